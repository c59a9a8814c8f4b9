"""cp, context (sequence) parallelism: DeepSpeed-Ulysses (`deepspeed.sequence.layer.DistributedAttention`) over
mesh["cp"].

The cp ranks of one data-parallel slot get the same micro-batch and each keeps a contiguous 1/cp of its sequence:
embeddings, norms, MLP, LM head and loss run on that shard. In attention, one all-to-all turns q/k/v from sequence
shards into head shards (heads / cp per rank over the whole sequence), causal SDPA runs, and a second all-to-all
turns the output back. RoPE gets the shard's global positions; the labels are shifted on the whole sequence
before sharding (no target is lost at a shard border); each rank's loss is its shard's summed cross-entropy over
the micro-batch's count of trained targets, times cp, so the mean over the dp x cp ranks is exactly the 1D loss. The
data-parallel dimension therefore runs over the flattened dp x cp mesh (`RunContext.data_mesh`): parameters are
replicated or sharded over it and their gradients averaged over it.

Choice (torch 2.13, DeepSpeed 0.19.8): torch's `context_parallel` (ring attention) registers only CUDA's SDPA
kernels, so it cannot run the CPU tests without patching torch internals; Ulysses runs anywhere SDPA does and
composes with tensor parallelism (heads / (tp x cp) per rank). KV heads fewer than cp on a rank are repeated to the
query heads before the all-to-all (grouped-query attention); the whole-sequence SDPA then sees as many KV heads as
query heads. Pipeline stages and this dimension do not compose yet (stages do not carry position ids); a
torch.compile'd loss (train.compile_loss) is not used under cp.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workflow_scripts.training.models import MODELS
from workflow_scripts.training.parallel import Dimension
from workflow_scripts.training.strategies.base import input_ids, targets

ATTENTION = "ulysses"  # the attention implementation name registered with transformers
FAMILIES = ("qwen2", "qwen2_moe")  # attention through transformers' AttentionInterface with position ids


def _attention(cp: int, group):
    from deepspeed.sequence.layer import DistributedAttention

    def local(q, k, v, scaling=None):  # [B, T, H/cp, D]: the whole sequence, this rank's heads
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=scaling, enable_gqa=k.size(2) != q.size(2))
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


def apply(model: nn.Module, ctx, family: str) -> None:
    """Route the model's attention through Ulysses over mesh["cp"] and shard every forward's sequence."""
    import deepspeed.comm
    from transformers import AttentionInterface

    deepspeed.comm.init_distributed(dist_backend=ctx.backend, auto_mpi_discovery=False)  # joins torch's group
    AttentionInterface.register(ATTENTION, _attention(ctx.layout.cp, ctx.mesh["cp"].get_group()))
    model.config._attn_implementation = ATTENTION
    for module in model.modules():
        if hasattr(module, "config") and module.config is not model.config:
            module.config._attn_implementation = ATTENTION
    ctx.forward_loss = forward_loss
    ctx.parallel["cp"] = {"implementation": "deepspeed.sequence.layer.DistributedAttention (Ulysses)",
                          "heads_per_rank": model.config.num_attention_heads // (ctx.layout.tp * ctx.layout.cp)}


def forward_loss(module: nn.Module, tokens: torch.Tensor, ctx) -> torch.Tensor:
    """This rank's share of the micro-batch's mean next-token loss (see the module docstring)."""
    batch, length = tokens.shape
    cp, r = ctx.layout.cp, ctx.layout.coords(ctx.rank)["cp"]
    n = length // cp
    shifted = torch.cat([targets(tokens)[:, 1:], tokens.new_full((batch, 1), -100)], dim=1)
    labels = shifted[:, r * n:(r + 1) * n]
    positions = torch.arange(r * n, (r + 1) * n, device=tokens.device).expand(batch, n)
    with ctx.precision.autocast(ctx.device.type):
        logits = module(input_ids=input_ids(tokens[:, r * n:(r + 1) * n]), position_ids=positions).logits
    summed = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1).long(),
                             ignore_index=-100, reduction="sum")
    return summed * cp / (shifted != -100).sum().clamp_min(1)


def problems(layout, strategy, train: dict, where: str) -> list[str]:
    out = []
    if layout.pp > 1:
        out.append(f"{where}: {layout.key}: cp and pp do not compose yet (pipeline stages carry no position ids)")
    return out


def model_problems(layout, model_name: str, where: str) -> list[str]:
    spec = MODELS.get(model_name)
    if spec is None or spec.family not in FAMILIES:
        return [f"{where}.cp: {layout.cp}, but {model_name} ({spec.family if spec else None}) has no Ulysses "
                f"attention here (families: {', '.join(FAMILIES)})"]
    heads = spec.n_heads // layout.tp
    if heads % layout.cp:
        return [f"{where}.cp: {layout.cp} does not divide the {heads} attention heads per tensor-parallel rank "
                f"of {model_name}"]
    return []


DIMENSION = Dimension(key="cp", description="context/sequence parallel: DeepSpeed-Ulysses all-to-all attention "
                                            "over mesh['cp'], contiguous sequence shards",
                      apply=apply, problems=problems, model_problems=model_problems)
