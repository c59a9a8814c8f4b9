"""Ulysses attention and the sequence-sharded loss of the cp dimension (torch and DeepSpeed, on a rank:
sequence.py is the dimension and says how they work)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workflow_scripts.training.strategies.engine import document_mask, document_positions, input_ids, targets

# the whole sequence's positions of the micro-batch being trained, where train.separate_documents keeps its
# documents apart (forward_loss sets them before the model runs; a recomputation in the backward of the same
# micro-batch finds them unchanged), else None: causal over the whole sequence
WHOLE = {"positions": None}


def attention(cp: int, group):
    from deepspeed.sequence.layer import DistributedAttention

    def local(q, k, v, scaling=None):  # [B, T, H/cp, D]: the whole sequence, this rank's heads
        positions = WHOLE["positions"]
        mask = None if positions is None else document_mask(positions)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, is_causal=mask is None, scale=scaling,
                                           enable_gqa=k.size(2) != q.size(2))
        return o.transpose(1, 2)

    distributed = DistributedAttention(local, group, scatter_idx=2, gather_idx=1)

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        # transformers hands [B, H, T/cp, D] and takes [B, T/cp, H, D]; causal masking is SDPA's is_causal
        if key.size(1) % cp:
            groups = query.size(1) // key.size(1)
            key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        out = distributed(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), 0, None,
                          scaling=scaling)
        return out.contiguous(), None

    return attention


def forward_loss(module: nn.Module, tokens: torch.Tensor, ctx) -> torch.Tensor:
    """This rank's share of the micro-batch's mean next-token loss (see the module docstring)."""
    batch, length = tokens.shape
    cp, r = ctx.layout.cp, ctx.layout.coords(ctx.rank)["cp"]
    n = length // cp
    shifted = torch.cat([targets(tokens)[:, 1:], tokens.new_full((batch, 1), -100)], dim=1)
    labels = shifted[:, r * n:(r + 1) * n]
    if ctx.document_eos is None:
        positions = torch.arange(r * n, (r + 1) * n, device=tokens.device).expand(batch, n)
    else:  # each document from 0 over the whole sequence; this rank's shard of them
        WHOLE["positions"] = document_positions(input_ids(tokens), ctx.document_eos)
        positions = WHOLE["positions"][:, r * n:(r + 1) * n]
    with ctx.precision.autocast(ctx.device.type):
        logits = module(input_ids=input_ids(tokens[:, r * n:(r + 1) * n]), position_ids=positions).logits
    summed = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1).long(),
                             ignore_index=-100, reduction="sum")
    return summed * cp / (shifted != -100).sum().clamp_min(1)
