"""The generated tables of the dated benchmark reports (benchmarks/*.md), written from the committed benchmark sets:

    python3 -m tools.benchmarks_md [--check] [--file benchmarks/<report>.md ...] [--results <root>]

Run by hand after a benchmark set changes, and by the committed-data test with `--check`. Without `--file` it reads
every report under benchmarks/. Every region of a report between an opening
marker and a closing one,

    <!-- bench-table sets="results/<study>/<set>,results/<study>/<another set>" table="compare" -->
    (anything: replaced)
    <!-- /bench-table -->

is rewritten in place with a table made from the named sets' CSVs, one set after the other in the order named. A
set is named by its folder relative to `--results` (the working directory by default, so a report names
`results/<study>/<set>`); its table is `<folder>/bench/<csv>`, or `<folder>/<csv>` where the folder holds it (a
second command's rows kept beside the first's, `results/<study>/<set>/bench/<part>`). The table's first column
shows the folder without `results/<study>/` and `bench/`. The markers stay and text outside them is never touched,
so a second run changes nothing. Reports of sets no longer in the tree carry their tables as plain text, without
markers. Two kinds of table:

- `compare`, from `harness_vs_trainer.csv` (rule bench_compare): one row per set and strategy, ours against the
  Trainer's fastest setting, mean ± 95 % CI (MFU), their ratio, whether the CIs are apart, ours over the ceiling; the
  ceiling (`bench.ceiling`) as its own row. Micro-batch and ours' compile levers from the runs' `run_spec.json`.
  The older one-round schema (`ours_tokens_per_s`, ...) is read too (no CI there).
- `levers`, from `levers.csv` (rule bench_levers): one row per set and lever, tokens/s as mean ± 95 % CI (Student's
  t, workflow_scripts.report.stats) over `levers_rounds.csv` where the set has one, the ratio to the set's first
  row, MFU, median step, torch peak and final loss (means over the rounds).

A region naming a missing set or CSV is an error naming the report, the set and the file, and nothing is written.
`--check` writes nothing and exits 1 with a unified diff for every report that is not what the committed results
give. Standard library and pandas only (no torch).
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workflow_scripts import columns as C
from workflow_scripts.report.stats import mean_ci

REPORTS = "benchmarks"  # the dated reports, relative to the repository root
DEFAULT_RESULTS = "."  # what the markers' set folders are relative to: the repository root
CEILING = "ceiling"  # the ceiling's runner and strategy name (workflow_scripts/bench/harness.py; not imported: torch)
CSV = {"compare": "harness_vs_trainer.csv", "levers": "levers.csv"}  # table kind -> its file under <set>/bench/
MARKER = re.compile(r"<!--\s*(/?)bench-table\b(.*?)-->", re.DOTALL)
ATTR = re.compile(r'(\w+)="([^"]*)"')
DASH = "–"
# The one-round schema -> today's (compare_summary in bench/harness.py)
OLD_COMPARE = {"ours_tokens_per_s": "ours tokens/s", "trainer_tokens_per_s": "trainer:default tokens/s",
               "ratio": "ratio to best", "ours_mfu": "ours MFU", "trainer_mfu": "trainer best MFU"}


class BenchTableError(ValueError):
    """A marker that cannot be rendered: bad syntax, or a set or CSV missing (the message names them)."""


@dataclass(frozen=True)
class Region:
    """One marked region: text[start:end] is replaced (the body between the two markers)."""

    start: int
    end: int
    line: int
    sets: tuple[str, ...]
    table: str


# ---------------------------------------------------------------- markers
def _attributes(raw: str, where: str) -> dict:
    """The marker's `name="value"` pairs; sets and table required, nothing else allowed."""
    attrs = dict(ATTR.findall(raw))
    if ATTR.sub("", raw).strip():
        raise BenchTableError(f"{where}: cannot read the marker's attributes {raw.strip()!r}")
    unknown = set(attrs) - {"sets", "table"}
    if unknown or "sets" not in attrs or attrs.get("table") not in CSV:
        raise BenchTableError(f'{where}: a bench-table marker needs sets="a,b" and table="compare" or '
                              f'table="levers" (and nothing else), got {raw.strip()!r}')
    return attrs


