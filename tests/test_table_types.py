"""The parse stage's tables have one type per column, whichever runs they hold: hand-written run directories of two
groups with different levers (an eager ddp run whose summary lacks columns the compiled one has, a compiled fsdp
run) and a run not started without provenance parse into Parquet files of the stated types; a value that does not
fit its column is an error naming the run and the column, and nothing is written."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import by_hand

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workflow_scripts.report import parse  # noqa: E402

COMPILED = "torch.compile(DistributedDataParallel, mode=default)"
CORPUS = "corpus: Python standard-library sources (offline) instead of the study's hub dataset"
TOKENIZER = "tokenizer: byte-level BPE trained in the pipeline instead of the hub tokenizer"
STEPS = 4
METRICS = ["step", "epoch", "loss", "lr", "step_time_s", "forward_s", "backward_s", "optimizer_s", "tokens", "samples",
           "warmup", "wall_s", "profiled"]
SAMPLES = ["time_unix", "t_s", "backend", "device", "used_bytes", "total_bytes", "process_bytes", "step"]

# the types a reader of the Parquet files relies on, stated here, not read from the code under test
RUN_TYPES = {"run_id": pa.string(), "world_size": pa.int64(), "repeat": pa.int64(), "in_figures": pa.bool_(),
             "n_params": pa.int64(), "tokens_per_s": pa.float64(), "mfu": pa.float64(),
             "peak_host_rss_bytes": pa.int64(), "val_ppl_final": pa.float64(), "compile_blocks": pa.bool_(),
             "compile_model": pa.bool_(), "compiled_module": pa.string(), "compile_mode": pa.string(),
             "initialisation": pa.string(), "substitutions": pa.string(), "epoch_time_s": pa.string(),
             "dynamo_graphs": pa.int64(), "reason": pa.string()}
STEP_TYPES = {"run_id": pa.string(), "world_size": pa.int64(), "step": pa.int64(), "loss": pa.float64(),
              "tokens": pa.int64(), "warmup": pa.bool_(), "profiled": pa.bool_()}
VRAM_TYPES = {"run_id": pa.string(), "backend": pa.string(), "device": pa.int64(), "used_bytes": pa.int64(),
              "process_bytes": pa.int64(), "step": pa.int64()}
PROVENANCE_TYPES = {"run_id": pa.string(), "git_dirty": pa.bool_(), "torch": pa.string(), "start_unix": pa.float64(),
                    "substitutions": pa.string()}


def summary(strategy: str, **levers) -> dict:
    """An ok CPU run's summary.json as the launcher writes it (training/loop.py run_summary + sampler fields)."""
    return {"status": "ok", "run_id": f"gpt2-tiny__{strategy}__ws2__r0", "study": "types", "model": "gpt2-tiny",
            "strategy": strategy, "family": strategy, "zero_stage": 3 if strategy == "fsdp" else 0, "layout": "ws2",
            "parallel": {}, "world_size": 2, "dp_size": 2, "repeat": 0, "platform": "cpu", "device_name": "cpu",
            "precision": "fp32", "precision_detail": "fp32 everywhere", "n_params": 1_000_000, "n_layer": 2,
            "d_model": 64, "seq_len": 64, "vocab_size": 512, "tokenizer_vocab_size": 512, "micro_batch": 4,
            "grad_accum": 1, "effective_batch": 8, "tokens_per_step": 512, "steps": STEPS, "steps_per_epoch": STEPS,
            "epochs": 1.0, "train_samples": 8 * STEPS, "timing_warmup_steps": 1, "epoch_time_s": [2.0],
            "train_time_s": 2.0, "flops_per_token": 6e6, "peak_tflops": None, "peak_allocated_bytes": None,
            "peak_reserved_bytes": None, "peak_allocated_bytes_per_rank": None, "peak_reserved_bytes_per_rank": None,
            "peak_host_rss_bytes_per_rank": [1.0e9, 1.0e9], "peak_host_rss_bytes": 2.0e9, "initial_loss": 6.2,
            "final_loss": 5.0, "val_loss_initial": 6.2, "val_loss_final": 5.1, "predicted_model_state_bytes": 8e6,
            "predicted_host_state_bytes": 0.0, "compile_blocks": False, "compile_loss": False, "compile_mode": None,
            "compile_auto": None, "trainable_params": 1_000_000, "resumed_from_step": None,
            "checkpoint_fallback": None, "sampler_status": "ok", "sampler_reason": None, "sampler_backends": ["host"],
            "sampler_samples": 3, "sampler_hz": 10.0, "sampler_gaps": [], "sampler_peak_device_bytes": None,
            "sampler_peak_host_bytes": 2_100_000_000, "sampler_peak_process_bytes": {"host": 2_000_000_000},
            "launch_wall_s": 9.5, **levers}


