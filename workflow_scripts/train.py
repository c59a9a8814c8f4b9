"""The training loop, one process per rank, started by torchrun (see workflow_scripts.launch):

    torchrun --nproc-per-node 2 -m workflow_scripts.train --spec run_spec.json

The run spec (written by the launcher from config) names the model, strategy, data and training settings. Rank 0
writes `metrics.csv` (one row per optimizer step), `train_summary.json` and `strategy_settings.json` into the run's
output directory. Log lines look like `step 10: loss 3.2100, lr 3.0e-04, step 105.2ms, 12345 tok/s`.

Timing: no host synchronisation inside the step loop. On GPU each phase is bracketed by CUDA events, read with the
losses once per `log_every` steps; on CPU by perf_counter. The first `timing_warmup_steps` steps (and everything
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
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from workflow_scripts import harness, metrics as M
from workflow_scripts.models import build_model, count_params, flops_per_token, padded_vocab, MODELS
from workflow_scripts.step_signal import StepPublisher
from workflow_scripts.strategies import get as get_strategy
from workflow_scripts.strategies.base import PRECISIONS, RunContext

OOM_MARKER = "oom_rank{rank}.json"


# ---------------------------------------------------------------- setup
def init_distributed(platform: str) -> tuple[int, int, int, int, torch.device]:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if platform == "cpu":
        device, backend = torch.device("cpu"), "gloo"
    else:
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    return rank, local_rank, world, local_world, device


def run_context(spec: dict, rank, local_rank, world, local_world, device) -> RunContext:
    t = spec["train"]
    strategy = get_strategy(spec["strategy"])
    micro, accum = t["micro_batch_size"], t["grad_accum"]
    if strategy.accum_steps is not None:  # e.g. grad_accum: its own accumulation, same effective batch
        own = strategy.accum_steps(spec["options"])
        if spec["options"].get("keep_effective_batch", True):
            micro = micro * accum // own
        accum = own
    options = {k: v for k, v in spec["options"].items() if k not in ("accum_steps", "keep_effective_batch")}
    return RunContext(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
                      device=device, platform=spec["platform"], precision=spec["precision"], micro_batch=micro,
                      accum=accum, lr=t["lr"], weight_decay=t["weight_decay"], betas=tuple(t["betas"]),
                      eps=t["eps"], grad_clip=t["grad_clip"], seed=t["seed"], work_dir=spec["work_dir"],
                      options=options)


def lr_at(step: int, t: dict, total_steps: int) -> float:
    """Linear warm-up over lr_warmup_steps, then cosine decay to min_lr at the last step."""
    if step < t["lr_warmup_steps"]:
        return t["lr"] * (step + 1) / t["lr_warmup_steps"]
    span = max(1, total_steps - t["lr_warmup_steps"])
    progress = min(1.0, (step - t["lr_warmup_steps"]) / span)
    return t["min_lr"] + 0.5 * (t["lr"] - t["min_lr"]) * (1 + math.cos(math.pi * progress))


def load_data(spec: dict) -> tuple[dict, np.ndarray, np.ndarray, int]:
    """The tokens manifest, the training blocks (the first max_train_samples), the validation blocks, and the
    embedding rows: the tokenizer's vocabulary padded to vocab_multiple, or the original model's row count."""
    t = spec["train"]
    data = json.loads(Path(spec["data"]["manifest"]).read_text())
    blocks = np.load(spec["data"]["train"], mmap_mode="r")
    if t.get("max_train_samples"):
        blocks = blocks[: t["max_train_samples"]]
    val = np.load(spec["data"]["val"], mmap_mode="r")
    vocab = max(padded_vocab(data["vocab_size"], t["vocab_multiple"]), t.get("embedding_rows") or 0)
    return data, blocks, val, vocab


def make_model(spec: dict, vocab: int, seq_len: int):
    """The run's model (registry shape or pretrained weights), fp32 on the CPU, no generation cache."""
    model = build_model(spec["model"], vocab, seq_len, pretrained=spec.get("pretrained"),
                        attn_implementation=spec["train"]["attn_implementation"],
                        overrides=spec.get("model_overrides"))
    model.config.use_cache = False
    return model