def regions(text: str, name: str = "report") -> list[Region]:
    """The marked regions of a markdown text, in order; unpaired or nested markers are an error."""
    out, opening = [], None
    for m in MARKER.finditer(text):
        where = f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
        closing = m.group(1) == "/"
        if closing == (opening is None):
            raise BenchTableError(f"{where}: {'closing' if closing else 'opening'} bench-table marker without "
                                  f"{'an opening' if closing else 'a closing'} one before it")
        if not closing:
            attrs = _attributes(m.group(2), where)
            sets = tuple(s.strip() for s in attrs["sets"].split(",") if s.strip())
            if not sets:
                raise BenchTableError(f"{where}: the bench-table marker names no set")
            opening = (m.end(), where, sets, attrs["table"])
        else:
            start, line, sets, table = opening
            out.append(Region(start, m.start(), line, sets, table))
            opening = None
    if opening is not None:
        raise BenchTableError(f"{opening[1]}: bench-table marker without a closing <!-- /bench-table -->")
    return out


def report_files(root: str | Path = ".") -> list[Path]:
    """Every dated report under <root>/benchmarks, in name order (the date first, so in time order)."""
    return sorted((Path(root) / REPORTS).glob("*.md"))


def as_files(files) -> list[Path]:
    """One path or several as a list of paths; None: every report of the working directory."""
    if files is None:
        return report_files()
    return [Path(files)] if isinstance(files, (str, Path)) else [Path(f) for f in files]


def marked_sets(files=None) -> list[tuple[str, str]]:
    """(set, table kind) of every region of the reports, in order, without repeats."""
    found = [(s, r.table) for path in as_files(files) for r in regions(path.read_text(), str(path)) for s in r.sets]
    return list(dict.fromkeys(found))


def inputs(files=None, results: str | Path = DEFAULT_RESULTS) -> list[str]:
    """The CSVs the reports' regions read: each set's table and its rounds file where one is committed."""
    out = []
    for name, table in marked_sets(files):
        csv, rounds = set_files(Path(results), name, table)
        out += [str(csv)] + ([str(rounds)] if rounds.exists() else [])
    return out


def set_files(results: Path, name: str, table: str) -> tuple[Path, Path]:
    """A set's table of this kind and its rounds file (which may not exist): in the named folder where it is there,
    else under its bench/."""
    folder = results / name
    csv = folder / CSV[table] if (folder / CSV[table]).is_file() else folder / "bench" / CSV[table]
    return csv, csv.with_name(csv.stem + "_rounds.csv")


def label(name: str) -> str:
    """A set's name in its table: the folder without `results/<study>/` and `bench/`."""
    parts = Path(name).parts
    if len(parts) > 2 and parts[0] == "results":
        parts = parts[2:]
    return "/".join(part for part in parts if part != "bench")


# ---------------------------------------------------------------- reading a set
def read_csv(results: Path, name: str, table: str, where: str) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The set's table and its rounds file (None where there is none)."""
    csv, rounds = set_files(results, name, table)
    if not csv.is_file():
        missing = f"no folder {results / name}" if not (results / name).is_dir() else "the folder has no such table"
        raise BenchTableError(f"{where}: set '{name}': {csv} not found ({missing})")
    return pd.read_csv(csv), (pd.read_csv(rounds) if rounds.is_file() else None)


def run_spec(bench: Path, strategy: str) -> dict:
    """The first round's run spec of ours (or of the ceiling); {} where none is kept."""
    pattern = f"{CEILING}/r*/{C.RUN_SPEC}" if strategy == CEILING else f"ours/{strategy}/r*/{C.RUN_SPEC}"
    specs = sorted(bench.glob(pattern))
    return json.loads(specs[0].read_text()) if specs else {}


def levers_label(train: dict, options: dict | None = None) -> str:
    """Ours' compile levers in words, as the hand tables wrote them; DeepSpeed's DeepCompile backend where the
    run's strategy options take it."""
    from workflow_scripts.training.strategies._deepspeed import asks_deepcompile

    if train.get("compile_model") is True:
        graphs = train.get("compile_mode") == "reduce-overhead"
        label = "whole model, CUDA graphs" if graphs else "whole model"
        return f"{label}, DeepCompile" if asks_deepcompile(options or {}) else label
    return "compiled blocks" if train.get("compile_blocks") is True else "eager"


