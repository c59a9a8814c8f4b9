"""The images for real: built from containers/install.sh with podman, then jobs run inside them by Snakemake's own
apptainer code path (`--use-apptainer`). Apptainer cannot be installed here, so tests/adapters/apptainer-over-bwrap
(named for what it is) answers Snakemake's `apptainer` calls with bubblewrap on the built image; on clusters the
real apptainer runs.

The CPU image, opt-in (~12 min on 2 cores, CI runs it):

    python3 -m pytest -q --image tests/test_image.py

The CUDA image, opt-in and not in CI (GBs of downloads, an hour on 2 cores; no GPU needed): inside it torch is
the CUDA build, DeepSpeed's ops are compiled for the listed GPUs, no toolkit stayed, and the default study runs
on the CPU with the host's losses:

    python3 -m pytest -q --image-cuda tests/test_image.py -k cuda   (or PIPELINE_IMAGE_CUDA=1)

Needs podman, runc, debootstrap and bubblewrap (envs/setup.sh --containers).
"""
from __future__ import annotations

import inspect
import json
import os
import re
import struct
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

ARCHIVE = REPO / "containers/images/cpu.oci.tar"
CUDA_ARCHIVE = REPO / "containers/images/cuda.oci.tar"
CUDA_TAG = "localhost/dist-train-studies-cuda:latest"
# The GPUs the CUDA image's DeepSpeed ops are compiled for: A100, A10/3090, L4/4090, H100/H200; PTX for newer
CUDA_SM, CUDA_PTX = {80, 86, 89, 90}, {90}
GPU_OPS = ["cpu_adam", "async_io", "fused_adam", "quantizer", "dc"]  # every op a strategy (or its options) loads


def build(*args, check=True, timeout=1800) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "containers/build.sh", "--engine", "podman", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
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
    done = build("cpu")
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


@pytest.mark.image
def test_a_rebuild_reuses_the_system_python_and_ops_layers(image):
    """The pipeline's code is not in the image (jobs run the working directory's, bound by Apptainer): a rebuild
    after a code change redoes only the last layer, the recipe's commit."""
    start = time.perf_counter()
    log = build("cpu").stdout
    seconds = time.perf_counter() - start
    steps = dict(re.findall(r'^STEP \d+/\d+: RUN bash /opt/pipeline/install.sh "\$PLATFORM" (\w+)\n(.*)$', log, re.M))
    assert all(steps[s].startswith("--> Using cache") for s in ("system", "python", "ops")), steps
    assert not steps["stamp"].startswith("--> Using cache")  # the new recipe.json: built_at, commit
    print(f"\nrebuild after a code change: {seconds:.0f} s")


@pytest.mark.image
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


@pytest.mark.image
def test_a_recipe_that_fails_to_build_is_named(image):
    done = build("--base", "localhost/no-such-base:0", "cpu", check=False)
    assert done.returncode != 0
    assert "building the cpu image from containers/Containerfile failed" in done.stderr


def default_study_in(archive: Path, adapter: dict, wd: Path) -> tuple[Path, str, str]:
    """The default study, every job inside the image `archive` (as the cpu platform's image). The stdlib corpus is
    the running interpreter's own library: the image's Debian Python 3.11.2 ships other files than the host's
    Python, so the image reads the host's (corpus.stdlib_root), the one input that would otherwise differ."""
    wd = copy_workflow(wd)
    (wd / "containers/images").mkdir(parents=True)
    os.link(archive, wd / "containers/images/cpu.oci.tar")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in stdlib.rglob("*.py"):
        if "site-packages" not in path.parts and "dist-packages" not in path.parts:
            dest = wd / "host-stdlib" / path.relative_to(stdlib)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
    (wd / "host_stdlib.yaml").write_text("corpus:\n  stdlib_root: host-stdlib\n")
    start = time.perf_counter()
    done = snakemake(wd, "--use-apptainer", "--configfile", "config.yaml", "host_stdlib.yaml", env=adapter,
                     timeout=2400)
    print(f"\ndefault study in {archive.name}: {time.perf_counter() - start:.0f} s")
    # the archive this study ran (a rebuild earlier in the session made a new one: a new digest)
    return wd, done.stdout + done.stderr, manifest_digest(wd / "containers/images/cpu.oci.tar")


