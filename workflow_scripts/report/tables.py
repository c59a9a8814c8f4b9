"""The paper's summary table and the pairwise comparisons, from the parse stage's runs.csv:

    python -m workflow_scripts.report.tables --runs results/<study>/runs.csv --out-dir results/<study>/tables

writes into --out-dir:
- `summary.csv`  one row per (model, strategy, layout): configuration, status, and for each metric its mean,
                 95% CI half-width (`<metric>_ci95`, Student t, NaN with one repeat) and count (`<metric>_n`);
- `summary.md`   the same as a Markdown table (mean ± CI where repeats > 1), provenance as links;
- `summary.tex`  the same as a booktabs LaTeX table (needs booktabs, graphicx and hyperref);
- `comparisons.md` for each model and world size, which strategy pairs are NOT distinguishable (Welch p >= 0.05)
                 in tokens/s and in peak memory, and which pairs cannot be tested (fewer than two repeats).

Runs that ended `oom`, `unsupported` or `failed` keep their row, with the status in place of the numbers.
Peak memory is, per run: the device-wide sampler peak (NVML/amdsmi) on GPU, torch's max reserved when the sampler has
no value, and the peak host RSS (summed over ranks) on CPU; a footnote line says which one each row shows.
The readers and the aggregation here are shared with `workflow_scripts.report.figures`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from itertools import combinations
from pathlib import Path

import pandas as pd

from workflow_scripts import columns as C
from workflow_scripts.columns import GROUP_KEYS, RUN_COLUMNS, RUN_TEXT
from workflow_scripts.report.stats import ALPHA, compare, mean_ci, within
from workflow_scripts.units import GIB, MIB

KEYS = GROUP_KEYS  # one summary row per (model, strategy, layout)

# metrics aggregated over the successful repeats of a (model, strategy, layout)
METRICS = ["time_per_epoch_s", "train_time_s", "tokens_per_s", "samples_per_s", "mfu", "final_loss",
           "initial_loss", "val_loss_final", "step_time_median_s", "peak_memory_bytes", "peak_allocated_bytes",
           "peak_reserved_bytes", "sampler_peak_device_bytes", "peak_host_rss_bytes", "sampler_peak_host_bytes",
           "predicted_model_state_bytes", "predicted_host_state_bytes", "predicted_peak_bytes",
           "predicted_device_peak_bytes", "predicted_tokens_per_s", "val_accuracy_initial",
           "val_accuracy_final", "trainable_params", "forward_median_s", "backward_median_s",
           "optimizer_median_s"]
# configuration: taken from the group's first successful run (the same for every repeat)
CONFIG = ["world_size", "family", "zero_stage", "platform", "device_name", "precision", "n_params", "n_layer",
          "seq_len", "micro_batch", "grad_accum", "effective_batch", "tokens_per_step", "epochs", "train_samples",
          "in_figures", "strategy_source"]

MEMORY_SOURCES = {
    "sampler": ("d", "device-wide peak from the NVML/amdsmi sampler (includes the CUDA/HIP context)"),
    "reserved": ("r", "torch max_memory_reserved (the sampler had no value)"),
    "allocated": ("a", "torch max_memory_allocated (no sampler or reserved value)"),
    "host_rss": ("h", "peak host RSS of the training processes, summed over ranks (CPU run)"),
}


# ---------------------------------------------------------------- reading
def read_table(path, columns: list[str], text: set[str] = frozenset()) -> pd.DataFrame:
    """A CSV of the contract; a missing or empty file gives an empty frame. Missing columns are added as NaN."""
    path = Path(path) if path else None
    if path is None or not path.exists() or path.stat().st_size == 0:
        df = pd.DataFrame(columns=columns)
    else:
        df = pd.read_csv(path, dtype={c: "string" for c in text})
    for col in columns:
        if col not in df.columns:
            df[col] = pd.NA if col in text else math.nan
    for col in columns:
        if col not in text:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def parse_bool(value, default: bool = True) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return default
    if isinstance(value, str):
        text = value.strip().lower()
        return default if text == "" else text in ("true", "1", "yes", "y", "t")
    return bool(value)


def peak_memory(row) -> tuple[float, str | None]:
    """The one peak memory a row reports: (bytes, source key of MEMORY_SOURCES)."""
    on_cpu = str(row.get("platform") or "").lower() == "cpu"
    order = ([("host_rss", "peak_host_rss_bytes"), ("host_rss", "sampler_peak_host_bytes")] if on_cpu else
             [("sampler", "sampler_peak_device_bytes"), ("reserved", "peak_reserved_bytes"),
              ("allocated", "peak_allocated_bytes")])
    for source, col in order:
        value = row.get(col)
        if value is not None and not pd.isna(value) and value > 0:
            return float(value), source
    return math.nan, None


def prepare_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Normalise status and in_figures, fill text keys, add peak_memory_bytes / peak_memory_source."""
    df = df.copy()
    df["status"] = df["status"].fillna(C.FAILED).astype(str).str.strip().str.lower().replace("", C.FAILED)
    df["in_figures"] = [parse_bool(v) for v in df["in_figures"].astype(object)]
    for col in ("model", "strategy", "platform", "reason", "provenance"):
        df[col] = df[col].astype(object).where(df[col].notna(), "").astype(str)
    df = with_layout(df)
    df["repeat"] = df["repeat"].fillna(0)
    memory = [peak_memory(row) for row in df.to_dict("records")]
    df["peak_memory_bytes"] = [m[0] for m in memory]
    df["peak_memory_source"] = [m[1] or "" for m in memory]
    return df


