#!/usr/bin/env bash
# Pack what a study running under tools/gpu_session.sh (setsid) has made so far into $OUT, for a command that polls
# it: a lent machine released between two commands takes its /tmp with it, and this keeps everything up to the
# last poll. RESULTS: the study's results folder; WORK: its work_dir (the lever trials' candidates: their summaries,
# metrics and launch logs only, not checkpoints or scratch).
# CHECKOUT: the copy the study runs in (default: here). PIPELINE_CACHE: the study's machine cache, whose lever
# decisions are packed as lever_decisions.tgz (carried back as .lever_decisions/, they seed a later lease's cache).
#   OUT=$OUT RESULTS=/tmp/gpu/tutorial WORK=/tmp/gpu/work CHECKOUT=/tmp/gpu/repo bash tools/gpu_snapshot.sh
set -uo pipefail
OUT="${OUT:?}"; mkdir -p "$OUT"
[ -n "${RESULTS:-}" ] && [ -d "$RESULTS" ] && tar czf "$OUT/results.tgz" "$RESULTS" 2>/dev/null
if [ -n "${WORK:-}" ] && [ -d "$WORK/lever_trial" ]; then
  (cd "$WORK" && find lever_trial \( -name summary.json -o -name metrics.csv -o -name launch.log \) -print0 \
    | tar czf "$OUT/lever_trial.tgz" --null -T -)
fi
if [ -n "${PIPELINE_CACHE:-}" ] && [ -d "$PIPELINE_CACHE/lever_decisions" ]; then
  tar czf "$OUT/lever_decisions.tgz" -C "$PIPELINE_CACHE" lever_decisions
fi
# Snakemake's own log of the running study (gpu_session.sh writes its tail only at the end), in the checkout it runs in
log="$(ls -t "${CHECKOUT:-$PWD}"/.snakemake/log/*.snakemake.log 2>/dev/null | head -n 1)"
[ -n "$log" ] && cp "$log" "$OUT/snakemake_running.log"
ls -la "$OUT"