@pytest.fixture(scope="module")
def study_in_image(image, adapter, tmp_path_factory):
    return default_study_in(image["archive"], adapter, tmp_path_factory.mktemp("in-image") / "wf")


@pytest.mark.image
def test_the_default_study_in_the_image_gives_the_host_losses_bit_for_bit(study_in_image):
    wd, _, _ = study_in_image
    runs = pd.read_csv(wd / "results/default/tables/runs.csv").set_index("strategy")
    steps = pd.read_csv(wd / "results/default/tables/steps.csv")
    assert_default_study_losses(runs, steps)


@pytest.mark.image
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


# ------------------------------------------------------------------ the CUDA image (opt-in, not in CI)
def cuda_opted_in(config) -> bool:
    """--image-cuda, or PIPELINE_IMAGE_CUDA=1."""
    return bool(config.getoption("--image-cuda") or os.environ.get("PIPELINE_IMAGE_CUDA") == "1")


@pytest.fixture(scope="session")
def cuda_image(request) -> dict:
    """The CUDA image built from its recipe (Debian from Debian's archive, the rest from PyPI; a build whose layers
    podman holds redoes only the recipe's commit)."""
    if not cuda_opted_in(request.config):
        pytest.skip("builds the CUDA image (GBs, ~1 h on 2 cores): python3 -m pytest -q --image-cuda "
                    "tests/test_image.py -k cuda")
    start = time.perf_counter()
    done = build("cuda", timeout=3 * 3600)
    print(f"\nbuild: {time.perf_counter() - start:.0f} s; {done.stdout.strip().splitlines()[-1]}")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {"archive": CUDA_ARCHIVE, "commit": commit or None}


def in_cuda_image(script: str) -> dict:
    """A Python script run inside the built CUDA image (podman, no GPU); its last line, JSON."""
    done = subprocess.run(["podman", "run", "--rm", "-i", CUDA_TAG, "python3", "-"], input=script,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "CONTAINERS_CONF": os.environ.get(
                              "CONTAINERS_CONF", str(REPO / "containers/podman.conf"))})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cuda_image_holds_torchs_cuda_build_and_no_toolkit(cuda_image):
    facts = in_cuda_image(
        "import importlib.metadata as m, json, shutil, torch\n"
        "names = {d.metadata['Name'].lower() for d in m.distributions()}\n"
        "print(json.dumps({'cuda': torch.version.cuda, 'available': torch.cuda.is_available(),\n"
        "    'archs': torch.cuda.get_arch_list(), 'nvcc': shutil.which('nvcc'),\n"
        "    'toolkit': sorted(n for n in names if n in ('nvidia-cuda-nvcc', 'nvidia-cuda-crt', 'nvidia-nvvm',\n"
        "                                                'nvidia-cuda-cccl')),\n"
        "    'runtime': sorted(n for n in names if n.startswith(('nvidia-cudnn', 'nvidia-nccl', 'nvidia-cublas'))),\n"
        "    'baked': json.load(open('/opt/pipeline/image.json'))}))\n")
    print(f"\ntorch CUDA {facts['cuda']}, archs {facts['archs']}")
    assert facts["cuda"] and int(facts["cuda"].split(".")[0]) >= 12 and facts["available"] is False  # no GPU here
    assert {"sm_80", "sm_90"} <= set(facts["archs"])
    assert len(facts["runtime"]) == 3  # cuDNN, NCCL, cuBLAS: torch's wheels
    assert facts["nvcc"] is None and facts["toolkit"] == []  # the op build's toolkit went with its step
    baked = facts["baked"]
    assert baked["platform"] == "cuda" and baked["torch_cuda"] == facts["cuda"]
    assert baked["recipe_commit"] == cuda_image["commit"] and baked["base_image"] == "localhost/debian-base:bookworm"
    assert baked["deepspeed_ops"] and set(GPU_OPS) <= set(baked["deepspeed_ops"])


