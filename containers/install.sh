#!/usr/bin/env bash
# Everything an image of the pipeline holds, installed by this one script, whichever tool builds the image:
#   containers/Containerfile   (podman / buildah / docker: one layer per step below)
#   containers/<platform>.def  (apptainer: %post runs the same steps)
#
#   install.sh PLATFORM STEP      PLATFORM: cpu | cuda | rocm      STEP: system | python | ops | stamp | all
#   install.sh PLATFORM requirements   print the pins pip installs into that image (envs/requirements.txt, filtered)
#
# cpu: a plain Debian base. Python, a compiler (DeepSpeed JIT-builds its CPU ops at the study's build_ops stage, as
#      on a host) and every pin of envs/requirements.txt, torch first and alone, as envs/setup.sh does: the same
#      environment as a host install, so a study gives the host's losses bit for bit.
# cuda: the same Debian base, Python and compiler; the pinned torch's CUDA build from PyPI (its nvidia-* wheels
#      carry the CUDA runtime, cuBLAS, cuDNN and NCCL; the driver is the host's, `apptainer --nv`), every other pin
#      but the other vendor's monitoring library; DeepSpeed with the ops the strategies load compiled at build time
#      (ops step) by a CUDA toolkit made of PyPI wheels of torch's own CUDA release, removed again in that step.
# rocm: the vendor's PyTorch image (ROCm builds of torch are not on PyPI). Its torch stays (a constraint pins its
#      exact build); every other pin but the other vendor's monitoring library; DeepSpeed's ops compiled (ops step).
#
# Build-time only (never baked into the image): BUILD_PIP_CERT (a CA bundle for pip), BUILD_PIP_FIND_LINKS (a
# directory of wheels, e.g. a local CPU torch wheel: the cpu image only), BUILD_PIP_INDEX_URL /
# BUILD_PIP_EXTRA_INDEX_URL.
set -euo pipefail
P="${PIPELINE_DIR:-/opt/pipeline}"
platform="${1:-}"
step="${2:-all}"
case "$platform" in
  cpu | cuda | rocm) ;;
  *) echo "install.sh: unknown platform '$platform' (cpu, cuda, rocm)" >&2; exit 2 ;;
esac
export DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore \
  PIP_DISABLE_PIP_VERSION_CHECK=1
[ -n "${BUILD_PIP_CERT:-}" ] && export PIP_CERT="$BUILD_PIP_CERT"
[ -n "${BUILD_PIP_FIND_LINKS:-}" ] && export PIP_FIND_LINKS="$BUILD_PIP_FIND_LINKS"
[ -n "${BUILD_PIP_INDEX_URL:-}" ] && export PIP_INDEX_URL="$BUILD_PIP_INDEX_URL"
[ -n "${BUILD_PIP_EXTRA_INDEX_URL:-}" ] && export PIP_EXTRA_INDEX_URL="$BUILD_PIP_EXTRA_INDEX_URL"

# The DeepSpeed ops compiled into the GPU images: every op a strategy loads (Strategy.ops and the options' ops,
# workflow_scripts/training/build_ops.py), by DeepSpeed's op name and its DS_BUILD_ variable. pin_memory comes along
# with async_io (DeepSpeed's setup adds it).
GPU_OPS="cpu_adam async_io fused_adam quantizer dc"
GPU_OP_BUILD="DS_BUILD_CPU_ADAM=1 DS_BUILD_AIO=1 DS_BUILD_FUSED_ADAM=1 DS_BUILD_QUANTIZER=1 DS_BUILD_DEEP_COMPILE=1"
# For A100, A10/3090, L4/4090, H100/H200, PTX for newer (DeepSpeed's op builder cannot parse "9.0a"-style entries);
# MI250X, MI300X.
CUDA_ARCHS="8.0;8.6;8.9;9.0+PTX"
ROCM_ARCHS="gfx90a;gfx942"

