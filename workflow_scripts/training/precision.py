"""The study's precision policy (`train.precision`), one object read by every strategy, the metrics and the
benchmarks instead of comparing strings:

  fp32       -- fp32 parameters, gradients, optimizer and compute;
  bf16-mixed -- fp32 parameters, gradients and optimizer; forward/backward under torch.autocast(bf16);
  bf16-pure  -- bf16 parameters and compute, fp32 master weights and optimizer states.

How each engine realises a policy lives with the engine (DDP keeps an fp32 master copy under bf16-pure, DeepSpeed
takes its `bf16` or `torch_autocast` section, FSDP2 a MixedPrecisionPolicy); what they share is here.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    detail: str
    autocast_bf16: bool  # forward/backward under torch.autocast(bf16), parameters stay fp32
    bf16_params: bool  # module parameters (and gradients) in bf16, fp32 master weights in the optimizer
    # bytes per parameter on the device before partitioning, (parameters, gradients, optimizer states), in the
    # ZeRO paper's accounting of the policy; `by_family`: where an engine family keeps them otherwise
    state_bytes: tuple[int, int, int]
    by_family: tuple = ()

    def engine_state_bytes(self, family: str) -> tuple[int, int, int]:
        """Bytes per parameter of (parameters, gradients, optimizer states) as the engine family keeps them: the
        one rule for the run's own prediction (training/loop.py) and the memory model (plan/memory_model.py)."""
        return dict(self.by_family).get(family, self.state_bytes)

    @property
    def module_bytes(self) -> int:
        """Bytes per element of the module's own dtype (bf16 under bf16-pure, else fp32): its parameters and their
        gradients as the engine computes with them (DeepSpeed's, FSDP2's gathered ones) and the residual stream."""
        return 2 if self.bf16_params else 4

    @property
    def uses_bf16(self) -> bool:
        return self.autocast_bf16 or self.bf16_params

    def autocast(self, device_type: str):
        """The context the forward (and loss) runs under."""
        if self.autocast_bf16:
            import torch

            return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def fsdp_policy(self):
        """FSDP2's (and composable replicate's) MixedPrecisionPolicy: bf16 parameters and gradient reduction for
        bf16-pure, the default (no casting) otherwise."""
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.bf16_params:
            return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        return MixedPrecisionPolicy()

    def __str__(self) -> str:
        return self.name


POLICIES: dict[str, Precision] = {p.name: p for p in [
    Precision("fp32", "fp32 parameters, gradients, optimizer and compute", False, False, (4, 4, 8)),
    Precision("bf16-mixed", "fp32 parameters, gradients and optimizer; forward/backward compute under "
              "torch.autocast(bf16)", True, False, (4, 4, 8)),  # autocast stores nothing extra
    # the ZeRO paper's mixed-precision Adam: bf16 p + g, fp32 master + m + v. DeepSpeed's bf16 mode keeps fp32
    # gradient partitions; DDP the bf16 module (bf16 gradients) and an fp32 master + moments; FSDP2's bf16
    # MixedPrecisionPolicy fp32 sharded parameters (the master itself) and fp32 moments, bf16 only in the unsharded
    # compute copy and its gradients
    Precision("bf16-pure", "bf16 parameters and compute, fp32 master weights and optimizer states", False, True,
              (2, 2, 12), by_family=(("deepspeed", (2, 4, 12)), ("ddp", (2, 2, 12)), ("fsdp", (4, 2, 8)))),
]}


def policy(name: str) -> Precision:
    try:
        return POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown precision {name!r}; known: {', '.join(POLICIES)}") from None
