#!/usr/bin/env bash
# Run a study on a GPU machine that has no network (how the committed results/<study>/<device>/ were made):
#   bash tools/gpu_session.sh --configfile studies/<study>.yaml studies/offline_gpu.yaml [snakemake args]
# Needs, carried next to the checkout: .whl/ (../shared/device/wheelhouse.sh -r envs/requirements.txt: snakemake,
# deepspeed and what the image lacks) and .deb/ (Debian's libaio1 + libaio-dev, `apt-get download`, for
# DeepSpeed's async_io op: unpacked to a prefix, found through CPATH / LIBRARY_PATH / LD_LIBRARY_PATH).
# Writes the results folder as $OUT/results.tgz (OUT defaults to ./out; RESULTS=<dir> packs that folder only).
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
# the copy travels without .git: the commit it was made from, written beside it (git rev-parse HEAD > .pipeline_commit)
[ -f .pipeline_commit ] && export PIPELINE_COMMIT="$(cat .pipeline_commit)"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.csv"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
timeout "${BUDGET_S:-540}" python3 -m snakemake --cores all --resources timed_runs=1 --keep-going "$@" 2>&1 \
  | tail -n 400 > "$OUT/snakemake.log"
rc=${PIPESTATUS[0]}
tar czf "$OUT/results.tgz" "${RESULTS:-results/}" 2>/dev/null
tail -n 30 "$OUT/snakemake.log"
exit "$rc"
