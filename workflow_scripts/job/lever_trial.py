"""The lever trial (rule lever_trial; config `auto_levers.by: measurement`): what `auto` means for one
configuration (model x strategy x layout, all its repeats), decided by timing it on the study's own machine.

Each candidate lever set (training/levers.py CANDIDATES: eager, the compiled loss, compiled blocks, the whole
model compiled, the same replayed as CUDA graphs) trains the configuration for `train.timing_warmup_steps` +
`auto_levers.steps` steps through the pipeline's own launcher, one after another in one job (a timed job: nothing
else runs beside it). The fastest candidate that finished is chosen: the file says which, what every candidate
measured (tokens/s, MFU, peak memory, the first steps' losses) and why the others were left out; the training
runs read it at launch (levers.apply_trial) and record the choice in `compile_auto`. Compilation happens inside
the warm-up steps, so it counts for nothing; each candidate's wall time is recorded beside its speed.

The whole-model candidates of a configuration where they were measured not to finish on this machine's torch and
DeepSpeed versions (levers.whole_model_known_to_fail) are left out before anything launches, the reason recorded.
Where one candidate is left to run (and the fallback behind it), nothing is launched: the choice is that candidate by
rule, its fallback named for the run itself (by_rule; job/launch.py falls back once if the choice fails there).
Where no candidate finishes, the choice is eager (the settings every strategy runs), said so in `why`. A candidate
stopped by SIGTERM (the workflow stopping: training/graceful_stop.py) ends the trial there, without a verdict.

A decision is cached (config `auto_levers.cache`: the machine's cache, `lever_decisions/<key>.json`), keyed by the
configuration's shape (the trial file's `shape`: study.lever_trial_specs), the machine: the device model (the
GPUs' names; on CPU the CPU's model) and the versions of torch, its CUDA / ROCm, DeepSpeed, transformers and
Python, and the training modules' code (training_code: a change there decides again). A trial whose key is there
launches no candidate: it writes the cached decision, its `why` saying `cached` and the device it was measured on.
Another device, version or training code is another key; a trial where no candidate finished is not cached.

    python -m workflow_scripts.job.lever_trial --trial <trial file> --out <verdict> --log <job log>

The trial file (study.lever_trial_specs, written by rules/common.smk) holds each candidate's run spec; a failed
trial's own output is its error in two lines, the rest in its log (job/job_log.py).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform as py
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
from workflow_scripts.training import build_ops, graceful_stop, levers
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
    """One run spec through the pipeline's launcher (job/launch.py); its summary. A run whose compiled region hit
    dynamo's recompile limit fails with that as its reason (`recompile_limit`: true)."""
    from workflow_scripts.job.launch import recompile_marker

    path = write_spec(spec)
    code, tail = run_logged([sys.executable, "-m", "workflow_scripts.job.launch", "--spec", str(path)],
                            path.parent / "launch.log")
    if code == graceful_stop.STOPPED_EXIT:  # the workflow was asked to stop (SIGTERM): no further run starts
        raise SystemExit(code)
    hit = recompile_marker(Path(spec["out_dir"])) if code != 0 else None
    if hit:
        return {"status": RunStatus.FAILED, "reason": f"hit dynamo's recompile limit ({hit})", "recompile_limit": True}
    return outcome(code, tail, Path(spec["out_dir"]) / C.SUMMARY, "launch")


def measured(s: dict) -> dict:
    """What a trial row (and every benchmark row) takes from a run's summary."""
    peak = s.get("peak_allocated_bytes")
    return {"status": s.get("status"), "tokens_per_s": s.get("tokens_per_s"), "mfu": s.get("mfu"),
            "peak_allocated_gib": None if peak is None else peak / GIB, "final_loss": s.get("final_loss")}


