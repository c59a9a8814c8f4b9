"""Harness levers: speed-ups applied to the model and the loss before a strategy wraps the model, the same way for
every strategy that is compatible with them (config `train.compile_blocks`, `train.compile_loss`).

- compile_blocks: `torch.compile` of each transformer block in place (`nn.Module.compile`) before the strategy
  wraps the model, the unit FSDP shards and DDP buckets around, so gradient communication still overlaps block by
  block (ZeRO-3 makes each block a leaf module and compiles its forward: the strategy's `compile_blocks`). Embeddings, the
  final norm and the LM head stay eager.
- compile_loss: the next-token cross-entropy compiled: the bf16 logits are upcast inside one fused kernel instead
  of materialising an fp32 copy of the (batch x sequence x vocabulary) logits and their gradient.

`train.compile_mode` is torch.compile's mode for both (e.g. max-autotune-no-cudagraphs: Triton matmul autotuning,
minutes of compilation). Both are off by default (CPU compilation costs more than it saves on the CPU study). What a run used is recorded
in its `strategy_settings.json` under `harness`.
"""
from __future__ import annotations

import torch

from workflow_scripts.training.strategies.base import lm_loss

_compiled_loss = None


def apply(model: torch.nn.Module, train: dict, strategy) -> dict:
    """Compile what the config asks for (in place, with the strategy's own block compiler: see
    training.strategies.base.compile_blocks) and return the settings to record."""
    blocks = bool(train.get("compile_blocks"))
    mode = train.get("compile_mode", "default")
    extra = strategy.compile_blocks(model, mode) if blocks else {}
    return {**extra, "compile_blocks": blocks, "compile_loss": bool(train.get("compile_loss")),
            "compile_mode": mode, "attn_implementation": train.get("attn_implementation", "sdpa"),
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
