"""Memory timeline sampler that runs beside a training job (VRAM through nvml/amdsmi/torch, host RAM through psutil).

    from workflow_scripts.measure.vram import start_sampler
    handle = start_sampler("run/vram.csv", root_pid=proc.pid, platform="cuda")
    ...
    result = handle.stop()   # never raises

The sampler is a separate process (``python -m workflow_scripts.measure.vram --root-pid ...``), so it never competes
with training threads for the GIL. It stops when ``stop()`` closes its stdin, which also happens if the launcher dies.
Units: bytes for memory, seconds for time. CSV columns: see ``sampler.COLUMNS``; result dict: see ``SamplerHandle``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from workflow_scripts.measure.vram.backends import plan
from workflow_scripts.measure.vram.sampler import COLUMNS, read_status, status_path, summarize_csv, write_status

__all__ = ["start_sampler", "SamplerHandle", "COLUMNS", "status_path"]

_REPO_ROOT = Path(__file__).resolve().parents[2]


def _describe_exit(rc: int | None) -> str:
    if rc is None:
        return "sampler process did not exit"
    if rc < 0:
        try:
            return f"sampler process killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"sampler process killed by signal {-rc}"
    return f"sampler process exited with code {rc}"


class SamplerHandle:
    """A running sampler. ``stop()`` ends it and returns (once; later calls return the same dict):

    {"status": "ok"|"failed"|"unavailable", "backends": [names], "samples": int,
     "peak_used_bytes": {backend: bytes|None}, "peak_process_bytes": {backend: bytes|None}, "interval_s": float,
     "achieved_hz": float, "gaps": [[t_start, t_end], ...], "reason": str|None}

    'unavailable': a requested backend could not be opened (whatever did open, e.g. host, still sampled).
    'failed': the sampler process could not start, crashed or was killed; the summary is rebuilt from the rows
    it had written. The same dict is written to ``<csv stem>.status.json``.
    """

    def __init__(self, out_csv: Path, interval_s: float, proc: subprocess.Popen | None, error: str | None,
                 stderr: Any = None):
        self.out_csv, self.interval_s = out_csv, interval_s
        self._proc, self._error, self._stderr = proc, error, stderr
        self._result: dict[str, Any] | None = None

    @property
    def pid(self) -> int | None:
        """The sampler process id (None if it never started)."""
        return self._proc.pid if self._proc is not None else None

    def stop(self, timeout_s: float = 15.0) -> dict[str, Any]:
        if self._result is None:
            try:
                self._result = self._stop(timeout_s)
            except Exception as e:  # noqa: BLE001 - stop() must never raise
                self._result = {"status": "failed", "backends": [], "samples": 0, "peak_used_bytes": {},
                                "peak_process_bytes": {}, "interval_s": self.interval_s, "achieved_hz": 0.0,
                                "gaps": [], "reason": f"stop() error: {type(e).__name__}: {e}"}
            finally:
                if self._stderr is not None:
                    self._stderr.close()
                    self._stderr = None
        return self._result

    def _stop(self, timeout_s: float) -> dict[str, Any]:
        proc = self._proc
        if proc is None:
            return self._failed(self._error or "sampler not started")
        early = proc.poll() is not None
        if not early:
            try:
                proc.stdin.close()  # EOF on its stdin = stop
            except OSError:
                pass
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return self._failed(f"sampler did not stop within {timeout_s} s; killed")
        status = read_status(self.out_csv)
        if proc.returncode == 0 and status and status.get("status") != "running" and not early:
            return status
        why = _describe_exit(proc.returncode) + (" before stop() was called" if early else "")
        return self._failed(why, status)

    def _failed(self, reason: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
        """A 'failed' result from whatever rows reached the CSV; the worker's own status notes are kept."""
        backends = (status or {}).get("backends") or []
        result = summarize_csv(self.out_csv, self.interval_s, backends).result("failed", reason)
        notes = [reason, (status or {}).get("reason"), self._stderr_tail()]
        result["reason"] = "; ".join(n for n in notes if n)
        try:
            write_status(self.out_csv, result)
        except OSError:
            pass
        return result

    def _stderr_tail(self) -> str | None:
        if self._stderr is None:
            return None
        try:
            self._stderr.seek(0)
            lines = self._stderr.read().decode(errors="replace").strip().splitlines()
            return f"stderr: {lines[-1]}" if lines else None
        except (OSError, ValueError):
            return None


def start_sampler(out_csv: str | os.PathLike, root_pid: int, platform: str = "auto", backend: str = "auto",
                  interval_s: float | None = None, step_file: str | os.PathLike | None = None) -> SamplerHandle:
    """Start sampling the process tree under ``root_pid`` into ``out_csv`` every ``interval_s`` seconds (default:
    the config's `sampler.interval_s` default).

    platform: 'cpu' | 'cuda' | 'rocm' ('auto' guesses from /dev). backend: 'auto' | 'nvml' | 'amdsmi' | 'torch' |
    'host'. step_file: the file ``StepPublisher`` writes (the PIPELINE_STEP_FILE of the run).
    Invalid arguments raise ValueError; anything going wrong at run time is reported by ``stop()`` instead.
    """
    plan(platform, backend)  # validates the names
    if interval_s is None:
        from workflow_scripts import schema

        interval_s = schema.default("sampler", "interval_s")
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")
    out = Path(out_csv).resolve()
    cmd = [sys.executable, "-m", "workflow_scripts.measure.vram", "--out", str(out), "--root-pid", str(int(root_pid)),
           "--platform", platform, "--backend", backend, "--interval", repr(float(interval_s)), "--stop-on-eof"]
    if step_file:
        cmd += ["--step-file", str(Path(step_file).resolve())]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        status_path(out).unlink(missing_ok=True)  # never read a previous run's status
        stderr = tempfile.TemporaryFile()
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                start_new_session=True)  # the terminal's Ctrl-C goes to training, not here
    except Exception as e:  # noqa: BLE001
        return SamplerHandle(out, interval_s, None, f"could not start sampler: {type(e).__name__}: {e}")
    return SamplerHandle(out, interval_s, proc, None, stderr)
