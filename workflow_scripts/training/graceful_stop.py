"""SIGTERM stops a training job at the next step boundary, after a checkpoint; Snakemake's rerun resumes from it.

Where the signal goes, top to bottom (Linux):
  Snakemake   its own SIGTERM handler starts no new job and waits for the running ones; `forward_from_workflow`
              (the Snakefile's `onstart`) adds: pass SIGTERM on to each running training launcher below it.
  launcher    `LauncherStop`: forwards SIGTERM once to torchrun, which runs in a process group of its own (a
              signal to the workflow's group reaches the launcher, not torchrun twice), and stops watching its
              ancestry (the job's shell may die of the same signal); torchrun dies with the launcher
              (`workflow_watch.pdeathsig`), so a SIGKILL still leaves nothing behind.
  torchrun    passes SIGTERM to every rank and waits 30 s before SIGKILL (torch.distributed.elastic).
  each rank   `RankStop`: the handler only sets a flag; at each step boundary the ranks read the vote started at
              the boundary before (a one-integer all-reduce over a gloo group, run by gloo's own thread during the
              step: host memory, no device synchronisation; reading it and starting the next take 0.2-0.4 ms of
              the host on CPU ranks, benchmarks/2026-12-08-stop-vote-cost-cpu.md) and start the next; where
              it says stop, they save a checkpoint at that step and leave with STOPPED_EXIT after rank 0 wrote
              `stopped.json`. A run of one rank reads its flag alone.
The job then fails (exit STOPPED_EXIT) with one line saying at which step it stopped: Snakemake marks its outputs
incomplete and `snakemake --rerun-incomplete` resumes from that checkpoint (training/checkpoint.py).

This module imports no torch at module level: the Snakefile imports it.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from workflow_scripts.training import workflow_watch

STOPPED_EXIT = 128 + signal.SIGTERM  # what a process killed by SIGTERM returns to its shell
STOPPED_MARKER = "stopped.json"  # in the run's output directory, written by rank 0
LAUNCHER_MODULE = "workflow_scripts.job.launch"


# ---------------------------------------------------------------- Snakemake
def launchers_below(root: int) -> list[int]:
    """The training launchers (python -m workflow_scripts.job.launch) among root's descendants; not the
    shells that run them, which die of SIGTERM and would orphan their launcher."""
    parents = {int(e.name): workflow_watch.parent_of(int(e.name)) for e in Path("/proc").iterdir() if e.name.isdigit()}
    below, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - below
        below |= frontier
    return sorted(pid for pid in below if is_launcher(workflow_watch.command_of(pid).split()))


def is_launcher(argv: list[str]) -> bool:
    return len(argv) >= 3 and "python" in Path(argv[0]).name and argv[1:3] == ["-m", LAUNCHER_MODULE]


def forward_from_workflow() -> None:
    """In the Snakemake process, after its scheduler installed its own SIGTERM handler: keep that handler and pass
    the signal on to the running training launchers."""
    if not sys.platform.startswith("linux"):
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        for pid in launchers_below(os.getpid()):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)


# ---------------------------------------------------------------- the launcher
class LauncherStop:
    """The launcher's side: forward SIGTERM to torchrun once; report how the run ended."""

    def __init__(self):
        self.requested = False
        self.proc = None

    def start(self, cmd: list[str], env: dict):
        """torchrun in its own process group, killed by the kernel when this launcher dies."""
        import subprocess

        self.proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=workflow_watch.pdeathsig())
        signal.signal(signal.SIGTERM, self._on_term)
        return self.proc

    def _on_term(self, signum, frame):
        if self.requested:
            return
        self.requested = True
        print("launch: SIGTERM: the ranks stop at the next step boundary, after a checkpoint", flush=True)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    @staticmethod
    def stopped_at(out_dir: Path) -> int | None:
        marker = out_dir / STOPPED_MARKER
        return json.loads(marker.read_text())["step"] if marker.exists() else None


# ---------------------------------------------------------------- a rank
class RankStop:
    """A rank's side: SIGTERM sets a flag; `agreed()` at a step boundary is True on every rank or on none."""

    def __init__(self, world_size: int):
        import torch.distributed as dist

        self.flag = False
        self.group = None
        self.pending = None  # the vote started at the last boundary: (its work handle, its tensor)
        if world_size > 1:  # NCCL would synchronise the device for one integer: agree over gloo, on the host
            self.group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum, frame):
        self.flag = True

    def agreed(self) -> bool:
        """Whether every rank stops here: the vote started at the previous boundary (a signal is acted on one step
        after the boundary it reached a rank by; every rank calls this at the same boundaries, so the votes pair up),
        and this boundary's vote started for the next."""
        if self.group is None:
            return self.flag
        import torch
        import torch.distributed as dist

        stop = self.finish()
        votes = torch.tensor([int(self.flag)], dtype=torch.int32)
        self.pending = (dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.group, async_op=True), votes)
        return stop

    def finish(self) -> bool:
        """The vote in flight, waited for (done long since at a step boundary); False where none is."""
        if self.pending is None:
            return False
        work, votes = self.pending
        self.pending = None
        work.wait()
        return bool(votes.item())

    @staticmethod
    def leave(out_dir: Path, step: int, rank: int) -> None:
        """After the checkpoint of `step` is complete on every rank (the launcher says so in the job's log)."""
        if rank == 0:
            (out_dir / STOPPED_MARKER).write_text(json.dumps({"step": step}))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(STOPPED_EXIT)


def signal_workflow(at_step: int) -> None:
    """Test hook (train.fault_injection.sigterm_workflow_at_step), rank 0: SIGTERM to the nearest Snakemake
    process above this rank, else to this rank's launcher (rank -> torchrun -> launcher)."""
    chain = [pid for pid, _ in workflow_watch.ancestry(os.getpid())]
    target = next((pid for pid in chain if workflow_watch.is_snakemake(pid)), None)
    target = target or (chain[1] if len(chain) > 1 else os.getppid())
    print(f"fault injection: SIGTERM to process {target} at step {at_step}", flush=True)
    os.kill(target, signal.SIGTERM)
