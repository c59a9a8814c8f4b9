"""One training job: checks, the VRAM sampler, torchrun with one process per rank, and the run's result row.

    python -m workflow_scripts.job.launch --spec <run spec file> --log <job log>   (what rules/train.smk runs)
    python -m workflow_scripts.job.launch --spec <results_dir>/runs/.../run_spec.json  (rerun a saved run by hand)

The spec (workflow_scripts/run_spec.py) says everything the run is; the launcher reads its fields and decides only
what needs this machine: the lever trial's verdict (measured `auto` levers), whether the strategy can run here,
whether the run is predicted not to fit. A spec of another schema version is refused, naming the file; a spec
written by hand without a schema_version is resolved by workflow_scripts.study.from_request first.

Outcomes, each a `summary.json` with a `status`:
  ok          -- training finished; the trainer's metrics, the sampler's peaks and provenance merged;
  unsupported -- the platform cannot run the strategy (a DeepSpeed op that does not build here, ...): no ranks
                 start, the reason is recorded;
  oom         -- a rank ran out of memory: the memory at failure is recorded and the job still succeeds, so
                 the rest of the study goes on.
Any other failure fails the job: with `--log`, the log holds everything (the traceback, every rank's output) and
the job's own output is the failure in two lines (job/job_log.py). A killed job rerun by Snakemake resumes from
the run's last checkpoint.
Multi-node: one launcher per node (srun), `--nnodes N --node-rank K --rdzv-endpoint HOST:PORT`; node 0 writes
the results and the log, node K>0 its log beside it (`<log>.node<K>`).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
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
from workflow_scripts.training import graceful_stop, recompute, workflow_watch
from workflow_scripts.units import GIB


def _header_only(path: Path, columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerow(columns)


def as_spec(spec: Mapping, where: str = "run spec") -> RunSpec:
    """The run spec to launch: a RunSpec, a spec's JSON mapping (its schema version checked), or a spec written by
    hand without a schema_version (resolved once, by workflow_scripts.study.from_request)."""
    if isinstance(spec, RunSpec):
        return spec
    if "schema_version" in spec:
        return RunSpec.from_dict(spec, where)
    from workflow_scripts import study

    return study.from_request(dict(spec))


def gpu_rank_threads(ranks_per_node: int, cores: int | None = None) -> int:
    """The CPU threads each rank of a GPU run gets: its share of the cores this process may run on (`cores`, else
    its affinity: a SLURM allocation's or a container's cpuset). A timed run never shares its node (the timed_runs
    resource, `--exclusive` on SLURM), and its host work runs on them: the model's construction on the CPU before
    it moves, CPU Adam under offload, the batches' pinned copies."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    return max(1, cores // max(1, ranks_per_node))


