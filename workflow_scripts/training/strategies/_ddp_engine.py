"""The DDP engine shared by ddp, ddp_overlap and grad_accum: torch DistributedDataParallel + torch AdamW (built on a
rank; the settings the registry reads are in _ddp.py)."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel

from workflow_scripts.training.strategies._ddp import ddp_settings
from workflow_scripts.training.strategies.engine import Engine, adamw

if TYPE_CHECKING:
    from workflow_scripts.training.run_context import RunContext


class DDPEngine(Engine):
    def __init__(self, model: torch.nn.Module, ctx: RunContext, ddp_kwargs: dict):
        super().__init__(ctx)
        model.to(ctx.device)
        self.master = None
        if ctx.precision.bf16_params:
            self.master = [p.detach().clone().float() for p in model.parameters()]
            model.to(torch.bfloat16)
        self.model = model
        self.wrapped = ctx.world_size > 1  # one rank: DDP's all-reduce is the identity, its per-parameter hooks
        # and bucket copies only cost host time (and split a compiled model into one graph per bucket)
        self.module = DistributedDataParallel(
            model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            process_group=ctx.dp_group, **ddp_kwargs) if self.wrapped else model
        self.optimizer = adamw(self.master if self.master is not None else model.parameters(), ctx)
        self.settings = ddp_settings(ctx, ddp_kwargs)

    def micro_step(self, last: bool):
        return contextlib.nullcontext() if last or not self.wrapped else self.module.no_sync()

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.ctx.accum).backward()

    def optimizer_step(self, lr: float) -> None:
        params = list(self.model.parameters())
        if self.master is not None:
            for m, p in zip(self.master, params):
                m.grad = None if p.grad is None else p.grad.float()
            params = self.master
        if self.ctx.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, self.ctx.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)
        if self.master is not None:
            with torch.no_grad():
                for m, p in zip(self.master, self.model.parameters()):
                    p.copy_(m)

    def save(self, path: str) -> None:
        if self.ctx.rank == 0:
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "master": self.master}, f"{path}/ddp.pt")
        torch.distributed.barrier()

    def load(self, path: str) -> None:
        state = torch.load(f"{path}/ddp.pt", map_location=self.ctx.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        if self.master is not None:
            for m, saved in zip(self.master, state["master"]):
                m.data.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
