"""Stage 5, parse: every run's files -> tidy tables (one row per run; one per step; the sampler timelines).

    python -m workflow_scripts.report.parse --runs DIR [DIR ...] --out-dir <set>/tables \
        [--calibration <set>/calibration/calibration.json]

Writes runs/steps/vram as CSV and Parquet. Runs that ended `oom` or `unsupported` keep their row. Every ok GPU row
carries the memory model's predicted peak and, from the study's calibration, the step-time model's predicted step
time and throughput (plan/step_time.py), or a note saying why there is none.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pandas as pd

from workflow_scripts import columns as C
from workflow_scripts.columns import ID_COLUMNS
from workflow_scripts.measure.metrics import timing
from workflow_scripts.training.strategies import STRATEGIES


def _flat(summary: dict) -> dict:
    """Lists and dicts become JSON strings so every cell of the run table is a scalar."""
    return {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in summary.items()}


def retimed(summary: dict, spec: dict, run_dir: Path) -> dict:
    """Time, throughput and MFU recomputed from the per-step rows with the one shared rule
    (metrics.timing), so every run of a table is measured the same way."""
    if summary.get("status") != C.OK:
        return summary
    rows = pd.read_csv(run_dir / C.METRICS).to_dict("records")
    return {**summary, **timing(rows, summary["steps_per_epoch"], summary["world_size"],
                                summary["flops_per_token"], summary["device_name"],
                                spec["train"].get("checkpoint_every", 0))}


def run_row(run_dir: Path, tables_dir: Path, rates=None) -> dict:
    spec = json.loads((run_dir / C.RUN_SPEC).read_text())
    # the exact engine settings the run wrote (none where it stopped before building its engine)
    settings = json.loads((run_dir / C.SETTINGS).read_text()) if (run_dir / C.SETTINGS).exists() else None
    summary = retimed(json.loads((run_dir / C.SUMMARY).read_text()), spec, run_dir)
    strategy = STRATEGIES.get(summary["strategy"])
    row = _flat(summary)
    row["layout"] = C.layout_key(row.get("layout"), summary["world_size"])
    row["reason"] = summary.get("reason")
    row["in_figures"] = bool(strategy.in_figures) if strategy else True
    row["provenance"] = os.path.relpath(run_dir / C.PROVENANCE, tables_dir)
    row["settings"] = os.path.relpath(run_dir / C.SETTINGS, tables_dir)
    row["run_dir"] = os.path.relpath(run_dir, tables_dir)
    return row | predicted_peak(summary, spec, settings) | predicted_step(summary, spec, settings, rates)


def predicted_peak(summary: dict, spec: dict, settings: dict | None) -> dict:
    """The analytic whole-peak prediction of an ok run (workflow_scripts/plan): torch-allocated and device-wide,
    or why there is none."""
    if summary.get("status") != C.OK or summary.get("platform") == "cpu":
        return {"predicted_peak_bytes": None, "predicted_device_peak_bytes": None,
                "predicted_peak_note": "no GPU peak to predict"}
    from workflow_scripts.plan.predict import predict_run

    p = predict_run(spec, summary, "analytic", settings)
    return {"predicted_peak_bytes": p.total, "predicted_device_peak_bytes": p.device,
            "predicted_peak_note": (f"{p.method}, {p.why}" if p.bound else p.method) if p.modelled else p.why}


def step_rates(calibration: str | None, machine_own: bool = False):
    """The step-time model's rates from the study's calibration, or why there are none: its host costs its GPU
    kind's rate file's medians, as experiments.step_time.fit tests them (plan.step_time.load_rates: what predicts a
    row best), or with
    `machine_own` the machine's own as measured (verify: what may tell two machines apart)."""
    if not calibration:
        return "no calibration"
    from workflow_scripts.plan.step_time import Rates, load_rates

    try:
        return Rates.load(calibration) if machine_own else load_rates(calibration)
    except ValueError as exc:
        return str(exc)


