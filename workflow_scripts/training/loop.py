"""The training loop, one process per rank, started by torchrun (see workflow_scripts.job.launch):

    torchrun --nproc-per-node 2 -m workflow_scripts.training.loop --spec run_spec.json

The run spec (written by the launcher from config) names the model, strategy, layout, data and training settings.
The loop only times, logs, checkpoints and evaluates: the engine owns each optimizer step (its micro-batches,
forward, backward and update; training.strategies.engine.Engine.train_step). Rank 0
writes `metrics.csv` (one row per optimizer step), `train_summary.json` and `strategy_settings.json` into the run's
output directory. Log lines look like `step 10: loss 3.2100, lr 3.0e-04, step 105.2ms, 12345 tok/s`.

Timing: no host synchronisation with the device inside the step loop (torch's DDP times its own first 10
iterations and every 100th with CUDA events it waits for: a rank's trace shows them, report/traces.py
`forward_syncs`). The ranks' stop vote runs in gloo's thread
during a step and is read at the next boundary (training/graceful_stop.py): a fraction of a millisecond of host
time a step (benchmarks/2026-12-08-stop-vote-cost-cpu.md). On GPU each phase is bracketed by CUDA events, read with
the losses once per `log_every` steps; on CPU by perf_counter. The first `timing_warmup_steps` steps (and everything
before the loop: op builds, compilation, checkpoint loading) are excluded from throughput.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import resource
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from workflow_scripts import columns as C
from workflow_scripts.measure import metrics as M
from workflow_scripts.measure import provenance
from workflow_scripts.measure.clock import PhaseClock
from workflow_scripts.measure.memory_peak import MemoryPeak
from workflow_scripts.measure.profile import StepProfiler
from workflow_scripts.measure.step_signal import StepPublisher
from workflow_scripts.run_spec import RunSpec
from workflow_scripts.training import IMPORTED, chunked_loss, determinism, levers, recompute, vision, workflow_watch
from workflow_scripts.training.batches import Batches, evaluate, load_data, make_model
from workflow_scripts.training.checkpoint import load_checkpoint, resume_hash, save_checkpoint
from workflow_scripts.training.context import init_distributed
from workflow_scripts.training.graceful_stop import RankStop, signal_workflow
from workflow_scripts.training.models import MODELS, count_params, count_trainable, model_flops_per_token, model_spec
from workflow_scripts.training.parallel import build_engine
from workflow_scripts.training.run_context import RunContext
from workflow_scripts.training.strategies import get as get_strategy
from workflow_scripts.training.strategies.base import Strategy
from workflow_scripts.training.strategies.engine import Engine
from workflow_scripts.training.trackers import SamplerTail, Trackers
from workflow_scripts.units import GIB


def lr_at(step: int, t: dict, total_steps: int) -> float:
    """Linear warm-up over lr_warmup_steps, then cosine decay to min_lr at the last step."""
    if step < t["lr_warmup_steps"]:
        return t["lr"] * (step + 1) / t["lr_warmup_steps"]
    span = max(1, total_steps - t["lr_warmup_steps"])
    progress = min(1.0, (step - t["lr_warmup_steps"]) / span)
    return t["min_lr"] + 0.5 * (t["lr"] - t["min_lr"]) * (1 + math.cos(math.pi * progress))


class Phases:
    """Wall seconds between named marks of a rank's run, from the process's start (training.IMPORTED: the first
    phase, `import`, is the libraries) to the last mark; each mark closes the phase since the one
    before. Where the time before the first step goes (launch_wall_s less the steps: imports, the process group,
    the model's build, the engine's, the first validation) and after the last."""

    def __init__(self, seconds: dict | None = None):
        self.seconds = seconds if seconds is not None else {}
        self.last = IMPORTED + sum(self.seconds.values())
        if not self.seconds:
            self.mark("import")

    def mark(self, name: str) -> None:
        now = time.time()
        self.seconds[name] = round(now - self.last, 3)
        self.last = now


# ---------------------------------------------------------------- setup
@dataclass
class Run:
    """Everything a rank needs to train, built once by `setup`."""

    spec: RunSpec
    ctx: RunContext
    strategy: Strategy
    engine: Engine
    batches: Batches
    val: np.ndarray
    seq_len: int
    vocab: int
    tokenizer_vocab: int
    n_params: int
    total_steps: int
    levers: dict
    out_dir: Path
    ckpt_dir: Path
    trainable: int = 0  # parameters that train (all of them, or LoRA's adapters and the head)
    accuracy: dict = field(default_factory=dict)  # image classifiers: top-1 validation accuracy, initial / final
    # wall seconds of what comes before the first step and after the last, on rank 0 (the summary's setup_phases_s)
    phases: dict = field(default_factory=dict)

    @property
    def vision(self) -> bool:
        return MODELS[self.spec["model"]].vision

    @property
    def t(self) -> dict:
        return self.spec["train"]

    @property
    def eval_samples(self) -> int:
        return self.t["eval_batches"] * self.t["micro_batch_size"]  # the study's micro-batch, not the strategy's


def setup(spec: RunSpec) -> Run:
    """Join the process group, build the model (seeded), apply the compile levers, write the exact strategy
    settings (rank 0) and wrap the model in the strategy's engine."""
    t = spec["train"]
    clock = Phases()
    deterministic = determinism.apply(t)  # before any CUDA work: cuBLAS reads its workspace setting once
    ctx = init_distributed(spec)
    clock.mark("distributed")
    strategy = get_strategy(spec["strategy"])
    out_dir, ckpt_dir = Path(spec["out_dir"]), Path(spec["work_dir"]) / "ckpt"
    if ctx.rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(t["seed"])
    if ctx.device.type == "cpu":
        torch.set_num_threads(max(1, int(t["threads_per_rank"])))

    data, blocks, val, vocab = load_data(spec)
    seq_len = data["block_size"]
    if t["separate_documents"]:
        if "eos_id" not in data:
            raise ValueError(f"train.separate_documents: {spec['data']['manifest']} names no eos_id (prepared "
                             "before documents could be told apart): delete the study's data_dir folder and rerun")
        ctx.document_eos = int(data["eos_id"])
    clock.mark("data")
    model = make_model(spec, vocab, seq_len)
    clock.mark("model")
    n_params, trainable = count_params(model), count_trainable(model)
    if MODELS[spec["model"]].vision:  # image rows: pixels and label (training/vision.py)
        ctx.forward_loss = vision.forward_loss
    applied = {**recompute.enable(model, t), **levers.apply(model, t, strategy), **deterministic}
    ctx.compiled = applied["compile_blocks"] or applied["compile_model"]  # what the strategy's engine is built around
    if t["chunked_loss"]:  # the head returns the loss (training/chunked_loss.py)
        applied.update(chunked_loss.install(model, t["chunked_loss"]))
        ctx.chunked_head, ctx.forward_loss = model.get_output_embeddings(), chunked_loss.forward_loss
    ctx.loss_fn = levers.loss_function(t)
    clock.mark("levers")
    engine = build_engine(strategy, model, ctx, MODELS[spec["model"]].family)
    applied.update(levers.apply_to_engine(engine, t, strategy))
    clock.mark("engine")
    if ctx.rank == 0:
        settings = {**strategy.settings(ctx), **engine.settings, "layout": ctx.layout.degrees(), "harness": applied}
        (out_dir / C.SETTINGS).write_text(json.dumps(settings, indent=2, default=str))

    batches = Batches(blocks, ctx, t["seed"], pin=ctx.device.type == "cuda")
    if batches.steps_per_epoch == 0:
        raise ValueError(f"train: {len(blocks)} training blocks give no full step of effective batch "
                         f"{ctx.effective_batch} (micro {ctx.micro_batch} x accum {ctx.accum} x dp {ctx.dp_size})")
    total_steps = t["epochs"] * batches.steps_per_epoch
    if t["max_steps"]:
        total_steps = min(total_steps, t["max_steps"])
    return Run(spec=spec, ctx=ctx, strategy=strategy, engine=engine, batches=batches, val=val, seq_len=seq_len,
               vocab=vocab, tokenizer_vocab=data["vocab_size"], n_params=n_params, total_steps=total_steps,
               levers=applied, out_dir=out_dir, ckpt_dir=ckpt_dir, trainable=trainable, phases=clock.seconds)