def with_layout(df: pd.DataFrame) -> pd.DataFrame:
    """world_size as int and the layout key (ws2, dp1-pp2, ...) as text. Parse writes both for every run; a table
    without them is an error naming the first run at fault."""
    if "layout" not in df.columns:
        raise ValueError("no `layout` column: not a table of the parse stage (workflow_scripts/report/parse.py)")
    missing = df["layout"].isna() | df["world_size"].isna()
    if missing.any():
        first = df.loc[missing].iloc[0]
        raise ValueError(f"{int(missing.sum())} of {len(df)} rows have no layout key or world size (the first: "
                         f"run {first.get('run_id', '?')})")
    df = df.copy()
    df["world_size"] = pd.to_numeric(df["world_size"]).astype(int)
    df["layout"] = df["layout"].astype(str)
    return df


def read_runs(path) -> pd.DataFrame:
    return prepare_runs(read_table(path, RUN_COLUMNS, RUN_TEXT))


# ---------------------------------------------------------------- ordering and labels
def strategy_rank(name: str) -> tuple:
    """The strategies' order in tables and figures, from the registry: by engine family (ddp, deepspeed, fsdp),
    ZeRO stage, then name (ddp, ddp_overlap, grad_accum, zero0 ... zero2_offload, zero3 ... zeropp, fsdp); names the
    registry does not know follow, alphabetically."""
    from workflow_scripts.training.strategies import STRATEGIES

    s = STRATEGIES.get(name)
    return (0, s.family, s.zero_stage, name) if s else (1, "", 0, name)


def order_strategies(names) -> list[str]:
    return sorted(set(names), key=strategy_rank)


def model_order(runs: pd.DataFrame) -> list[str]:
    """Models by parameter count, then name."""
    sizes = runs.groupby("model")["n_params"].max() if len(runs) else pd.Series(dtype=float)
    return sorted(sizes.index, key=lambda m: (sizes[m] if pd.notna(sizes[m]) else math.inf, m))


def ranks_word(world_size: int, platform: str) -> str:
    unit = "CPU rank" if str(platform).lower() == "cpu" else "GPU"
    return f"{world_size} {unit}{'' if world_size == 1 else 's'}"


def data_parallel(row) -> bool:
    """A pure data-parallel layout (key ws<N>)."""
    return row["layout"] == f"ws{int(row['world_size'])}"


def layout_word(layout: str, world_size: int, platform: str) -> str:
    """'2 CPU ranks' for a pure data-parallel layout, 'dp2-pp2 (4 GPUs)' for others."""
    ranks = ranks_word(world_size, platform)
    return ranks if layout == f"ws{world_size}" else f"{layout} ({ranks})"


def memory_unit(max_bytes: float) -> tuple[str, float]:
    """GiB for values of a GiB and more, MiB below."""
    return ("GiB", float(GIB)) if not math.isfinite(max_bytes) or max_bytes >= GIB else ("MiB", float(MIB))