def test_cuda_image_holds_deepspeeds_ops_for_the_listed_gpus(cuda_image):
    """DeepSpeed's own record says which ops are compiled in; each GPU op's library holds device code for exactly the
    listed architectures (its .nv_fatbin read here: cuobjdump is not in the image), the CPU ops no AVX-512."""
    probe = "import json, struct\n" + inspect.getsource(section) + inspect.getsource(archs)
    report = in_cuda_image(probe + (
        "import glob, os, subprocess, deepspeed\n"
        "from deepspeed.git_version_info import installed_ops, accelerator_name\n"
        "root = os.path.dirname(deepspeed.__file__)\n"
        "libs = {os.path.basename(p).split('.')[0]: p for p in glob.glob(root + '/ops/**/*_op*.so', recursive=True)}\n"
        "print(json.dumps({'installed': installed_ops, 'accelerator': accelerator_name,\n"
        "    'archs': {op: archs(section(libs[op + '_op'], '.nv_fatbin')) for op in ('fused_adam', 'quantizer')},\n"
        "    'zmm': {op: '%zmm' in subprocess.run(['objdump', '-d', libs[op + '_op']], capture_output=True,\n"
        "                                        text=True).stdout for op in ('cpu_adam', 'async_io')}}))\n"))
    print(f"\nDeepSpeed ops installed: {sorted(op for op, on in report['installed'].items() if on)}; "
          f"device code: {report['archs']}")
    assert report["accelerator"] == "cuda"
    assert [op for op in GPU_OPS if not report["installed"].get(op)] == []
    for op, (elf, ptx) in report["archs"].items():
        assert set(elf) == CUDA_SM and set(ptx) == CUDA_PTX, (op, elf, ptx)
    assert report["zmm"] == {"cpu_adam": False, "async_io": False}


@pytest.fixture(scope="module")
def study_in_cuda_image(cuda_image, adapter, tmp_path_factory):
    return default_study_in(cuda_image["archive"], adapter, tmp_path_factory.mktemp("in-cuda-image") / "wf")


def test_cuda_image_runs_the_default_study_on_the_cpu_with_the_host_losses(study_in_cuda_image, cuda_image):
    """The CUDA build of torch on a machine without a GPU: the default study (platform cpu) inside the image."""
    wd, _, digest = study_in_cuda_image
    runs = pd.read_csv(wd / "results/default/tables/runs.csv").set_index("strategy")
    steps = pd.read_csv(wd / "results/default/tables/steps.csv")
    assert_default_study_losses(runs, steps)
    prov = pd.read_csv(wd / "results/default/tables/provenance.csv", dtype=str, keep_default_na=False)
    assert (prov.image_digest == digest).all() and (prov.image_recipe_commit == (cuda_image["commit"] or "")[:12]).all()
    one = json.loads(next((wd / "results/default/runs").glob("*/ddp/ws2/r0/provenance.json")).read_text())
    assert one["image"]["baked"]["platform"] == "cuda" and "+cpu" not in one["packages"]["torch"]


def section(path, wanted):
    """The bytes of one section of a 64-bit little-endian ELF file (empty if it has none)."""
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    for name, _, _, _, offset, size, *_ in headers:
        start = headers[shstrndx][4] + name
        if data[start:data.index(b"\0", start)].decode() == wanted:
            return data[offset:offset + size]
    return b""


def archs(blob):
    """(sm numbers of the device code, sm numbers of the PTX) in a .nv_fatbin section: fatbin containers (magic
    0xBA55ED50; header size, payload size) of entries (kind 1 PTX, 2 ELF; header size, padded size; sm at 28)."""
    elf, ptx, pos = set(), set(), 0
    while pos + 16 <= len(blob):
        magic, _, header, size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != 0xBA55ED50:
            pos += 8  # containers are 8-byte aligned
            continue
        entry, end = pos + header, pos + header + size
        while entry < end:
            kind, _, entry_header, padded = struct.unpack_from("<HHII", blob, entry)
            sm, = struct.unpack_from("<I", blob, entry + 28)
            {1: ptx, 2: elf}.get(kind, set()).add(sm)
            entry += entry_header + padded
        pos = end
    return sorted(elf), sorted(ptx)
