"""dp, data parallelism: every dp rank trains on its own slots of the same global batch (training/batches.py) and
the strategy synchronises or shards over the dp ranks.

A pure data-parallel layout uses the strategy's own engine: DDP (replicated), DeepSpeed ZeRO stages 0-3 or FSDP2
over all ranks. A layout with model-parallel dimensions (pp, tp, ...) wraps its model part over `mesh["dp"]` with
PyTorch's composable APIs, which accept the DTensor parameters of tensor parallelism and pipeline stages:
  fsdp       -> the strategy's FSDP2 engine (`fully_shard` per block + root over mesh["dp"]);
  ddp family -> `replicate` (torch.distributed._composable.replicate_with_fsdp: DDP's semantics, replicated
                parameters and all-reduced gradients, on FSDP2's machinery). `DistributedDataParallel` itself is
                not used there: its reducer does not reduce a pipeline stage whose micro-batch forwards precede
                their backwards (the dp ranks end with different gradients), and it does not take DTensor
                parameters. DDP's bucket options (ddp_overlap) therefore do not apply to such layouts;
  DeepSpeed  -> refused for model-parallel layouts (its engine owns the model whole).
The engines are in _data_engine.py (torch, built on a rank).
"""
from __future__ import annotations

from workflow_scripts.training.parallel import Dimension

FAMILIES = ("ddp", "fsdp")  # strategy families that compose with model-parallel dimensions


def problems(layout, strategy, train: dict, where: str) -> list[str]:
    if layout.data_only or strategy.family in FAMILIES:
        return []
    return [f"{where}: {layout.key} with strategy {strategy.name}: model-parallel layouts compose with the "
            f"{', '.join(FAMILIES)} families only (DeepSpeed's engine owns the model whole)"]


DIMENSION = Dimension(key="dp", description="data parallel: DDP, DeepSpeed ZeRO or FSDP2 over the dp ranks "
                                            "(the run's strategy)", problems=problems,
                      compiled_on_gpu=True)
