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

# ---------------------------------------------------------------- column kinds
# Every column of the tables below has one kind, declared beside its name; the parse stage writes the Parquet schema
# from them and refuses a value that does not fit its column. Every cell may be empty (an oom or unsupported row has
# most of them empty).
TEXT, BOOL, INT, FLOAT = "text", "bool", "int", "float"
JSON = "json"  # a list or dict, its cell the JSON text

# ---------------------------------------------------------------- one run's directory (training -> parse)
SUMMARY = "summary.json"  # the run's row: trainer summary + sampler peaks + status
TRAIN_SUMMARY = "train_summary.json"  # rank 0's summary, before the launcher merges the sampler's
METRICS = "metrics.csv"  # one row per optimizer step (METRIC_COLUMNS)
VRAM = "vram.csv"  # the sampler's timeline (SAMPLER_COLUMNS)
SETTINGS = "strategy_settings.json"  # the exact DeepSpeed JSON / DDP / FSDP settings
PROVENANCE = "provenance.json"
RUN_SPEC = "run_spec.json"
OOM_MARKER = "oom_rank{rank}.json"
RECOMPILE_MARKER = "recompile_limit_rank{rank}.json"  # a rank whose compiled region hit dynamo's recompile limit
ERROR_MARKER = "error_rank{rank}.json"  # a rank's failure and when: the launcher names the first (the root cause)
# run spec keys that never change a number (where files go, how the run is observed, the data's paths: the data
# itself counts by its manifest): which checkpoint a run may resume (training/checkpoint.resume_hash) and what a
# verification rerun compares (replay.settings)
SPEC_NOT_SETTINGS = ("run_id", "study", "out_dir", "work_dir", "sampler", "ops", "torch_extensions_dir",
                     "substitutions", "profile", "trace_dir", "memory_guard", "data", "variant", "trackers")
TRAIN_NOT_SETTINGS = ("log_every", "checkpoint_every", "fault_injection",
                      "tensorboard",  # a TensorBoard switch a committed run spec may carry (now config trackers)
                      "compile_auto",  # why auto decided: prose; the decided compile_blocks/compile_loss count
                      "lever_trial")  # where a measured decision was read: the decided levers count

# one row per optimizer step, written by the training loop
METRIC_TYPES = {"step": INT, "epoch": INT, "loss": FLOAT, "lr": FLOAT, "step_time_s": FLOAT, "forward_s": FLOAT,
                "backward_s": FLOAT, "optimizer_s": FLOAT, "tokens": INT, "samples": INT, "warmup": BOOL,
                "wall_s": FLOAT, "profiled": BOOL}
METRIC_COLUMNS = list(METRIC_TYPES)
# one row per VRAM sample, written by the sampler (measure/vram); device -1 is the host
SAMPLER_TYPES = {"time_unix": FLOAT, "t_s": FLOAT, "backend": TEXT, "device": INT, "used_bytes": INT,
                 "total_bytes": INT, "process_bytes": INT, "step": INT}
SAMPLER_COLUMNS = list(SAMPLER_TYPES)

