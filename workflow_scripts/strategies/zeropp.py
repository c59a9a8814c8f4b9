"""zeropp: ZeRO++ -- ZeRO-3 with quantized weights (qwZ), quantized gradients (qgZ) and hierarchical
partitioning (hpZ, secondary partition of `zero_hpz_partition_size` ranks, default: the ranks of one node)."""
from workflow_scripts.strategies._deepspeed import deepspeed_strategy


def _zero(ctx):
    return {"zero_quantized_weights": True, "zero_quantized_gradients": True,
            "zero_hpz_partition_size": int(ctx.options.get("zero_hpz_partition_size", ctx.local_world_size))}


def _unsupported(ctx):
    if ctx.device.type != "cuda":
        return ("ZeRO++ quantized weights/gradients run DeepSpeed's CUDA quantizer kernels "
                "(QuantizerBuilder, swizzled all-to-all); the CPU accelerator has none")
    return None


STRATEGY = deepspeed_strategy("zeropp", 3, "ZeRO++: ZeRO-3 + quantized weights and gradients + hpZ", zero=_zero,
                              unsupported=_unsupported)
