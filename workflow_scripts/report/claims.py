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

A loss is compared only where our runs start from pretrained weights and their provenance records no substitution
(runs.csv `initialisation`, `substitutions`); elsewhere the loss cell reads "not comparable", numbered notes under
the table say why, claims.csv keeps the value without a ratio, and the figure leaves the bar out. Speed and memory
are compared in every case.
"""
from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from workflow_scripts import columns as C
from workflow_scripts.report.style import apply_style, corner_note, grid, mark_missing, parse_style, save, titled
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
RANDOM_INIT = "random initialisation (the publication fine-tuned pretrained weights)"
COMPARABLE, NOT_COMPARABLE = "yes", "no: "  # claims.csv `<variant>_loss_comparable`: yes, or no: <reasons>
REASONS_SEP = "; "  # between reasons, as between substitutions in runs.csv


def as_text(value) -> str:
    return "" if value is None or pd.isna(value) else str(value).strip()


def loss_reasons(rows: pd.DataFrame) -> list[str]:
    """Why these runs' final loss is not comparable to a publication's, each reason once, in order; none where every
    run started from pretrained weights (`initialisation` "pretrained: ...") with no substitution recorded. A column
    that is missing, or a run without its initialisation, is not known, so not comparable. An empty `substitutions`
    reads as none where the run records its initialisation (the parse stage writes both; CSV reads "" as empty)."""
    reasons = []
    for _, run in rows.iterrows():
        init = as_text(run["initialisation"]) if "initialisation" in rows else ""
        if not init:
            reasons.append("initialisation not recorded")
        elif init == "random":
            reasons.append(RANDOM_INIT)
        elif not init.startswith("pretrained"):
            reasons.append(f"initialisation: {init}")
        subs = as_text(run["substitutions"]) if "substitutions" in rows else ""
        if "substitutions" not in rows or (not init and not subs):
            reasons.append("substitutions not recorded")
        reasons += [s.strip() for s in subs.split(REASONS_SEP) if s.strip()]
    return list(dict.fromkeys(reasons))


def ours(runs: pd.DataFrame, model: str, strategy: str, layout: str, published: dict) -> dict:
    """Mean over the ok repeats of each measure, in the publication's units, the run's precision and why the loss is
    not comparable (`loss_reasons`, empty where it is)."""
    rows = runs[(runs["model"] == model) & (runs["strategy"] == strategy) & (runs["layout"] == layout)]
    ok = rows[rows["status"] == C.OK]
    if ok.empty:
        return {"status": rows["status"].iloc[0] if len(rows) else "missing", "precision": None}
    memory = ok[MEMORY_COLUMNS[published["memory"]]] / UNIT_BYTES[published["memory_unit"]]
    return {"status": C.OK, "precision": ok["precision"].iloc[0], "repeats": len(ok),
            "seconds_per_epoch": ok["time_per_epoch_s"].mean(), "peak_memory": memory.mean(),
            "final_loss": ok["final_loss"].mean(), "loss_reasons": loss_reasons(ok)}


def ratio(value, reference):
    return value / reference if value is not None and reference and not pd.isna(value) else np.nan


def comparable_cell(reasons: list[str]) -> str:
    return NOT_COMPARABLE + REASONS_SEP.join(reasons) if reasons else COMPARABLE


def not_comparable(cell_text) -> list[str]:
    """The reasons of a `<variant>_loss_comparable` cell; none where the loss is comparable or was not measured."""
    cell_text = as_text(cell_text)
    return cell_text[len(NOT_COMPARABLE):].split(REASONS_SEP) if cell_text.startswith(NOT_COMPARABLE) else []


def claims_table(fair: pd.DataFrame, as_published: pd.DataFrame, published: dict) -> pd.DataFrame:
    """One row per claim and measure: the published number, then per variant (as_published, fair) our value, its
    ratio, precision, status and, on final-loss rows, `<variant>_loss_comparable` ("yes", or "no: " and the
    reasons; empty where no run is ok). A loss that is not comparable keeps its value and has no ratio."""
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
                reasons = got.get("loss_reasons") if measure == "final_loss" else None
                row |= {name: value, f"{name}_ratio": np.nan if reasons else ratio(value, claim[measure]),
                        f"{name}_precision": got["precision"], f"{name}_status": got["status"],
                        f"{name}_loss_comparable": "" if reasons is None else comparable_cell(reasons)}
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


def notes_of(table: pd.DataFrame) -> dict[str, int]:
    """Every reason a loss is not comparable, numbered once each in the table's order."""
    notes: dict[str, int] = {}
    for r in table.itertuples():
        for name in ("as_published", "fair"):
            for reason in not_comparable(getattr(r, f"{name}_loss_comparable", "")):
                notes.setdefault(reason, len(notes) + 1)
    return notes


