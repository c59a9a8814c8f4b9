"""train.chunked_loss: the LM head and the next-token cross-entropy computed together, a chunk of token rows at a
time, so the (tokens x vocabulary) logits never exist whole (at Qwen2.5's 151,936 rows and micro-batch 4 x 1024 they
are 1.2 GB in bf16 and 2.5 GB again for each fp32 copy and gradient).

Each chunk's logits (the autocast dtype, as the LM head's matmul gives them; fp32 for the softmax, as lm_loss) give
its loss and, in the same pass, the gradient of the loss with respect to the chunk's hidden states and the head's
weight; the backward only scales what the forward stored. No matmul is repeated: forward + backward cost what the
unfused head and loss cost; the memory is one chunk's logits, the hidden states' gradient and an fp32 weight
gradient (vocabulary x hidden).

The head keeps its module and parameter (tied embeddings stay tied; the strategy sees the head's forward as before
and gathers, reduces and shards its weight as usual: run with FSDP2 and DDP, not yet with ZeRO): only its forward is
replaced, and it returns the micro-batch's loss as the model's `logits`. The targets reach it through `forward_loss`
(RunContext.forward_loss, the hook every engine calls). Data-parallel layouts of causal language models only
(config_check).
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from workflow_scripts.training.strategies.engine import model_inputs, targets

IGNORE = -100


class LinearCrossEntropy(torch.autograd.Function):
    """mean cross-entropy of (hidden @ weight.T) against targets, over the targets that are not IGNORE."""

    @staticmethod
    def forward(ctx, hidden, weight, target, chunk_rows: int, dtype):
        n_valid = (target != IGNORE).sum().clamp(min=1)
        grads = hidden.requires_grad or weight.requires_grad
        d_hidden = torch.empty_like(hidden) if grads else None
        d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if grads else None
        w = weight.to(dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.size(0), chunk_rows):
            h, t = hidden[start:start + chunk_rows].to(dtype), target[start:start + chunk_rows]
            logits = (h @ w.t()).float()
            total += F.cross_entropy(logits, t, ignore_index=IGNORE, reduction="sum")
            if grads:  # d(sum of losses)/d(logits) = softmax - one-hot on the trained rows, 0 on ignored ones
                g = torch.softmax(logits, dim=-1)
                keep = t != IGNORE
                g[keep, t[keep]] -= 1.0
                g[~keep] = 0.0
                g = (g / n_valid).to(dtype)
                d_hidden[start:start + chunk_rows] = (g @ w).to(hidden.dtype)
                d_weight += (g.t() @ h).float()
        if grads:
            ctx.save_for_backward(d_hidden, d_weight.to(weight.dtype))
        return total / n_valid

    @staticmethod
    def backward(ctx, grad_out):
        d_hidden, d_weight = ctx.saved_tensors
        return d_hidden * grad_out, d_weight * grad_out, None, None, None


def _head_forward(head, hidden_states: torch.Tensor) -> torch.Tensor:
    """The replaced LM head: the micro-batch's mean loss over positions 0..T-2 predicting 1..T-1 (lm_loss)."""
    tokens = head.chunked_targets
    h = hidden_states[:, :-1].reshape(-1, hidden_states.size(-1))
    t = targets(tokens)[:, 1:].reshape(-1).long()
    device = hidden_states.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden_states.dtype
    with torch.autocast(device, enabled=False):
        return LinearCrossEntropy.apply(h, head.weight, t, head.chunk_rows, dtype)


def install(model: torch.nn.Module, chunk_rows: int) -> dict:
    """Replace the LM head's forward (in place, before a strategy wraps the model); the settings to record."""
    head = model.get_output_embeddings()
    if head is None or getattr(head, "bias", None) is not None:
        raise ValueError("train.chunked_loss: the model has no bias-free LM head")
    head.chunk_rows = int(chunk_rows)
    head.forward = types.MethodType(_head_forward, head)
    return {"chunked_loss": f"LM head + cross-entropy in chunks of {chunk_rows} token rows (training/chunked_loss.py)"}


def forward_loss(module, tokens: torch.Tensor, ctx) -> torch.Tensor:
    """RunContext.forward_loss under train.chunked_loss: the head gets the targets, the model returns the loss."""
    ctx.chunked_head.chunked_targets = tokens
    with ctx.precision.autocast(ctx.device.type):
        return module(**model_inputs(tokens, ctx)).logits
