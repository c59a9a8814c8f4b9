"""A training job never outlives the workflow that started it.

Snakemake runs a job as `bash -c '... python -m workflow_scripts.job.launch ...'`; when Snakemake alone is
killed (SIGKILL from a batch system, the OOM killer, a closed terminal) the shell and the launcher are not, and
the launcher would train to the end and write outputs nobody collects. The launcher therefore watches its
ancestry up to the Snakemake that started it (watched): it records each ancestor and that ancestor's parent when it
starts, and when any of them changes (an ancestor died, its child was adopted by init or a subreaper) it kills
torchrun (whose ranks die with it: loop.die_with_parent) and exits; the VRAM sampler stops when its stdin, the
launcher's pipe, closes. What lies above Snakemake is not watched: a workflow started with `nohup ... &` from a
shell that then exits lives on, and so do its jobs. A launcher with no Snakemake above it watches its parent. Linux
only (/proc); elsewhere nothing is watched.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.5


def parent_of(pid: int) -> int | None:
    """The parent pid from /proc/<pid>/stat (the field after the command name, which may hold spaces)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def command_of(pid: int) -> str:
    """/proc/<pid>/cmdline with spaces between the arguments; "" when the process is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def is_snakemake(pid: int) -> bool:
    """Whether the process is Snakemake itself (`snakemake ...` or `python -m snakemake ...`), not a job whose
    command merely names a file under .snakemake/."""
    argv = command_of(pid).split()
    return bool(argv) and (Path(argv[0]).name == "snakemake"
                           or any(a == "-m" and b == "snakemake" for a, b in zip(argv, argv[1:], strict=False))
                           or (len(argv) > 1 and Path(argv[1]).name == "snakemake"))


def pdeathsig():
    """A preexec function for a child that must not outlive this process (Linux: the kernel sends it SIGKILL when
    its parent dies); None elsewhere. libc is loaded here, before the fork: the child only calls prctl."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def ancestry(pid: int) -> list[tuple[int, int]]:
    """(ancestor, its parent) from pid's parent up to init."""
    chain, current = [], os.getppid() if pid == os.getpid() else parent_of(pid)
    while current and current > 1:
        parent = parent_of(current)
        if parent is None:
            break
        chain.append((current, parent))
        current = parent
    return chain


def watched(chain: list[tuple[int, int]],
            snakemake: Callable[[int], bool] = is_snakemake) -> list[tuple[int, int | None]]:
    """The part of an ancestry a job depends on: up to the Snakemake that started it, which must stay alive but
    may be adopted (its parent None: not compared); without a Snakemake above, the launcher's parent alone."""
    for i, (pid, _) in enumerate(chain):
        if snakemake(pid):
            return [*chain[:i], (pid, None)]
    return chain[:1]


def broken(chain: list[tuple[int, int | None]]) -> str | None:
    """Which ancestor is gone or was re-parented since `chain` was recorded (a parent of None: gone only), or
    None."""
    if chain and os.getppid() != chain[0][0]:
        return f"this launcher's parent {chain[0][0]} is gone"
    for pid, parent in chain:
        now = parent_of(pid)
        if now is None or (parent is not None and now != parent):
            return f"ancestor {pid} " + ("is gone" if now is None else f"lost its parent {parent}")
    return None


def watch(on_orphaned: Callable[[str], None], poll_s: float = POLL_S) -> threading.Thread | None:
    """Start a daemon thread that calls on_orphaned(reason) once when the ancestry breaks."""
    if not sys.platform.startswith("linux"):
        return None
    chain = watched(ancestry(os.getpid()))

    def run():
        stop = threading.Event()
        while not stop.wait(poll_s):
            reason = broken(chain)
            if reason:
                on_orphaned(reason)
                return

    thread = threading.Thread(target=run, name="workflow-watch", daemon=True)
    thread.start()
    return thread
