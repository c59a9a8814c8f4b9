"""Traced estimate of activation memory: one real transformers decoder layer of the run's shape, run forward on
fake tensors (FakeTensorMode: shapes and dtypes, no storage, seconds even for a 3B layer) while
`torch.autograd.graph.saved_tensors_hooks` records every tensor autograd keeps for backward; parameters are left
out, every other storage is counted once. That is the same accounting the analytic model (memory_model.py) does by
hand, done by torch on the code that really runs.

Where it works and where not: the trace runs on this machine's device type. On a CUDA host it traces CUDA autocast;
on a CPU-only host the bf16-mixed trace uses CPU autocast, whose op lists differ (e.g. `pow` in GPT-2's gelu_new is
an fp32 op under CUDA autocast and stays bf16 on CPU), so a CPU trace of a bf16-mixed run says so (`device`).
fp32 and bf16-pure involve no autocast and trace the same on both.
"""
from __future__ import annotations

import torch

from workflow_scripts.training.models import MODELS, build_config


def _layer(config, family: str):
    if family == "gpt2":
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        return GPT2Block(config, layer_idx=0), None
    if family == "vit":
        from transformers.models.vit.modeling_vit import ViTLayer

        return ViTLayer(config), None
    if family == "qwen2":
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

        return Qwen2DecoderLayer(config, layer_idx=0), Qwen2RotaryEmbedding(config)
    if family == "qwen2_moe":
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeDecoderLayer, Qwen2MoeRotaryEmbedding

        config._experts_implementation = "grouped_mm"  # what from_config picks (transformers' default)
        return Qwen2MoeDecoderLayer(config, layer_idx=0), Qwen2MoeRotaryEmbedding(config)
    raise ValueError(f"no traced layer for family {family!r}")


def cannot_trace(model: str, precision: str) -> str | None:
    """Why one layer of this model cannot be traced at this precision; None if it can."""
    if MODELS[model].family == "qwen2_moe" and precision == "fp32":
        return "transformers' grouped_mm experts take bf16 only"
    return None


def layer_saved_bytes(model: str, precision: str, micro_batch: int, seq_len: int, overrides: dict | None = None,
                      device: str | None = None) -> dict:
    """Bytes autograd saves for one decoder layer, per token: {"per_token": float, "device": str, "tensors": n}.
    `precision`: fp32 | bf16-mixed | bf16-pure (as training.precision: bf16-pure has bf16 parameters and input)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    family = MODELS[model].family
    # a ViT layer does not depend on the image size: any valid image row builds its config; seq_len = tokens
    row = 1 + 3 * 16 * 16 if family == "vit" else seq_len
    config = build_config(model, vocab_size=256, block_size=row, overrides=overrides)
    config._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if precision == "bf16-pure" else torch.float32
    saved: dict[int, int] = {}
    default = torch.get_default_dtype()
    with FakeTensorMode(), torch.device(device):
        torch.set_default_dtype(dtype)
        try:
            layer, rotary = _layer(config, family)
        finally:
            torch.set_default_dtype(default)
        params = {id(p.untyped_storage()) for p in layer.parameters()}
        x = torch.randn(micro_batch, seq_len, config.hidden_size, dtype=dtype, requires_grad=True)
        kwargs = {}
        if rotary is not None:
            positions = torch.arange(seq_len).unsqueeze(0).expand(micro_batch, -1)
            kwargs["position_embeddings"] = rotary(x, positions)

        def pack(t):
            key = id(t.untyped_storage())
            if key not in params:
                saved.setdefault(key, t.untyped_storage().nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                layer(x, **kwargs)
    return {"per_token": sum(saved.values()) / (micro_batch * seq_len), "device": device, "tensors": len(saved)}
