"""What a study found, as tables of numbers: the first page of report.html (report/workflow.rst includes the
reStructuredText) and findings.md beside the summary table.

    python -m workflow_scripts.report.findings --runs runs.csv [--verify verify/reproduction.csv] \\
        --study default --md tables/findings.md --rst tables/findings.rst

Tables, each with numbered notes under it:
- Findings      per (model, layout): the fastest strategy with its mean ± 95% CI and its lead over the next
                fastest (Welch's test where both have two or more repeats), and the strategy with the lowest peak
                memory and its margin under the next lowest; how many strategies ran to `ok`.
- Summary       per strategy: status, throughput (mean ± 95% CI) and its rank, peak memory and its rank, final loss.
- Not measured  the rows that ended oom, unsupported or failed (or lost a repeat), with the reason each gives.
- Reproduction  with a verify output (target verify): the rows per verdict, and each row neither reproduced nor
                explained with why.
- Lever decisions  with lever trials (measured `auto` levers: job/lever_trial.py): per configuration what was
                chosen, measured or read from the machine's cache, each candidate's tokens/s and the seconds
                deciding took, against the timed runs' launch time.

Strategies kept out of figures (zero0, identical to ddp) are left out of the rankings and named in a note.
Throughput is tokens/s, images/s for image classifiers; peak memory is the summary table's (tables.peak_memory).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from workflow_scripts import columns as C
from workflow_scripts import status
from workflow_scripts.report import stats
from workflow_scripts.report.tables import (
    MEMORY_SOURCES,
    fmt_mean_ci,
    is_image_model,
    layout_word,
    memory_unit,
    order_strategies,
    read_runs,
    summary_rows,
)

VERIFY_PASSING = status.PASSING  # the verdicts target verify accepts


@dataclass
class Table:
    """A titled table whose cells may cite its notes by number ([1] in Markdown, a footnote in reStructuredText)."""

    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> str:
        """The marker of a note (added once), to append to a cell."""
        if text not in self.notes:
            self.notes.append(text)
        return f"\x00{self.notes.index(text) + 1}\x00"


# ---------------------------------------------------------------- what the tables say
def throughput(model: str) -> tuple[str, str]:
    """(summary column, unit) of a model's throughput."""
    return ("samples_per_s", "images/s") if is_image_model(model) else ("tokens_per_s", "tokens/s")


def where(row) -> str:
    return layout_word(row["layout"], int(row["world_size"]), row["platform"])


def percent(ratio: float) -> str:
    return f"{100 * (ratio - 1):+.0f} %".replace("-", "−")


def welch_note(runs: pd.DataFrame, row_a, row_b, metric: str) -> str:
    """'Welch p = 0.004' over the two strategies' successful repeats, or why it cannot be tested."""
    def values(row):
        ok = runs[(runs["model"] == row["model"]) & (runs["layout"] == row["layout"])
                  & (runs["strategy"] == row["strategy"]) & (runs["status"] == C.OK)]
        return list(ok[metric])
    c = stats.compare(values(row_a), values(row_b))
    if c.distinguishable is None:
        return "not tested: under 2 repeats"
    p = f"p = {c.p:.3f}" if c.p >= 0.001 else "p < 0.001"
    return f"Welch {p}" + ("" if c.distinguishable else ", not distinguishable")


def ranked(rows: pd.DataFrame, metric: str, ascending: bool) -> pd.DataFrame:
    """The rows that ran to ok with a value, best first. Peak memory ranks only the rows measured as most of them
    are (one MEMORY_SOURCES key): a device-wide peak and a torch-reserved one are not the same quantity."""
    ok = rows[(rows["status"] == C.OK) & rows[metric].notna()]
    if metric == "peak_memory_bytes" and len(ok):
        ok = ok[ok["peak_memory_source"] == ok["peak_memory_source"].mode().iloc[0]]
    return ok.sort_values([metric, "strategy"], ascending=[ascending, True])


def memory_sources(rows: pd.DataFrame) -> list[str]:
    """The MEMORY_SOURCES keys the rows' peak memories come from."""
    return list(dict.fromkeys(k for v in rows["peak_memory_source"] for k in str(v).split(";") if k in MEMORY_SOURCES))


def memory_header(table: Table, word: str, summary: pd.DataFrame) -> str:
    """The peak-memory column's header: marked with its source where every row has the same one."""
    sources = memory_sources(summary[summary["status"] == C.OK])
    return word + (table.note(MEMORY_SOURCES[sources[0]][1]) if len(sources) == 1 else "")


