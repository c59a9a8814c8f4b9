"""cp, context (sequence) parallelism: DeepSpeed-Ulysses (`deepspeed.sequence.layer.DistributedAttention`) over
mesh["cp"].

The cp ranks of one data-parallel slot get the same micro-batch and each keeps a contiguous 1/cp of its sequence:
embeddings, norms, MLP, LM head and loss run on that shard. In attention, one all-to-all turns q/k/v from sequence
shards into head shards (heads / cp per rank over the whole sequence), causal SDPA runs, and a second all-to-all
turns the output back. RoPE gets the shard's global positions; the labels are shifted on the whole sequence
before sharding (no target is lost at a shard border); each rank's loss is its shard's summed cross-entropy over
the micro-batch's count of trained targets, times cp, so the mean over the dp x cp ranks is exactly the 1D loss.
With train.separate_documents the positions are each document's over the whole sequence (the shard gets its part)
and the whole-sequence SDPA takes their block-diagonal mask instead of is_causal. The
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

from typing import TYPE_CHECKING

from workflow_scripts.training.models import MODELS
from workflow_scripts.training.parallel import Dimension

if TYPE_CHECKING:  # annotations only: the module is read by every Snakefile parse
    from torch import nn

ATTENTION = "ulysses"  # the attention implementation name registered with transformers
FAMILIES = ("qwen2", "qwen2_moe")  # attention through transformers' AttentionInterface with position ids


def apply(model: nn.Module, ctx, family: str) -> None:
    """Route the model's attention through Ulysses over mesh["cp"] and shard every forward's sequence."""
    import deepspeed.comm
    from transformers import AttentionInterface

    from workflow_scripts.training.parallel._ulysses import attention, forward_loss
    from workflow_scripts.training.strategies._deepspeed import gloo_collectives_on_cpu

    gloo_collectives_on_cpu(ctx.platform)
    deepspeed.comm.init_distributed(dist_backend=ctx.backend, auto_mpi_discovery=False)  # joins torch's group
    AttentionInterface.register(ATTENTION, attention(ctx.layout.cp, ctx.mesh["cp"].get_group()))
    model.config._attn_implementation = ATTENTION
    for module in model.modules():
        if hasattr(module, "config") and module.config is not model.config:
            module.config._attn_implementation = ATTENTION
    ctx.forward_loss = forward_loss
    ctx.parallel["cp"] = {"implementation": "deepspeed.sequence.layer.DistributedAttention (Ulysses)",
                          "heads_per_rank": model.config.num_attention_heads // (ctx.layout.tp * ctx.layout.cp)}


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