# ---------------------------------------------------------------- step rows
class StepLog:
    """The per-step rows of a run. Steps are added with their clock marks and the loss as a device tensor; `flush`
    (every `log_every` steps) synchronises once, averages the losses over ranks, turns marks into phase times,
    prints a log line and writes TensorBoard scalars."""

    def __init__(self, run: Run, rows: list[dict], start_step: int, profiled=lambda step: False):
        self.run, self.rows, self.start_step, self.profiled = run, rows, start_step, profiled
        self.clock = PhaseClock(run.ctx.device)
        self.pending: list[dict] = []
        self.prev_end = None
        self.t_start = time.time()
        self.trackers = None  # rank 0's (config trackers): nothing imported where the study names none
        if run.spec.trackers and run.ctx.rank == 0:
            self.trackers = Trackers(run.spec["trackers"], run.out_dir, run.spec["run_id"], run.spec["study"],
                                     {"model": run.spec["model"], "strategy": run.spec["strategy"],
                                      "layout": run.spec["layout"], "precision": run.spec["precision"],
                                      "batch": run.spec["batch"], "train": run.t})
            self.sampler = SamplerTail(run.out_dir / C.VRAM)
            self.device_name, self.flops_per_token = device_name(run.ctx.device), flops_per_token(run)

    def add(self, step: int, loss: torch.Tensor, lr: float, marks: dict) -> None:
        self.pending.append({"step": step, "loss": loss, "lr": lr, "marks": marks, "wall": time.time()})

    def untimed_gap(self) -> None:
        """Time spent outside training (a checkpoint save): the next step is timed from its own start."""
        self.prev_end = None

    def flush(self) -> None:
        if not self.pending:
            return
        run, clock = self.run, self.clock
        clock.sync()
        losses = torch.stack([p["loss"] for p in self.pending]).double()
        dist.all_reduce(losses)
        losses = (losses / run.ctx.world_size).tolist()
        for p, loss in zip(self.pending, losses):
            self.rows.append(self._row(p, loss))
        if self.trackers is not None:
            memory = device_memory(run.ctx.device)
            logged = self.rows[-len(self.pending):]
            for r in logged:
                tokens_per_s = r["tokens"] / r["step_time_s"]
                sampled = self.sampler.peaks() if r is logged[-1] else {}  # since the previous logged step
                self.trackers.log(r["step"], {**{k: r[k] for k in ("loss", "lr", "step_time_s", "forward_s",
                                                                    "backward_s", "optimizer_s")},
                                              "tokens_per_s": tokens_per_s, **memory, **sampled,
                                              "mfu": M.mfu(self.flops_per_token, tokens_per_s, run.ctx.world_size,
                                                           self.device_name)})
            self.trackers.flush()
        if run.ctx.rank == 0:
            r = self.rows[-1]
            print(f"step {r['step']}: loss {r['loss']:.4f}, lr {r['lr']:.2e}, step {1000 * r['step_time_s']:.1f}ms, "
                  f"{r['tokens'] / max(r['step_time_s'], 1e-9):.0f} tok/s", flush=True)
        self.pending.clear()

    def _row(self, p: dict, loss: float) -> dict:
        run, clock, marks = self.run, self.clock, p["marks"]
        step_time = clock.seconds(self.prev_end if self.prev_end is not None else marks["start"], marks["end"])
        self.prev_end = marks["end"]
        return {"step": p["step"] + 1, "epoch": p["step"] // run.batches.steps_per_epoch, "loss": loss,
                "lr": p["lr"], "step_time_s": step_time,
                "forward_s": sum(clock.seconds(a, b) for a, b, _ in marks["micro"]),
                "backward_s": sum(clock.seconds(b, c) for _, b, c in marks["micro"]),
                "optimizer_s": clock.seconds(marks["opt"], marks["end"]),
                "tokens": run.ctx.effective_batch * run.seq_len, "samples": run.ctx.effective_batch,
                "warmup": p["step"] - self.start_step < run.t["timing_warmup_steps"],
                "profiled": self.profiled(p["step"]),
                "wall_s": p["wall"] - self.t_start}

    def close(self, val_final: float) -> None:
        if self.trackers is not None:
            self.trackers.log(self.run.total_steps, {"val_loss": val_final})
            self.trackers.close()


