"""Where a GPU run's peak allocation comes from: a diagnostic, off unless the environment sets
PIPELINE_MEMORY_PEAK=<steps> (the run's losses do not change, so it is not part of the run's configuration). Its
steps synchronise the device and record every allocation's stack: they are marked `profiled` in metrics.csv and left
out of the run's timing like a profiler's (MemoryPeak.recording), and the variable is in the run's provenance.

Rank 0 records torch's CUDA allocator history (torch.cuda.memory._record_memory_history, Python stacks) from the
first training step for <steps> steps, replays it and writes <run_dir>/memory_peak.json:

    recorded_peak_bytes   the allocated bytes at the highest point of the replay (checked against
                          torch.cuda.max_memory_allocated over the same steps: `torch_peak_bytes`)
    peak_step             the 1-based step in which it happened, and `peak_event`: the code whose allocation hit it
    alive                 the blocks alive at that point, grouped by the code that allocated them (the innermost
                          frame of our code, transformers, DeepSpeed or torch's optim / distributed / autograd;
                          "before step 1" = what existed when recording began: parameters, engine buffers)

The memory model (workflow_scripts/plan) is checked part by part against these groups.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "PIPELINE_MEMORY_PEAK"
KEEP = ("workflow_scripts/", "transformers/", "deepspeed/", "torch/optim/", "torch/nn/parallel/",
        "torch/distributed/", "torch/utils/checkpoint", "torch/autograd/", "torch/_dynamo/", "torch/_inductor/",
        "peft/")


def frame_group(frames: list[dict]) -> str:
    """`file:function` of the innermost frame from code we can name (else the innermost frame)."""
    for f in frames:
        name = f.get("filename", "")
        for key in KEEP:
            at = name.find(key)
            if at >= 0:
                return f"{name[at:]}:{f.get('name')}"
    return f"{frames[0].get('filename')}:{frames[0].get('name')}" if frames else "(no Python frame)"


def replay(trace: list[dict], baseline: float, step_marks: list[int]) -> dict:
    """The peak of a recorded allocator trace and what was alive there. `step_marks[i]` = the number of trace
    events when step i + 1 ended."""
    alive: dict[int, tuple[int, str]] = {}
    before = now = peak = peak_before = baseline  # `before`: what is left of the blocks that predate recording
    peak_at, peak_alive, peak_event = 0, {}, ""
    for i, ev in enumerate(trace):
        action = ev.get("action")
        if action == "alloc":
            alive[ev["addr"]] = (ev["size"], frame_group(ev.get("frames") or []))
            now += ev["size"]
            if now > peak:
                peak, peak_at, peak_event, peak_before = now, i, alive[ev["addr"]][1], before
                peak_alive = dict(alive)
        elif action == "free_requested":
            if ev["addr"] in alive:
                now -= alive.pop(ev["addr"])[0]
            else:  # a block allocated before recording began (e.g. DDP's buckets, rebuilt after step 1)
                now -= ev["size"]
                before -= ev["size"]
    groups: dict[str, list[float]] = {}
    for size, group in peak_alive.values():
        g = groups.setdefault(group, [0.0, 0])
        g[0] += size
        g[1] += 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])
    step = next((s + 1 for s, mark in enumerate(step_marks) if peak_at < mark), len(step_marks))
    return {"recorded_peak_bytes": peak, "peak_step": step, "peak_event": peak_event,
            "alive": [{"group": "before step 1", "bytes": peak_before, "blocks": None}]
            + [{"group": k, "bytes": v[0], "blocks": v[1]} for k, v in ranked]}


def refused(spec: dict) -> str | None:
    """Why this diagnostic cannot record this run, checked by the launcher before any rank starts (a diagnostic
    never changes or crashes training); None when it can, or is not asked for."""
    if not os.environ.get(ENV) or spec["platform"] == "cpu":
        return None
    t = spec["train"]
    if t.get("gradient_checkpointing") and t.get("compile_blocks") is True:
        return (f"{ENV}: torch's allocator history with Python stacks crashes compiled, checkpointed blocks "
                "(`SystemError: <built-in method apply of FunctionMeta object> returned NULL`, torch 2.11, H100): "
                f"unset {ENV} for this run, or record it with train.compile_blocks: false (the eager peak)")
    return None


class MemoryPeak:
    """Around the step loop: `start()` after the peak statistics are reset, `step()` after every step."""

    def __init__(self, ctx, out_dir: Path):
        steps = os.environ.get(ENV)
        self.steps = int(steps) if steps and ctx.device.type == "cuda" and ctx.rank == 0 else 0
        self.ctx, self.out_dir, self.marks, self.baseline, self.done = ctx, Path(out_dir), [], 0.0, False

    def recording(self, step: int, first: int) -> bool:
        """Whether 0-based `step` is one this run records (the `steps` from its first, `first`)."""
        return bool(self.steps) and first <= step < first + self.steps

    def start(self) -> None:
        if self.steps:
            import torch  # not at the top: the launcher imports refused() and never torch (training/context.py)

            self.baseline = torch.cuda.memory_allocated(self.ctx.device)
            torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")

    def step(self) -> None:
        if not self.steps or self.done:
            return
        import torch

        torch.cuda.synchronize(self.ctx.device)
        snapshot = torch.cuda.memory._snapshot()
        trace = snapshot["device_traces"][self.ctx.device.index or 0]
        self.marks.append(len(trace))
        if len(self.marks) < self.steps:
            return
        torch.cuda.memory._record_memory_history(enabled=None)
        out = replay(trace, self.baseline, self.marks)
        out["torch_peak_bytes"] = torch.cuda.max_memory_allocated(self.ctx.device)
        out["recorded_steps"] = self.steps
        (self.out_dir / "memory_peak.json").write_text(json.dumps(out, indent=2))
        self.done = True
