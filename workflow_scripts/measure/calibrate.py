"""Machine calibration (rule calibrate): what this machine does per second, measured in seconds before the study's
timed runs, so that a rerun on another machine can say whether its timings differ because the machine does.

    python -m workflow_scripts.measure.calibrate --platform cuda --world-sizes 2,4 --work-dir work/x \\
        --out <set>/calibration/calibration.json --md <set>/calibration/calibration.md

Measured (median of `rounds` after one warm-up; the two host-speed measures, cpu_single_thread and launch_us, the
fastest of 3 x `rounds`), each a row {name, value, unit, detail}:
- cpu_single_thread      pure-Python integer loop, million iterations/s (launch-bound runs follow it);
- host_memcpy            numpy copy of 64 MiB, GB/s;
- cpu_adam               torch AdamW (foreach) step over 10 M fp32 parameters on the CPU, ms (offload strategies);
- disk_write / disk_read 64 MiB file in the work directory (fsync after the write; the read is from page cache
                         unless the machine evicts it), GB/s (ZeRO-Infinity's NVMe path);
- per GPU: matmul_bf16   8192^3 bf16 matmul, TFLOP/s; h2d / d2h pinned copies of 1 GiB, GB/s; launch_us: the
                         host's time per eager kernel launch (a one-element add), microseconds (host-bound GPU runs
                         follow it: plan/bound.py);
- per GPU: hbm_copy      device-to-device copy of 1 GiB, GB/s read + written (memory-bound work: plan/step_time.py);
- tp_linear_us           the host's time per tensor-parallel linear, forward + backward, beyond a plain one's:
                         DTensor's dispatch, microseconds (GPU 0, a one-rank mesh; eager tensor parallelism's host
                         term in plan/step_time.py), and tp_linear_us_ranks[n] on a mesh of n ranks (below);
- zero3_tensor_us        the host's time per parameter tensor and step of a one-rank DeepSpeed ZeRO-3 engine beyond
                         plain torch's, microseconds (GPU 0; eager ZeRO-3's hook term in plan/step_time.py; None
                         where DeepSpeed is missing), and zero3_module_us, what each module adds (its hooks);
- curves (GPU 0)         matmul_bf16 TFLOP/s over GEMM shapes m x k x n (GEMM_M x GEMM_KN x GEMM_KN) and SDPA
                         forward + backward TFLOP/s over mask (causal, full) x sequence x head dimension, both
                         replayed from CUDA graphs (the device's rates): the step-time model's rates;
- memory_block[b,l]      (GPU 0) a block's norm, rotary, activation and residual kernels, forward + backward,
                         eager or compiled, GB/s (measure/block_kernels.py: the step-time model's pace for
                         memory-bound work against the machine its constants were fitted on);
- matmul_bf16_unaligned  (GPU 0) TFLOP/s of a linear whose output width is not a multiple of 8, forward and both
                         gradients (UNALIGNED: GPT-2's unpadded 50,257-row head over 8 k tokens), replayed from a
                         CUDA graph: cuBLAS falls back to slower kernels for it (the step-time model's rate for such
                         GEMMs);
- per world size n > 1 on one node: all_reduce and all_gather bus bandwidth (nccl-tests convention: all-reduce
                         algbw x 2(n-1)/n, all-gather algbw x (n-1)/n) at 64 MB and 1 GB, torchrun with n processes;
                         launch_us_ranks[n], the launch cost measured on the n processes at once (their slowest):
                         n host-bound ranks of a node issue their steps together; host_beside[n], its ratio to
                         launch_us[0] alone; tp_linear_us_ranks[n], tp_linear_us over a mesh of the n ranks (the
                         slowest rank's): the dispatch with the all-reduces of tensor parallelism at n ranks;
                         zero3_tensor_us_ranks[n], zero3_tensor_us of an engine over the n ranks (the slowest
                         rank's): its hooks with the gathers and reduce-scatters the ranks wait on together.
On CPU the GPU and collective rows are present with value None and detail "not applicable (cpu)" (CPU studies
check a pipeline, they time nothing worth explaining; the calibration there takes about 3 s).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from workflow_scripts.units import GB, GIB, MB

LAUNCHES = 20_000
GEMM_M = (2048, 8192, 32768)  # tokens of a micro-batch on one device
# hidden, MLP and vocabulary widths; 1024 and 1536 between 768 and 2048, where the rate climbs steeply: interpolated
# there without them, GPT-2-medium's 16384 x 1024 x 4096 read 623 TFLOP/s on an H100 whose direct measurement gave
# 678-707
GEMM_KN = (768, 1024, 1536, 2048, 4096, 8192, 65536)
UNALIGNED = (8192, 1024, 50257)  # m x k x n: tokens x hidden x an odd vocabulary (GPT-2's 50,257 rows unpadded)
SDPA_SEQ = (256, 512, 1024, 2048, 4096)  # a ViT's 197-257 patches to long language-model contexts
SDPA_HEAD_DIM = (64, 80, 128)
HOST_WIDTH, HOST_TOKENS = 256, 128  # small linears: the host sets their pace, not the GPU (the host-cost rows)
TP_PAIRS = 50
ZERO3_LAYERS, ZERO3_STEPS = 48, 5  # a stack of small linears (96 parameter tensors) as a ZeRO-3 engine's model
ZERO3_STACK_MODULES_PER_TENSOR = (ZERO3_LAYERS + 1) / (2 * ZERO3_LAYERS)  # the bare stack's: its linears and root
ZERO3_CONTAINERS = 4  # parameterless containers nested around each linear of the other stack: 192 modules more


def timed(fn, rounds: int, best: bool = False) -> float:
    """Median seconds of fn() over `rounds` calls after one warm-up call; fn synchronises itself. best: the
    fastest of 3 x rounds calls instead, for the host measures, which a job beside the calibration (tokenize, an
    op build) only ever slows down."""
    fn()
    times = []
    for _ in range(3 * rounds if best else rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) if best else statistics.median(times)


def row(name: str, value, unit: str, detail: str) -> dict:
    return {"name": name, "value": value, "unit": unit, "detail": detail}


def host_memcpy_gbs(rounds: int) -> float:
    """The host's copy bandwidth (`host_memcpy`): a numpy copy of 64 MiB, GB/s, the median round."""
    import numpy as np

    src = np.ones(64 * 2**20, dtype=np.uint8)
    dst = np.empty_like(src)
    return src.nbytes / timed(lambda: np.copyto(dst, src), rounds) / GB


