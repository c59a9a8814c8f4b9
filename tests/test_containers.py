"""Containers and local profiles, tested as far as this machine allows.

Apptainer cannot be installed here, so the images (containers/*.def) are never built in these tests. What is
tested instead:
  * the definition files: sections, the base (Debian by debootstrap; ROCm's pinned vendor image, whose torch is
    the pipeline's), each converted into the Containerfile steps it mirrors, every pin of envs/requirements.txt
    installed (their own filter lines are run against the real file), the vendor's monitoring package only in its
    image, the DeepSpeed ops every strategy loads compiled at build time by a toolkit present for the build only;
  * the workflow under --use-apptainer against tests/fakes/apptainer, a recording STAND-IN put first on PATH:
    Snakemake's real `apptainer exec ...` calls are recorded (image, flags, binds) and the stand-in runs each job
    on the host, so the reduced study really completes; every job must get the platform's image and the profile's
    GPU flags (Snakemake never adds --nv or device binds itself);
  * the local profiles: they parse, and timed_runs=1 keeps two training runs from overlapping;
  * the op builds' precompiled header (a stand-in compiler records the calls).

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
from conftest import REPO, copy_workflow, reuse_calibration, snakemake

PLATFORMS = ["cpu", "cuda", "rocm"]
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


# ---------------------------------------------------------- recipes: containers/install.sh, run by every builder
def install_script() -> str:
    return (REPO / "containers/install.sh").read_text()


def function_body(name: str) -> str:
    """The body of a shell function of containers/install.sh."""
    match = re.search(rf"^{name}\(\) \{{\n(.*?)^\}}", install_script(), re.M | re.S)
    assert match, f"install.sh: no function {name}"
    return match.group(1)


DEBOOTSTRAP = ["cpu", "cuda"]  # Debian from Debian's archive; rocm's torch comes only with the vendor's base


@pytest.mark.parametrize("platform", PLATFORMS)
def test_definition_has_every_section(platform):
    header, sections = parse_def(platform)
    if platform in DEBOOTSTRAP:  # no container registry: apptainer's debootstrap, the mirror a build argument
        assert header == {"Bootstrap": "debootstrap", "OSVersion": "bookworm", "MirrorURL": "{{ DEBIAN_MIRROR }}"}
    else:
        assert header.get("Bootstrap") == "docker" and header.get("From")
    for name in SECTIONS:
        assert sections.get(name), f"{platform}.def: %{name} missing or empty"


def test_the_vendor_base_image_is_pinned():
    image = parse_def("rocm")[0]["From"]
    name, _, tag = image.rpartition(":")
    assert name == "rocm/pytorch" and re.fullmatch(
        rf"rocm\d+(\.\d+)+_.+_pytorch_release_{re.escape(requirement_pins()['torch'])}", tag), image


def def_base(platform) -> str:
    """The base a .def names, as its label and the recipe record spell it."""
    header = parse_def(platform)[0]
    return f"debootstrap:{header['OSVersion']}" if header["Bootstrap"] == "debootstrap" else header["From"]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_labels_name_the_platform_base_and_recipe(platform):
    labels = dict(line.split(None, 1) for line in parse_def(platform)[1]["labels"])
    assert labels["org.pipeline.base-image"] == def_base(platform)
    assert labels["org.pipeline.platform"] == platform
    assert labels["org.pipeline.recipe"] == "containers/install.sh"


def containerfile_steps(platform) -> dict:
    """containers/Containerfile as build.sh runs it for a platform: its COPYs as (source, destination file) pairs,
    its RUN lines as install.sh steps, its ENV, the base (build.sh's podman command, printed by -n)."""
    text = (REPO / "containers/Containerfile").read_text().replace("${PLATFORM}", platform)
    copies, steps, env = set(), [], {}
    for line in text.splitlines():
        words = line.split()
        if line.startswith("COPY "):
            *sources, dest = words[1:]
            copies |= {(s, dest + s.rsplit("/", 1)[-1] if dest.endswith("/") else dest) for s in sources}
        elif line.startswith("RUN "):
            run = re.fullmatch(r'RUN bash /opt/pipeline/install.sh "\$PLATFORM" (\w+)', line)
            assert run, f"Containerfile: {line!r} is not an install.sh step"
            steps.append(run.group(1))
        elif line.startswith("ENV "):
            env.update(w.split("=", 1) for w in words[1:])
    commands = build_dry_run("--engine", "podman", platform)
    build = next(c for c in commands if c.startswith("+ podman build "))
    return {"copies": copies, "steps": steps, "env": env, "platform": re.search(r"PLATFORM=(\S+)", build).group(1),
            "base": re.search(r"BASE=(\S+)", build).group(1), "made": [c for c in commands if "debian_base" in c]}


def def_as_containerfile_steps(platform) -> dict:
    """containers/<platform>.def converted into the Containerfile steps it mirrors: %files as COPY pairs, %post's
    lines as install.sh steps of one platform, %environment as ENV, the header as the base podman builds over
    (debootstrap: containers/debian_base.sh makes OSVersion as the local image localhost/debian-base:<OSVersion>)."""
    header, sections = parse_def(platform)
    steps, platforms = [], set()
    for line in sections["post"]:
        run = re.fullmatch(r"bash /opt/pipeline/install.sh (\w+) (\w+)", line)
        assert run, f"{platform}.def: %post line {line!r} is not an install.sh step"
        platforms.add(run.group(1))
        steps.append(run.group(2))
    assert len(platforms) == 1, f"{platform}.def: %post runs install.sh for {platforms}"
    env = dict(re.fullmatch(r"export (\w+)=(\S+)", line).groups() for line in sections["environment"])
    debootstrap = header["Bootstrap"] == "debootstrap"
    return {"copies": {tuple(line.split()) for line in sections["files"]}, "steps": steps, "env": env,
            "platform": platforms.pop(),
            "base": f"localhost/debian-base:{header['OSVersion']}" if debootstrap else header["From"],
            "made": [f"+ containers/debian_base.sh {header['OSVersion']}"] if debootstrap else []}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_definition_file_converts_into_the_containerfile_steps(platform):
    """apptainer (.def) and podman (Containerfile) copy the same files and run the same containerised steps of
    containers/install.sh, for the same platform over the same base; neither installs anything itself, so the two
    images cannot drift apart."""
    converted = def_as_containerfile_steps(platform)
    assert converted == containerfile_steps(platform)
    assert converted["platform"] == platform and converted["steps"] == ["system", "python", "ops", "stamp"]
    assert converted["copies"] == {("containers/install.sh", "/opt/pipeline/install.sh"),
                                   ("envs/requirements.txt", "/opt/pipeline/requirements.txt"),
                                   (f"containers/.build/{platform}.recipe.json", "/opt/pipeline/recipe.json")}
    all_step = re.search(r"^  all\) (.*) ;;$", install_script(), re.M).group(1)
    assert [s.removesuffix("_step") for s in all_step.split("; ")] == converted["steps"]
    _, sections = parse_def(platform)
    for text in ("\n".join(sum(sections.values(), [])), (REPO / "containers/Containerfile").read_text()):
        assert not re.search(r"apt-get|pip install", text)
    # the build context holds only what the Containerfile copies: a study's work/ never travels to the builder
    ignore = [line for line in (REPO / ".containerignore").read_text().splitlines() if line and line[0] != "#"]
    assert ignore == ["*", "!containers/install.sh", "!envs/requirements.txt", "!containers/.build/"]


def test_the_debian_base_is_made_as_apptainers_debootstrap_makes_it():
    """Both builders' Debian: debootstrap's minbase variant of the .def's OSVersion from the build machine's apt
    mirror (apptainer: MirrorURL, the build argument build.sh fills)."""
    script = (REPO / "containers/debian_base.sh").read_text()
    assert 'debootstrap --variant=minbase "$suite" "$root" "$archive"' in script
    assert 'tag="localhost/debian-base:$suite"' in script
    mirror = "file:///srv/debian-mirror"  # no host: a mirror this machine would have
    done = subprocess.run(["bash", str(REPO / "containers/debian_base.sh"), "--mirror"], capture_output=True,
                          text=True, env={**os.environ, "DEBIAN_MIRROR": mirror})
    assert done.stdout.strip() == mirror
    commands = build_dry_run("--engine", "apptainer", *DEBOOTSTRAP, env={"DEBIAN_MIRROR": mirror})
    assert all(f"--build-arg DEBIAN_MIRROR={mirror} " in c for c in commands) and len(commands) == 2


def image_requirements(platform, tmp_path) -> dict[str, str]:
    shutil.copy(REPO / "envs/requirements.txt", tmp_path / "requirements.txt")
    out = subprocess.run(["bash", str(REPO / "containers/install.sh"), platform, "requirements"], check=True,
                         capture_output=True, text=True, env={**os.environ, "PIPELINE_DIR": str(tmp_path)}).stdout
    lines = [line.split("#")[0].strip() for line in out.splitlines() if line.split("#")[0].strip()]
    return {line.split("==")[0].lower(): line.split("==")[1] for line in lines}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_pin_is_installed_from_the_same_requirements_file(platform, tmp_path):
    """install.sh filters envs/requirements.txt: run its own filter on the real file and check what pip gets."""
    installed = image_requirements(platform, tmp_path)
    pins = requirement_pins()
    if platform == "cpu":  # the host's environment: torch first and alone (its CPU build), then every other pin
        assert installed == {k: v for k, v in pins.items() if k != "torch"}
        assert "'^torch=='" in function_body("python_cpu")
        return
    other_smi = VENDOR_SMI["rocm" if platform == "cuda" else "cuda"]
    assert installed == {k: v for k, v in pins.items() if k not in ("torch", "deepspeed", other_smi)}
    assert VENDOR_SMI[platform] in installed and other_smi not in installed
    body = function_body(f"python_{platform}")
    assert "pin_torch" in body and '-c "$P/constraints.txt"' in body  # torch's exact build, as a constraint
    assert 'print("torch==" + m.version("torch"))' in function_body("pin_torch")
    if platform == "cuda":  # the pin from PyPI, refused unless it is a CUDA build
        assert "'^torch=='" in body and "torch.version.cuda" in body
        assert body.index("'^torch=='") < body.index("pin_torch")
    else:  # never installed on the ROCm image: the base image's own build
        assert not re.search(r"pip install[^\n]*\btorch\b", body)
    assert "'^deepspeed=='" in function_body("ops_gpu")


def test_only_the_cpu_image_build_sees_local_wheels(tmp_path):
    """This machine's pip find-links (e.g. a CPU torch wheel) are mounted for the cpu image's build only: the cuda
    image's pip must take PyPI's CUDA build of the pin."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(wheels)}  # pip's settings: these alone
    builds = {p: next(c for c in build_dry_run("--engine", "podman", p, env=env) if c.startswith("+ podman build"))
              for p in ("cpu", "cuda")}
    assert f"-v {wheels}:/run/build/wheels0:ro" in builds["cpu"] and "BUILD_PIP_FIND_LINKS=" in builds["cpu"]
    assert "wheels" not in builds["cuda"] and "FIND_LINKS" not in builds["cuda"]
    assert all("-v /etc/ssl/certs/ca-certificates.crt:/run/build/ca.crt:ro" in c for c in builds.values()) or \
        not os.path.exists("/etc/ssl/certs/ca-certificates.crt")


def needed_ops() -> dict[str, tuple[str, str]]:
    """op builder class -> (op name, DS_BUILD_ variable), for every op a strategy loads (its own, and those its
    options can add), as DeepSpeed's CUDA accelerator (used by CUDA and ROCm torch alike) resolves them."""
    code = (
        "import json, sys\n"
        "from workflow_scripts.training.build_ops import needed_ops\n"
        "from workflow_scripts.training.strategies import STRATEGIES\n"
        "from workflow_scripts.training.strategies._deepspeed import option_ops\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "ops = {op for s in STRATEGIES for op in needed_ops(s)}\n"
        "ops = sorted(ops | set(option_ops({'compile': {'deepcompile': True}})))\n"
        "out = {}\n"
        "for op in ops:\n"
        "    b = get_accelerator().create_op_builder(op)\n"
        "    out[op] = [b.NAME, b.BUILD_VAR]\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                          env={**os.environ, "DS_ACCELERATOR": "cuda"})
    return {k: tuple(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def shell_value(name: str) -> str:
    return re.search(rf'^{name}="([^"]*)"$', install_script(), re.M).group(1)


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_deepspeed_ops_are_compiled_into_the_gpu_images(platform):
    body = function_body("ops_gpu").replace("\\\n", " ")
    ops = needed_ops()
    assert {"CPUAdamBuilder", "AsyncIOBuilder", "QuantizerBuilder", "DeepCompileBuilder"} <= set(ops), ops
    install = next(line for line in body.splitlines() if '"$ds_spec"' in line and "pip install" in line)
    assert "$GPU_OP_BUILD" in install and "--no-build-isolation" in install
    assert "DS_BUILD_OPS=0" in body and "DS_ACCELERATOR=cuda" in body  # named, not detected: no GPU at build
    built, checked = shell_value("GPU_OP_BUILD").split(), shell_value("GPU_OPS").split()
    tests = "\n".join(parse_def(platform)[1]["test"])
    for builder, (name, build_var) in {**ops, "FusedAdamBuilder": ("fused_adam", "DS_BUILD_FUSED_ADAM")}.items():
        assert f"{build_var}=1" in built, f"{builder}: {build_var}=1 missing from the DeepSpeed install"
        assert name in checked, f"{builder}: the build does not verify that {name} was compiled"
        assert f'"{name}"' in tests, f"{builder}: %test does not check {name}"
    assert body.index("check_ops") > body.index('"$ds_spec"')
    assert "libaio-dev" in function_body("system")  # async_io links libaio
    arch_var, archs = ("TORCH_CUDA_ARCH_LIST", "CUDA_ARCHS") if platform == "cuda" else ("PYTORCH_ROCM_ARCH",
                                                                                        "ROCM_ARCHS")
    assert body.index(f'{arch_var}="${archs}"') < body.index('"$ds_spec"'), f"{arch_var} set before the build"
    if platform == "cuda":  # sm_80, 86, 89, 90 + PTX; DeepSpeed's op builder cannot parse suffixes such as 9.0a
        assert shell_value(archs) == "8.0;8.6;8.9;9.0+PTX"
    else:
        assert all(re.fullmatch(r"gfx[0-9a-f]+", a) for a in shell_value(archs).split(";")), shell_value(archs)


def test_the_cuda_toolkit_is_present_for_the_op_build_only():
    """The toolkit comes from PyPI at the release torch's wheel requires, serves as CUDA_HOME for the build, and is
    uninstalled in the same step (what it added, recorded before)."""
    toolkit, body = function_body("cuda_toolkit"), function_body("ops_gpu")
    assert 'm.requires("torch")' in toolkit and '"cuda-toolkit[nvcc,cccl]==$release"' in toolkit
    assert 'build-only.txt"' in toolkit and "pip freeze" in toolkit
    order = [body.index(s) for s in ('cuda_toolkit "$tmp/cuda"', 'export CUDA_HOME="$tmp/cuda"', '"$ds_spec"',
                                     'pip uninstall -q -y $(cat "$tmp/cuda/build-only.txt")', 'rm -rf "$tmp"')]
    assert order == sorted(order)


def test_the_portable_compiler_rewrites_only_the_machine_specific_flags(tmp_path):
    """DeepSpeed's CPU ops ask for -march=native and the build machine's SIMD width; the image's c++ compiles for
    x86-64-v3 and AVX2 instead and passes every other argument as given (a stand-in /usr/bin/c++ is not possible
    here, so the generated script is run with its exec line pointed at echo)."""
    script = re.search(r"<<'SH'\n(.*?)^SH$", function_body("portable_cxx"), re.S | re.M).group(1)
    assert "exec /usr/bin/c++ " in script
    (tmp_path / "c++").write_text(script.replace("exec /usr/bin/c++ ", "exec echo "))
    out = subprocess.run(["bash", str(tmp_path / "c++"), "-O3", "-march=native", "-fopenmp", "-D__AVX512__",
                          "-DBF16_AVAILABLE", "a b.cpp"], capture_output=True, text=True, check=True).stdout
    assert out.split(" ", 5) == ["-O3", "-march=x86-64-v3", "-fopenmp", "-D__AVX256__", "-DBF16_AVAILABLE",
                                 "a b.cpp\n"]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_image_self_test_imports_the_stack(platform):
    _, sections = parse_def(platform)
    imports = " ".join(sections["test"])
    modules = {"cpu": [], "cuda": ["pynvml"], "rocm": ["amdsmi"]}[platform]
    for module in ("torch", "deepspeed", "snakemake", *modules):
        assert re.search(rf"import [^;']*\b{module}\b", imports), module


def build_dry_run(*args, env=None) -> list[str]:
    done = subprocess.run(["bash", str(REPO / "containers/build.sh"), "-n", *args], capture_output=True, text=True,
                          check=True, cwd="/", env={**os.environ, "DEBIAN_MIRROR": "file:///srv/debian-mirror",
                                                    **(env or {})})
    return [line for line in done.stdout.splitlines() if line.startswith("+ ")]


def test_build_script_builds_each_image_from_its_recipe():
    mirror = "file:///srv/debian-mirror"
    fakeroot = "--fakeroot " if os.geteuid() else ""
    assert build_dry_run("--engine", "apptainer", "cpu", "cuda", "rocm", env={"DEBIAN_MIRROR": mirror}) == [
        f"+ apptainer build {fakeroot}{f'--build-arg DEBIAN_MIRROR={mirror} ' if p in DEBOOTSTRAP else ''}"
        f"containers/images/{p}.sif containers/{p}.def" for p in PLATFORMS]
    podman = build_dry_run("--engine", "podman", "cuda")
    assert podman[0] == "+ containers/debian_base.sh bookworm"
    assert podman[1].startswith("+ podman build -f containers/Containerfile --build-arg "
                                "BASE=localhost/debian-base:bookworm --build-arg PLATFORM=cuda")
    assert podman[2:] == ["+ podman save --format oci-archive -o containers/images/cuda.oci.tar.tmp "
                          "localhost/dist-train-studies-cuda:latest",
                          "+ mv containers/images/cuda.oci.tar.tmp containers/images/cuda.oci.tar"]
    rocm = build_dry_run("--engine", "podman", "rocm")
    assert f"BASE={parse_def('rocm')[0]['From']} --build-arg PLATFORM=rocm" in rocm[0]
    # --base debootstrap, as before the recipe made it the default: the same base
    assert build_dry_run("--engine", "podman", "--base", "debootstrap", "cpu")[:2] == build_dry_run(
        "--engine", "podman", "cpu")[:2]
    refused = subprocess.run(["bash", str(REPO / "containers/build.sh"), "-n", "--engine", "podman", "--base",
                              "debootstrap", "rocm"], capture_output=True, text=True, cwd="/")
    assert refused.returncode == 2 and "rocm.def builds over rocm/pytorch:" in refused.stderr


def test_build_script_refuses_an_unknown_platform():
    done = subprocess.run(["bash", str(REPO / "containers/build.sh"), "-n", "tpu"], capture_output=True, text=True)
    assert done.returncode == 2 and "containers/tpu.def" in done.stderr and not done.stdout


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
    (bin_dir / "apptainer").symlink_to(REPO / "tests/fakes/apptainer")  # a link: it imports tests/adapters
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
    """Snakemake hands a local image path to apptainer untouched; the workflow refuses a missing image, so an empty
    placeholder stands where containers/build.sh would put the image (`containers.<platform>: auto` finds it)."""
    assert yaml.safe_load((REPO / "schemas/config.schema.yaml").read_text())[
        "properties"]["containers"]["properties"][platform]["default"] == "auto"
    image = wd / f"containers/images/{platform}.sif"
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
    assert len(jobs) == 12 and len(calls) == len(jobs), (jobs, [c["command"][-1][:60] for c in calls])
    args = profile_args("local-cuda")
    assert args == ["--nv"]
    for call in calls:
        assert call["argv"][1] == "exec" and call["image"] == image and call["image_exists"]
        assert "--nv" in call["flags"]  # from the profile: Snakemake never adds it
        assert ("--home", str(wd)) in option_pairs(call)  # Snakemake's own: the working directory as HOME
        assert call["command"][:2] == ["bash", "-c"]
        assert "python3 -m workflow_scripts." in call["command"][2] or "cp -v " in call["command"][2]  # manifests
        assert call["cwd"] == str(wd)
    ran = sorted(re.search(r"python3 -m workflow_scripts\.([\w.]+)", c["command"][2]).group(1) for c in calls
                 if "cp -v " not in c["command"][2])
    assert ran == sorted(["data.corpus", "data.tokenizer", "data.tokenize", "job.random_init", "measure.calibrate",
                          "job.launch", "report.calibration", "report.parse", "report.tables", "report.figures",
                          "report.findings"])


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
    _, calls = with_standin(standin, wd, "corpus", "--profile", f"profiles/{profile}",
                           *study_overlay(wd, platform=platform, devices_per_node=2))
    assert len(calls) == 1
    call = calls[0]
    assert call["image"] == image == f"containers/images/{platform}.sif"
    assert set(call["flags"]) == flags
    assert binds <= set(call["binds"])
    assert "--rocm" not in call["flags"]  # ROCm: device binds, never the host's ROCm libraries over the image's


def test_a_missing_image_is_one_error_before_any_job(standin, tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    target = "corpus"  # the first rule of the DAG
    done, calls = with_standin(standin, wd, target, "--profile", "profiles/local-cpu", *study_overlay(wd),
                               check=False)
    assert done.returncode != 0 and not list(wd.glob("work/**/corpus.jsonl")) and calls == []
    assert "containers.cpu: no image for platform cpu under --use-apptainer" in done.stderr
    assert "containers/build.sh cpu" in done.stderr
    overlay = study_overlay(wd, "named.yaml", containers={"cpu": "images/nowhere.sif"})
    done, calls = with_standin(standin, wd, target, *overlay, check=False)
    assert done.returncode != 0 and calls == []
    assert "containers.cpu: image images/nowhere.sif not found under --use-apptainer" in done.stderr
    # without --use-apptainer no image is needed
    snakemake(wd, target, *study_overlay(wd), timeout=300)
    assert len(list(wd.glob("work/data/*/corpus.jsonl"))) == 1


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


def test_timed_runs_never_overlap_under_a_local_profile(default_study):
    """Two one-rank runs fit the two cores at once; the profile's timed_runs=1 must still run them one by one. In the
    default study's folder with its data settings (the prepared data shared), the two training jobs as targets."""
    wd, results = default_study, "results/timed"
    (wd / "timed.yaml").write_text(yaml.safe_dump({"results_dir": results, "work_dir": "work/timed",
                                                   "strategies": ["ddp", "fsdp"], "world_sizes": [1],
                                                   "train": REDUCED["train"]}))
    reuse_calibration(wd, results)
    runs = [f"{results}/runs/gpt2-tiny/{strategy}/ws1/r0" for strategy in ("ddp", "fsdp")]
    snakemake(wd, *[f"{run}/summary.json" for run in runs], "--profile", "profiles/local-cpu",
              "--configfile", "config.yaml", "timed.yaml", timeout=600)  # targets first: --configfile takes the rest
    spans = sorted((p["start_unix"], p["end_unix"]) for p in (
        json.loads((wd / run / "provenance.json").read_text()) for run in runs))
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], spans


# ------------------------------------------------------------------ images: which one, its digest, its unpacking
def oci_archive(path, layers: list[dict[str, bytes | None]], env=("PATH=/opt/bin:/usr/bin",)) -> str:
    """A minimal OCI archive: each layer maps a path to its content (None: a directory; a `.wh.` name: a
    whiteout). Returns the manifest digest."""
    import hashlib
    import io
    import tarfile

    blobs, layer_descs = {}, []

    def add(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest

    for layer in layers:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, content in layer.items():
                info = tarfile.TarInfo(name)
                if content is None:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                else:
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
        layer_descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": add(buf.getvalue()),
                            "size": len(buf.getvalue())})
    config = add(json.dumps({"config": {"Env": list(env)}}).encode())
    manifest = add(json.dumps({"schemaVersion": 2, "config": {"digest": config}, "layers": layer_descs}).encode())
    index = json.dumps({"schemaVersion": 2, "manifests": [{"digest": manifest}]}).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), ("index.json", index)] + [
                (f"blobs/sha256/{d.split(':')[1]}", b) for d, b in blobs.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
    return manifest


def load_adapter():
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("adapter", str(REPO / "tests/adapters/apptainer-over-bwrap"))
    spec = importlib.util.spec_from_loader("adapter", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_adapter_unpacks_layers_and_applies_whiteouts(tmp_path, monkeypatch):
    adapter = load_adapter()
    archive = tmp_path / "img.oci.tar"
    digest = oci_archive(archive, [
        {"opt": None, "opt/keep": b"1", "opt/gone": b"2", "etc": None, "etc/old": None, "etc/old/a": b"3"},
        {"opt/.wh.gone": b"", "etc/old/.wh..wh..opq": b"", "etc/old/b": b"4", "opt/new": b"5"},
    ])
    monkeypatch.setenv("APPTAINER_CACHEDIR", str(tmp_path / "cache"))
    rootfs, config = adapter.rootfs_of(str(archive))
    assert rootfs.name == digest.replace(":", "-") and config["config"]["Env"] == ["PATH=/opt/bin:/usr/bin"]
    files = sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*") if p.is_file())
    assert files == ["etc/hosts", "etc/old/b", "etc/resolv.conf", "opt/keep", "opt/new"]
    assert adapter.rootfs_of(str(archive))[0] == rootfs  # unpacked once per digest
    # pull/build link the archive as the image file; anything but an OCI archive is refused by name
    assert adapter.main(["pull", "--name", str(tmp_path / "x.simg"), f"oci-archive://{archive}"]) == 0
    assert os.path.samefile(tmp_path / "x.simg", archive)
    assert adapter.main(["pull", "--name", str(tmp_path / "y.simg"), "docker://debian:bookworm"]) == 255
    (tmp_path / "fake.sif").write_bytes(b"SIF_MAGIC")
    assert adapter.main(["exec", str(tmp_path / "fake.sif"), "true"]) == 255


def test_the_adapter_gives_the_container_apptainers_environment(tmp_path, monkeypatch):
    adapter = load_adapter()
    monkeypatch.setenv("SINGULARITYENV_STUDY", "x")
    monkeypatch.setenv("HOST_ONLY", "kept")
    call = adapter.parse_exec(["--home", str(tmp_path), "--env", "A=1", "img", "bash"])
    env = adapter.container_env(call, "/abs/img", {"config": {"Env": ["PATH=/opt/bin", "HOST_ONLY=image"]}},
                                str(tmp_path))
    assert env["PATH"] == "/opt/bin" and env["STUDY"] == "x" and "SINGULARITYENV_STUDY" not in env
    assert env["HOST_ONLY"] == "kept" and env["A"] == "1" and env["HOME"] == str(tmp_path)
    assert env["APPTAINER_CONTAINER"] == "/abs/img" and env["APPTAINER_NAME"] == "img"
    clean = adapter.container_env(adapter.parse_exec(["--cleanenv", "img", "bash"]), "/abs/img", {}, "/h")
    assert "HOST_ONLY" not in clean


def test_provenance_reads_the_image_inside_and_nothing_on_the_host(tmp_path, monkeypatch):
    from workflow_scripts.measure import container

    monkeypatch.delenv("APPTAINER_CONTAINER", raising=False)
    monkeypatch.delenv("SINGULARITY_CONTAINER", raising=False)
    assert container.facts(tmp_path / "no-image.json") is None  # the host
    archive = tmp_path / "img.oci.tar"
    digest = oci_archive(archive, [{"opt": None}])
    baked = tmp_path / "image.json"
    baked.write_text(json.dumps({"recipe_commit": "abc", "platform": "cpu"}))
    monkeypatch.setenv("APPTAINER_CONTAINER", str(archive))
    facts = container.facts(baked)
    assert facts["digest"] == digest and facts["digest_kind"] == "oci-manifest"
    assert facts["baked"]["recipe_commit"] == "abc"
    sif = tmp_path / "img.sif"
    sif.write_bytes(b"SIF_MAGIC" + bytes(100))
    monkeypatch.setenv("APPTAINER_CONTAINER", str(sif))
    import hashlib

    facts = container.facts(baked)
    assert facts["digest"] == "sha256:" + hashlib.sha256(sif.read_bytes()).hexdigest()
    assert facts["digest_kind"] == "file-sha256" and (tmp_path / "img.sif.sha256").exists()  # hashed once


def test_auto_finds_the_built_image_and_a_rebuilt_archive_is_converted_again(tmp_path, monkeypatch):
    from workflow_scripts import container_image as ci

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ci.ImageError, match=r"containers\.cpu: no image .* `containers/build.sh cpu`"):
        ci.settle("auto", "cpu", using_apptainer=True, image_dir=".snakemake/singularity")
    assert ci.settle("auto", "cpu", using_apptainer=False, image_dir="x") == "containers/images/cpu.sif"
    (tmp_path / "containers/images").mkdir(parents=True)
    archive = tmp_path / "containers/images/cpu.oci.tar"
    archive.write_bytes(b"v1")
    url = ci.settle("auto", "cpu", using_apptainer=True, image_dir=".snakemake/singularity")
    assert url == f"oci-archive://{archive}"
    assert ci.resolve("oci-archive://containers/images/cpu.oci.tar", "cpu") == url  # absolute: pulled elsewhere
    converted = tmp_path / ".snakemake/singularity" / (__import__("hashlib").md5(url.encode()).hexdigest() + ".simg")
    converted.parent.mkdir(parents=True)
    os.link(archive, converted)
    assert ci.drop_stale_conversion(url, ".snakemake/singularity") is None  # the archive itself: fresh
    (tmp_path / "new.tar").write_bytes(b"v2")
    os.utime(tmp_path / "new.tar", (converted.stat().st_mtime + 10,) * 2)
    os.replace(tmp_path / "new.tar", archive)  # containers/build.sh's rename
    assert ci.drop_stale_conversion(url, ".snakemake/singularity") == ".snakemake/singularity/" + converted.name
    assert not converted.exists()
    (tmp_path / "containers/images/cpu.sif").write_bytes(b"")
    assert ci.settle("auto", "cpu", using_apptainer=True, image_dir="x") == "containers/images/cpu.sif"
    assert ci.settle("docker://x/y:1", "cpu", using_apptainer=True, image_dir="x") == "docker://x/y:1"


def test_op_sources_compile_against_one_precompiled_header(tmp_path, monkeypatch):
    """build_ops' masquerading c++: with an op of many sources, the first compile builds the header (once, with the
    object's flags less source, output, depfile and -g) and every compile of a source with torch (itself or through
    its own header) includes it, one without torch does not; an op of few sources, a link and `-v` pass through as
    given. A STAND-IN compiler records each call and writes what -o names."""
    from workflow_scripts.training import precompiled_header as ph

    calls = tmp_path / "calls.jsonl"
    real = tmp_path / "cc"
    real.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + "
                    "'\\n')\nif '-o' in sys.argv: open(sys.argv[sys.argv.index('-o') + 1], 'w').close()\n")
    real.chmod(0o755)
    op = tmp_path / "op"
    op.mkdir()
    monkeypatch.chdir(op)
    src = tmp_path / "src"
    (src / "inc").mkdir(parents=True)
    (src / "inc/op.h").write_text("#pragma once\n#include <torch/extension.h>\n")
    (src / "inc/plain.h").write_text("#pragma once\n#include <vector>\n")
    for name, includes in {"a": "<torch/extension.h>", "b": '"op.h"', "c": "<ATen/ATen.h>", "d": '"plain.h"',
                           "e": "<op.h>"}.items():
        (src / f"{name}.cpp").write_text(f"#include <cmath>\n#include {includes}\nint {name}() {{ return 0; }}\n")
    compile_line = (f"-MMD -MF {{0}}.o.d -DTORCH_EXTENSION_NAME=op -O3 -g -fPIC -I{src / 'inc'} -c {src}/{{0}}.cpp "
                    "-o {0}.o")
    root = tmp_path / "headers"

    def run(argv):
        command = ph.compile_command(argv, str(real), root)
        subprocess.run(command, check=True)
        return command

    (op / "build.ninja").write_text("".join(f"build {s}.o: compile /src/{s}.cpp\n" for s in "ab")
                                    + "build op.so: link a.o b.o\n")
    assert run(compile_line.format("a").split()) == [str(real), *compile_line.format("a").replace(" -g", "").split()]
    (op / "build.ninja").write_text("".join(f"build {s}.o: compile /src/{s}.cpp\n" for s in "abcde"))
    commands = {s: run(compile_line.format(s).split()) for s in "abcde"}
    headers = {c[c.index("-include") + 1] for s, c in commands.items() if s != "d"}
    assert len(headers) == 1 and all("-g" not in c for c in commands.values())
    assert commands["d"] == [str(real), *compile_line.format("d").replace(" -g", "").split()]  # no torch: as given
    recorded = [json.loads(line) for line in calls.read_text().splitlines()]
    builds = [c for c in recorded if "c++-header" in c]
    assert len(builds) == 1 and builds[0][:-5] == f"-DTORCH_EXTENSION_NAME=op -O3 -fPIC -I{src / 'inc'}".split()
    assert ph.compile_command(["-v"], str(real), root) == [str(real), "-v"]
    assert ph.compile_command(["a.o", "-shared", "-o", "op.so"], str(real), root)[1:] == ["a.o", "-shared", "-o",
                                                                                            "op.so"]


def test_an_op_the_cache_built_is_answered_without_deepspeed(tmp_path):
    """A study's build_op job for an op this op cache recorded as built (its library still there) answers at once,
    without importing DeepSpeed; with the library gone the record is not trusted."""
    ext = tmp_path / "ext"
    (ext / "cpu_adam").mkdir(parents=True)
    library = ext / "cpu_adam" / "cpu_adam.so"
    library.write_bytes(b"")
    (ext / "CPUAdamBuilder.built.json").write_text(json.dumps({"ok": True, "seconds": 61.0, "error": None,
                                                                "library": str(library)}))
    probe = ("import sys; from workflow_scripts.training import build_ops as b; "
             "b.main(['--op', 'CPUAdamBuilder', '--platform', 'cpu', '--out', sys.argv[1]]); "
             "assert 'deepspeed' not in sys.modules; library = sys.argv[2]; import os; os.remove(library); "
             "assert b.built_before('CPUAdamBuilder') is None")
    subprocess.run([sys.executable, "-c", probe, str(tmp_path / "op.json"), str(library)], cwd=REPO, check=True,
                   env={**os.environ, "TORCH_EXTENSIONS_DIR": str(ext)}, capture_output=True)
    result = json.loads((tmp_path / "op.json").read_text())
    assert result["ok"] and result["cached"] and result["seconds"] == 61.0
