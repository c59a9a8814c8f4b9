"""How well the memory prediction does on every committed GPU run (a benchmark: prints, times nothing):

    python3 -m workflow_scripts.bench.memory [--results results] [--out table.md]

For each ok GPU row of every committed result set: the measured peak (torch max_memory_allocated, max over ranks)
against the analytic and the traced prediction (workflow_scripts/plan), the relative error of each, and why a row
is not modelled. Rows repeated across sets (the same run in a traces set) are shown once per set. The last lines
count the rows within 10 %.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from workflow_scripts import columns as C
from workflow_scripts.plan.predict import predict_run

GIB = 2**30


def committed_rows(results: Path) -> list[tuple[str, Path]]:
    """(set name, run directory) of every ok GPU run under results/."""
    out = []
    for runs_csv in sorted(results.glob("**/tables/runs.csv")):
        tables = runs_csv.parent
        runs = pd.read_csv(runs_csv)
        for row in runs.to_dict("records"):
            if row["status"] != "ok" or str(row.get("platform")) == "cpu":
                continue
            layout = row["layout"] if isinstance(row.get("layout"), str) else f"ws{row['world_size']}"
            run_dir = tables.parent / "runs" / row["model"] / row["strategy"] / layout / f"r{int(row['repeat'])}"
            out.append((str(tables.parent.relative_to(results)), run_dir))
    return out


def table(results: Path) -> pd.DataFrame:
    rows = []
    for name, run_dir in committed_rows(results):
        spec = json.loads((run_dir / C.RUN_SPEC).read_text())
        summary = json.loads((run_dir / C.SUMMARY).read_text())
        measured = summary["peak_allocated_bytes"]
        row = {"set": name, "model": spec["model"], "strategy": spec["strategy"],
               "layout": summary.get("layout", f"ws{spec['world_size']}"), "precision": spec["precision"],
               "micro_batch": summary["micro_batch"], "measured_gib": measured / GIB}
        for method in ("analytic", "traced"):
            p = predict_run(spec, summary, method)
            row[f"{method}_gib"] = p.total / GIB if p.modelled else None
            row[f"{method}_error_pct"] = (p.total / measured - 1) * 100 if p.modelled else None
            row["not_modelled"] = p.why
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.drop_duplicates(subset=["set", "model", "strategy", "layout"]).reset_index(drop=True)


def markdown(frame: pd.DataFrame) -> str:
    lines = ["| set | model | strategy | layout | precision | mb | measured GiB | analytic GiB (err %) | "
             "traced GiB (err %) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in frame.itertuples():
        cells = []
        for m in ("analytic", "traced"):
            value = getattr(r, f"{m}_gib")
            cells.append(r.not_modelled if pd.isna(value) else f"{value:.1f} ({getattr(r, f'{m}_error_pct'):+.1f})")
        lines.append(f"| {r.set} | {r.model} | `{r.strategy}` | {r.layout} | {r.precision} | {r.micro_batch} | "
                     f"{r.measured_gib:.1f} | {cells[0]} | {cells[1]} |")
    lines.append("")
    for m in ("analytic", "traced"):
        err = frame[f"{m}_error_pct"].dropna().abs()
        lines.append(f"{m}: {len(err)} of {len(frame)} rows modelled, {int((err <= 10).sum())} within 10 % "
                     f"(median |error| {err.median():.1f} %, max {err.max():.1f} %)")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", help="also write the Markdown table here")
    args = ap.parse_args(argv)
    text = markdown(table(Path(args.results)))
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
