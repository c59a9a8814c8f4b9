"""train.attn_implementation: sdpa_cudnn, transformers' SDPA attention with cuDNN's fused attention kernel.

torch's SDPA picks flash attention first on a GPU (priority flash, memory-efficient, math, cuDNN). On an H100,
cuDNN's kernel runs causal attention (16 x 16 heads x 1024 x 64) forward + backward in 0.75x flash's time eager and
0.91x compiled; in DDP's compiled blocks at micro-batch 16 the whole step gains 0.3 %: a lever to measure, not a
default. This implementation is transformers' own
`sdpa_attention_forward` under `torch.nn.attention.sdpa_kernel(CUDNN_ATTENTION)`, entered inside each attention call
so that a compiled block traces the choice into its graph (a global flag does not reach torch.compile's caches, and
torch 2.11's compiled code keeps flash under a priority order that puts cuDNN first: only cuDNN is allowed). A CPU rank
takes plain sdpa. Registered with transformers' AttentionInterface (and the `sdpa` mask) under its own name, once per
process, before the model is built (models.build_model).
"""
from __future__ import annotations

CUDNN = "sdpa_cudnn"


def register(name: str) -> None:
    """Make `name` a transformers attention implementation if it is one of ours (a no-op for transformers' own)."""
    if name != CUDNN:
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def forward(module, query, *args, **kwargs):
        if not query.is_cuda:  # no cuDNN attention on a CPU rank: plain sdpa
            return sdpa_attention_forward(module, query, *args, **kwargs)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa_attention_forward(module, query, *args, **kwargs)

    AttentionInterface.register(CUDNN, forward)
    AttentionMaskInterface.register(CUDNN, sdpa_mask)
