"""One look for every figure the pipeline draws (the study's figures, calibration, claims, traces, the scale
simulation, the memory-prediction benchmark): the style keys and their defaults (config `figures`, defaults in the
schema), the seaborn theme, panel grids, notes and status marks, and saving as PNG + PDF.

A figure module draws its panels and leaves the rest here; workflow_scripts/report/figure_registry.py lists every
figure once with its caption."""
from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from workflow_scripts import columns as C  # noqa: E402
from workflow_scripts import schema  # noqa: E402

NO_VALUE = C.STATUS_MARK[C.UNSUPPORTED]  # a successful run without the value a panel draws


def parse_style(text: str | dict | None) -> dict:
    """Defaults overlaid with the given JSON; unknown keys are an error (a typo would otherwise be ignored)."""
    given = json.loads(text) if isinstance(text, str) and text.strip() else dict(text or {})
    defaults = schema.default("figures")  # None where the figure chooses (step_marker_every)
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(f"unknown style keys {sorted(unknown)}; known: {sorted(defaults)}")
    return {**defaults, **given}


def apply_style(style: dict) -> None:
    sns.set_theme(context=style["context"], style="whitegrid", palette=style["palette"],
                  font_scale=style["font_scale"])


def strategy_colours(names: list[str], palette: str) -> tuple[dict, dict]:
    """One colour per strategy with data; past the palette's length, darker shades and dashed lines."""
    base = sns.color_palette(palette)
    colours = {n: base[i] if i < len(base) else tuple(0.55 * c for c in base[i % len(base)])
               for i, n in enumerate(names)}
    dashes = {n: "-" if i < len(base) else "--" for i, n in enumerate(names)}
    return colours, dashes


def grid(n: int, style: dict, ncols: int = 3, legend_width: float = 0.0) -> tuple[plt.Figure, list[plt.Axes]]:
    """n panels (at least one) of style width x height each (plus room for a legend), constrained layout."""
    n = max(n, 1)
    ncols = min(n, ncols)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(style["width"] * ncols + legend_width, style["height"] * nrows),
                             squeeze=False, layout="constrained")
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def empty_note(ax: plt.Axes, text: str) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.35")


def mark_missing(ax: plt.Axes, x: float, word: str, width: float = 0.8) -> None:
    """A hatched empty bar over the lower third of the axes at x, with the status word in it."""
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    ax.add_patch(Rectangle((x - width / 2, 0), width, 0.33, transform=trans, fill=False, hatch="///",
                           edgecolor="0.45", linewidth=0.8))
    ax.text(x, 0.17, word, transform=trans, ha="center", va="center", rotation=90, fontsize="small",
            fontweight="bold", color="0.2", bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})


def status_mark(status: str) -> str:
    return C.STATUS_MARK.get(status, status)


def titled(ax: plt.Axes, title: str, note: str = "") -> None:
    """Panel title, with a smaller second line for what the panel cannot show (kept clear of the data)."""
    note = textwrap.fill(note, width=70)
    ax.set_title(f"{title}\n{note}" if note else title, fontsize="medium" if not note else "small")


def corner_note(ax: plt.Axes, text: str) -> None:
    if text:
        ax.text(0.99, 0.98, text, transform=ax.transAxes, ha="right", va="top", fontsize="x-small",
                color="0.25", bbox={"facecolor": "white", "edgecolor": "0.7", "alpha": 0.85, "pad": 2})


def strategy_ticks(ax: plt.Axes, names: list[str]) -> None:
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=40, ha="right")
    ax.set_xlim(-0.6, len(names) - 0.4)


def save(fig: plt.Figure, out_dir: Path, name: str, dpi: int) -> None:
    """PNG at the style's dpi and PDF, cropped to what is drawn (outside legends and notes included)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / f"{name}.png", dpi=dpi, bbox_inches="tight")
    fig.savefig(out_dir / f"{name}.pdf", bbox_inches="tight")
    plt.close(fig)
