"""zero3: DeepSpeed ZeRO-3: parameters, gradients and optimizer states partitioned.

At one data-parallel rank on a GPU every parameter is persistent (`stage3_param_persistence_threshold` above any
parameter's size): the one rank's partition is the whole model, so the per-module gathers and releases move
nothing, and skipping them changes neither the numerics nor the peak memory. Measured on one H100 (gpt2-medium,
micro-batch 4: 1.22x, benchmarks/2026-11-26-zero3-one-gpu-h100.md) and one H200 (gpt2-large, micro-batch 2,
compiled blocks: 0.234 against 0.285 s a step, the same 16.8 GiB peak,
benchmarks/2026-12-04-zero3-tutorial-shape-h200.md). On several data-parallel ranks, or on CPU, DeepSpeed's default
stays; `strategy_options.zero3.stage3_param_persistence_threshold` overrides both.
"""
from workflow_scripts.training.strategies._deepspeed import deepspeed_strategy

EVERY_PARAMETER = 10**12  # elements: above any parameter's size


def _zero(ctx):
    if ctx.dp_size == 1 and ctx.platform in ("cuda", "rocm"):
        return {"stage3_param_persistence_threshold": EVERY_PARAMETER}
    return {}


STRATEGY = deepspeed_strategy("zero3", 3, "DeepSpeed ZeRO-3: parameters, gradients and optimizer states partitioned",
                              zero=_zero)