def steady_pace(s: dict) -> dict:
    """A candidate's speed in the trial: a step's tokens over the median of its few timed steps' times (its MFU
    scaled alike), the run's mean beside it. One slow step in `auto_levers.steps` (a first collective, a kernel
    compiled late on a cold machine: 1 of 8 steps measured the first candidate on a fresh H200 at a quarter of its
    pace) moves the mean; the median is the pace the timed runs settle at."""
    mean, median, tokens = s.get("tokens_per_s"), s.get("step_time_median_s"), s.get("tokens_per_step")
    if not (mean and median and tokens):
        return {}
    pace = tokens / median
    return {"tokens_per_s": pace, "mean_tokens_per_s": mean,
            "mfu": s["mfu"] * pace / mean if s.get("mfu") is not None else None}


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


def fallbacks(specs: dict) -> dict[str, str]:
    """The candidates here that stand behind another one here ({fallback: the candidate it stands behind}:
    levers.FALLBACK)."""
    return {fb: first for first, fb in levers.FALLBACK.items() if first in specs and fb in specs}


def compiled_share(s: dict) -> float | None:
    """The share of a run's median step that compiled levers act on: its forward and backward medians over its step
    median (the rest is the optimizer step); None where a median is missing."""
    parts = [s.get(k) for k in ("forward_median_s", "backward_median_s", "step_time_median_s")]
    if any(p is None for p in parts) or not parts[2]:
        return None
    return (parts[0] + parts[1]) / parts[2]


def trial(specs: dict[str, RunSpec], skipped: dict[str, str], min_share: float = 0.0) -> dict:
    """Every candidate's run (specs: name -> run spec), one after another; the verdict and the rows (each at its
    steady pace: steady_pace). A fallback (levers.FALLBACK: the whole model without CUDA graphs) runs last, and only
    where the candidate it stands behind did not finish for another reason than dynamo's recompile limit (the whole
    model recompiled DeepSpeed's stage-3 backward hook past the limit with and without graphs alike: ZeRO-3 offload
    and ZeRO-Infinity, gpt2-large, one H200). Once eager has run, where its forward and backward are under
    `min_share` of its step (compiled_share; config auto_levers.min_compiled_share), the candidates not run yet are
    left out: a compiled lever saves at most that share."""
    rows, skipped = [], dict(skipped)
    behind = fallbacks(specs)
    for name in [n for n in specs if n not in behind] + list(behind):
        spec = specs[name]
        done = next((r for r in rows if r["candidate"] == behind.get(name)), None)
        if done is not None and done["status"] == RunStatus.OK:
            skipped[name] = f"run only if {done['candidate']} fails"
            continue
        if done is not None and done.get("recompile_limit"):  # the same frames and guards, without CUDA graphs
            skipped[name] = (f"{done['candidate']} hit dynamo's recompile limit, and {name} compiles the same frames "
                             "under the same guards")
            continue
        print(f"candidate {name}: {json.dumps(levers.CANDIDATES[name], sort_keys=True)}", flush=True)
        started = time.time()
        s = run_launcher(spec)
        rows.append({"candidate": name, **measured(s), **steady_pace(s), "wall_s": round(time.time() - started, 1),
                     "first_losses": first_losses(Path(spec.out_dir)), "reason": s.get("reason"),
                     **({"recompile_limit": True} if s.get("recompile_limit") else {})})
        share = compiled_share(s) if name == "eager" and s.get("status") == RunStatus.OK else None
        if share is not None and share < min_share:
            ran = {r["candidate"] for r in rows}
            skipped.update({other: (f"eager's forward and backward are {share:.0%} of its step (the rest the "
                                    f"optimizer step): a compiled lever saves at most that, under "
                                    f"auto_levers.min_compiled_share {min_share:.0%}")
                            for other in specs if other not in ran and other not in skipped})
            break
    return {**choose(rows, skipped), "candidates": rows, "skipped": skipped}