PYTHON_LOOP = 2_000_000  # iterations of cpu_single_thread's pure-Python loop


def python_loop() -> int:
    """cpu_single_thread's work (and bench.host_pace's): a pure-Python integer loop of PYTHON_LOOP iterations."""
    total = 0
    for i in range(PYTHON_LOOP):
        total += i
    return total


def host_rows(work_dir: Path, rounds: int) -> list[dict]:
    import numpy as np
    import torch

    src = np.ones(64 * 2**20, dtype=np.uint8)
    dst = np.empty_like(src)
    # torch's functional AdamW, the arithmetic of AdamW(foreach=True).step: an Optimizer object would import
    # torch._dynamo on construction (2.6 s on a 2-core machine, every study's calibration)
    from torch.optim.adamw import adamw

    state = [[torch.randn(10_000_000)], [torch.randn(10_000_000)], [torch.zeros(10_000_000)],
             [torch.zeros(10_000_000)], [], [torch.tensor(0.0)]]

    def adam_step():
        adamw(*state, foreach=True, capturable=False, differentiable=False, fused=None, grad_scale=None,
              found_inf=None, amsgrad=False, beta1=0.9, beta2=0.999, lr=1e-4, weight_decay=0.01, eps=1e-8,
              maximize=False)
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "calibration.bin"

    def write():
        with open(path, "wb") as f:
            f.write(src.data)
            f.flush()
            os.fsync(f.fileno())

    def read():
        with open(path, "rb") as f:
            f.readinto(dst.data)

    out = [row("cpu_single_thread", PYTHON_LOOP / 1e6 / timed(python_loop, rounds, best=True), "M iterations/s",
               "pure-Python integer loop, fastest round"),
           row("host_memcpy", host_memcpy_gbs(rounds), "GB/s", "numpy copy, 64 MiB"),
           row("cpu_adam", 1000 * timed(adam_step, rounds), "ms", "torch AdamW(foreach) step, 10 M fp32 parameters")]
    try:  # the scratch file goes whatever happens: a failed write on a full disk must not keep it full
        out.append(row("disk_write", src.nbytes / timed(write, rounds) / GB, "GB/s",
                       f"64 MiB + fsync in {work_dir}"))
        out.append(row("disk_read", src.nbytes / timed(read, rounds) / GB, "GB/s", "64 MiB, page cache may serve it"))
    finally:
        path.unlink(missing_ok=True)
    return out


