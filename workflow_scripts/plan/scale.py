"""The study at scales we cannot rent (target `scale`, config `plan.scale`): for every GPU count of `plan.scale.gpus`
and every model and strategy of the plan, every layout that the parallel dimensions accept (tp and cp inside a node,
pp, ep, dp the rest; training/parallel/ checks each as it checks a study's layouts) at every micro-batch of the
plan, the predicted device-wide peak (memory model) and, for those that fit, the predicted step on the network of
plan.scale (plan/fabric.py) at the rates of plan.calibration (plan/step_time.py). Writes scale.csv (every
candidate) and scale.md (the assumptions, then per model and GPU count the fastest layout of each kind); the rule
then draws scale.png from scale.csv (workflow_scripts/report/scale_figure.py).

    snakemake --cores 1 scale --configfile studies/parallelism.yaml studies/scale/h200_nodes.yaml

Pipeline candidates run max(train.grad_accum, pp) micro-batches per step (the fewest the schedule takes); every
candidate keeps its micro-batch per GPU as the GPU count grows (weak scaling: the global batch grows with dp).
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import pandas as pd

from workflow_scripts import study
from workflow_scripts.plan import planner
from workflow_scripts.plan.fabric import Fabric
from workflow_scripts.training import parallel
from workflow_scripts.training.layout import Layout
from workflow_scripts.training.models import MODELS
from workflow_scripts.units import GIB

DEGREES = (1, 2, 4, 8)  # tp, cp, pp and ep candidates (tp and cp: inside one node)


def kind(layout: Layout) -> str:
    """The layout's kind as the figure draws it: the dimensions above one besides dp (`dp` alone)."""
    return "+".join(k for k in ("tp", "pp", "cp", "ep") if getattr(layout, k) > 1) or "dp"


