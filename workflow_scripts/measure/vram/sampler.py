"""The sampling loop: one tidy CSV row per device per sample, plus a summary dict (all memory in bytes, times in s).

CSV columns (``COLUMNS``): time_unix (s since the epoch), t_s (s since sampler start), backend, device (-1 = host),
used_bytes (device-wide, or the tree's RSS for host), total_bytes, process_bytes (the training tree's share; empty
where unknown), step (training step in progress from the step file; empty before the first step or without one).

Rows reach the disk in whole lines about once per ``flush_s`` (1 s), so a sampler killed mid-run leaves a CSV that
parses, missing at most the last second.
"""
from __future__ import annotations

import csv
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workflow_scripts.columns import SAMPLER_COLUMNS
from workflow_scripts.measure.step_signal import StepReader
from workflow_scripts.measure.vram.backends import Backend, ProcessTree, Reading, open_plan, plan

COLUMNS = SAMPLER_COLUMNS
GAP_FACTOR = 5  # a gap is a stretch of more than GAP_FACTOR * interval without a sample


@dataclass
class SamplerConfig:
    out_csv: str
    root_pid: int | None
    platform: str = "auto"        # cpu | cuda | rocm | auto
    backend: str = "auto"         # auto | nvml | amdsmi | torch | host
    interval_s: float = 0.1       # target seconds between samples
    step_file: str | None = None
    flush_s: float = 1.0          # seconds between CSV writes


def status_path(out_csv: str | os.PathLike) -> Path:
    """``<dir>/<csv stem>.status.json`` beside the timeline."""
    p = Path(out_csv)
    return p.with_name(p.stem + ".status.json")


def write_status(out_csv: str | os.PathLike, result: dict[str, Any]) -> None:
    """Write the status JSON atomically (a reader never sees half a file)."""
    path = status_path(out_csv)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, path)


def read_status(out_csv: str | os.PathLike) -> dict[str, Any] | None:
    try:
        return json.loads(status_path(out_csv).read_text())
    except (OSError, ValueError):
        return None


class Summary:
    """Running aggregates over rows; a new sample starts whenever t_s changes (all rows of one sample share it)."""

    def __init__(self, interval_s: float, backends: list[str]):
        self.interval_s = interval_s
        self.backends = list(backends)
        self.samples = 0
        self.first: float | None = None
        self.last: float | None = None
        self.gaps: list[list[float]] = []
        self.peak_used: dict[str, int | None] = {b: None for b in backends}
        self.peak_process: dict[str, int | None] = {b: None for b in backends}

    def add(self, t_s: float, backend: str, used: int | None, process: int | None) -> None:
        if t_s != self.last:
            if self.last is not None and t_s - self.last > GAP_FACTOR * self.interval_s:
                self.gaps.append([round(self.last, 3), round(t_s, 3)])
            self.first = t_s if self.first is None else self.first
            self.last = t_s
            self.samples += 1
        if backend not in self.peak_used:
            self.backends.append(backend)
            self.peak_used[backend] = self.peak_process[backend] = None
        for peaks, value in ((self.peak_used, used), (self.peak_process, process)):
            if value is not None and (peaks[backend] is None or value > peaks[backend]):
                peaks[backend] = value

    def result(self, status: str, reason: str | None) -> dict[str, Any]:
        span = (self.last - self.first) if self.samples >= 2 else 0.0
        return {"status": status, "backends": self.backends, "samples": self.samples,
                "peak_used_bytes": self.peak_used, "peak_process_bytes": self.peak_process,
                "interval_s": self.interval_s,
                "achieved_hz": round((self.samples - 1) / span, 3) if span > 0 else 0.0,
                "gaps": self.gaps, "reason": reason}


def _int_or_none(text: str) -> int | None:
    return int(text) if text not in ("", None) else None