def without_known_failures(specs: dict[str, RunSpec], skipped: dict[str, str],
                           facts: dict) -> tuple[dict[str, RunSpec], dict[str, str]]:
    """The candidates left once those measured not to finish on this machine's versions are out
    (levers.whole_model_known_to_fail: the whole model compiled under DeepSpeed's stage 3), each with its reason."""
    from workflow_scripts.training.models import MODELS

    whole = [name for name, spec in specs.items() if spec.train.get("compile_model") is True]
    if not whole:
        return specs, skipped
    one = specs[whole[0]]
    why = levers.whole_model_known_to_fail(one.strategy, one.options, MODELS[one.model].family, one.platform, facts)
    if why is None:
        return specs, skipped
    return ({k: v for k, v in specs.items() if k not in whole}, {**skipped, **{name: why for name in whole}})


def by_rule(specs: dict[str, RunSpec], skipped: dict[str, str]) -> dict | None:
    """A configuration left with one candidate to run (and the fallback behind it, levers.FALLBACK): nothing to
    compare, so nothing is launched. The choice is that candidate, by rule; its fallback is named for the run to
    fall back to if the choice fails there (levers.apply_fallback, job/launch.py). None where there is a choice."""
    behind = fallbacks(specs)
    first = [name for name in specs if name not in behind]
    if len(first) != 1:
        return None
    chosen = first[0]
    fb = next((f for f, ahead in behind.items() if ahead == chosen), None)
    left = "; ".join(f"{k} not run ({why})" for k, why in skipped.items())
    why = (f"rule: {chosen}, the one candidate that can win here, no trial launched"
           + (f"; {fb} if it fails in the run" if fb else "") + (f"; {left}" if left else ""))
    return {"chosen": chosen, "chosen_train": levers.CANDIDATES[chosen], "why": why, "by": "rule",
            "candidates": [], "skipped": dict(skipped),
            **({"fallback": fb, "fallback_train": levers.CANDIDATES[fb]} if fb else {})}


def read_trial(path: str) -> tuple[dict[str, RunSpec], dict[str, str]]:
    """A trial file: {"specs": {candidate: run spec}, "skipped": {candidate: why}}, each spec's version checked;
    the candidates in levers.CANDIDATES' order, eager first, whatever the file's key order (the rule writes it with
    sorted keys): eager's step says what a compiled lever can save (auto_levers.min_compiled_share)."""
    plan = json.loads(Path(path).read_text())
    order = list(levers.CANDIDATES)
    specs = {name: RunSpec.from_dict(plan["specs"][name], f"{path}: specs.{name}")
             for name in sorted(plan["specs"], key=order.index)}
    return specs, plan["skipped"]


# ---------------------------------------------------------------- the decision cache
# the GPUs a trial's ranks use and torch's CUDA / ROCm, read in a child process: the trial's own process holds no
# device context while its candidates run
GPU_FACTS = """import json, sys, torch
n = min(int(sys.argv[1]), torch.cuda.device_count())
print(json.dumps({"names": [torch.cuda.get_device_name(i) for i in range(n)],
                  "accelerator": f"hip {torch.version.hip}" if torch.version.hip else f"cuda {torch.version.cuda}"}))
"""


def machine(platform: str, world_size: int = 1) -> dict:
    """What a decision holds on besides the configuration: the device model and the software versions. On CPU
    torch is not imported (a cached decision is read in well under a second)."""
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "none"

    facts = {name: version(name) for name in ("torch", "deepspeed", "transformers")}
    facts["python"] = py.python_version()
    if platform == "cpu":
        from workflow_scripts.measure.machine import cpu_model

        return {"device": f"cpu: {cpu_model() or py.machine()}", **facts, "accelerator": "none"}
    out = subprocess.run([sys.executable, "-c", GPU_FACTS, str(world_size)], check=True, capture_output=True,
                         text=True).stdout
    gpus = json.loads(out.strip().splitlines()[-1])
    return {"device": " + ".join(dict.fromkeys(gpus["names"])) or "no GPU visible", **facts,
            "accelerator": gpus["accelerator"]}


