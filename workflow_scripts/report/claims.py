"""A publication's numbers against ours (rule claims, config `published`):

    python -m workflow_scripts.report.claims --fair results/<s>/tables/runs.csv \\
        --as-published results/<s>/as_published/tables/runs.csv --published '<config published as JSON>' \\
        --out-csv claims.csv --out-md claims.md --figure claims.png

Three columns per claimed (model, strategy) and measure: the published number, our regenerated as-published run
(the publication's own settings, confounds included) and our fair run (the study's one precision policy), each of
ours with its ratio to the published number. Measures: seconds per epoch (ours: the steady step time times the
steps of one epoch, warm-up and compilation excluded), peak memory (the peak `published.memory` names, in
`published.memory_unit`) and final training loss (mean over repeats). Headlines (a published speed ratio such as
"ZeRO-1/2 2.4x faster than DP") are recomputed from both of our variants. The figure draws the three side by side.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from workflow_scripts import columns as C
from workflow_scripts.report.style import apply_style, corner_note, grid, parse_style, save, titled
from workflow_scripts.report.tables import read_runs
from workflow_scripts.units import GB, GIB

MEASURES = {  # claim key -> (our runs.csv column, label)
    "seconds_per_epoch": ("time_per_epoch_s", "time per epoch (s)"),
    "peak_memory": (None, "peak memory"),
    "final_loss": ("final_loss", "final training loss"),
}
MEMORY_COLUMNS = {"allocated": "peak_allocated_bytes", "reserved": "peak_reserved_bytes",
                  "device": "sampler_peak_device_bytes"}
UNIT_BYTES = {"GB": GB, "GiB": GIB}


def ours(runs: pd.DataFrame, model: str, strategy: str, layout: str, published: dict) -> dict:
    """Mean over the ok repeats of each measure, in the publication's units, and the run's precision."""
    rows = runs[(runs["model"] == model) & (runs["strategy"] == strategy) & (runs["layout"] == layout)]
    ok = rows[rows["status"] == C.OK]
    if ok.empty:
        return {"status": rows["status"].iloc[0] if len(rows) else "missing", "precision": None}
    memory = ok[MEMORY_COLUMNS[published["memory"]]] / UNIT_BYTES[published["memory_unit"]]
    return {"status": C.OK, "precision": ok["precision"].iloc[0], "repeats": len(ok),
            "seconds_per_epoch": ok["time_per_epoch_s"].mean(), "peak_memory": memory.mean(),
            "final_loss": ok["final_loss"].mean()}


def ratio(value, reference):
    return value / reference if value is not None and reference and not pd.isna(value) else np.nan


def claims_table(fair: pd.DataFrame, as_published: pd.DataFrame, published: dict) -> pd.DataFrame:
    out = []
    for claim in published["claims"]:
        m, s = claim["model"], claim["strategy"]
        variants = {"as_published": ours(as_published, m, s, published["layout"], published),
                    "fair": ours(fair, m, s, published["layout"], published)}
        for measure in MEASURES:
            if measure not in claim:
                continue
            row = {"model": m, "strategy": s, "measure": measure, "published": claim[measure]}
            for name, got in variants.items():
                value = got.get(measure, np.nan)
                row |= {name: value, f"{name}_ratio": ratio(value, claim[measure]),
                        f"{name}_precision": got["precision"], f"{name}_status": got["status"]}
            out.append(row)
    return pd.DataFrame(out)


def headlines_table(table: pd.DataFrame, published: dict) -> pd.DataFrame:
    """Per headline and faster strategy: the published factor and ours (slower's s/epoch over faster's)."""
    time = table[table["measure"] == "seconds_per_epoch"].set_index(["model", "strategy"])
    out = []
    for h in published["headlines"]:
        for fast in h["faster"]:
            row = {"headline": h["text"], "model": h["model"], "slower": h["slower"], "faster": fast,
                   "published": h["factor"]}
            for name in ("as_published", "fair"):
                try:
                    row[name] = time.loc[(h["model"], h["slower"]), name] / time.loc[(h["model"], fast), name]
                except KeyError:  # no time claim for one of them
                    row[name] = np.nan
            out.append(row)
    return pd.DataFrame(out, columns=["headline", "model", "slower", "faster", "published", "as_published", "fair"])


def cell(value, ratio_value=None, precision=None, status=C.OK) -> str:
    if status not in (None, C.OK):
        return status
    if value is None or pd.isna(value):
        return "–"
    text = f"{value:.4g}"
    if ratio_value is not None and not pd.isna(ratio_value):
        text += f" (x{ratio_value:.2f})"
    return text + (f" [{precision}]" if precision else "")


def write_markdown(table: pd.DataFrame, heads: pd.DataFrame, published: dict, path: Path) -> None:
    unit = published["memory_unit"]
    lines = [f"Published: {published['source']}", "",
             "Ours: regenerated **as published** (the publication's own settings, its confounds included) and "
             "**fair** (the study's one precision policy); (xR) = ours / published; [precision] per run. "
             f"Memory: torch {published['memory']} peak in {unit}. Time per epoch: steady steps x steps per epoch "
             "(warm-up and compilation excluded).", "",
             "| model | strategy | measure | published | as published | fair |", "|---|---|---|---|---|---|"]
    for r in table.itertuples():
        label = MEASURES[r.measure][1] + (f" ({unit})" if r.measure == "peak_memory" else "")
        lines.append(f"| {r.model} | {r.strategy} | {label} | {r.published:.4g} | "
                     f"{cell(r.as_published, r.as_published_ratio, r.as_published_precision, r.as_published_status)}"
                     f" | {cell(r.fair, r.fair_ratio, r.fair_precision, r.fair_status)} |")
    if len(heads):
        lines += ["", "| headline | model | slower / faster | published | as published | fair |",
                  "|---|---|---|---|---|---|"]
        for h in heads.itertuples():
            lines.append(f"| {h.headline} | {h.model} | {h.slower} / {h.faster} | {h.published:.2f}x | "
                         f"{cell(h.as_published)}x | {cell(h.fair)}x |")
    path.write_text("\n".join(lines) + "\n")


def claims_figure(table: pd.DataFrame, heads: pd.DataFrame, published: dict, style: dict):
    """Per measure the published figure, ours as published and ours fair; the headline speed-ups last."""
    measures = [m for m in MEASURES if m in set(table["measure"])]
    fig, axes = grid(len(measures) + (1 if len(heads) else 0), style, ncols=2)
    series = [("published", "0.55"), ("as_published", "C1"), ("fair", "C0")]
    for ax, measure in zip(axes, measures):
        rows = table[table["measure"] == measure].reset_index(drop=True)
        x = np.arange(len(rows))
        for i, (name, colour) in enumerate(series):
            ax.bar(x + (i - 1) * 0.27, rows[name].astype(float), width=0.27, color=colour,
                   label=name.replace("_", "-"))
        ax.set_xticks(x)
        ax.set_xticklabels(rows["model"] + "\n" + rows["strategy"], fontsize="x-small")
        unit = f" ({published['memory_unit']})" if measure == "peak_memory" else ""
        ax.set_ylabel(MEASURES[measure][1] + unit)
        titled(ax, MEASURES[measure][1])
        if rows[["as_published", "fair"]].isna().all().all():
            corner_note(ax, "ours: not measured here (no torch peak on CPU)")
    if len(heads):
        ax = axes[-1]
        x = np.arange(len(heads))
        for i, (name, colour) in enumerate(series):
            ax.bar(x + (i - 1) * 0.27, heads[name].astype(float), width=0.27, color=colour)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(heads["faster"] + " vs\n" + heads["slower"], fontsize="x-small")
        ax.set_ylabel("speed-up (time per epoch ratio)")
        titled(ax, "headline: " + "; ".join(dict.fromkeys(heads["headline"])))
    axes[0].legend(fontsize="x-small")
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fair", required=True)
    ap.add_argument("--as-published", required=True)
    ap.add_argument("--published", required=True, help="the study's config `published`, as JSON")
    ap.add_argument("--style", default="{}")
    ap.add_argument("--out-csv", required=True)
    ap.add_argument("--out-headlines", required=True)
    ap.add_argument("--out-md", required=True)
    ap.add_argument("--figure", required=True)
    args = ap.parse_args(argv)
    published = json.loads(args.published)
    table = claims_table(read_runs(args.fair), read_runs(args.as_published), published)
    heads = headlines_table(table, published)
    out_csv = Path(args.out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out_csv, index=False)
    heads.to_csv(args.out_headlines, index=False)
    write_markdown(table, heads, published, Path(args.out_md))
    style, figure = parse_style(args.style), Path(args.figure)
    apply_style(style)
    save(claims_figure(table, heads, published, style), figure.parent, figure.stem, style["dpi"])
    print(Path(args.out_md).read_text())


if __name__ == "__main__":
    main()
