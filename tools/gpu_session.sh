#!/usr/bin/env bash
# Run a study on a GPU machine that has no network (how the committed results/<study>/<device>/ were made):
#   bash tools/gpu_session.sh --configfile studies/<study>.yaml studies/offline_gpu.yaml [snakemake args]
# Needs, carried next to the checkout: .whl/ (../shared/device/wheelhouse.sh -r envs/requirements.txt: snakemake,
# deepspeed and what the image lacks) and .deb/ (Debian's libaio1 + libaio-dev, `apt-get download`, for
# DeepSpeed's async_io op: unpacked to a prefix, found through CPATH / LIBRARY_PATH / LD_LIBRARY_PATH).
# Writes the results folder as $OUT/results.tgz (OUT defaults to ./out; RESULTS=<dir> packs that folder only).
# BUILD_OPS=1: first the GPU image's ops step (containers/install.sh cuda ops) against this machine's torch and CUDA
# toolkit, so the study loads pre-built ops as in the image; needs .sdist/ carried too (DeepSpeed's sdist and a
# ninja wheel: `pip download --no-deps --no-binary :all: deepspeed==<pin>`). Then `pytest tests/test_gpu_ops.py`
# checks the ops against references. Nothing may train beside that step: DeepSpeed is gone while it reinstalls.
# A study longer than one command can run under `setsid` across several (each later command polling it with
# tools/gpu_snapshot.sh, so a machine lost between commands loses nothing before the last poll): the jobs watch their ancestry only up to
# Snakemake (training/workflow_watch.py), so the first command's shell ending stops nothing.
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if ls .deb/*.deb >/dev/null 2>&1; then
  for f in .deb/*.deb; do dpkg -x "$f" /tmp/aio; done
  lib=/tmp/aio/usr/lib/x86_64-linux-gnu
  export CPATH=/tmp/aio/usr/include LIBRARY_PATH=$lib LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-}
fi
if [ "${BUILD_OPS:-0}" = 1 ]; then  # the pip-installed JIT DeepSpeed goes; the one built with its ops replaces it
  rm -rf /tmp/site/deepspeed /tmp/site/deepspeed-*
  pp="$(mktemp -d)"; cp envs/requirements.txt "$pp/"
  python3 -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' > "$pp/constraints.txt"
  CUDA_HOME="$(dirname "$(dirname "$(command -v nvcc)")")" PIPELINE_DIR="$pp" PIP_FIND_LINKS="$PWD/.sdist" \
    PIP_NO_INDEX=1 PIP_NO_DEPS=1 bash containers/install.sh cuda ops > "$OUT/ops_build.log" 2>&1 || exit 1
  tail -n 1 "$OUT/ops_build.log"
fi
# the commit the copy was made from, written beside it (git rev-parse HEAD > .pipeline_commit); a .git found in the
# copy is not that checkout's (the lent machine keeps one of its own), so git is pointed away from it (never moved:
# the machine's next command needs it)
if [ -f .pipeline_commit ]; then export PIPELINE_COMMIT="$(cat .pipeline_commit)" GIT_DIR=/nonexistent; fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.csv"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
timeout "${BUDGET_S:-540}" python3 -m snakemake --cores all --resources timed_runs=1 --keep-going "$@" 2>&1 \
  | tail -n 400 > "$OUT/snakemake.log"
rc=${PIPESTATUS[0]}
tar czf "$OUT/results.tgz" "${RESULTS:-results/}" 2>/dev/null
tail -n 30 "$OUT/snakemake.log"
exit "$rc"