def one_gpu(i: int, rounds: int) -> list[dict]:
    import torch

    dev = torch.device("cuda", i)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    host = torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(GIB, dtype=torch.uint8, device=dev)

    def sync(fn):
        def run():
            fn()
            torch.cuda.synchronize(dev)
        return run

    def matmuls():
        for _ in range(10):
            a @ a

    tiny = torch.zeros(1, device=dev)

    def launches():  # the host's cost of one eager kernel launch: the GPU finishes each before the next is issued
        for _ in range(LAUNCHES):
            tiny.add_(1)

    flops = 10 * 2 * 8192**3 / timed(sync(matmuls), rounds) / 1e12
    launch_us = 1e6 * timed(sync(launches), rounds, best=True) / LAUNCHES
    h2d = GIB / timed(sync(lambda: device.copy_(host, non_blocking=True)), rounds) / GB
    d2h = GIB / timed(sync(lambda: host.copy_(device, non_blocking=True)), rounds) / GB
    other = torch.empty_like(device)
    hbm = 2 * GIB / timed(sync(lambda: other.copy_(device)), rounds) / GB  # read + write
    return [row(f"matmul_bf16[{i}]", flops, "TFLOP/s", torch.cuda.get_device_name(dev)),
            row(f"h2d[{i}]", h2d, "GB/s", "pinned, 1 GiB"), row(f"d2h[{i}]", d2h, "GB/s", "pinned, 1 GiB"),
            row(f"hbm_copy[{i}]", hbm, "GB/s", "device-to-device copy of 1 GiB, bytes read + written"),
            row(f"launch_us[{i}]", launch_us, "us",
                f"eager launch of a one-element add, {LAUNCHES} in a row, fastest round")]


def matmul_curve(rounds: int) -> list[dict]:
    """bf16 matmul TFLOP/s of an (m x k) @ (k x n) product on GPU 0, over the shapes a transformer's GEMMs take
    (m tokens, k and n hidden, MLP and vocabulary widths), replayed from a CUDA graph (the device's rate; the host's
    launches are the step-time model's host term): its rate for each GEMM by shape (plan/step_time.py interpolates)."""
    import torch

    out = []
    for m in GEMM_M:
        for k in GEMM_KN:
            for n in GEMM_KN:
                a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
                out.append({"m": m, "k": k, "n": n,
                            "tflops": replayed_tflops(lambda a=a, b=b: a @ b, 2 * m * k * n, rounds)})
    return out


def unaligned_matmul_row(rounds: int) -> dict:
    """The bf16 rate of a linear whose output width n is odd (UNALIGNED): y = x W^T, dx = dy W, dW = dy^T x, as a
    language model's head computes them where the vocabulary is not padded to a multiple of 8 (train.embedding_rows);
    one rate over the three."""
    import torch

    m, k, n = UNALIGNED
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

    def body():
        x @ w.t(), dy @ w, dy.t() @ x

    return row("matmul_bf16_unaligned", replayed_tflops(body, 3 * 2 * m * k * n, rounds), "TFLOP/s",
               f"{m} x {k} x {n}: y = x W^T, dx = dy W, dW = dy^T x, replayed from a CUDA graph")


def replayed_tflops(body, flops: float, rounds: int) -> float:
    """TFLOP/s of body() (`flops` a call) on GPU 0's device (replayed_rate)."""
    return replayed_rate(body, flops, rounds) / 1e12


def replayed_rate(body, work: float, rounds: int) -> float:
    """`work` (FLOPs, bytes) per second of body() (`work` a call) on GPU 0's device: as many calls as make about
    2 x 10^12 of it (1 to 50) captured in a CUDA graph, the graph replayed (the kernels' time, not the host's launches:
    those are the step-time model's host term). The body runs first on a side stream, so that cuBLAS and autograd pick
    their kernels and workspaces before the capture."""
    import torch

    reps = max(1, min(50, int(2e12 / work)))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            body()

    def run():
        graph.replay()
        torch.cuda.synchronize()

    return work * reps / timed(run, rounds)


