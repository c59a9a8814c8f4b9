"""The CPU image for real: built from containers/install.sh with podman, then jobs run inside it by Snakemake's own
apptainer code path (`--use-apptainer`). Apptainer cannot be installed here, so tests/adapters/apptainer-over-bwrap
(named for what it is) answers Snakemake's `apptainer` calls with bubblewrap on the built image; on clusters the
real apptainer runs. Opt-in (~12 min on 2 cores, CI runs it):

    python3 -m pytest -q --image tests/test_image.py

Needs podman, runc, debootstrap and bubblewrap (envs/setup.sh --containers).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, assert_default_study_losses, copy_workflow, snakemake

from workflow_scripts.measure.container import oci_manifest_digest

pytestmark = pytest.mark.image
ARCHIVE = REPO / "containers/images/cpu.oci.tar"


def build(*args, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "containers/build.sh", "--engine", "podman", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=1800)
    if check and done.returncode:
        raise AssertionError(f"containers/build.sh {' '.join(args)} failed:\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def manifest_digest(archive: Path) -> str:
    return oci_manifest_digest(str(archive))  # what provenance records for an OCI archive


@pytest.fixture(scope="session")
def image() -> dict:
    """The CPU image built from its recipe (from scratch on a clean machine: the Debian base from Debian's archive)."""
    start = time.perf_counter()
    done = build("--base", "debootstrap", "cpu")
    seconds = time.perf_counter() - start
    print(f"\nbuild: {seconds:.0f} s; {done.stdout.strip().splitlines()[-1]}")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {"archive": ARCHIVE, "digest": manifest_digest(ARCHIVE), "commit": commit or None, "log": done.stdout}


@pytest.fixture(scope="session")
def adapter(tmp_path_factory) -> dict:
    """PATH with the adapter first, as `apptainer`."""
    bin_dir = tmp_path_factory.mktemp("adapter-bin")
    (bin_dir / "apptainer").symlink_to(REPO / "tests/adapters/apptainer-over-bwrap")
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_a_rebuild_reuses_the_system_and_python_layers(image):
    """The pipeline's code is not in the image (jobs run the working directory's, bound by Apptainer): a rebuild
    after a code change redoes only the last layer, the recipe's commit."""
    start = time.perf_counter()
    log = build("--base", "debootstrap", "cpu").stdout
    seconds = time.perf_counter() - start
    steps = dict(re.findall(r'^STEP \d+/\d+: RUN bash /opt/pipeline/install.sh "\$PLATFORM" (\w+)\n(.*)$', log, re.M))
    assert steps["system"].startswith("--> Using cache") and steps["python"].startswith("--> Using cache"), steps
    assert not steps["stamp"].startswith("--> Using cache")  # the new recipe.json: built_at, commit
    print(f"\nrebuild after a code change: {seconds:.0f} s")


def test_a_job_sees_the_image_and_not_the_host(image, adapter, tmp_path):
    host_only = Path(f"/srv/host-only-{uuid.uuid4().hex}")
    host_only.mkdir(parents=True)
    try:
        (tmp_path / "probe.py").write_text(
            "import json, os, sys\n"
            "print(json.dumps({'image': json.load(open('/opt/pipeline/image.json')), 'prefix': sys.prefix,\n"
            f"                  'host_only': os.path.exists('{host_only}'),\n"
            "                  'container': os.environ.get('APPTAINER_CONTAINER')}))\n")
        (tmp_path / "Snakefile").write_text(
            f'rule probe:\n    output: "probe.json"\n    container: "oci-archive://{image["archive"]}"\n'
            '    shell: "python3 probe.py > {output}"\n')
        done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--use-apptainer"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600, env={**os.environ, **adapter})
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        host_only.rmdir()
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["image"]["platform"] == "cpu" and probe["image"]["recipe_commit"] == image["commit"]
    assert probe["host_only"] is False and probe["prefix"] == "/usr" != sys.prefix
    assert probe["container"].startswith(str(tmp_path / ".snakemake/singularity"))


def test_a_recipe_that_fails_to_build_is_named(image):
    done = build("--base", "localhost/no-such-base:0", "cpu", check=False)
    assert done.returncode != 0
    assert "building the cpu image from containers/Containerfile failed" in done.stderr


@pytest.fixture(scope="module")
def study_in_image(image, adapter, tmp_path_factory):
    """The default study, every job inside the image. The stdlib corpus is the running interpreter's own library:
    the image's Debian Python 3.11.2 ships other files than the host's Python, so the image reads the host's
    (corpus.stdlib_root), the one input that would otherwise differ."""
    wd = copy_workflow(tmp_path_factory.mktemp("in-image") / "wf")
    (wd / "containers/images").mkdir(parents=True)
    os.link(image["archive"], wd / "containers/images/cpu.oci.tar")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in stdlib.rglob("*.py"):
        if "site-packages" not in path.parts and "dist-packages" not in path.parts:
            dest = wd / "host-stdlib" / path.relative_to(stdlib)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
    (wd / "host_stdlib.yaml").write_text("corpus:\n  stdlib_root: host-stdlib\n")
    start = time.perf_counter()
    done = snakemake(wd, "--use-apptainer", "--configfile", "config.yaml", "host_stdlib.yaml", env=adapter,
                     timeout=1800)
    print(f"\ndefault study in the image: {time.perf_counter() - start:.0f} s")
    # the archive this study ran (a rebuild earlier in the session made a new one: a new digest)
    return wd, done.stdout + done.stderr, manifest_digest(wd / "containers/images/cpu.oci.tar")


def test_the_default_study_in_the_image_gives_the_host_losses_bit_for_bit(study_in_image):
    wd, _, _ = study_in_image
    runs = pd.read_csv(wd / "results/default/tables/runs.csv").set_index("strategy")
    steps = pd.read_csv(wd / "results/default/tables/steps.csv")
    assert_default_study_losses(runs, steps)


def test_every_run_records_the_image_it_ran_in(study_in_image, image):
    wd, log, digest = study_in_image
    assert "Pulling singularity image oci-archive://" in log  # Snakemake's own conversion, then every job in it
    # as text: a short hash such as 285581273e20 would otherwise be read as a float
    prov = pd.read_csv(wd / "results/default/tables/provenance.csv", dtype=str, keep_default_na=False)
    assert (prov.image_digest == digest).all() and digest.startswith("sha256:")
    assert (prov.image_recipe_commit == (image["commit"] or "")[:12]).all()
    one = json.loads(next((wd / "results/default/runs").glob("*/ddp/ws2/r0/provenance.json")).read_text())
    assert one["python"] == one["image"]["baked"]["python"]  # the image's interpreter ran the job
    assert one["image"]["baked"]["installed"]["torch"] == one["packages"]["torch"]
