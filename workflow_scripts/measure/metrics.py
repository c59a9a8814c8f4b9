"""Numbers researchers report: MFU against a peak table, predicted model-state memory, step-time statistics."""
from __future__ import annotations

import statistics

# Peak dense bf16 TFLOP/s by device name (substring match, most specific first). No entry: no MFU (e.g. CPU).
PEAK_TFLOPS_BF16 = [
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("H200", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
    ("MI250X", 383.0),
    ("MI300X", 1307.0),
]


def peak_tflops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, value in PEAK_TFLOPS_BF16:
        if key.lower() in device_name.lower():
            return value
    return None


def mfu(flops_per_token: float, tokens_per_s: float, world_size: int, device_name: str | None) -> float | None:
    """Model FLOPs utilisation of the whole job: achieved FLOP/s over world_size x the device's peak."""
    peak = peak_tflops(device_name)
    if peak is None or not tokens_per_s:
        return None
    return flops_per_token * tokens_per_s / (world_size * peak * 1e12)


ZERO_PARTITIONS_FROM = {"optimizer states": 1, "gradients": 2, "parameters": 3}  # the ZeRO stage that shards each


def partitioned(part: str, zero_stage: int) -> bool:
    """Whether ZeRO stage `zero_stage` partitions this model state over the data-parallel ranks (ZeRO paper: stage 1
    the optimizer states, 2 also the gradients, 3 also the parameters); the one rule the memory model and the
    run's own model-state prediction read."""
    return zero_stage >= ZERO_PARTITIONS_FROM[part]


def model_state_bytes(n_params: int, dp_size: int, zero_stage: int, state_bytes: tuple[int, int, int],
                      offload_optimizer: bool = False, offload_params: bool = False) -> dict:
    """Predicted model-state memory per rank (ZeRO paper, sec. 3 and 5) over `dp_size` data-parallel ranks, with
    `state_bytes` = bytes per parameter of (parameters, gradients, optimizer states) before partitioning (the
    precision policy's, training.precision): stage 1 partitions optimizer states,
    stage 2 also gradients, stage 3 also parameters. With bf16-pure this gives 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N.
    Optimizer offload (ZeRO-Offload) moves the optimizer states and the gradient partition the CPU Adam step
    reads to host memory; parameter offload (stage 3) moves the parameters. Activations come on top.
    DeepSpeed's own estimators (estimate_zero{2,3}_model_states_mem_needs) count 18Ψ/N for the partitioned
    part at stages 2 and 3 where the paper counts 14Ψ/N and 16Ψ/N: 4Ψ/N (fp32 gradient partition) more at
    stage 2, 2Ψ/N more at stage 3. tests/test_models_metrics.py pins that relation."""
    p, g, o = (b * n_params for b in state_bytes)
    n = dp_size
    p_dev = p / n if partitioned("parameters", zero_stage) else p
    g_dev = g / n if partitioned("gradients", zero_stage) else g
    o_dev = o / n if partitioned("optimizer states", zero_stage) else o
    host = 0.0
    if offload_optimizer:  # the CPU Adam step reads the gradient partition from host memory
        host += o_dev + (g_dev if partitioned("optimizer states", zero_stage) else 0.0)
        o_dev = 0.0
        g_dev = 0.0 if partitioned("optimizer states", zero_stage) else g_dev
    if offload_params:
        host += p_dev
        p_dev = 0.0
    return {"predicted_model_state_bytes": p_dev + g_dev + o_dev, "predicted_host_state_bytes": host}


def percentile(values, q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def steady(rows: list[dict], checkpoint_every: int = 0) -> list[dict]:
    """The steps that measure training: not timing warm-up, not a profiled step, and not the step right after a
    checkpoint save (a recorded run may count the save's time in that step). Empty when no step is left: warm-up
    steps never stand in for timed ones."""
    def after_save(step: int) -> bool:
        return bool(checkpoint_every) and step > 1 and (step - 1) % checkpoint_every == 0

    out = [r for r in rows if not _true(r["warmup"]) and not _true(r.get("profiled"))
           and not after_save(int(r["step"]))]
    return out


def timed_after_trace(rows: list[dict]) -> bool:
    """Whether a step measured for timing (`steady`) ran after a profiled one: once a trace ends, Kineto keeps CUPTI
    subscribed in the process, and its later steps run slower (measure/profile.py says by how much, and where).
    A run profiled with `profile.at: end` never does."""
    traced = [int(r["step"]) for r in rows if _true(r.get("profiled"))]
    return bool(traced) and any(int(r["step"]) > min(traced) for r in steady(rows))


def _true(value) -> bool:
    return value is True or str(value).lower() == "true"


def timing(rows: list[dict], steps_per_epoch: int, world_size: int, flops_per_token: float,
           device_name: str | None, checkpoint_every: int = 0) -> dict:
    """Time, throughput and MFU of a run from its per-step rows (the trainer and the parse stage share this)."""
    s = steady(rows, checkpoint_every)
    total = sum(float(r["step_time_s"]) for r in s)
    tokens_per_s = sum(float(r["tokens"]) for r in s) / total if total else None
    return {
        "time_per_epoch_s": total / len(s) * steps_per_epoch if s else None,
        "step_time_median_s": median(float(r["step_time_s"]) for r in s),
        "step_time_p90_s": percentile([float(r["step_time_s"]) for r in s], 0.9),
        "forward_median_s": median(float(r["forward_s"]) for r in s),
        "backward_median_s": median(float(r["backward_s"]) for r in s),
        "optimizer_median_s": median(float(r["optimizer_s"]) for r in s),
        "tokens_per_s": tokens_per_s,
        "samples_per_s": sum(float(r["samples"]) for r in s) / total if total else None,
        "mfu": mfu(flops_per_token, tokens_per_s, world_size, device_name),
        "timed_steps": len(s),
        "timing_note": None if s else (f"no timed step: all {len(rows)} steps are timing warm-up, profiled or "
                                       "right after a checkpoint save (train.timing_warmup_steps, max_steps)"),
    }