def predicted_step(summary: dict, spec: dict, settings: dict | None, rates) -> dict:
    """The step-time model's prediction of an ok GPU run (plan/step_time.py): step seconds, tokens/s and what
    bounds it, or why there is none."""
    none = {"predicted_step_s": None, "predicted_tokens_per_s": None}
    if summary.get("status") != C.OK or summary.get("platform") == "cpu":
        return {**none, "predicted_step_note": "no GPU step to predict"}
    if rates is None or isinstance(rates, str):
        return {**none, "predicted_step_note": rates or "no calibration"}
    from workflow_scripts.plan import step_time

    p = step_time.predict(step_time.run_of(spec, summary, settings), rates)
    return {"predicted_step_s": p.step_s, "predicted_tokens_per_s": p.tokens_per_s(summary["tokens_per_step"]),
            "predicted_step_note": "; ".join([f"{p.bound}-bound"] + p.notes)}


def machine_columns(m: dict) -> dict:
    """The machine facts that explain timing differences, one column each (provenance.csv)."""
    gpu = m.get("gpu") or {}
    gpus = gpu.get("gpus") if isinstance(gpu.get("gpus"), list) else []
    return {"cpu_model": m.get("cpu_model"), "driver": gpu.get("driver"), "nccl": m.get("nccl"),
            "sm_clock_max_mhz": ",".join(sorted({str(g["sm_clock_max_mhz"]) for g in gpus})) or None,
            "power_limit_w": ",".join(sorted({f"{g['power_limit_w']:g}" for g in gpus})) or None}


def image_columns(image: dict | None) -> dict:
    """The image a run ran in (measure/container.py); empty on the host."""
    image = image or {}
    baked = image.get("baked") or {}
    return {"image_digest": image.get("digest"), "image_recipe_commit": (baked.get("recipe_commit") or "")[:12] or None,
            "image_recipe_dirty": baked.get("recipe_dirty")}


def provenance_row(run_dir: Path, row: dict) -> dict:
    path = run_dir / C.PROVENANCE
    if not path.exists():
        return {"run_id": row["run_id"]}
    p = json.loads(path.read_text())
    devices = p.get("devices", {})
    names = ", ".join(sorted(set(devices.get("device_names") or []))) or devices.get("cpu")
    return {"run_id": row["run_id"], "status": row.get("status"), "git_commit": (p["git"].get("commit") or "")[:12],
            "git_dirty": p["git"].get("dirty"), "config_hash": p.get("run_config_hash"),
            **{f"{k}": v for k, v in p.get("packages", {}).items()},
            "cuda": devices.get("torch_cuda"), "rocm": devices.get("torch_hip"),
            "devices": f"{devices.get('device_count', 0)} x {names}", **machine_columns(p.get("machine") or {}),
            "host": p.get("host"), "container": p.get("container"), **image_columns(p.get("image")),
            "slurm_job_id": p.get("slurm_job_id"),
            "start_unix": p.get("start_unix"), "end_unix": p.get("end_unix"),
            "substitutions": "; ".join(p.get("substitutions") or []), "settings": row["settings"]}


def with_ids(frame: pd.DataFrame, row: dict) -> pd.DataFrame:
    for i, col in enumerate(ID_COLUMNS):
        frame.insert(i, col, row[col])
    return frame


def parse(run_dirs: list[str], out_dir: str, calibration: str | None = None) -> dict[str, pd.DataFrame]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, steps, vram, prov = [], [], [], []
    rates = step_rates(calibration)
    for d in map(Path, run_dirs):
        row = run_row(d, out, rates)
        rows.append(row)
        prov.append(provenance_row(d, row))
        steps.append(with_ids(pd.read_csv(d / C.METRICS), row))
        vram.append(with_ids(pd.read_csv(d / C.VRAM), row))
    tables = {"runs": pd.DataFrame(rows), "steps": pd.concat(steps, ignore_index=True),
              "vram": pd.concat(vram, ignore_index=True), "provenance": pd.DataFrame(prov)}
    for name, frame in tables.items():
        frame.to_csv(out / f"{name}.csv", index=False)
        frame.to_parquet(out / f"{name}.parquet", index=False)
    (out / "provenance.md").write_text("# Provenance\n\n" + tables["provenance"].to_markdown(index=False) + "\n")
    return tables


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", nargs="+", required=True, help="run directories (each with summary.json, ...)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--calibration", help="the study's calibration.json (the step-time model's rates)")
    a = ap.parse_args(argv)
    tables = parse(a.runs, a.out_dir, a.calibration)
    print(tables["runs"][["run_id", "status", "final_loss", "tokens_per_s"]
                         if "final_loss" in tables["runs"] else ["run_id", "status"]].to_string())


if __name__ == "__main__":
    main()