def sdpa_curve(rounds: int) -> list[dict]:
    """Scaled-dot-product attention (the flash kernel), forward + input gradients, TFLOP/s of GPU 0's device by
    mask (causal: a language model's; full: a ViT's), sequence length and head dimension, at 16 k tokens x 16 heads
    a call, replayed from a CUDA graph; FLOPs: 4 s^2 h e forward (half of it causal), 2.5x that backward."""
    import torch
    import torch.nn.functional as F

    out = []
    for causal in (True, False):
        for seq in SDPA_SEQ:
            for head_dim in SDPA_HEAD_DIM:
                batch, heads = max(1, 16384 // seq), 16
                q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                grad = torch.randn_like(q)

                def body(q=q, k=k, v=v, grad=grad, causal=causal):
                    torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v), grad)

                flops = 3.5 * 4 * batch * heads * seq * seq * head_dim / (2 if causal else 1)
                out.append({"causal": causal, "seq": seq, "head_dim": head_dim,
                            "tflops": replayed_tflops(body, flops, rounds)})
    return out


def gpu_curves(rounds: int) -> dict:
    """The curves of GPU 0 (one kind per node); none on CPU."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"matmul_bf16": matmul_curve(rounds), "sdpa_bf16": sdpa_curve(rounds)}


def block_pace(block: str, levers: str, rounds: int) -> float:
    """GB/s of one block's work (block_kernels.block_work), forward and backward, eager or compiled, replayed from a
    CUDA graph."""
    import torch

    from workflow_scripts.measure.block_kernels import block_work

    work, inputs, nbytes = block_work(block)
    if levers == "compiled":
        work = torch.compile(work)
    grads = [torch.randn_like(t) for t in work(*inputs)]

    def body():
        torch.autograd.grad(work(*inputs), inputs, grads)

    return replayed_rate(body, nbytes, rounds) / GB


def block_rows(rounds: int) -> list[dict]:
    """memory_block[<block>,<levers>] of GPU 0: each block's pace (block_pace), GB/s."""
    from workflow_scripts.measure.block_kernels import BLOCKS, LEVERS, MEMORY_TOKENS

    out = []
    for block, (d, f) in BLOCKS.items():
        for levers in LEVERS:
            gbs = block_pace(block, levers, rounds)
            out.append(row(f"memory_block[{block},{levers}]", gbs, "GB/s",
                           f"{block} (d {d}, f {f}) over {MEMORY_TOKENS} tokens, forward + backward, {levers}, "
                           "replayed from a CUDA graph"))
    return out


def gpu_rows(rounds: int) -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return [row(n, None, u, "not applicable (cpu)") for n, u in
                (("matmul_bf16", "TFLOP/s"), ("matmul_bf16_unaligned", "TFLOP/s"), ("h2d", "GB/s"), ("d2h", "GB/s"),
                 ("tp_linear_us", "us"), ("zero3_tensor_us", "us"), ("zero3_module_us", "us"),
                 ("memory_block", "GB/s"))]
    out = []
    for i in range(torch.cuda.device_count()):
        out += one_gpu(i, rounds)
        torch.cuda.empty_cache()
    return out + [unaligned_matmul_row(rounds), *block_rows(rounds), tp_linear_row(rounds),
                  *zero3_host_rows(rounds)]


