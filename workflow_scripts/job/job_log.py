"""A job's own log and what a person reads when the job fails: everything the job and its children print goes to
its log (`redirect`, the rule's `--log`); on failure the job writes at most three lines to the stream Snakemake
shows (`failed`): what failed with the error's one-line summary, and where the full log is."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TextIO

ROOT_CAUSE = "root cause error: "  # job/launch.py prints it before the failed run's last line
LONGEST = 800  # characters of the error line shown: a full-disk error's path, free space and what stays intact


def redirect(log: str | None) -> TextIO:
    """Send this process's stdout and stderr (and its children's) into `log`; the stream the caller's stderr was,
    for the failure summary. Without a log, stderr itself."""
    if not log:
        return sys.stderr
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    shown = os.fdopen(os.dup(2), "w", buffering=1)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return shown


def error_line(text: str) -> str:
    """The error a run's output ends with: the root cause the launcher named (the first rank's failure:
    job/launch.py root_cause), else the last line naming an error (a rank's own, above torchrun's ChildFailedError
    tail), else its last line."""
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", ln.strip()) for ln in text.strip().splitlines() if ln.strip()]
    root = [ln.split(ROOT_CAUSE, 1)[1] for ln in lines if ROOT_CAUSE in ln]
    errors = [ln for ln in lines if ("Error" in ln or "error:" in ln) and "ChildFailedError" not in ln]
    return ((root or errors or lines or [""])[-1])[:LONGEST]


def summary(exc: BaseException) -> str:
    """An exception's one line: its type and the first line of its message."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def failed(shown: TextIO, what: str, code: int, why: str, log: str | None) -> None:
    """The failure as Snakemake's output shows it: `<what> failed (exit code N): <why>` and the log's path."""
    print(f"{what} failed (exit code {code}): {why}", file=shown, flush=True)
    if log:
        print(f"  full log: {log}", file=shown, flush=True)


def tail(log: str | None) -> str:
    """The error line of the log written so far ("" without one)."""
    if not log or not Path(log).exists():
        return ""
    sys.stdout.flush()
    sys.stderr.flush()
    return error_line(Path(log).read_text(errors="replace"))
