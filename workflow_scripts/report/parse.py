"""Stage 5, parse: every run's files -> tidy tables (one row per run; one per step; the sampler timelines).

    python -m workflow_scripts.report.parse --runs DIR [DIR ...] --out-dir <set>/tables \
        [--calibration <set>/calibration/calibration.json]

Writes runs/steps/vram/provenance as CSV and Parquet. Runs that ended `oom` or `unsupported` keep their row. Every ok
GPU row carries the memory model's predicted peak and, from the study's calibration, the step-time model's predicted
step time and throughput (plan/step_time.py), or a note saying why there is none.

Every table has the columns workflow_scripts/columns.py declares, in its order, each of its declared kind (the
Parquet schema), whichever runs the table holds: a column a run lacks is empty there. A value that does not fit its
column's kind, or a key or file column declared nowhere, is an error naming the run and the column, raised before
any table is written.
"""
from __future__ import annotations

import argparse
import json
import math
import numbers
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from workflow_scripts import columns as C
from workflow_scripts.columns import ID_COLUMNS
from workflow_scripts.measure.metrics import timing
from workflow_scripts.measure.provenance import PACKAGES
from workflow_scripts.run_spec import RunSpec
from workflow_scripts.training.strategies import STRATEGIES

ARROW = {C.TEXT: pa.string(), C.BOOL: pa.bool_(), C.INT: pa.int64(), C.FLOAT: pa.float64(), C.JSON: pa.string()}
PANDAS = {C.TEXT: "string", C.BOOL: "boolean", C.INT: "Int64", C.FLOAT: "Float64", C.JSON: "string"}
BOOL_TEXT = {"true": True, "false": False}  # a bool cell of a CSV (csv writes True / False)
TABLE_TYPES = {"runs": C.RUN_TABLE_TYPES, "steps": C.STEP_TYPES, "vram": C.VRAM_TYPES,
               "provenance": C.provenance_types(PACKAGES)}