def tp_linear_row(rounds: int) -> dict:
    """The host's cost of one tensor-parallel linear beyond a plain one's on a one-rank DTensor mesh of GPU 0
    (tp_extra_us). Its own one-rank process group where the process has none (a study's calibrate job)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    dev = torch.device("cuda", 0)
    try:
        with one_rank_group(dev):
            extra = tp_extra_us(dev, init_device_mesh("cuda", (1,)), rounds)
    except (RuntimeError, ValueError) as exc:  # the rest of the calibration stands without this row
        return row("tp_linear_us", None, "us", f"failed: {str(exc).strip().splitlines()[-1:]}")
    return row("tp_linear_us", extra, "us",
               "DTensor colwise + rowwise linear, forward + backward, less plain ones, per linear; one-rank mesh, "
               "fastest round")


def host_pair(dev):
    """The host-bound pair of linears the tensor-parallel host rows time (HOST_WIDTH -> 4 x HOST_WIDTH ->
    HOST_WIDTH, no biases), on `dev`."""
    import torch

    return torch.nn.Sequential(torch.nn.Linear(HOST_WIDTH, 4 * HOST_WIDTH, bias=False),
                               torch.nn.Linear(4 * HOST_WIDTH, HOST_WIDTH, bias=False)).to(dev)


def tp_extra_us(dev, mesh, rounds: int) -> float:
    """Forward and backward of a ColwiseParallel and a RowwiseParallel linear (parallel/tensor.py's split) over
    `mesh`, less the same two as plain linears, microseconds per linear (fastest round): DTensor's dispatch and, on
    a mesh of several ranks, the all-reduces they wait on together."""
    import torch
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plain, split = host_pair(dev), host_pair(dev)
    parallelize_module(split, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    x = torch.randn(HOST_TOKENS, HOST_WIDTH, device=dev)

    def pairs(m):
        def run():
            for _ in range(TP_PAIRS):
                m(x).sum().backward()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        return run

    extra = timed(pairs(split), rounds, best=True) - timed(pairs(plain), rounds, best=True)
    return 1e6 * extra / (2 * TP_PAIRS)


@contextlib.contextmanager
def one_rank_group(dev):
    """A one-rank NCCL process group on `dev` where the process has none (a study's calibrate job), left after;
    LOCAL_RANK set meanwhile where unset (DeepSpeed's engine asks for it)."""
    import torch.distributed as dist

    own = not dist.is_initialized()
    set_rank = "LOCAL_RANK" not in os.environ
    if own:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=dev)
    if set_rank:
        os.environ["LOCAL_RANK"] = "0"
    try:
        yield
    finally:
        if set_rank:
            os.environ.pop("LOCAL_RANK", None)
        if own:
            dist.destroy_process_group()


def zero3_host_rows(rounds: int) -> list[dict]:
    """The host's cost of DeepSpeed ZeRO-3 beyond plain torch, per parameter tensor and per module: forward, backward
    and optimizer step in a one-rank ZeRO-3 engine (the strategies' bf16-mixed JSON: DeepSpeed's torch_autocast,
    torch's AdamW), less the same model plain under autocast with the same optimizer. Its gathers, releases and
    gradient reductions walk every tensor in Python (a host profile of ViT-Huge under ZeRO-3), and it hooks every
    module, with parameters or without; what a launch costs prices neither (GPT-2 under ZeRO-3 on an H100 ran far
    slower than its launches predict). Two models of ZERO3_LAYERS small linears, equal in tensors: `zero3_tensor_us`
    is the bare stack's cost per tensor (ZERO3_STACK_MODULES_PER_TENSOR modules a tensor), `zero3_module_us` what the
    ZERO3_CONTAINERS containers nested around each linear of the other add, per module (one container a linear made
    a signal of about 20 ms a step, which one machine's noise turned negative). None with the reason where DeepSpeed
    is missing or fails."""
    import torch

    dev = torch.device("cuda", 0)
    try:
        with one_rank_group(dev):  # one group for both engines: DeepSpeed keeps the first's
            bare = zero3_extra_seconds(dev, rounds, contained=False)
            contained = zero3_extra_seconds(dev, rounds, contained=True)
    except (ImportError, RuntimeError, ValueError, AssertionError) as exc:  # the rest of the calibration stands
        why = f"failed: {str(exc).strip().splitlines()[-1:]}"
        return [row("zero3_tensor_us", None, "us", why), row("zero3_module_us", None, "us", why)]
    return [row("zero3_tensor_us", per_tensor_us(bare), "us",
                "DeepSpeed ZeRO-3 forward + backward + step less plain torch's, per parameter tensor and step of a "
                "bare stack of linears; one-rank engine, fastest round"),
            row("zero3_module_us", 1e6 * (contained - bare) / (ZERO3_LAYERS * ZERO3_CONTAINERS), "us",
                f"what {ZERO3_CONTAINERS} parameterless containers nested around each linear add to it, per module "
                "and step")]


def per_tensor_us(seconds: float) -> float:
    """A step of the bare ZeRO-3 stack's extra seconds per parameter tensor (a weight and a bias a linear), µs."""
    return 1e6 * seconds / (2 * ZERO3_LAYERS)


def zero3_extra_seconds(dev, rounds: int, contained: bool) -> float:
    """Seconds a step of ZERO3_LAYERS linears (each inside ZERO3_CONTAINERS containers where `contained`) takes in a
    DeepSpeed ZeRO-3 engine over the caller's group (one rank, or a torchrun's ranks) beyond plain torch's, fastest
    rounds of ZERO3_STEPS steps."""
    import deepspeed
    import torch

    def wrapped(module):
        for _ in range(ZERO3_CONTAINERS if contained else 0):
            module = torch.nn.Sequential(module)
        return module

    def stack():
        return torch.nn.Sequential(*[wrapped(torch.nn.Linear(HOST_WIDTH, HOST_WIDTH))
                                     for _ in range(ZERO3_LAYERS)]).to(dev)

    x = torch.randn(HOST_TOKENS, HOST_WIDTH, device=dev)
    plain = stack()
    plain_opt = torch.optim.AdamW(plain.parameters(), fused=True)
    model = stack()
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), fused=True),
                                      config={"train_micro_batch_size_per_gpu": 1,
                                              "zero_optimization": {"stage": 3},
                                              "zero_allow_untested_optimizer": True,
                                              "steps_per_print": 1_000_000_000,
                                              "torch_autocast": {"enabled": True, "dtype": "bfloat16",
                                                                 "lower_precision_safe_modules": []}})

    def zero3():
        for _ in range(ZERO3_STEPS):
            engine.backward(engine(x).float().square().mean())
            engine.step()
        torch.cuda.synchronize(dev)

    def eager():
        for _ in range(ZERO3_STEPS):
            with torch.autocast("cuda", torch.bfloat16):
                loss = plain(x).float().square().mean()
            loss.backward()
            plain_opt.step()
            plain_opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(dev)

    extra = timed(zero3, rounds, best=True) - timed(eager, rounds, best=True)
    engine.destroy()
    return extra / ZERO3_STEPS