def variant_cell(r, name: str, notes: dict[str, int]) -> str:
    """Our value, ratio and precision; for a loss that is not comparable, "not comparable" and its notes."""
    reasons = not_comparable(getattr(r, f"{name}_loss_comparable", ""))
    if reasons and getattr(r, f"{name}_status") in (None, C.OK):
        numbers = sorted({notes[reason] for reason in reasons})
        return f"not comparable (note{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))})"
    return cell(getattr(r, name), getattr(r, f"{name}_ratio"), getattr(r, f"{name}_precision"),
                getattr(r, f"{name}_status"))


def write_markdown(table: pd.DataFrame, heads: pd.DataFrame, published: dict, path: Path) -> None:
    """The claims table, the notes saying why a loss is not comparable under it, then the headlines."""
    unit = published["memory_unit"]
    notes = notes_of(table)
    lines = [f"Published: {published['source']}", "",
             "Ours: regenerated **as published** (the publication's own settings, its confounds included) and "
             "**fair** (the study's one precision policy); (xR) = ours / published; [precision] per run. "
             f"Memory: torch {published['memory']} peak in {unit}. Time per epoch: steady steps x steps per epoch "
             "(warm-up and compilation excluded).", "",
             "| model | strategy | measure | published | as published | fair |", "|---|---|---|---|---|---|"]
    for r in table.itertuples():
        label = MEASURES[r.measure][1] + (f" ({unit})" if r.measure == "peak_memory" else "")
        lines.append(f"| {r.model} | {r.strategy} | {label} | {r.published:.4g} | "
                     f"{variant_cell(r, 'as_published', notes)} | {variant_cell(r, 'fair', notes)} |")
    if notes:
        lines += ["", "Final training loss not comparable to the publication's (the value stays in claims.csv, "
                  "without a ratio):", ""]
        lines += [f"{number}. {reason}" for reason, number in notes.items()]
    if len(heads):
        lines += ["", "| headline | model | slower / faster | published | as published | fair |",
                  "|---|---|---|---|---|---|"]
        for h in heads.itertuples():
            lines.append(f"| {h.headline} | {h.model} | {h.slower} / {h.faster} | {h.published:.2f}x | "
                         f"{cell(h.as_published)}x | {cell(h.fair)}x |")
    path.write_text("\n".join(lines) + "\n")


def loss_note(ax, head: str, reasons) -> None:
    """A corner note naming why the losses left out are not comparable, with room made for it above the bars."""
    lines = [head] + [textwrap.fill(f"- {r}", width=60, subsequent_indent="  ") for r in reasons]
    corner_note(ax, "\n".join(lines))
    ax.texts[-1].set_multialignment("left")
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, top * (1.1 + 0.1 * sum(line.count("\n") + 1 for line in lines)))


def claims_figure(table: pd.DataFrame, heads: pd.DataFrame, published: dict, style: dict):
    """Per measure the published figure, ours as published and ours fair; the headline speed-ups last."""
    measures = [m for m in MEASURES if m in set(table["measure"])]
    fig, axes = grid(len(measures) + (1 if len(heads) else 0), style, ncols=2)
    series = [("published", "0.55"), ("as_published", "C1"), ("fair", "C0")]
    for ax, measure in zip(axes, measures):
        rows = table[table["measure"] == measure].reset_index(drop=True)
        x = np.arange(len(rows))
        reasons = {name: [not_comparable(c) for c in rows.get(f"{name}_loss_comparable", [""] * len(rows))]
                   for name in ("as_published", "fair")}
        drawn = {"published": rows["published"].astype(float)} | {
            name: rows[name].astype(float).where([not r for r in reasons[name]]) for name in reasons}
        for i, (name, colour) in enumerate(series):
            ax.bar(x + (i - 1) * 0.27, drawn[name], width=0.27, color=colour, label=name.replace("_", "-"))
        ax.set_xticks(x)
        ax.set_xticklabels(rows["model"] + "\n" + rows["strategy"], fontsize="x-small")
        unit = f" ({published['memory_unit']})" if measure == "peak_memory" else ""
        ax.set_ylabel(MEASURES[measure][1] + unit)
        titled(ax, MEASURES[measure][1])
        why = dict.fromkeys(reason for each in reasons.values() for r in each for reason in r)
        if why and drawn["as_published"].isna().all() and drawn["fair"].isna().all():
            loss_note(ax, "ours: loss not comparable", why)
        elif why:  # some drawn: the left-out bars marked
            for offset, name in ((0.0, "as_published"), (0.27, "fair")):
                for j in (j for j, r in enumerate(reasons[name]) if r):
                    mark_missing(ax, j + offset, "n/c", width=0.27)
            loss_note(ax, "n/c: loss not comparable", why)
        elif rows[["as_published", "fair"]].isna().all().all():
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
