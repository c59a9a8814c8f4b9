"""Do steps run slower once torch.profiler has traced a window of them? The steps before and after a window, against
a process that never profiles, on one GPU.

    python -m experiments.step_overheads.profiler_aftereffect --rounds 3 --out DIR

Kineto leaves CUPTI subscribed when a trace ends unless TEARDOWN_CUPTI=1 (pytorch/pytorch#144455), which would slow
every later launch: a run whose timed steps follow its profile window would then time the profiler's after-effect.
Each variant is its own process (a fresh CUDA context), the variants interleaved within a round:

- `off`: no profiler;
- `window`: the harness's own StepProfiler (measure.profile) over steps WINDOW, its defaults (1 warm-up, 3 recorded);
- `window_teardown`: the same with TEARDOWN_CUPTI=1 in the environment.

The model: GPT-2-medium's shape (24 layers, 1,024 wide, sequence 1,024, vocabulary 50,304), micro-batch 4, bf16
autocast over fp32 parameters, fused AdamW, eager: a step of the committed one-GPU rows (~0.1 s), partly
host-bound. A block's time is the wall time between two device synchronisations, divided by its steps. Writes
profiler_aftereffect.csv (rounds) and profiler_aftereffect.md per variant, mean and 95% CI: after / before in one
process, and its steps after the window against the `off` process's same steps in the same round (the paired
comparison: the early `before` steps still carry the process's own warm-up). The harness's window is at a run's
end since (measure.profile, `profile.at`); this script places it as it was (`at: start`).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from experiments import rounds

VARIANTS = ("off", "window", "window_teardown")
BEFORE, WINDOW, AFTER = range(5, 15), range(15, 19), range(20, 60)  # 0-based steps


def steps(variant: str, micro_batch: int, wrap=None, blocks: bool = False) -> dict:
    """One process: its blocks' seconds a step (the child's side); `wrap(model)` returns the module that runs the
    forward (ddp_wrapper: DistributedDataParallel); `blocks` compiles each block first, as the harness's
    compiled-blocks lever does (training/strategies/engine.compile_blocks)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from workflow_scripts.measure.profile import StepProfiler

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: only to try the script
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    config = GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024, vocab_size=50304)
    model = GPT2LMHeadModel(config).to(device)
    for block in model.transformer.h if blocks else ():
        block.compile()
    forward = wrap(model) if wrap else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    tokens = torch.randint(0, config.vocab_size, (micro_batch, 1024), device=device)
    spec = SimpleNamespace(profile={"enabled": variant != "off", "at": "start", "wait": WINDOW.start},
                           train={"timing_warmup_steps": 0}, trace_dir=tempfile.mkdtemp())
    profiler = StepProfiler(spec, SimpleNamespace(rank=0, world_size=1, device=device), 0, AFTER.stop)
    assert variant == "off" or (profiler.window.start, profiler.window.stop) == (WINDOW.start, WINDOW.stop)
    marks = {}
    with profiler:
        for step in range(AFTER.stop):
            if step in (BEFORE.start, BEFORE.stop, AFTER.start):
                sync()
                marks[step] = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = forward(input_ids=tokens, labels=tokens).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            profiler.step(step)
        sync()
        marks[AFTER.stop] = time.perf_counter()
    return {"before_s": (marks[BEFORE.stop] - marks[BEFORE.start]) / len(BEFORE),
            "after_s": (marks[AFTER.stop] - marks[AFTER.start]) / len(AFTER), "traced": profiler.written}


def child(variant: str, micro_batch: int) -> dict:
    env = {**os.environ, "TEARDOWN_CUPTI": "1"} if variant == "window_teardown" else {
        k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    return rounds.child(__spec__.name, ["--child", variant, "--micro-batch", str(micro_batch)], env)


def summary(done: pd.DataFrame) -> pd.DataFrame:
    from workflow_scripts.report.stats import mean_ci

    rows = []
    for variant, df in done.groupby("variant", sort=False):
        ratio, paired, before, after = (mean_ci(df[c]) for c in ("after_over_before", "after_over_off", "before_s",
                                                                  "after_s"))
        rows.append({"variant": variant, "rounds": ratio.n, "before (ms)": 1e3 * before.mean,
                     "after (ms)": 1e3 * after.mean, "after / before": ratio.mean, "± 95% CI": ratio.half_width,
                     "after / off's after, same round": paired.mean, "± 95% CI ": paired.half_width})
    return pd.DataFrame(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(steps(a.child, a.micro_batch)), flush=True)
        return
    rows = [{"round": r, "variant": v, "micro_batch": a.micro_batch, **child(v, a.micro_batch)}
            for r in range(a.rounds) for v in VARIANTS]
    done = pd.DataFrame(rows).assign(after_over_before=lambda d: d.after_s / d.before_s)
    off_after = done[done.variant == "off"].set_index("round").after_s
    done["after_over_off"] = done.after_s / done["round"].map(off_after)
    rounds.write(done, summary(done).to_markdown(index=False, floatfmt=".4g"), a.out, "profiler_aftereffect")


if __name__ == "__main__":
    main()