def collective_rows(world: int, platform: str, rounds: int) -> list[dict]:
    """Runs this module's --collectives mode under torchrun with `world` processes; rank 0 prints the rows."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", "-m",
           "workflow_scripts.measure.calibrate", "--collectives", "--platform", platform, "--rounds", str(rounds)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return [row(f"collectives[{world}]", None, "", f"failed: {done.stderr.strip().splitlines()[-1:]}")]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def collectives(platform: str, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    cuda = platform != "cpu"
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    n = dist.get_world_size()
    for size in (64 * MB, 1000 * MB):
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
        parts = torch.empty(n * x.numel(), dtype=x.dtype, device=device)

        def sync(fn):
            def run():
                fn()
                if cuda:
                    torch.cuda.synchronize(device)
                dist.barrier()
            return run

        t_ar = timed(sync(lambda: dist.all_reduce(x)), rounds)
        t_ag = timed(sync(lambda: dist.all_gather_into_tensor(parts, x)), rounds)
        if dist.get_rank() == 0:
            label = f"{size // MB} MB, {n} ranks, {'NCCL/RCCL' if cuda else 'gloo'}"  # gloo: --collectives by hand
            print(json.dumps(row(f"all_reduce_busbw[{n}x{size // MB}MB]", size / t_ar * 2 * (n - 1) / n / GB,
                                 "GB/s", label)))
            print(json.dumps(row(f"all_gather_busbw[{n}x{size // MB}MB]", size * n / t_ag * (n - 1) / n / GB,
                                 "GB/s", label)))
    launch = launch_beside(device, rounds)
    tp = tp_beside(device, rounds)
    zero3 = zero3_beside(device, rounds)
    if dist.get_rank() == 0:
        print(json.dumps(row(f"launch_us_ranks[{n}]", launch, "us", f"launch_us on each of {n} processes at once "
                             "(their slowest, fastest round): a host-bound rank's pace beside the node's others")))
        print(json.dumps(row(f"tp_linear_us_ranks[{n}]", tp, "us", f"tp_linear_us on a mesh of the {n} ranks "
                             "(their slowest): DTensor's dispatch with the all-reduces the ranks wait on together")))
        print(json.dumps(row(f"zero3_tensor_us_ranks[{n}]", zero3, "us", f"zero3_tensor_us of an engine over the {n} "
                             "ranks (their slowest): ZeRO-3's hooks with the collectives the ranks wait on together")))
    dist.destroy_process_group()


def tp_beside(device, rounds: int) -> float | None:
    """tp_extra_us on a mesh of every rank of the group, the slowest rank's; None where DTensor fails here."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    try:
        mine = tp_extra_us(device, init_device_mesh(device.type, (dist.get_world_size(),)), rounds)
    except (RuntimeError, ValueError):
        mine = None
    return slowest(mine)