def write_run(root: Path, summary_: dict, pretrained=None, substitutions=None, steps: int = STEPS) -> Path:
    """A run's directory as the train stage leaves it: summary, run spec, metrics and sampler timeline (headers only
    without steps), and (where `substitutions` is a list) provenance."""
    d = root / "runs" / summary_["model"] / summary_["strategy"] / "ws2" / "r0"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary_))
    (d / "run_spec.json").write_text(by_hand(run_id=summary_["run_id"], study=summary_["study"],
                                             model=summary_["model"], strategy=summary_["strategy"], world_size=2,
                                             train={"checkpoint_every": 0}, pretrained=pretrained).to_json())
    (d / "strategy_settings.json").write_text("{}")
    pd.DataFrame([{"step": s, "epoch": 0, "loss": 6.0 - 0.25 * s, "lr": 1e-3, "step_time_s": 0.5, "forward_s": 0.1,
                   "backward_s": 0.3, "optimizer_s": 0.1, "tokens": 512, "samples": 8, "warmup": s == 1,
                   "wall_s": 0.5 * s, "profiled": False} for s in range(1, steps + 1)], columns=METRICS
                 ).to_csv(d / "metrics.csv", index=False)
    pd.DataFrame([{"time_unix": 1.7e9 + 0.1 * i, "t_s": 0.1 * i, "backend": "host", "device": -1,
                   "used_bytes": 2_000_000_000 + i, "total_bytes": 64_000_000_000, "process_bytes": None,
                   "step": i} for i in range(3 if steps else 0)], columns=SAMPLES).to_csv(d / "vram.csv", index=False)
    if substitutions is not None:
        (d / "provenance.json").write_text(json.dumps({
            "git": {"commit": "0123456789abcdef", "dirty": False}, "run_config_hash": "abc",
            "packages": {"torch": "2.11.0", "deepspeed": None}, "devices": {"cpu": "x86_64", "device_count": 0},
            "machine": {}, "host": "h", "start_unix": 1.7e9, "end_unix": 1.7e9 + 10, "substitutions": substitutions}))
    return d


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    """An eager ddp run (random initialisation, two substitutions; no val_ppl_final, no dynamo counters), a compiled
    fsdp run (pretrained, none substituted), and an unsupported run with no provenance."""
    eager = summary("ddp", compile_model=False, compiled_module=None)
    compiled = summary("fsdp", compile_model=True, compiled_module=COMPILED, compile_mode="default",
                       val_ppl_final=164.0, dynamo_graphs=3, dynamo_graph_breaks=0, dynamo_frames=5)
    unsupported = {"run_id": "gpt2-tiny__zero3__ws2__r0", "study": "types", "model": "gpt2-tiny",
                   "strategy": "zero3", "world_size": 2, "repeat": 0, "platform": "cpu", "layout": "ws2",
                   "precision": "fp32", "status": "unsupported", "reason": "needs a GPU"}
    return [write_run(tmp_path, eager, substitutions=[CORPUS, TOKENIZER]),
            write_run(tmp_path, compiled, pretrained="gpt2", substitutions=[]),
            write_run(tmp_path, unsupported, steps=0)]


def types_of(path: Path, stated: dict) -> dict:
    fields = pq.read_schema(path)
    return {name: fields.field(name).type for name in stated}


def test_mixed_lever_runs_parse_into_the_declared_column_types(tmp_path, runs):
    out = tmp_path / "tables"
    parse.parse([str(d) for d in runs], str(out))
    for table, stated in (("runs", RUN_TYPES), ("steps", STEP_TYPES), ("vram", VRAM_TYPES),
                          ("provenance", PROVENANCE_TYPES)):
        assert types_of(out / f"{table}.parquet", stated) == stated, table
        assert list(pd.read_csv(out / f"{table}.csv").columns) == pq.read_schema(out / f"{table}.parquet").names

    got = pd.read_parquet(out / "runs.parquet").set_index("strategy")
    assert [bool(got.loc[s, "compile_model"]) for s in ("ddp", "fsdp")] == [False, True]
    assert got.loc["zero3", "compile_model"] is pd.NA
    assert got.loc["ddp", "compiled_module"] is pd.NA and got.loc["fsdp", "compiled_module"] == COMPILED
    assert got.loc["ddp", "val_ppl_final"] is pd.NA and got.loc["fsdp", "val_ppl_final"] == 164.0
    assert got.loc["ddp", "dynamo_graphs"] is pd.NA and got.loc["fsdp", "dynamo_graphs"] == 3
    assert got.loc["zero3", "reason"] == "needs a GPU" and got.loc["zero3", "tokens_per_s"] is pd.NA
    # retimed from the three steps after the warm-up step: 3 x 512 tokens in 3 x 0.5 s
    assert got.loc["ddp", "tokens_per_s"] == pytest.approx(1024.0)
    assert got.loc["ddp", "epoch_time_s"] == "[2.0]"
    assert got.loc["ddp", "initialisation"] == "random" and got.loc["fsdp", "initialisation"] == "pretrained: gpt2"
    assert got.loc["zero3", "initialisation"] == "random"
    assert got.loc["ddp", "substitutions"] == f"{CORPUS}; {TOKENIZER}"
    assert got.loc["fsdp", "substitutions"] == "" and got.loc["zero3", "substitutions"] is pd.NA

    steps = pd.read_parquet(out / "steps.parquet")
    assert len(steps) == 2 * STEPS and steps.warmup.tolist() == [True, False, False, False] * 2
    prov = pd.read_parquet(out / "provenance.parquet").set_index("run_id")
    assert prov.loc["gpt2-tiny__ddp__ws2__r0", "torch"] == "2.11.0"
    assert prov.loc["gpt2-tiny__fsdp__ws2__r0", "deepspeed"] is pd.NA