def device_memory(device) -> dict:
    """The allocator's memory now, in GiB, for the trackers (a GPU's; none on the CPU)."""
    if device.type != "cuda":
        return {}
    return {"allocated_gib": torch.cuda.memory_allocated(device) / GIB,
            "reserved_gib": torch.cuda.memory_reserved(device) / GIB}


# ---------------------------------------------------------------- the run
def train(spec: RunSpec) -> dict | None:
    run = setup(spec)
    ctx, engine, t = run.ctx, run.engine, run.t
    clock = Phases(run.phases)
    config_hash = resume_hash(spec)
    state, fallback = load_checkpoint(engine, run.ckpt_dir, config_hash, ctx.rank)
    clock.mark("checkpoint_load")
    state = state or {"step": 0, "rows": [], "val_loss_initial": None}
    resumed_from = state["step"] if state["step"] else None
    val_initial = state["val_loss_initial"]
    if val_initial is None:
        val_initial = evaluate(engine, run.val, ctx, run.eval_samples)
    if run.vision:  # a resumed run keeps the accuracy measured before its first step (0.0 is a real value)
        initial = state.get("val_accuracy_initial")
        run.accuracy["initial"] = initial if initial is not None else vision.accuracy(engine, run.val, ctx,
                                                                                      run.eval_samples)
    clock.mark("evaluate_initial")

    profiler = StepProfiler(spec, ctx, state["step"], run.total_steps)
    memory_peak = MemoryPeak(ctx, run.out_dir)
    first = state["step"]  # steps under a diagnostic are left out of the timing (metrics.steady)
    log = StepLog(run, state["rows"], state["step"],
                  lambda step: profiler.profiled(step) or memory_peak.recording(step, first))
    publisher = StepPublisher(os.environ.get("PIPELINE_STEP_FILE") if ctx.rank == 0 else None)
    faults = t["fault_injection"]
    stop = RankStop(ctx.world_size)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
        memory_peak.start()
    clock.mark("before_steps")

    def checkpoint(done: int) -> None:
        log.flush()
        save_checkpoint(engine, run.ckpt_dir, done,
                        {"step": done, "rows": log.rows, "val_loss_initial": val_initial,
                         "val_accuracy_initial": run.accuracy.get("initial"), "config_hash": config_hash,
                         "checkpoint_fallback": fallback},
                        ctx.rank, inject_no_space=ctx.rank == 0 and faults.get("no_space_at_checkpoint_step") == done)
        log.untimed_gap()

    with profiler:
        profiler.annotate(engine)
        for step in range(state["step"], run.total_steps):
            publisher.publish(step + 1)
            inject_faults(faults, step + 1, ctx.rank)
            lr = lr_at(step, t, run.total_steps)
            loss, marks = engine.train_step(run.batches.micro_batches(step), lr, log.clock)
            log.add(step, loss, lr, marks)
            memory_peak.step()
            if profiler.step(step):  # the trace was exported: the next step is timed from its own start
                log.flush()
                log.untimed_gap()
            done = step + 1
            if done % t["log_every"] == 0 or done == run.total_steps:
                log.flush()
            saved = t["checkpoint_every"] and done % t["checkpoint_every"] == 0 and done < run.total_steps
            if saved:
                checkpoint(done)
            if done < run.total_steps and stop.agreed():  # SIGTERM: a checkpoint at this step, then leave
                if not saved:
                    checkpoint(done)
                stop.leave(run.out_dir, done, ctx.rank)
    stop.finish()  # the last vote, before the collectives of the final validation
    log.flush()
    clock.mark("steps")
    publisher.publish(run.total_steps + 1)
    val_final = evaluate(engine, run.val, ctx, run.eval_samples)
    if run.vision:
        run.accuracy["final"] = vision.accuracy(engine, run.val, ctx, run.eval_samples)
    log.close(val_final)
    clock.mark("evaluate_final")
    return finish(run, log.rows, (val_initial, val_final), resumed_from, fallback,
                  tracked=log.trackers.facts() if log.trackers is not None else None)


