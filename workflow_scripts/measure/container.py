"""Which image a job ran in, read from inside the container: None on the host.

Two facts, each from where it cannot be faked by the host:
  * /opt/pipeline/image.json, written by containers/install.sh when the image was built: the platform, the
    recipe's commit (and whether containers/ or envs/ differed from it), the base image, the builder, the versions
    installed. A host has no such file.
  * the image's digest, from the image file Apptainer names in APPTAINER_CONTAINER: an OCI archive's manifest
    digest (containers/build.sh with podman; what `podman images --digests` calls the image after a load), else the
    SHA-256 of the file (a SIF), computed once per change of the file (data/checksum.py: cached in <image>.sha256).
"""
from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

from workflow_scripts.data import checksum

IMAGE_FACTS = Path("/opt/pipeline/image.json")


def oci_manifest_digest(path: str) -> str | None:
    try:
        with tarfile.open(path) as tar:
            return json.load(tar.extractfile("index.json"))["manifests"][0]["digest"]
    except (tarfile.TarError, KeyError, IndexError, TypeError, OSError, ValueError):
        return None


def file_sha256(path: str) -> str:
    return f"sha256:{checksum.sha256(path)}"


def image_digest(image: str | None) -> dict:
    if not image:
        return {"digest": None, "digest_kind": None, "digest_why": "APPTAINER_CONTAINER is not set"}
    if os.path.isdir(image):
        return {"digest": None, "digest_kind": None, "digest_why": "a sandbox directory has no digest"}
    if not os.path.isfile(image):
        return {"digest": None, "digest_kind": None, "digest_why": "the image file is not visible in the container"}
    oci = oci_manifest_digest(image)
    if oci:
        return {"digest": oci, "digest_kind": "oci-manifest"}
    return {"digest": file_sha256(image), "digest_kind": "file-sha256"}


def facts(baked: Path = IMAGE_FACTS) -> dict | None:
    image = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    inside = json.loads(baked.read_text()) if baked.is_file() else None
    if image is None and inside is None:
        return None  # on the host
    return {"image": image, **image_digest(image), "baked": inside}
