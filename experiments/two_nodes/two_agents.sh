#!/usr/bin/env bash
# One run as two "nodes" on one multi-GPU host: two launchers (workflow_scripts.job.launch), one GPU each, a
# c10d rendezvous on localhost. DeepSpeed then sees world size / device_count() = 2 and takes its multi-node code
# paths, e.g. ZeRO++'s quantized gradient all-to-all (qgZ), which a single node never runs (README.md here).
#   bash experiments/two_nodes/two_agents.sh SPEC.json OUT_DIR WORK_DIR
# SPEC.json: a run spec (e.g. a study's runs/<model>/<strategy>/<layout>/r0/run_spec.json); its nodes become 2 and
# its out_dir / work_dir the given ones. Needs the spec's data and op files in place (run the study's data and
# build_op targets first).
set -euo pipefail
spec=$1 out=$2 work=$3
mkdir -p "$out"
python3 - "$spec" "$out" "$work" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec.update(nodes=2, out_dir=sys.argv[2], work_dir=sys.argv[3], run_id=spec["run_id"] + "__two_agents")
json.dump(spec, open(f"{sys.argv[2]}/two_agents_spec.json", "w"), indent=2)
PY
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
for k in 0 1; do
  CUDA_VISIBLE_DEVICES=$k python3 -m workflow_scripts.job.launch --spec "$out/two_agents_spec.json" \
    --nnodes 2 --node-rank $k --rdzv-endpoint "127.0.0.1:$port" > "$out/agent$k.log" 2>&1 &
done
wait
