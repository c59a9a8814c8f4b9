"""zero2_offload: ZeRO-2 with optimizer states (and the Adam step) on the host, DeepSpeedCPUAdam.

Stage 1/2 cannot offload parameters; `device: nvme` is silently treated as CPU below stage 3, so it is refused.
"""
from workflow_scripts.training.strategies._deepspeed import deepspeed_strategy


def _zero(ctx):
    return {"offload_optimizer": {"device": "cpu", "pin_memory": ctx.device.type == "cuda"}}


STRATEGY = deepspeed_strategy("zero2_offload", 2, "ZeRO-2, optimizer states offloaded to CPU", zero=_zero,
                              offload_optimizer=lambda ctx: True,
                              ops=("CPUAdamBuilder",), unsupported=lambda ctx: _nvme_below_stage3(ctx))


def _nvme_below_stage3(ctx):
    if ctx.options.get("offload_optimizer", {}).get("device") == "nvme":
        return "offload_optimizer.device=nvme at stage 2 silently means CPU in DeepSpeed; use zero_infinity"
    return None
