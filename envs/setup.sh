#!/usr/bin/env bash
# The one setup step: system libraries, then the pinned Python environment (envs/requirements.txt).
#   bash envs/setup.sh            (as root on Debian/Ubuntu; elsewhere install libaio-dev yourself)
#   bash envs/setup.sh --trackers (also W&B and MLflow for config `trackers`: envs/requirements-trackers.txt)
#   bash envs/setup.sh --tests    (also slurm-wlm + munge: the real single-node SLURM cluster of tests/test_slurm.py;
#                                 and the trackers, which the suite writes to)
#   bash envs/setup.sh --tests --containers   (also podman, runc, debootstrap, bubblewrap: building the CPU image
#                                 and running jobs in it, tests/test_image.py)
# torch is installed first, alone, so that pip takes the pinned CPU build and DeepSpeed builds against it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
packages="libaio-dev"  # DeepSpeed's async_io op (ZeRO-Infinity NVMe offload)
trackers=0
for flag in "$@"; do
  case "$flag" in
    --tests) packages="$packages slurm-wlm munge"; trackers=1 ;;
    --containers) packages="$packages podman runc debootstrap bubblewrap" ;;
    --trackers) trackers=1 ;;
    *) echo "setup.sh: unknown option $flag (--tests, --containers, --trackers)" >&2; exit 2 ;;
  esac
done
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086
  apt-get install -y -q $packages >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q $packages >/dev/null; }
elif [ "$packages" != libaio-dev ]; then
  echo "install $packages yourself (Debian/Ubuntu as root does it here); without slurm-wlm the SLURM tests skip,
  # without podman/bubblewrap tests/test_image.py cannot run" >&2
fi
pin() { grep -E "^$1==" "$here/requirements.txt"; }
# --no-compile: pip writes no bytecode while it installs (torch's install 17 s -> 7 s), so the op builds below start
# sooner; every installed file is compiled afterwards, beside the builds (compileall, about 50 s of one core).
python3 -m pip install -q --no-compile "$(pin torch)"
python3 -m pip install -q --no-compile -c "$here/requirements.txt" "$(pin deepspeed)"
# DeepSpeed's CPU ops (every op a strategy needs, from the strategies' own lists; one the CPU has none of is
# reported as not built) into this machine's op cache, once, as the workflow's build_op stage does (workflow_scripts/training/build_ops.py), while
# pip installs the rest. A failed build is only reported here; a study records it as the strategy's `unsupported`
# row. Building them here rather than among the study's training jobs: setup 6 min 53 s + default study 4 min 34 s,
# against 2 min 17 s + 10 min 41 s (an emptied 2-core machine).
ops_dir="$(mktemp -d)"
(cd "$here/.." && python3 -m workflow_scripts.training.build_ops --all --platform cpu --out "$ops_dir" \
   > "$ops_dir/all.log" 2>&1) &
ops=$!
# every pin, those marked `# no-deps` without their declared dependencies (requirements.txt says why)
python3 -m pip install -q --no-compile -r <(grep -v '# no-deps$' "$here/requirements.txt")
# shellcheck disable=SC2046
python3 -m pip install -q --no-compile --no-deps $(grep '# no-deps$' "$here/requirements.txt" | cut -d' ' -f1)
if [ "$trackers" = 1 ]; then  # their shared dependencies held at requirements.txt's pins
  python3 -m pip install -q --no-compile -c "$here/requirements.txt" -r "$here/requirements-trackers.txt"
fi
# bytecode written explicitly (an environment with PYTHONDONTWRITEBYTECODE, or a later user who may not write here,
# would otherwise compile every module again in every process); as pip, a file that does not compile (another
# Python's syntax, a template) is left as it is
site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
python3 -m compileall -q -j 0 "$site" > /dev/null || true
python3 -c "import torch, deepspeed, snakemake; print('torch', torch.__version__, '| deepspeed', deepspeed.__version__)"
wait "$ops" || true
cat "$ops_dir/all.log"
