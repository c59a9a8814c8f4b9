"""zeropp: ZeRO++ -- ZeRO-3 with quantized weights (qwZ), quantized gradients (qgZ) and hierarchical
partitioning (hpZ, secondary partition of `zero_hpz_partition_size` ranks, default: the ranks of one node)."""
from workflow_scripts.training.strategies._deepspeed import deepspeed_strategy


def _zero(ctx):
    return {"zero_quantized_gradients": True,
            "zero_hpz_partition_size": int(ctx.options.get("zero_hpz_partition_size", ctx.local_world_size))}


STRATEGY = deepspeed_strategy("zeropp", 3, "ZeRO++: ZeRO-3 + quantized weights and gradients + hpZ", zero=_zero,
                              quantized_weights=True,
                              ops=("QuantizerBuilder",))
