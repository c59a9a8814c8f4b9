"""Paper-grade outputs: repeats with confidence intervals, the trackers' runs, provenance without secrets, the
report, and regeneration (a figure-only edit reruns figures and never a training job)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, overlay, reuse_calibration, snakemake

SECRETS = {"HF_TOKEN": "hf_" + "s3cretvalue" * 4, "WANDB_API_KEY": "wandbkey" * 5}


# the default study's data settings: its prepared data is shared (study.data_dir), nothing prepared again
# ddp's levers are measured; fsdp sets its own, so it gets no trial (a study that sets a lever has chosen)
REPEATS = {"results_dir": "results/repeats", "work_dir": "work/repeats", "strategies": ["ddp", "fsdp"], "repeats": 2,
           "groups": [{"models": ["gpt2-tiny"], "strategies": ["ddp"], "world_sizes": [2]},
                      {"models": ["gpt2-tiny"], "strategies": ["fsdp"], "world_sizes": [2],
                       "train": {"compile_blocks": False, "compile_loss": False}}],
           "train": {"max_steps": 8}, "trackers": ["tensorboard", "wandb", "mlflow"],
           "auto_levers": {"by": "measurement", "candidates": ["eager", "loss", "model_graphs"], "steps": 2,
                           "cache": "work/lever_decisions"}}  # this study's own: its first trial measures
MEASURED = ["ddp"]


@pytest.fixture(scope="module")
def repeated(default_study):
    """ddp and fsdp, two repeats each, ddp's `auto` levers measured, every tracker on, secrets in the environment."""
    reuse_calibration(default_study, REPEATS["results_dir"])
    snakemake(default_study, *overlay(default_study, "repeats", **REPEATS), env=SECRETS, report=True)
    return default_study / "results/repeats"


def test_measured_levers_are_the_trials_fastest_and_every_repeat_runs_them(repeated):
    runs = pd.read_csv(repeated / "tables/runs.csv").set_index(["strategy", "repeat"])
    assert not (repeated / "levers/gpt2-tiny/fsdp").exists()  # its levers were set: nothing to measure
    findings = (repeated / "tables/findings.md").read_text().split("## Lever decisions\n")[1]
    assert "| gpt2-tiny | ddp | ws2 |" in findings and "| 1 measured, 0 cached |" in findings
    assert not runs.loc[("fsdp", 0), "compile_loss"] and not runs.loc[("fsdp", 0), "compile_blocks"]
    for strategy in MEASURED:
        trial = json.loads((repeated / f"levers/gpt2-tiny/{strategy}/ws2.json").read_text())
        speed = {r["candidate"]: r["tokens_per_s"] for r in trial["candidates"]}
        assert sorted(speed) == ["eager", "loss"] and all(v > 0 for v in speed.values())
        assert trial["chosen"] == max(speed, key=speed.get)
        assert trial["skipped"] == {"model_graphs": "CUDA graphs need a GPU"}
        first = [r["first_losses"] for r in trial["candidates"]]
        assert first[0] == pytest.approx(first[1], abs=1e-4)  # the compiled loss trains the same steps
        for repeat in (0, 1):
            row = runs.loc[(strategy, repeat)]
            assert bool(row.compile_loss) == (trial["chosen"] == "loss") and not row.compile_blocks
            assert row.compile_auto == trial["why"] and row.compile_auto.startswith(f"measured: {trial['chosen']}")


def test_a_second_study_of_the_same_shapes_reads_the_cached_decisions_without_a_trial(default_study, repeated):
    """Another study (its own results and scratch, other steps) of the same configurations on this machine: each
    lever_trial job writes the first study's decision from the cache, no candidate launched, in well under a
    second, and says so."""
    args = overlay(default_study, "repeats_cached", **{**REPEATS, "results_dir": "results/repeats-cached",
                                                       "work_dir": "work/repeats-cached",
                                                       "train": {**REPEATS["train"], "max_steps": 6}})
    targets = [f"results/repeats-cached/levers/gpt2-tiny/{s}/ws2.json" for s in MEASURED]
    snakemake(default_study, *targets, *args)
    for strategy, target in zip(MEASURED, targets):
        first = json.loads((repeated / f"levers/gpt2-tiny/{strategy}/ws2.json").read_text())
        again = json.loads((default_study / target).read_text())
        assert again["chosen_train"] == first["chosen_train"] and again["candidates"] == first["candidates"]
        assert again["cache"] == {"key": first["cache"]["key"], "hit": True, "measured_why": first["why"]}
        assert again["why"].startswith(f"measured: {first['chosen']} (cached: {first['cache']['key'][:12]}, "
                                       "measured on cpu: ")
        assert again["decided_s"] < 1.0 < first["decided_s"]
        assert not (default_study / "work/repeats-cached/lever_trial").exists()  # no candidate's folder
        log = (default_study / f"results/repeats-cached/logs/levers/gpt2-tiny/{strategy}/ws2.log").read_text()
        assert "lever decision cached" in log and "no candidate launched" in log


