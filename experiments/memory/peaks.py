"""How well the memory prediction does on every committed GPU run (a benchmark: prints, times nothing):

    python3 -m experiments.memory.peaks --results DIR [--out table.md] [--figure predicted_vs_measured.png]

For each ok GPU row of every committed result set: the measured peak (torch max_memory_allocated, max over ranks)
against the analytic and the traced prediction (workflow_scripts/plan), the relative error of each, and why a row
is not modelled; then the device-wide peak the sampler measured (NVML) against the device-wide prediction
(memory_model.device_peak). Rows repeated across sets (the same run in a traces set) are shown once per set. The
last lines count the rows within 10 %. With --figure: predicted against measured, both peaks, one point per row.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from workflow_scripts import columns as C
from workflow_scripts.plan.predict import predict_run
from workflow_scripts.run_spec import RunSpec
from workflow_scripts.units import GIB


def committed_rows(results: Path) -> list[tuple[str, Path, float]]:
    """(set name, run directory, sampled device-wide peak) of every ok GPU run of the sets under `results`."""
    out = []
    for runs_csv in sorted(results.glob(f"**/{C.RUNS_TABLE}")):
        tables = runs_csv.parent
        runs = pd.read_csv(runs_csv)
        for row in runs.to_dict("records"):
            if row["status"] != C.OK or str(row.get("platform")) == "cpu":
                continue
            run_dir = tables.parent / C.RUN_DIR.format(model=row["model"], strategy=row["strategy"],
                                                        layout=C.layout_key(row.get("layout"), row["world_size"]),
                                                        repeat=int(row["repeat"]))
            out.append((str(tables.parent.relative_to(results)), run_dir, row.get("sampler_peak_device_bytes")))
    return out


def table(results: Path) -> pd.DataFrame:
    rows = []
    for name, run_dir, device in committed_rows(results):
        spec = RunSpec.committed(run_dir / C.RUN_SPEC)
        summary = json.loads((run_dir / C.SUMMARY).read_text())
        settings = json.loads((run_dir / C.SETTINGS).read_text()) if (run_dir / C.SETTINGS).exists() else None
        measured = summary["peak_allocated_bytes"]
        row = {"set": name, "model": spec.model, "strategy": spec.strategy,
               "layout": C.layout_key(summary.get("layout"), spec.world_size), "precision": spec.precision,
               "micro_batch": summary["micro_batch"], "measured_gib": measured / GIB}
        for method in ("analytic", "traced"):
            p = predict_run(spec, summary, method, settings)
            row[f"{method}_gib"] = p.total / GIB if p.modelled else None
            row[f"{method}_error_pct"] = (p.total / measured - 1) * 100 if p.modelled else None
            row["not_modelled"] = p.why
            row["bound"] = p.bound  # "upper": compiled, the eager count bounds it (kept out of the error figures)
            if method == "analytic":
                row["device_measured_gib"] = device / GIB if device and device == device else None
                row["device_predicted_gib"] = p.device / GIB if p.modelled else None
        row["device_error_pct"] = (row["device_predicted_gib"] / row["device_measured_gib"] - 1) * 100 \
            if row["device_predicted_gib"] and row["device_measured_gib"] else None
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.drop_duplicates(subset=["set", "model", "strategy", "layout"]).reset_index(drop=True)


def markdown(frame: pd.DataFrame) -> str:
    lines = ["| set | model | strategy | layout | precision | mb | measured GiB | analytic GiB (err %) | "
             "traced GiB (err %) | device-wide measured GiB | device-wide predicted GiB (err %) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.itertuples():
        cells = []
        for m in ("analytic", "traced"):
            value = getattr(r, f"{m}_gib")
            cells.append(r.not_modelled if pd.isna(value) else
                         f"{'≤ ' if r.bound else ''}{value:.1f} ({getattr(r, f'{m}_error_pct'):+.1f})")
        dev = "–" if pd.isna(r.device_measured_gib) else f"{r.device_measured_gib:.1f}"
        dev_p = "–" if pd.isna(r.device_error_pct) else f"{r.device_predicted_gib:.1f} ({r.device_error_pct:+.1f})"
        lines.append(f"| {r.set} | {r.model} | `{r.strategy}` | {r.layout} | {r.precision} | {r.micro_batch} | "
                     f"{r.measured_gib:.1f} | {cells[0]} | {cells[1]} | {dev} | {dev_p} |")
    lines.append("")
    eager, bounded = frame[frame["bound"] == ""], frame[frame["bound"] != ""]
    for m in ("analytic", "traced", "device"):
        err = eager[f"{m}_error_pct"].dropna().abs()
        lines.append(f"{m}: {len(err)} of {len(eager)} eager rows modelled, {int((err <= 10).sum())} within 10 % "
                     f"(median |error| {err.median():.1f} %, max {err.max():.1f} %)")
    if len(bounded):
        ratio = (bounded["measured_gib"] / bounded["analytic_gib"]).dropna()
        lines.append(f"compiled rows, the eager count as an upper bound: {len(ratio)}, measured below it in "
                     f"{int((ratio <= 1).sum())} (measured / bound {ratio.min():.2f} to {ratio.max():.2f})")
    return "\n".join(lines) + "\n"


def memory_prediction_figure(frame: pd.DataFrame, style: dict):
    """Predicted against measured, torch-allocated (analytic) and device-wide, with the +-10 % band."""
    from workflow_scripts.report.style import grid

    fig, axes = grid(2, style)
    pairs = (("measured_gib", "analytic_gib", "torch-allocated peak (analytic model)"),
             ("device_measured_gib", "device_predicted_gib", "device-wide peak (NVML)"))
    for ax, (x, y, title) in zip(axes, pairs):
        part = frame[frame["bound"] == ""][[x, y, "set"]].dropna()  # compiled upper bounds: in the table
        top = float(max(part[x].max(), part[y].max())) * 1.05
        ax.fill_between([0, top], [0, top * 0.9], [0, top * 1.1], color="0.9", label="±10 %")
        ax.plot([0, top], [0, top], color="0.5", linewidth=0.8)
        for name, g in part.groupby(part["set"].str.split("/").str[0]):
            ax.scatter(g[x], g[y], s=14, label=name)
        ax.set(xlim=(0, top), ylim=(0, top), xlabel="measured (GiB)", ylabel="predicted (GiB)", title=title)
    axes[0].legend(fontsize="x-small", loc="upper left")
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results", help="the tree of result sets")
    ap.add_argument("--out", help="also write the Markdown table here")
    ap.add_argument("--figure", help="also draw predicted against measured into this image")
    args = ap.parse_args(argv)
    frame = table(Path(args.results))
    text = markdown(frame)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.figure:
        from workflow_scripts.report.style import apply_style, parse_style, save

        style, path = parse_style(None), Path(args.figure)
        apply_style(style)
        save(memory_prediction_figure(frame, style), path.parent, path.stem, style["dpi"])


if __name__ == "__main__":
    main()
