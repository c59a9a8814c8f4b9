"""Gradient clipping over a model split across dimensions: the norm of the whole model's gradient, as the 1D run
clips it, whatever mix of plain tensors and DTensors (of different meshes: tensor-parallel weights on (dp, tp),
replicated ones on (dp)) the parameters are, summed over the ranks of other parts (pipeline stages)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own data of a DTensor (the same storage: writing it writes the DTensor); a plain tensor as it is.
    The attribute, not `to_local()`, which is itself a dispatched call."""
    return getattr(t, "_local_tensor", t)


def total_norm(params, groups=(), device=None) -> torch.Tensor:
    """The 2-norm of all gradients: per mesh, torch's own norm (a DTensor norm made whole); squares summed, then
    summed over `groups` (process groups holding the other parts of the model). One mesh and no groups: torch's
    norm itself, as torch.nn.utils.clip_grad_norm_ computes it."""
    by_mesh: dict = {}
    for p in params:
        if p.grad is not None:
            by_mesh.setdefault(id(getattr(p.grad, "device_mesh", None)), []).append(p.grad)
    norms = [torch.nn.utils.get_total_norm(grads) for grads in by_mesh.values()]
    norms = [n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms]
    if len(norms) == 1 and not groups:
        return norms[0]
    squared = None
    for norm in norms:
        squared = norm.float() ** 2 if squared is None else squared + norm.float() ** 2
    if squared is None:
        squared = torch.zeros((), device=device)  # a stage without gradients still joins the sum
    for group in groups:
        dist.all_reduce(squared, group=group)
    return squared.sqrt()


def clip_(params, max_norm: float, groups=(), device=None) -> torch.Tensor:
    """Scale gradients in place so that their total norm is at most max_norm (torch's clip arithmetic), one
    foreach multiply per device and dtype over the ranks' own gradient data."""
    params = [p for p in params if p.grad is not None]
    norm = total_norm(params, groups, device)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    by_kind: dict = {}
    for p in params:
        g = local(p.grad)
        by_kind.setdefault((g.device, g.dtype), []).append(g)
    with torch.no_grad():
        for (dev, dtype), grads in by_kind.items():
            torch._foreach_mul_(grads, coef.to(device=dev, dtype=dtype))
    return norm