def memory_cell(row, unit: tuple[str, float], table: Table, summary: pd.DataFrame, with_unit: bool = True) -> str:
    """Mean ± CI in `unit`; marked with its source unless the column's header is (one source in the table)."""
    text = fmt_mean_ci(row["peak_memory_bytes"] / unit[1], row["peak_memory_bytes_ci95"] / unit[1])
    text += f" {unit[0]}" if with_unit else ""
    if len(memory_sources(summary[summary["status"] == C.OK])) == 1:
        return text
    return text + "".join(table.note(MEMORY_SOURCES[s][1]) for s in memory_sources(pd.DataFrame([row])))


def interval_note(table: Table, n: float) -> str:
    if n >= 2:
        return table.note("mean ± 95% confidence half-width over the successful repeats (Student t, n − 1 "
                          "degrees of freedom)")
    return table.note("one successful repeat: no interval")


def findings_table(summary: pd.DataFrame, runs: pd.DataFrame, hidden: list[str]) -> Table:
    t = Table("Findings", ["Model", "Run on", "Fastest", "Throughput", "Lead over the next fastest",
                           "Lowest peak memory", "", "Margin under the next lowest", "Ran to ok"])
    t.header[6] = memory_header(t, "Peak memory", summary)
    for (model, _), rows in summary.groupby(["model", "layout"], sort=False):
        metric, unit = throughput(model)
        visible = rows[~rows["strategy"].isin(hidden)]
        fast = ranked(visible, metric, ascending=False)
        small = ranked(visible, "peak_memory_bytes", ascending=True)
        mem_unit = memory_unit(float(small["peak_memory_bytes"].max()) if len(small) else math.nan)
        cells = [model, where(rows.iloc[0])]
        if len(fast):
            a = fast.iloc[0]
            cells += [a["strategy"], f"{fmt_mean_ci(a[metric], a[f'{metric}_ci95'], decimals=0)} {unit}"
                      + interval_note(t, a[f"{metric}_n"])]
            if len(fast) > 1:
                b = fast.iloc[1]
                cells.append(f"{percent(a[metric] / b[metric])} over {b['strategy']} "
                             f"({welch_note(runs, a, b, metric)})")
            else:
                cells.append("–" + t.note("one strategy ran to ok: nothing to rank"))
        else:
            cells += ["–", "–", "–"]
        if len(small):
            a = small.iloc[0]
            cells += [a["strategy"], memory_cell(a, mem_unit, t, summary)]
            if len(small) > 1:
                b = small.iloc[1]
                cells.append(f"{percent(a['peak_memory_bytes'] / b['peak_memory_bytes'])} under {b['strategy']}")
            else:
                cells.append("–" + t.note("one strategy ran to ok: nothing to rank"))
        else:
            cells += ["–", "–", "–"]
        ok = (visible["status"] == C.OK).sum()
        cells.append(f"{ok} of {len(visible)}")
        t.rows.append(cells)
    if hidden:
        t.notes.append(f"Left out of the rankings (identical to another strategy, in the tables only): "
                       f"{', '.join(hidden)}.")
    return t


def summary_tables(summary: pd.DataFrame, hidden: list[str]) -> list[Table]:
    """One table per (model, layout): every strategy's status, throughput, peak memory, ranks and final loss."""
    out = []
    for (model, _), rows in summary.groupby(["model", "layout"], sort=False):
        metric, unit = throughput(model)
        ok = rows[rows["status"] == C.OK]
        mem_unit = memory_unit(float(ok["peak_memory_bytes"].max()) if len(ok) else math.nan)
        t = Table(f"Summary: {model}, {where(rows.iloc[0])}",
                  ["Strategy", "Status", f"{unit[0].upper()}{unit[1:]}", "Speed rank", "", "Memory rank",
                   "Final loss", "Repeats ok"])
        t.header[4] = memory_header(t, f"Peak memory ({mem_unit[0]})", summary)
        visible = rows[~rows["strategy"].isin(hidden)]
        speed = {s: i + 1 for i, s in enumerate(ranked(visible, metric, ascending=False)["strategy"])}
        memory = {s: i + 1 for i, s in enumerate(ranked(visible, "peak_memory_bytes", ascending=True)["strategy"])}
        for _, row in rows.iterrows():
            repeats = f"{row['n_ok']}/{row['n_runs']}"
            if row["status"] != C.OK:
                t.rows.append([row["strategy"], C.STATUS_CELL.get(row["status"], row["status"])] + ["–"] * 5
                              + [repeats])
                continue
            rank = (lambda ranks: str(ranks[row["strategy"]]) if row["strategy"] in ranks else "–" + t.note(
                "left out of the rankings (identical to another strategy)" if row["strategy"] in hidden else
                "not ranked: peak memory measured otherwise than the ranked rows"))
            t.rows.append([
                row["strategy"], C.OK + (f" ({row['status_detail']})" if row["status_detail"] else ""),
                fmt_mean_ci(row[metric], row[f"{metric}_ci95"], decimals=0), rank(speed),
                memory_cell(row, mem_unit, t, summary, with_unit=False) if pd.notna(row["peak_memory_bytes"])
                else "–", rank(memory), fmt_mean_ci(row["final_loss"], row["final_loss_ci95"], decimals=3), repeats])
        ranks = t.note("Rank 1: the highest throughput, the lowest peak memory, among the strategies that ran to ok. "
                       "± is the 95% confidence half-width where two or more repeats succeeded. All columns: "
                       "summary.md.")
        t.header[3] += ranks
        t.header[5] += ranks
        out.append(t)
    return out


