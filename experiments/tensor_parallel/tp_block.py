"""A real block's tensor-parallel host cost against the calibration's lone pair, at the same rank count and on the
same machine: the two shares the step-time model prices eager tensor parallelism with (plan/step_time.py's
TP_BLOCK_SHARE and TP_CLIP_PAIRS, in units of the calibrated `tp_linear_us_ranks[n]`).

    python -m experiments.tensor_parallel.tp_block --rounds 3 --ranks 1,2 --out DIR

Per outer round, for each rank count: tp_step (transformers' Qwen2 at Qwen2.5-3B's widths, 4 layers, dp-N against
dp1-tpN, one round of both layouts) and tp_host (the lone ColwiseParallel + RowwiseParallel pair, 2 rounds), each in
its own torchrun. Per rank count and outer round:
  block_us          tp2 - dp2 of forward + backward per split linear (4 layers x 7 linears: parallel/tensor.py's plan)
  clip_us_layer     tp2 - dp2 of the clip (training/grad_norm.clip_ over the DTensors of two meshes) per layer
  pair_us           the pair's tp - plain per linear (what calibrate's tp_linear_us_ranks[n] measures)
  block_over_pair   block_us / pair_us;  clip_over_pair  clip_us_layer / pair_us
Writes tp_host.csv / .md, tp_step.csv / .md (per rank count) and block_over_pair.csv / .md (mean and 95 % CI over the
outer rounds). `--join DIR` rebuilds the tables from the per-round folders (host-<r>, step<n>-<r>) a run left in DIR.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

from experiments import rounds
from experiments.tensor_parallel import tp_host, tp_step
from workflow_scripts.training.parallel.tensor import BLOCK_PLAN

LAYERS = 4


def run_round(outer: int, ranks: list[int], raw: Path) -> None:
    """One outer round: tp_step at each rank count, then the pair at all of them."""
    for n in ranks:
        subprocess.run([sys.executable, "-m", tp_step.__spec__.name, "--ranks", str(n), "--rounds", "1",
                        "--layers", str(LAYERS), "--out", str(raw / f"step{n}-{outer}")], check=True)
    subprocess.run([sys.executable, "-m", tp_host.__spec__.name, "--rounds", "2", "--ranks", ",".join(map(str, ranks)),
                    "--out", str(raw / f"host-{outer}")], check=True)


def rounds_of(raw: Path, stem: str, name: str) -> pd.DataFrame:
    """Every round of one benchmark's folders, `round` made unique across outer rounds, `outer` (and for tp_step,
    `ranks`) from the folder's name."""
    frames = []
    for folder in sorted(raw.glob(f"{stem}*-*")):
        rows = pd.read_csv(folder / f"{name}.csv")
        head, outer = folder.name.rsplit("-", 1)
        rows["outer"] = int(outer)
        rows["round"] = int(outer) * 10 + rows["round"]
        if stem == "step":
            rows["ranks"] = int(head[len(stem):])
        frames.append(rows)
    return pd.concat(frames, ignore_index=True)


def shares(host: pd.DataFrame, step: pd.DataFrame) -> pd.DataFrame:
    """Per rank count and outer round: the block's and the clip's cost against the pair's (module docstring)."""
    slowest = step.groupby(["ranks", "outer", "round", "layout"])[["forward", "backward", "clip"]].max()
    slowest["fb"] = slowest["forward"] + slowest["backward"]
    per = slowest.groupby(["ranks", "outer", "layout"]).mean().unstack("layout")
    linears = LAYERS * len(BLOCK_PLAN)
    pair = host.groupby(["ranks", "outer", "round", "variant"])["pair_s"].max().unstack("variant") * 1e6 / 2
    out = pd.DataFrame({"block_us": (per["fb"]["tp2"] - per["fb"]["dp2"]) * 1e6 / linears,
                        "clip_us_layer": (per["clip"]["tp2"] - per["clip"]["dp2"]) * 1e6 / LAYERS,
                        "pair_us": (pair["tp"] - pair["plain"]).groupby(["ranks", "outer"]).mean()}).dropna()
    out["block_over_pair"] = out["block_us"] / out["pair_us"]
    out["clip_over_pair"] = out["clip_us_layer"] / out["pair_us"]
    return out.reset_index()


def join(raw: Path, out: Path) -> pd.DataFrame:
    from workflow_scripts.report.stats import mean_ci

    host, step = rounds_of(raw, "host", "tp_host"), rounds_of(raw, "step", "tp_step")
    out.mkdir(parents=True, exist_ok=True)
    host.drop(columns="outer").to_csv(out / "tp_host.csv", index=False)
    (out / "tp_host.md").write_text(tp_host.summary(host.drop(columns="outer")).to_markdown(index=False,
                                                                                             floatfmt=".4g") + "\n")
    step.drop(columns="outer").to_csv(out / "tp_step.csv", index=False)
    (out / "tp_step.md").write_text("\n\n".join(
        f"### {n} rank(s)\n\n" + tp_step.summary(rows.drop(columns=["outer", "ranks"]), LAYERS)
        .to_markdown(index=False, floatfmt=".4g") for n, rows in step.groupby("ranks")) + "\n")
    each = shares(host, step)
    each.to_csv(out / "block_over_pair.csv", index=False)
    table = []
    for n, rows in each.groupby("ranks"):
        for measure in ("block_us", "clip_us_layer", "pair_us", "block_over_pair", "clip_over_pair"):
            ci = mean_ci(rows[measure])
            table.append({"ranks": n, "measure": measure, "mean": ci.mean, "± 95% CI": ci.half_width, "rounds": ci.n})
    text = pd.DataFrame(table).to_markdown(index=False, floatfmt=".4g")
    (out / "block_over_pair.md").write_text(text + "\n")
    print(text)
    return each


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    rounds.add_ranks(ap)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--join", type=Path, help="only join the per-round folders a run left in this folder")
    a = ap.parse_args(argv)
    raw = a.join or a.out / "rounds"
    if not a.join:
        for outer in range(a.rounds):
            run_round(outer, [int(n) for n in a.ranks.split(",")], raw)
    join(raw, a.out)


if __name__ == "__main__":
    sys.exit(main())
