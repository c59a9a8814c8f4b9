"""The FSDP2 engine of the fsdp strategy (built on a rank; the strategy and its settings are in fsdp.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from workflow_scripts.training.grad_norm import clip_
from workflow_scripts.training.local_step import LocalAdamW
from workflow_scripts.training.models import transformer_blocks
from workflow_scripts.training.strategies.engine import Engine, adamw
from workflow_scripts.training.strategies.fsdp import fsdp_settings

if TYPE_CHECKING:
    from workflow_scripts.training.run_context import RunContext


class FSDPEngine(Engine):
    def __init__(self, model: torch.nn.Module, ctx: RunContext):
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        super().__init__(ctx)
        self.settings = fsdp_settings(ctx)
        mesh = ctx.data_mesh
        kwargs = {"mesh": mesh, "reshard_after_forward": self.settings["reshard_after_forward"]}
        if ctx.precision.bf16_params:
            kwargs["mp_policy"] = ctx.precision.fsdp_policy()
        if self.settings["cpu_offload"]:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda")
        else:
            model.to(ctx.device)
        if self.settings["wrap_blocks"]:
            for block in transformer_blocks(model):
                fully_shard(block, **kwargs)
        self.module = fully_shard(model, **kwargs)
        self.optimizer = adamw(model.parameters(), ctx)
        self.stepper = LocalAdamW(self.optimizer) if self.settings["local_step"] else self.optimizer

    def micro_step(self, last: bool):
        self.module.set_requires_gradient_sync(last)
        return super().micro_step(last)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.ctx.accum).backward()

    def optimizer_step(self, lr: float) -> None:
        if self.ctx.grad_clip and self.stepper is not self.optimizer:  # torch's norm, scaled on the shards' data
            clip_(self.module.parameters(), self.ctx.grad_clip)
        elif self.ctx.grad_clip and self.ctx.layout.data_only:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.ctx.grad_clip)
        elif self.ctx.grad_clip:  # tensor-parallel DTensors on another mesh than the replicated ones
            clip_(self.module.parameters(), self.ctx.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.stepper.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _state(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.module, self.optimizer)
        return {"model": model, "optimizer": optim}

    def save(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), checkpoint_id=f"{path}/fsdp")

    def load(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        dcp.load(state, checkpoint_id=f"{path}/fsdp")
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
