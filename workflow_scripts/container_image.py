"""The image every rule runs in under --use-apptainer (config `containers.<platform>`), settled when the Snakefile
is parsed: a missing image is one error naming the key, before any job starts.

`auto` (the default) takes what containers/build.sh made: containers/images/<platform>.sif (apptainer), else
containers/images/<platform>.oci.tar (podman) as an oci-archive:// URI, which Snakemake converts once with
`apptainer pull` into its image directory. A conversion older than the archive it came from (the image was rebuilt)
is removed, so Snakemake converts the new one instead of running the old.
"""
from __future__ import annotations

import hashlib
import os

OCI = "oci-archive://"


class ImageError(ValueError):
    pass


def candidates(platform: str) -> tuple[str, str]:
    return f"containers/images/{platform}.sif", f"containers/images/{platform}.oci.tar"


def resolve(setting: str, platform: str) -> str:
    """The container URL for Snakemake: a local path, an absolute oci-archive:// URI, or a registry URI as given."""
    if setting == "auto":
        sif, oci = candidates(platform)
        return f"{OCI}{os.path.abspath(oci)}" if not os.path.exists(sif) and os.path.exists(oci) else sif
    if setting.startswith(OCI) and not setting[len(OCI):].startswith("/"):  # pulled from Snakemake's image dir
        return f"{OCI}{os.path.abspath(setting[len(OCI):])}"
    return setting


def local_file(url: str) -> str | None:
    """The file a URL names on this machine (None for a registry URI such as docker://)."""
    if url.startswith(OCI):
        return url[len(OCI):]
    return None if "://" in url else url


def check(setting: str, platform: str, url: str) -> None:
    path = local_file(url)
    if path is None or os.path.exists(path):
        return
    build = f"build it with `containers/build.sh {platform}`"
    if setting == "auto":
        sif, oci = candidates(platform)
        raise ImageError(f"containers.{platform}: no image for platform {platform} under --use-apptainer: neither "
                         f"{sif} nor {oci} exists; {build}, or set containers.{platform} to an image")
    raise ImageError(f"containers.{platform}: image {path} not found under --use-apptainer; {build} "
                     f"(or point containers.{platform} at an existing image)")


def drop_stale_conversion(url: str, image_dir: str) -> str | None:
    """Remove Snakemake's converted copy of an OCI archive when the archive is newer; returns what was removed."""
    if not url.startswith(OCI):
        return None
    archive = url[len(OCI):]
    converted = os.path.join(image_dir, hashlib.md5(url.encode(), usedforsecurity=False).hexdigest() + ".simg")
    if not (os.path.exists(archive) and os.path.exists(converted)):
        return None
    old, new = os.stat(converted), os.stat(archive)
    if (old.st_dev, old.st_ino) == (new.st_dev, new.st_ino) or old.st_mtime >= new.st_mtime:
        return None
    os.remove(converted)
    return converted


def settle(setting: str, platform: str, using_apptainer: bool, image_dir: str) -> str:
    url = resolve(setting, platform)
    if using_apptainer:
        check(setting, platform, url)
        drop_stale_conversion(url, image_dir)
    return url
