"""The study's figures, from the parse stage's tables:

    python -m workflow_scripts.report.figures --runs runs.csv --steps steps.csv --vram vram.csv \\
        --style '{"context": "paper", "dpi": 150}' --out-dir results/<study>/figures

Each figure is written as <name>.png and <name>.pdf. Panels are one per (model, world size) unless said otherwise.
- loss_curves           training loss vs optimizer step, one line per strategy: mean over repeats with a 95%
                        Student-t band where repeats > 1.
- peak_memory           per strategy, grouped bars of the three memories: torch max_memory_allocated, torch
                        max_memory_reserved and the device-wide peak from the NVML/amdsmi sampler (on CPU: peak host
                        RSS summed over ranks and the sampler's host peak); a black tick marks the predicted
                        model-state memory (ZeRO paper formula, activations excluded).
- throughput            tokens/s per strategy, bars with 95% CI error bars.
- time_per_epoch        seconds per epoch per strategy, bars with 95% CI error bars.
- mfu                   model FLOPs utilisation (%) per strategy (GPU studies).
- memory_timeline       the sampler's used memory vs time since the sampler started, one panel per
                        (model, world size, strategy), one line per device, first repeat only; dotted vertical lines
                        every N optimizer steps (from the samples' `step` column).
- memory_vs_throughput  which strategy to pick: peak memory (x) against tokens/s (y), one labelled point per strategy.
- scaling               tokens/s vs world size per strategy, one panel per model run at more than one data-parallel
                        world size, with the ideal linear line from each strategy's smallest world size.
- accuracy              image classifiers: top-1 validation accuracy before and after training per strategy, and
                        for a model trained both fully and with LoRA the peak memory and trainable parameters of
                        each.
- predicted_speed       measured tokens/s per strategy (bars, 95% CI) with the step-time model's prediction made
                        before the run (a black tick) and each strategy's error in the panel's corner.
- layouts               per model run in more than one layout at one world size: MFU per layout (on CPU tokens/s
                        per rank), and each rank's peak torch-allocated memory per layout (on CPU peak host RSS):
                        pipeline stages hold different memory.

Runs that ended `oom`, `unsupported` or `failed` are drawn as marked entries (a hatched empty bar with OOM / n/a /
failed, a cross on the scaling axis, a note on line plots), never silently dropped. Strategies whose runs have
`in_figures` false (zero0, identical to ddp) are left out unless the style says `include_hidden: true`.

Style keys (JSON, all optional): config `figures` (schemas/config.schema.yaml, its defaults there; report/style.py).
Which figures exist, which studies have data for each, and their captions: report/figure_registry.py; `--names`
draws those the rule asks for (default: every study figure).
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from workflow_scripts import columns as C  # noqa: E402
from workflow_scripts.columns import STEP_COLUMNS, VRAM_COLUMNS  # noqa: E402
from workflow_scripts.report import figure_registry  # noqa: E402
from workflow_scripts.report.stats import t_quantile  # noqa: E402
from workflow_scripts.report.style import (  # noqa: E402
    NO_VALUE,
    apply_style,
    corner_note,
    empty_note,
    grid,
    mark_missing,
    parse_style,
    save,
    status_mark,
    strategy_colours,
    strategy_ticks,
    titled,
)
from workflow_scripts.report.tables import (  # noqa: E402
    is_image_model,
    layout_word,
    memory_unit,
    model_order,
    order_strategies,
    read_runs,
    read_table,
    strategy_rank,
    summary_rows,
    with_layout,
)

__all__ = ["parse_style", "apply_style", "save"]  # the style module's, re-exported for the CLI's callers
FIGURES = figure_registry.names("figures")  # the study figures (rule figures), in the registry's order
BACKEND_LABEL = {"nvml": "device-wide used (NVML)", "amdsmi": "device-wide used (amdsmi)",
                 "torch": "torch reserved", "host": "host RSS, training processes"}
BACKEND_PRIORITY = ["nvml", "amdsmi", "torch", "host"]


# ---------------------------------------------------------------- data
@dataclass
class Data:
    runs: pd.DataFrame  # visible runs (hidden strategies removed unless include_hidden)
    summary: pd.DataFrame  # one row per visible (model, strategy, layout)
    steps: pd.DataFrame
    vram: pd.DataFrame
    style: dict
    colors: dict  # strategy -> colour
    dashes: dict  # strategy -> line style (palettes shorter than the strategy list repeat with dashes)


def prepare(runs: pd.DataFrame, steps: pd.DataFrame, vram: pd.DataFrame, style: dict) -> Data:
    """Drop hidden strategies (unless include_hidden) from all three tables and fix the strategy colours."""
    hidden = set() if style["include_hidden"] else set(runs.loc[~runs["in_figures"].astype(bool), "strategy"])
    runs = runs[~runs["strategy"].isin(hidden)].reset_index(drop=True)
    steps = with_layout(steps[~steps["strategy"].astype(object).isin(hidden)])
    vram = with_layout(vram[~vram["strategy"].astype(object).isin(hidden)])
    with_data = order_strategies(list(runs.loc[runs["status"] == C.OK, "strategy"])
                                 + list(steps["strategy"].dropna().astype(str)))
    colours, dashes = strategy_colours(with_data, style["palette"])
    for name in set(runs["strategy"]) | set(vram["strategy"].dropna().astype(str)):
        colours.setdefault(name, (0.45, 0.45, 0.45))  # no successful run: only drawn as a marked entry
        dashes.setdefault(name, "-")
    return Data(runs, summary_rows(runs), steps, vram, style, colours, dashes)


def load(runs_csv, steps_csv, vram_csv, style: dict) -> Data:
    steps = read_table(steps_csv, STEP_COLUMNS, {"run_id", "model", "strategy", "layout", "warmup"})
    vram = read_table(vram_csv, VRAM_COLUMNS, {"run_id", "model", "strategy", "layout", "backend"})
    return prepare(read_runs(runs_csv), steps, vram, style)


# ---------------------------------------------------------------- layout helpers
def panel_keys(summary: pd.DataFrame) -> list[tuple[str, str]]:
    """(model, layout) pairs in model-size, world-size, layout order."""
    models = {m: i for i, m in enumerate(model_order(summary))} if len(summary) else {}
    triples = summary[["model", "world_size", "layout"]].drop_duplicates().itertuples(index=False, name=None)
    return [(m, k) for m, _, k in sorted(triples, key=lambda p: (models.get(p[0], 0), p[1], p[2]))]


def panel_title(summary: pd.DataFrame, model: str, layout: str) -> str:
    rows = summary[(summary["model"] == model) & (summary["layout"] == layout)]
    if not len(rows):
        return f"{model}, {layout}"
    return f"{model}, {layout_word(layout, int(rows['world_size'].iloc[0]), rows['platform'].iloc[0])}"


def panel_rows(summary: pd.DataFrame, model: str, layout: str) -> pd.DataFrame:
    return summary[(summary["model"] == model) & (summary["layout"] == layout)].reset_index(drop=True)


def per_panel(data: Data, draw, keys=None, legend: dict | None = None, note=None,
              legend_width: float = 0.0) -> plt.Figure:
    """The study figures' skeleton: one panel per (model, layout) (`keys`, default the summary's), filled by
    `draw(ax, rows, handles, key)`, titled by its panel (with `note(rows)` as a smaller second line); the handles the
    panels collect (label -> artist) become one figure legend placed by `legend` (matplotlib's keywords); a study
    without runs gets one axes saying so."""
    keys = panel_keys(data.summary) if keys is None else keys
    fig, axes = grid(len(keys), data.style, legend_width=legend_width)
    handles: dict = {}
    for ax, key in zip(axes, keys):
        rows = panel_rows(data.summary, *key)
        draw(ax, rows, handles, key)
        titled(ax, panel_title(data.summary, *key), note(rows) if note else "")
    if handles and legend is not None:
        fig.legend(list(handles.values()), list(handles), **legend)
    if not keys:
        empty_note(axes[0], "no runs")
    return fig


RIGHT = {"loc": "outside right center", "fontsize": "small"}  # where a figure's legend goes


def missing_note(rows: pd.DataFrame) -> str:
    """'not shown: zero3 (OOM), zero_infinity (n/a)' for the rows without a successful run."""
    bad = rows[rows["status"] != C.OK]
    return ("not shown: " + ", ".join(f"{r.strategy} ({status_mark(r.status)})"
                                      for r in bad.itertuples())) if len(bad) else ""


def memory_axis_label(sources, unit: str) -> str:
    names = {"sampler": "device-wide peak (sampler)", "reserved": "torch max reserved",
             "allocated": "torch max allocated", "host_rss": "peak host RSS"}
    which = ", ".join(names[s] for s in dict.fromkeys(sources) if s in names) or "peak memory"
    return f"peak memory ({unit}): {which}"


# ---------------------------------------------------------------- bars: throughput, time per epoch, MFU
def bar_panel(ax: plt.Axes, rows: pd.DataFrame, metric: str, scale: float, colours: dict) -> None:
    """One bar per strategy (mean, 95% CI error bar); OOM/unsupported/failed as hatched empty bars."""
    for x, row in enumerate(rows.itertuples()):
        value, half = getattr(row, metric) * scale, getattr(row, f"{metric}_ci95") * scale
        if row.status != C.OK:
            mark_missing(ax, x, status_mark(row.status))
        elif pd.isna(value):
            mark_missing(ax, x, NO_VALUE)
        else:
            ax.bar(x, value, 0.8, color=colours.get(row.strategy), yerr=None if pd.isna(half) else half,
                   capsize=3, error_kw={"elinewidth": 1})
    strategy_ticks(ax, list(rows["strategy"]))
    ax.set_ylim(bottom=0)


def bars_by_strategy(data: Data, metric: str, ylabel: str, scale: float = 1.0, note_cpu: str = "") -> plt.Figure:
    """One bar panel per (model, layout); `note_cpu` goes in the corner of panels whose runs are all on CPU."""
    def draw(ax, rows, handles, key):
        bar_panel(ax, rows, metric, scale, data.colors)
        ax.set_ylabel(ylabel)
        if note_cpu and len(rows) and (rows["platform"].str.lower() == "cpu").all():
            corner_note(ax, note_cpu)
    return per_panel(data, draw)


def throughput_figure(data: Data) -> plt.Figure:
    if len(data.summary) and data.summary["model"].map(is_image_model).all():
        return bars_by_strategy(data, "samples_per_s", "images/s (mean ± 95% CI)")
    return bars_by_strategy(data, "tokens_per_s", "tokens/s (mean ± 95% CI)")


# ---------------------------------------------------------------- measured against the step-time model
PREDICTED_SPEED_LABEL = "predicted tokens/s (step-time model, workflow_scripts/plan/step_time.py)"


def speed_panel(ax: plt.Axes, rows: pd.DataFrame, colours: dict, handles: dict) -> None:
    """Measured tokens/s per strategy (bars, 95% CI) and the step-time model's prediction (a black tick); the
    corner gives each strategy's error, prediction / measurement - 1."""
    bar_panel(ax, rows, "tokens_per_s", 1.0, colours)
    errors, top = [], ax.get_ylim()[1]
    for x, row in enumerate(rows.itertuples()):
        if row.status == C.OK and pd.notna(row.predicted_tokens_per_s):
            handles.setdefault(PREDICTED_SPEED_LABEL, ax.hlines(row.predicted_tokens_per_s, x - 0.45, x + 0.45,
                                                                colors="black", linewidth=2.2))
            errors.append(f"{row.strategy} {100 * (row.predicted_tokens_per_s / row.tokens_per_s - 1):+.0f} %")
            top = max(top, 1.08 * row.predicted_tokens_per_s)
    ax.set_ylim(0, top)  # the bars fixed the axis (bar_panel): a tick above every bar stays in view
    corner_note(ax, "\n".join(errors))
    ax.set_ylabel("tokens/s: measured (bar), predicted (tick)")


def predicted_no_value(rows: pd.DataFrame) -> str:
    ok = rows[rows["status"] == C.OK]
    missing = ok.loc[ok["predicted_tokens_per_s"].isna(), "strategy"]
    return "no prediction: " + ", ".join(missing) if len(missing) else ""


def predicted_speed_figure(data: Data) -> plt.Figure:
    """Measured tokens/s against the step-time model's prediction made before the run (see the module docstring)."""
    return per_panel(data, lambda ax, rows, handles, key: speed_panel(ax, rows, data.colors, handles),
                     legend={"loc": "outside lower center", "fontsize": "small"}, note=predicted_no_value)


# ---------------------------------------------------------------- image classifiers: accuracy, LoRA vs full
def accuracy_panel(ax: plt.Axes, rows: pd.DataFrame, colours: dict) -> None:
    """Validation top-1 accuracy before (hatched) and after training, per strategy."""
    for x, row in enumerate(rows.itertuples()):
        if row.status != C.OK:
            mark_missing(ax, x, status_mark(row.status))
            continue
        colour = colours.get(row.strategy)
        ax.bar(x - 0.2, 100 * row.val_accuracy_initial, 0.4, color="white", edgecolor=colour, hatch="///")
        ax.bar(x + 0.2, 100 * row.val_accuracy_final, 0.4, color=colour,
               yerr=None if pd.isna(row.val_accuracy_final_ci95) else 100 * row.val_accuracy_final_ci95, capsize=3)
    strategy_ticks(ax, list(rows["strategy"]))
    ax.set_ylim(0, 100)
    ax.set_ylabel("top-1 validation accuracy (%): before / after")


def lora_panel(ax: plt.Axes, summary: pd.DataFrame, full: str) -> None:
    """The same model fine-tuned fully and with LoRA (same strategy and GPUs): peak memory, trainable parameters."""
    rows = summary[summary["model"].isin([full, f"{full}-lora"]) & (summary["status"] == C.OK)]
    rows = rows.sort_values("model")
    unit, div = memory_unit(float(rows["peak_allocated_bytes"].max()))
    ax.bar(range(len(rows)), rows["peak_allocated_bytes"] / div, 0.6, color=["C0", "C1"][:len(rows)])
    for x, row in enumerate(rows.itertuples()):
        ax.text(x, row.peak_allocated_bytes / div, f"{row.trainable_params / 1e6:.2f}M trainable", ha="center",
                va="bottom", fontsize="x-small")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(["LoRA" if m.endswith("-lora") else "full" for m in rows["model"]])
    ax.set_ylabel(f"torch peak allocated ({unit})")
    ax.set_title(f"{full}: LoRA vs full fine-tuning", fontsize="medium")


def accuracy_figure(data: Data) -> plt.Figure:
    keys = [k for k in panel_keys(data.summary) if is_image_model(k[0])]
    models = set(data.summary.loc[data.summary["status"] == C.OK, "model"])
    pairs = sorted(m for m in models if f"{m}-lora" in models)
    fig, axes = grid(len(keys) + len(pairs), data.style)
    for ax, (model, layout) in zip(axes, keys):
        accuracy_panel(ax, panel_rows(data.summary, model, layout), data.colors)
        ax.set_title(panel_title(data.summary, model, layout))
    for ax, full in zip(axes[len(keys):], pairs):
        lora_panel(ax, data.summary, full)
    if not keys:
        empty_note(axes[0], "no image-classification runs (accuracy is drawn for image classifiers)")
    return fig


def time_per_epoch_figure(data: Data) -> plt.Figure:
    return bars_by_strategy(data, "time_per_epoch_s", "time per epoch (s, mean ± 95% CI)")


def mfu_figure(data: Data) -> plt.Figure:
    """MFU bars (drawn for GPU studies: figure_registry); a device without a datasheet peak has no MFU (–)."""
    return bars_by_strategy(data, "mfu", "MFU (%, mean ± 95% CI)", scale=100.0, note_cpu="MFU not defined on CPU")


# ---------------------------------------------------------------- the step's phases
PHASES = [("forward_median_s", "forward"), ("backward_median_s", "backward"),
          ("optimizer_median_s", "optimizer step"), (None, "other (data, logging, gaps)")]


def phases_panel(ax: plt.Axes, rows: pd.DataFrame, colours: list, handles: dict) -> None:
    """Per strategy one stacked bar: the median forward, backward and optimizer times of a step and the rest of the
    median step; the error bar is the median step's 95% CI over repeats."""
    for x, row in enumerate(rows.itertuples()):
        parts = [getattr(row, col) if col else None for col, _ in PHASES[:-1]]
        step = row.step_time_median_s
        if row.status != C.OK:
            mark_missing(ax, x, status_mark(row.status))
            continue
        if pd.isna(step) or any(pd.isna(p) for p in parts):
            mark_missing(ax, x, NO_VALUE)
            continue
        parts.append(max(step - sum(parts), 0.0))
        bottom = 0.0
        for (_, label), value, colour in zip(PHASES, parts, colours):
            handles[label] = ax.bar(x, 1000 * value, 0.8, bottom=bottom, color=colour)
            bottom += 1000 * value
        half = row.step_time_median_s_ci95
        if not pd.isna(half):
            ax.errorbar(x, 1000 * max(step, bottom / 1000), yerr=1000 * half, color="black", capsize=3, lw=1)
    strategy_ticks(ax, list(rows["strategy"]))
    ax.set_ylim(bottom=0)


def phases_figure(data: Data) -> plt.Figure:
    """Where a step's time goes, per strategy: forward, backward, optimizer (timed in the step loop: CUDA events on
    GPU, perf_counter on CPU) and the rest."""
    colours = sns.color_palette("muted", 4)

    def draw(ax, rows, handles, key):
        phases_panel(ax, rows, colours, handles)
        ax.set_ylabel("median step (ms)")
    return per_panel(data, draw, legend={**RIGHT, "frameon": False}, legend_width=2.2)


# ---------------------------------------------------------------- peak memory
GPU_MEMORIES = [("peak_allocated_bytes", "torch max_memory_allocated"),
                ("peak_reserved_bytes", "torch max_memory_reserved"),
                ("sampler_peak_device_bytes", "device-wide peak (NVML/amdsmi sampler)")]
CPU_MEMORIES = [("peak_host_rss_bytes", "peak host RSS (sum over ranks)"),
                ("sampler_peak_host_bytes", "sampler host peak (training process tree RSS)")]
PREDICTED_LABEL = "predicted model states (ZeRO formula)"
PREDICTED_PEAK_LABEL = "predicted whole peak, torch allocated (analytic memory model)"
PREDICTED_DEVICE_LABEL = "predicted device-wide peak (+ allocator slack, context, NCCL)"


def memory_panel(ax: plt.Axes, rows: pd.DataFrame, colours: list, handles: dict) -> None:
    """Grouped bars of the memories per strategy and a black tick at the predicted model-state memory."""
    on_cpu = len(rows) > 0 and (rows["platform"].str.lower() == "cpu").all()
    series = CPU_MEMORIES if on_cpu else GPU_MEMORIES
    values = [rows[c] for c, _ in series] + [rows[c] for c in ("predicted_model_state_bytes", "predicted_peak_bytes",
                                                                 "predicted_device_peak_bytes")]
    unit, div = memory_unit(float(np.nanmax(pd.concat(values).to_numpy(float), initial=0.0)) or math.nan)
    width = 0.8 / len(series)
    for x, row in enumerate(rows.itertuples()):
        if row.status != C.OK:
            mark_missing(ax, x, status_mark(row.status))
            continue
        for i, (col, label) in enumerate(series):
            value, half = getattr(row, col) / div, getattr(row, f"{col}_ci95") / div
            if pd.notna(value):
                bar = ax.bar(x - 0.4 + (i + 0.5) * width, value, width, color=colours[i],
                             yerr=None if pd.isna(half) else half, capsize=2)
                handles.setdefault(label, bar.patches[0])
        if pd.notna(row.predicted_model_state_bytes):
            y = row.predicted_model_state_bytes / div
            handles.setdefault(PREDICTED_LABEL, ax.hlines(y, x - 0.45, x + 0.45, colors="black", linewidth=2.2))
        if pd.notna(row.predicted_peak_bytes):
            y = row.predicted_peak_bytes / div
            handles.setdefault(PREDICTED_PEAK_LABEL, ax.hlines(y, x - 0.45, x + 0.45, colors="black",
                                                               linewidth=1.4, linestyles="dashed"))
        if pd.notna(row.predicted_device_peak_bytes):
            y = row.predicted_device_peak_bytes / div
            handles.setdefault(PREDICTED_DEVICE_LABEL, ax.hlines(y, x - 0.45, x + 0.45, colors="dimgray",
                                                                 linewidth=1.4, linestyles="dotted"))
    strategy_ticks(ax, list(rows["strategy"]))
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"peak host memory ({unit})" if on_cpu else f"peak memory per GPU ({unit})")


