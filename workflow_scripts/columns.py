"""Names shared by the stages: the columns of the files one stage writes and the next reads, the per-run file
names. Files between stages are the contract; this module is where their names are written once.
"""
from __future__ import annotations

from workflow_scripts.status import RunStatus

# ---------------------------------------------------------------- where things are in a results_dir
RUN_DIR = "runs/{model}/{strategy}/{layout}/r{repeat}"  # one run's directory (layout: ws2, dp2-pp2-tp2, ...)
RUNS_TABLE = "tables/runs.csv"  # the parse stage's run table
TOKENS_MANIFEST = "data/tokens_manifest.json"  # the data stage's manifest (token blocks or image rows)
LEVER_TRIAL = "levers/{model}/{strategy}/{layout}.json"  # a configuration's lever trial (job/lever_trial.py)
CALIBRATION = "calibration/calibration.json"  # a set's measured machine (measure/calibrate.py)
RUN_TO_RUN = "verify/run_to_run.json"  # a committed set's measured run-to-run spread (report/verify.py)

# ---------------------------------------------------------------- a run's status (summary.json, runs.csv, tables)
OK, OOM, UNSUPPORTED, FAILED = RunStatus.OK, RunStatus.OOM, RunStatus.UNSUPPORTED, RunStatus.FAILED  # status.py
NOT_OK = (OOM, UNSUPPORTED, FAILED)  # most telling first
STATUS_CELL = {OOM: "OOM", UNSUPPORTED: "unsupported", FAILED: "failed"}  # a status as a table cell says it
STATUS_MARK = {**STATUS_CELL, UNSUPPORTED: "n/a"}  # a status as a figure marks it (short: it is drawn vertically)

# ---------------------------------------------------------------- one run's directory (training -> parse)
SUMMARY = "summary.json"  # the run's row: trainer summary + sampler peaks + status
TRAIN_SUMMARY = "train_summary.json"  # rank 0's summary, before the launcher merges the sampler's
METRICS = "metrics.csv"  # one row per optimizer step (METRIC_COLUMNS)
VRAM = "vram.csv"  # the sampler's timeline (SAMPLER_COLUMNS)
SETTINGS = "strategy_settings.json"  # the exact DeepSpeed JSON / DDP / FSDP settings
PROVENANCE = "provenance.json"
RUN_SPEC = "run_spec.json"
OOM_MARKER = "oom_rank{rank}.json"
# run spec keys that never change a number (where files go, how the run is observed, the data's paths: the data
# itself counts by its manifest): which checkpoint a run may resume (training/checkpoint.resume_hash) and what a
# verification rerun compares (replay.settings)
SPEC_NOT_SETTINGS = ("run_id", "study", "out_dir", "work_dir", "sampler", "ops", "torch_extensions_dir",
                     "substitutions", "profile", "trace_dir", "memory_guard", "data", "variant")
TRAIN_NOT_SETTINGS = ("log_every", "checkpoint_every", "tensorboard", "fault_injection",
                      "compile_auto",  # why auto decided: prose; the decided compile_blocks/compile_loss count
                      "lever_trial")  # where a measured decision was read: the decided levers count

# one row per optimizer step, written by the training loop
METRIC_COLUMNS = ["step", "epoch", "loss", "lr", "step_time_s", "forward_s", "backward_s", "optimizer_s",
                  "tokens", "samples", "warmup", "wall_s", "profiled"]
# one row per VRAM sample, written by the sampler (measure/vram)
SAMPLER_COLUMNS = ["time_unix", "t_s", "backend", "device", "used_bytes", "total_bytes", "process_bytes", "step"]

# ---------------------------------------------------------------- study tables (parse -> tables, figures)
# what identifies a run in every table; `layout` is the run's parallel layout key (ws2, dp2-pp2-tp2, ...)
ID_COLUMNS = ["run_id", "model", "strategy", "layout", "world_size", "repeat"]
# what identifies a group of repeats (one row of the summary table)
GROUP_KEYS = ["model", "strategy", "layout"]
STEP_COLUMNS = ID_COLUMNS + METRIC_COLUMNS
# the run table (parse -> tables, figures, verify): its columns, and those read as text
RUN_COLUMNS = [
    "run_id", "study", "model", "strategy", "family", "zero_stage", "layout", "world_size", "repeat", "platform",
    "device_name", "precision", "precision_detail", "status", "reason", "in_figures", "n_params", "n_layer",
    "d_model", "seq_len", "vocab_size", "micro_batch", "grad_accum", "effective_batch", "tokens_per_step", "steps",
    "steps_per_epoch", "epochs", "train_samples", "time_per_epoch_s", "train_time_s", "step_time_median_s",
    "step_time_p90_s", "forward_median_s", "backward_median_s", "optimizer_median_s", "tokens_per_s",
    "samples_per_s", "flops_per_token", "peak_tflops", "mfu", "peak_allocated_bytes", "peak_reserved_bytes",
    "peak_host_rss_bytes", "initial_loss", "final_loss", "val_loss_initial", "val_loss_final", "val_ppl_final",
    "predicted_model_state_bytes", "predicted_host_state_bytes", "sampler_status", "sampler_peak_device_bytes",
    "sampler_peak_host_bytes", "predicted_peak_bytes", "predicted_device_peak_bytes", "predicted_peak_note",
    "predicted_step_s", "predicted_tokens_per_s", "predicted_step_note", "val_accuracy_initial", "val_accuracy_final",
    "trainable_params", "compile_blocks", "compile_loss",
    "compile_model", "compile_mode", "compile_auto", "provenance", "settings",
]
RUN_TEXT = {"run_id", "study", "model", "strategy", "family", "layout", "platform", "device_name", "precision",
            "precision_detail", "status", "reason", "in_figures", "sampler_status", "provenance", "settings",
            "predicted_peak_note", "predicted_step_note", "compile_mode", "compile_auto"}
VRAM_COLUMNS = ID_COLUMNS + SAMPLER_COLUMNS


def layout_key(layout, world_size) -> str:
    """The layout key of a run's row or summary: its `layout`; where that is None, NaN, pandas' NA or empty (the
    summaries of some committed sets carry none), pure data parallel over `world_size` ranks, `ws<world_size>`."""
    if layout is None or str(layout) in ("", "nan", "<NA>"):
        return f"ws{int(float(world_size))}"
    return str(layout)

