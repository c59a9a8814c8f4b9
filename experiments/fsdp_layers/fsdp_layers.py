"""What one more layer costs a step's host and device, eager and with each block compiled, under FSDP2 on one rank
and on several, and unwrapped on one: the host's and the step's time per layer of a real block, the numbers the
step-time model prices with its fitted launches per layer (plan/step_time.py HOST_OPS[levers], + HOOK_OPS["fsdp"]
under FSDP2) at the calibrated launch cost.

    python -m experiments.fsdp_layers.fsdp_layers --rounds 3 --ranks 1,2 --out DIR
    python -m experiments.fsdp_layers.fsdp_layers --ranks 1 --families qwen2,gpt2 --wraps fsdp,none --out ...

The parallelism study's Qwen2.5-3B under FSDP2 on two and four H200 was predicted 12-29 % fast eager and 15-33 %
slow with its blocks compiled: both host-bound, so the model's host per layer is off in opposite
directions. Families: `qwen2`, tensor_parallel/tp_step's model (transformers' Qwen2 at Qwen2.5-3B's widths), and `gpt2`
(GPT-2 at GPT-2-medium's widths), both with a 1,024-token vocabulary, at the study's micro-batch of 2 x 1,024 tokens
a rank; wraps: `fsdp` (bf16 parameters and fp32 reductions, per block and at the root, over every rank) and `none`
(one rank, fp32 parameters under bf16 autocast: the harness's one-rank DDP run, unwrapped; GPT-2 only). Each layer
count of `--layers` is built one after the other in one torchrun per variant (rank count, family, wrap, lever set; the
order alternates between rounds). Per layer count: 3 warm-up steps, then `--steps` timed, each the forward with its
loss and the backward from a synchronised start: `issue`, when the host has issued them (backward() returned), and
`step`, when the device has run them (synchronised); the optimizer's step runs after, untimed. The median per rank,
the slowest rank's. Per layer: the slope between the smallest and the largest layer count (what the embedding, the
head and the root unit cost cancels). Writes fsdp_layers.csv (one row per round, variant, layer count and rank) and
fsdp_layers.md (ms per layer, mean and 95 % CI over rounds).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from experiments import rounds
from experiments.tensor_parallel import tp_step

LEVERS = ("eager", "blocks")
FAMILIES = ("qwen2", "gpt2")
VARIANT = ("ranks", "family", "wrap", "levers")  # what one torchrun measures
WRAPS = ("fsdp", "none")


def model_of(family: str, wrap: str, layers: int, device, compiled: bool):
    """The family's model with `layers` layers on this rank: Qwen2 at Qwen2.5-3B's widths (tensor_parallel/tp_step) or
    GPT-2 at GPT-2-medium's (hidden 1,024, 16 heads), a 1,024-token vocabulary; each block compiled first where
    `compiled`; sharded by FSDP2 per block and at the root over every rank (`fsdp`, bf16 parameters, fp32 reductions) or
    left unwrapped (`none`: one rank, as the harness runs a one-rank DDP run)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from workflow_scripts.training.strategies.engine import compile_blocks

    if family == "qwen2" and wrap == "fsdp":
        return tp_step.model_of("dp2", layers, device, compiled=compiled)
    if family == "qwen2":
        raise SystemExit("fsdp_layers: --wraps none runs GPT-2 only (Qwen2 unwrapped: tp_step's model without FSDP2)")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_head=16, n_layer=layers, vocab_size=1024, n_positions=1024,
                                       attn_implementation="sdpa")).to(device)
    if compiled:
        compile_blocks(model, "default")
    return model if wrap == "none" else tp_step.sharded(model, model.transformer.h)


