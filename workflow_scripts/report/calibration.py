"""The machine calibration as a figure (rule calibration_figure), from rule calibrate's calibration.json:

    python -m workflow_scripts.report.calibration --calibration calibration.json --style '{}' --figure calibration.png

One horizontal-bar panel per unit (TFLOP/s, GB/s, M iterations/s, ms), one bar per measure; GPU matmuls carry a
tick at the GPU's datasheet bf16 peak (the peak MFU divides by). Measures the platform has not (GPU matmul and
copies, collectives on CPU) are named in a panel note as not applicable, never left out silently.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from workflow_scripts.measure.metrics import peak_tflops
from workflow_scripts.report.style import apply_style, empty_note, grid, parse_style, save, titled

UNITS = ["TFLOP/s", "GB/s", "M iterations/s", "ms"]  # panel order
GPU_ONLY = ("matmul_bf16", "h2d", "d2h", "all_reduce_busbw", "all_gather_busbw")


def rows(calibration: dict) -> pd.DataFrame:
    frame = pd.DataFrame(calibration["rows"], columns=["name", "value", "unit", "detail"])
    return frame.dropna(subset=["value"])


def gpu_peaks(calibration: dict) -> dict[int, float | None]:
    gpus = ((calibration.get("machine") or {}).get("gpu") or {}).get("gpus") or []
    return {g["index"]: peak_tflops(g.get("name")) for g in gpus}


def panel(ax, frame: pd.DataFrame, unit: str, peaks: dict, platform: str) -> None:
    mine = frame[frame["unit"] == unit].reset_index(drop=True)
    missing = [m for m in GPU_ONLY if not frame["name"].str.startswith(m).any()]
    note = f"not applicable on {platform}: " + ", ".join(missing) if missing and unit in ("TFLOP/s", "GB/s") else ""
    if mine.empty:
        titled(ax, unit)
        empty_note(ax, note or "not measured")
        return
    ax.barh(range(len(mine)), mine["value"], color="C0")
    ax.set_yticks(range(len(mine)))
    ax.set_yticklabels(mine["name"])
    ax.invert_yaxis()
    for y, row in mine.iterrows():
        ax.text(row["value"], y, f" {row['value']:.4g}", va="center", fontsize="x-small")
        if row["name"].startswith("matmul_bf16["):
            peak = peaks.get(int(row["name"].split("[")[1].rstrip("]")))
            if peak:
                ax.plot([peak, peak], [y - 0.4, y + 0.4], color="black", linewidth=1.5)
                ax.text(peak, y - 0.45, f"peak {peak:g}", ha="center", va="bottom", fontsize="xx-small")
    ax.set_xlabel(unit + (" (lower is faster)" if unit == "ms" else ""))
    ax.margins(x=0.2)
    titled(ax, unit, note)


def calibration_figure(calibration: dict, style: dict):
    """One panel per unit (TFLOP/s, GB/s, µs) of the calibration's measures, beside the device's peaks."""
    frame = rows(calibration)
    units = UNITS + [u for u in frame["unit"].unique() if u not in UNITS]
    fig, axes = grid(len(units), style, ncols=2)
    for ax, unit in zip(axes, units):
        panel(ax, frame, unit, gpu_peaks(calibration), calibration.get("platform", "cpu"))
    machine = calibration.get("machine") or {}
    fig.suptitle(f"Calibration ({calibration.get('platform')}, median of {calibration.get('rounds')}); "
                 f"CPU: {machine.get('cpu_model')}", fontsize="medium")
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--style", default="{}")
    ap.add_argument("--figure", required=True, help="the PNG path (a PDF is written beside it)")
    args = ap.parse_args(argv)
    style, figure = parse_style(args.style), Path(args.figure)
    apply_style(style)
    save(calibration_figure(json.loads(Path(args.calibration).read_text()), style), figure.parent, figure.stem,
         style["dpi"])


if __name__ == "__main__":
    main()
