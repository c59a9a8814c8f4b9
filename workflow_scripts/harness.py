"""Harness levers: speed-ups applied to the model and the loss before a strategy wraps the model, the same way for
every strategy that is compatible with them (config `train.compile_blocks`, `train.compile_loss`).

- compile_blocks: `torch.compile` of each transformer block in place (`nn.Module.compile`) before the strategy
  wraps the model, the unit FSDP shards and DDP buckets around, so gradient communication still overlaps block by
  block (ZeRO-3's parameter-gathering hooks run inside the compiled blocks, with graph breaks). Embeddings, the
  final norm and the LM head stay eager.
- compile_loss: the next-token cross-entropy compiled: the bf16 logits are upcast inside one fused kernel instead
  of materialising an fp32 copy of the (batch x sequence x vocabulary) logits and their gradient.

`train.compile_mode` is torch.compile's mode for both (e.g. max-autotune-no-cudagraphs: Triton matmul autotuning,
minutes of compilation). Both are off by default (CPU compilation costs more than it saves on the CPU study). What a run used is recorded
in its `strategy_settings.json` under `harness`.
"""
from __future__ import annotations

import torch

from workflow_scripts.models import transformer_blocks
from workflow_scripts.strategies.base import lm_loss

_compiled_loss = None


def apply(model: torch.nn.Module, train: dict, zero3: bool = False) -> dict:
    """Compile what the config asks for (in place) and return the settings to record. `zero3`: the strategy is
    DeepSpeed ZeRO-3, whose parameter hooks on every submodule break a compiled block into pieces: each block
    becomes a ZeRO-3 leaf module instead (its parameters gathered together by hooks on the block) and only the
    block's forward is compiled, so the hooks run between compiled blocks, not inside them."""
    blocks = bool(train.get("compile_blocks"))
    mode = train.get("compile_mode", "default")
    extra = {}
    if blocks and zero3:
        from deepspeed.utils import set_z3_leaf_modules

        layers = transformer_blocks(model)
        set_z3_leaf_modules(model, [type(layers[0])])
        for block in layers:
            block.forward = torch.compile(block.forward, mode=mode)
        extra = {"zero3_leaf_modules": type(layers[0]).__name__}
    elif blocks:
        for block in transformer_blocks(model):
            block.compile(mode=mode)
    return {**extra, "compile_blocks": blocks, "compile_loss": bool(train.get("compile_loss")),
            "compile_mode": train.get("compile_mode", "default"),
            "attn_implementation": train.get("attn_implementation", "sdpa"),
            "gradient_checkpointing": bool(train.get("gradient_checkpointing")),
            "host_sync": f"every {train.get('log_every')} steps (losses and CUDA-event timings read together)",
            "loader": "pinned host memory, non_blocking copies"}


def loss_function(train: dict):
    """The loss the engines call: lm_loss, or its compiled form."""
    global _compiled_loss
    if not train.get("compile_loss"):
        return lm_loss
    if _compiled_loss is None:
        _compiled_loss = torch.compile(lm_loss, mode=train.get("compile_mode", "default"))
    return _compiled_loss
