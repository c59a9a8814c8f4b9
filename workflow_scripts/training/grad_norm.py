"""Gradient clipping over a model split across dimensions: the norm of the whole model's gradient, as the 1D run
clips it, whatever mix of plain tensors and DTensors (of different meshes: tensor-parallel weights on (dp, tp),
replicated ones on (dp)) the parameters are, summed over the ranks of other parts (pipeline stages)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own data of a DTensor (a view: writing it writes the DTensor); a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def total_norm(params, groups=(), device=None) -> torch.Tensor:
    """The 2-norm of all gradients: per mesh, torch's own norm (a DTensor norm made whole); squares summed, then
    summed over `groups` (process groups holding the other parts of the model)."""
    by_mesh: dict = {}
    for p in params:
        if p.grad is not None:
            by_mesh.setdefault(id(getattr(p.grad, "device_mesh", None)), []).append(p.grad)
    squared = None
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        squared = norm.float() ** 2 if squared is None else squared + norm.float() ** 2
    if squared is None:
        squared = torch.zeros((), device=device)  # a stage without gradients still joins the sum
    for group in groups:
        dist.all_reduce(squared, group=group)
    return squared.sqrt()


def clip_(params, max_norm: float, groups=(), device=None) -> torch.Tensor:
    """Scale gradients in place so that their total norm is at most max_norm (torch's clip arithmetic)."""
    params = [p for p in params if p.grad is not None]
    norm = total_norm(params, groups, device)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    with torch.no_grad():
        for p in params:
            g = local(p.grad)
            g.mul_(coef.to(device=g.device, dtype=g.dtype))
    return norm
