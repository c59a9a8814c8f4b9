"""The Strategy record and the settings every strategy records; read without torch (the registry is read by every
Snakefile parse and config check).

A strategy is one small module that builds a `Strategy`: its exact settings (the DeepSpeed JSON, the DDP or FSDP
keyword arguments), a check for platforms that cannot run it, and an engine around the model (engine.py: the
interface; the engine modules `_ddp_engine`, `_deepspeed_engine`, `_fsdp_engine` import torch and their library
only when a rank builds one, through `training.lazy.part`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workflow_scripts.training import lazy

if TYPE_CHECKING:
    from workflow_scripts.training.run_context import RunContext


def adamw_settings(ctx: RunContext) -> dict:
    impl = "torch.optim.AdamW(fused=True)" if ctx.device.type == "cuda" else "torch.optim.AdamW(foreach=True)"
    return {"impl": impl, "lr": ctx.lr, "betas": list(ctx.betas), "eps": ctx.eps,
            "weight_decay": ctx.weight_decay, "grad_clip": ctx.grad_clip}


def batch_settings(ctx: RunContext) -> dict:
    """The batch and precision keys every engine records in its settings."""
    return {"micro_batch": ctx.micro_batch, "grad_accum": ctx.accum, "effective_batch": ctx.effective_batch,
            "precision": ctx.precision.name, "precision_detail": ctx.precision.detail}


@dataclass
class Strategy:
    """One training strategy. `family` groups the engines: ddp, deepspeed, fsdp."""

    name: str
    family: str
    description: str
    build: Callable  # (model, ctx) -> Engine
    settings: Callable  # (ctx) -> dict, the exact settings, computed before the model exists
    zero_stage: int  # 0 for DDP (replicated), 3 for FSDP full sharding
    offload_optimizer: Callable = lambda ctx: False
    offload_params: Callable = lambda ctx: False
    # (ctx) -> whether the gathered (unsharded) parameters stay from forward to backward (FSDP2 not resharding)
    keeps_gathered_params: Callable = lambda ctx: False
    # (ctx) -> whether a sharding engine gathers and reduces block by block (hooks per transformer block), or once
    # for the whole model (FSDP2 with one unit: wrap_blocks false)
    hooks_per_block: Callable = lambda ctx: True
    unsupported: Callable = lambda ctx: None  # (ctx) -> reason or None, for reasons other than a missing op
    ops: tuple = ()  # DeepSpeed op builders this strategy needs, built once before any rank starts
    # (options) -> (accumulation steps, keep the effective batch), if the strategy accumulates on its own; the
    # options it reads are the run context's (consumed before the engine sees them), not the engine's
    accumulation: Callable | None = None
    compile_blocks: Callable = lazy.part(f"{__package__}.engine", "compile_blocks")  # (model, mode) -> dict
    compile_model: Callable = lazy.part(f"{__package__}.engine", "compile_model")  # (engine, mode) -> dict
    # the keys its `strategy_options` section may hold, checked before any job starts (config_check); None: any
    option_keys: tuple | None = None
    # (options) -> one line per problem, for options a library validates (DeepSpeed: training.strategies.
    # _deepspeed checks them against its config models); set, it replaces the option_keys check
    option_problems: Callable | None = None
    in_figures: bool = True
    # (precision policy name, options) -> the policy the engine really runs (DeepSpeed's bf16 mode replaces
    # bf16-mixed where ZeRO++ quantizes weights): the one rule of the engine's config, config_check and the models
    engine_precision: Callable = lambda precision, options: precision
    # a consistency check: this strategy's losses must equal those of the named one at the same layout and
    # repeat (report/tables.py puts the difference in the summary and warns beyond verify.tolerances.loss_abs)
    must_match: str | None = None
