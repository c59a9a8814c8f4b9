"""Does a training step's device work run at the rates the calibration measures? Three ways it may not, on GPU 0:

    python -m workflow_scripts.bench.device_pace --rounds 3 --out results/bench_harness/<set>

- memory-bound kernels by size: the calibration prices every kernel outside the matmuls at one 1 GiB device copy's
  bandwidth (`hbm_copy`), while a step's kernels read and write tensors of 8-256 MB (tokens x hidden x 2 bytes):
  a copy, an add of two tensors, GELU and LayerNorm forward, over MEMORY_MB per input tensor, GB/s read + written,
  replayed from a CUDA graph (the calibration's way: measure/calibrate.replayed_rate);
- matmul operand layouts: the calibration's curve multiplies row-major operands (NN); a linear's forward computes
  x W^T (NT), its input gradient dy W (NN), its weight gradient dy^T x (TN); TFLOP/s of each at GPT-2-medium's and
  Llama-8B's widths;
- sustained load: the calibration measures each shape for milliseconds at the clocks of an idle GPU; a step
  multiplies for seconds on end. One matmul graph replayed for SUSTAIN_S seconds: TFLOP/s, SM clock, power and the
  clock-event reasons NVML reports, per half-second window.

Each measure runs `rounds` times interleaved (the sizes in turn, then again); writes device_pace.csv (one row per
round and measure) and device_pace.md (means and 95% CIs, the sustained windows' first and last seconds).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from workflow_scripts.bench import rounds as rounds_
from workflow_scripts.measure.calibrate import replayed_rate, replayed_tflops
from workflow_scripts.units import GB

MEMORY_MB = (8, 32, 128, 512, 1024)
LAYOUT_SHAPES = ((16384, 1024, 4096), (16384, 4096, 1024), (16384, 4096, 14336), (16384, 14336, 4096))
SUSTAIN_SHAPE = (16384, 4096, 4096)
SUSTAIN_S = 20.0


def memory_kernels(mb: int) -> dict:
    """GB/s (read + written) of four memory-bound kernels over bf16 tensors of `mb` MB each."""
    import torch
    import torch.nn.functional as F

    n = mb * 2**20 // 2
    width = 1024
    x = torch.randn(n // width, width, device="cuda", dtype=torch.bfloat16)
    y, out = torch.randn_like(x), torch.empty_like(x)
    w, b = torch.ones(width, device="cuda", dtype=torch.bfloat16), torch.zeros(width, device="cuda",
                                                                               dtype=torch.bfloat16)
    nbytes = x.numel() * 2
    bodies = {"copy": (lambda: out.copy_(x), 2 * nbytes), "add": (lambda: torch.add(x, y, out=out), 3 * nbytes),
              "gelu": (lambda: F.gelu(x, approximate="tanh"), 2 * nbytes),
              "layer_norm": (lambda: F.layer_norm(x, (width,), w, b), 2 * nbytes)}
    return {name: replayed_rate(body, moved, 3) / GB for name, (body, moved) in bodies.items()}


def layouts(m: int, k: int, n: int) -> dict:
    """TFLOP/s of m x k x n as NN (the calibration's), NT (a linear's forward) and TN (its weight gradient)."""
    import torch

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    bt = b.t().contiguous()  # n x k: a weight as nn.Linear stores it
    at = a.t().contiguous()  # k x m: dy^T's storage is dy's
    flops = 2 * m * k * n
    return {"NN": replayed_tflops(lambda: a @ b, flops, 3), "NT": replayed_tflops(lambda: a @ bt.t(), flops, 3),
            "TN": replayed_tflops(lambda: at.t() @ b, flops, 3)}


def sustained(seconds: float) -> list[dict]:
    """One matmul graph replayed for `seconds`: per half-second window, TFLOP/s, SM clock, power, clock reasons."""
    import pynvml as nv
    import torch

    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    m, k, n = SUSTAIN_SHAPE
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()  # cuBLAS picks its kernel and workspace before the capture
    with torch.cuda.stream(side):
        a @ b
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            a @ b
    windows, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0, replays = time.perf_counter(), 0
        while time.perf_counter() - t0 < 0.5:
            graph.replay()
            replays += 1
            if replays % 8 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        windows.append({"t_s": t1 - start, "tflops": 20 * replays * 2 * m * k * n / (t1 - t0) / 1e12,
                        "sm_mhz": nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
                        "power_w": nv.nvmlDeviceGetPowerUsage(handle) / 1e3,
                        "temp_c": nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
                        "reasons": nv.nvmlDeviceGetCurrentClocksEventReasons(handle)})
    return windows


def measure(rounds: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    import torch

    rows, windows = [], []
    for r in range(rounds):
        for mb in rounds_.order(r, MEMORY_MB):
            for kernel, gbs in memory_kernels(mb).items():
                rows.append({"round": r, "measure": f"{kernel} {mb} MB", "value": gbs, "unit": "GB/s"})
        for shape in rounds_.order(r, LAYOUT_SHAPES):
            for layout, tflops in layouts(*shape).items():
                rows.append({"round": r, "measure": f"{layout} {'x'.join(map(str, shape))}", "value": tflops,
                             "unit": "TFLOP/s"})
        for w in sustained(SUSTAIN_S):
            windows.append({"round": r, **w})
        torch.cuda.empty_cache()
        time.sleep(5)  # the GPU cools between rounds: each round's sustained run starts from the same state
    return pd.DataFrame(rows), pd.DataFrame(windows)


def summary(rows: pd.DataFrame, windows: pd.DataFrame, device: str) -> str:
    from workflow_scripts.report.stats import mean_ci

    lines = [f"### device pace on {device}", "", "| measure | unit | rounds | mean | ± 95% CI |", "|---|---|---|---|---|"]
    for (measure, unit), df in rows.groupby(["measure", "unit"], sort=False):
        ci = mean_ci(df.value)
        lines.append(f"| {measure} | {unit} | {ci.n} | {ci.mean:.1f} | {ci.half_width:.1f} |")
    title = f"### {'x'.join(map(str, SUSTAIN_SHAPE))} replayed for {SUSTAIN_S:.0f} s (per round: first window, last 5 s)"
    head = ("| round | first TFLOP/s | last 5 s TFLOP/s | last / first | SM MHz first / last | power W last | "
            "temp C last | clock reasons last |")
    lines += ["", title, "", head, "|---|---|---|---|---|---|---|---|"]
    for r, w in windows.groupby("round"):
        tail = w[w.t_s > w.t_s.max() - 5]
        lines.append(f"| {r} | {w.tflops.iloc[0]:.0f} | {tail.tflops.mean():.0f} | "
                     f"{tail.tflops.mean() / w.tflops.iloc[0]:.3f} | {w.sm_mhz.iloc[0]} / {tail.sm_mhz.iloc[-1]} | "
                     f"{tail.power_w.mean():.0f} | {tail.temp_c.iloc[-1]} | {tail.reasons.iloc[-1]:#x} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, help="write device_pace.csv, device_pace_windows.csv and device_pace.md here")
    args = ap.parse_args(argv)
    import torch

    rows, windows = measure(args.rounds)
    table = summary(rows, windows, torch.cuda.get_device_name())
    rounds_.write(rows, table, args.out, "device_pace")
    if args.out:
        windows.to_csv(args.out / "device_pace_windows.csv", index=False)


if __name__ == "__main__":
    main()
