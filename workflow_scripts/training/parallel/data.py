"""dp, data parallelism: every dp rank trains on its own slots of the same global batch (training/batches.py) and
the strategy synchronises or shards over the dp ranks.

A pure data-parallel layout uses the strategy's own engine: DDP (replicated), DeepSpeed ZeRO stages 0-3 or FSDP2
over all ranks. A layout with model-parallel dimensions (pp, tp, ...) wraps its model part over `mesh["dp"]` with
PyTorch's composable APIs, which accept the DTensor parameters of tensor parallelism and pipeline stages:
  fsdp       -> the strategy's FSDP2 engine (`fully_shard` per block + root over mesh["dp"]);
  ddp family -> `replicate` (torch.distributed._composable.replicate_with_fsdp: DDP's semantics, replicated
                parameters and all-reduced gradients, on FSDP2's machinery). `DistributedDataParallel` itself is
                not used there: its reducer does not reduce a pipeline stage whose micro-batch forwards precede
                their backwards (measured: dp ranks kept different gradients), and it does not take DTensor
                parameters. DDP's bucket options (ddp_overlap) therefore do not apply to such layouts;
  DeepSpeed  -> refused for model-parallel layouts (its engine owns the model whole).
"""
from __future__ import annotations

from torch import nn

from workflow_scripts.training.parallel import Dimension
from workflow_scripts.training.strategies.base import Engine, adamw, adamw_settings, batch_settings
from workflow_scripts.training.strategies.fsdp import FSDPEngine

FAMILIES = ("ddp", "fsdp")  # strategy families that compose with model-parallel dimensions


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
        self.settings = {"engine": "torch.distributed._composable.replicate_with_fsdp.replicate over mesh['dp']",
                         "mixed_precision_policy": "bf16 params and reduce" if ctx.precision.bf16_params else None,
                         **batch_settings(ctx), "optimizer": adamw_settings(ctx)}



def data_parallel_engine(strategy, model: nn.Module, ctx) -> Engine:
    """The data-parallel dimension around a model part of a model-parallel layout (see the module docstring)."""
    return strategy.build(model, ctx) if strategy.family == "fsdp" else ReplicatedEngine(model, ctx)


def problems(layout, strategy, train: dict, where: str) -> list[str]:
    if layout.data_only or strategy.family in FAMILIES:
        return []
    return [f"{where}: {layout.key} with strategy {strategy.name}: model-parallel layouts compose with the "
            f"{', '.join(FAMILIES)} families only (DeepSpeed's engine owns the model whole)"]


DIMENSION = Dimension(key="dp", description="data parallel: DDP, DeepSpeed ZeRO or FSDP2 over the dp ranks "
                                            "(the run's strategy)", problems=problems,
                      compiled_on_gpu=True)