def test_the_schema_does_not_depend_on_which_runs_a_table_holds(tmp_path, runs):
    for name, subset in (("all", runs), ("eager", runs[:1]), ("unsupported", runs[2:])):
        parse.parse([str(d) for d in subset], str(tmp_path / name))
    for table in ("runs", "steps", "vram", "provenance"):
        schemas = [pq.read_schema(tmp_path / name / f"{table}.parquet").remove_metadata()
                   for name in ("all", "eager", "unsupported")]
        assert schemas[0] == schemas[1] == schemas[2], table


@pytest.mark.parametrize("file, key, value, named", [
    ("summary.json", "sampler_hz", "fast", "'sampler_hz'"),  # a float column
    ("summary.json", "compile_model", 1, "'compile_model'"),  # a bool column
    ("summary.json", "a_new_key", 1.0, "'a_new_key'"),  # declared nowhere
    ("metrics.csv", "loss", "fast", "metrics.csv line 3, column 'loss'"),
])
def test_a_value_that_does_not_fit_names_the_run_and_the_column_and_writes_nothing(tmp_path, runs, file, key, value,
                                                                                     named):
    bad = runs[0]
    if file == "summary.json":
        s = json.loads((bad / file).read_text())
        (bad / file).write_text(json.dumps({**s, key: value}))
    else:
        rows = pd.read_csv(bad / file, dtype=str)
        rows.loc[1, key] = value
        rows.to_csv(bad / file, index=False)
    out = tmp_path / "tables"
    with pytest.raises(ValueError) as caught:
        parse.parse([str(d) for d in runs], str(out))
    message = str(caught.value)
    assert "gpt2-tiny__ddp__ws2__r0" in message and str(bad) in message and named in message, message
    assert not out.exists()


def test_tokens_per_s_of_a_run_not_retimed_must_be_a_number(tmp_path, runs):
    """An oom row keeps its summary's timing (only ok runs are retimed from their steps): "fast" there is refused."""
    bad = runs[2]
    s = json.loads((bad / "summary.json").read_text())
    (bad / "summary.json").write_text(json.dumps({**s, "status": "oom", "tokens_per_s": "fast"}))
    with pytest.raises(ValueError) as caught:
        parse.parse([str(d) for d in runs], str(tmp_path / "tables"))
    assert "gpt2-tiny__zero3__ws2__r0" in str(caught.value) and "'tokens_per_s'" in str(caught.value)
    assert "'fast'" in str(caught.value)


def test_a_cpu_study_whose_groups_differ_in_levers_parses_into_tables(default_study):
    """The crash the parse stage had: a study whose rows mix an eager run and a whole-model compiled one (and a
    `zeropp` row that ends `unsupported` on CPU, without most columns) makes its tables through Snakemake."""
    import yaml
    from conftest import reuse_calibration, snakemake

    wd, results = default_study, "results/mixed_levers"
    reuse_calibration(wd, results)
    overlay = {"results_dir": results, "strategies": ["ddp"], "world_sizes": [1],
               "train": {"max_steps": 4, "log_every": 2, "timing_warmup_steps": 1},
               "groups": [{"models": ["gpt2-tiny"], "strategies": ["ddp", "zeropp"], "world_sizes": [1]},
                          {"models": ["gpt2-tiny"], "strategies": ["ddp"], "world_sizes": [2],
                           "train": {"compile_model": True}}]}
    (wd / "mixed_levers.yaml").write_text(yaml.safe_dump(overlay))
    snakemake(wd, f"{results}/tables/summary.md", "--configfile", "mixed_levers.yaml")
    runs = pq.read_table(wd / results / "tables/runs.parquet")
    assert runs.schema.field("compile_model").type == pa.bool_()
    assert runs.schema.field("compiled_module").type == pa.string()
    rows = {(r["strategy"], r["layout"]): r for r in runs.to_pylist()}
    assert set(rows) == {("ddp", "ws1"), ("zeropp", "ws1"), ("ddp", "ws2")}
    assert rows[("ddp", "ws1")]["compile_model"] is False and rows[("ddp", "ws1")]["compiled_module"] is None
    assert rows[("ddp", "ws2")]["compile_model"] is True
    assert rows[("ddp", "ws2")]["compiled_module"].startswith("torch.compile(")
    assert rows[("zeropp", "ws1")]["status"] == "unsupported" and rows[("zeropp", "ws1")]["tokens_per_s"] is None
