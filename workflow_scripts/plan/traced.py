"""Traced estimate of activation memory: one real transformers decoder layer of the run's shape, run forward on
fake tensors (FakeTensorMode: shapes and dtypes, no storage, seconds even for a 3B layer) while
`torch.autograd.graph.saved_tensors_hooks` records every tensor autograd keeps for backward; parameters are left
out, every other storage is counted once. That is the same accounting the analytic model (memory_model.py) does by
hand, done by torch on the code that really runs.

Where it works and where not: the trace runs on this machine's device type. On a CUDA host it traces CUDA autocast;
on a CPU-only host the bf16-mixed trace uses CPU autocast, whose op lists differ (e.g. `pow` in GPT-2's gelu_new is
an fp32 op under CUDA autocast and stays bf16 on CPU), so a CPU trace of a bf16-mixed run says so (`device`).
fp32 and bf16-pure involve no autocast and trace the same on both.

The same layer, run forward and backward under a dispatch counter, gives the kernels it issues (layer_kernels):
what the step-time model's host term scales with from one layer family to another.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from workflow_scripts.training.models import FAMILIES, MODELS, build_config


def _layer(config, family: str):
    if family == "gpt2":
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        return GPT2Block(config, layer_idx=0), None
    if FAMILIES[family].vision:
        from transformers.models.vit.modeling_vit import ViTLayer

        return ViTLayer(config), None
    if family == "qwen2":
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

        return Qwen2DecoderLayer(config, layer_idx=0), Qwen2RotaryEmbedding(config)
    if FAMILIES[family].moe:
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeDecoderLayer, Qwen2MoeRotaryEmbedding

        config._experts_implementation = "grouped_mm"  # what from_config picks (transformers' default)
        return Qwen2MoeDecoderLayer(config, layer_idx=0), Qwen2MoeRotaryEmbedding(config)
    raise ValueError(f"no traced layer for family {family!r}")


def cannot_trace(model: str, precision: str) -> str | None:
    """Why one layer of this model cannot be traced at this precision; None if it can."""
    if MODELS[model].moe and precision == "fp32":
        return "transformers' grouped_mm experts take bf16 only"
    return None


@contextmanager
def fake_layer(model: str, dtype, micro_batch: int, seq_len: int, overrides: dict | None, device: str):
    """One real transformers layer of the model on fake tensors (inside FakeTensorMode on `device`), its input of
    micro_batch x seq_len tokens (requires grad) and its keyword arguments (a Qwen layer's rotary embeddings)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    family = MODELS[model].family
    # a ViT layer does not depend on the image size: any valid image row builds its config; seq_len = tokens
    row = 1 + 3 * 16 * 16 if FAMILIES[family].vision else seq_len
    config = build_config(model, vocab_size=256, block_size=row, overrides=overrides)
    config._attn_implementation = "sdpa"
    default = torch.get_default_dtype()
    with FakeTensorMode(), torch.device(device):
        torch.set_default_dtype(dtype)
        try:
            layer, rotary = _layer(config, family)
        finally:
            torch.set_default_dtype(default)
        x = torch.randn(micro_batch, seq_len, config.hidden_size, dtype=dtype, requires_grad=True)
        kwargs = {}
        if rotary is not None:
            positions = torch.arange(seq_len).unsqueeze(0).expand(micro_batch, -1)
            kwargs["position_embeddings"] = rotary(x, positions)
        yield layer, x, kwargs


def layer_saved_bytes(model: str, precision: str, micro_batch: int, seq_len: int, overrides: dict | None = None,
                      device: str | None = None) -> dict:
    """Bytes autograd saves for one decoder layer, per token: {"per_token": float, "device": str, "tensors": n}.
    `precision`: fp32 | bf16-mixed | bf16-pure (as training.precision: bf16-pure has bf16 parameters and input)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if precision == "bf16-pure" else torch.float32
    saved: dict[int, int] = {}
    with fake_layer(model, dtype, micro_batch, seq_len, overrides, device) as (layer, x, kwargs):
        params = {id(p.untyped_storage()) for p in layer.parameters()}

        def pack(t):
            key = id(t.untyped_storage())
            if key not in params:
                saved.setdefault(key, t.untyped_storage().nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                layer(x, **kwargs)
    return {"per_token": sum(saved.values()) / (micro_batch * seq_len), "device": device, "tensors": len(saved)}


# aten ops that launch no kernel: views and metadata, allocations, autograd's bookkeeping
NO_KERNEL = {"detach", "empty", "empty_like", "empty_strided", "_unsafe_view", "lift_fresh", "alias"}
# the layer each family's is counted against: its own for a dense family (step_time's fitted host constant per
# layer holds for GPT-2, Qwen2 and ViT blocks alike: scaled by their kernels, 2.4x for Qwen2, the refit's held-out
# error went 18.3 -> 20.8 %), a dense Qwen2 layer for a Qwen2-MoE one
REFERENCE_MODEL = {"gpt2": "gpt2-medium", "qwen2": "qwen2.5-3b", "vit": "vit-huge-14", "qwen2_moe": "qwen2.5-3b"}


def layer_kernels(model: str, overrides: dict | None = None) -> int:
    """Kernels one layer of the model issues per micro-batch, forward and backward: every aten op that reaches the
    dispatcher (views, allocations and FakeTensorMode's own `prim` ops left out), counted on fake tensors in bf16
    without autocast (a cast per op is the precision's, not the layer's). Independent of batch and sequence: a
    Qwen2 decoder layer issues 2.4x a GPT-2 block's kernels (its rotary, RMS norms, gated MLP), a Qwen2-MoE layer
    3.7x (router, sort, gather, two grouped GEMMs, scatter and the shared expert): an H100 trace of the MoE layer
    launched 4.1x a GPT-2-medium block's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if not (func.is_view or name.startswith("prim.") or func.overloadpacket.__name__ in NO_KERNEL):
                self.n += 1
            return func(*args, **(kwargs or {}))

    tokens = 257 if MODELS[model].vision else 64  # a ViT's 256 patches + its class token
    with fake_layer(model, torch.bfloat16, 1, tokens, overrides, "cpu") as (layer, x, kwargs), Count() as count:
        out = layer(x, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(torch.ones_like(out))
    return count.n
