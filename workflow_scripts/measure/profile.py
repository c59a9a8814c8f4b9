"""torch.profiler over a window of training steps, one Kineto trace per rank (config `profile`, default off).

    profile: {enabled: true, at: end, warmup: 1, active: 3, ranks: all}

The window is `warmup` steps traced but discarded (the profiler's own start-up), then `active` steps recorded. With
`at: end` (the default) they are the run's last steps, so no timed step follows a trace: Kineto leaves CUPTI
subscribed when a trace ends (pytorch/pytorch#144455), and every later step of the process runs 17 % slower
(GPT-2-medium, one H100). With `at: start` the window opens
after the run's timing warm-up plus `wait` steps, and the steps timed after it carry that after-effect. The window's
steps carry `profiled = true` in metrics.csv and are left out of throughput, MFU and the phase medians
(measure.metrics.steady), like the timing warm-up. The trace of
rank r goes to <trace_dir>/rank<r>.json.gz (gzip: a GPU step of a billion-parameter model is tens of MB raw);
report.traces analyses it. The engine's step is annotated (forward / backward / optimizer) only while tracing.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from workflow_scripts import schema
from workflow_scripts.run_spec import RunSpec


def traced_ranks(cfg: dict, world_size: int) -> list[int]:
    ranks = cfg["ranks"]
    return list(range(world_size)) if ranks == "all" else sorted(r for r in ranks if r < world_size)


def window(cfg: dict, timed_from: int, total_steps: int) -> range:
    """The 0-based steps under the profiler (its warm-up, then the recorded ones): the run's last ones (`at: end`),
    or from `wait` steps after the timing warm-up (`at: start`); never a step of the timing warm-up. Empty where the
    run leaves no step to record."""
    steps = cfg["warmup"] + cfg["active"]
    if cfg["at"] == "end":
        start = max(total_steps - steps, timed_from)
    else:
        start = timed_from + cfg["wait"]
    stop = min(start + steps, total_steps)
    return range(start, stop) if stop > start + cfg["warmup"] else range(start, start)


class StepProfiler:
    """`with StepProfiler(...) as prof:` around the step loop; `prof.step()` after every step."""

    def __init__(self, spec: RunSpec, ctx, first_step: int, total_steps: int):
        cfg = schema.filled("profile", spec.profile)  # a run without profiling carries no section: the schema's
        self.enabled = bool(cfg["enabled"]) and ctx.rank in traced_ranks(cfg, ctx.world_size)
        self.window = window(cfg, first_step + spec.train["timing_warmup_steps"], total_steps)
        self.active_from = self.window.start + cfg["warmup"]
        if self.enabled and not spec.trace_dir:
            raise ValueError(f"run {spec.run_id}: profile.enabled without a trace_dir (study.resolve gives a "
                             "profiled run one)")
        self.path = Path(spec.trace_dir) / f"rank{ctx.rank}.json.gz" if self.enabled else None
        self.first_step, self.cfg, self.ctx, self.prof, self.written = first_step, cfg, ctx, None, False

    def profiled(self, step: int) -> bool:
        """Whether this 0-based step runs under the profiler (warm-up or recorded): left out of the timing."""
        return bool(self.cfg["enabled"]) and step in self.window

    def __enter__(self):
        if not self.enabled or not len(self.window):
            return self
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.ctx.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        schedule = torch.profiler.schedule(skip_first=self.window.start - self.first_step, wait=0,
                                           warmup=self.active_from - self.window.start,
                                           active=self.window.stop - self.active_from, repeat=1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.prof = torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=self._write,
                                           record_shapes=bool(self.cfg["record_shapes"]),
                                           with_stack=bool(self.cfg["with_stack"]),
                                           profile_memory=bool(self.cfg["memory"]))
        self.prof.__enter__()
        return self

    def _write(self, prof) -> None:
        prof.export_chrome_trace(str(self.path))
        self.written = True

    def annotate(self, engine) -> None:
        """Named ranges for the engine's phases while a trace is taken (report.traces reads them)."""
        engine.phase = torch.profiler.record_function if self.prof is not None else None

    def step(self, step: int) -> bool:
        """Advance the schedule after 0-based `step`; True on every rank when the window closed with it: the traced
        ranks export then (seconds, which the next step must not count, nor an untraced rank waiting for them)."""
        if self.prof is not None and not self.written:
            self.prof.step()
        return bool(self.cfg["enabled"]) and len(self.window) > 0 and step == self.window.stop - 1

    def __exit__(self, *exc):
        if self.prof is not None:
            self.prof.__exit__(*exc)
        return False


def phase(engine, name: str):
    """The engine's step phases as profiler ranges, or nothing when no trace is taken."""
    record = getattr(engine, "phase", None)
    return record(name) if record is not None else contextlib.nullcontext()
