"""The lever trial (rule lever_trial; config `auto_levers.by: measurement`): what `auto` means for one
configuration (model x strategy x layout, all its repeats), decided by timing it on the study's own machine.

Each candidate lever set (training/levers.py CANDIDATES: eager, the compiled loss, compiled blocks, the whole
model compiled, the same replayed as CUDA graphs) trains the configuration for `train.timing_warmup_steps` +
`auto_levers.steps` steps through the pipeline's own launcher, one after another in one job (a timed job: nothing
else runs beside it). The fastest candidate that finished is chosen: the file says which, what every candidate
measured (tokens/s, MFU, peak memory, the first steps' losses) and why the others were left out; the training
runs read it at launch (levers.apply_trial) and record the choice in `compile_auto`. Compilation happens inside
the warm-up steps, so it counts for nothing; each candidate's wall time is recorded beside its speed.

Where no candidate finishes, the choice is eager (the settings every strategy runs), said so in `why`. A candidate
stopped by SIGTERM (the workflow stopping: training/graceful_stop.py) ends the trial there, without a verdict.

    python -m workflow_scripts.job.lever_trial --trial <trial file> --out <verdict> --log <job log>

The trial file (study.lever_trial_specs, written by rules/common.smk) holds each candidate's run spec; a failed
trial's own output is its error in two lines, the rest in its log (job/job_log.py).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from workflow_scripts import columns as C
from workflow_scripts.job import job_log
from workflow_scripts.run_spec import RunSpec
from workflow_scripts.status import RunStatus
from workflow_scripts.training import graceful_stop, levers
from workflow_scripts.units import GIB


def write_spec(spec: Mapping) -> Path:
    """A run spec (a RunSpec, or a benchmark runner's spec mapping with its own keys) into its out_dir."""
    Path(spec["out_dir"]).mkdir(parents=True, exist_ok=True)
    path = Path(spec["out_dir"]) / C.RUN_SPEC
    path.write_text(spec.to_json() if isinstance(spec, RunSpec) else json.dumps(spec, indent=2))
    return path


def run_logged(cmd: list[str], log: Path, env=None) -> tuple[int, str]:
    """Run a command with its output in `log` (and echoed into the job's log); on failure, its last lines."""
    print(" ".join(cmd), flush=True)
    with open(log, "w") as f:
        proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    text = log.read_text(errors="replace")
    print(text, flush=True)
    if proc.returncode == 0:
        return 0, ""
    lines = text.strip().splitlines()
    return proc.returncode, " | ".join([job_log.error_line(text)] + lines[-4:])


def outcome(code: int, tail: str, summary: Path, what: str) -> dict:
    """A run's summary, or a failed status with the command's last lines."""
    if code != 0 or not summary.exists():
        return {"status": RunStatus.FAILED, "reason": f"{what} exit code {code}: {tail}"}
    return json.loads(summary.read_text())


def run_launcher(spec: Mapping) -> dict:
    """One run spec through the pipeline's launcher (job/launch.py); its summary."""
    path = write_spec(spec)
    code, tail = run_logged([sys.executable, "-m", "workflow_scripts.job.launch", "--spec", str(path)],
                            path.parent / "launch.log")
    if code == graceful_stop.STOPPED_EXIT:  # the workflow was asked to stop (SIGTERM): no further run starts
        raise SystemExit(code)
    return outcome(code, tail, Path(spec["out_dir"]) / C.SUMMARY, "launch")


def measured(s: dict) -> dict:
    """What a trial row (and every benchmark row) takes from a run's summary."""
    peak = s.get("peak_allocated_bytes")
    return {"status": s.get("status"), "tokens_per_s": s.get("tokens_per_s"), "mfu": s.get("mfu"),
            "peak_allocated_gib": None if peak is None else peak / GIB, "final_loss": s.get("final_loss")}


def first_losses(out_dir: Path, n: int = 3) -> list[float]:
    """The first steps' losses of a candidate's run (the candidates train the same steps: a lever that changed the
    numerics shows here)."""
    import csv

    path = out_dir / C.METRICS
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [round(float(r["loss"]), 5) for r, _ in zip(csv.DictReader(f), range(n))]


def choose(rows: list[dict], skipped: dict) -> dict:
    """The trial's verdict from its rows: the fastest candidate that finished (eager where none did)."""
    ok = [r for r in rows if r["status"] == RunStatus.OK and r["tokens_per_s"]]
    others = ", ".join(f"{r['candidate']} {r['tokens_per_s']:,.0f}" for r in ok)
    left = "; ".join([f"{r['candidate']} {r['status']}" for r in rows if r not in ok]
                     + [f"{k} not run ({why})" for k, why in skipped.items()])
    if ok:
        best = max(ok, key=lambda r: r["tokens_per_s"])
        why = f"measured: {best['candidate']} fastest (tokens/s: {others})"
    else:
        best = {"candidate": "eager"}
        why = "measured: no candidate finished, eager"
    return {"chosen": best["candidate"], "chosen_train": levers.CANDIDATES[best["candidate"]],
            "why": why + (f"; {left}" if left else "")}


def trial(specs: dict[str, RunSpec], skipped: dict[str, str]) -> dict:
    """Every candidate's run (specs: name -> run spec), one after another; the verdict and the rows."""
    rows = []
    for name, spec in specs.items():
        print(f"candidate {name}: {json.dumps(levers.CANDIDATES[name], sort_keys=True)}", flush=True)
        started = time.time()
        s = run_launcher(spec)
        rows.append({"candidate": name, **measured(s), "wall_s": round(time.time() - started, 1),
                     "first_losses": first_losses(Path(spec.out_dir)), "reason": s.get("reason")})
    return {**choose(rows, skipped), "candidates": rows, "skipped": skipped}


def read_trial(path: str) -> tuple[dict[str, RunSpec], dict[str, str]]:
    """A trial file: {"specs": {candidate: run spec}, "skipped": {candidate: why}}, each spec's version checked."""
    plan = json.loads(Path(path).read_text())
    specs = {name: RunSpec.from_dict(d, f"{path}: specs.{name}") for name, d in plan["specs"].items()}
    return specs, plan["skipped"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trial", required=True,
                    help='the trial file: {"specs": {candidate: run spec}, "skipped": {candidate: why}}')
    ap.add_argument("--out", required=True)
    ap.add_argument("--log", help="the job's log: all output goes there, a failure is two lines on stderr")
    a = ap.parse_args(argv)
    shown = job_log.redirect(a.log)
    try:
        result = trial(*read_trial(a.trial))
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
        print(result["why"], flush=True)
    except SystemExit as stop:  # a candidate stopped by SIGTERM: the trial ends without a verdict
        job_log.failed(shown, "lever trial", stop.code, "stopped by SIGTERM", a.log)
        raise
    except Exception as exc:  # noqa: BLE001 - the traceback into the log, its one line where the person looks
        traceback.print_exc()
        job_log.failed(shown, "lever trial", 1, job_log.summary(exc), a.log)
        sys.exit(1)


if __name__ == "__main__":
    main()
