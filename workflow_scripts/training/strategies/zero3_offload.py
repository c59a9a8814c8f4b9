"""zero3_offload: ZeRO-3 with parameters and optimizer states offloaded to CPU (ZeRO-Offload at stage 3)."""
from workflow_scripts.training.strategies._deepspeed import deepspeed_strategy


def _zero(ctx):
    pin = ctx.device.type == "cuda"
    return {"offload_optimizer": {"device": "cpu", "pin_memory": pin},
            "offload_param": {"device": "cpu", "pin_memory": pin}}


STRATEGY = deepspeed_strategy("zero3_offload", 3, "ZeRO-3, parameters and optimizer states offloaded to CPU",
                              zero=_zero, offload_optimizer=lambda ctx: True, offload_params=lambda ctx: True,
                              ops=("CPUAdamBuilder",))