class Batches:
    """Same samples, same order, for every strategy: epoch e uses permutation(seed + e) of the training blocks;
    step s takes the next `effective_batch` of them; rank r's micro-step m takes slots (m * world + r) * micro."""

    def __init__(self, blocks: np.ndarray, ctx: RunContext, seed: int, pin: bool):
        self.blocks, self.ctx, self.seed, self.pin = blocks, ctx, seed, pin
        self.steps_per_epoch = len(blocks) // ctx.effective_batch
        self._epoch, self._perm = None, None

    def micro_batches(self, step: int):
        epoch, s = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng(self.seed + epoch).permutation(len(self.blocks))
        c = self.ctx
        base = s * c.effective_batch
        for m in range(c.accum):
            start = base + (m * c.world_size + c.rank) * c.micro_batch
            idx = np.sort(self._perm[start:start + c.micro_batch])
            batch = torch.from_numpy(self.blocks[idx].astype(np.int64))
            if self.pin:
                batch = batch.pin_memory()
            yield batch.to(c.device, non_blocking=True)


class PhaseClock:
    """Marks phase boundaries with CUDA events (GPU) or perf_counter (CPU); durations are read at flush time."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        if self.cuda:
            return a.elapsed_time(b) / 1000.0
        return b - a

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


# ---------------------------------------------------------------- checkpoints
def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    pointer = ckpt_dir / "latest"
    if not pointer.exists():
        return None
    path = ckpt_dir / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def save_checkpoint(engine, ckpt_dir: Path, step: int, state: dict, rank: int) -> None:
    path = ckpt_dir / f"step_{step:08d}"
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    dist.barrier()
    engine.save(str(path))
    dist.barrier()
    if rank == 0:
        (path / "state.json").write_text(json.dumps(state))
        tmp = ckpt_dir / "latest.tmp"
        tmp.write_text(path.name)
        os.replace(tmp, ckpt_dir / "latest")  # atomic: a kill before this line keeps the previous checkpoint
        for old in ckpt_dir.glob("step_*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


# ---------------------------------------------------------------- evaluation
def evaluate(engine, val: np.ndarray, ctx: RunContext, samples: int) -> float:
    """Mean next-token loss over the same validation blocks for every strategy (`samples` per rank, read in
    chunks of the strategy's micro-batch), averaged over ranks."""
    per_rank = min(samples, len(val) // ctx.world_size)
    total = torch.zeros(2, device=ctx.device, dtype=torch.float64)
    if per_rank > 0:
        mine = val[ctx.rank::ctx.world_size][:per_rank]
        with engine.eval_mode():
            for i in range(0, per_rank, ctx.micro_batch):
                tokens = torch.from_numpy(mine[i:i + ctx.micro_batch].astype(np.int64)).to(ctx.device)
                total[0] += engine.forward_loss(tokens).double() * len(tokens)
                total[1] += len(tokens)
    dist.all_reduce(total)
    return float(total[0] / total[1]) if total[1] > 0 else float("nan")


# ---------------------------------------------------------------- the run
def train(spec: dict) -> dict:
    t = spec["train"]
    rank, local_rank, world, local_world, device = init_distributed(spec["platform"])
    ctx = run_context(spec, rank, local_rank, world, local_world, device)
    strategy = get_strategy(spec["strategy"])
    out_dir, work_dir = Path(spec["out_dir"]), Path(spec["work_dir"])
    ckpt_dir = work_dir / "ckpt"
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(t["seed"])
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(t.get("threads_per_rank", 1))))

    data, blocks, val, vocab = load_data(spec)
    seq_len = data["block_size"]
    model = make_model(spec, vocab, seq_len)
    n_params = count_params(model)
    if t["gradient_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    levers = harness.apply(model, t, zero3=strategy.family == "deepspeed" and strategy.zero_stage == 3)
    ctx.loss_fn = harness.loss_function(t)
    settings = {**strategy.settings(ctx), "harness": levers}
    if rank == 0:
        (out_dir / "strategy_settings.json").write_text(json.dumps(settings, indent=2, default=str))
    engine = strategy.build(model, ctx)

    batches = Batches(blocks, ctx, t["seed"], pin=device.type == "cuda")
    if batches.steps_per_epoch == 0:
        raise ValueError(f"train: {len(blocks)} training blocks give no full step of effective batch "
                         f"{ctx.effective_batch} (micro {ctx.micro_batch} x accum {ctx.accum} x world {world})")
    total_steps = t["epochs"] * batches.steps_per_epoch
    if t.get("max_steps"):
        total_steps = min(total_steps, t["max_steps"])

    eval_samples = t["eval_batches"] * t["micro_batch_size"]  # the study's micro-batch, not the strategy's
    # resume
    rows, start_step, val_initial, resumed_from = [], 0, None, None
    last = latest_checkpoint(ckpt_dir)
    if last is not None:
        state = json.loads((last / "state.json").read_text())
        engine.load(str(last))
        rows, start_step, val_initial = state["rows"], state["step"], state["val_loss_initial"]
        resumed_from = start_step
    if val_initial is None:
        val_initial = evaluate(engine, val, ctx, eval_samples)

    publisher = StepPublisher(os.environ.get("PIPELINE_STEP_FILE") if rank == 0 else None)
    clock = PhaseClock(device)
    inject_oom = (t.get("fault_injection") or {}).get("oom_at_step")
    tokens_per_step = ctx.effective_batch * seq_len
    pending, prev_end = [], None
    board = None
    if t.get("tensorboard") and rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        board = SummaryWriter(str(out_dir / "tensorboard"))
    t_start = time.time()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def flush():
        nonlocal prev_end
        if not pending:
            return
        clock.sync()
        losses = torch.stack([p["loss"] for p in pending]).double()
        dist.all_reduce(losses)
        losses = (losses / world).tolist()
        for p, loss in zip(pending, losses):
            marks = p["marks"]
            fwd = sum(clock.seconds(a, b) for a, b, _ in marks["micro"])
            bwd = sum(clock.seconds(b, c) for _, b, c in marks["micro"])
            step_time = clock.seconds(prev_end if prev_end is not None else marks["start"], marks["end"])
            prev_end = marks["end"]
            rows.append({"step": p["step"] + 1, "epoch": p["step"] // batches.steps_per_epoch, "loss": loss,
                         "lr": p["lr"], "step_time_s": step_time, "forward_s": fwd, "backward_s": bwd,
                         "optimizer_s": clock.seconds(marks["opt"], marks["end"]),
                         "tokens": tokens_per_step, "samples": ctx.effective_batch,
                         "warmup": p["step"] - start_step < t["timing_warmup_steps"],
                         "wall_s": p["wall"] - t_start})
        if board is not None:
            for r in rows[-len(pending):]:
                for key in ("loss", "lr", "step_time_s"):
                    board.add_scalar(f"train/{key}", r[key], r["step"])
            board.flush()
        if rank == 0:
            r = rows[-1]
            print(f"step {r['step']}: loss {r['loss']:.4f}, lr {r['lr']:.2e}, step {1000 * r['step_time_s']:.1f}ms, "
                  f"{r['tokens'] / max(r['step_time_s'], 1e-9):.0f} tok/s", flush=True)
        pending.clear()

    for step in range(start_step, total_steps):
        publisher.publish(step + 1)
        if inject_oom is not None and step + 1 == inject_oom and rank == 0:
            raise torch.OutOfMemoryError(f"injected allocation failure at step {step + 1} (fault_injection)")
        lr = lr_at(step, t, total_steps)
        marks = {"start": clock.mark(), "micro": []}
        loss_sum = torch.zeros((), device=device)
        for m, tokens in enumerate(batches.micro_batches(step)):
            with engine.micro_step(last=m == ctx.accum - 1):
                a = clock.mark()
                loss = engine.forward_loss(tokens)
                b = clock.mark()
                engine.backward(loss)
                marks["micro"].append((a, b, clock.mark()))
            loss_sum += loss.detach().float()
        marks["opt"] = clock.mark()
        engine.optimizer_step(lr)
        marks["end"] = clock.mark()
        pending.append({"step": step, "loss": loss_sum / ctx.accum, "lr": lr, "marks": marks, "wall": time.time()})
        done = step + 1
        if done % t["log_every"] == 0 or done == total_steps:
            flush()
        if t["checkpoint_every"] and done % t["checkpoint_every"] == 0 and done < total_steps:
            flush()
            save_checkpoint(engine, ckpt_dir, done, {"step": done, "rows": rows, "val_loss_initial": val_initial},
                            rank)
            prev_end = None  # the save is not training time: the next step is timed from its own start
    flush()
    publisher.publish(total_steps + 1)
    val_final = evaluate(engine, val, ctx, eval_samples)
    if board is not None:
        board.add_scalar("val/loss", val_final, total_steps)
        board.close()

    # memory of all ranks
    mem = torch.tensor([torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0,
                        torch.cuda.max_memory_reserved(device) if device.type == "cuda" else 0,
                        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.float64,
                       device=device)  # NCCL gathers device tensors only
    gathered = [torch.zeros_like(mem) for _ in range(world)]
    dist.all_gather(gathered, mem)
    gathered = torch.stack(gathered).tolist()

    summary = None
    if rank == 0:
        spec_model = MODELS[spec["model"]]
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        summary = summarise(spec, ctx, strategy, rows, batches.steps_per_epoch, total_steps, seq_len, vocab,
                            data["vocab_size"], n_params, spec_model, device_name, val_initial, val_final, gathered,
                            resumed_from)
        summary.update(compile_blocks=levers["compile_blocks"], compile_loss=levers["compile_loss"])
        write_metrics(out_dir / "metrics.csv", rows)
        (out_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)  # the run is complete: checkpoints are no longer needed
    dist.barrier()
    return summary


def summarise(spec, ctx, strategy, rows, steps_per_epoch, total_steps, seq_len, vocab, tokenizer_vocab, n_params,
              spec_model, device_name, val_initial, val_final, gathered, resumed_from) -> dict:
    fpt = flops_per_token(n_params, spec_model.n_layer, spec_model.d_model, seq_len)
    epoch_wall = {}
    for r in rows:
        epoch_wall[r["epoch"]] = epoch_wall.get(r["epoch"], 0.0) + r["step_time_s"]
    return {
        "status": "ok", "run_id": spec["run_id"], "model": spec["model"], "strategy": spec["strategy"],
        "family": strategy.family, "zero_stage": strategy.zero_stage, "world_size": ctx.world_size,
        "repeat": spec["repeat"], "platform": spec["platform"], "device_name": device_name,
        "precision": ctx.precision, "precision_detail": PRECISIONS[ctx.precision],
        "n_params": n_params, "n_layer": spec_model.n_layer, "d_model": spec_model.d_model, "seq_len": seq_len,
        "vocab_size": vocab, "tokenizer_vocab_size": tokenizer_vocab, "micro_batch": ctx.micro_batch,
        "grad_accum": ctx.accum,
        "effective_batch": ctx.effective_batch, "tokens_per_step": ctx.effective_batch * seq_len,
        "steps": total_steps, "steps_per_epoch": steps_per_epoch, "epochs": total_steps / steps_per_epoch,
        "train_samples": int(ctx.effective_batch * total_steps),
        "timing_warmup_steps": spec["train"]["timing_warmup_steps"],
        "epoch_time_s": [epoch_wall[e] for e in sorted(epoch_wall)],
        "train_time_s": sum(r["step_time_s"] for r in rows),
        "flops_per_token": fpt, "peak_tflops": M.peak_tflops(device_name),
        **M.timing(rows, steps_per_epoch, ctx.world_size, fpt, device_name, spec["train"]["checkpoint_every"]),
        "peak_allocated_bytes": max(g[0] for g in gathered) if ctx.device.type == "cuda" else None,
        "peak_reserved_bytes": max(g[1] for g in gathered) if ctx.device.type == "cuda" else None,
        "peak_host_rss_bytes_per_rank": [g[2] for g in gathered],
        "peak_host_rss_bytes": sum(g[2] for g in gathered),
        "initial_loss": rows[0]["loss"] if rows else None, "final_loss": rows[-1]["loss"] if rows else None,
        "val_loss_initial": val_initial, "val_loss_final": val_final,
        "val_ppl_final": math.exp(val_final) if val_final == val_final and val_final < 50 else None,
        **M.model_state_bytes(n_params, ctx.world_size, strategy.zero_stage, ctx.precision,
                              strategy.offload_optimizer(ctx), strategy.offload_params(ctx)),
        "resumed_from_step": resumed_from,
    }


def write_metrics(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="run spec JSON written by workflow_scripts.launch")
    spec = json.loads(Path(ap.parse_args(argv).spec).read_text())
    try:
        train(spec)
        # Everything is written and every rank passed the last barrier: leave without running C++ destructors.
        # DeepSpeed's CPU shared-memory comm threads sometimes abort a rank at interpreter exit ("terminate
        # called without an active exception", seen once in CI-sized runs), which would fail a finished run.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except torch.OutOfMemoryError as exc:
        rank = int(os.environ.get("RANK", 0))
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if spec["platform"] != "cpu" else None
        info = {"rank": rank, "error": str(exc).splitlines()[0][:500],
                "allocated_bytes": torch.cuda.memory_allocated(device) if device is not None else None,
                "reserved_bytes": torch.cuda.memory_reserved(device) if device is not None else None,
                "host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        Path(spec["out_dir"]).mkdir(parents=True, exist_ok=True)
        Path(spec["out_dir"], OOM_MARKER.format(rank=rank)).write_text(json.dumps(info))
        raise


if __name__ == "__main__":
    main()