def inject_faults(faults: dict, step: int, rank: int) -> None:
    """Test hooks (train.fault_injection), on rank 0 before `step` runs."""
    if rank != 0:
        return
    if faults.get("oom_at_step") == step:
        raise torch.OutOfMemoryError(f"injected allocation failure at step {step} (fault_injection)")
    if faults.get("sigterm_workflow_at_step") == step:
        signal_workflow(step)


def gather_memory(ctx: RunContext) -> list[list[float]]:
    """Per rank: torch peak allocated and reserved (GPU, else 0) and the peak host RSS, in bytes."""
    cuda = ctx.device.type == "cuda"
    mem = torch.tensor([torch.cuda.max_memory_allocated(ctx.device) if cuda else 0,
                        torch.cuda.max_memory_reserved(ctx.device) if cuda else 0,
                        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.float64,
                       device=ctx.device)  # NCCL gathers device tensors only
    gathered = [torch.zeros_like(mem) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, mem)
    return torch.stack(gathered).tolist()


def finish(run: Run, rows: list[dict], val_losses: tuple[float, float], resumed_from: int | None,
           fallback: str | None = None, tracked: dict | None = None) -> dict | None:
    """Gather memory, write metrics.csv and train_summary.json (rank 0), drop the run's checkpoints. `tracked`:
    the trackers' run ids and folders (rank 0), for provenance."""
    memory = gather_memory(run.ctx)
    summary = None
    if run.ctx.rank == 0:
        summary = run_summary(run, rows, val_losses, memory)
        summary["resumed_from_step"] = resumed_from
        summary["checkpoint_fallback"] = fallback  # a damaged checkpoint skipped on resume: which, and why
        # read here, where torch is imported already; with the CPU threads the rank ran its host work on
        summary[provenance.TORCH_FACTS] = {**provenance.torch_facts(), "rank_cpu_threads": torch.get_num_threads(),
                                           **({"trackers": tracked} if tracked else {})}
        write_metrics(run.out_dir / C.METRICS, rows)
        (run.out_dir / C.TRAIN_SUMMARY).write_text(json.dumps(summary, indent=2))
    dist.barrier()
    if run.ctx.rank == 0:
        shutil.rmtree(run.ckpt_dir, ignore_errors=True)  # the run is complete: checkpoints are no longer needed
    dist.barrier()
    return summary


def device_name(device) -> str:
    """The GPU's name as MFU's peak table knows it, "cpu" on the CPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def flops_per_token(run: Run) -> float:
    """The model FLOPs of one trained token (measure/metrics: MFU's numerator)."""
    return model_flops_per_token(run.spec["model"], run.n_params, run.seq_len, run.trainable,
                                 run.spec.model_overrides)


def run_summary(run: Run, rows: list[dict], val_losses: tuple[float, float], memory: list[list[float]]) -> dict:
    """The run's row of the study table (before the launcher adds the sampler's peaks)."""
    spec, ctx, strategy = run.spec, run.ctx, run.strategy
    shape = model_spec(spec.model, spec.model_overrides)
    counted = levers.dynamo_counters()
    device, fpt = device_name(ctx.device), flops_per_token(run)
    steps_per_epoch, total_steps, cuda = run.batches.steps_per_epoch, run.total_steps, ctx.device.type == "cuda"
    epoch_wall = {}
    for r in rows:
        epoch_wall[r["epoch"]] = epoch_wall.get(r["epoch"], 0.0) + r["step_time_s"]
    val_initial, val_final = val_losses
    return {
        "status": C.OK, "run_id": spec["run_id"], "model": spec["model"], "strategy": spec["strategy"],
        "family": strategy.family, "zero_stage": strategy.zero_stage, "layout": ctx.layout.key,
        "parallel": ctx.parallel, "world_size": ctx.world_size, "dp_size": ctx.dp_size,
        "repeat": spec["repeat"], "platform": spec["platform"], "device_name": device,
        "precision": ctx.precision.name, "precision_detail": ctx.precision.detail,
        "n_params": run.n_params, "n_layer": shape.n_layer, "d_model": shape.d_model, "seq_len": run.seq_len,
        "vocab_size": run.vocab, "tokenizer_vocab_size": run.tokenizer_vocab, "micro_batch": ctx.micro_batch,
        "grad_accum": ctx.accum,
        "effective_batch": ctx.effective_batch, "tokens_per_step": ctx.effective_batch * run.seq_len,
        "steps": total_steps, "steps_per_epoch": steps_per_epoch, "epochs": total_steps / steps_per_epoch,
        "train_samples": int(ctx.effective_batch * total_steps),
        "timing_warmup_steps": run.t["timing_warmup_steps"],
        "epoch_time_s": [epoch_wall[e] for e in sorted(epoch_wall)],
        "train_time_s": sum(r["step_time_s"] for r in rows),
        "flops_per_token": fpt, "peak_tflops": M.peak_tflops(device),
        **M.timing(rows, steps_per_epoch, ctx.world_size, fpt, device, run.t["checkpoint_every"]),
        "peak_allocated_bytes": max(g[0] for g in memory) if cuda else None,
        "peak_reserved_bytes": max(g[1] for g in memory) if cuda else None,
        "peak_allocated_bytes_per_rank": [g[0] for g in memory] if cuda else None,
        "peak_reserved_bytes_per_rank": [g[1] for g in memory] if cuda else None,
        "peak_host_rss_bytes_per_rank": [g[2] for g in memory],
        "peak_host_rss_bytes": sum(g[2] for g in memory),
        "initial_loss": rows[0]["loss"] if rows else None, "final_loss": rows[-1]["loss"] if rows else None,
        "val_loss_initial": val_initial, "val_loss_final": val_final,
        "val_ppl_final": math.exp(val_final) if val_final == val_final and val_final < 50 else None,
        # model parallelism splits the parameters over pp x tp ranks (evenly, as an estimate), ZeRO/FSDP over the
        # data ranks (dp x cp; expert shards too: ep x their copies); replicated experts (ddp family) not divided
        **M.model_state_bytes(run.n_params // (ctx.layout.pp * ctx.layout.tp), ctx.layout.shard_ranks,
                              strategy.zero_stage,
                              ctx.precision.engine_state_bytes(strategy.family),
                              strategy.offload_optimizer(ctx), strategy.offload_params(ctx)),
        "compile_blocks": run.levers["compile_blocks"], "compile_loss": run.levers["compile_loss"],
        # whether the whole model was compiled (a bool, every run alike), and what was compiled (text, or None)
        "compile_model": run.levers["compile_model"] not in (None, False),
        "compiled_module": run.levers["compile_model"] if isinstance(run.levers["compile_model"], str) else None,
        "compile_mode": run.levers["compile_mode"],
        # why: the rule's reason, a trial's measurement; and the graph breaks where the compiled region had some
        "compile_auto": levers.said_with_breaks(spec.train.get("compile_auto"), counted),
        # the wall seconds from the rank's start to its first step, and each phase of the run beside the steps
        "setup_s": round(sum(run.phases[k] for k in list(run.phases)[:list(run.phases).index("steps")]), 3)
        if "steps" in run.phases else None,
        "setup_phases_s": dict(run.phases),
        **counted,  # rank 0's dynamo counters: graphs compiled, graph breaks and the most frequent one's reason
        "trainable_params": run.trainable,
        **({"val_accuracy_initial": run.accuracy.get("initial"), "val_accuracy_final": run.accuracy.get("final")}
           if run.vision else {}),
    }


def write_metrics(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=C.METRIC_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def die_with_parent() -> None:
    """torchrun starts the ranks in their own session, so a kill of the workflow's process group reaches the
    launcher but not the ranks, which would train on and write checkpoints into the folder the rerun resumes from.
    Linux: the kernel kills this rank when its parent (the agent) dies."""
    die = workflow_watch.pdeathsig()
    if die is not None:
        die()
        if os.getppid() == 1:  # the parent died before prctl
            os._exit(1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="run spec JSON written by workflow_scripts.job.launch")
    spec = RunSpec.load(ap.parse_args(argv).spec)  # its schema version checked: the fields the launcher wrote
    die_with_parent()
    try:
        train(spec)
        # Everything is written and every rank passed the last barrier: leave without running C++ destructors.
        # DeepSpeed's CPU shared-memory comm threads can abort a rank at interpreter exit ("terminate called
        # without an active exception"), which would fail a finished run.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except torch.OutOfMemoryError as exc:
        write_oom_marker(spec, exc)
        raise
    except Exception as exc:
        write_error_marker(spec, exc)
        hit = levers.recompile_limit_hit(exc)
        if hit:  # the launcher reads it: an `auto`-decided run goes again eager (job/launch.py)
            write_marker(spec, C.RECOMPILE_MARKER, {"error": hit, **levers.dynamo_counters()})
        raise


def write_marker(spec: dict, marker: str, info: dict) -> None:
    """A file of this rank's (`marker`: a C.*_MARKER name with {rank}) in the run's folder, for the launcher."""
    rank = int(os.environ.get("RANK", 0))
    Path(spec["out_dir"]).mkdir(parents=True, exist_ok=True)
    Path(spec["out_dir"], marker.format(rank=rank)).write_text(json.dumps({"rank": rank, **info}))


def write_error_marker(spec: dict, exc: BaseException) -> None:
    """This rank's failure and when it happened (C.ERROR_MARKER): the launcher names the first rank's as the root
    cause (the others' are mostly their peers' broken connections)."""
    failed_at = getattr(exc, "failed_at", None)  # set where the failure was caught before cleaning up after it
    try:
        write_marker(spec, C.ERROR_MARKER, {"time": time.time() if failed_at is None else failed_at,
                                            "error": f"{type(exc).__name__}: {exc}"[:600]})
    except OSError:  # a full disk may refuse this too: the rank's traceback stays in the log
        pass


def write_oom_marker(spec: dict, exc: BaseException) -> None:
    """What this rank held when it ran out of memory, for the launcher's `oom` row."""
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if spec["platform"] != "cpu" else None
    write_marker(spec, C.OOM_MARKER, {
        "error": str(exc).splitlines()[0][:500],
        "allocated_bytes": torch.cuda.memory_allocated(device) if device is not None else None,
        "reserved_bytes": torch.cuda.memory_reserved(device) if device is not None else None,
        "host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})


if __name__ == "__main__":
    main()
