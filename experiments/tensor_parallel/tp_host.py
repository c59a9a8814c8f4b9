"""What does eager tensor parallelism cost the host per linear at one and at several ranks, and with FSDP2 around it?
The calibration's `tp_linear_us` is measured on a one-rank mesh; the parallelism study's eager tp2 rows ran 2.5-2.7 s
a step where the model, at that cost, says 1.5 s (BENCHMARKS.md caveats).

    python -m experiments.tensor_parallel.tp_host --rounds 5 --ranks 1,2 --out DIR

Per rank count, one torchrun of that many processes on one node, each timing, interleaved within a round, forward and
backward of `measure.calibrate`'s host-bound pair of linears (HOST_WIDTH -> 4 x HOST_WIDTH -> HOST_WIDTH over
HOST_TOKENS tokens, TP_PAIRS times, then a device synchronisation) as
  plain      two plain linears, bf16 parameters;
  tp         ColwiseParallel + RowwiseParallel over the tp mesh (all the ranks): DTensor's dispatch and, at several
             ranks, the forward's and backward's all-reduces in lockstep;
  fsdp       the plain pair under FSDP2 (`fully_shard` over the dp dimension of a dp1 x tpN mesh, bf16 parameters,
             fp32 reduction: the study's bf16-mixed), no tp;
  fsdp_tp    the tp pair under the same FSDP2: the study's dp1-tpN layout of a block.
Each process's best round of each variant is its time; the slowest rank's is the variant's. Per linear beyond the
plain pair's: tp - plain (what the calibration's `tp_linear_us` measures at one rank), fsdp_tp - fsdp (tp's cost
inside FSDP2) and fsdp_tp - plain. Writes tp_host.csv (one row per rank count, round, variant and rank) and
tp_host.md (per rank count and variant: the slowest rank's time per linear, mean and 95 % CI over rounds, and the
differences).
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

VARIANTS = ("plain", "tp", "fsdp", "fsdp_tp")
EXTRAS = (("tp", "plain"), ("fsdp_tp", "fsdp"), ("fsdp_tp", "plain"))


def pairs_of(variant: str, mesh, device):
    """The variant's module: a pair of linears, parallelised and wrapped as the variant says."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from workflow_scripts.measure.calibrate import host_pair

    pair = host_pair(device)
    if variant in ("tp", "fsdp_tp"):
        parallelize_module(pair, mesh["tp"], {"0": ColwiseParallel(), "1": RowwiseParallel()})
    if variant in ("fsdp", "fsdp_tp"):
        fully_shard(pair, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                           reduce_dtype=torch.float32))
    else:
        pair.to(torch.bfloat16)
    return pair


def measure(rounds_: int) -> list[dict]:
    """One rank (the child's side): its best time per round of each variant, seconds per pair."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from workflow_scripts.measure.calibrate import HOST_TOKENS, HOST_WIDTH, TP_PAIRS, timed

    cuda = torch.cuda.is_available()
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    mesh = init_device_mesh(device.type, (1, n), mesh_dim_names=("dp", "tp"))
    modules = {v: pairs_of(v, mesh, device) for v in VARIANTS}
    x = torch.randn(HOST_TOKENS, HOST_WIDTH, device=device, dtype=torch.bfloat16)

    def run(module):
        def pairs():
            for _ in range(TP_PAIRS):
                module(x).float().sum().backward()
            if cuda:
                torch.cuda.synchronize(device)
        return pairs

    out = []
    for r in range(rounds_):
        for v in rounds.order(r, VARIANTS):
            dist.barrier()
            seconds = timed(run(modules[v]), 3, best=True) / TP_PAIRS
            out.append({"ranks": n, "round": r, "variant": v, "rank": rank, "pair_s": seconds})
    every = [None] * n
    dist.all_gather_object(every, out)
    dist.destroy_process_group()
    return [row for rows in every for row in rows]


def child(ranks: int, rounds_: int) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "--local-ranks-filter=0", "-m", __spec__.name, "--child", "--rounds", str(rounds_)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return rounds.answer(done.stdout)["rows"]


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per rank count: each variant's slowest-rank time per linear (µs) and the differences, mean and 95 % CI over
    rounds (paired within a round)."""
    from workflow_scripts.report.stats import mean_ci

    slowest = rows.groupby(["ranks", "round", "variant"])["pair_s"].max().unstack("variant") * 1e6 / 2
    out = []
    for ranks, per in slowest.groupby(level="ranks"):
        cells = {v: per[v] for v in VARIANTS}
        cells.update({f"{a} - {b}": per[a] - per[b] for a, b in EXTRAS})
        for name, values in cells.items():
            ci = mean_ci(values)
            out.append({"ranks": ranks, "per linear (µs)": name, "mean": ci.mean, "± 95% CI": ci.half_width,
                        "rounds": ci.n})
    return pd.DataFrame(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    rounds.add_ranks(ap)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        rows = measure(a.rounds)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps({"rows": rows}), flush=True)
        return
    rows = pd.DataFrame([row for n in (int(k) for k in a.ranks.split(",")) for row in child(n, a.rounds)])
    rounds.write(rows, summary(rows).to_markdown(index=False, floatfmt=".4g"), a.out, "tp_host")


if __name__ == "__main__":
    sys.exit(main())
