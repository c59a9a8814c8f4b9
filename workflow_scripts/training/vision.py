"""Image classification on the shared training loop: the rows of data/images.py ([label, uint8 pixels]) travel
through the same batches as token blocks; this module turns a row batch into pixels and labels, computes the loss
(RunContext.forward_loss, the hook every engine calls) and top-1 accuracy on the validation rows.

Pixels are scaled to [0, 1] and normalised with the manifest's mean / std (0.5 each), in the dtype of the model's
parameters (bf16 under DeepSpeed's bf16, fp32 otherwise: autocast does the rest).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from workflow_scripts.training.batches import rank_chunks
from workflow_scripts.training.models import image_size


def split(rows: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixels B x 3 x S x S normalised, labels B) from a batch of image rows."""
    size = image_size(rows.shape[1])
    pixels = rows[:, 1:].reshape(len(rows), 3, size, size).to(dtype) / 255.0
    return (pixels - 0.5) / 0.5, rows[:, 0].long()


def param_dtype(module: torch.nn.Module) -> torch.dtype:
    p = next(module.parameters(), None)
    return p.dtype if p is not None and p.is_floating_point() else torch.float32


def forward_loss(module, rows: torch.Tensor, ctx) -> torch.Tensor:
    pixels, labels = split(rows, param_dtype(module))
    with ctx.precision.autocast(ctx.device.type):
        logits = module(pixel_values=pixels).logits
    return F.cross_entropy(logits.float(), labels)


def accuracy(engine, val: np.ndarray, ctx, samples: int) -> float:
    """Top-1 accuracy over the same validation images for every strategy (`samples` per data-parallel rank)."""
    counts = torch.zeros(2, device=ctx.device, dtype=torch.float64)
    with engine.eval_mode():
        for rows in rank_chunks(val, ctx, samples, ctx.micro_batch):
            pixels, labels = split(rows, param_dtype(engine.module))
            with ctx.precision.autocast(ctx.device.type):
                logits = engine.module(pixel_values=pixels).logits
            counts[0] += (logits.argmax(-1) == labels).sum()
            counts[1] += len(labels)
    dist.all_reduce(counts)
    return float(counts[0] / counts[1]) if counts[1] > 0 else float("nan")
