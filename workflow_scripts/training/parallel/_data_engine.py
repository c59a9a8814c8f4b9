"""The data-parallel dimension's engines around a model part of a model-parallel layout (data.py says which; built
on a rank)."""
from __future__ import annotations

from torch import nn

from workflow_scripts.training.strategies._fsdp_engine import FSDPEngine
from workflow_scripts.training.strategies.base import adamw_settings, batch_settings
from workflow_scripts.training.strategies.engine import Engine, adamw


class ReplicatedEngine(FSDPEngine):
    """The ddp family's data-parallel dimension of a model-parallel layout: composable `replicate` over
    mesh["dp"] (gradients all-reduced once per optimizer step) + torch AdamW. Steps, gradient sync and
    checkpoints as FSDP2's engine (the same composable machinery)."""

    def __init__(self, model: nn.Module, ctx):  # noqa: super-init-not-called: no fully_shard here
        from torch.distributed._composable.replicate_with_fsdp import replicate

        Engine.__init__(self, ctx)
        model.to(ctx.device)
        mp = ctx.precision.fsdp_policy()
        self.module = replicate(model, mesh=ctx.data_mesh, mp_policy=mp)
        self.optimizer = adamw(model.parameters(), ctx)
        self.stepper = self.optimizer  # torch's own step over the DTensors
        self.settings = {"engine": "torch.distributed._composable.replicate_with_fsdp.replicate over mesh['dp']",
                         "mixed_precision_policy": "bf16 params and reduce" if ctx.precision.bf16_params else None,
                         **batch_settings(ctx), "optimizer": adamw_settings(ctx)}


def data_parallel_engine(strategy, model: nn.Module, ctx) -> Engine:
    """The data-parallel dimension around a model part of a model-parallel layout (see the module docstring)."""
    return strategy.build(model, ctx) if strategy.family == "fsdp" else ReplicatedEngine(model, ctx)
