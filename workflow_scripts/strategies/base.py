"""What every strategy shares: the run context, the precision policy, the optimizer and the engine interface.

A strategy is one small module that builds a `Strategy`: its exact settings (the DeepSpeed JSON, the DDP or FSDP
keyword arguments), a check for platforms that cannot run it, and an engine around the model. The training loop
(`workflow_scripts.train`) only talks to `Engine`:

    for micro in range(accum):
        with engine.micro_step(last=micro == accum - 1):
            loss = engine.forward_loss(tokens)
            engine.backward(loss)
    engine.optimizer_step(lr)
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

PRECISIONS = {
    "fp32": "fp32 parameters, gradients, optimizer and compute",
    "bf16-mixed": "fp32 parameters, gradients and optimizer; forward/backward compute under torch.autocast(bf16)",
    "bf16-pure": "bf16 parameters and compute, fp32 master weights and optimizer states",
}


@dataclass
class RunContext:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    platform: str  # cpu | cuda | rocm
    precision: str
    micro_batch: int
    accum: int
    lr: float
    weight_decay: float
    betas: tuple
    eps: float
    grad_clip: float
    seed: int
    work_dir: str  # per-run scratch (offload files, ...)
    options: dict = field(default_factory=dict)  # this strategy's section of `strategy_options`
    loss_fn: Callable | None = None  # (logits, tokens) -> loss; None: lm_loss (see workflow_scripts.harness)

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accum * self.world_size


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in fp32 over positions 0..T-2 predicting 1..T-1."""
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1).long())


def autocast(ctx: RunContext):
    if ctx.precision == "bf16-mixed":
        return torch.autocast(device_type=ctx.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def adamw(params, ctx: RunContext) -> torch.optim.Optimizer:
    """The one optimizer of every non-offload strategy: torch AdamW, fused kernels on GPU, foreach on CPU."""
    kind = {"fused": True} if ctx.device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(params, lr=ctx.lr, betas=tuple(ctx.betas), eps=ctx.eps,
                             weight_decay=ctx.weight_decay, **kind)


def adamw_settings(ctx: RunContext) -> dict:
    impl = "torch.optim.AdamW(fused=True)" if ctx.device.type == "cuda" else "torch.optim.AdamW(foreach=True)"
    return {"impl": impl, "lr": ctx.lr, "betas": list(ctx.betas), "eps": ctx.eps,
            "weight_decay": ctx.weight_decay, "grad_clip": ctx.grad_clip}


class Engine:
    """Interface the training loop drives. `settings` is what gets saved next to the run's results."""

    module: torch.nn.Module
    settings: dict
    precision_detail: str

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def forward_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        with autocast(self.ctx):
            logits = self.module(input_ids=tokens).logits
        return (self.ctx.loss_fn or lm_loss)(logits, tokens)

    def micro_step(self, last: bool):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def optimizer_step(self, lr: float) -> None:
        raise NotImplementedError

    def eval_mode(self):
        return _EvalMode(self.module)

    def save(self, path: str) -> None:
        raise NotImplementedError

    def load(self, path: str) -> None:
        raise NotImplementedError


class _EvalMode:
    def __init__(self, module):
        self.module = module

    def __enter__(self):
        self.module.eval()
        self._grad = torch.no_grad()
        self._grad.__enter__()

    def __exit__(self, *exc):
        self._grad.__exit__(*exc)
        self.module.train()


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
    unsupported: Callable = lambda ctx: None  # (ctx) -> reason or None, for reasons other than a missing op
    ops: tuple = ()  # DeepSpeed op builders this strategy needs, built once before any rank starts
    accum_steps: Callable | None = None  # (options) -> accumulation steps, if the strategy sets its own
    in_figures: bool = True
