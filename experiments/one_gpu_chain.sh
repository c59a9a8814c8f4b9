#!/usr/bin/env bash
# Several studies in a row on one lent GPU machine, for a session whose commands each end before the studies do:
# started under setsid from a copy of the checkout in /tmp/gpu/repo, each study through tools/gpu_session.sh
# (its outputs in /tmp/gpu/out_<name>, results in /tmp/gpu/<name>); later commands poll it with
# tools/gpu_snapshot.sh. Each name is a study file with its one-GPU overlay (studies/one_gpu/<name>.yaml).
#   setsid bash experiments/one_gpu_chain.sh vit ml815 > /tmp/gpu/chain.log 2>&1 < /dev/null &
cd /tmp/gpu/repo || exit 1
for name in "$@"; do
  echo "$name started $(date -u +%T)"
  OUT=/tmp/gpu/out_$name RESULTS=/tmp/gpu/$name BUDGET_S=1700 bash tools/gpu_session.sh \
    --configfile studies/$name.yaml studies/offline_gpu.yaml studies/one_gpu/$name.yaml studies/one_gpu_check.yaml \
    --config results_dir=/tmp/gpu/$name work_dir=/tmp/gpu/w_$name data_dir=/tmp/gpu/data
  echo "$name ended rc=$? $(date -u +%T)"
done