def test_a_verification_rerun_replays_the_measured_levers_without_a_trial(default_study, repeated):
    args = overlay(default_study, "repeats_rerun", **{**REPEATS, "results_dir": "results/repeats-rerun",
                                                      "verify": {"against": "results/repeats"}})
    done = snakemake(default_study, *args, "-n", "-p")  # -p: the planned shell commands, each with its run spec
    jobs = _planned(done)
    assert jobs.get("train") == 4 and "lever_trial" not in jobs, jobs
    for strategy in MEASURED:
        chosen = json.loads((repeated / f"levers/gpt2-tiny/{strategy}/ws2.json").read_text())["chosen_train"]
        spec = next(json.loads((default_study / line.split("--spec ", 1)[1].split()[0]).read_text())
                    for line in done.stdout.splitlines()
                    if "job.launch --spec" in line and f"/{strategy}/ws2/r0.log" in line)
        assert {k: spec["train"][k] for k in chosen} == chosen and "lever_trial" not in spec["train"]
        assert spec["train"]["compile_auto"].startswith("replayed from results/repeats: measured")


def test_repeats_give_means_and_confidence_intervals(repeated):
    runs = pd.read_csv(repeated / "tables/runs.csv")
    assert sorted(runs.repeat.unique()) == [0, 1] and len(runs) == 4
    summary = pd.read_csv(repeated / "tables/summary.csv")
    assert len(summary) == 2
    assert summary.filter(like="ci95").notna().any(axis=None)
    assert "distinguishable" in (repeated / "tables/comparisons.md").read_text().lower()


def test_provenance_is_complete_and_has_no_secrets(repeated):
    for path in (repeated / "runs").rglob("provenance.json"):
        p = json.loads(path.read_text())
        assert len(p["git"]["commit"] or "") in (0, 40)
        assert p["packages"]["torch"] and p["packages"]["deepspeed"] and p["config_hash"]
        assert p["host"] and p["end_unix"] >= p["start_unix"]
    for path in repeated.rglob("*"):
        if path.is_file():
            text = path.read_bytes()
            for value in SECRETS.values():
                assert value.encode() not in text, path
    prov = pd.read_csv(repeated / "tables/provenance.csv")
    assert len(prov) == 4 and prov.torch.notna().all()


def wandb_history(path: Path) -> list[dict]:
    """The history rows of an offline W&B run file (run-<id>.wandb): a 7-byte header (":W&B", magic, version),
    then 32 KiB blocks of records, each a 7-byte header (CRC32, length, kind: 1 whole, 2 first, 3 middle, 4 last
    part) and a protobuf Record; a history item's name is its key, or its nested key's parts ("train", "loss")."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    raw, pos, block, part, rows = path.read_bytes(), 7, 32768, b"", []
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # a block's zero padding
            pos += left
            continue
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        part = data if kind in (1, 2) else part + data
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(part)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_every_tracker_holds_the_runs_scalars_and_provenance_names_its_run(repeated, monkeypatch):
    """TensorBoard events, the offline W&B run and the MLflow file store each hold every step's loss and learning
    rate as metrics.csv has them, and the final validation loss; the run's provenance names each tracker's run."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = repeated / "runs/gpt2-tiny/ddp/ws2/r0"
    steps = pd.read_csv(run / "metrics.csv")
    summary = json.loads((run / "summary.json").read_text())
    tracked = json.loads((run / "provenance.json").read_text())["trackers"]
    assert set(tracked) == {"tensorboard", "wandb", "mlflow"} and tracked["wandb"]["mode"] == "offline"

    acc = EventAccumulator(str(run / tracked["tensorboard"]["dir"]))
    acc.Reload()
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx(steps.loss.tolist(), rel=1e-5)
    assert [e.step for e in acc.Scalars("train/learning_rate")] == steps.step.tolist()
    host = pd.read_csv(run / "vram.csv").query("device == -1").used_bytes / 2**30  # the sampler's host rows
    sampled = [e.value for e in acc.Scalars("memory/host_used_gib")]  # the highest since the previous log
    assert sampled and all(min(abs(host - v)) < 1e-6 * v for v in sampled)

    (history,) = (run / tracked["wandb"]["dir"]).glob(f"run-{tracked['wandb']['run_id']}.wandb")
    rows = wandb_history(history)
    assert [r["train/loss"] for r in rows] == pytest.approx(steps.loss.tolist())
    assert [r["train/learning_rate"] for r in rows] == pytest.approx(steps.lr.tolist())
    assert rows[-1]["val/loss"] == pytest.approx(summary["val_loss_final"])

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as for `mlflow ui`: MLflow's file store is in maintenance
    client = MlflowClient(tracking_uri=(run / tracked["mlflow"]["dir"]).resolve().as_uri())
    history = client.get_metric_history(tracked["mlflow"]["run_id"], "train/loss")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(steps.loss.tolist())
    (val,) = client.get_metric_history(tracked["mlflow"]["run_id"], "val/loss")
    assert val.value == pytest.approx(summary["val_loss_final"])


