"""train.deterministic: two runs of one row on one machine give bitwise-identical losses at every step.

Turned on in every rank before the process group, the model or any CUDA work exists:
  * torch.use_deterministic_algorithms(True): deterministic kernels where torch has them (index_add / scatter in
    the embedding backward, ...), an error naming the op where it has none;
  * cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8), without which its GEMMs may split reductions
    differently from run to run; cuDNN deterministic, no benchmark mode;
  * inductor's deterministic mode (no on-device benchmarking to choose kernel configurations: the same compiled
    code every run) where the torch version has it.
Collectives over several GPUs keep NCCL's reduction order for a fixed topology and algorithm; this setting does
not pin NCCL's algorithm choice. What it costs is measured per row (BENCHMARKS.md), not assumed.
"""
from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ":4096:8"


def apply(train: dict) -> dict:
    """Make this process deterministic if the run asks for it; what was set, for the run's settings."""
    if not train["deterministic"]:
        return {"deterministic": False}
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    import torch._inductor.config as inductor

    has_inductor_mode = hasattr(inductor, "deterministic")
    if has_inductor_mode:
        inductor.deterministic = True
    return {"deterministic": True, "cublas_workspace_config": CUBLAS_WORKSPACE,
            "inductor_deterministic": has_inductor_mode}
