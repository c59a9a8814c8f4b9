"""The baseline our harness is measured against: Hugging Face `Trainer` training the same model on the same token
blocks with the same strategy settings (one process per rank, started by torchrun):

    torchrun --nproc-per-node N -m workflow_scripts.bench.trainer --spec run_spec.json

The run spec is the one our trainer gets (workflow_scripts.study.run_spec). From it: the model (same registry
entry, same embedding rows), micro-batch, accumulation and effective batch, learning-rate schedule (linear
warm-up, cosine), AdamW hyper-parameters, gradient clipping, sequence length, steps. Strategy settings:
  deepspeed family -> `TrainingArguments(deepspeed=<the exact DeepSpeed JSON our strategy builds>)`;
  fsdp             -> `fsdp="full_shard auto_wrap"`, FSDP2, one unit per transformer block, reshard after forward
                      (on CPU ranks accelerate has no FSDP and the Trainer trains with DDP: recorded as
                      settings.trainer_fsdp_active);
  ddp              -> torchrun's DDP, as the Trainer does by itself.
Precision: `bf16=True` for the bf16 policies, which is autocast for DDP, DeepSpeed's bf16 mode and FSDP2's
bf16 MixedPrecisionPolicy (what Trainer/accelerate choose); workflow_scripts.bench.harness gives our runs the
matching policy per family. The Trainer runs in the setting the spec's `trainer_setting` names, each as its users
turn it on: eager (its defaults), compile (`torch_compile=True`), liger (`use_liger_kernel=True`: Liger's fused
kernels, RMSNorm, RoPE, SwiGLU and the fused linear cross-entropy, patched into the model by transformers); a
setting that cannot run here (liger-kernel not installed, or no Liger patch for the model type) writes a summary
with status `unavailable` and the reason.

Throughput: wall time between the end of optimizer step `timing_warmup_steps` and the end of the last step, with a
device synchronisation at both ends only. Rank 0 writes `trainer_summary.json` (SUMMARY) into the spec's out_dir.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers import __version__ as TRANSFORMERS_VERSION

from workflow_scripts import columns as C
from workflow_scripts import schema
from workflow_scripts.measure import metrics as M
from workflow_scripts.run_spec import RunSpec
from workflow_scripts.training import recompute
from workflow_scripts.training.batches import load_data, make_model
from workflow_scripts.training.context import from_spec, process_env
from workflow_scripts.training.models import count_params, model_flops_per_token, transformer_blocks
from workflow_scripts.training.strategies import get as get_strategy
from workflow_scripts.training.strategies._deepspeed import gloo_collectives_on_cpu
from workflow_scripts.training.strategies.engine import input_ids, targets


class TokenBlocks(torch.utils.data.Dataset):
    """The packed training blocks as causal-LM examples (the model shifts the labels itself; context-only tokens of
    chat data are labelled -100, as our loss ignores them)."""

    def __init__(self, blocks: np.ndarray):
        self.blocks = blocks

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        tokens = torch.from_numpy(self.blocks[i].astype(np.int64))
        return {"input_ids": input_ids(tokens), "labels": targets(tokens)}


def strategy_arguments(spec: dict, ctx, model) -> tuple[dict, dict]:
    """TrainingArguments keys for the strategy, and what to record about them."""
    strategy = get_strategy(spec["strategy"])
    settings = strategy.settings(ctx)
    if strategy.family == "deepspeed":
        cfg = settings["deepspeed_config"]
        return {"deepspeed": cfg}, {"deepspeed_config": cfg}
    if strategy.family == "fsdp":
        block = type(transformer_blocks(model)[0]).__name__
        fsdp_config = {"fsdp_version": 2, "transformer_layer_cls_to_wrap": [block],
                       "reshard_after_forward": settings["reshard_after_forward"]}  # as ours resolves it
        return ({"fsdp": "full_shard auto_wrap", "fsdp_config": fsdp_config},
                {"fsdp": "full_shard auto_wrap", "fsdp_config": fsdp_config})
    return {}, {"ddp": "Trainer's own DistributedDataParallel"}


class StepTimer(TrainerCallback):
    """Synchronised wall clock at the end of optimizer step `warmup` and of the last step."""

    def __init__(self, warmup: int, cuda: bool):
        self.warmup, self.cuda = warmup, cuda
        self.start = self.end = self.start_step = self.end_step = None

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.warmup:
            self.start, self.start_step = self._now(), state.global_step
        if state.global_step == state.max_steps:
            self.end, self.end_step = self._now(), state.global_step


def training_arguments(spec: dict, ctx, total_steps: int, extra: dict) -> TrainingArguments:
    """The Trainer's settings from the same spec our trainer reads (see the module docstring)."""
    t, cuda = spec["train"], ctx.device.type == "cuda"
    recomputes = recompute.mode(t)
    return TrainingArguments(
        output_dir=str(Path(spec["work_dir"]) / "trainer"), per_device_train_batch_size=ctx.micro_batch,
        gradient_accumulation_steps=ctx.accum, max_steps=total_steps, learning_rate=t["lr"],
        weight_decay=t["weight_decay"], adam_beta1=t["betas"][0], adam_beta2=t["betas"][1], adam_epsilon=t["eps"],
        max_grad_norm=t["grad_clip"], lr_scheduler_type="cosine", warmup_steps=t["lr_warmup_steps"],
        optim="adamw_torch_fused" if cuda else "adamw_torch", bf16=ctx.precision.uses_bf16,
        gradient_checkpointing=recomputes is not None,
        gradient_checkpointing_kwargs=recompute.checkpoint_kwargs(recomputes), logging_steps=t["log_every"],
        save_strategy="no", report_to=[], disable_tqdm=True, seed=t["seed"], data_seed=t["seed"],
        dataloader_pin_memory=cuda, use_cpu=not cuda, ddp_backend=None if cuda else "gloo",
        **extra)


