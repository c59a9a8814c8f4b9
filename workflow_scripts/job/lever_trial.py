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
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from workflow_scripts import columns as C
from workflow_scripts.training import graceful_stop, levers
from workflow_scripts.units import GIB



def write_spec(spec: dict) -> Path:
    Path(spec["out_dir"]).mkdir(parents=True, exist_ok=True)
    path = Path(spec["out_dir"]) / C.RUN_SPEC
    path.write_text(json.dumps(spec, indent=2))
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
    errors = [ln.strip() for ln in lines if ("Error" in ln or "error:" in ln)
              and "ChildFailedError" not in ln][-1:]  # the rank's own error, above torchrun's tail
    return proc.returncode, " | ".join(errors + lines[-4:])


def outcome(code: int, tail: str, summary: Path, what: str) -> dict:
    """A run's summary, or a failed status with the command's last lines."""
    if code != 0 or not summary.exists():
        return {"status": C.FAILED, "reason": f"{what} exit code {code}: {tail}"}
    return json.loads(summary.read_text())


def run_launcher(spec: dict) -> dict:
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
    ok = [r for r in rows if r["status"] == C.OK and r["tokens_per_s"]]
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


def trial(specs: dict[str, dict], skipped: dict[str, str]) -> dict:
    """Every candidate's run (specs: name -> run spec), one after another; the verdict and the rows."""
    rows = []
    for name, spec in specs.items():
        print(f"candidate {name}: {json.dumps(levers.CANDIDATES[name], sort_keys=True)}", flush=True)
        started = time.time()
        s = run_launcher(spec)
        rows.append({"candidate": name, **measured(s), "wall_s": round(time.time() - started, 1),
                     "first_losses": first_losses(Path(spec["out_dir"])), "reason": s.get("reason")})
    return {**choose(rows, skipped), "candidates": rows, "skipped": skipped}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trial-json", required=True,
                    help='{"specs": {candidate: run spec}, "skipped": {candidate: why}} (study.lever_trial_specs)')
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    plan = json.loads(a.trial_json)
    result = trial(plan["specs"], plan["skipped"])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(result["why"], flush=True)


if __name__ == "__main__":
    main()