def environment(spec: Mapping) -> dict:
    from workflow_scripts.training.build_ops import compile_caches, extensions_dir

    spec = as_spec(spec)
    env = dict(os.environ)
    if spec.platform == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env["OMP_NUM_THREADS"] = str(spec.train["threads_per_rank"])
    else:  # not Snakemake's threads for the rule (4 a rank): the host work of a GPU rank runs on them
        env["OMP_NUM_THREADS"] = str(gpu_rank_threads(spec.world_size // spec.nodes))
    if spec.torch_extensions_dir:  # a spec run by hand may name its own; else the workflow's (common.smk)
        env["TORCH_EXTENSIONS_DIR"] = os.path.abspath(spec.torch_extensions_dir)
    elif not env.get("TORCH_EXTENSIONS_DIR"):  # in a container: the image's toolchain, as its build_ops job found
        env["TORCH_EXTENSIONS_DIR"] = extensions_dir("auto", spec.platform)
    compile_caches(env)  # before torch starts in a rank: what compiles there shares the machine's caches
    env["PIPELINE_STEP_FILE"] = os.path.abspath(os.path.join(spec.work_dir, "step"))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def unsupported_reason(spec: RunSpec, ctx) -> str | None:
    """A DeepSpeed op that did not build here, or the strategy's own reason; None if it can run."""
    from workflow_scripts.training.strategies import get as get_strategy

    for op_file in spec.ops:
        op = json.loads(Path(op_file).read_text())
        if not op["ok"]:
            return f"DeepSpeed op {op['op']} cannot be built on this platform: {op['error']}"
    return get_strategy(spec.strategy).unsupported(ctx)


def write_settings(spec: RunSpec, ctx, path: Path) -> None:
    """The strategy's exact settings, for runs whose ranks never wrote them (unsupported, early OOM)."""
    from workflow_scripts.training.context import with_device
    from workflow_scripts.training.strategies import get as get_strategy

    settings = {**get_strategy(spec.strategy).settings(with_device(ctx)), "layout": ctx.layout.degrees()}
    path.write_text(json.dumps(settings, indent=2, default=str))


def torchrun_command(spec: RunSpec, spec_path: Path, nnodes: int, node_rank: int, endpoint: str | None) -> list:
    per_node = spec.world_size // nnodes
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={per_node}"]
    if nnodes == 1:
        cmd += ["--standalone"]
    else:
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}", f"--rdzv-id={spec.run_id}"]
    return cmd + ["-m", "workflow_scripts.training.loop", "--spec", str(spec_path)]


def start_sampler(spec: RunSpec, out_csv: Path, root_pid: int, env: dict):
    cfg = spec.sampler
    if cfg["backend"] == "none":
        return None
    from workflow_scripts.measure.vram import start_sampler as start

    return start(str(out_csv), root_pid=root_pid, platform=spec.platform, backend=cfg["backend"],
                 interval_s=cfg["interval_s"], step_file=env["PIPELINE_STEP_FILE"])


def sampler_fields(result: dict | None) -> dict:
    if result is None:
        return {"sampler_status": "off", "sampler_reason": "sampler.backend: none"}
    peaks = result.get("peak_used_bytes") or {}
    device_peak = max((v for k, v in peaks.items() if k != "host" and v is not None), default=None)
    return {"sampler_status": result.get("status"), "sampler_reason": result.get("reason"),
            "sampler_backends": result.get("backends"), "sampler_samples": result.get("samples"),
            "sampler_hz": result.get("achieved_hz"), "sampler_gaps": result.get("gaps"),
            "sampler_peak_device_bytes": device_peak, "sampler_peak_host_bytes": peaks.get("host"),
            "sampler_peak_process_bytes": result.get("peak_process_bytes")}


def identity(spec: RunSpec, ctx) -> dict:
    return {k: spec[k] for k in ("run_id", "study", "model", "strategy", "world_size", "repeat", "platform")} | {
        "layout": ctx.layout.key, "precision": spec.precision}


def launch(spec: Mapping, nnodes: int = 1, node_rank: int = 0, endpoint: str | None = None) -> int:
    """The run with the levers its trial decided (levers.apply_trial). Where the trial chose by rule without
    launching anything and the run then fails or runs out of memory: once more with the fallback the trial named
    (levers.apply_fallback: the whole model without CUDA graphs). Where an `auto`-decided run's compiled region hit
    dynamo's recompile limit (the ranks' marker, training/loop.py): once more eager (levers.eager_after). Each time
    `compile_auto` says so; a run whose levers were set by the study fails with dynamo's error instead."""
    from workflow_scripts.training import strategies
    from workflow_scripts.training.levers import apply_fallback, apply_trial, eager_after
    from workflow_scripts.training.models import register_from

    spec = as_spec(spec)
    register_from(spec)  # a study's own model, for this launcher and its ranks
    strategies.register_from(spec)  # a strategy from a study's DeepSpeed JSON, likewise
    auto = "compile_auto" in spec.train or "lever_trial" in spec.train
    train, fell_back = apply_trial(spec.train), False
    while True:
        rc = launch_once(spec.replace(train=train), nnodes, node_rank, endpoint)
        if nnodes > 1 or rc == graceful_stop.STOPPED_EXIT or not (rc != 0 or ran_out_of_memory(Path(spec.out_dir))):
            return rc
        hit = recompile_marker(Path(spec.out_dir))
        if hit and auto and any(train.get(k) is True for k in ("compile_blocks", "compile_model", "compile_loss")):
            train = eager_after(train, hit)
            print(f"launch: {hit}; again eager", flush=True)
            continue
        behind = None if fell_back or hit else apply_fallback(spec.train)
        if behind is None:
            return rc
        print(f"launch: the levers failed ({'exit code ' + str(rc) if rc else 'out of memory'}); again with "
              f"{behind['compile_auto'].rsplit(', ', 1)[-1]}", flush=True)
        train, fell_back = behind, True


def recompile_marker(out_dir: Path) -> str | None:
    """The recompile-limit failure a rank of the last attempt recorded (training/loop.py), if any."""
    for marker in sorted(out_dir.glob(C.RECOMPILE_MARKER.format(rank="*"))):
        return json.loads(marker.read_text())["error"]
    return None


def root_cause(out_dir: Path) -> str | None:
    """The failure of the rank that failed first (the ranks' C.ERROR_MARKER files), `rank R: <error>`; None where
    no rank recorded one (killed, or failed before its spec was read)."""
    found = []
    for marker in out_dir.glob(C.ERROR_MARKER.format(rank="*")):
        try:
            found.append(json.loads(marker.read_text()))
        except (OSError, ValueError):
            continue
    if not found:
        return None
    first = min(found, key=lambda m: m["time"])
    return f"rank {first['rank']} (the first to fail): {first['error']}"


def ran_out_of_memory(out_dir: Path) -> bool:
    """Whether the run's row is an out-of-memory one measured while training (not a prediction before it)."""
    path = out_dir / C.SUMMARY
    return path.exists() and "oom_ranks" in json.loads(path.read_text())


def launch_once(spec: RunSpec, nnodes: int = 1, node_rank: int = 0, endpoint: str | None = None) -> int:
    from workflow_scripts.training.context import from_spec

    out_dir, work_dir = Path(spec.out_dir), Path(spec.work_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    if spec.trace_dir:  # the job's output even when the run ends unsupported or out of memory
        shutil.rmtree(spec.trace_dir, ignore_errors=True)  # never a trace of an earlier attempt
        Path(spec.trace_dir).mkdir(parents=True)
    spec_path = out_dir / C.RUN_SPEC
    spec_path.write_text(spec.to_json())
    env = environment(spec)
    started = time.time()
    lead = node_rank == 0
    refused = preflight_problems(spec)
    if refused:
        print("launch: not started:\n  " + "\n  ".join(refused), file=sys.stderr, flush=True)
        return 1
    ctx = from_spec(spec)  # rank 0's view, before any rank starts (without torch: context.from_spec)

    reason = unsupported_reason(spec, ctx)
    if reason:
        write_not_started(spec, ctx, RunStatus.UNSUPPORTED, reason, started)
        return 0
    reason = predicted_oom(spec, ctx)
    if reason:
        write_not_started(spec, ctx, RunStatus.OOM, reason, started)
        return 0

    for marker in [*out_dir.glob(C.OOM_MARKER.format(rank="*")), *out_dir.glob(C.RECOMPILE_MARKER.format(rank="*")),
                   *out_dir.glob(C.ERROR_MARKER.format(rank="*")), out_dir / graceful_stop.STOPPED_MARKER]:
        marker.unlink(missing_ok=True)
    cmd = torchrun_command(spec, spec_path, nnodes, node_rank, endpoint)
    print("launch:", " ".join(cmd), flush=True)
    stop = graceful_stop.LauncherStop()
    proc = stop.start(cmd, env)
    workflow_watch.watch(lambda why: None if stop.requested else stop_orphaned(proc, why))
    node_csv = out_dir / C.VRAM if lead else out_dir / f"vram_node{node_rank}.csv"
    sampler = None
    try:
        sampler = start_sampler(spec, node_csv, proc.pid, env)
    except Exception as exc:  # noqa: BLE001 - a broken sampler never stops training
        print(f"sampler did not start: {exc!r}", flush=True)
    rc = proc.wait()
    sampled = sampler.stop() if sampler is not None else None
    if sampled is None:
        _header_only(node_csv, C.SAMPLER_COLUMNS)
    if stop.requested and not (out_dir / C.TRAIN_SUMMARY).exists():
        return stopped(out_dir, rc)
    if not lead:
        return rc
    return write_result(spec, ctx, rc, sampled, started, time.time())


def stopped(out_dir: Path, rc: int) -> int:
    """The job asked to stop (training/graceful_stop.py): fail it, so that Snakemake's rerun resumes."""
    step = graceful_stop.LauncherStop.stopped_at(out_dir)
    if step is None:
        print(f"launch: stopped by SIGTERM before a step boundary (exit code {rc}); the rerun resumes from the last "
              f"checkpoint, if any", flush=True)
    else:
        print(f"launch: stopped by SIGTERM after step {step}, checkpoint saved; `snakemake --rerun-incomplete` "
              f"resumes from it", flush=True)
    return graceful_stop.STOPPED_EXIT


def preflight_problems(spec: RunSpec) -> list[str]:
    """Why no rank may start: damaged data files, a diagnostic that would crash this run."""
    from workflow_scripts.measure.memory_peak import refused

    return data_problems(spec) + [why for why in [refused(spec)] if why]


def data_problems(spec: Mapping) -> list[str]:
    """The run's data files against the SHA-256 in their manifest (data/checksum.py), before any rank starts."""
    from workflow_scripts.data import checksum

    manifest = Path(spec["data"]["manifest"])
    images = manifest.exists() and json.loads(manifest.read_text()).get("kind") == "images"
    return checksum.problems(spec["data"], f"regenerate it with `snakemake --cores all --forcerun "
                                           f"{'images' if images else 'tokenize'}`")


def stop_orphaned(proc: subprocess.Popen, why: str) -> None:
    """The workflow that started this job died: kill torchrun (its ranks die with it) and leave; the sampler
    stops when this process's pipe to it closes (training/workflow_watch.py)."""
    print(f"launch: stopping the run: the workflow that started it died ({why})", flush=True)
    proc.kill()
    os._exit(1)


def predicted_oom(spec: RunSpec, ctx) -> str | None:
    """With config plan.refuse_oom (spec memory_guard): why the run is not started, if the analytic memory model
    predicts a device-wide peak above the usable GPU memory; None when it fits or is not modelled."""
    guard = spec.memory_guard
    if not guard:
        return None
    from workflow_scripts.plan.predict import predict
    from workflow_scripts.training.levers import compiles
    from workflow_scripts.training.models import MODELS, embedding_rows

    data, t = json.loads(Path(spec.data["manifest"]).read_text()), spec.train
    p = predict(model=spec.model, strategy=spec.strategy, precision=spec.precision,
                world_size=spec.world_size, micro_batch=ctx.micro_batch, seq_len=data["block_size"],
                grad_accum=ctx.accum, vocab=embedding_rows(data["vocab_size"], t), overrides=spec.model_overrides,
                layout=spec.layout, options=spec.options, checkpointing=recompute.mode(t),
                compiled=compiles(t, MODELS[spec.model].family, spec.layout))
    if not p.modelled or p.bound or p.device <= guard["usable_bytes"]:  # an upper bound refuses nothing
        return None
    return (f"not started: predicted device-wide peak {p.device / GIB:.1f} GiB per GPU (torch-allocated "
            f"{p.total / GIB:.1f}) > {guard['usable_bytes'] / GIB:.1f} GiB usable ({guard['gpu_memory_gib']} GiB "
            f"minus {guard['headroom_gib']} GiB headroom; analytic memory model, config plan.refuse_oom)")


def write_not_started(spec: RunSpec, ctx, status: RunStatus, reason: str, started: float) -> None:
    """The row of a run that is not started (unsupported here, or predicted not to fit): empty metrics and
    timeline, the reason in the summary."""
    from workflow_scripts.measure import provenance

    out_dir = Path(spec.out_dir)
    print(f"{status}: {reason}", flush=True)
    write_settings(spec, ctx, out_dir / C.SETTINGS)
    _header_only(out_dir / C.METRICS, C.METRIC_COLUMNS)
    _header_only(out_dir / C.VRAM, C.SAMPLER_COLUMNS)
    (out_dir / C.PROVENANCE).write_text(json.dumps(provenance.collect(spec, started, time.time()), indent=2))
    (out_dir / C.SUMMARY).write_text(json.dumps({**identity(spec, ctx), "status": status, "reason": reason},
                                                indent=2))


def write_result(spec: RunSpec, ctx, rc: int, sampled: dict | None, started: float, ended: float) -> int:
    """Node 0, after the ranks ended: the `ok` or `oom` row with the sampler's peaks and provenance."""
    from workflow_scripts.measure import provenance

    out_dir = Path(spec.out_dir)
    ooms = sorted(out_dir.glob("oom_rank*.json"))
    if rc != 0 and not ooms:
        first = root_cause(out_dir)
        print(f"training failed with exit code {rc}" + (f"; {job_log.ROOT_CAUSE}{first}" if first else ""), flush=True)
        return rc
    train_summary = json.loads((out_dir / C.TRAIN_SUMMARY).read_text()) if not ooms else {}
    measured = train_summary.pop(provenance.TORCH_FACTS, None)
    (out_dir / C.PROVENANCE).write_text(json.dumps(provenance.collect(spec, started, ended, measured=measured),
                                                   indent=2))
    if ooms:
        failures = [json.loads(p.read_text()) for p in ooms]
        if not (out_dir / C.METRICS).exists():
            _header_only(out_dir / C.METRICS, C.METRIC_COLUMNS)
        if not (out_dir / C.SETTINGS).exists():
            write_settings(spec, ctx, out_dir / C.SETTINGS)
        summary = {**identity(spec, ctx), "status": RunStatus.OOM, "reason": failures[0]["error"],
                   "oom_ranks": failures,
                   "oom_allocated_bytes": max((f["allocated_bytes"] or 0) for f in failures) or None,
                   "oom_reserved_bytes": max((f["reserved_bytes"] or 0) for f in failures) or None}
    else:
        summary = train_summary
    summary.update(sampler_fields(sampled), study=spec.study, launch_wall_s=ended - started)
    if spec.variant:  # the as-published variant of a study (rules/published.smk)
        summary["variant"] = spec.variant
    (out_dir / C.SUMMARY).write_text(json.dumps(summary, indent=2))
    print(f"{summary['status']}: {spec.run_id}", flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="the run spec file (run_spec.json)")
    ap.add_argument("--log", help="the job's log: all output goes there, a failure is two lines on stderr")
    ap.add_argument("--nnodes", type=int, default=None, help="default: the spec's nodes")
    ap.add_argument("--node-rank", type=int, default=int(os.environ.get("SLURM_NODEID", 0)))
    ap.add_argument("--rdzv-endpoint", default=os.environ.get("PIPELINE_RDZV_ENDPOINT"))
    a = ap.parse_args(argv)
    log = a.log if not a.log or a.node_rank == 0 else f"{a.log}.node{a.node_rank}"
    shown = job_log.redirect(log)
    try:
        spec = as_spec(json.loads(Path(a.spec).read_text()), a.spec)
        nnodes = a.nnodes or spec.nodes
        endpoint = a.rdzv_endpoint or (slurm_endpoint() if nnodes > 1 else None)
        rc = launch(spec, nnodes, a.node_rank, endpoint)
    except Exception as exc:  # noqa: BLE001 - the traceback into the log, its one line where the person looks
        traceback.print_exc()
        job_log.failed(shown, "launch", 1, job_log.summary(exc), log)
        sys.exit(1)
    if rc != 0:
        job_log.failed(shown, "launch", rc, job_log.tail(log) or "see the log", log)
    sys.exit(rc)


def slurm_endpoint(port: int = 29400) -> str:
    """The rendezvous on the job's first node (srun starts one launcher per node)."""
    nodes = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                           capture_output=True, text=True, check=True).stdout.split()
    return f"{nodes[0]}:{port}"


if __name__ == "__main__":
    main()