# ---------------------------------------------------------------- study tables (parse -> tables, figures)
# what identifies a run in every table; `layout` is the run's parallel layout key (ws2, dp2-pp2-tp2, ...)
ID_TYPES = {"run_id": TEXT, "model": TEXT, "strategy": TEXT, "layout": TEXT, "world_size": INT, "repeat": INT}
ID_COLUMNS = list(ID_TYPES)
# what identifies a group of repeats (one row of the summary table)
GROUP_KEYS = ["model", "strategy", "layout"]
STEP_TYPES = ID_TYPES | METRIC_TYPES  # tables/steps
STEP_COLUMNS = list(STEP_TYPES)
VRAM_TYPES = ID_TYPES | SAMPLER_TYPES  # tables/vram
VRAM_COLUMNS = list(VRAM_TYPES)
# the run table (parse -> tables, figures, verify, claims): the contract's columns. Measured bytes are whole numbers,
# predicted ones need not be. compile_model: whether the whole model was compiled, compiled_module: what was
# (torch.compile(DistributedDataParallel, mode=default), ...). initialisation: "random", or "pretrained: <hub id or
# directory>" (the run spec's `pretrained`); substitutions: those the run's provenance records, "; " between them
# ("" where none, empty where the run has no provenance); strategy_source: for a study's strategy from a DeepSpeed JSON
# the file and the registry strategy it runs as ("ds_z3.json as zero3"), "" for the registry's own.
RUN_TYPES = {
    "run_id": TEXT, "study": TEXT, "model": TEXT, "strategy": TEXT, "family": TEXT, "zero_stage": INT,
    "layout": TEXT, "world_size": INT, "repeat": INT, "platform": TEXT, "device_name": TEXT, "precision": TEXT,
    "precision_detail": TEXT, "status": TEXT, "reason": TEXT, "in_figures": BOOL, "n_params": INT, "n_layer": INT,
    "d_model": INT, "seq_len": INT, "vocab_size": INT, "micro_batch": INT, "grad_accum": INT,
    "effective_batch": INT, "tokens_per_step": INT, "steps": INT, "steps_per_epoch": INT, "epochs": FLOAT,
    "train_samples": INT, "time_per_epoch_s": FLOAT, "train_time_s": FLOAT, "step_time_median_s": FLOAT,
    "step_time_p90_s": FLOAT, "forward_median_s": FLOAT, "backward_median_s": FLOAT, "optimizer_median_s": FLOAT,
    "tokens_per_s": FLOAT, "samples_per_s": FLOAT, "flops_per_token": FLOAT, "peak_tflops": FLOAT, "mfu": FLOAT,
    "peak_allocated_bytes": INT, "peak_reserved_bytes": INT, "peak_host_rss_bytes": INT, "initial_loss": FLOAT,
    "final_loss": FLOAT, "val_loss_initial": FLOAT, "val_loss_final": FLOAT, "val_ppl_final": FLOAT,
    "predicted_model_state_bytes": FLOAT, "predicted_host_state_bytes": FLOAT, "sampler_status": TEXT,
    "sampler_peak_device_bytes": INT, "sampler_peak_host_bytes": INT, "predicted_peak_bytes": FLOAT,
    "predicted_device_peak_bytes": FLOAT, "predicted_peak_note": TEXT, "predicted_step_s": FLOAT,
    "predicted_tokens_per_s": FLOAT, "predicted_step_note": TEXT, "val_accuracy_initial": FLOAT,
    "val_accuracy_final": FLOAT, "trainable_params": INT, "compile_blocks": BOOL, "compile_loss": BOOL,
    "compile_model": BOOL, "compiled_module": TEXT, "compile_mode": TEXT, "compile_auto": TEXT,
    "initialisation": TEXT, "substitutions": TEXT, "strategy_source": TEXT, "provenance": TEXT, "settings": TEXT,
    "run_dir": TEXT,
}
RUN_COLUMNS = list(RUN_TYPES)
# the run table's columns a reader takes as text, not numbers (the bools too: report/tables.parse_bool reads them)
RUN_TEXT = {c for c, kind in RUN_TYPES.items() if kind in (TEXT, BOOL)}
# the run table's further columns: the other keys a summary.json carries (training/loop.py run_summary and finish,
# job/launch.py write_result, write_not_started and sampler_fields), outside the contract. A summary key declared in
# neither is an error of the parse stage: the table's columns never depend on which runs it holds.
RUN_EXTRA_TYPES = {
    "parallel": JSON, "dp_size": INT, "tokenizer_vocab_size": INT, "timing_warmup_steps": INT,
    "epoch_time_s": JSON, "timed_steps": INT, "timing_note": TEXT, "peak_allocated_bytes_per_rank": JSON,
    "peak_reserved_bytes_per_rank": JSON, "peak_host_rss_bytes_per_rank": JSON, "dynamo_graphs": INT,
    "dynamo_graph_breaks": INT, "dynamo_frames": INT, "dynamo_graph_break_reason": TEXT, "resumed_from_step": INT,
    "checkpoint_fallback": TEXT,
    "oom_ranks": JSON, "oom_allocated_bytes": INT, "oom_reserved_bytes": INT, "sampler_reason": TEXT,
    "sampler_backends": JSON, "sampler_samples": INT, "sampler_hz": FLOAT, "sampler_gaps": JSON,
    "sampler_peak_process_bytes": JSON, "launch_wall_s": FLOAT, "variant": TEXT, "setup_s": FLOAT,
    "setup_phases_s": JSON,
}
RUN_TABLE_TYPES = RUN_TYPES | RUN_EXTRA_TYPES  # every column of tables/runs.csv and runs.parquet, in order


def provenance_types(packages) -> dict:
    """The columns of the provenance table (parse: one row per run), each with its kind: one text column per package
    whose version provenance records (`packages`: measure/provenance.PACKAGES, a layer above this module) after the
    config hash."""
    return {"run_id": TEXT, "status": TEXT, "git_commit": TEXT, "git_dirty": BOOL, "config_hash": TEXT,
            **dict.fromkeys(packages, TEXT),
            "cuda": TEXT, "rocm": TEXT, "devices": TEXT, "cpu_model": TEXT, "driver": TEXT, "nccl": TEXT,
            "sm_clock_max_mhz": TEXT, "power_limit_w": TEXT, "rank_cpu_threads": INT, "host": TEXT,
            "container": TEXT, "image_digest": TEXT, "image_recipe_commit": TEXT, "image_recipe_dirty": BOOL,
            "slurm_job_id": TEXT, "start_unix": FLOAT, "end_unix": FLOAT, "substitutions": TEXT, "settings": TEXT}


def layout_key(layout, world_size) -> str:
    """The layout key of a run's row or summary: its `layout`; where that is None, NaN, pandas' NA or empty (the
    summaries of some committed sets carry none), pure data parallel over `world_size` ranks, `ws<world_size>`."""
    if layout is None or str(layout) in ("", "nan", "<NA>"):
        return f"ws{int(float(world_size))}"
    return str(layout)

