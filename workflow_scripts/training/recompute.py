"""What the backward recomputes: `train.gradient_checkpointing` (schemas/config.schema.yaml), read here only.

- false: nothing; every activation the backward needs stays from the forward.
- true or "full": each transformer block's whole forward again (transformers' non-reentrant checkpoint of the
  block); only the block's input is kept.
- "selective": each block's forward under a per-op policy: the outputs of its matmuls and of attention are kept,
  the rest (norms, activation functions, rotary embeddings, residual adds, casts) is recomputed, so the backward's
  extra work is memory-bound ops only and what is kept is the matmul outputs (plan/memory_model.selective_bytes).
  Each block's `forward` is checkpointed (`enable`), so under compiled blocks the checkpoint lies inside the
  compiled region and inductor's partitioner follows the policy (torch.utils.checkpoint's selective checkpoint
  contexts); module hooks (FSDP2's) stay outside it.

The planners read the mode from here (`mode`); the step-time model how much matmul work the mode recomputes
(`MATMULS_RECOMPUTED`). Nothing here imports torch until a model is changed."""
from __future__ import annotations

from functools import lru_cache, partial

MODES = ("full", "selective")
# The share of a block's forward matmul time the backward runs again (plan/step_time.gemm_seconds).
MATMULS_RECOMPUTED = {"full": 1.0, "selective": 0.0}


def mode(train: dict) -> str | None:
    """None (nothing recomputed), "full" or "selective" for a run's train settings; true is "full"."""
    value = train["gradient_checkpointing"]
    if value is False or value is None:
        return None
    if value is True:
        return "full"
    if value in MODES:
        return value
    raise ValueError(f"train.gradient_checkpointing: {value!r}, expected true, false, 'full' or 'selective'")


def checkpoint_kwargs(how: str | None) -> dict | None:
    """transformers' gradient_checkpointing_kwargs for a mode: ours under "full", the Trainer's under both
    (bench/trainer.py; its whole-model compile traces transformers' checkpoint, so the policy reaches it there)."""
    if how is None:
        return None
    return {"use_reentrant": False, **({"context_fn": selective_contexts} if how == "selective" else {})}


def enable(model, train: dict) -> dict:
    """Turn the run's recomputation on for an HF model; what to record among the harness settings. "full" through
    transformers; "selective" wraps each block's `forward` here, whatever the transformers version (before 5.23 it
    checkpoints the block's `__call__`, outside a compiled block, where the policy would see none of its ops)."""
    from workflow_scripts.training.models import transformer_blocks

    how = mode(train)
    if how == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs(how))
    elif how == "selective":
        for block in transformer_blocks(model):
            block.forward = partial(_selective, block.forward)
    return {"gradient_checkpointing": how or False}


def _selective(forward, *args, **kwargs):
    """One block's forward under the selective policy (a frame of ours: torch.compile traces the checkpoint in it
    as one region with the policy's marks; its own frames it does not trace)."""
    from torch.utils.checkpoint import checkpoint

    return checkpoint(forward, *args, use_reentrant=False, context_fn=selective_contexts, **kwargs)


@lru_cache(maxsize=1)
def kept_ops() -> frozenset:
    """The ops whose outputs a selective checkpoint keeps: matmuls and every attention kernel SDPA may pick."""
    import torch

    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
             "_flash_attention_forward", "_efficient_attention_forward")
    return frozenset(getattr(aten, n).default for n in names if hasattr(aten, n))


def keep_matmuls(ctx, op, *args, **kwargs):
    """The selective policy: keep what `kept_ops` names, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in kept_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts():
    """A fresh pair of (forward, recompute) contexts for one checkpointed call (torch.utils.checkpoint's
    context_fn)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(keep_matmuls)