# ---------------------------------------------------------------- formatting
def finite(x) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def number(x, fmt: str, suffix: str = "") -> str:
    """x formatted, or a dash where there is no number."""
    return f"{float(x):{fmt}}{suffix}" if finite(x) else DASH


def tokens(mean, half=None) -> str:
    """Tokens/s with thousands separators, ± the CI's half-width where there is one."""
    return number(mean, ",.0f") + (f" ± {float(half):,.0f}" if finite(mean) and finite(half) else "")


def percent(fraction) -> str:
    return number(100 * float(fraction), ".1f", " %") if finite(fraction) else DASH


def yes_no_apart(overlap) -> str:
    """`CIs overlap` (True/False, NaN without CIs) as 'CIs apart'."""
    text = str(overlap).strip().lower()
    return {"true": "no", "1": "no", "1.0": "no", "false": "yes", "0": "yes", "0.0": "yes"}.get(text, DASH)


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# ---------------------------------------------------------------- compare
COMPARE_HEADER = ["set", "micro-batch", "strategy (ours' levers)", "ours: tokens/s (MFU)", "Trainer best",
                  "Trainer: tokens/s (MFU)", "ours / Trainer", "CIs apart", "ours / ceiling"]


def compare_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Today's compare columns; the one-round schema renamed into them (the Trainer's defaults as its setting)."""
    if "ours_tokens_per_s" in df.columns and "ours tokens/s" not in df.columns:
        df = df.rename(columns=OLD_COMPARE).assign(**{"trainer best": "trainer:default"})
    need = ["strategy", "ours tokens/s", "trainer best", "ratio to best", "ours MFU"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise BenchTableError(f"no column {', '.join(missing)}")
    return df


def compare_row(row: dict, train: dict, options: dict) -> list[str]:
    """One strategy: ours (`train` and strategy `options` of its run spec), the Trainer's fastest setting, their
    ratio, the ceiling ratio."""
    best = row.get("trainer best")
    setting = str(best).split(":", 1)[-1] if isinstance(best, str) else DASH
    trainer = tokens(row.get(f"{best} tokens/s"), row.get(f"{best} ±95%")) if isinstance(best, str) else DASH
    return [number(train.get("micro_batch_size"), ".0f") if train else DASH,
            f"`{row['strategy']}` ({levers_label(train, options)})" if train else f"`{row['strategy']}`",
            f"{tokens(row['ours tokens/s'], row.get('ours ±95%'))} ({percent(row['ours MFU'])})",
            setting, f"{trainer} ({percent(row.get('trainer best MFU'))})",
            number(row["ratio to best"], ".2f", "×"), yes_no_apart(row.get("CIs overlap")),
            number(row.get("ours / ceiling"), ".2f")]


def ceiling_row(row: dict, train: dict) -> list[str]:
    """The ceiling: its tokens/s and MFU (in `ours MFU`), nothing to compare with."""
    mean = f"{tokens(row.get('ceiling tokens/s'), row.get('ceiling ±95%'))} ({percent(row['ours MFU'])})"
    return [number(train.get("micro_batch_size"), ".0f") if train else DASH, CEILING, mean, "", "", "", "", ""]


def compare_rows(name: str, df: pd.DataFrame, bench: Path) -> list[list[str]]:
    rows = []
    for row in compare_frame(df).to_dict("records"):
        spec = run_spec(bench, row["strategy"])
        train = spec.get("train", {})
        cells = (ceiling_row(row, train) if row["strategy"] == CEILING
                 else compare_row(row, train, spec.get("options") or {}))
        rows.append([f"`{label(name)}`" if not rows else ""] + cells)
    return rows


# ---------------------------------------------------------------- levers
LEVERS_HEADER = ["set", "lever", "strategy", "micro-batch", "tokens/s", "vs first row", "MFU", "step (ms)",
                 "torch peak (GiB)", "final loss"]


def lever_tokens(df: pd.DataFrame, rounds: pd.DataFrame | None) -> dict[str, tuple[float, float]]:
    """Per lever: mean tokens/s and the 95 % CI's half-width over the ok rounds (NaN without a rounds file)."""
    out = {row["lever"]: (row["tokens_per_s"], math.nan) for row in df.to_dict("records")}
    if rounds is not None:
        for lever, part in rounds[rounds["status"] == C.OK].groupby("lever", sort=False):
            ci = mean_ci(part["tokens_per_s"])
            out[lever] = (ci.mean, ci.half_width)
    return out


