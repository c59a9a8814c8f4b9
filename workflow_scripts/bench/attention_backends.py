"""Causal attention forward + backward by SDPA backend (flash, cuDNN, memory-efficient) on GPU 0, eager and
compiled, at a study's shapes: whether a run should ask for cuDNN's kernel (train.attn_implementation: sdpa_cudnn).
Prints one row per backend and shape: median ms over repeats of 20 calls, TFLOP/s on 3.5 x 4 b h s^2 e / 2 FLOPs
(causal, backward 2.5x). `python -m workflow_scripts.bench.attention_backends` on a GPU machine."""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def only(backend):
    """Attention with only `backend` allowed, chosen inside the call (as training/attention.py does): a compiled
    copy traces the choice into its graph, where a global flag would not reach torch.compile's caches (torch 2.11's
    compiled code kept flash first under a priority order that put cuDNN before it)."""
    def call(q, k, v):
        with sdpa_kernel(backend):
            return attention(q, k, v)
    return call


def time_ms(fn, q, k, v, repeats: int) -> float:
    for _ in range(3):
        fn(q, k, v).sum().backward()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn(q, k, v).sum().backward()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 20)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", default="16x16x1024x64,4x12x1024x128",
                   help="batch x heads x sequence x head_dim, comma-separated")
    p.add_argument("--repeats", type=int, default=10)
    a = p.parse_args()
    print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.get_device_name())
    for shape in a.shapes.split(","):
        b, h, s, e = (int(x) for x in shape.split("x"))
        q, k, v = (torch.randn(b, h, s, e, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        flops = 3.5 * 4 * b * h * s * s * e / 2
        for name, backend in BACKENDS.items():
            for label, fn in (("eager", only(backend)), ("compiled", torch.compile(only(backend)))):
                try:
                    ms = time_ms(fn, q, k, v, a.repeats)
                    print(f"{shape:>16} {name:>9} {label:>8} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")
                except RuntimeError as err:
                    print(f"{shape:>16} {name:>9} {label:>8} unavailable: {str(err).splitlines()[0][:100]}")


if __name__ == "__main__":
    main()