# The VRAM sampler's library: one per GPU vendor; the CPU image has both, as a host install does.
other_vendor_smi() {
  case "$platform" in cuda) echo amdsmi ;; rocm) echo nvidia-ml-py ;; cpu) echo "" ;; esac
}

# What pip installs with -r in the python step: every pin but torch (installed first, or the base image's) and,
# on GPU images, the other vendor's monitoring library and deepspeed (built with its ops in the ops step).
requirements() {
  local drop="torch"
  [ "$platform" = cpu ] || drop="torch|deepspeed|$(other_vendor_smi)"
  grep -Ev "^(${drop})==" "$P/requirements.txt"
}

# pip installs the pins `requirements` prints (more pip arguments: "$@"); those marked `# no-deps` without their
# declared dependencies (envs/requirements.txt says why).
install_requirements() {
  python3 -m pip install -q -r <(requirements | grep -v '# no-deps$') "$@"
  # shellcheck disable=SC2046
  python3 -m pip install -q --no-deps $(requirements | grep '# no-deps$' | cut -d' ' -f1) "$@"
}

system() {
  local packages="libaio-dev git ca-certificates"  # libaio: DeepSpeed's async_io op; git: provenance's commit
  if [ "$platform" != rocm ]; then  # the Debian base: Python; g++ + headers for DeepSpeed's and Triton's builds
    packages="$packages python3 python3-pip python3-dev g++"
  fi
  apt-get update -q
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $packages
  rm -rf /var/lib/apt/lists/*
}

# torch's exact build, as a constraint: no later requirement can replace it (the distribution's version: PyPI's
# CUDA build calls itself 2.13.0+cu130 at run time, 2.13.0 to pip)
pin_torch() {
  python3 -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' > "$P/constraints.txt"
}

python_cpu() {
  python3 -m pip install -q "$(grep -E '^torch==' "$P/requirements.txt")"
  install_requirements
}

python_cuda() {
  # the pin's default wheel on PyPI is its CUDA build; a wheel directory of CPU builds must not be in reach
  python3 -m pip install -q "$(grep -E '^torch==' "$P/requirements.txt")"
  python3 -c 'import sys, torch; sys.exit(None if torch.version.cuda else f"install.sh: pip installed torch {torch.__version__}, a build without CUDA (a directory of CPU wheels in reach of pip?)")'
  pin_torch
  install_requirements -c "$P/constraints.txt"
}

python_rocm() {
  pin_torch  # the base image's torch stays
  install_requirements -c "$P/constraints.txt"
}

# The CUDA toolkit DeepSpeed compiles with, from PyPI, for the ops step only (into directory $1): the cuda-toolkit
# release torch's wheel requires (nvcc must match torch's CUDA), its nvcc and CCCL extras. The wheels share one tree
# (site-packages/nvidia/cu<major>: bin/nvcc, include/, lib/) with the runtime wheels torch already has; CUDA_HOME
# ($1) is a directory of links to it and to the headers of torch's other CUDA wheels (NCCL, cuDNN), plus what the
# wheels lack: lib64 (where torch's extension builder links), libcudart.so and an empty libcuda.so stub (async_io
# links -lcuda; the driver's libcuda.so.1 answers at run time).
# The packages it added, for the step to remove: $1/build-only.txt.
cuda_toolkit() {
  local home="$1" release tree before
  release="$(python3 -c '
import importlib.metadata as m, re
pins = [x.group(1) for r in m.requires("torch") or [] if (x := re.match(r"cuda-toolkit\[.*\]\s*==\s*([^;\s]+)", r))]
print(pins[0] if pins else "")')"
  [ -n "$release" ] || { echo "install.sh: torch's wheel requires no cuda-toolkit release: no toolkit to match" >&2; exit 1; }
  before="$(python3 -m pip freeze | sort)"
  python3 -m pip install -q -c "$P/constraints.txt" "cuda-toolkit[nvcc,cccl]==$release"
  comm -13 <(echo "$before") <(python3 -m pip freeze | sort) | cut -d= -f1 > "$home/build-only.txt"
  tree="$(python3 -c 'import os, nvidia, torch; print(os.path.join(list(nvidia.__path__)[0], "cu" + torch.version.cuda.split(".")[0]))')"
  [ -x "$tree/bin/nvcc" ] || { echo "install.sh: no nvcc in $tree after installing cuda-toolkit[nvcc]==$release" >&2; exit 1; }
  mkdir -p "$home/lib64" "$home/include"
  ln -s "$tree/bin" "$tree/nvvm" "$home/"
  local include  # the toolkit's headers and those of torch's other CUDA wheels (nccl.h: DeepCompile), as links
  for include in "$tree/include" "$(dirname "$tree")"/*/include; do cp -rsn "$include/." "$home/include/"; done
  ln -s "$tree"/lib/* "$home/lib64/"
  ln -s "$(basename "$tree"/lib/libcudart.so.*)" "$home/lib64/libcudart.so"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$home/lib64/libcuda.so" -x c /dev/null
  echo "CUDA toolkit for the build: cuda-toolkit $release ($("$home/bin/nvcc" --version | grep -o 'release [^,]*')):" \
    "$(tr '\n' ' ' < "$home/build-only.txt")"
}

# DeepSpeed's CPU ops compile with -march=native and the build machine's widest SIMD: built into an image, they
# would stop with an illegal instruction on a node of an older CPU (AVX-512 built, a node of AVX2 only). For the
# image, a c++ in $1 that compiles for x86-64-v3 (AVX2, FMA: Intel since Haswell, AMD since Zen) instead.
portable_cxx() {
  cat > "$1/c++" <<'SH'
#!/bin/bash
args=()
for a in "$@"; do
  case "$a" in -march=native) a=-march=x86-64-v3 ;; -D__AVX512__) a=-D__AVX256__ ;; esac
  args+=("$a")
done
exec /usr/bin/c++ "${args[@]}"
SH
  chmod +x "$1/c++"
}

# DeepSpeed (the pinned version) with GPU_OPS compiled against this torch (--no-build-isolation), no GPU needed:
# the accelerator and the architectures are named, not detected.
ops_gpu() {
  local ds_spec tmp
  ds_spec="$(grep -E '^deepspeed==' "$P/requirements.txt")"
  python3 -m pip install -q -c "$P/constraints.txt" ninja  # DeepSpeed's own requirement: parallel compiles
  tmp="$(mktemp -d)"
  mkdir -p "$tmp/bin" "$tmp/cuda"
  export DS_ACCELERATOR=cuda DS_BUILD_OPS=0 DS_ENABLE_NINJA=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}"
  export TORCH_CUDA_ARCH_LIST="$CUDA_ARCHS" PYTORCH_ROCM_ARCH="$ROCM_ARCHS"
  if [ "$(uname -m)" = x86_64 ]; then portable_cxx "$tmp/bin"; export CXX="$tmp/bin/c++"; fi
  # a machine that has a CUDA toolkit (CUDA_HOME with bin/nvcc: a GPU node checking this step) builds with it
  local own_toolkit=0
  if [ "$platform" = cuda ] && [ ! -x "${CUDA_HOME:-/nonexistent}/bin/nvcc" ]; then
    cuda_toolkit "$tmp/cuda"; export CUDA_HOME="$tmp/cuda"; own_toolkit=1
  fi
  # shellcheck disable=SC2086
  env $GPU_OP_BUILD python3 -m pip install -q --no-build-isolation -c "$P/constraints.txt" "$ds_spec"
  if [ "$own_toolkit" = 1 ]; then  # the toolkit goes: no compute node compiles
    # shellcheck disable=SC2046
    python3 -m pip uninstall -q -y $(cat "$tmp/cuda/build-only.txt")
  fi
  rm -rf "$tmp"
  unset CUDA_HOME CXX
  check_ops
}

# Every op of GPU_OPS installed, by DeepSpeed's own record; on CUDA each op with device code holds it; on x86_64 the
# CPU ops use no AVX-512 register (portable_cxx).
check_ops() {
  python3 - "$GPU_OPS" <<'PY'
import glob, os, platform, subprocess, sys
from deepspeed.git_version_info import installed_ops, accelerator_name
import deepspeed
need = sys.argv[1].split()
missing = [op for op in need if not installed_ops.get(op)]
assert not missing, f"install.sh: DeepSpeed ops not pre-built: {missing} (installed: {installed_ops})"
root = os.path.dirname(deepspeed.__file__)
libs = {os.path.basename(p).split(".")[0]: p for p in glob.glob(f"{root}/ops/**/*_op*.so", recursive=True)}
for op in ("fused_adam", "quantizer") if accelerator_name == "cuda" else ():
    sections = subprocess.run(["readelf", "-SW", libs[f"{op}_op"]], capture_output=True, text=True, check=True).stdout
    assert ".nv_fatbin" in sections, f"install.sh: {libs[op + '_op']} holds no CUDA device code (built without nvcc?)"
for op in ("cpu_adam", "async_io") if platform.machine() == "x86_64" else ():
    code = subprocess.run(["objdump", "-d", libs[f"{op}_op"]], capture_output=True, text=True, check=True).stdout
    assert "%zmm" not in code, f"install.sh: {libs[op + '_op']} uses AVX-512 (compiled for the build machine)"
print(f"pre-built DeepSpeed ops ({accelerator_name}):", ", ".join(sorted(op for op, on in installed_ops.items() if on)))
PY
}

