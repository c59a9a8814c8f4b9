"""What the SIGTERM stop vote (training/graceful_stop.RankStop.agreed: one int32 all-reduced over gloo per step,
started at a boundary and read at the next) costs a rank's step, on the ranks of one machine:

    torchrun --standalone --nproc-per-node 2 -m experiments.stop_vote.cost --steps 400 --rounds 3 --step-ms 5

Each round runs the same loop twice, in alternating order: `steps` steps of `step-ms` of host work (a CPU matmul
sized to take that long, one thread a rank), once with the vote at every boundary and once without. Rank 0 prints per
arm the median step and, for the vote, the median and 99th percentile of the time spent in agreed() and the median
of its wait for the vote started a step before; then the paired step ratio with its 95 % CI over rounds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from experiments import rounds
from workflow_scripts.report.stats import mean_ci
from workflow_scripts.training.graceful_stop import RankStop


def work(n: int) -> None:
    a = torch.ones(n, n)
    (a @ a).sum().item()


def size_for(ms: float) -> int:
    """The matmul side whose product takes about `ms` on this host."""
    n = 64
    while True:
        t = time.perf_counter()
        for _ in range(5):
            work(n)
        if (time.perf_counter() - t) / 5 * 1000 >= ms:
            return n
        n = int(n * 1.15) + 1


def arm(vote: RankStop | None, steps: int, n: int) -> tuple[list[float], list[float], list[float]]:
    """Each step's time, and with the vote the time in agreed() and in the part of it that waits for the vote
    started at the boundary before (RankStop.finish, timed on its own by wrapping it)."""
    step_s, vote_s, wait_s = [], [], []
    if vote is not None:
        finish = vote.finish

        def timed_finish():
            t = time.perf_counter()
            out = finish()
            wait_s.append(time.perf_counter() - t)
            return out

        vote.finish = timed_finish
    dist.barrier()
    for _ in range(steps):
        t0 = time.perf_counter()
        work(n)
        if vote is not None:
            t1 = time.perf_counter()
            vote.agreed()
            vote_s.append(time.perf_counter() - t1)
        step_s.append(time.perf_counter() - t0)
    if vote is not None:
        vote.finish = finish
        vote.finish()
    return step_s, vote_s, wait_s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=5.0)
    a = ap.parse_args(argv)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    n = torch.tensor([size_for(a.step_ms)])
    dist.broadcast(n, 0)  # every rank the same work
    vote = RankStop(dist.get_world_size())
    ratios, rows = [], []
    for r in range(a.rounds):
        order = rounds.order(r, ("vote", "none"))
        got = {name: arm(vote if name == "vote" else None, a.steps, int(n)) for name in order}
        with_vote, without = statistics.median(got["vote"][0]), statistics.median(got["none"][0])
        calls = sorted(got["vote"][1])
        ratios.append(with_vote / without)
        rows.append((r, order[0], without * 1e3, with_vote * 1e3, statistics.median(calls) * 1e6,
                     calls[int(0.99 * (len(calls) - 1))] * 1e6, statistics.median(got["vote"][2]) * 1e6))
    if rank == 0:
        print(f"{dist.get_world_size()} gloo ranks, matmul side {int(n)}, {a.steps} steps an arm")
        print("| round | first | step ms, no vote | step ms, vote | agreed() median us | agreed() p99 us "
              "| of it waiting, median us |")
        print("|---|---|---|---|---|---|---|")
        for row in rows:
            print("| {} | {} | {:.3f} | {:.3f} | {:.1f} | {:.1f} | {:.1f} |".format(*row))
        ci = mean_ci(ratios)
        print(f"step with the vote / without: {ci.mean:.4f} ± {ci.half_width:.4f} (95 % CI over {ci.n} rounds)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
