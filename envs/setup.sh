#!/usr/bin/env bash
# The one setup step: system libraries, then the pinned Python environment (envs/requirements.txt).
#   bash envs/setup.sh            (as root on Debian/Ubuntu; elsewhere install libaio-dev yourself)
# torch is installed first, alone, so that pip takes the pinned CPU build and DeepSpeed builds against it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  # libaio-dev: DeepSpeed's async_io op (ZeRO-Infinity NVMe offload)
  apt-get install -y -q libaio-dev >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q libaio-dev >/dev/null; }
fi
python3 -m pip install -q "$(grep -E '^torch==' "$here/requirements.txt")"
python3 -m pip install -q -r "$here/requirements.txt"
python3 -c "import torch, deepspeed, snakemake; print('torch', torch.__version__, '| deepspeed', deepspeed.__version__)"