def measure(family: str, wrap: str, levers: str, layer_counts: list[int], steps: int) -> dict:
    """One rank (the child's side): per layer count, the median issue and step time (s) over the timed steps."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)

    def synced():
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter()

    # bf16-mixed: FSDP2 computes in its bf16 parameters, the unwrapped model under autocast (the harness's precision)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=wrap == "none")
    out = {}
    for layers in layer_counts:
        model = model_of(family, wrap, layers, device, compiled=levers == "blocks")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if cuda else {"foreach": True}))
        ids = torch.randint(0, 1024, (2, 1024), device=device)
        issue, step = [], []
        for i in range(3 + steps):
            t0 = synced()
            with autocast:
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            t1 = time.perf_counter()
            t2 = synced()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if i >= 3:
                issue.append(t1 - t0)
                step.append(t2 - t0)
        out[str(layers)] = {"issue_s": statistics.median(issue), "step_s": statistics.median(step)}
        del model, optimizer
        if cuda:
            torch.cuda.empty_cache()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, out)
    dist.destroy_process_group()
    return {"ranks": every}


def child(family: str, wrap: str, levers: str, layer_counts: list[int], steps: int, ranks: int) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "--local-ranks-filter=0", "-m", __spec__.name, "--child", levers, "--families", family, "--wraps", wrap,
           "--layers", ",".join(map(str, layer_counts)), "--steps", str(steps)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return rounds.answer(done.stdout)


def per_layer(rows: pd.DataFrame) -> pd.DataFrame:
    """Per round, rank count and lever set: the slowest rank's issue and step time, their slope over the layer
    counts (s a layer)."""
    slowest = rows.groupby(["round", *VARIANT, "layers"])[["issue_s", "step_s"]].max().reset_index()
    out = []
    for (r, *variant), df in slowest.groupby(["round", *VARIANT]):
        lo, hi = df.loc[df.layers.idxmin()], df.loc[df.layers.idxmax()]
        span = hi.layers - lo.layers
        out.append({"round": r, **dict(zip(VARIANT, variant)),
                    **{f"{k}_per_layer_s": (hi[k] - lo[k]) / span for k in ("issue_s", "step_s")}})
    return pd.DataFrame(out)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per rank count and lever set: ms per layer issued and run, mean and 95 % CI over rounds."""
    from workflow_scripts.report.stats import mean_ci

    out = []
    for variant, df in per_layer(rows).groupby(list(VARIANT)):
        for what in ("issue", "step"):
            ci = mean_ci(df[f"{what}_s_per_layer_s"] * 1e3)
            out.append({**dict(zip(VARIANT, variant)), "per layer": what, "ms": ci.mean, "± 95% CI": ci.half_width,
                        "rounds": ci.n})
    return pd.DataFrame(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    rounds.add_ranks(ap)
    ap.add_argument("--layers", default="2,6", help="a comma list of layer counts (at least two)")
    ap.add_argument("--levers", default=",".join(LEVERS), help=f"a comma list of {', '.join(LEVERS)}")
    ap.add_argument("--families", default="qwen2", help=f"a comma list of {', '.join(FAMILIES)}")
    ap.add_argument("--wraps", default="fsdp", help=f"a comma list of {', '.join(WRAPS)} (none: one rank, GPT-2)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", choices=LEVERS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    layer_counts = [int(n) for n in a.layers.split(",")]
    if a.child:
        answer = measure(a.families, a.wraps, a.child, layer_counts, a.steps)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(answer), flush=True)
        return
    if len(set(layer_counts)) < 2:
        ap.error("--layers: at least two different layer counts (the slope between them is the layer's cost)")
    variants = [(int(n), family, wrap, levers) for n in a.ranks.split(",") for family in a.families.split(",")
                for wrap in a.wraps.split(",") for levers in a.levers.split(",")
                if not (wrap == "none" and (family == "qwen2" or int(n) > 1))]
    rows = []
    for r in range(a.rounds):
        for n, family, wrap, levers in rounds.order(r, tuple(variants)):
            answer = child(family, wrap, levers, layer_counts, a.steps, n)
            for rank, by_layers in enumerate(answer["ranks"]):
                rows += [{"round": r, "ranks": n, "family": family, "wrap": wrap, "levers": levers,
                          "layers": int(k), "rank": rank, **v} for k, v in by_layers.items()]
            if a.out:  # what finished survives a command stopped by its limit
                a.out.mkdir(parents=True, exist_ok=True)
                pd.DataFrame(rows).to_csv(a.out / "fsdp_layers.csv", index=False)
    frame = pd.DataFrame(rows)
    rounds.write(frame, summary(frame).to_markdown(index=False, floatfmt=".4g"), a.out, "fsdp_layers")


if __name__ == "__main__":
    sys.exit(main())
