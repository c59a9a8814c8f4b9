"""What does DistributedDataParallel's wrapper cost a host-bound step, apart from any communication? The same model
unwrapped and under DDP over a one-rank process group, on one GPU.

    python -m experiments.step_overheads.ddp_wrapper --rounds 4 --out DIR

A one-GPU run of the harness trains its model unwrapped (training/strategies/_ddp_engine: one rank's all-reduce is
the identity), a run of several ranks under DDP; on a 2 x H200 machine the two-GPU step of eager GPT-2-medium ran
26-33 % slower than the one-GPU step, which the step-time model does not price.
Over one rank DDP still registers its per-parameter hooks, fills its buckets and all-reduces them (a one-rank NCCL
all-reduce: a copy), so the difference between the two variants here is the wrapper's own cost on this machine.
Each variant is its own process, interleaved within a round (the order alternates); the step is
profiler_aftereffect's (eager GPT-2-medium, bf16 autocast, fused AdamW, clipping, no profiler), the mean of its 40
steps after the first 20. Writes ddp_wrapper.csv and ddp_wrapper.md: each variant's step, mean and 95% CI, and the
ratio ddp / plain paired within a round.

`--blocks` compiles each of the model's blocks first (the harness's compiled-blocks lever, a host-bound step) and adds
a third variant, `ddp_one_bucket`: DDP with one bucket of the whole model (`bucket_cap_mb` 10,000). torch.compile
under DDP splits a compiled region at the bucket boundaries (dynamo's DDPOptimizer), so ddp against ddp_one_bucket
is the cost of those splits, and ddp_one_bucket against plain the cost of DDP's per-parameter hooks and bucket
copies (where DDP's two-GPU compiled step loses its time).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

import pandas as pd

from experiments import rounds

VARIANTS = ("plain", "ddp")
BLOCK_VARIANTS = VARIANTS + ("ddp_one_bucket",)
ONE_BUCKET_MB = 10_000  # more than any model here: DDP holds it in one bucket
RATIOS = (("ddp", "plain"), ("ddp_one_bucket", "plain"), ("ddp", "ddp_one_bucket"))  # those whose variants ran


def measure(variant: str, micro_batch: int, blocks: bool = False) -> dict:
    """One process (the child's side)."""
    from experiments.step_overheads.profiler_aftereffect import steps

    def ddp(model):
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        cuda = torch.cuda.is_available()
        dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
        bucket = {"bucket_cap_mb": ONE_BUCKET_MB} if variant == "ddp_one_bucket" else {}
        return DistributedDataParallel(model, device_ids=[0] if cuda else None, **bucket)

    return {"step_s": steps("off", micro_batch, wrap=None if variant == "plain" else ddp, blocks=blocks)["after_s"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child(variant: str, micro_batch: int, blocks: bool) -> dict:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    args = ["--child", variant, "--micro-batch", str(micro_batch)] + (["--blocks"] if blocks else [])
    return rounds.child(__spec__.name, args, env)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    return rounds.step_table(rows, RATIOS)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--blocks", action="store_true", help="compile each block first (a host-bound step)")
    ap.add_argument("--child", choices=BLOCK_VARIANTS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(measure(a.child, a.micro_batch, a.blocks)), flush=True)
        return
    variants = BLOCK_VARIANTS if a.blocks else VARIANTS
    rows = pd.DataFrame([{"round": r, "variant": v, "micro_batch": a.micro_batch, "blocks": a.blocks,
                          **child(v, a.micro_batch, a.blocks)}
                         for r in range(a.rounds) for v in rounds.order(r, variants)])
    rounds.write(rows, summary(rows).to_markdown(index=False, floatfmt=".4g"), a.out, "ddp_wrapper")


if __name__ == "__main__":
    main()
