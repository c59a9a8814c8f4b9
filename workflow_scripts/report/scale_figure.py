"""The scale simulation's figure, drawn from what workflow_scripts/plan/scale.py wrote (rule scale): per model, the
best predicted tokens/s per GPU of each kind of layout against the GPU count, the network's assumptions above.

    python -m workflow_scripts.report.scale_figure --csv <results>/plan/scale.csv --config-json '<plan config>'
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from workflow_scripts.plan import planner
from workflow_scripts.plan.fabric import Fabric
from workflow_scripts.plan.scale import best
from workflow_scripts.report import style as F


def scale_figure(frame: pd.DataFrame, style: dict, caption: str):
    """Per model, the best predicted tokens/s per GPU of each kind of layout against the GPU count."""
    top = best(frame)
    models = list(dict.fromkeys(frame["model"]))
    fig, axes = F.grid(len(models), style, ncols=min(3, len(models)))
    for ax, model in zip(axes, models):
        part = top[top["model"] == model]
        for name, line in part.groupby("kind", sort=True):
            ax.plot(line["gpus"], line["predicted_tokens_per_s_per_gpu"], marker="o", label=name)
        ax.set_xscale("log", base=2)
        counts = sorted(set(frame["gpus"]))
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("predicted tokens/s per GPU")
        F.titled(ax, model)
        if part.empty:
            F.empty_note(ax, "nothing fits")
        else:
            ax.legend(title="layout", fontsize="small", ncols=3, loc="lower center")
    fig.suptitle(caption, fontsize="small", wrap=True)
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", required=True, help="scale.csv (the figure goes beside it: scale.png, scale.pdf)")
    ap.add_argument("--config-json", required=True, help="the plan config the simulation ran with")
    args = ap.parse_args(argv)
    config, csv = json.loads(args.config_json), Path(args.csv)
    device = planner.step_rates(config["plan"]).device
    style = F.parse_style(config.get("figures"))
    F.apply_style(style)
    caption = f"Predicted, not measured: {device}; {Fabric.of(config['plan']['scale']).describe()}"
    F.save(scale_figure(pd.read_csv(csv), style, caption), csv.parent, "scale", style["dpi"])


if __name__ == "__main__":
    main()
