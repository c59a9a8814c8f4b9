"""Where does an eager tensor-parallel step spend its time against the same step data parallel? The parallelism
study's Qwen2.5-3B ran 2.5-2.7 s a step as dp1-tp2 and 0.93 s as dp2 on two H200 (its trace: the GPU idle 0.8-1.4 s of
the tp2 step outside any kernel, 0.2-0.3 s of the dp2 one), and tp_host measures DTensor's dispatch of a lone pair of
linears at 1.1 ms a linear on two ranks, a third of that gap.

    python -m experiments.tensor_parallel.tp_step --rounds 5 --layers 4 --out DIR

One torchrun of two processes on one node (gloo on CPU; `--ranks 1`: one process, where both layouts are a one-rank
mesh and tp2 - dp2 is the split block's DTensor dispatch alone, to set beside tp_host's lone pair at one rank). The
model: transformers' Qwen2 at Qwen2.5-3B's widths (hidden 2,048, MLP 11,008, 16 heads, 2 KV heads) with `--layers`
layers and a 1,024-token vocabulary, bf16-mixed FSDP2 as the fsdp strategy builds it (`fully_shard` per block and
the root over the dp dimension), as
  dp2     the data-parallel layout: FSDP2 over both ranks;
  tp2     dp1-tp2: each block split by training/parallel/tensor.py's plan over the tp dimension, FSDP2 over dp (one
          rank).
Per step (micro-batch 2 x 1,024 tokens a rank, one micro-batch), each phase ended by a device synchronisation:
forward + loss, backward, clip (training/grad_norm.clip_ at 1.0, as the engine clips tensor-parallel DTensors) and
optimizer (fused AdamW step and zero_grad, the engine's); 3 warm-up steps, then `--steps` timed, the median per
phase; the slowest rank's. Writes tp_step.csv (one row per round, layout and rank) and tp_step.md (per layout and
phase, ms a step and per layer, mean and 95 % CI over rounds).
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

LAYOUTS = ("dp2", "tp2")
PHASES = ("forward", "backward", "clip", "optimizer")


def model_of(layout: str, layers: int, device, compiled: bool = False):
    """The layout's model on this rank: Qwen2 at Qwen2.5-3B's widths, split and wrapped as the layout says; each
    block compiled in place first where `compiled` (the harness's train.compile_blocks: strategies.engine)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from workflow_scripts.training.parallel.tensor import block_plan
    from workflow_scripts.training.strategies.engine import compile_blocks

    config = Qwen2Config(hidden_size=2048, intermediate_size=11008, num_attention_heads=16, num_key_value_heads=2,
                         num_hidden_layers=layers, vocab_size=1024, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device)
    if compiled:  # before the split: only the data-parallel layout compiles here
        assert layout == "dp2", "tp_step compiles the dp2 layout's blocks only"
        compile_blocks(model, "default")
    n = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh(device.type, (n, 1) if layout == "dp2" else (1, n), mesh_dim_names=("dp", "tp"))
    if layout == "tp2":
        for block in model.model.layers:
            parallelize_module(block, mesh["tp"], block_plan())
    return sharded(model, model.model.layers, mesh["dp"])


def sharded(model, blocks, mesh=None):
    """bf16-mixed FSDP2 as the fsdp strategy builds it: each block its own unit, then the root, over `mesh` (every
    rank where None); bf16 parameters, fp32 reductions."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def measure(layout: str, layers: int, steps: int) -> dict:
    """One rank (the child's side): the median of each phase over the timed steps, seconds."""
    import torch
    import torch.distributed as dist

    from workflow_scripts.training.grad_norm import clip_

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    model = model_of(layout, layers, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if cuda else {"foreach": True}))
    ids = torch.randint(0, 1024, (2, 1024), device=device)

    def synced():
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter()

    times: dict = {p: [] for p in PHASES}
    for step in range(3 + steps):
        t0 = synced()
        loss = model(input_ids=ids, labels=ids).loss
        t1 = synced()
        loss.backward()
        t2 = synced()
        clip_(model.parameters(), 1.0)
        t3 = synced()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t4 = synced()
        if step >= 3:
            for phase, (a, b) in zip(PHASES, ((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
                times[phase].append(b - a)
    out = {p: statistics.median(v) for p, v in times.items()}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, out)
    dist.destroy_process_group()
    return {"ranks": every}


def child(layout: str, layers: int, steps: int, ranks: int = 2) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "--local-ranks-filter=0", "-m", __spec__.name, "--child", layout, "--layers", str(layers),
           "--steps", str(steps)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return rounds.answer(done.stdout)


def summary(rows: pd.DataFrame, layers: int) -> pd.DataFrame:
    """Per layout and phase (and the step, their sum): the slowest rank's ms, mean and 95 % CI over rounds, and per
    layer; then tp2 - dp2 paired within a round."""
    from workflow_scripts.report.stats import mean_ci

    slowest = rows.groupby(["round", "layout"])[list(PHASES)].max()
    slowest["step"] = slowest[list(PHASES)].sum(axis=1)
    out = []
    for name in (*PHASES, "step"):
        by = slowest[name].unstack("layout") * 1e3
        cells = {layout: by[layout] for layout in LAYOUTS if layout in by}
        if set(LAYOUTS) <= set(by):
            cells["tp2 - dp2"] = by["tp2"] - by["dp2"]
        for what, values in cells.items():
            ci = mean_ci(values)
            out.append({"phase": name, "layout": what, "ms": ci.mean, "± 95% CI": ci.half_width,
                        "ms per layer": ci.mean / layers, "rounds": ci.n})
    return pd.DataFrame(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=2, help="processes (GPUs) of the one torchrun; at 1 both layouts "
                    "run on one rank and tp2 - dp2 is the split block's DTensor dispatch alone")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", choices=LAYOUTS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        answer = measure(a.child, a.layers, a.steps)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(answer), flush=True)
        return
    rows = pd.DataFrame([{"round": r, "layout": layout, "rank": rank, **phases}
                         for r in range(a.rounds) for layout in rounds.order(r, LAYOUTS)
                         for rank, phases in enumerate(child(layout, a.layers, a.steps, a.ranks)["ranks"])])
    rounds.write(rows, summary(rows, a.layers).to_markdown(index=False, floatfmt=".4g"), a.out, "tp_step")


if __name__ == "__main__":
    sys.exit(main())