# ---------------------------------------------------------------- cells of a declared kind
def cell(value, kind: str):
    """A value of a run's JSON file as a cell of a `kind` column: None where empty (None, NaN), a list or dict as its
    JSON text, a whole float as an int; TypeError where it does not fit (a number is never text, nor a bool a
    number)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    is_bool = isinstance(value, (bool, np.bool_))
    number = isinstance(value, numbers.Real) and not is_bool
    if kind == C.TEXT and isinstance(value, str):
        return str(value)
    if kind == C.JSON and isinstance(value, (list, dict)):
        return json.dumps(value)
    if kind == C.BOOL and is_bool:
        return bool(value)
    if kind == C.FLOAT and number:
        return float(value)
    if kind == C.INT and number and float(value).is_integer():
        return int(value)
    raise TypeError(f"{value!r} is not {kind}")


def text_cell(text: str, kind: str):
    """A cell of a run's CSV file (its text) as a cell of a `kind` column: None where empty; TypeError where it does
    not fit."""
    if text == "":
        return None
    if kind in (C.TEXT, C.JSON):
        return text
    if kind == C.BOOL:
        if text.lower() in BOOL_TEXT:
            return BOOL_TEXT[text.lower()]
        raise TypeError(f"{text!r} is not {kind}")
    for number in (int, float):  # int first: a whole number keeps every digit
        try:
            return cell(number(text), kind)
        except ValueError:
            pass
    raise TypeError(f"{text!r} is not {kind}")


def checked_row(row: dict, types: dict, where: str) -> dict:
    """`row` with every declared column, in order, each value a cell of its kind; ValueError naming `where` (the
    run) and the column for a value that does not fit or a key declared nowhere."""
    undeclared = [k for k in row if k not in types]
    if undeclared:
        raise ValueError(f"{where}: no declared column type for {', '.join(map(repr, undeclared))} (declare each in "
                         "workflow_scripts/columns.py)")
    out = {}
    for column, kind in types.items():
        try:
            out[column] = cell(row.get(column), kind)
        except TypeError as exc:
            raise ValueError(f"{where}: column {column!r}: {exc}") from None
    return out


def checked_csv(path: Path, types: dict, where: str) -> dict[str, list]:
    """A run's per-step or per-sample CSV as its cells per declared column (empty where the file has none), each
    parsed as its kind; ValueError naming `where` (the run), the file's line and the column for a cell that does not
    fit or a column declared nowhere."""
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    undeclared = [c for c in raw.columns if c not in types]
    if undeclared:
        raise ValueError(f"{where}: {path.name} has columns with no declared type: {', '.join(undeclared)} "
                         "(declare each in workflow_scripts/columns.py)")
    cols = {}
    for column, kind in types.items():
        texts = raw[column].tolist() if column in raw else [""] * len(raw)
        cells = []
        for line, text in enumerate(texts, start=2):
            try:
                cells.append(text_cell(text, kind))
            except TypeError as exc:
                raise ValueError(f"{where}: {path.name} line {line}, column {column!r}: {exc}") from None
        cols[column] = cells
    return cols


def records(cols: dict[str, list]) -> list[dict]:
    """Cells per column as one dict per row."""
    return [dict(zip(cols, values)) for values in zip(*cols.values())]


def with_ids(cols: dict[str, list], row: dict) -> dict[str, list]:
    """A run's per-step or per-sample cells with the run's identifying cells in front."""
    n = len(next(iter(cols.values())))
    return {c: [row[c]] * n for c in ID_COLUMNS} | cols


def typed_frame(parts: list[dict[str, list]], types: dict) -> pd.DataFrame:
    """Checked cells, one {column: cells} per run, as one frame of the declared columns in order, each of its kind's
    nullable pandas dtype."""
    return pd.DataFrame({c: pd.array([v for part in parts for v in part[c]], dtype=PANDAS[kind])
                         for c, kind in types.items()})


def schema(types: dict) -> pa.Schema:
    """The Parquet schema of a table: its declared columns in order, every one nullable."""
    return pa.schema([pa.field(c, ARROW[kind]) for c, kind in types.items()])


def run_name(run_dir: Path) -> str:
    """A run as an error names it: its run_id (where its summary has one) and directory."""
    run_id = json.loads((run_dir / C.SUMMARY).read_text()).get("run_id")
    return f"run {run_id} ({run_dir})" if run_id else f"run {run_dir}"


def retimed(summary: dict, spec: RunSpec, rows: list[dict]) -> dict:
    """Time, throughput and MFU recomputed from the per-step rows (checked: checked_csv) with the one shared rule
    (metrics.timing), so every run of a table is measured the same way."""
    if summary.get("status") != C.OK:
        return summary
    return {**summary, **timing(rows, summary["steps_per_epoch"], summary["world_size"],
                                summary["flops_per_token"], summary["device_name"],
                                spec.train["checkpoint_every"])}


def run_row(run_dir: Path, tables_dir: Path, steps: list[dict], rates=None) -> dict:
    """The run's row of the run table (`steps`: its per-step rows), its values as the run's files hold them (parse
    checks them against the declared kinds)."""
    spec = RunSpec.committed(run_dir / C.RUN_SPEC)  # of any version (a committed set's), migrated
    # the exact engine settings the run wrote (none where it stopped before building its engine)
    settings = json.loads((run_dir / C.SETTINGS).read_text()) if (run_dir / C.SETTINGS).exists() else None
    summary = retimed(compiled_module(json.loads((run_dir / C.SUMMARY).read_text())), spec, steps)
    provenance = json.loads((run_dir / C.PROVENANCE).read_text()) if (run_dir / C.PROVENANCE).exists() else None
    strategy = STRATEGIES.get(summary["strategy"])
    row = dict(summary)
    row["layout"] = C.layout_key(row.get("layout"), summary["world_size"])
    row["reason"] = summary.get("reason")
    row["in_figures"] = bool(strategy.in_figures) if strategy else True
    row["initialisation"] = initialisation(spec)
    row["substitutions"] = substitutions(provenance) if provenance is not None else None
    row["strategy_source"] = strategy_source(spec)
    row["provenance"] = os.path.relpath(run_dir / C.PROVENANCE, tables_dir)
    row["settings"] = os.path.relpath(run_dir / C.SETTINGS, tables_dir)
    row["run_dir"] = os.path.relpath(run_dir, tables_dir)
    return row | predicted_peak(summary, spec, settings) | predicted_step(summary, spec, settings, rates)


def compiled_module(summary: dict) -> dict:
    """The summary with `compile_model` a bool and `compiled_module` what was compiled; the summaries of some
    committed sets carry the description in `compile_model` itself."""
    if not isinstance(summary.get("compile_model"), str):
        return summary
    return {**summary, "compile_model": True, "compiled_module": summary["compile_model"]}


def initialisation(spec: RunSpec) -> str:
    """Where the run's weights started: "random", or "pretrained: <the run spec's `pretrained`>"."""
    return "random" if spec.pretrained is None else f"pretrained: {spec.pretrained}"