def layouts(model: str, strategy, gpus: int, fabric: Fabric, train: dict, seq_len: int) -> list[Layout]:
    """The layouts of `gpus` ranks that the parallel dimensions accept for this model, strategy and training."""
    spec, out = MODELS[model], []
    for tp, cp, pp, ep in itertools.product(DEGREES, DEGREES, DEGREES, DEGREES):
        if gpus % (tp * cp * pp) or tp * cp > fabric.gpus_per_node:
            continue
        layout = Layout(dp=gpus // (tp * cp * pp), pp=pp, tp=tp, cp=cp, ep=ep)
        where, t = "plan.scale", {**train, "grad_accum": max(int(train["grad_accum"]), pp)}
        if not (layout.problems(spec, where, seq_len) or parallel.unimplemented(layout, where)
                or parallel.run_problems(layout, strategy, {**t, "checkpoint_every": 0}, where)
                or parallel.model_problems(layout, model, where)):
            out.append(layout)
    return out


def candidates(config: dict, rates, fabric: Fabric) -> pd.DataFrame:
    """Every model x strategy x GPU count x layout x micro-batch of plan.scale: memory, and the step where it fits."""
    from workflow_scripts.training.strategies import STRATEGIES

    plan, train = config["plan"], config["train"]
    vocab, usable = planner.plan_vocab(config), planner.usable_bytes(plan)
    seq_len = plan.get("seq_len") or config["data"]["block_size"]
    precision = plan.get("precision") or train["precision"]
    out = []
    for model in plan.get("models") or study.all_names(config, "models"):
        for strategy in plan.get("strategies") or study.all_names(config, "strategies"):
            for gpus in plan["scale"]["gpus"]:
                for layout in layouts(model, STRATEGIES[strategy], gpus, fabric, train, seq_len):
                    for mb in plan["micro_batches"]:
                        out.append(candidate(config, rates, fabric, model, strategy, layout, mb, vocab, seq_len,
                                             precision, usable))
    return pd.DataFrame(out)


def candidate(config, rates, fabric, model, strategy, layout: Layout, mb, vocab, seq_len, precision, usable):
    spec = study.candidate(config, model, strategy, layout, mb, seq_len, precision)
    # a pipeline of pp stages has at least pp micro-batches in flight: the simulated run accumulates over as many
    spec = spec.replace(batch={**spec.batch, "accum": max(spec.accum, layout.pp)})
    accum = spec.accum
    p = planner.memory(spec, vocab, seq_len)
    device = p.device if p.modelled else None
    fits = None if device is None or (p.bound and device > usable) else bool(device <= usable)
    row = {"model": model, "strategy": strategy, "gpus": layout.world_size, "layout": layout.key,
           "kind": kind(layout), "micro_batch": mb, "accum": accum, "precision": precision,
           "predicted_device_gib": None if device is None else device / GIB, "fits": fits, "memory_note": p.why}
    if fits:
        row.update(planner.throughput(spec, rates, vocab, seq_len, fabric))
    return row


def best(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model, GPU count and kind of layout, the fastest candidate that fits."""
    if "predicted_tokens_per_s_per_gpu" not in frame:
        return frame.iloc[0:0]
    ok = frame.dropna(subset=["predicted_tokens_per_s_per_gpu"])
    idx = ok.groupby(["model", "gpus", "kind"])["predicted_tokens_per_s_per_gpu"].idxmax()
    return ok.loc[idx].sort_values(["model", "gpus", "predicted_tokens_per_s_per_gpu"], ascending=[True, True, False])


def markdown(frame: pd.DataFrame, config: dict, fabric: Fabric, device: str | None) -> str:
    plan = config["plan"]
    lines = ["# Simulated scaling (plan/scale.py)", "",
             f"Assumed: {device or 'the calibrated GPU'} at the rates of `{plan['calibration']}` (host costs: the "
             "median of the kind's calibrated machines, its rate file in plan/rates/: plan/step_time.load_rates); "
             f"{fabric.describe()}; "
             f"{plan['gpu_memory_gib']} GiB per GPU ({plan['headroom_gib']} kept free); micro-batch per GPU fixed as "
             "the GPU count grows (weak scaling); pipeline layouts at max(train.grad_accum, pp) micro-batches per "
             "step; levers as `auto` resolves them for the layout (eager where compiled runs of a dimension were not "
             "checked on a GPU: training/levers.py). Predictions, not measurements: the model's held-out error on one "
             "node is in experiments/step_time.", ""]
    top = best(frame)
    for model, part in top.groupby("model", sort=False):
        lines += [f"## {model}", "", "| GPUs | layout | strategy | mb | levers | tokens/s per GPU | MFU | bound | "
                  "comm share | peak GiB |", "|---|---|---|---|---|---|---|---|---|---|"]
        for _, r in part.iterrows():
            mfu = "" if pd.isna(r["predicted_mfu"]) else f"{r['predicted_mfu']:.1%}"
            lines.append(f"| {r['gpus']} | `{r['layout']}` | `{r['strategy']}` | {r['micro_batch']} | {r['levers']} | "
                         f"{r['predicted_tokens_per_s_per_gpu']:,.0f} | {mfu} | {r['bound']} | "
                         f"{r['comm_share']:.0%} | {r['predicted_device_gib']:.1f} |")
        none = sorted(set(frame[frame["model"] == model]["gpus"]) - set(part["gpus"]))
        if none:
            lines.append(f"| {', '.join(map(str, none))} | nothing fits | | | | | | | | |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config-json", required=True)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args(argv)
    config = json.loads(args.config_json)
    scale = config["plan"].get("scale")
    try:
        if not scale:
            raise planner.PlanError("plan.scale: not set (the GPU counts and the network to simulate)")
        rates = planner.step_rates(config["plan"])
        if rates is None:
            raise planner.PlanError("plan.calibration: the scale simulation needs a calibration of the GPU kind")
        fabric = Fabric.of(scale)
        frame = candidates(config, rates, fabric)
        if best(frame).empty:
            notes = [n for c in ("memory_note", "step_note") for n in frame.get(c, []) if isinstance(n, str) and n]
            raise planner.PlanError(f"no layout of {sorted(set(frame.get('model', [])))} both fits and has a step "
                                    f"time at {config['plan']['scale']['gpus']} GPUs: "
                                    f"{'; '.join(dict.fromkeys(notes)) or 'none fits in memory'}")
    except planner.PlanError as exc:
        raise SystemExit(f"invalid plan: {exc}") from None
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "scale.csv", index=False)
    text = markdown(frame, config, fabric, rates.device)
    (out / "scale.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