# ---------------------------------------------------------------- aggregation
def group_status(statuses: list[str]) -> tuple[str, str]:
    """(status, detail): 'ok' when any repeat succeeded, else the most telling failure."""
    failures = [s for s in statuses if s != C.OK]
    n_ok = len(statuses) - len(failures)
    counts = ", ".join(f"{failures.count(s)} {s}" for s in sorted(set(failures), key=_failure_rank))
    if n_ok == len(statuses):
        return C.OK, ""
    if n_ok:
        return C.OK, f"{n_ok}/{len(statuses)} ok; {counts}"
    return min(set(failures), key=_failure_rank), counts if len(set(failures)) > 1 else ""


def _failure_rank(status: str) -> int:
    return C.NOT_OK.index(status) if status in C.NOT_OK else len(C.NOT_OK)


def _first(rows: pd.DataFrame, col: str):
    values = rows[col].dropna()
    return values.iloc[0] if len(values) else math.nan


def summarise_group(rows: pd.DataFrame) -> dict:
    rows = rows.sort_values("repeat")
    status, detail = group_status(list(rows["status"]))
    ok = rows[rows["status"] == C.OK]
    source = ok if len(ok) else rows
    out = {"status": status, "status_detail": detail, "n_runs": len(rows), "n_ok": len(ok)}
    out.update({col: _first(source, col) for col in CONFIG})
    out["n_params"] = _first(rows, "n_params")  # a model property: also known for runs that never started
    out["in_figures"] = bool(rows["in_figures"].all())
    out["reason"] = "; ".join(dict.fromkeys(r for r in rows.loc[rows["status"] != C.OK, "reason"] if r))
    out["provenance"] = ";".join(p for p in rows["provenance"] if p)
    out["repeats"] = ";".join(str(int(r)) if float(r).is_integer() else str(r) for r in rows["repeat"])
    out["peak_memory_source"] = ";".join(dict.fromkeys(s for s in ok["peak_memory_source"] if s))
    for metric in METRICS:
        ci = mean_ci(ok[metric])
        out.update({metric: ci.mean, f"{metric}_ci95": ci.half_width, f"{metric}_n": ci.n})
    return out


def summary_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, strategy, layout), in model / world size / layout / strategy order."""
    columns = KEYS + ["status", "status_detail", "n_runs", "n_ok"] + CONFIG + ["reason", "provenance", "repeats",
                                                                                "peak_memory_source"]
    columns += [f"{m}{s}" for m in METRICS for s in ("", "_ci95", "_n")]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    records = [{**dict(zip(KEYS, key)), **summarise_group(rows)} for key, rows in runs.groupby(KEYS, sort=False)]
    table = pd.DataFrame(records, columns=columns)
    model_params = runs.groupby("model")["n_params"].max()
    table["n_params"] = table["n_params"].fillna(table["model"].map(model_params))
    models = {m: i for i, m in enumerate(model_order(runs))}
    order = sorted(range(len(table)), key=lambda i: (models[table.at[i, "model"]], table.at[i, "world_size"],
                                                     not data_parallel(table.loc[i]), table.at[i, "layout"],
                                                     strategy_rank(table.at[i, "strategy"])))
    return table.iloc[order].reset_index(drop=True)


def consistency(runs: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Per (model, layout) of a strategy that must match another (Strategy.must_match, e.g. zero0 -> ddp): the
    reference and the largest final-loss difference over the repeats both ran to `ok`, and whether it is within
    the tolerance (inclusive)."""
    from workflow_scripts.training.strategies import STRATEGIES

    ok = runs[runs["status"] == C.OK].set_index(["model", "layout", "strategy", "repeat"])["final_loss"]
    out = []
    for name in sorted(set(runs["strategy"])):
        reference = getattr(STRATEGIES.get(name), "must_match", None)
        for (model, layout), _ in runs[runs["strategy"] == name].groupby(["model", "layout"]):
            pairs = [(ok[k], ok[(model, layout, reference, k[3])]) for k in ok.index
                     if k[:3] == (model, layout, name) and (model, layout, reference, k[3]) in ok.index]
            diff = max((abs(a - b) for a, b in pairs), default=math.nan) if reference else math.nan
            if reference:
                out.append({"model": model, "layout": layout, "strategy": name, "consistency_reference": reference,
                            "consistency_loss_diff": diff, "consistency_ok": within(diff, tolerance)
                            if pairs else None, "consistency_tolerance": tolerance})
    return pd.DataFrame(out, columns=KEYS + CONSISTENCY)