def not_measured_table(summary: pd.DataFrame) -> Table | None:
    rows = summary[summary["reason"].astype(bool) | (summary["status"] != C.OK)]
    if rows.empty:
        return None
    t = Table("Not measured", ["Model", "Run on", "Strategy", "Status", "Reason"])
    for _, row in rows.iterrows():
        status = row["status_detail"] or C.STATUS_CELL.get(row["status"], row["status"])
        t.rows.append([row["model"], where(row), row["strategy"], status, row["reason"] or "–"])
    return t


def verify_tables(reproduction: pd.DataFrame) -> list[Table]:
    counts = reproduction["verdict"].value_counts()
    passed = int(counts[[v for v in VERIFY_PASSING if v in counts]].sum())
    head = Table("Reproduction (target verify)", ["Verdict", "Rows"])
    head.rows = [[verdict, str(int(n))] for verdict, n in counts.items()]
    head.rows.append(["target verify", f"{'passes' if passed == len(reproduction) else 'fails'}: {passed} of "
                      f"{len(reproduction)} rows reproduced or explained"])
    head.notes.append("Verdicts and tolerances: workflow_scripts/report/verify.py; every row: reproduction.md.")
    bad = reproduction[~reproduction["verdict"].isin(VERIFY_PASSING)]
    if bad.empty:
        return [head]
    rows = Table("Rows neither reproduced nor explained", ["Model", "Strategy", "Layout", "Repeat", "Verdict", "Why"])
    rows.rows = [[str(r["model"]), str(r["strategy"]), str(r["layout"]), str(r["repeat"]), str(r["verdict"]),
                  str(r["why"])] for _, r in bad.iterrows()]
    return [head, rows]


def study_line(study: str, summary: pd.DataFrame, runs: pd.DataFrame) -> str:
    """'Study default: 1 model, 13 strategies, 1 layout; 13 runs, 10 ok; platform cpu.'"""
    def count(n: int, one: str, many: str) -> str:
        return f"{n} {one if n == 1 else many}"
    platforms = ", ".join(sorted(set(summary["platform"].astype(str)) - {""})) or "–"
    return (f"Study {study}: {count(summary['model'].nunique(), 'model', 'models')}, "
            f"{count(summary['strategy'].nunique(), 'strategy', 'strategies')}, "
            f"{count(summary['layout'].nunique(), 'layout', 'layouts')}; {count(len(runs), 'run', 'runs')}, "
            f"{int((runs['status'] == C.OK).sum())} ok; platform {platforms}.")


def build(runs: pd.DataFrame, reproduction: pd.DataFrame | None, trials: dict | None = None) -> list[Table]:
    summary = summary_rows(runs)
    if summary.empty:
        return [Table("Findings", ["Runs"], [["none"]])]
    hidden = order_strategies(summary.loc[~summary["in_figures"].astype(bool), "strategy"])
    tables = [findings_table(summary, runs, hidden), *summary_tables(summary, hidden)]
    tables += [t for t in [not_measured_table(summary)] if t]
    if reproduction is not None:
        tables += verify_tables(reproduction)
    if trials:
        tables.append(lever_table(trials, runs))
    return tables