def lever_row(row: dict, mean: float, half: float, first: float) -> list[str]:
    ok = row.get("status") == C.OK
    strategy = f"`{row['strategy']}`" if isinstance(row.get("strategy"), str) else DASH
    return [row["lever"], strategy, number(row.get("micro_batch"), ".0f"),
            tokens(mean, half) if ok else str(row.get("status")), number(mean / first if ok else None, ".2f", "×"),
            percent(row.get("mfu")), number(1000 * float(row.get("step_time_s") or math.nan), ".1f"),
            number(row.get("peak_allocated_gib"), ".1f"), number(row.get("final_loss"), ".3f")]


def levers_rows(name: str, df: pd.DataFrame, rounds: pd.DataFrame | None) -> list[list[str]]:
    missing = [c for c in ("lever", "status", "tokens_per_s") if c not in df.columns]
    if missing:
        raise BenchTableError(f"no column {', '.join(missing)}")
    means = lever_tokens(df, rounds)
    first = means[df["lever"].iloc[0]][0]
    rows = []
    for row in df.to_dict("records"):
        mean, half = means[row["lever"]]
        rows.append([f"`{label(name)}`" if not rows else ""] + lever_row(row, mean, half, first))
    return rows


# ---------------------------------------------------------------- rewriting
def render(region: Region, results: Path) -> str:
    """The region's table, one set after the other."""
    rows = []
    for name in region.sets:
        df, rounds = read_csv(results, name, region.table, region.line)
        csv = set_files(results, name, region.table)[0]
        try:
            rows += compare_rows(name, df, csv.parent) if region.table == "compare" else levers_rows(name, df, rounds)
        except BenchTableError as e:
            raise BenchTableError(f"{region.line}: set '{name}': {csv}: {e}") from None
    return markdown(COMPARE_HEADER if region.table == "compare" else LEVERS_HEADER, rows)


def rewrite(text: str, results: str | Path, name: str = "report") -> str:
    """The text with every marked region's body replaced by its table (blank lines around it)."""
    out, pos = [], 0
    for region in regions(text, name):
        out += [text[pos:region.start], "\n\n" + render(region, Path(results)) + "\n\n"]
        pos = region.end
    return "".join(out) + text[pos:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", action="append", default=None,
                    help=f"a report to rewrite in place (repeatable; default: every {REPORTS}/*.md)")
    ap.add_argument("--results", default=DEFAULT_RESULTS,
                    help="the folder the markers' set folders are relative to (default: the working directory)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff when out of date")
    a = ap.parse_args(argv)
    paths = as_files(a.file)
    if not paths:
        print(f"benchmarks_md: error: no report under {Path(REPORTS).resolve()}", file=sys.stderr)
        return 2
    new = {}
    for path in paths:
        try:
            new[path] = rewrite(path.read_text(), a.results, str(path))
        except (BenchTableError, OSError) as e:
            print(f"benchmarks_md: error: {e}", file=sys.stderr)
            return 2
    stale = [path for path in paths if new[path] != path.read_text()]
    tables = sum(len(regions(new[path], str(path))) for path in paths)
    if not stale:
        print(f"{len(paths)} reports up to date ({tables} generated tables from {a.results})")
        return 0
    if a.check:
        for path in stale:
            sys.stdout.writelines(difflib.unified_diff(path.read_text().splitlines(True), new[path].splitlines(True),
                                                       f"{path} (committed)", f"{path} (from {a.results})"))
        names = " ".join(f"--file {path}" for path in stale)
        print(f"{len(stale)} reports not up to date with {a.results}: python3 -m tools.benchmarks_md "
              f"{names} --results {a.results}", file=sys.stderr)
        return 1
    for path in stale:
        path.write_text(new[path])
        print(f"{path}: rewrote its generated tables from {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
