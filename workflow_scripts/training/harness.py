"""Harness levers: speed-ups applied to the model and the loss before a strategy wraps the model, the same way for
every strategy that is compatible with them (config `train.compile_blocks`, `train.compile_loss`).

- compile_blocks: `torch.compile` of each transformer block in place (`nn.Module.compile`) before the strategy
  wraps the model, the unit FSDP shards and DDP buckets around, so gradient communication still overlaps block by
  block (ZeRO-3 makes each block a leaf module and compiles its forward: the strategy's `compile_blocks`). Embeddings, the
  final norm and the LM head stay eager. Gradient checkpointing wraps the compiled block (HF's non-reentrant
  checkpoint recomputes the compiled forward).
- compile_model (false unless set): the whole model compiled around the strategy's wrapper after the engine is built
  (`torch.compile(DDP(model))`, FSDP2's root module, DeepSpeed's `engine.compile`): a few compiled regions per step
  instead of one per block; with `compile_mode: reduce-overhead` they replay as CUDA graphs. Replaces
  compile_blocks; data-parallel layouts only (config_check).
- compile_loss: the next-token cross-entropy compiled: the bf16 logits are upcast inside one fused kernel instead
  of materialising an fp32 copy of the (batch x sequence x vocabulary) logits and their gradient.

Both default to `auto` (resolve, called by the run spec): on a GPU platform they are on, the fast path; off on CPU
(compilation costs more than it saves there), where a block call is too small for compilation to pay
(MIN_BLOCK_FLOPS: the step is host-bound there), under layout dimensions whose compiled runs were not checked on a
GPU yet (parallel.Dimension.compiled_on_gpu) and for the MoE family (grouped_mm experts); the reason is recorded in
the spec. `true` / `false` force them. `train.compile_mode` is torch.compile's mode for both (e.g.
max-autotune-no-cudagraphs: Triton matmul autotuning, minutes of compilation). What a run used is recorded in its
`strategy_settings.json` under `harness`.
"""
from __future__ import annotations

import torch

from workflow_scripts.training.strategies.base import lm_loss

_compiled_loss = None
LEVERS = ("compile_blocks", "compile_loss")
# Below this much forward matmul work per block call, a compiled block's per-call host cost (guards, the
# autograd wrapper) outweighs what fusion saves: GPT-2-medium on one H100, interleaved, micro-batch 4 (1.0e11 FLOP)
# compiled 0.85x eager, micro-batch 16 (4.1e11) 1.9x (results/bench_harness/h100-levers-mb4, BENCHMARKS.md Part 1b).
MIN_BLOCK_FLOPS = 2.0e11


def auto_compile(platform: str, layout: dict | None, family: str, block_flops: float) -> tuple[bool, str]:
    """What `auto` means for one run: (compile?, why). `block_flops`: forward matmul FLOPs of one block call
    (study.block_flops)."""
    from workflow_scripts.training.parallel import DIMENSIONS

    if platform == "cpu":
        return False, "auto: off on CPU (compiling costs more than it saves there)"
    unchecked = [k for k, n in (layout or {}).items() if int(n) > 1 and not (k in DIMENSIONS and
                                                                            DIMENSIONS[k].compiled_on_gpu)]
    if unchecked:
        return False, f"auto: off under {'/'.join(unchecked)} (compiled runs not checked on a GPU yet)"
    if family == "qwen2_moe":
        return False, "auto: off for the MoE family (compiled grouped_mm experts not checked on a GPU yet)"
    if block_flops < MIN_BLOCK_FLOPS:
        return False, (f"auto: off, {block_flops:.1e} FLOP per block call < {MIN_BLOCK_FLOPS:.0e} (host-bound: "
                       "compiled blocks cost more per call than they save)")
    return True, f"auto: on ({platform}, {block_flops:.1e} FLOP per block call)"


def resolve(train: dict, platform: str, layout: dict | None, family: str, block_flops: float) -> dict:
    """The run's train settings with `auto` levers made true/false (and the reason under `compile_auto`)."""
    auto = [k for k in LEVERS if train.get(k, "auto") == "auto"]
    if not auto:
        return dict(train)
    on, why = auto_compile(platform, layout, family, block_flops)
    out = {**train, **{k: on for k in auto}, "compile_auto": why}
    if "compile_loss" in auto and (family == "vit" or train.get("chunked_loss")):  # not lm_loss: nothing to compile
        out["compile_loss"] = False
    return out


def compiles(train: dict, family: str, layout: dict | None) -> bool:
    """Whether a run's resolved settings compile anything: its blocks, or its loss where the loss is ours (not a
    ViT's classifier loss, not under cp, whose sequence-sharded loss stays eager: parallel/sequence.py)."""
    loss = train.get("compile_loss") is True and family != "vit" and int((layout or {}).get("cp", 1)) == 1
    return train.get("compile_blocks") is True or train.get("compile_model") is True or loss


def apply(model: torch.nn.Module, train: dict, strategy) -> dict:
    """Compile what the config asks for (in place, with the strategy's own block compiler: see
    training.strategies.base.compile_blocks) and return the settings to record. Under compile_model the blocks
    are left to the whole-model compile (apply_to_engine)."""
    whole = train.get("compile_model") is True
    blocks = train.get("compile_blocks") is True and not whole  # resolved by the run spec; "auto" compiles nothing
    mode = train.get("compile_mode", "default")
    extra = strategy.compile_blocks(model, mode) if blocks else {}
    return {**extra, "compile_blocks": blocks, "compile_model": whole, "compile_loss": train.get("compile_loss") is True,
            "compile_mode": mode, "attn_implementation": train.get("attn_implementation", "sdpa"),
            "gradient_checkpointing": bool(train.get("gradient_checkpointing")),
            "host_sync": f"every {train.get('log_every')} steps (losses and CUDA-event timings read together)",
            "loader": "pinned host memory, non_blocking copies"}


def apply_to_engine(engine, train: dict, strategy) -> dict:
    """train.compile_model: the whole model compiled around the strategy's wrapper, once the engine exists (the
    strategy's own compile_model: training.strategies.base.compile_model)."""
    if train.get("compile_model") is not True:
        return {}
    return strategy.compile_model(engine, train.get("compile_mode", "default"))


def loss_function(train: dict):
    """The loss the engines call: lm_loss, or its compiled form."""
    global _compiled_loss
    if train.get("compile_loss") is not True:
        return lm_loss
    if _compiled_loss is None:
        _compiled_loss = torch.compile(lm_loss, mode=train.get("compile_mode", "default"))
    return _compiled_loss