CONSISTENCY = ["consistency_reference", "consistency_loss_diff", "consistency_ok", "consistency_tolerance"]


def consistency_lines(summary: pd.DataFrame) -> list[str]:
    """A footnote per consistency check: agrees, or a warning with the difference."""
    lines = []
    for _, row in summary[summary["consistency_reference"].notna()].iterrows():
        where = f"{row['model']}, {layout_word(row['layout'], row['world_size'], row['platform'])}"
        if row["consistency_ok"] is None or pd.isna(row["consistency_ok"]):
            lines.append(f"Consistency check {row['strategy']} = {row['consistency_reference']} ({where}): not "
                         "checked (no repeat where both ran to ok).")
            continue
        diff, tol = row["consistency_loss_diff"], row["consistency_tolerance"]
        lines.append(f"Consistency check {row['strategy']} = {row['consistency_reference']} ({where}): final loss "
                     f"differs by {diff:.2g} " + (f"(within {tol:g})." if row["consistency_ok"] else
                                                  f"-- WARNING: beyond the tolerance {tol:g}: the two engines do "
                                                  "not compute the same training here."))
    return lines


# ---------------------------------------------------------------- formatting
EXTRA_DECIMALS = 0  # config `tables.extra_decimals`: added to every decimal count chosen from a value's size


def fmt_number(x: float, decimals: int | None = None) -> str:
    if x is None or pd.isna(x):
        return "–"
    if decimals is None:
        size = abs(x)
        decimals = (0 if size >= 100 else 1 if size >= 10 else 2 if size >= 1 else 3) + EXTRA_DECIMALS
    return f"{x:,.{decimals}f}"


def fmt_mean_ci(mean: float, half: float, decimals: int | None = None, pm: str = " ± ") -> str:
    """'12.3 ± 0.4' (decimals chosen from the mean's magnitude), or just '12.3' with no interval."""
    if pd.isna(mean):
        return "–"
    if decimals is None:
        size = abs(mean)
        decimals = (0 if size >= 100 else 1 if size >= 10 else 2 if size >= 1 else 3) + EXTRA_DECIMALS
    text = fmt_number(mean, decimals)
    return text if pd.isna(half) else f"{text}{pm}{fmt_number(half, decimals)}"


def fmt_params(n: float) -> str:
    if pd.isna(n):
        return "–"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.{2 if n / div < 10 else 1}f}{unit}"
    return f"{int(n)}"


def fmt_int(x) -> str:
    """Counts as integers; fractions (e.g. a short run's epochs) to three significant digits."""
    return "–" if pd.isna(x) else f"{int(x):,}" if float(x).is_integer() else f"{x:.3g}"


# ---------------------------------------------------------------- the summary table
COLUMNS = ["Strategy", "Model", "Parameters", "GPUs", "Batch", "Epochs", "Samples", "Time/epoch (s)",
           "Step: fwd / bwd / opt (ms)", "Peak memory", "Final loss", "Tokens/s (images: img/s)", "MFU (%)", "Repeats",
           "Status", "Provenance"]


def phase_cell(row) -> str:
    """Median forward / backward / optimizer time of a step (mean over repeats), as timed in the step loop."""
    values = [row[f"{phase}_median_s"] for phase in ("forward", "backward", "optimizer")]
    return "–" if any(pd.isna(v) for v in values) else " / ".join(fmt_number(1000 * v) for v in values)


def is_image_model(name: str) -> bool:
    """An image classifier (its throughput is images/s: its "tokens" are stored pixel values)."""
    from workflow_scripts.training.models import MODELS

    return name in MODELS and MODELS[name].vision


def throughput_cell(row, pm: str) -> str:
    if is_image_model(row["model"]):
        return fmt_mean_ci(row["samples_per_s"], row["samples_per_s_ci95"], decimals=1, pm=pm) + " img/s"
    return fmt_mean_ci(row["tokens_per_s"], row["tokens_per_s_ci95"], decimals=0, pm=pm)


