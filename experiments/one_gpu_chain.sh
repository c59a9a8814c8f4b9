#!/usr/bin/env bash
# Several studies in a row on one lent GPU machine, for a session whose commands each end before the studies do:
# started under setsid from a copy of the checkout in /tmp/gpu/repo, each study through tools/gpu_session.sh
# (its outputs in /tmp/gpu/out_<name>, results in /tmp/gpu/<name>); later commands poll it with
# tools/gpu_snapshot.sh. Each name is a study file, with its one-GPU overlay where it has one
# (studies/one_gpu/<name>.yaml), then studies/one_gpu_check.yaml.
# The lever decisions live in /tmp/gpu/cache/lever_decisions (PIPELINE_CACHE); a folder .lever_decisions/ carried
# beside the checkout (decisions an earlier lease of the same kind of machine measured, packed by gpu_snapshot.sh)
# seeds it, so a study longer than one lease times its rows in the next without deciding again.
#   setsid bash experiments/one_gpu_chain.sh vit ml815 > /tmp/gpu/chain.log 2>&1 < /dev/null &
cd /tmp/gpu/repo || exit 1
export PIPELINE_CACHE=/tmp/gpu/cache
mkdir -p "$PIPELINE_CACHE/lever_decisions"
if [ -d .lever_decisions ]; then cp -v .lever_decisions/*.json "$PIPELINE_CACHE/lever_decisions/"; fi
for name in "$@"; do
  echo "$name started $(date -u +%T)"
  overlay=(); [ -f "studies/one_gpu/$name.yaml" ] && overlay=("studies/one_gpu/$name.yaml")
  OUT=/tmp/gpu/out_$name RESULTS=/tmp/gpu/$name BUDGET_S=1700 bash tools/gpu_session.sh \
    --configfile studies/$name.yaml studies/offline_gpu.yaml "${overlay[@]}" studies/one_gpu_check.yaml \
    --config results_dir=/tmp/gpu/$name work_dir=/tmp/gpu/w_$name data_dir=/tmp/gpu/data
  echo "$name ended rc=$? $(date -u +%T)"
done
