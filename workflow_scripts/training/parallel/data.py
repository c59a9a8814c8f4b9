"""dp, data parallelism: every dp rank trains on its own slots of the same global batch (training/batches.py) and
the strategy synchronises or shards over the dp ranks: DDP (replicated), DeepSpeed ZeRO stages 0-3 (optimizer
states, gradients, parameters partitioned) or FSDP2 (`fully_shard` over `mesh["dp"]`). Nothing to apply to the
model here: the strategy's engine is the data-parallel dimension.
"""
from workflow_scripts.training.parallel import Dimension

DIMENSION = Dimension(key="dp", description="data parallel: DDP, DeepSpeed ZeRO or FSDP2 over the dp ranks "
                                            "(the run's strategy)")
