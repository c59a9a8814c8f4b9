"""What fits, before anything runs (rule `plan`, config `plan`):

    snakemake plan --configfile studies/<study>.yaml --config 'plan={gpu_memory_gib: 80, gpus: [1, 2, 4]}'
    python -m workflow_scripts.plan.planner --config-json '<the study config as JSON>' --out-dir results/<s>/plan

For every model x strategy x GPU count x micro-batch of the plan: the predicted peak per GPU (analytic memory
model, workflow_scripts/plan/memory_model.py: torch-allocated, and device-wide with the CUDA context, NCCL buffers
and allocator slack), the usable memory (gpu_memory_gib minus headroom_gib, a margin for the prediction's error),
the margin of the device-wide peak and whether it fits; then per model, strategy and GPU count the largest
micro-batch that fits. Writes plan.csv and plan.md. Needs no data: the embedding rows come from plan.vocab, else
train.embedding_rows, else the trained BPE's tokenizer.vocab_size (a hub tokenizer's size is only known after
download: set plan.vocab).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from workflow_scripts import study
from workflow_scripts.plan.predict import predict
from workflow_scripts.training.models import MODELS, embedding_rows
from workflow_scripts.units import GIB



class PlanError(ValueError):
    pass


def plan_vocab(config: dict) -> int:
    plan, train = config["plan"], config["train"]
    if plan.get("vocab"):
        return embedding_rows(plan["vocab"], train)
    if config["tokenizer"]["kind"] == "bpe":
        return embedding_rows(config["tokenizer"]["vocab_size"], train)
    if train.get("embedding_rows"):
        return embedding_rows(train["embedding_rows"], train)
    raise PlanError("plan.vocab: the hub tokenizer's vocabulary is not known before it is downloaded; set it")


def usable_bytes(plan: dict) -> float:
    return (plan["gpu_memory_gib"] - plan["headroom_gib"]) * GIB


def compiled(config: dict, gpus: int, model: str, micro_batch: int, seq_len: int) -> bool:
    """Whether the run compiles (train.compile_blocks / compile_loss, `auto` resolved as a run spec does)."""
    from workflow_scripts.training import levers

    family = MODELS[model].family
    t = levers.resolve(config["train"], config["platform"], {"dp": gpus}, family,
                       study.block_flops(config, model, micro_batch, {}, seq_len))
    return levers.compiles(t, family, {"dp": gpus})


def accumulation(strategy: str, config: dict) -> int:
    """Micro-batches per step: the strategy's own (grad_accum) or train.grad_accum."""
    from workflow_scripts.training.strategies import STRATEGIES

    own = STRATEGIES[strategy].accum_steps
    return int(own(config["strategy_options"].get(strategy, {}))) if own else int(config["train"]["grad_accum"])


def rows(config: dict) -> pd.DataFrame:
    plan, train = config["plan"], config["train"]
    vocab = plan_vocab(config)
    seq_len = plan.get("seq_len") or config["data"]["block_size"]
    models = plan.get("models") or study.all_names(config, "models")
    strategies = plan.get("strategies") or study.all_names(config, "strategies")
    gpus = plan.get("gpus") or study.all_names(config, "world_sizes")
    usable = usable_bytes(plan)
    out = []
    for model in models:
        for strategy in strategies:
            for n in gpus:
                for mb in plan["micro_batches"]:
                    p = predict(model=model, strategy=strategy, precision=plan.get("precision") or train["precision"],
                                world_size=n, micro_batch=mb, seq_len=seq_len,
                                grad_accum=accumulation(strategy, config),
                                vocab=vocab, overrides=config["model_overrides"].get(model),
                                options=config["strategy_options"].get(strategy, {}),
                                checkpointing=bool(train["gradient_checkpointing"]),
                                compiled=compiled(config, n, model, mb, seq_len))
                    total, device = (p.total, p.device) if p.modelled else (None, None)
                    out.append({"model": model, "strategy": strategy, "gpus": n, "micro_batch": mb,
                                "predicted_gib": None if total is None else total / GIB,
                                "predicted_device_gib": None if device is None else device / GIB,
                                "usable_gib": usable / GIB,
                                "margin_gib": None if device is None else (usable - device) / GIB,
                                # an upper bound (compiled) that exceeds the usable memory says nothing
                                "fits": None if device is None or (p.bound and device > usable)
                                else bool(device <= usable),
                                "method": p.method if p.modelled else "", "bound": p.bound, "note": p.why})
    return pd.DataFrame(out)


def largest_fitting(frame: pd.DataFrame) -> pd.DataFrame:
    fit = frame[frame["fits"] == True]  # noqa: E712 - None (not modelled) is neither
    best = fit.groupby(["model", "strategy", "gpus"])["micro_batch"].max().rename("largest_micro_batch")
    return frame[["model", "strategy", "gpus"]].drop_duplicates().merge(
        best.reset_index(), how="left", on=["model", "strategy", "gpus"])


def markdown(frame: pd.DataFrame, plan: dict) -> str:
    lines = [f"Plan: {plan['gpu_memory_gib']} GiB per GPU, {plan['headroom_gib']} GiB kept free (the prediction's "
             "error); predicted device-wide peak per GPU (analytic memory model: torch-allocated peak, allocator "
             "slack, CUDA context, NCCL buffers); ✓ fits, ✗ does not; ≤: compiled runs, from the eager count, which bounds "
             "their torch-allocated peak (the device-wide figure can be passed by a few % of allocator slack) "
             "(? where it does not fit: the compiled run may).", ""]
    mbs = list(plan["micro_batches"])
    best = largest_fitting(frame).set_index(["model", "strategy", "gpus"])["largest_micro_batch"]
    for model, part in frame.groupby("model", sort=False):
        lines += [f"### {model}", "", "| strategy | GPUs | " + " | ".join(f"mb {m}" for m in mbs)
                  + " | largest mb that fits |", "|---|---|" + "---|" * (len(mbs) + 1)]
        for (strategy, n), cells in part.groupby(["strategy", "gpus"], sort=False):
            by_mb = cells.set_index("micro_batch")
            text = []
            for m in mbs:
                r = by_mb.loc[m]
                mark = "?" if r["fits"] is None else "✓" if r["fits"] else "✗"
                text.append(r["note"] if pd.isna(r["predicted_gib"]) else
                            f"{'≤ ' if r['bound'] else ''}{r['predicted_device_gib']:.1f} {mark}")
            largest = best.loc[(model, strategy, n)]
            lines.append(f"| `{strategy}` | {n} | " + " | ".join(text) + " | "
                         + ("none" if pd.isna(largest) else str(int(largest))) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config-json", required=True)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args(argv)
    config = json.loads(args.config_json)
    try:
        frame = rows(config)
    except PlanError as exc:
        raise SystemExit(f"invalid plan: {exc}") from None
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "plan.csv", index=False)
    text = markdown(frame, config["plan"])
    (out / "plan.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
