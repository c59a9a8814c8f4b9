"""The DeepSpeed ops the GPU strategies load, each against a reference computed here, on a GPU: ZeRO++'s quantizer
(int8 per group, as zero_quantized_weights uses it), fused Adam (ZeRO-1/2's optimizer) and async I/O (ZeRO-Infinity's
NVMe path). Pre-built ops (the image's, containers/install.sh's ops step) are loaded as they are; otherwise DeepSpeed
builds them first. Skipped without a CUDA device; on a GPU machine:

    python3 -m pytest -q tests/test_gpu_ops.py
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("deepspeed")


def test_the_quantizer_rounds_each_group_to_its_int8_step():
    """Symmetric int8 per group: the step is the group's largest magnitude over 127, and every value comes back
    within one step of the input plus two fp16 roundings, of the group's scale and of the result (half an ulp
    each, at most |x| x 2^-10 together; an H200 measured 1.044 steps where |x| is near 127 steps: 0.124 allowed
    there), as torch's own rounding at that step gives for nearly every value."""
    from deepspeed.ops.op_builder import QuantizerBuilder

    q_op = QuantizerBuilder().load()
    groups, size = 256, 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    scale = torch.linspace(0.01, 4.0, groups * size, device="cuda")
    x = (torch.randn(groups * size, device="cuda", generator=g) * scale).half()
    q, params = q_op.quantize(x, groups, 8, q_op.Symmetric)
    assert q.dtype == torch.int8 and q.numel() == x.numel()
    back = q_op.dequantize(q, params, groups, 8, q_op.Symmetric).float().view(groups, size)
    ref = x.float().view(groups, size)
    step = ref.abs().amax(dim=1, keepdim=True) / 127
    rounded = torch.round(ref / step).clamp(-127, 127) * step
    fp16 = ref.abs() * 2.0**-10  # the fp16 scale's and result's rounding
    assert ((back - ref).abs() - fp16).div(step).max() <= 1.0 + 1e-3
    assert ((back - rounded).abs() <= step + fp16).float().mean() > 0.99


def test_fused_adam_takes_the_steps_of_torchs_adamw():
    from deepspeed.ops.adam import FusedAdam

    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(4096, 33, device="cuda")) for _ in range(3)]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kw = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    fused, ref = FusedAdam(ours, adam_w_mode=True, **kw), torch.optim.AdamW(theirs, foreach=False, **kw)
    for _ in range(5):
        grads = [torch.randn_like(p) for p in ours]
        for p, q, gr in zip(ours, theirs, grads):
            p.grad, q.grad = gr.clone(), gr.clone()
        fused.step()
        ref.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_async_io_writes_and_reads_back_the_same_bytes(tmp_path):
    from deepspeed.ops.op_builder import AsyncIOBuilder

    aio = AsyncIOBuilder().load()
    handle = aio.aio_handle(1 << 20, 8, False, True, 1)  # block size, queue depth, single submit, overlap, threads
    data = torch.randint(-128, 127, (8 << 20,), dtype=torch.int8).pin_memory()
    back = torch.empty_like(data).pin_memory()
    path = str(tmp_path / "swap.bin")
    assert handle.sync_pwrite(data, path) >= 0
    assert handle.sync_pread(back, path) >= 0
    assert torch.equal(data, back)