def summarize_csv(out_csv: str | os.PathLike, interval_s: float, backends: list[str] | None = None) -> Summary:
    """Rebuild the summary from a timeline CSV (used when the sampler died); malformed rows are skipped."""
    summary = Summary(interval_s, backends or [])
    try:
        with open(out_csv, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    summary.add(float(row["t_s"]), row["backend"], _int_or_none(row["used_bytes"]),
                                _int_or_none(row["process_bytes"]))
                except (TypeError, ValueError, KeyError):
                    continue
    except OSError:
        pass
    return summary


class TimelineWriter:
    """Buffers CSV lines and writes them as whole lines with one unbuffered write every ``flush_s`` seconds."""

    def __init__(self, path: str | os.PathLike, flush_s: float):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "wb", buffering=0)
        self._pending: list[str] = [",".join(COLUMNS) + "\n"]
        self._flush_s = flush_s
        self._last_flush = time.monotonic()
        self.flush()

    def add(self, time_unix: float, t_s: float, backend: str, r: Reading, step: int | None) -> None:
        opt = lambda v: "" if v is None else str(v)  # noqa: E731
        self._pending.append(f"{time_unix:.6f},{t_s:.6f},{backend},{r.device},{r.used_bytes},{r.total_bytes},"
                             f"{opt(r.process_bytes)},{opt(step)}\n")

    def flush_if_due(self) -> None:
        if time.monotonic() - self._last_flush >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._f.write("".join(self._pending).encode())
            self._pending = []
        self._last_flush = time.monotonic()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._f.close()


class _Errors:
    """Per-backend sampling errors, kept as a count and the last message."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.last: dict[str, str] = {}

    def add(self, backend: str, e: Exception) -> None:
        self.count[backend] = self.count.get(backend, 0) + 1
        self.last[backend] = f"{type(e).__name__}: {e}"

    def notes(self) -> list[str]:
        return [f"{b}: {n} failed samples (last: {self.last[b]})" for b, n in self.count.items()]


def _tick(backends: list[Backend], tree: ProcessTree, steps: StepReader, t0: float, writer: TimelineWriter,
          summary: Summary, errors: _Errors) -> None:
    time_unix, t_s = time.time(), time.monotonic() - t0
    snapshot = tree.snapshot()
    try:
        step = steps.read()
    except Exception:  # a step file being rewritten: leave the column empty
        step = None
    for b in backends:
        try:
            readings = b.sample(snapshot)
        except Exception as e:
            errors.add(b.name, e)
            continue
        for r in readings:
            writer.add(time_unix, t_s, b.name, r, step)
            summary.add(t_s, b.name, r.used_bytes, r.process_bytes)


def run_sampler(config: SamplerConfig, stop: threading.Event) -> dict[str, Any]:
    """Sample until ``stop`` is set; returns the result dict (also written to the status JSON). Never raises for
    backend trouble: a missing library gives status 'unavailable', an unexpected error 'failed'."""
    t0 = time.monotonic()
    backends, notes, complete = open_plan(plan(config.platform, config.backend))
    summary = Summary(config.interval_s, [b.name for b in backends])
    status = "ok" if complete else "unavailable"
    errors = _Errors()
    writer: TimelineWriter | None = None
    try:
        writer = TimelineWriter(config.out_csv, config.flush_s)  # creates the folder
        write_status(config.out_csv, summary.result("running", "; ".join(notes) or None))
        tree, steps = ProcessTree(config.root_pid), StepReader(config.step_file)
        start, k = time.monotonic(), 0
        while backends:
            _tick(backends, tree, steps, t0, writer, summary, errors)
            writer.flush_if_due()
            # fixed-rate schedule; after an overrun skip to the next future slot instead of bursting
            now = time.monotonic()
            k = max(k + 1, math.ceil((now - start) / config.interval_s))
            if stop.wait(start + k * config.interval_s - now):
                break
    except Exception as e:  # noqa: BLE001 - report, do not raise into the caller
        status = "failed"
        notes.append(f"sampler error: {type(e).__name__}: {e}")
    finally:
        for b in backends:
            b.close()
        if writer is not None:
            writer.close()
    result = summary.result(status, "; ".join(notes + errors.notes()) or None)
    write_status(config.out_csv, result)
    return result