# /opt/pipeline/image.json: what a job reads from inside the container (measure/container.py) — the platform, the
# recipe's commit (recipe.json, written by containers/build.sh), torch's CUDA/HIP release, the DeepSpeed ops
# compiled in and the versions actually installed.
stamp() {
  python3 - "$P" "$platform" <<'EOF'
import importlib.metadata as m, json, os, platform, sys
P, plat = sys.argv[1], sys.argv[2]
recipe = json.load(open(os.path.join(P, "recipe.json"))) if os.path.exists(os.path.join(P, "recipe.json")) else {}
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
import torch
from deepspeed.git_version_info import installed_ops
facts = {"platform": plat, **recipe, "python": platform.python_version(),
         "torch_cuda": torch.version.cuda, "torch_hip": torch.version.hip,
         "deepspeed_ops": sorted(op for op, on in installed_ops.items() if on),  # compiled in (none: JIT, cpu)
         "installed": {p: version(p) for p in ("torch", "deepspeed", "snakemake", "transformers", "datasets",
                                               "nvidia-ml-py", "amdsmi")}}
json.dump(facts, open(os.path.join(P, "image.json"), "w"), indent=1, sort_keys=True)
if os.environ.get("APPTAINER_LABELS"):
    with open(os.environ["APPTAINER_LABELS"], "a") as f:
        for k, v in facts["installed"].items():
            f.write(f"org.pipeline.installed.{k} {v}\n")
print("image facts:", json.dumps(facts, sort_keys=True))
EOF
}

python_step() { "python_$platform"; }
ops_step() {
  if [ "$platform" = cpu ]; then echo "cpu: DeepSpeed JIT-builds its CPU ops at a study's build_ops stage"
  else ops_gpu; fi
}

case "$step" in
  requirements) requirements ;;
  system) system ;;
  python) python_step ;;
  ops) ops_step ;;
  stamp) stamp ;;
  all) system; python_step; ops_step; stamp ;;
  *) echo "install.sh: unknown step '$step' (system, python, ops, stamp, all, requirements)" >&2; exit 2 ;;
esac
