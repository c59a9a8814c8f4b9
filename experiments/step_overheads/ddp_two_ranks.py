"""What does DDP's second rank cost a compiled-blocks step, and how much of it is the all-reduce? The step on one GPU
unwrapped, on two GPUs under DDP, and on two GPUs under DDP whose buckets are not communicated.

    python -m experiments.step_overheads.ddp_two_ranks --rounds 3 --out DIR

The scaling study's GPT-2-medium DDP step ran 13-29 ms slower on two H200 than on one, which the step-time model does
not price: DDP over one rank costs the same step 4.4 ms (ddp_wrapper --blocks), so the rest needs the second rank.
Variants, each its own torchrun of one or two processes, interleaved within a round (the order alternates): `one_gpu`
(one process, the model unwrapped, as the harness runs one rank), `ddp` (two ranks, DDP's default 25 MB buckets and NCCL
all-reduces) and `ddp_no_comm` (two ranks, DDP with a communication hook that hands each bucket back as it is: the
reducer's hooks, copies and the compiled blocks' bucket splits without any collective; the ranks then train apart, so
this variant times, it does not train); with --variants, `ddp_pinned` (`ddp` with each rank's process and its threads
bound to its own share of the host's CPUs, rank r to the r-th of equal consecutive slices of the CPUs it may use, before
torch loads: do two ranks slow each other where their threads share cores?), `ddp_visible` (`ddp` with each rank seeing
its own GPU only, CUDA_VISIBLE_DEVICES set before CUDA starts: does a rank's context on the other rank's GPU cost it?),
and DDP's own settings against its 25 MB buckets: `ddp_one_bucket` (one bucket of the whole model, ddp_wrapper's
ONE_BUCKET_MB: one all-reduce after the backward, no overlap, no split of the compiled blocks), `ddp_no_split` (dynamo's
DDPOptimizer off, torch._dynamo.config.optimize_ddp: 25 MB buckets, each block one graph) and `ddp_bucket_view`
(gradient_as_bucket_view: the gradients are the buckets, no copy in or out); `--eager` runs the step without compiling
its blocks (device-bound where the compiled one is host-bound). The step is profiler_aftereffect's (bf16 autocast, fused
AdamW, clipping, each block compiled first, micro-batch 8 a rank, no profiler), rank 0's mean of its 40 steps after the
first 20. Writes ddp_two_ranks.csv and ddp_two_ranks.md: each variant's step, mean and 95% CI, and the ratios paired
within a round.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from experiments import rounds
from experiments.step_overheads.ddp_wrapper import ONE_BUCKET_MB

VARIANTS = ("one_gpu", "ddp", "ddp_no_comm")
SETTINGS = ("ddp_one_bucket", "ddp_no_split", "ddp_bucket_view")  # DDP's own knobs, against `ddp`
EVERY = (*VARIANTS, "ddp_pinned", "ddp_visible", *SETTINGS)
RATIOS = (("ddp", "one_gpu"), ("ddp_no_comm", "one_gpu"), ("ddp", "ddp_no_comm"), ("ddp_pinned", "one_gpu"),
          ("ddp_pinned", "ddp"), ("ddp_visible", "one_gpu"), ("ddp_visible", "ddp"),
          *((v, "ddp") for v in SETTINGS), *((v, "one_gpu") for v in SETTINGS))


def pin(rank: int, ranks: int) -> list[int]:
    """Bind this process (and the threads it starts from now on) to the rank-th of `ranks` equal consecutive slices
    of the CPUs it may use; the CPUs bound."""
    cpus = sorted(os.sched_getaffinity(0))
    share = max(1, len(cpus) // ranks)
    mine = cpus[rank * share:(rank + 1) * share] or cpus
    os.sched_setaffinity(0, mine)
    return mine


def measure(variant: str, micro_batch: int, eager: bool = False) -> dict:
    """One rank (the child's side): rank 0 answers."""
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    cpus = pin(rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) if variant == "ddp_pinned" else None
    if variant == "ddp_visible":  # this rank's GPU only, before CUDA starts: no context of it on another GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    gpu = 0 if variant == "ddp_visible" else rank
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from experiments.step_overheads.profiler_aftereffect import steps

    if torch.cuda.is_available():
        torch.cuda.set_device(gpu)

    def ddp(model):
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        knobs = {"ddp_one_bucket": {"bucket_cap_mb": ONE_BUCKET_MB},
                 "ddp_bucket_view": {"gradient_as_bucket_view": True}}.get(variant, {})
        if variant == "ddp_no_split":  # read when a block first compiles, after this
            torch._dynamo.config.optimize_ddp = False
        module = DistributedDataParallel(model, device_ids=[gpu] if torch.cuda.is_available() else None, **knobs)
        if variant == "ddp_no_comm":
            def as_it_is(state, bucket):
                done = torch.futures.Future()
                done.set_result(bucket.buffer())
                return done
            module.register_comm_hook(None, as_it_is)
        return module

    step_s = steps("off", micro_batch, wrap=None if variant == "one_gpu" else ddp, blocks=not eager)["after_s"]
    if variant != "one_gpu":
        dist.destroy_process_group()
    return {"step_s": step_s, "ranks": 1 if variant == "one_gpu" else 2,
            "cpus": f"{cpus[0]}-{cpus[-1]}" if cpus else "all"}


def child(variant: str, micro_batch: int, eager: bool = False) -> dict:
    """A torchrun of the variant's processes to its end; rank 0's answer (the last line of its output)."""
    ranks = 1 if variant == "one_gpu" else 2
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "--local-ranks-filter=0", "-m", __spec__.name, "--child", variant, "--micro-batch", str(micro_batch),
           *(["--eager"] if eager else [])]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return rounds.answer(done.stdout)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    return rounds.step_table(rows, RATIOS)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--eager", action="store_true", help="the step eager (no block compiled): device-bound")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"a comma list of {', '.join(EVERY)}")
    ap.add_argument("--child", choices=EVERY, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        answer = measure(a.child, a.micro_batch, a.eager)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(answer), flush=True)
        return
    variants = tuple(a.variants.split(","))
    if unknown := set(variants) - set(EVERY):
        ap.error(f"--variants: unknown {', '.join(sorted(unknown))} (known: {', '.join(EVERY)})")
    rows = pd.DataFrame([{"round": r, "variant": v, "micro_batch": a.micro_batch, "eager": a.eager,
                          **child(v, a.micro_batch, a.eager)}
                         for r in range(a.rounds) for v in rounds.order(r, variants)])
    rounds.write(rows, summary(rows).to_markdown(index=False, floatfmt=".4g"), a.out, "ddp_two_ranks")


if __name__ == "__main__":
    sys.exit(main())