def lever_table(trials: dict, runs: pd.DataFrame) -> Table:
    """`trials`: {(model, strategy, layout): the lever trial's verdict}. Deciding time against the timed runs' launch
    time (runs.csv launch_wall_s: process start, compilation and training of every repeat)."""
    t = Table("Lever decisions", ["Model", "Strategy", "Layout", "Chosen", "Decided by", "Candidates (tokens/s)",
                                  "Deciding (s)"])
    for (model, strategy, layout), v in sorted(trials.items()):
        speeds = "; ".join(f"{r['candidate']} {r['tokens_per_s']:,.0f}" if r.get("tokens_per_s")
                           else f"{r['candidate']} {r['status']}" for r in v.get("candidates", []))
        by = "cache" if (v.get("cache") or {}).get("hit") else v.get("by", "measurement")
        t.rows.append([model, strategy, layout, v["chosen"], by, speeds or "–", f"{v.get('decided_s', 0):.1f}"])
    decided = sum(float(v.get("decided_s") or 0) for v in trials.values())
    cached = sum(bool((v.get("cache") or {}).get("hit")) for v in trials.values())
    ruled = sum(v.get("by") == "rule" for v in trials.values())
    launch = pd.to_numeric(runs.get("launch_wall_s", pd.Series(dtype=float)), errors="coerce").sum()
    mark = t.note("the timed runs' launch time: every repeat from process start to exit (start-up, compilation, "
                  "training), summed over runs.csv's launch_wall_s")
    share = f"{100 * decided / launch:.0f} % of the timed runs' {launch:,.0f} s{mark}" if launch > 0 else "–"
    counted = f"{len(trials) - cached - ruled} measured, {cached} cached" + (f", {ruled} by rule" if ruled else "")
    t.rows.append(["all", "", "", "", counted, share, f"{decided:.1f}"])
    t.notes.append("Candidates the rule knows cannot win are left out (training/levers.py); each configuration's "
                   "verdict: levers/<model>/<strategy>/<layout>.json.")
    return t


def read_trials(paths: list[str]) -> dict:
    """The lever trials' verdicts, keyed by the (model, strategy, layout) of their path .../<m>/<s>/<layout>.json."""
    import json

    out = {}
    for path in paths:
        p = Path(path)
        if not p.exists():
            raise SystemExit(f"findings: --levers {p}: no such file")
        out[(p.parent.parent.name, p.parent.name, p.stem)] = json.loads(p.read_text())
    return out


# ---------------------------------------------------------------- rendering
def _marks(cell: str, render) -> str:
    """The cell on one line (a reason may span several), its note markers rendered."""
    parts = " ".join(str(cell).split()).split("\x00")
    return "".join(render(int(p)) if i % 2 else p for i, p in enumerate(parts))


def markdown(title: str, line: str, tables: list[Table]) -> str:
    out = [f"# {title}", "", line, ""]
    for t in tables:
        cells = [[_marks(c, lambda n: f" [{n}]").replace("|", "\\|") for c in r] for r in [t.header, *t.rows]]
        out += [f"## {t.title}", "", "| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(t.header)]
        out += ["| " + " | ".join(r) + " |" for r in cells[1:]]
        out += [""] + [f"[{i}] {n}  " for i, n in enumerate(t.notes, 1)] + [""]
    return "\n".join(out)


def rst_text(text: str) -> str:
    """Plain text in reStructuredText: markup characters escaped."""
    for ch in ("\\", "*", "`", "|", "_", "[", "]"):
        text = text.replace(ch, "\\" + ch)
    return text


def rst(title: str, line: str, tables: list[Table]) -> str:
    out = [title, "=" * len(title), "", rst_text(line), ""]
    for t in tables:
        out += [".. list-table:: " + rst_text(t.title), "   :header-rows: 1", "   :class: findings", ""]
        for r in [t.header, *t.rows]:
            cells = [_marks(rst_text(c), lambda n: f"\\ :sup:`{n}`") or "–" for c in r]
            out += ["   * - " + cells[0]] + [f"     - {c}" for c in cells[1:]]
        out.append("")
        out += [f"| :sup:`{i}` {rst_text(n)}" for i, n in enumerate(t.notes, 1)] + [""]
    return "\n".join(out)


def read_reproduction(path) -> pd.DataFrame | None:
    if not path:
        return None
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"findings: --verify {path}: no such file")
    table = pd.read_csv(path)
    missing = {"model", "strategy", "layout", "repeat", "verdict", "why"} - set(table.columns)
    if missing:
        raise SystemExit(f"findings: --verify {path}: no column {', '.join(sorted(missing))}")
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True, help="runs.csv from the parse stage")
    ap.add_argument("--verify", default=None, help="verify/reproduction.csv of target verify, where it exists")
    ap.add_argument("--levers", nargs="*", default=[], help="the study's lever trial verdicts, where measured")
    ap.add_argument("--study", default="", help="the study's name (config study)")
    ap.add_argument("--md", required=True, help="where findings.md goes")
    ap.add_argument("--rst", required=True, help="where findings.rst (the report's first page) goes")
    args = ap.parse_args(argv)
    runs = read_runs(args.runs)
    tables = build(runs, read_reproduction(args.verify), read_trials(args.levers))
    line = study_line(args.study, summary_rows(runs), runs) if len(runs) else f"Study {args.study}: no runs."
    title = f"What the {args.study} study found" if args.study else "What the study found"
    for path, text in ((args.md, markdown(title, line, tables)), (args.rst, rst(title, line, tables))):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    print(f"findings: {len(tables)} tables -> {args.md}, {args.rst}")


if __name__ == "__main__":
    main()
