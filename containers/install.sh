#!/usr/bin/env bash
# Everything an image of the pipeline holds, installed by this one script, whichever tool builds the image:
#   containers/Containerfile   (podman / buildah / docker: one layer per step below)
#   containers/<platform>.def  (apptainer: %post runs the same steps)
#
#   install.sh PLATFORM STEP      PLATFORM: cpu | cuda | rocm      STEP: system | python | stamp | all
#   install.sh PLATFORM requirements   print the pins pip installs into that image (envs/requirements.txt, filtered)
#
# cpu: a plain Debian/Ubuntu base. Python, a compiler (DeepSpeed JIT-builds its CPU ops at the study's build_ops
#      stage, as on a host) and every pin of envs/requirements.txt, torch first and alone, as envs/setup.sh does:
#      the same environment as a host install, so a study gives the host's losses bit for bit.
# cuda/rocm: the vendor's PyTorch image. Its torch stays (a constraint pins its exact build); every other pin except
#      the other vendor's monitoring library; DeepSpeed with the ops the strategies load compiled now.
#
# Build-time only (never baked into the image): BUILD_PIP_CERT (a CA bundle for pip), BUILD_PIP_FIND_LINKS (a
# directory of wheels, e.g. a local CPU torch wheel), BUILD_PIP_INDEX_URL / BUILD_PIP_EXTRA_INDEX_URL.
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

# The VRAM sampler's library: one per GPU vendor; the CPU image has both, as a host install does.
other_vendor_smi() {
  case "$platform" in cuda) echo amdsmi ;; rocm) echo nvidia-ml-py ;; cpu) echo "" ;; esac
}

# What pip installs with -r in the python step: every pin but torch (installed first, or the base image's) and,
# on GPU images, the other vendor's monitoring library and deepspeed (built with its ops below).
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
  if [ "$platform" = cpu ]; then
    packages="$packages python3 python3-pip python3-dev g++"  # g++ + headers: DeepSpeed's JIT-built CPU ops
  fi
  apt-get update -q
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $packages
  rm -rf /var/lib/apt/lists/*
}

python_cpu() {
  python3 -m pip install -q "$(grep -E '^torch==' "$P/requirements.txt")"
  install_requirements
}

python_gpu() {
  # The base image's torch stays: a constraint pins its exact build, so no requirement can replace it.
  python3 -c 'import torch; print("torch==" + torch.__version__)' > "$P/constraints.txt"
  install_requirements -c "$P/constraints.txt"
  # DeepSpeed (the pinned version) with the ops the strategies load compiled now, against this torch
  # (--no-build-isolation), for A100, A10/3090, L4/4090, H100/H200 (PTX for newer; DeepSpeed's op builder cannot
  # parse "9.0a"-style entries) or MI250X / MI300X.
  export TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0+PTX"
  export PYTORCH_ROCM_ARCH="gfx90a;gfx942"
  local ds_spec
  ds_spec="$(grep -E '^deepspeed==' "$P/requirements.txt")"
  DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_AIO=1 DS_BUILD_FUSED_ADAM=1 DS_BUILD_QUANTIZER=1 \
    python3 -m pip install -q --no-build-isolation -c "$P/constraints.txt" "$ds_spec"
  python3 -c 'from deepspeed.git_version_info import installed_ops as ops; need = ["cpu_adam", "async_io", "fused_adam", "quantizer"]; missing = [o for o in need if not ops.get(o)]; assert not missing, f"DeepSpeed ops not pre-built: {missing}"; print("pre-built DeepSpeed ops:", need)'
}

# /opt/pipeline/image.json: what a job reads from inside the container (measure/container.py) — the platform, the
# recipe's commit (recipe.json, written by containers/build.sh) and the versions actually installed.
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
facts = {"platform": plat, **recipe, "python": platform.python_version(),
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

case "$step" in
  requirements) requirements ;;
  system) system ;;
  python) if [ "$platform" = cpu ]; then python_cpu; else python_gpu; fi ;;
  stamp) stamp ;;
  all) system; if [ "$platform" = cpu ]; then python_cpu; else python_gpu; fi; stamp ;;
  *) echo "install.sh: unknown step '$step' (system, python, stamp, all, requirements)" >&2; exit 2 ;;
esac