def training_code() -> str:
    """A hash of the training modules (workflow_scripts/training, every .py, by path and content): what runs a
    candidate's steps, so a change to it decides again."""
    root = Path(levers.__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def decision_key(shape: dict, facts: dict, code: str) -> str:
    """The cache key of a decision: a hash of the configuration's shape, the machine's facts and the training
    modules' hash (training_code)."""
    text = json.dumps({"shape": shape, "machine": facts, "training_code": code}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_dir(setting: str | None) -> Path | None:
    """Where decisions are kept (config auto_levers.cache): `auto` the machine's cache, `off` none, else the
    directory."""
    if setting == "off":
        return None
    if setting in (None, "auto"):
        return Path(build_ops.machine_cache()) / "lever_decisions"
    return Path(setting)


def cached(directory: Path | None, key: str) -> dict | None:
    """The decision stored under `key`, if any (an unreadable entry is a miss)."""
    path = directory / f"{key}.json" if directory else None
    if path is None or not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def store(directory: Path | None, key: str, shape: dict, facts: dict, result: dict) -> Path | None:
    """Keep a measured decision (written whole or not at all; a cache that cannot be written loses only the
    shortcut)."""
    if directory is None or not any(r["status"] == RunStatus.OK for r in result["candidates"]):
        return None
    path = directory / f"{key}.json"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**result, "key": key, "shape": shape, "machine": facts}, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        print(f"lever decision not cached ({exc})", flush=True)
        return None
    return path


def replayed(entry: dict, key: str) -> dict:
    """A trial's result from a cached decision: its choice, candidates and skips as measured, `why` saying so."""
    ok = [r for r in entry["candidates"] if r["status"] == RunStatus.OK and r["tokens_per_s"]]
    speeds = ", ".join(f"{r['candidate']} {r['tokens_per_s']:,.0f}" for r in ok)
    facts = entry["machine"]
    why = (f"measured: {entry['chosen']} (cached: {key[:12]}, measured on {facts['device']} with torch "
           f"{facts['torch']}, DeepSpeed {facts['deepspeed']}; tokens/s: {speeds})")
    return {"chosen": entry["chosen"], "chosen_train": entry["chosen_train"], "why": why,
            "candidates": entry["candidates"], "skipped": entry["skipped"],
            "cache": {"key": key, "hit": True, "measured_why": entry["why"]}}


def decide(plan_path: str) -> dict:
    """The trial's result: by rule where one candidate is left to run (by_rule), else the cached decision of this
    shape on this machine, else a trial of every candidate (kept in the cache). `decided_s`: the seconds deciding
    took."""
    started = time.time()
    plan = json.loads(Path(plan_path).read_text())
    specs, skipped = read_trial(plan_path)
    first = next(iter(specs.values()), None)
    facts = None
    if first is not None and first.strategy in levers.WHOLE_MODEL_RECOMPILES["strategies"]:
        facts = machine(first.platform, first.world_size)
        specs, skipped = without_known_failures(specs, skipped, facts)
    alone = by_rule(specs, skipped)
    if alone is not None:
        print(f"lever decision: {alone['why']}", flush=True)
        return {**alone, "decided_s": round(time.time() - started, 3)}
    shape = plan.get("shape")
    directory = cache_dir(plan.get("cache")) if shape else None
    key = entry = None
    if directory is not None:
        facts = facts or machine(first.platform if first else shape["platform"], first.world_size if first else 1)
        key = decision_key(shape, facts, training_code())
        entry = cached(directory, key)
    if entry is not None:
        print(f"lever decision cached: {directory / (key + '.json')}; no candidate launched", flush=True)
        return {**replayed(entry, key), "decided_s": round(time.time() - started, 3)}
    result = trial(specs, skipped, plan["min_compiled_share"])
    if key is not None:
        path = store(directory, key, shape, facts, result)
        result["cache"] = {"key": key, "hit": False, "stored": str(path) if path else None}
    return {**result, "decided_s": round(time.time() - started, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trial", required=True,
                    help='the trial file: {"specs": {candidate: run spec}, "skipped": {candidate: why}}')
    ap.add_argument("--out", required=True)
    ap.add_argument("--log", help="the job's log: all output goes there, a failure is two lines on stderr")
    a = ap.parse_args(argv)
    shown = job_log.redirect(a.log)
    try:
        result = decide(a.trial)
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