def test_the_trackers_read_the_samplers_rows_as_it_writes_them(tmp_path):
    """Each call: the highest device-wide and host bytes of the whole rows written since the previous call, in GiB;
    a line still being written waits for the next call; no new row, nothing."""
    from workflow_scripts.training.trackers import SamplerTail

    path = tmp_path / "vram.csv"
    tail = SamplerTail(path)
    assert tail.peaks() == {}  # the sampler has not started
    header = "time_unix,t_s,backend,device,used_bytes,total_bytes,process_bytes,step\n"
    path.write_text(header + "1,0.0,nvml,0,3221225472,8,1,\n1,0.1,nvml,0,2147483648,8,1,\n1,0.1,host,-1,1073741824"
                    ",8,1,\n1,0.2,nvml,0,53687")
    assert tail.peaks() == {"device_used_gib": 3.0, "host_used_gib": 1.0}
    assert tail.peaks() == {}
    with open(path, "a") as f:
        f.write("09120,8,1,3\n")  # the rest of the last row: 5368709120 bytes, 5 GiB
    assert tail.peaks() == {"device_used_gib": 5.0}


def test_a_study_without_trackers_imports_none_of_them():
    """The training loop imports no tracker's package until a study names it."""
    import subprocess
    import sys

    probe = ("import sys, workflow_scripts.training.loop; "
             "print([m for m in ('wandb', 'mlflow', 'torch.utils.tensorboard') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_report_holds_figures_tables_and_provenance(repeated):
    html = (repeated / "report.html").read_text(errors="replace")
    for name in ("loss_curves", "peak_memory", "memory_timeline", "summary", "provenance"):
        assert name in html, name


def _planned(done) -> dict:
    return {line.split()[0]: int(line.split()[1]) for line in done.stdout.splitlines()
            if len(line.split()) == 2 and line.split()[1].isdigit()}


def test_figure_only_edit_reruns_only_figures(default_study):
    args = overlay(default_study, "style", figures={"dpi": 99, "palette": "deep"})
    jobs = _planned(snakemake(default_study, *args, "-n", "--quiet", "rules"))
    assert jobs.get("figures") == 1
    assert "train" not in jobs and "parse" not in jobs and "tokenize" not in jobs, jobs
    args = overlay(default_study, "tables", tables={"extra_decimals": 1})
    jobs = _planned(snakemake(default_study, *args, "-n", "--quiet", "rules"))
    assert jobs.get("summary_table") == 1 and "train" not in jobs and "figures" not in jobs, jobs


def test_editing_a_report_module_reruns_its_stage_only(default_study):
    """A report stage's modules are inputs of its rule (common.smk stage_code): an edit to the style module every
    figure draws with reruns the figures and the calibration figure, never parse, a table or a training job."""
    import os

    module = default_study / "workflow_scripts/report/style.py"
    text, kept = module.read_text(), module.stat()
    module.write_text(text + "\n# an edit\n")  # Snakemake reruns on new content, not on a new mtime alone
    try:
        jobs = _planned(snakemake(default_study, "-n", "--quiet", "rules"))
    finally:
        module.write_text(text)
        os.utime(module, (kept.st_atime, kept.st_mtime))
    assert jobs.get("figures") == 1 and jobs.get("calibration_figure") == 1, jobs
    assert not {"train", "parse", "summary_table", "tokenize"} & set(jobs), jobs


def test_studies_with_the_same_data_settings_share_the_prepared_data(default_study):
    """Prepared data is keyed by its settings (study.data_dir): another study with the same corpus, tokenizer and
    data sections only copies the manifests into its results; another block size prepares its own folder and never
    touches the first."""
    wd = default_study
    same = _planned(snakemake(wd, *overlay(wd, "same_data", results_dir="results/same", work_dir="work/same"),
                              "-n", "--quiet", "rules"))
    assert same.get("data_manifests") == 1 and not {"corpus", "tokenizer", "tokenize"} & set(same), same
    prepared = sorted((wd / "work/data").iterdir())
    other = _planned(snakemake(wd, *overlay(wd, "other_data", results_dir="results/other", data={"block_size": 64}),
                               "-n", "--quiet", "rules"))
    assert other.get("tokenize") == 1 and other.get("corpus") == 1, other
    assert sorted((wd / "work/data").iterdir()) == prepared  # planned only: no folder made or touched


def test_a_tracker_named_but_not_installed_is_one_error_naming_its_package_and_the_setup_flag(monkeypatch):
    from workflow_scripts.training import trackers

    monkeypatch.setitem(trackers.PACKAGES, "wandb", "no_such_tracker_package")
    assert trackers.missing(["tensorboard", "wandb"]) == [
        "trackers: wandb needs the Python package 'no_such_tracker_package', not installed here: "
        "bash envs/setup.sh --trackers (envs/requirements-trackers.txt)"]