def strategy_source(spec: RunSpec) -> str:
    """Where the run's strategy came from: "<file> as <registry strategy>" for a study's strategy from a DeepSpeed
    JSON (the run spec's `strategy_source`), "" for the registry's own."""
    source = spec.strategy_source
    return f"{os.path.basename(source['deepspeed'])} as {source['base']}" if source else ""


def substitutions(provenance: dict) -> str:
    """The substitutions a run's provenance records, "; " between them ("" where none)."""
    return "; ".join(provenance.get("substitutions") or [])


def predicted_peak(summary: dict, spec: RunSpec, settings: dict | None) -> dict:
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


def predicted_step(summary: dict, spec: RunSpec, settings: dict | None, rates) -> dict:
    """The step-time model's prediction of an ok GPU run (plan/step_time.py): step seconds, tokens/s and what
    bounds it, or why there is none."""
    none = {"predicted_step_s": None, "predicted_tokens_per_s": None}
    if summary.get("status") != C.OK or summary.get("platform") == "cpu":
        return {**none, "predicted_step_note": "no GPU step to predict"}
    if rates is None or isinstance(rates, str):
        return {**none, "predicted_step_note": rates or "no calibration"}
    from workflow_scripts.plan import step_time

    p = step_time.predict(step_time.run_of(spec, summary, settings), rates)
    if not p.modelled:  # a term's input is missing from the calibration: no number, the reason
        return {**none, "predicted_step_note": f"not modelled: {p.why}"}
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
            "rank_cpu_threads": p.get("rank_cpu_threads"),  # absent where no rank trained
            "host": p.get("host"), "container": p.get("container"), **image_columns(p.get("image")),
            "slurm_job_id": p.get("slurm_job_id"),
            "start_unix": p.get("start_unix"), "end_unix": p.get("end_unix"),
            "substitutions": row["substitutions"], "settings": row["settings"]}


def parse(run_dirs: list[str], out_dir: str, calibration: str | None = None) -> dict[str, pd.DataFrame]:
    """The four tables of these runs, written into `out_dir` once every run's values are checked."""
    out = Path(out_dir)
    rows, steps, vram, prov = [], [], [], []
    rates = step_rates(calibration)
    for d in map(Path, run_dirs):
        run = run_name(d)
        metrics = checked_csv(d / C.METRICS, C.METRIC_TYPES, run)
        row = checked_row(run_row(d, out, records(metrics), rates), TABLE_TYPES["runs"], run)
        rows.append({c: [v] for c, v in row.items()})
        prov.append({c: [v] for c, v in checked_row(provenance_row(d, row), TABLE_TYPES["provenance"], run).items()})
        steps.append(with_ids(metrics, row))
        vram.append(with_ids(checked_csv(d / C.VRAM, C.SAMPLER_TYPES, run), row))
    tables = {name: typed_frame(parts, TABLE_TYPES[name])
              for name, parts in (("runs", rows), ("steps", steps), ("vram", vram), ("provenance", prov))}
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        frame.to_csv(out / f"{name}.csv", index=False)
        pq.write_table(pa.Table.from_pandas(frame, schema=schema(TABLE_TYPES[name]), preserve_index=False),
                       out / f"{name}.parquet")
    shown = tables["provenance"].astype(object).where(tables["provenance"].notna(), None)
    (out / "provenance.md").write_text("# Provenance\n\n" + shown.to_markdown(index=False) + "\n")
    return tables


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", nargs="+", required=True, help="run directories (each with summary.json, ...)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--calibration", help="the study's calibration.json (the step-time model's rates)")
    a = ap.parse_args(argv)
    tables = parse(a.runs, a.out_dir, a.calibration)
    print(tables["runs"][["run_id", "status", "final_loss", "tokens_per_s"]].to_string())


if __name__ == "__main__":
    main()