SETTINGS = tuple(schema.schema()["properties"]["bench"]["properties"]["trainer_settings"]["items"]["enum"])  # once
SUMMARY = "trainer_summary.json"


def cannot_run(setting: str, model_type: str) -> str | None:
    """Why a Trainer setting cannot run here for a model of this transformers model_type; None if it can. Asked
    by the harness before it launches a run (a setting that cannot run costs no torchrun) and by the run itself."""
    if setting in ("eager", "compile"):
        return None
    if setting != "liger":
        raise ValueError(f"bench.trainer_settings: unknown setting {setting!r} (one of {', '.join(SETTINGS)})")
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as exc:
        return f"liger-kernel is not installed ({exc})"
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return f"liger-kernel has no patch for model type {model_type!r}"
    return None


def setting_arguments(setting: str, model) -> tuple[dict, str | None]:
    """TrainingArguments keys of a Trainer setting, or why it cannot run here."""
    why_not = cannot_run(setting, model.config.model_type)
    if why_not:
        return {}, why_not
    return {"compile": {"torch_compile": True}, "liger": {"use_liger_kernel": True}}.get(setting, {}), None


def unavailable(spec: dict, setting: str, reason: str) -> dict:
    summary = {"status": "unavailable", "runner": "hf_trainer", "trainer_setting": setting, "reason": reason,
               "run_id": spec["run_id"], "model": spec["model"], "strategy": spec["strategy"]}
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SUMMARY).write_text(json.dumps(summary, indent=2))
    return summary


def run(spec: dict) -> dict | None:
    t = spec["train"]
    rank, local_rank, world, local_world, device = process_env(spec["platform"])
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(max(1, int(schema.filled("train", t)["threads_per_rank"])))
    ctx = from_spec(spec, rank, local_rank, local_world, device)
    data, blocks, _, vocab = load_data(spec)
    seq_len = data["block_size"]
    torch.manual_seed(t["seed"])
    model = make_model(RunSpec.of(spec), vocab, seq_len)
    n_params = count_params(model)
    steps_per_epoch = len(blocks) // ctx.effective_batch
    total_steps = min(t["epochs"] * steps_per_epoch, t.get("max_steps") or 10**12)
    warmup = t["timing_warmup_steps"]
    if total_steps <= warmup:
        raise ValueError(f"bench.trainer: {total_steps} steps leave none after {warmup} timing warm-up steps")
    setting = spec["trainer_setting"]  # the harness's baseline spec names it (bench.trainer_settings)
    gloo_collectives_on_cpu(spec["platform"])  # the same collectives as ours (no-op on GPU)
    extra, recorded = strategy_arguments(spec, ctx, model)
    setting_extra, why_not = setting_arguments(setting, model)
    if why_not:
        return unavailable(spec, setting, why_not) if rank == 0 else None
    extra = {**extra, **setting_extra}
    out_dir = Path(spec["out_dir"])
    args = training_arguments(spec, ctx, total_steps, extra)
    timer = StepTimer(warmup, cuda)
    trainer = Trainer(model=model, args=args, train_dataset=TokenBlocks(blocks), callbacks=[timer])
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    trainer.train()
    peak = torch.tensor([torch.cuda.max_memory_allocated(device) if cuda else 0,
                         torch.cuda.max_memory_reserved(device) if cuda else 0], dtype=torch.float64,
                        device=device)
    if dist.is_initialized():
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank != 0:
        return None
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    seconds = timer.end - timer.start
    tokens = (timer.end_step - timer.start_step) * ctx.effective_batch * seq_len
    tokens_per_s = tokens / seconds
    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    fpt = model_flops_per_token(spec["model"], n_params, seq_len)
    summary = {
        "status": C.OK, "runner": "hf_trainer", "trainer_setting": setting, "run_id": spec["run_id"],
        "model": spec["model"],
        "strategy": spec["strategy"], "world_size": world, "precision": spec["precision"],
        "trainer_bf16": args.bf16, "device_name": device_name, "n_params": n_params, "seq_len": seq_len,
        "micro_batch": ctx.micro_batch, "grad_accum": ctx.accum, "effective_batch": ctx.effective_batch,
        "steps": total_steps, "timed_steps": timer.end_step - timer.start_step, "timed_s": seconds,
        "step_time_s": seconds / (timer.end_step - timer.start_step), "tokens_per_s": tokens_per_s,
        "flops_per_token": fpt, "mfu": M.mfu(fpt, tokens_per_s, world, device_name),
        "peak_allocated_bytes": peak[0].item() if cuda else None,
        "peak_reserved_bytes": peak[1].item() if cuda else None,
        "final_loss": losses[-1] if losses else None, "losses": losses,
        "settings": {**recorded, **setting_extra, "trainer_fsdp_active": trainer.is_fsdp_enabled},
        "transformers_version": TRANSFORMERS_VERSION,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SUMMARY).write_text(json.dumps(summary, indent=2, default=str))
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="the run spec (same format as workflow_scripts.training.loop's)")
    run(json.loads(Path(ap.parse_args(argv).spec).read_text()))
    # Leave the process group before the interpreter does: without it a rank aborted at exit about one run in three
    # on CPU ranks ("terminate called without an active exception", SIGABRT after the summary was written), which
    # torchrun reported as a failed baseline (the CI failure of two stops ago).
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
