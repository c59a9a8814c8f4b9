"""zero_infinity: ZeRO-3 with parameters and optimizer states offloaded to NVMe (a directory from config).

Goes through DeepSpeed's async_io op, which needs libaio (Debian: libaio-dev). `nvme_path` comes from
`strategy_options.zero_infinity.nvme_path` (default: the run's scratch directory); `aio` from the same section.
"""
import os

from workflow_scripts.training.strategies._deepspeed import deepspeed_strategy

AIO = {"block_size": 1048576, "queue_depth": 8, "single_submit": False, "overlap_events": True}


def _path(ctx):
    return os.path.abspath(ctx.options.get("nvme_path") or os.path.join(ctx.work_dir, "nvme"))


def _zero(ctx):
    path, pin = _path(ctx), ctx.device.type == "cuda"
    return {"offload_optimizer": {"device": "nvme", "nvme_path": path, "pin_memory": pin},
            "offload_param": {"device": "nvme", "nvme_path": path, "pin_memory": pin}}


STRATEGY = deepspeed_strategy("zero_infinity", 3, "ZeRO-Infinity: ZeRO-3 with parameters and optimizer on NVMe",
                              zero=_zero, extra=lambda ctx: {"aio": dict(AIO)}, consumes=("nvme_path",),
                              offload_optimizer=lambda ctx: True, offload_params=lambda ctx: True,
                              ops=("AsyncIOBuilder", "CPUAdamBuilder"))
