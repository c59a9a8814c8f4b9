"""Does a rank's host run slower while the node's other GPUs run processes of their own? One process on GPU 0 alone,
against one process on each GPU at once, none communicating with another.

    python -m workflow_scripts.bench.host_contention --rounds 5 --out results/bench_harness/<set>

The step-time model prices a rank's host work at the launch cost the calibration measures in one process
(measure/calibrate.one_gpu's `launch_us`), while a run of n ranks on a node runs n such processes at once. Each
process here measures what the calibration measures (`one_gpu`: the launch cost among its rows), then runs the
eager GPT-2-medium step of bench/profiler_aftereffect (bf16 autocast, fused AdamW, no profiler) and reports its 40
steps after the first 20. The processes of one round start their work at one instant (a start time they wait for
after their imports). `--blocks` compiles each block first (the compiled-blocks step, whose host sets its pace as
much as its device: the processes compile at once, then time their steps). `alone` and `beside` alternate within a
round; writes host_contention.csv (one row per
process) and host_contention.md: each variant's launch cost and step, mean and 95% CI over rounds, and GPU 0's
`beside` / `alone` ratios paired within a round.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from workflow_scripts.bench import rounds

VARIANTS = ("alone", "beside")


def measure(micro_batch: int, start_at: float, blocks: bool = False) -> dict:
    """One process (the child's side): the calibration's per-GPU rows, then the steps."""
    import torch

    from workflow_scripts.bench.profiler_aftereffect import steps
    from workflow_scripts.measure.calibrate import one_gpu

    torch.zeros(1, device="cuda")  # the CUDA context, before the common start
    time.sleep(max(0.0, start_at - time.time()))
    rows = {r["name"]: r["value"] for r in one_gpu(0, 3)}
    return {"launch_us": rows["launch_us[0]"], "step_s": steps("off", micro_batch, blocks=blocks)["after_s"]}


def round_of(variant: str, gpus: int, micro_batch: int, lead_s: float, blocks: bool = False) -> list[dict]:
    """One variant's processes, started together; one row per process."""
    start_at = time.time() + lead_s
    procs = [subprocess.Popen([sys.executable, "-m", __spec__.name, "--child", "--micro-batch", str(micro_batch),
                               "--start-at", str(start_at), *(["--blocks"] if blocks else [])],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)})
             for gpu in range(gpus if variant == "beside" else 1)]
    rows = []
    for gpu, proc in enumerate(procs):
        out, _ = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"{variant} process on GPU {gpu} failed (exit code {proc.returncode})")
        rows.append({"variant": variant, "gpu": gpu, "processes": len(procs), **rounds.answer(out)})
    return rows


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    from workflow_scripts.report.stats import mean_ci

    out = []
    for variant, df in rows.groupby("variant", sort=False):
        launch, step = mean_ci(df.launch_us), mean_ci(df.step_s)
        out.append({"variant": variant, "processes": int(df.processes.max()), "runs": launch.n,
                    "launch (µs)": launch.mean, "± 95% CI": launch.half_width, "step (ms)": 1e3 * step.mean,
                    "± 95% CI ": 1e3 * step.half_width})
    launch, step = (rounds.paired(rows[rows.gpu == 0], name, "beside", "alone") for name in ("launch_us", "step_s"))
    out.append({"variant": "GPU 0: beside / alone (ratios)", "runs": launch.n, "launch (µs)": launch.mean,
                "± 95% CI": launch.half_width, "step (ms)": step.mean, "± 95% CI ": step.half_width})
    return pd.DataFrame(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=None, help="default: every GPU of the machine")
    ap.add_argument("--lead-s", type=float, default=20.0, help="seconds from the start of a round's processes to "
                                                               "their common start (their imports)")
    ap.add_argument("--blocks", action="store_true", help="compile each block first (the harness's compiled-blocks "
                                                          "lever): a step whose host, not its device, sets the pace")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(measure(a.micro_batch, a.start_at, a.blocks)), flush=True)
        return
    import torch

    gpus = a.gpus or torch.cuda.device_count()
    rows = pd.DataFrame([{"round": r, **row} for r in range(a.rounds) for v in rounds.order(r, VARIANTS)
                         for row in round_of(v, gpus, a.micro_batch, a.lead_s, a.blocks)])
    rounds.write(rows, summary(rows).to_markdown(index=False, floatfmt=".4g"), a.out, "host_contention")


if __name__ == "__main__":
    main()
