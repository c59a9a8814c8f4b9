"""The pace of a transformer block's kernels outside its matmuls (calibration rows memory_block[<block>,<levers>],
GB/s): the step-time model prices that work as bytes at the device copy's bandwidth, but a block's norm and
activation kernels do not all run at the copy's bandwidth, and not in the same proportion on every GPU. On an H200
the aten LayerNorm ran at the H100's pace (1,645 against 1,624 GB/s at 32 MB), GELU 1.17x and an add 1.40x faster,
where the 1 GiB copy is 1.49x faster.

Each block's work runs forward and backward on MEMORY_TOKENS tokens, as the block's eager modules run it and as
torch.compile fuses it, replayed from a CUDA graph: its bytes (each input and output tensor once, forward; twice that
backward) per second: stable where the copy is not (2,692-2,696 GB/s for LayerNorm + GELU on three commands on two
H100 machines whose 1 GiB copies measured 2,792-2,954). The step-time model moves its memory bytes at the fitted
machine's copy bandwidth times this pace over the fitted machine's (plan/step_time.memory_rate). This module
describes the work (block_work); measure/calibrate.py times it (block_rows).
"""
from __future__ import annotations

MEMORY_TOKENS = 16384
# block -> (hidden d, MLP width f): GPT-2-medium's LayerNorm + GELU (ViT's too); Qwen2.5-1.5B's RMSNorm, rotary
# embedding of q and k (KV_WIDTH: its 2 key-value heads of HEAD_DIM) and SiLU-gated MLP
BLOCKS = {"layernorm_gelu": (1024, 4096), "rmsnorm_rotary_silu": (1536, 8960)}
HEAD_DIM, KV_WIDTH = 128, 256
LEVERS = ("eager", "compiled")


def block_work(block: str, device: str = "cuda", tokens: int = MEMORY_TOKENS):
    """(function, its input tensors, bytes forward + backward) of one block's norm, activation and residual add (and
    rotary embedding): GPT-2's through torch's functions, Qwen2's through transformers' own RMSNorm and rotary."""
    import torch
    import torch.nn.functional as F

    d, f = BLOCKS[block]
    new = lambda *shape: torch.randn(*shape, device=device, dtype=torch.bfloat16, requires_grad=True)
    x, r, w = new(tokens, d), new(tokens, d), new(d)
    if block == "layernorm_gelu":
        a, b = new(tokens, f), new(d)

        def work(x, r, w, a, b):
            return F.layer_norm(x, (d,), w, b), F.gelu(a, approximate="tanh"), x + r

        inputs = (x, r, w, a, b)
        tensors = 4 * d + 2 * f  # read x, r, a; wrote the norm, the activation, the sum
    else:
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm, apply_rotary_pos_emb

        norm = Qwen2RMSNorm(d, eps=1e-6).to(device, torch.bfloat16)
        w = norm.weight
        gate, up = new(tokens, f), new(tokens, f)
        q, k = new(tokens, d // HEAD_DIM, HEAD_DIM), new(tokens, KV_WIDTH // HEAD_DIM, HEAD_DIM)
        angle = torch.rand(tokens, HEAD_DIM, device=device)
        cos, sin = angle.cos().bfloat16(), angle.sin().bfloat16()

        def work(x, r, w, gate, up, q, k):  # w is norm's weight
            return norm(x), *apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1), F.silu(gate) * up, x + r

        inputs = (x, r, w, gate, up, q, k)
        # read x, r, gate, up, q, k; wrote the norm, q and k rotated, the activation, the sum
        tensors = 4 * d + 3 * f + 2 * (d + KV_WIDTH)
    return work, inputs, 3 * tokens * tensors * 2
