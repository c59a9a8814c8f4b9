"""The optimizer step of DTensor parameters (FSDP2) on each rank's own shards: torch's AdamW arithmetic, the same
functional kernels its `step` calls (fused on GPU, foreach on CPU), handed the shards' plain tensors instead of the
DTensors, so the step costs no DTensor dispatch per call (one H100, GPT-2-medium, micro-batch 16: FSDP2's
optimizer phase through DTensors takes 26 ms against DDP's 5.5 ms for the same fused AdamW arithmetic).

AdamW is elementwise, so a shard's update is the one its DTensor would get: losses are those of `optimizer.step()`.
The optimizer object stays torch's own over the DTensors (its state is what checkpoints save and load); its first
step is torch's own (which creates that state), every later one goes through `step` here.
"""
from __future__ import annotations

import torch
from torch.optim.adamw import adamw

from workflow_scripts.training.grad_norm import local as shard


class LocalAdamW:
    """Steps a torch.optim.AdamW built over DTensor parameters on their local shards."""

    def __init__(self, optimizer: torch.optim.AdamW):
        if not isinstance(optimizer, torch.optim.AdamW):
            raise TypeError(f"LocalAdamW steps torch.optim.AdamW, not {type(optimizer).__name__}")
        self.optimizer = optimizer

    @torch.no_grad()
    def step(self) -> None:
        opt = self.optimizer
        if any(p.grad is not None and p not in opt.state for g in opt.param_groups for p in g["params"]):
            opt.step()  # a parameter without state yet: torch creates it (as DTensors, what checkpoints hold)
            return
        for group in opt.param_groups:
            self._step_group(group)

    def _step_group(self, group: dict) -> None:
        if group["amsgrad"] or group["maximize"] or group["differentiable"]:
            raise ValueError("LocalAdamW: amsgrad, maximize and differentiable are not used by this pipeline")
        params = [p for p in group["params"] if p.grad is not None]
        state = [self.optimizer.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adamw([shard(p) for p in params], [shard(p.grad) for p in params], [shard(s["exp_avg"]) for s in state],
              [shard(s["exp_avg_sq"]) for s in state], [], [s["step"] for s in state], foreach=group["foreach"],
              capturable=group["capturable"], differentiable=False, fused=group["fused"], amsgrad=False,
              beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
              maximize=False)