def zero3_beside(device, rounds: int) -> float | None:
    """zero3_tensor_us of an engine over every rank of the group (its parameters partitioned across them), the
    slowest rank's; None where DeepSpeed is missing or fails here."""
    try:
        mine = per_tensor_us(zero3_extra_seconds(device, rounds, contained=False))
    except (ImportError, RuntimeError, ValueError, AssertionError):
        mine = None
    return slowest(mine)


def launch_beside(device, rounds: int) -> float:
    """launch_us measured on every rank of the group at once (started at a barrier); the slowest rank's."""
    import torch
    import torch.distributed as dist

    tiny = torch.zeros(1, device=device)

    def launches():
        for _ in range(LAUNCHES):
            tiny.add_(1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    dist.barrier()
    return slowest(1e6 * timed(launches, rounds, best=True) / LAUNCHES)


def slowest(mine: float | None) -> float | None:
    """The largest of every rank's measure of the group (the slowest rank's); None where any rank has none."""
    import torch.distributed as dist

    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return None if None in every else max(every)


def calibrate(platform: str, world_sizes: list[int], work_dir: Path, rounds: int) -> dict:
    rows = host_rows(work_dir, rounds) + gpu_rows(rounds)
    curves = gpu_curves(rounds)
    for world in sorted({w for w in world_sizes if w > 1}):
        rows += (collective_rows(world, platform, rounds) if platform != "cpu" else
                 [row(f"all_reduce_busbw[{world}]", None, "GB/s", "not applicable (cpu)"),
                  row(f"all_gather_busbw[{world}]", None, "GB/s", "not applicable (cpu)")])
    rows += host_beside_rows(rows)
    from workflow_scripts.measure import machine

    return {"platform": platform, "rounds": rounds, "rows": rows, "curves": curves, "machine": machine.facts(),
            "measured_unix": time.time()}


def host_beside_rows(rows: list[dict]) -> list[dict]:
    """host_beside[n]: launch_us_ranks[n] over GPU 0's launch_us alone, both of this calibration (how much slower a
    host-bound rank issues its work beside the node's n - 1 other ranks; the step-time model's host term at n ranks)."""
    values = {r["name"]: r["value"] for r in rows}
    alone = values.get("launch_us[0]")
    out = []
    for name, value in values.items():
        if name.startswith("launch_us_ranks[") and value and alone:
            n = name[len("launch_us_ranks["):-1]
            out.append(row(f"host_beside[{n}]", value / alone, "x", f"launch_us_ranks[{n}] / launch_us[0]"))
    return out


def markdown(cal: dict) -> str:
    lines = ["| measure | value | unit | how |", "|---|---|---|---|"]
    for r in cal["rows"]:
        value = "n/a" if r["value"] is None else f"{r['value']:.4g}"
        lines.append(f"| {r['name']} | {value} | {r['unit']} | {r['detail']} |")
    for name, points in (cal.get("curves") or {}).items():
        rates = sorted(p["tflops"] for p in points)
        lines.append(f"| {name} curve | {rates[0]:.4g} .. {rates[len(rates) // 2]:.4g} .. {rates[-1]:.4g} | TFLOP/s "
                     f"| min .. median .. max over {len(points)} shapes (calibration.json `curves`) |")
    gpu = (cal["machine"].get("gpu") or {})
    return (f"Calibration ({cal['platform']}, median of {cal['rounds']}); CPU: {cal['machine'].get('cpu_model')}; "
            f"driver: {gpu.get('driver')}; NCCL: {cal['machine'].get('nccl')}\n\n" + "\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--world-sizes", default="", help="comma-separated world sizes of one node (collectives)")
    ap.add_argument("--work-dir", default="work/calibration")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--md")
    ap.add_argument("--collectives", action="store_true", help="internal: one torchrun rank of the collectives")
    a = ap.parse_args(argv)
    if a.collectives:
        return collectives(a.platform, a.rounds)
    sizes = [int(w) for w in a.world_sizes.split(",") if w.strip()]
    cal = calibrate(a.platform, sizes, Path(a.work_dir), a.rounds)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(cal, indent=2))
    Path(a.md).write_text(markdown(cal))
    print(markdown(cal))


if __name__ == "__main__":
    main()