def metric_cells(row, unit: tuple[str, float], pm: str, mark) -> list[str]:
    """Time/epoch, the step's phases, peak memory, final loss, tokens/s, MFU: mean ± CI, or the status word."""
    if row["status"] != C.OK:
        return [C.STATUS_CELL.get(row["status"], row["status"])] * 6
    memory = fmt_mean_ci(row["peak_memory_bytes"] / unit[1], row["peak_memory_bytes_ci95"] / unit[1], pm=pm)
    sources = [s for s in str(row["peak_memory_source"]).split(";") if s]
    memory += "".join(mark(MEMORY_SOURCES[s][0]) for s in sources) if memory != "–" else ""
    return [fmt_mean_ci(row["time_per_epoch_s"], row["time_per_epoch_s_ci95"], pm=pm), phase_cell(row), memory,
            fmt_mean_ci(row["final_loss"], row["final_loss_ci95"], decimals=3, pm=pm),
            throughput_cell(row, pm),
            fmt_mean_ci(100 * row["mfu"], 100 * row["mfu_ci95"], pm=pm)]


def row_cells(row, unit, pm: str, mark) -> list[str]:
    status = row["status"] + (f" ({row['status_detail']})" if row["status_detail"] else "")
    strategy = row["strategy"] + ("" if data_parallel(row) else f" ({row['layout']})")
    return [strategy, row["model"], fmt_params(row["n_params"]), fmt_int(row["world_size"]),
            fmt_int(row["effective_batch"]), fmt_int(row["epochs"]), fmt_int(row["train_samples"]),
            *metric_cells(row, unit, pm, mark), f"{row['n_ok']}/{row['n_runs']}", status]


def provenance_links(row, link_base: Path, out_dir: Path) -> list[tuple[str, str]]:
    """(label, path relative to out_dir) per repeat's provenance file."""
    paths = [p for p in str(row["provenance"]).split(";") if p]
    repeats = str(row["repeats"]).split(";")
    labels = [f"r{r}" for r in repeats] if len(paths) == len(repeats) else [f"#{i}" for i in range(len(paths))]
    if len(paths) == 1:
        labels = ["provenance"]
    return [(label, os.path.relpath(link_base / p, out_dir) if not os.path.isabs(p) else p)
            for label, p in zip(labels, paths)]


def footnotes(summary: pd.DataFrame) -> list[str]:
    """Lines under the table: which peak memory, what ± means, failure reasons, strategies left out of figures."""
    used = [s for s in MEMORY_SOURCES if summary["peak_memory_source"].astype(str).str.contains(s).any()]
    lines = ["Peak memory: " + ("; ".join(f"({MEMORY_SOURCES[s][0]}) {MEMORY_SOURCES[s][1]}" for s in used)
                                 if used else "no successful run reported one") + "."]
    lines.append("Values are means over successful repeats; ± is the 95% confidence half-width "
                 "(Student t, n−1 degrees of freedom), shown only where repeats > 1. Batch = effective batch "
                 "(micro-batch × accumulation × world size); MFU is not defined on CPU (–).")
    for _, row in summary[summary["reason"].astype(bool)].iterrows():
        where = layout_word(row["layout"], row["world_size"], row["platform"])
        lines.append(f"{row['strategy']} ({row['model']}, {where}), "
                     f"{row['status_detail'] or row['status']}: {row['reason']}")
    sources = summary.loc[summary["strategy_source"].fillna("").astype(bool), ["strategy", "strategy_source"]]
    for strategy, source in dict(sources.drop_duplicates("strategy").values).items():
        lines.append(f"{strategy}: the study's strategy from {source} (its ZeRO settings, the study's batch, "
                     "optimizer and precision).")
    hidden = order_strategies(summary.loc[~summary["in_figures"].astype(bool), "strategy"])
    if hidden:
        lines.append(f"Left out of the figures (in the table only): {', '.join(hidden)}.")
    return lines + consistency_lines(summary)


def gpu_header(summary: pd.DataFrame) -> str:
    platforms = set(summary["platform"].astype(str).str.lower())
    return "Ranks" if platforms == {"cpu"} else "GPUs/ranks" if "cpu" in platforms else "GPUs"


