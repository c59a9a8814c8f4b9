"""DeepSpeed ZeRO's gradient norm in a few multi-tensor launches instead of two or three per parameter tensor.

Before its clip, DeepSpeed's ZeRO-1/2 optimizer (`DeepSpeedZeroOptimizer.get_grad_norm_direct`) takes every
gradient of its partition to float64 and its 2-norm one tensor at a time, and moves each norm to the device: about
three launches per parameter tensor from Python, 293 tensors for GPT-2-medium, on the host while the GPU waits.
`foreach_grad_norm` swaps in the same sum for that optimizer: torch's `_foreach_norm`
over the same gradients, cast to the same float64, then DeepSpeed's own reductions (data-parallel all-reduce of the
squared sum, the model-parallel one, the square root, the inf/NaN mask). Where the optimizer's case is one it does
not cover (another norm type, model-parallel ranks other than 0, pipeline-replicated parameters), it calls
DeepSpeed's. ZeRO-3's optimizer (`DeepSpeedZeroOptimizer_Stage3.get_grad_norm_direct`) does the same per tensor
over its gradient partitions (a cast and a norm each: 2 launches per tensor of the 748 its step issues for
GPT-2-medium on one H100); its swap keeps its own reductions (the
partition group's all-reduce, the model-parallel one where a rank does not count every gradient, the -1 of an inf
or NaN norm) and calls DeepSpeed's for AutoEP expert groups. Strategy option `foreach_grad_norm` of ZeRO-1/2/3
(_deepspeed.OWN_KEYS; default true; false keeps DeepSpeed's own, e.g. to measure it).
"""
from __future__ import annotations

import types

import torch

PER_TENSOR = "DeepSpeed's get_grad_norm_direct (a float64 norm per gradient tensor)"
FOREACH = "torch._foreach_norm over the partition's gradients (float64), DeepSpeed's reductions after it"


def foreach_grad_norm(optimizer) -> str:
    """Swap the optimizer's per-tensor gradient norm for the multi-tensor one; returns what the run computes its
    gradient norm with (recorded in its strategy settings)."""
    if getattr(optimizer, "cpu_offload", False) or getattr(optimizer, "offload_optimizer", False):
        # its norm is taken on the host, per tensor, elsewhere (ZeRO-1/2's cpu_offload, ZeRO-3's offload_optimizer)
        return "DeepSpeed's own (optimizer offload)"
    if not hasattr(optimizer, "get_grad_norm_direct"):  # another optimizer than ZeRO's
        return f"the engine's own ({type(optimizer).__name__})"
    original = optimizer.get_grad_norm_direct
    if hasattr(optimizer, "_grad_norm_counts_every_rank"):  # ZeRO-3's
        optimizer.get_grad_norm_direct = types.MethodType(stage3_direct(original), optimizer)
        return FOREACH

    def direct(self, gradients, params, norm_type=2):
        if float(norm_type) != 2.0 or getattr(self, "model_parallel_rank", 0) != 0:
            return original(gradients, params, norm_type)
        pairs = list(zip((g for g in gradients if not getattr(g, "_zero_padding", False)), params))
        if any(getattr(p, "ds_pipe_replicated", False) for _, p in pairs):
            return original(gradients, params, norm_type)
        return squared_sum_norm(self, [g.detach() for g, _ in pairs])

    optimizer.get_grad_norm_direct = types.MethodType(direct, optimizer)
    return FOREACH


def squared_sum_norm(optimizer, grads: list) -> torch.Tensor:
    """The 2-norm of `grads` over every data- and model-parallel rank, as DeepSpeed computes it, per-tensor norms in
    float64 by `_foreach_norm` (grouped by device and dtype)."""
    import deepspeed.comm as dist
    from deepspeed.runtime.utils import mask_nan_or_inf_with_val_inplace
    from deepspeed.runtime.zero.utils import get_norm_dtype

    total = summed_squares(grads, get_norm_dtype(), optimizer.device).float()
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=optimizer.dp_process_group)
    optimizer._model_parallel_all_reduce(tensor=total, op=dist.ReduceOp.SUM)
    total = total.pow(0.5)
    mask_nan_or_inf_with_val_inplace(total, device=optimizer.device)
    return total


def summed_squares(grads: list, dtype: torch.dtype, device) -> torch.Tensor:
    """The sum of the squared 2-norms of `grads`, each taken in `dtype` by one `_foreach_norm`, on `device`."""
    if not grads:
        return torch.zeros((), dtype=dtype, device=device)
    norms = torch._foreach_norm(grads, 2.0, dtype=dtype)
    return torch.stack([n.to(device) for n in norms]).pow(2).sum()


def stage3_direct(original):
    """ZeRO-3's get_grad_norm_direct with the per-tensor norms in one `_foreach_norm` (DeepSpeed 0.19's arithmetic:
    float64 norms, their squares summed, all-reduced over the parameters' partition group, the model-parallel
    all-reduce unless every rank counts its own, the square root, -1 where inf or NaN)."""
    from deepspeed.runtime.utils import is_model_parallel_parameter
    from deepspeed.runtime.zero.utils import get_norm_dtype

    def direct(self, gradients, params, norm_type=2):
        if float(norm_type) != 2.0 or not params or self._autoep_expert_parallel_group(params) is not None:
            return original(gradients, params, norm_type)
        import deepspeed.comm as dist

        self._assert_same_partition_group(params)
        group = self._get_param_partition_group(params[0])
        every = self._grad_norm_counts_every_rank(params, group)
        grads = [g.detach() for g, p in zip(gradients, params)
                 if every or is_model_parallel_parameter(p) or self.model_parallel_rank == 0]
        total = summed_squares(grads, get_norm_dtype(), self.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        if not every:
            self._model_parallel_all_reduce(tensor=total, op=dist.ReduceOp.SUM)
        total = total.sqrt()
        return torch.where(total.isnan() | total.isinf(), torch.tensor(-1.0, device=self.device), total)

    return direct
