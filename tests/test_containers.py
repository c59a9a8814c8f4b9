"""Containers and local profiles, tested as far as this machine allows.

Apptainer cannot be installed here, so the images (containers/*.def) are never built in these tests. What is
tested instead:
  * the definition files: sections, pinned base images whose torch is the pipeline's torch, every pin of
    envs/requirements.txt installed (their own filter lines are run against the real file), the vendor's
    monitoring package only in its image, the DeepSpeed ops every strategy loads compiled at build time;
  * the workflow under --use-apptainer against tests/fakes/apptainer, a recording STAND-IN put first on PATH:
    Snakemake's real `apptainer exec ...` calls are recorded (image, flags, binds) and the stand-in runs each job
    on the host, so the reduced study really completes; every job must get the platform's image and the profile's
    GPU flags (Snakemake never adds --nv or device binds itself);
  * the local profiles: they parse, and timed_runs=1 keeps two training runs from overlapping.

    python3 -m pytest tests/test_containers.py
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from conftest import REPO, copy_workflow, snakemake

PLATFORMS = ["cuda", "rocm"]
VENDOR_SMI = {"cuda": "nvidia-ml-py", "rocm": "amdsmi"}  # the VRAM sampler's library, one per image
SECTIONS = ["help", "labels", "files", "environment", "post", "test"]


def requirement_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "envs/requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"envs/requirements.txt: {line!r} is not pinned"
            pins[name.lower()] = version
    return pins


def parse_def(platform: str) -> tuple[dict, dict]:
    """(header, sections) of containers/<platform>.def; sections map name -> list of stripped lines."""
    header, sections, current = {}, {}, None
    for raw in (REPO / f"containers/{platform}.def").read_text().splitlines():
        match = re.match(r"^%(\w+)\s*$", raw)
        if match:
            current = match.group(1)
            assert current not in sections, f"{platform}.def: %{current} twice"
            sections[current] = []
        elif current is None:
            if raw.strip() and not raw.lstrip().startswith("#"):
                key, _, value = raw.partition(":")
                header[key.strip()] = value.strip()
        elif raw.strip() and not raw.strip().startswith("#"):
            sections[current].append(raw.strip())
    return header, sections


def post_script(sections) -> str:
    """%post as one script, with backslash continuations joined."""
    return "\n".join(sections["post"]).replace("\\\n", " ")


# ------------------------------------------------------------------ definition files
@pytest.mark.parametrize("platform", PLATFORMS)
def test_definition_has_every_section(platform):
    header, sections = parse_def(platform)
    assert header.get("Bootstrap") == "docker" and header.get("From")
    for name in SECTIONS:
        assert sections.get(name), f"{platform}.def: %{name} missing or empty"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_base_image_is_pinned_to_the_pipelines_torch(platform):
    image = parse_def(platform)[0]["From"]
    name, _, tag = image.rpartition(":")
    assert name and tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"unpinned base image {image!r}"
    torch = requirement_pins()["torch"]
    if platform == "cuda":  # the devel flavour: nvcc compiles the DeepSpeed ops
        assert name == "pytorch/pytorch" and re.fullmatch(rf"{re.escape(torch)}-cuda12\.\d+-cudnn9-devel", tag), image
    else:
        assert name == "rocm/pytorch" and re.fullmatch(rf"rocm\d+(\.\d+)+_.+_pytorch_release_{re.escape(torch)}",
                                                        tag), image


@pytest.mark.parametrize("platform", PLATFORMS)
def test_labels_name_the_versions(platform):
    header, sections = parse_def(platform)
    labels = dict(line.split(None, 1) for line in sections["labels"])
    pins = requirement_pins()
    assert labels["org.pipeline.base-image"] == header["From"]
    assert labels["org.pipeline.torch"] == pins["torch"]
    assert labels["org.pipeline.deepspeed"] == pins["deepspeed"]
    assert labels["org.pipeline.snakemake"] == pins["snakemake"]
    assert labels["org.pipeline.platform"] == platform


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_pin_except_torch_is_installed_from_the_same_requirements_file(platform, tmp_path):
    """The .def copies envs/requirements.txt in and filters it with grep: run its own filter lines on the real
    file and check what pip gets (everything but torch, and the other vendor's monitoring library)."""
    _, sections = parse_def(platform)
    files = [line.split() for line in sections["files"]]
    assert ["envs/requirements.txt", "/opt/pipeline/requirements.txt"] in files
    post = post_script(sections)
    assert re.search(r"^P=/opt/pipeline$", post, re.M)
    filters = [line for line in post.splitlines() if re.match(r"^(\w+=\"?\$\()?grep ", line)]
    assert filters, "no grep filter over requirements.txt in %post"
    shutil.copy(REPO / "envs/requirements.txt", tmp_path / "requirements.txt")
    script = "\n".join(["set -eu", f"P={tmp_path}", *filters, 'printf "%s" "$DS_SPEC"'])
    ds_spec = subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout
    image_reqs = [line.split("#")[0].strip() for line in (tmp_path / "requirements.image.txt").read_text().splitlines()
                  if line.split("#")[0].strip()]  # what pip reads: comments and blank lines dropped
    assert re.search(r'pip install .*-r "\$P/requirements\.image\.txt"', post)
    assert re.search(r'pip install .*--no-build-isolation .*"\$DS_SPEC"', post)

    installed = {line.split("==")[0].lower(): line.split("==")[1] for line in image_reqs + [ds_spec]}
    pins = requirement_pins()
    other_smi = VENDOR_SMI["rocm" if platform == "cuda" else "cuda"]
    expected = {k: v for k, v in pins.items() if k not in ("torch", other_smi)}
    assert installed == expected
    assert VENDOR_SMI[platform] in installed and other_smi not in installed
    # torch is never installed: a constraint pins the base image's own build
    assert not re.search(r"pip install[^\n]*\btorch\b", post)
    assert "import torch; print(\"torch==\" + torch.__version__)" in post and '-c "$P/constraints.txt"' in post


def needed_ops(platform: str) -> dict[str, tuple[str, str]]:
    """op builder class -> (op name, DS_BUILD_ variable), for every op a strategy loads on this platform, as
    DeepSpeed's CUDA accelerator (used by CUDA and ROCm torch alike) resolves them."""
    code = (
        "import json, sys\n"
        "from workflow_scripts.training.build_ops import needed_ops\n"
        "from workflow_scripts.training.strategies import STRATEGIES\n"
        "from deepspeed.accelerator import get_accelerator\n"
        f"ops = sorted({{op for s in STRATEGIES for op in needed_ops(s, {platform!r})}})\n"
        "out = {}\n"
        "for op in ops:\n"
        "    b = get_accelerator().create_op_builder(op)\n"
        "    out[op] = [b.NAME, b.BUILD_VAR]\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                          env={**os.environ, "DS_ACCELERATOR": "cuda"})
    return {k: tuple(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_deepspeed_ops_are_compiled_into_the_image(platform):
    _, sections = parse_def(platform)
    post = post_script(sections)
    ops = needed_ops(platform)
    assert {"CPUAdamBuilder", "AsyncIOBuilder"} <= set(ops), ops  # offload and ZeRO-Infinity at least
    install = next(line for line in post.splitlines() if "$DS_SPEC" in line and "pip install" in line)
    assert "DS_BUILD_OPS=0" in install and "--no-build-isolation" in install
    check = next(line for line in post.splitlines() if "installed_ops" in line)
    tests = "\n".join(sections["test"])
    for builder, (name, build_var) in ops.items():
        assert f"{build_var}=1" in install, f"{builder}: {build_var}=1 missing from the DeepSpeed install"
        assert f'"{name}"' in check, f"{builder}: the build does not verify that {name} was compiled"
        assert f'"{name}"' in tests, f"{builder}: %test does not check {name}"
    assert re.search(r"apt-get install .*libaio-dev", post)  # async_io links libaio
    arch_var = "TORCH_CUDA_ARCH_LIST" if platform == "cuda" else "PYTORCH_ROCM_ARCH"
    arch = re.search(rf'export {arch_var}="([^"]+)"', post)
    assert arch and arch.start() < post.index("$DS_SPEC\""), f"{arch_var} must be set before DeepSpeed builds"
    if platform == "cuda":  # DeepSpeed's op builder cannot parse arch suffixes such as 9.0a
        assert all(re.fullmatch(r"\d+\.\d+(\+PTX)?", a) for a in arch.group(1).split(";")), arch.group(1)
    else:
        assert all(re.fullmatch(r"gfx[0-9a-f]+", a) for a in arch.group(1).split(";")), arch.group(1)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_image_self_test_imports_the_stack(platform):
    _, sections = parse_def(platform)
    imports = " ".join(sections["test"])
    for module in ("torch", "deepspeed", "snakemake", {"cuda": "pynvml", "rocm": "amdsmi"}[platform]):
        assert re.search(rf"import [^;']*\b{module}\b", imports), module


def test_build_script_builds_each_image_from_its_definition():
    done = subprocess.run(["bash", str(REPO / "containers/build.sh"), "-n"], capture_output=True, text=True,
                          check=True, cwd="/")
    assert done.stdout.split("\n")[:2] == [
        f"+ apptainer build {'--fakeroot ' if os.geteuid() else ''}containers/images/{p}.sif containers/{p}.def"
        for p in PLATFORMS]


# ------------------------------------------------------------------ the workflow against the apptainer stand-in
REDUCED = {"study": "containers", "results_dir": "results/containers", "work_dir": "work/containers",
           "strategies": ["ddp"], "corpus": {"source": "stdlib", "max_bytes": 200_000},
           "tokenizer": {"kind": "bpe", "vocab_size": 512}, "data": {"block_size": 64},
           "train": {"max_steps": 4, "log_every": 2, "timing_warmup_steps": 1, "eval_batches": 1,
                     "checkpoint_every": 0}}


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """A bin directory whose only entry is tests/fakes/apptainer, named `apptainer`, to go first on PATH."""
    bin_dir = tmp_path_factory.mktemp("standin-bin")
    shutil.copy(REPO / "tests/fakes/apptainer", bin_dir / "apptainer")
    (bin_dir / "apptainer").chmod(0o755)
    return bin_dir


def with_standin(standin, wd, *args, check=True):
    log = wd / "apptainer-calls.jsonl"
    env = {"PATH": f"{standin}{os.pathsep}{os.environ['PATH']}", "APPTAINER_STANDIN_LOG": str(log)}
    done = snakemake(wd, "--use-apptainer", *args, check=check, env=env, timeout=600, report=True)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def study_overlay(wd, name="reduced.yaml", **cfg):
    (wd / name).write_text(yaml.safe_dump({**REDUCED, **cfg}))
    return ["--configfile", "config.yaml", name]


def placeholder_image(wd, platform):
    """Snakemake hands a local image path to apptainer untouched; Apptainer (and the stand-in) refuse a missing
    file, so an empty placeholder stands where containers/build.sh would put the image."""
    image = wd / yaml.safe_load((REPO / "schemas/config.schema.yaml").read_text())[
        "properties"]["containers"]["properties"][platform]["default"]
    image.parent.mkdir(parents=True, exist_ok=True)
    image.touch()
    return image.relative_to(wd).as_posix()


def profile_args(name):
    return shlex.split(yaml.safe_load((REPO / f"profiles/{name}/config.yaml").read_text())["apptainer-args"])


def option_pairs(call):
    return [tuple(o) for o in call["options"]]


def test_the_standin_is_the_apptainer_on_path(standin):
    path = f"{standin}{os.pathsep}{os.environ['PATH']}"
    assert shutil.which("apptainer", path=path) == str(standin / "apptainer")
    out = subprocess.run(["apptainer", "--version"], env={**os.environ, "PATH": path}, capture_output=True,
                         text=True, check=True).stdout
    assert "standin" in out and "STAND-IN" in (standin / "apptainer").read_text().split("\n", 3)[1]


@pytest.fixture(scope="module")
def cuda_profile_run(standin, tmp_path_factory):
    """The reduced study on CPU (platform cpu: the CUDA image) with the local-cuda profile, under --use-apptainer."""
    wd = copy_workflow(tmp_path_factory.mktemp("apptainer") / "wf")
    image = placeholder_image(wd, "cpu")
    done, calls = with_standin(standin, wd, "--profile", "profiles/local-cuda", *study_overlay(wd))
    return wd, image, done.stdout + done.stderr, calls


def test_every_job_runs_in_the_platform_image_with_the_profiles_flags(cuda_profile_run):
    wd, image, log, calls = cuda_profile_run
    jobs = [rule for rule in re.findall(r"^localrule (\w+):", log, re.M) if rule != "all"]
    assert len(jobs) == 8 and len(calls) == len(jobs), (jobs, [c["command"][-1][:60] for c in calls])
    args = profile_args("local-cuda")
    assert args == ["--nv"]
    for call in calls:
        assert call["argv"][1] == "exec" and call["image"] == image and call["image_exists"]
        assert "--nv" in call["flags"]  # from the profile: Snakemake never adds it
        assert ("--home", str(wd)) in option_pairs(call)  # Snakemake's own: the working directory as HOME
        assert call["command"][:2] == ["bash", "-c"] and "python3 -m workflow_scripts." in call["command"][2]
        assert call["cwd"] == str(wd)
    ran = sorted(re.search(r"python3 -m workflow_scripts\.([\w.]+)", c["command"][2]).group(1) for c in calls)
    assert ran == sorted(["data.corpus", "data.tokenizer", "data.tokenize", "measure.calibrate", "training.launch",
                          "report.parse", "report.tables", "report.figures"])


def test_the_study_completes_inside_the_image(cuda_profile_run):
    wd, image, _, _ = cuda_profile_run
    runs = pd.read_csv(wd / REDUCED["results_dir"] / "tables/runs.csv")
    assert list(runs.strategy) == ["ddp"] and (runs.status == "ok").all()
    prov = json.loads(next((wd / REDUCED["results_dir"] / "runs").glob("*/ddp/ws2/r0/provenance.json")).read_text())
    # provenance reads APPTAINER_CONTAINER, which Apptainer (here the stand-in) sets inside the container
    assert prov["container"] == str(wd / image)
    assert (wd / REDUCED["results_dir"] / "report.html").exists()


@pytest.mark.parametrize("profile, platform, flags, binds", [
    ("local-cuda", "cuda", {"--nv"}, set()),
    ("local-rocm", "rocm", set(), {"/dev/kfd", "/dev/dri"}),
])
def test_gpu_platform_jobs_get_their_image_and_device_flags(standin, tmp_path, profile, platform, flags, binds):
    """One cheap job (the corpus) per GPU platform; devices_per_node stands in for the GPUs this machine lacks."""
    wd = copy_workflow(tmp_path / "wf")
    image = placeholder_image(wd, platform)
    target = f"{REDUCED['work_dir']}/data/corpus.jsonl"
    _, calls = with_standin(standin, wd, target, "--profile", f"profiles/{profile}",
                           *study_overlay(wd, platform=platform, devices_per_node=2))
    assert len(calls) == 1
    call = calls[0]
    assert call["image"] == image == f"containers/images/{platform}.sif"
    assert set(call["flags"]) == flags
    assert binds <= set(call["binds"])
    assert "--rocm" not in call["flags"]  # ROCm: device binds, never the host's ROCm libraries over the image's


def test_a_missing_image_fails_the_job(standin, tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    target = f"{REDUCED['work_dir']}/data/corpus.jsonl"
    done, calls = with_standin(standin, wd, target, "--profile", "profiles/local-cpu", *study_overlay(wd),
                               check=False)
    assert done.returncode != 0 and not (wd / target).exists()
    assert [c["image_exists"] for c in calls] == [False]
    assert "could not open image" in (wd / "results/containers/logs/corpus.log").read_text() + done.stderr


# ------------------------------------------------------------------ local profiles
@pytest.mark.parametrize("name", ["local-cpu", "local-cuda", "local-rocm"])
def test_local_profile_keys(name):
    profile = yaml.safe_load((REPO / f"profiles/{name}/config.yaml").read_text())
    resources = dict(r.split("=") for r in profile["resources"])
    assert resources["timed_runs"] == "1" and "gpu" in resources
    assert profile["keep-going"] is False and profile["rerun-incomplete"] is True and profile["printshellcmds"]
    # --use-apptainer stays on the command line: the same profile serves machines without Apptainer
    assert "software-deployment-method" not in profile and "use-apptainer" not in profile
    assert profile_args(name) if name != "local-cpu" else "apptainer-args" not in profile


def test_timed_runs_never_overlap_under_a_local_profile(tmp_path):
    """Two one-rank runs fit the two cores at once; the profile's timed_runs=1 must still run them one by one."""
    wd = copy_workflow(tmp_path / "wf")
    snakemake(wd, "--profile", "profiles/local-cpu", *study_overlay(wd, strategies=["ddp", "fsdp"],
                                                                     world_sizes=[1]), timeout=600)
    spans = sorted((p["start_unix"], p["end_unix"]) for p in (
        json.loads(f.read_text()) for f in (wd / REDUCED["results_dir"] / "runs").glob("*/*/ws1/r0/provenance.json")))
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], spans