def md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def write_markdown(summary: pd.DataFrame, path: Path, link_base: Path) -> None:
    unit = memory_unit(summary["peak_memory_bytes"].max() if len(summary) else math.nan)
    header = [gpu_header(summary) if c == "GPUs" else f"Peak memory ({unit[0]})" if c == "Peak memory" else c
              for c in COLUMNS]
    lines = ["# Summary", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in summary.iterrows():
        cells = [md_escape(c) for c in row_cells(row, unit, " ± ", lambda m: f" ({m})")]
        cells[0], cells[1] = f"`{row['strategy']}`" + cells[0][len(row["strategy"]):], f"`{row['model']}`"
        links = " ".join(f"[{label}]({target})" for label, target in provenance_links(row, link_base, path.parent))
        lines.append("| " + " | ".join(cells + [links or "–"]) + " |")
    if summary.empty:
        lines.append("| " + " | ".join(["no runs"] + [""] * (len(header) - 1)) + " |")
    lines += [""] + [f"{md_escape(line)}  " for line in footnotes(summary)]
    path.write_text("\n".join(lines) + "\n")


TEX_CHARS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
             "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}", "±": r"$\pm$", "–": "--",
             "×": r"$\times$", "−": "-", "≥": r"$\geq$"}


def tex_escape(text: str) -> str:
    return "".join(TEX_CHARS.get(ch, ch) for ch in str(text))


def write_latex(summary: pd.DataFrame, path: Path, link_base: Path) -> None:
    unit = memory_unit(summary["peak_memory_bytes"].max() if len(summary) else math.nan)
    header = [gpu_header(summary) if c == "GPUs" else f"Peak memory ({unit[0]})" if c == "Peak memory" else c
              for c in COLUMNS]
    lines = [r"% Generated by workflow_scripts.report.tables; needs \usepackage{booktabs,graphicx,hyperref}.",
             r"\begin{table}[t]", r"\centering", r"\resizebox{\textwidth}{!}{%",
             r"\begin{tabular}{ll" + "r" * (len(header) - 5) + "lll}", r"\toprule",
             " & ".join(tex_escape(h) for h in header) + r" \\", r"\midrule"]
    for _, row in summary.iterrows():
        cells = [tex_escape(c) for c in row_cells(row, unit, " ± ", lambda m: f"\x01{m}\x02")]
        cells = [c.replace("\x01", r"\textsuperscript{").replace("\x02", "}") for c in cells]
        links = " ".join(rf"\href{{{target}}}{{{tex_escape(label)}}}"
                         for label, target in provenance_links(row, link_base, path.parent))
        lines.append(" & ".join(cells + [links or "--"]) + r" \\")
    if summary.empty:
        lines.append(r"\multicolumn{" + str(len(header)) + r"}{c}{no runs} \\")
    lines += [r"\bottomrule", r"\end{tabular}}", r"\par\smallskip\footnotesize"]
    lines += [tex_escape(line) + r"\par" for line in footnotes(summary)]
    lines += [r"\caption{Distributed-training strategies compared: time, throughput, MFU, peak memory and loss.}",
              r"\label{tab:summary}", r"\end{table}"]
    path.write_text("\n".join(lines) + "\n")


def write_csv(summary: pd.DataFrame, path: Path) -> None:
    summary.to_csv(path, index=False)


# ---------------------------------------------------------------- comparisons
COMPARED = [("tokens_per_s", "Throughput (tokens/s)"), ("peak_memory_bytes", "Peak memory")]


def pair_rows(ok: pd.DataFrame, metric: str, scale: float) -> tuple[list[str], list[str], list[str]]:
    """Markdown rows of the not-distinguishable pairs, names of the distinguishable ones, and untestable ones."""
    same, different, untestable = [], [], []
    values = {s: list(ok.loc[ok["strategy"] == s, metric] / scale) for s in order_strategies(ok["strategy"])}
    for a, b in combinations(values, 2):
        c = compare(values[a], values[b], ALPHA)
        if c.distinguishable is None:
            untestable.append(f"{a}–{b}")
        elif c.distinguishable:
            different.append(f"{a}–{b}")
        else:
            overlap = {True: "yes", False: "no", None: "–"}[c.ci_overlap]
            same.append(f"| `{a}` | `{b}` | {fmt_mean_ci(c.a.mean, c.a.half_width)} | "
                        f"{fmt_mean_ci(c.b.mean, c.b.half_width)} | {c.p:.3f} | {overlap} |")
    return same, different, untestable


