"""tp, tensor parallelism: PyTorch DTensor (`torch.distributed.tensor.parallel.parallelize_module`) over mesh["tp"].

Per transformer block, Megatron-style: the attention's q/k/v and the MLP's gate/up projections are split by output
features (ColwiseParallel: each tp rank holds heads/tp attention heads and KV heads, intermediate/tp MLP columns),
o_proj and down_proj by input features (RowwiseParallel: their partial outputs are summed, one all-reduce each in
forward and in backward). Embeddings, norms and the LM head stay replicated on the tp ranks (every tp rank computes
the same logits and loss). Sequence-parallel norms (activations sharded along the sequence between blocks) are not
applied yet. Families: qwen2 (separate q/k/v Linear layers, the plan transformers ships for Qwen2); GPT-2's fused
Conv1D attention projection has no such split and is refused.

The data-parallel dimension wraps the tensor-parallel model over mesh["dp"] (parallel/data.py); gradient clipping
over DTensor gradients takes the norm over the whole model.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from workflow_scripts.training.models import MODELS, transformer_blocks
from workflow_scripts.training.parallel import Dimension

if TYPE_CHECKING:  # annotations only: the module is read by every Snakefile parse
    from torch import nn

FAMILIES = ("qwen2",)


# each block's parallel linears and how each is split (the step-time model counts their DTensor dispatches)
BLOCK_PLAN = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
              "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
              "mlp.down_proj": "rowwise"}


def block_plan() -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    style = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    return {name: style[split]() for name, split in BLOCK_PLAN.items()}


def apply(model: nn.Module, ctx, family: str) -> None:
    """Parallelise every block in place on this rank's device (the tp mesh lives there)."""
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = ctx.mesh["tp"]
    for block in transformer_blocks(model):
        block.to(ctx.device)
        parallelize_module(block, mesh, block_plan())


def model_problems(layout, model_name: str, where: str) -> list[str]:
    family = MODELS[model_name].family if model_name in MODELS else None
    if family in FAMILIES:
        return []
    return [f"{where}.tp: {layout.tp}, but {model_name} ({family}) has no tensor-parallel plan here "
            f"(families: {', '.join(FAMILIES)})"]


DIMENSION = Dimension(key="tp", description="tensor parallel: DTensor ColwiseParallel q/k/v and gate/up, "
                                            "RowwiseParallel o/down, per block over mesh['tp']",
                      apply=apply, model_problems=model_problems, compiled_on_gpu=True)