def peak_memory_figure(data: Data) -> plt.Figure:
    colours = sns.color_palette(data.style["palette"])
    below = {"loc": "outside lower center", "ncols": 1 if len(panel_keys(data.summary)) == 1 else 2,
             "fontsize": "small"}
    return per_panel(data, lambda ax, rows, handles, key: memory_panel(ax, rows, colours, handles), legend=below)


# ---------------------------------------------------------------- loss curves
def mean_band(frame: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Per x: mean of y over repeats and the 95% Student-t half-width (NaN where one repeat)."""
    g = frame.groupby(x)[y].agg(["mean", "std", "count"]).reset_index()
    t = g["count"].map(lambda n: t_quantile(0.975, n - 1) if n > 1 else math.nan)
    g["half"] = t * g["std"] / np.sqrt(g["count"])
    return g


def loss_panel(ax: plt.Axes, steps: pd.DataFrame, data: Data, handles: dict) -> None:
    for strategy in order_strategies(steps["strategy"].dropna().astype(str)):
        band = mean_band(steps[steps["strategy"] == strategy].dropna(subset=["loss"]), "step", "loss")
        if band.empty:
            continue
        colour = data.colors.get(strategy)
        (line,) = ax.plot(band["step"], band["mean"], color=colour, linestyle=data.dashes.get(strategy, "-"),
                          linewidth=1.2)
        ax.fill_between(band["step"], band["mean"] - band["half"], band["mean"] + band["half"], color=colour,
                        alpha=0.2, linewidth=0)
        handles.setdefault(strategy, line)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (mean, 95% CI band)")


def loss_curves_figure(data: Data) -> plt.Figure:
    in_steps = data.steps.dropna(subset=["model"])
    keys = set(panel_keys(data.summary)) | set(zip(in_steps["model"].astype(str), in_steps["layout"]))

    def draw(ax, rows, handles, key):
        steps = data.steps[(data.steps["model"] == key[0]) & (data.steps["layout"] == key[1])]
        loss_panel(ax, steps, data, handles)
        if steps.empty:
            ax.text(0.5, 0.5, "no step data", transform=ax.transAxes, ha="center", color="0.35")
    return per_panel(data, draw, keys=sorted(keys, key=lambda k: panel_rank(data, k)), legend=RIGHT,
                     note=missing_note, legend_width=1.5)


# ---------------------------------------------------------------- memory timeline
def nice_every(max_step: float, markers: int = 8) -> int:
    """1, 2, 5 x 10^k steps between markers, about `markers` of them."""
    raw = max(max_step / markers, 1.0)
    base = 10 ** math.floor(math.log10(raw))
    return int(next(m * base for m in (1, 2, 5, 10) if m * base >= raw))


def step_markers(ax: plt.Axes, samples: pd.DataFrame, every: int) -> None:
    """A dotted vertical line where the sampled step first reaches each multiple of `every`."""
    steps = samples.dropna(subset=["step"]).sort_values("t_s")
    reached = (steps["step"] // every).cummax()
    firsts = steps.loc[reached.ne(reached.shift()) & (reached > 0), "t_s"]
    for t in firsts:
        ax.axvline(t, color="0.5", linestyle=":", linewidth=0.7)


def pick_samples(samples: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The first repeat's samples of the most direct backend (NVML/amdsmi, then torch, then host)."""
    if samples.empty:
        return samples, ""
    samples = samples[samples["repeat"] == samples["repeat"].min()]
    backends = list(samples["backend"].dropna().astype(str))
    backend = next((b for b in BACKEND_PRIORITY if b in backends), backends[0] if backends else "")
    return samples[samples["backend"].astype(str) == backend], backend


def timeline_panel(ax: plt.Axes, samples: pd.DataFrame, div: float, unit: str, every: int | None) -> None:
    samples, backend = pick_samples(samples)
    devices = sorted(samples["device"].dropna().unique())
    palette = sns.color_palette("dark", max(len(devices), 1))
    for i, device in enumerate(devices):
        s = samples[samples["device"] == device].sort_values("t_s")
        label = "host" if device < 0 else f"device {int(device)}"
        ax.plot(s["t_s"], s["used_bytes"] / div, color=palette[i], linewidth=1.0, label=label)
    if len(devices) > 1:
        ax.legend(fontsize="x-small", loc="lower right")
    marker_every = every or nice_every(float(samples["step"].max()) if samples["step"].notna().any() else 1)
    step_markers(ax, samples, marker_every)
    has_steps = samples["step"].notna().any()
    ax.set_xlabel("time since sampler start (s)" + (f"; dotted: every {marker_every} steps" if has_steps else ""),
                  fontsize="small")
    ax.set_ylabel(f"{BACKEND_LABEL.get(backend, backend or 'used memory')} ({unit})", fontsize="small")
    ax.set_ylim(bottom=0)


def timeline_keys(data: Data) -> list[tuple[str, int, str]]:
    """(model, layout, strategy) for every visible run group and every group with samples."""
    keys = {(r.model, r.layout, r.strategy) for r in data.summary.itertuples()}
    v = data.vram.dropna(subset=["model", "strategy"])
    keys |= {(str(m), k, str(s)) for m, k, s in v[["model", "layout", "strategy"]].itertuples(
        index=False, name=None)}
    return sorted(keys, key=lambda k: (panel_rank(data, k[:2]), strategy_rank(k[2])))


def panel_rank(data: Data, key: tuple[str, str]) -> tuple:
    """Position of a (model, layout) panel: the summary's panels first, others (steps/samples only) after."""
    panels = panel_keys(data.summary)
    return (panels.index(key), "", 0) if key in panels else (len(panels), key[0], key[1])


def memory_timeline_figure(data: Data) -> plt.Figure:
    keys = timeline_keys(data)
    fig, axes = grid(len(keys), data.style, ncols=4)
    unit, div = memory_unit(float(data.vram["used_bytes"].max()) if data.vram["used_bytes"].notna().any()
                            else math.nan)
    for ax, (model, layout, strategy) in zip(axes, keys):
        v = data.vram
        samples = v[(v["model"] == model) & (v["layout"] == layout) & (v["strategy"] == strategy)]
        row = data.summary[(data.summary["model"] == model) & (data.summary["layout"] == layout)
                           & (data.summary["strategy"] == strategy)]
        status = row["status"].iloc[0] if len(row) else C.OK
        ax.set_title(f"{strategy}{'' if status == C.OK else ' — ' + status_mark(status)}\n"
                     f"{panel_title(data.summary, model, layout)}", fontsize="small")
        if samples["used_bytes"].notna().any():
            timeline_panel(ax, samples, div, unit, data.style["step_marker_every"])
        else:
            empty_note(ax, "no memory samples" if status == C.OK else status_mark(status))
    if not keys:
        empty_note(axes[0], "no memory samples")
    return fig


# ---------------------------------------------------------------- memory vs throughput
def tradeoff_note(rows: pd.DataFrame) -> str:
    """What the scatter cannot place: failed runs and successful ones without both numbers."""
    ok = rows["status"] == C.OK
    no_value = rows[ok & (rows["peak_memory_bytes"].isna() | rows["tokens_per_s"].isna())]
    return "; ".join(filter(None, [missing_note(rows),
                                   "no value: " + ", ".join(no_value["strategy"]) if len(no_value) else ""]))


def tradeoff_panel(ax: plt.Axes, rows: pd.DataFrame, colours: dict) -> None:
    ok = rows[(rows["status"] == C.OK) & rows["peak_memory_bytes"].notna() & rows["tokens_per_s"].notna()]
    unit, div = memory_unit(float(ok["peak_memory_bytes"].max()) if len(ok) else math.nan)
    for i, row in enumerate(ok.sort_values("tokens_per_s").itertuples()):
        x, y = row.peak_memory_bytes / div, row.tokens_per_s
        xerr, yerr = row.peak_memory_bytes_ci95 / div, row.tokens_per_s_ci95
        ax.errorbar(x, y, xerr=None if pd.isna(xerr) else xerr, yerr=None if pd.isna(yerr) else yerr,
                    fmt="o", color=colours.get(row.strategy), markersize=6, capsize=2)
        # labels alternate above/below in throughput order, so neighbours rarely collide
        ax.annotate(row.strategy, (x, y), xytext=(5, 3 if i % 2 == 0 else -10), textcoords="offset points",
                    fontsize="small")
    sources = [s for v in ok["peak_memory_source"] for s in str(v).split(";") if s]
    ax.set_xlabel(memory_axis_label(sources, unit), fontsize="small")
    ax.set_ylabel("tokens/s")
    ax.margins(0.15)
    if ok.empty:
        empty_note(ax, "no successful runs")


def memory_vs_throughput_figure(data: Data) -> plt.Figure:
    fig = per_panel(data, lambda ax, rows, handles, key: tradeoff_panel(ax, rows, data.colors), note=tradeoff_note)
    fig.suptitle("Which strategy to pick: less memory (left), more tokens/s (up)")
    return fig


# ---------------------------------------------------------------- scaling
def failed_marker(ax: plt.Axes, trans, world_size: int, text: str, colour, stacked: dict) -> None:
    """A cross near the bottom of the axes at this world size, labelled; several stack upwards."""
    y = 0.04 + 0.07 * stacked.get(world_size, 0)
    stacked[world_size] = stacked.get(world_size, 0) + 1
    ax.plot(world_size, y, marker="x", color=colour, transform=trans, markersize=6, clip_on=False)
    ax.annotate(text, (world_size, y), xycoords=trans, xytext=(5, 0), textcoords="offset points",
                fontsize="x-small", va="center", color=colour)


def scaling_panel(ax: plt.Axes, rows: pd.DataFrame, data: Data) -> None:
    sizes = sorted(rows["world_size"].unique())
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    stacked: dict = {}
    for strategy in order_strategies(rows["strategy"]):
        s = rows[rows["strategy"] == strategy].sort_values("world_size")
        ok = s[(s["status"] == C.OK) & s["tokens_per_s"].notna()]
        colour = data.colors.get(strategy)
        if len(ok):
            ax.errorbar(ok["world_size"], ok["tokens_per_s"], yerr=ok["tokens_per_s_ci95"].fillna(0), marker="o",
                        color=colour, linestyle=data.dashes.get(strategy, "-"), capsize=2, label=strategy)
            w0, y0 = ok["world_size"].iloc[0], ok["tokens_per_s"].iloc[0]
            ideal = [w for w in sizes if w >= w0]
            ax.plot(ideal, [y0 * w / w0 for w in ideal], color=colour, linestyle=(0, (2, 2)), linewidth=0.8)
        for row in s[s["status"] != C.OK].itertuples():
            failed_marker(ax, trans, row.world_size, f"{strategy}: {status_mark(row.status)}",
                          colour, stacked)
    ax.set_xticks(sizes)
    ax.margins(x=0.3)
    ax.set_xlabel("world size (GPUs or CPU ranks)")
    ax.set_ylabel("tokens/s (mean ± 95% CI)")
    ax.set_ylim(0, None if (rows["status"] == C.OK).any() else 1)


def scaling_figure(data: Data) -> plt.Figure:
    """One panel per model run at more than one world size, over its data-parallel layouts (other layouts are not
    a line of one strategy)."""
    summary = data.summary
    data_parallel = summary[summary["layout"] == "ws" + summary["world_size"].astype(str)]
    models = [m for m in (model_order(summary) if len(summary) else [])
              if data_parallel.loc[data_parallel["model"] == m, "world_size"].nunique() > 1]
    fig, axes = grid(len(models), data.style, legend_width=2.0)
    for ax, model in zip(axes, models):
        scaling_panel(ax, data_parallel[data_parallel["model"] == model], data)
        ax.set_title(model)
    handles, labels = [], []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    if handles:
        handles.append(Line2D([], [], color="0.3", linestyle=(0, (2, 2))))
        labels.append("ideal linear (from smallest world size)")
        fig.legend(handles, labels, **RIGHT)
    if not models:
        empty_note(axes[0], "no model ran at more than one world size")
    return fig


# ---------------------------------------------------------------- parallel layouts
def rank_values(cell) -> list[float]:
    """A per-rank column of runs.csv (a JSON list, or a list already) as floats; [] when absent."""
    if isinstance(cell, str):
        cell = json.loads(cell)
    return [float(v) for v in cell] if isinstance(cell, (list, tuple)) else []


def rank_memory(runs: pd.DataFrame, column: str) -> list[float]:
    """Each rank's peak, the mean over the successful repeats ([] where no run recorded one: the per-rank columns
    are written by the runs that measure them, outside the contract's RUN_COLUMNS)."""
    if column not in runs:
        return []
    lists = [rank_values(c) for c in runs.loc[runs["status"] == C.OK, column]]
    lists = [v for v in lists if v]
    return list(np.mean(lists, axis=0)) if lists else []


def layouts_panels(axes, rows: pd.DataFrame, runs: pd.DataFrame, data: Data, on_cpu: bool) -> None:
    labels = [f"{r.layout}\n{r.strategy}" if rows["strategy"].nunique() > 1 else r.layout for r in rows.itertuples()]
    speed, memory = axes
    column = "peak_host_rss_bytes_per_rank" if on_cpu else "peak_allocated_bytes_per_rank"
    per_rank = [rank_memory(runs[(runs["layout"] == r.layout) & (runs["strategy"] == r.strategy)], column)
                for r in rows.itertuples()]
    unit, div = memory_unit(max((max(v) for v in per_rank if v), default=0.0))
    for x, (row, ranks) in enumerate(zip(rows.itertuples(), per_rank)):
        colour = data.colors.get(row.strategy)
        if row.status != C.OK:
            mark_missing(speed, x, status_mark(row.status))
            mark_missing(memory, x, status_mark(row.status))
            continue
        value, half = ((row.tokens_per_s / row.world_size, row.tokens_per_s_ci95 / row.world_size) if on_cpu
                       else (100 * row.mfu, 100 * row.mfu_ci95))
        speed.bar(x, value, 0.8, color=colour, yerr=None if pd.isna(half) else half, capsize=3)
        width = 0.8 / max(len(ranks), 1)
        for r, v in enumerate(ranks):
            memory.bar(x - 0.4 + width * (r + 0.5), v / div, width * 0.9, color=colour,
                       alpha=1.0 - 0.5 * r / max(len(ranks), 1), edgecolor="0.3", linewidth=0.3)
    for ax in axes:
        strategy_ticks(ax, labels)
        ax.set_ylim(bottom=0)
    speed.set_ylabel("tokens/s per rank (mean ± 95% CI)" if on_cpu else "MFU (%, mean ± 95% CI)")
    memory.set_ylabel(f"peak {'host RSS' if on_cpu else 'torch allocated'} per rank ({unit})")


def compared_layouts(summary: pd.DataFrame, model: str) -> pd.DataFrame:
    """The model's rows at the world sizes where it ran more than one layout, world size then 1D layout first."""
    rows = summary[summary["model"] == model]
    several = rows.groupby("world_size")["layout"].transform("nunique") > 1
    rows = rows[several].assign(_1d=lambda r: ~r["layout"].str.startswith("ws"))
    return rows.sort_values(["world_size", "_1d", "layout"]).drop(columns="_1d").reset_index(drop=True)


def layouts_figure(data: Data) -> plt.Figure:
    """Per model run in more than one layout at one world size: speed and per-rank memory by layout (see the
    module docstring)."""
    summary = data.summary
    models = [m for m in (model_order(summary) if len(summary) else []) if len(compared_layouts(summary, m))]
    fig, axes = grid(2 * len(models), data.style, ncols=2)
    for i, model in enumerate(models):
        rows = compared_layouts(summary, model)
        on_cpu = bool((rows["platform"].str.lower() == "cpu").all())
        layouts_panels(axes[2 * i:2 * i + 2], rows, data.runs[data.runs["model"] == model], data, on_cpu)
        axes[2 * i].set_title(f"{model}: {'throughput' if on_cpu else 'MFU'} per layout")
        axes[2 * i + 1].set_title(f"{model}: peak memory, a bar per rank (rank 0 left)")
    if not models:
        empty_note(axes[0], "no model ran in more than one layout at one world size")
    return fig


# ---------------------------------------------------------------- CLI
def write_all(data: Data, out_dir, names: list[str] = FIGURES) -> list[Path]:
    """The named study figures of the registry (report/figure_registry.py, stage `figures`)."""
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise SystemExit(f"figures: --names {','.join(unknown)}: not a study figure; known: {', '.join(FIGURES)}")
    out_dir = Path(out_dir)
    apply_style(data.style)
    for name in names:
        save(figure_registry.entry(name).load()(data), out_dir, name, int(data.style["dpi"]))
    return [out_dir / f"{name}.{ext}" for name in names for ext in figure_registry.EXTENSIONS]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True, help="runs.csv from the parse stage")
    ap.add_argument("--steps", required=True, help="steps.csv from the parse stage")
    ap.add_argument("--vram", required=True, help="vram.csv from the parse stage (may be header only)")
    ap.add_argument("--style", default="{}", help="JSON object of style keys (see above)")
    ap.add_argument("--names", default=",".join(FIGURES),
                    help="comma-separated figures to draw (default: every study figure of the registry)")
    ap.add_argument("--out-dir", required=True, help="where <figure>.png and <figure>.pdf go")
    args = ap.parse_args(argv)
    style = parse_style(args.style)
    names = [n for n in args.names.split(",") if n]
    written = write_all(load(args.runs, args.steps, args.vram, style), args.out_dir, names)
    print(f"figures: {len(written)} files -> {args.out_dir}")


if __name__ == "__main__":
    main()