def metric_section(ok: pd.DataFrame, metric: str, title: str) -> list[str]:
    unit = ("", 1.0)
    if metric == "peak_memory_bytes":
        unit = memory_unit(ok[metric].max() if len(ok) else math.nan)
        sources = [MEMORY_SOURCES[s][1] for s in dict.fromkeys(ok["peak_memory_source"]) if s in MEMORY_SOURCES]
        title = f"{title} ({unit[0]}; {'; '.join(sources) or 'none'})"
    same, different, untestable = pair_rows(ok, metric, unit[1])
    lines = [f"### {title}", ""]
    if same:
        lines += ["Not distinguishable (Welch p ≥ 0.05):", "",
                  "| A | B | mean A ± 95% CI | mean B ± 95% CI | Welch p | 95% CIs overlap |",
                  "|---|---|---|---|---|---|", *same, ""]
    else:
        lines += ["Not distinguishable: none.", ""]
    lines += [f"Distinguishable (p < 0.05): {', '.join(different) if different else 'none'}.", ""]
    if untestable:
        lines += [f"Cannot be tested (fewer than two successful repeats on a side): {', '.join(untestable)}.", ""]
    return lines


def group_section(runs: pd.DataFrame, summary: pd.DataFrame, model: str, layout: str) -> list[str]:
    rows = summary[(summary["model"] == model) & (summary["layout"] == layout)]
    platform = str(rows["platform"].iloc[0]) if len(rows) else ""
    counts = ", ".join(f"`{r['strategy']}` {r['n_ok']}/{r['n_runs']}" + ("" if r["status"] == C.OK else
                       f" ({r['status']})") for _, r in rows.iterrows())
    where = layout_word(layout, int(rows["world_size"].iloc[0]), platform) if len(rows) else layout
    lines = [f"## {model}, {where}", "", f"Successful / total repeats: {counts}.", ""]
    ok = runs[(runs["model"] == model) & (runs["layout"] == layout) & (runs["status"] == C.OK)]
    for metric, title in COMPARED:
        lines += metric_section(ok, metric, title)
    return lines


def write_comparisons(runs: pd.DataFrame, summary: pd.DataFrame, path: Path) -> None:
    lines = ["# Which strategies cannot be told apart", "",
             "Two strategies are distinguishable in a metric when Welch's two-sided t-test over their successful "
             f"repeats gives p < {ALPHA}. Pairs with p ≥ {ALPHA} are listed as not distinguishable; the CI column "
             "says whether their 95% Student-t intervals overlap. A pair needs two or more successful repeats on "
             "each side to be tested; runs that ended OOM, unsupported or failed are listed in the repeat counts.",
             ""]
    groups = summary[["model", "layout"]].drop_duplicates().itertuples(index=False)
    for model, layout in groups:
        lines += group_section(runs, summary, model, layout)
    if summary.empty:
        lines.append("No runs.")
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- CLI
def write_all(runs_csv, out_dir, link_base=None, loss_tolerance: float | None = None) -> pd.DataFrame:
    """`loss_tolerance`: of the consistency checks (config verify.tolerances.loss_abs, its default if None)."""
    from workflow_scripts import schema

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    link_base = Path(link_base) if link_base else Path(runs_csv).parent
    runs = read_runs(runs_csv)
    tolerance = schema.default("verify", "tolerances")["loss_abs"] if loss_tolerance is None else loss_tolerance
    summary = summary_rows(runs).merge(consistency(runs, tolerance), on=KEYS, how="left")
    write_csv(summary, out_dir / "summary.csv")
    write_markdown(summary, out_dir / "summary.md", link_base)
    write_latex(summary, out_dir / "summary.tex", link_base)
    write_comparisons(runs, summary, out_dir / "comparisons.md")
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True, help="runs.csv from the parse stage")
    ap.add_argument("--out-dir", required=True, help="where summary.{md,tex,csv} and comparisons.md go")
    ap.add_argument("--link-base", default=None,
                    help="directory the `provenance` paths in runs.csv are relative to (default: runs.csv's folder); "
                         "links in summary.md/.tex are rewritten relative to --out-dir")
    ap.add_argument("--style", default="{}", help="the config's `tables` section as JSON (extra_decimals)")
    ap.add_argument("--loss-tolerance", type=float, default=None,
                    help="of the consistency checks (zero0 = ddp): config verify.tolerances.loss_abs")
    args = ap.parse_args(argv)
    global EXTRA_DECIMALS
    EXTRA_DECIMALS = int(json.loads(args.style).get("extra_decimals", 0))
    summary = write_all(args.runs, args.out_dir, args.link_base, args.loss_tolerance)
    print(f"summary: {len(summary)} rows -> {args.out_dir}")


if __name__ == "__main__":
    main()
