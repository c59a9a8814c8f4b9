"""A run's step time by parts, before it runs: what one optimizer step asks of one device, at the rates the
machine's calibration measured (measure/calibrate.py), beside the memory model (memory_model.py).

Per device and optimizer step, with a micro-batches of N tokens each (the tokens of this rank's sequence shard),
L_r the layers of this rank (L / pp) and P_r the parameters it updates:

  gemm       every matmul of the blocks and the head, forward, input gradient and (trainable weights) weight
             gradient, each at the calibrated bf16 rate for its shape m x k x n (curve `matmul_bf16`, interpolated
             in log space); tensor parallelism divides the sharded widths by tp; checkpointing adds a forward; a
             matmul with a width not a multiple of ALIGN (an unpadded vocabulary: train.embedding_rows) at the
             calibrated share of that rate cuBLAS's fallback kernels reach (`matmul_bf16_unaligned`; UNALIGNED_SHARE
             where the calibration has no such row);
  attention  SDPA, forward + backward, at the calibrated rate for its mask, sequence and head dimension (curve
             `sdpa_bf16`), 4 s^2 h e FLOPs forward (half of it causal: language models; full: ViT), 2.5x that
             backward;
  memory     what the kernels outside the matmuls read and write (norms, activations, residuals, dropout, rotary,
             the loss's logits): MEMORY_BYTES[levers] x (d + f) bytes per token and layer (f: the MLP width a token
             passes through, a MoE layer's shared and top-k routed experts together), LOSS_BYTES[levers] x V
             per token for the loss, at the fitted machine's device copy bandwidth times how much faster this
             machine runs a block's norm, rotary, activation and residual kernels (`memory_block`, eager or
             compiled: memory_rate; where a calibration has no such row, at its own copy bandwidth, `hbm_copy`);
  optimizer  AdamW over the rank's P_r parameters: 28 bytes each (fp32 parameter, gradient, two moments read;
             parameter and moments written), 12 more where the gradients are clipped (their norm, their scaling)
             at `hbm_copy`; optimizer offload: the CPU's AdamW rate (`cpu_adam`)
             and the gradients and parameters over `d2h` / `h2d`;
  host       what the host issues per step: HOST_OPS[levers] per layer and micro-batch (kernel launches and Python,
             in units of the calibrated eager launch, `launch_us`; one constant for GPT-2, Qwen2 and ViT blocks), a
             MoE layer's in proportion to the kernels it issues against a dense layer of its family (counted on the
             real layer: plan.traced.layer_kernels; 1.52x for Qwen2-MoE), FIXED_OPS per micro-batch, the optimizer's
             launches (torch's fused AdamW: a few; DeepSpeed's ZeRO optimizers: DS_OPS_PER_TENSOR per parameter
             tensor, counted on the model built on the meta device), DDP's reducer over several ranks
             (DDP_OPS_PER_TENSOR per parameter tensor and step), the gather and reduce hooks a micro-batch:
             FSDP2's HOOK_OPS per layer (once where one unit holds the whole model: Strategy.hooks_per_block),
             DeepSpeed ZeRO-3's per parameter tensor (hook_ops; its eager and compiled-block hooks apart, the
             eager ones at the calibrated `zero3_tensor_us` and `zero3_module_us` per module where measured),
             again where a block's forward is recomputed from the host; eager tensor parallelism's DTensor
             dispatch, per parallel linear of a block at TP_BLOCK_SHARE times the calibrated pair's `tp_linear_us`
             (at the run's rank count: `tp_linear_us_ranks[n]`), and its clip over two meshes, TP_CLIP_PAIRS of
             that pair a layer and step; each micro-batch's samples readied on the host (gathered from the
             memory-mapped rows, widened to int64, pinned: plan.predict.host_copy_bytes) at the calibrated
             `host_memcpy` (an image micro-batch's 10-40 ms; a token block's nothing); all of it slower by the
             calibrated `host_beside` where several ranks share the node (launch_us measured on every rank at once,
             over one process's alone; none where the calibration has no such row);
  comm       the strategy's collectives at the calibrated bus bandwidth for their message size and rank count
             (`all_reduce_busbw`, `all_gather_busbw`, reduce-scatter at the all-gather's rate), minus what the
             engine overlaps with the backward (DDP's buckets, FSDP2's prefetch; DeepSpeed ZeRO-1/2 do not
             overlap by default, ZeRO-3 hides ZERO3_OVERLAP of its own, a trace's share) but for the compute-bound
             share of what it hides (the matmuls' and attention's share of the device's work: beside_compute):
             NCCL's kernels hold SMs while they run, which a matmul beside them loses and a memory-bound kernel,
             paced by HBM, hardly; tensor parallelism's activation all-reduces (2 per layer forward, 2 backward);
             pipeline stages add the bubble (pp - 1) / (a + pp - 1) of the step.

  step = || gemm + attention + memory + optimizer, host ||_OVERLAP + exposed comm + offload (+ the pipeline bubble)

The device and the host run concurrently (kernels are queued ahead), so the larger of the two sets the pace (the
p-norm is their max where one dominates, and more where they are close: the queue runs dry now and then); the named
term with the largest share is the run's bound. The constants in upper case describe the software (how many
bytes an eager block moves, how many launches it issues) and are fitted once on one-GPU sets (step_time_fit.json,
written by experiments.step_time.fit --fit), never on the sets the model is tested on; the rates are the machine's
(a calibration's, its host costs its GPU kind's rate file's: load_rates).

A term the run needs whose rate the calibration lacks (a collective over several ranks without its bus-bandwidth
curve, an offloaded step without `cpu_adam`, `d2h` or `h2d`, bytes to ready on the host without `host_memcpy`,
eager tensor parallelism without `tp_linear_us`, ZeRO-3's extra modules without `zero3_module_us`) is not given a
zero or a default rate: the prediction is not modelled (Prediction.missing, `why`: "<rates file> has no all_reduce
bus-bandwidth curve"), as a run whose kernels the calibration does not time is (not_modelled). A one-rank run needs no
collective. A rate file of plan/rates/ holds the collectives of its kind's machines of several GPUs where some were
calibrated (h200.json) and none where none were (h100.json): there a multi-GPU run predicted from the GPU kind alone
is not modelled (a study's own calibration of several GPUs, or a simulated network, plan/fabric.py, gives the
collectives their rate).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from workflow_scripts.measure.calibrate import UNALIGNED, ZERO3_STACK_MODULES_PER_TENSOR
from workflow_scripts.plan import memory_model as mm
from workflow_scripts.plan.bound import BUSBW
from workflow_scripts.run_spec import RunSpec
from workflow_scripts.training.precision import policy
from workflow_scripts.units import GB, MB, MIB

# The software's constants, fitted on one-GPU H100 rows (python -m experiments.step_time.fit --fit writes
# step_time_fit.json: the values, what they were fitted on and the error there): bytes per token, layer and
# (d + f) moved outside the matmuls, per lever set; bytes per token and vocabulary entry of the loss; launches per
# layer and micro-batch; launches per micro-batch; DeepSpeed's launches per parameter tensor; FSDP2's and ZeRO-3's
# hook launches per layer and micro-batch; the p-norm of device and host time.
FIT_FILE = Path(__file__).with_name("step_time_fit.json")
_FIT_RECORD = json.loads(FIT_FILE.read_text())
_FIT = _FIT_RECORD["constants"]
MEMORY_BYTES, LOSS_BYTES, HOST_OPS = _FIT["MEMORY_BYTES"], _FIT["LOSS_BYTES"], _FIT["HOST_OPS"]
FIXED_OPS, DS_OPS_PER_TENSOR, HOOK_OPS, OVERLAP = (_FIT["FIXED_OPS"], _FIT["DS_OPS_PER_TENSOR"], _FIT["HOOK_OPS"],
                                                   _FIT["OVERLAP"])
ADAMW_BYTES = 28  # per parameter: fp32 parameter, gradient, exp_avg, exp_avg_sq read; parameter and moments written
# and where the gradients are clipped: their norm reads each fp32 gradient, the scaling reads and writes it (traced
# optimizer kernels ran 1.4-1.65x the 28 bytes: experiments.step_time.fit's traced parts)
CLIP_BYTES = 12
# The share of DeepSpeed ZeRO-3's gathers and reduce-scatters that ran under compute in a trace (ViT-Huge, 2 x H200,
# NCCL kernels overlapped 7.6 % and 12.0 % on the two ranks);
# FSDP2's prefetch is taken to hide them behind the backward (no trace of it measured against that yet).
ZERO3_OVERLAP = 0.1
# A matmul whose width k or n is not a multiple of ALIGN elements (16 bytes of bf16) runs on cuBLAS's fallback kernels
# (sm75 tensor-op GEMMs on an H200): GPT-2-medium's unpadded 50,257-row head over 8 k tokens ran its forward and two
# gradients at 122-123 TFLOP/s in six traces on two H200 (20.6 ms a step), 0.18 of
# the rate its calibration's curve gives the same shapes padded (3.7 ms). The share where a calibration has no
# matmul_bf16_unaligned row (measure/calibrate.py measures it since then).
ALIGN = 8
UNALIGNED_SHARE = 0.18
# Eager tensor parallelism in a real block against the calibration's lone pair of split linears (calibrate.host_pair,
# `tp_linear_us_ranks[n]`), at the same rank count on the same machine: a Qwen2 block's DTensor dispatch per split
# linear (biases, the attention's reshapes of the split heads) ran 1.39 +- 0.27 pairs' (9 paired rounds: one H200 at
# one rank 1.79; a 2 x H100 machine 1.15 at one rank, 1.24 at two), and its clip over the DTensors of two meshes,
# beyond one mesh's, a layer and step, 1.05 +- 0.19 pairs at one rank and 1.51 +- 0.59 at two (experiments/
# tensor_parallel; two other 2 x H200 machines, unpaired: 1.35 and 1.59).
TP_BLOCK_SHARE = 1.39
TP_CLIP_PAIRS = {1: 1.05, 2: 1.51}
DDP_BUCKET = 25 * MIB  # bytes: DistributedDataParallel's default bucket_cap_mb (torch reads it in MiB)
# DistributedDataParallel's reducer on the host, per parameter tensor and step (its autograd hook, the gradient scaled
# into its bucket and copied back, the bucket's all-reduce call), in launches: over one rank it cost GPT-2-medium's
# compiled-blocks step 4.4 ms for its 292 tensors at a 6.8 us launch (one H200, 1.049 +- 0.023x in 3 rounds:
# experiments/step_overheads). The harness runs one rank unwrapped (strategies/_ddp_engine), several under DDP.
DDP_OPS_PER_TENSOR = 2.2
# FSDP2 with a bf16 param_dtype (bf16-pure's policy over fp32 shards) moves every parameter it gathers through casts
# and copies each micro-batch: the shard cast to bf16, the gathered copy-out, the gradient's copy-in, its cast back and
# accumulation. Bytes per gathered parameter and micro-batch: what the profiled MoE row's memory-bound kernels ran
# beyond the per-token memory term (one H100's trace: 114.2 ms traced against 59.4 modelled, 4
# micro-batches of 2.90 B parameters at the H100's 2,767 GB/s: 13.1). FSDP2 without a policy (fp32 parameters)
# copies without casting: no trace has measured it, so it has no such bytes here.
FSDP_CAST_BYTES = 13
# The machine the constants were fitted on, as the memory term needs it (the fit records it): its device copy's
# bandwidth ("hbm", GB/s) and how fast it ran each block's memory-bound kernels ("<block>,<levers>", GB/s: its kind's
# calibrations' memory_block rows, measure/calibrate.block_rows). Another machine moves the memory bytes at that copy
# bandwidth times its own block's pace over this one's (a block's pace is steady where a 1 GiB copy is not).
MEMORY_FITTED = _FIT_RECORD.get("memory_pace") or {}


# The calibration row each optional rate of Rates is read from: where a run's term needs one that the calibration
# lacks, the prediction is not modelled and names it (Rates.rate).
RATE_ROWS = {"h2d": "h2d", "d2h": "d2h", "cpu_adam_ms": "cpu_adam", "host_memcpy": "host_memcpy",
             "tp_linear_us": "tp_linear_us", "zero3_module_us": "zero3_module_us"}
REPO = Path(__file__).resolve().parents[2]


def shown(path) -> str:
    """A rates file's path as a prediction names it: from the repository's root where it lies inside it."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def lacking(missing: list | None, why: str) -> float:
    """NaN, the seconds of a term whose input the rates lack, with `why` added to `missing` (predict: the run is
    then not modelled and says why; never a zero or a default rate)."""
    if missing is not None and why not in missing:
        missing.append(why)
    return math.nan


@dataclass
class Rates:
    """What the machine does per second, from a calibration.json (measure/calibrate.py). The GEMM and SDPA curves
    and the copy bandwidth every calibration has (Rates.of refuses one without them); the rest a calibration may
    lack (a one-GPU calibration, as the rate files are, has no collectives): a term that needs one reads it through
    `rate` (a collective: `busbw`, None where absent), and the run's prediction is then not modelled, naming what
    `source` lacks."""

    matmul: tuple  # ((m, k, n, TFLOP/s), ...)
    sdpa: tuple  # ((causal, seq, head_dim, TFLOP/s), ...): both masks
    hbm: float  # GB/s read + written
    launch_us: float
    busbw: dict = field(default_factory=dict)  # (collective, ranks) -> [(bytes, GB/s)]
    h2d: float | None = None
    d2h: float | None = None
    cpu_adam_ms: float | None = None  # AdamW step over 10 M fp32 parameters on the host
    host_memcpy: float | None = None  # GB/s of a numpy copy on the host
    tp_linear_us: float | None = None  # a tensor-parallel linear's DTensor dispatch, forward + backward, on the host
    tp_linear_ranks: tuple = ()  # ((ranks, the same on a mesh of that many ranks of one node, us), ...)
    zero3_tensor_us: float | None = None  # DeepSpeed ZeRO-3's host time per parameter tensor and step, beyond torch's
    zero3_module_us: float | None = None  # and what each module adds to it (its hooks)
    zero3_tensor_ranks: tuple = ()  # ((ranks, zero3_tensor_us of an engine over that many ranks of one node), ...)
    matmul_unaligned: float | None = None  # TFLOP/s of calibrate.UNALIGNED's three matmuls (an odd output width)
    host_beside: tuple = ()  # ((ranks, the host's slowdown with that many ranks on the node), ...)
    memory_block: dict = field(default_factory=dict)  # "<block>,<levers>" -> GB/s of its memory-bound kernels
    device: str | None = None  # the GPU's name (its datasheet peak: MFU)
    source: str | None = None  # the file the rates were read from (what a not-modelled prediction names)

    def lacks(self, what: str) -> str:
        """Why a term is not modelled: `<the rates' file> has no <what>`."""
        return f"{self.source or 'the calibration'} has no {what}"

    def rate(self, name: str, missing: list | None) -> float:
        """The optional rate `name` (RATE_ROWS), or NaN where the calibration has no such row, its absence added to
        `missing` (lacking)."""
        value = getattr(self, name)
        return lacking(missing, self.lacks(f"{RATE_ROWS[name]} row")) if value is None else value

    @classmethod
    def load(cls, path, adjust=lambda calibration: calibration) -> Rates:
        """The rates of a calibration.json (`adjust`ed: load_rates); ValueError naming the file where it is missing
        or has no curves."""
        try:
            return cls.of(adjust(json.loads(Path(path).read_text())), source=shown(path))
        except OSError as exc:
            raise ValueError(f"{path}: {exc.strerror}") from None
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def of(cls, calibration: dict, source: str | None = None) -> Rates:
        rows = {r["name"]: r["value"] for r in calibration["rows"] if r["value"] is not None}
        curves = calibration.get("curves") or {}
        missing = [k for k in ("matmul_bf16", "sdpa_bf16") if not curves.get(k)]
        if missing or not any(k.startswith("hbm_copy[") for k in rows):
            raise ValueError(f"calibration has no {', '.join(missing or ['hbm_copy'])}: recalibrate "
                             "(measure/calibrate.py measures them)")
        masks = {p.get("causal") for p in curves["sdpa_bf16"]}
        if masks != {True, False}:
            raise ValueError("calibration's sdpa_bf16 curve has not both masks (`causal` true and false): recalibrate")
        busbw: dict = {}
        beside = tuple(sorted((int(k[len("host_beside["):-1]), v) for k, v in rows.items()
                              if k.startswith("host_beside[")))
        blocks = {k[len("memory_block["):-1]: v for k, v in rows.items() if k.startswith("memory_block[")}
        tp_ranks = tuple(sorted((int(k[len("tp_linear_us_ranks["):-1]), v) for k, v in rows.items()
                                if k.startswith("tp_linear_us_ranks[")))
        zero3_ranks = tuple(sorted((int(k[len("zero3_tensor_us_ranks["):-1]), v) for k, v in rows.items()
                                   if k.startswith("zero3_tensor_us_ranks[")))
        for name, value in rows.items():
            if m := BUSBW.fullmatch(name):
                busbw.setdefault((m[1], int(m[2])), []).append((float(m[3]) * MB, value))
        first = lambda prefix: next((v for k, v in sorted(rows.items()) if k.startswith(prefix)), None)  # noqa: E731
        return cls(matmul=tuple((p["m"], p["k"], p["n"], p["tflops"]) for p in curves["matmul_bf16"]),
                   sdpa=tuple((p["causal"], p["seq"], p["head_dim"], p["tflops"]) for p in curves["sdpa_bf16"]),
                   hbm=first("hbm_copy["), launch_us=first("launch_us["),
                   busbw={k: tuple(sorted(v)) for k, v in busbw.items()},
                   h2d=first("h2d["), d2h=first("d2h["), cpu_adam_ms=rows.get("cpu_adam"),
                   host_memcpy=rows.get("host_memcpy"),
                   tp_linear_us=rows.get("tp_linear_us"), tp_linear_ranks=tp_ranks,
                   zero3_tensor_us=rows.get("zero3_tensor_us"),
                   zero3_module_us=rows.get("zero3_module_us"), zero3_tensor_ranks=zero3_ranks,
                   matmul_unaligned=rows.get("matmul_bf16_unaligned"),
                   host_beside=beside, memory_block=blocks,
                   device=next((r["detail"] for r in calibration["rows"] if r["name"].startswith("matmul_bf16[")),
                               None), source=source)


def machine_gpu(calibration: dict) -> str | None:
    """The GPU name a calibration was measured on."""
    gpus = ((calibration.get("machine") or {}).get("gpu") or {}).get("gpus") or [{}]
    return gpus[0].get("name")


def host_row(name: str) -> bool:
    """Whether a calibration row is a host cost (the launch cost per GPU, the tensor-parallel linear's dispatch at
    one rank and at n, ZeRO-3's per-tensor work at one rank and at n and its per-module work, the host's copies)."""
    return (name.startswith(("launch_us[", "tp_linear_us_ranks[", "zero3_tensor_us_ranks["))
            or name in ("tp_linear_us", "zero3_tensor_us", "zero3_module_us", "host_memcpy"))


def kind_row(name: str) -> bool:
    """Whether a calibration row is taken from the GPU kind's rate file (the median over the kind's calibrated
    machines): the host costs, and how fast the kind's block kernels run (memory_block)."""
    return host_row(name) or name.startswith("memory_block[")


def machine_row(name: str) -> bool:
    """Whether a calibration row describes the machine rather than its GPU kind: its host's slowdown beside the
    node's other ranks (host_beside: a machine's own, never a kind's median), its collectives. A set's own
    calibration overrides its kind's file with these. Its host costs do not: one machine's launch loop and hooks,
    measured once, did not order the kind's machines by their steps (the same run on other machines of its kind,
    experiments.step_time.fit's twins: moved by the machines' own host costs 12.8 % from what they measured, 8.5 %
    apart as they were), so they count once among the kind's (its rate file's medians)."""
    return name.startswith("host_beside[") or "_busbw[" in name


RATES = Path(__file__).with_name("rates")  # the GPU kinds' rate files: <kind>.json


def kind_rates(gpu: str | None, rates: Path = RATES) -> dict | None:
    """The rate file (rates/<kind>.json, written by experiments.step_time.rates) of the GPU kind named `gpu`, or
    None where no file is of that GPU."""
    for path in sorted(Path(rates).glob("*.json")):
        record = json.loads(path.read_text())
        if gpu and machine_gpu(record) == gpu:
            return record
    return None


def rates_file(name: str, rates: Path = RATES) -> Path:
    """The calibration a plan names: a GPU kind (`h100`: rates/h100.json) or a calibration.json's path."""
    kind = Path(rates) / f"{name}.json"
    return kind if "/" not in str(name) and kind.exists() else Path(name)


def with_medians(calibration: dict, medians: dict) -> dict:
    """A calibration with `medians` (row name -> value) for its rows of those names, and the rest of them added."""
    rows = [{**r, "value": medians.get(r["name"], r["value"])} for r in calibration["rows"]]
    have = {r["name"] for r in rows}
    return {**calibration, "rows": rows + [{"name": k, "value": v, "detail": "the kind's median",
                                            "unit": "GB/s" if k.startswith("memory_block[") or "_busbw[" in k
                                            else "us"}
                                           for k, v in sorted(medians.items()) if k not in have]}


def load_rates(path, rates: Path = RATES) -> Rates:
    """A calibration's rates (Rates.load), its host costs and block-kernel paces (kind_row) those of its GPU kind's
    rate file (kind_rates: the median over the kind's calibrated machines), its other rows (curves, copies,
    collectives, host_beside) its own. A calibration of a GPU with no rate file keeps every row of its own; so does a
    CPU calibration. Reads nothing but `path` and the rate files."""
    def adjust(calibration: dict) -> dict:
        kind = kind_rates(machine_gpu(calibration), rates)
        if kind is None:
            return calibration
        return with_medians(calibration, {r["name"]: r["value"] for r in kind["rows"]
                                          if kind_row(r["name"]) and r["value"] is not None})

    return Rates.load(path, adjust)


def at_ranks(points: tuple, ranks: int) -> float:
    """The value of ((rank count, value), ...) measured at the rank count nearest `ranks` (the larger of two as
    near)."""
    return min(points, key=lambda p: (abs(p[0] - ranks), -p[0]))[1]


@lru_cache(maxsize=65536)
def interpolate(points: tuple, at: tuple) -> float:
    """The value at `at` of a grid of points (coordinates..., value), linear in the logs of coordinates and value
    along each axis in turn (clamped at the grid's edges)."""
    if len(at) == 0:
        return points[0][-1]
    axis = sorted({p[0] for p in points})
    x = min(max(at[0], axis[0]), axis[-1])
    hi = next(v for v in axis if v >= x)
    lo = max(v for v in axis if v <= x)
    below = interpolate(tuple(p[1:] for p in points if p[0] == lo), at[1:])
    if hi == lo:
        return below
    above = interpolate(tuple(p[1:] for p in points if p[0] == hi), at[1:])
    w = (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return math.exp((1 - w) * math.log(below) + w * math.log(above))


def busbw(rates: Rates, kind: str, ranks: int, message: float) -> float | None:
    """GB/s of a collective over `ranks` for one message (bytes): the curve for that rank count, else the
    nearest rank count measured (a stated assumption in the prediction's notes); None where the rates have no curve
    of that collective at any rank count (Collectives: the run is not modelled)."""
    curves = {r: v for (k, r), v in rates.busbw.items() if k == kind}
    if not curves:
        return None
    nearest = min(curves, key=lambda r: (abs(r - ranks), -r))
    return interpolate(tuple(curves[nearest]), (message,))


@dataclass
class Run:
    """What the step-time model needs of a run (from its run spec, or from a plan's candidate)."""

    shape: mm.Shape
    family: str  # strategy family: ddp | deepspeed | fsdp
    zero_stage: int
    strategy: str
    micro_batch: int
    accum: int
    tokens: int  # tokens of one sample through every layer (sequence; a ViT's patches + 1)
    layout: dict  # the dimensions of more than one rank (dp, pp, cp, tp, ep); a 1-GPU run: {}
    levers: str  # eager | blocks | model | graphs
    compile_loss: bool
    checkpointing: bool
    trainable: int
    tensors: int  # parameter tensors (DeepSpeed's optimizer launches per tensor)
    modules: int = 0  # modules, with parameters or without (DeepSpeed ZeRO-3 hooks each)
    kernel_ratio: float = 1.0  # a layer's kernels against a dense layer of its family's (plan.predict.kernel_ratio)
    host_copy_bytes: float = 0.0  # per sample: what the host copies to hand it to the device (plan.predict)
    grad_clip: bool = False  # the gradients clipped to a norm (train.grad_clip > 0): the norm and the scaling
    offload_optimizer: bool = False
    precision: str = "bf16-mixed"
    deterministic: bool = False
    grad_bytes: int = 4  # bytes of one communicated gradient (fp32; bf16 under bf16-pure)
    bucket: float = DDP_BUCKET
    # checkpointing per op (attention kept, the ops outside the matmuls recomputed) or per block, and the share of
    # the forward's matmuls the backward runs again: 1 per block; torchtitan's per-op policy 0.5 (every other
    # one); ours 0 (training/recompute.py)
    selective: bool = False
    matmuls_recomputed: float = 1.0
    hooks_per_block: bool = True  # FSDP2 / ZeRO-3's gather and reduce hooks per block (else once: one FSDP2 unit)
    deepcompile: bool = False  # DeepSpeed's compiler backend (strategy_options.<zero*>.compile.deepcompile)
    traced_ds_linear: bool = False  # ZeRO-3 blocks compiled around DeepSpeed's linear (_deepspeed.traced_ds_linear)


@dataclass
class Prediction:
    """A run's predicted step, or (`missing` not empty) none: a term of the run needs an input the rates lack, and
    `why` names it; step_s and bound are None then, and that term's part NaN."""

    step_s: float | None
    parts: dict  # name -> seconds
    bound: str | None  # the part with the largest share
    notes: list = field(default_factory=list)
    missing: list = field(default_factory=list)  # what the rates lack that a term of the run needs

    @property
    def modelled(self) -> bool:
        return not self.missing

    @property
    def why(self) -> str:
        """Why there is no step (`<rates file> has no all_reduce bus-bandwidth curve`), or ''."""
        return "; ".join(self.missing)

    def tokens_per_s(self, tokens_per_step: float) -> float | None:
        return None if self.step_s is None else tokens_per_step / self.step_s


def degree(run: Run, key: str) -> int:
    return int(run.layout.get(key, 1) or 1)


def gemms(s: mm.Shape, tokens: int, tp: int) -> list[tuple[int, int, int, int]]:
    """(m, k, n, count) of one layer's forward matmuls on one rank for `tokens` tokens, and the head's (count
    negative: once, not per layer). Tensor parallelism splits q/k/v, gate/up by columns and o/down by rows."""
    d, f, kv = s.d, s.ffn, s.kv
    if s.family == "gpt2" or s.vision:
        layer = [(tokens, d, 3 * d // tp, 1), (tokens, d // tp, d, 1), (tokens, d, f // tp, 1), (tokens, f // tp, d, 1)]
    else:
        layer = [(tokens, d, (d + 2 * kv) // tp, 1), (tokens, d // tp, d, 1)]
        if s.experts:
            routed = max(1, tokens * s.top_k // s.experts)
            layer += [(tokens, d, s.experts, 1), (routed, d, 2 * s.expert_ffn, s.experts),
                      (routed, s.expert_ffn, d, s.experts)]
            if s.shared_ffn:
                layer += [(tokens, d, 2 * s.shared_ffn, 1), (tokens, s.shared_ffn, d, 1)]
        else:
            layer += [(tokens, d, 2 * f // tp, 1), (tokens, f // tp, d, 1)]
    head_tokens = tokens // s.loss_tokens if s.vision else tokens
    return layer + [(head_tokens, d, s.vocab, -1)]


def unaligned_share(rates: Rates) -> float:
    """The share of the calibrated (aligned) rate a matmul with an odd width reaches: the calibration's
    matmul_bf16_unaligned against the curve's rate for the same three matmuls, or UNALIGNED_SHARE."""
    if rates.matmul_unaligned is None:
        return UNALIGNED_SHARE
    m, k, n = UNALIGNED
    aligned_s = sum(1.0 / interpolate(rates.matmul, shape) for shape in ((m, k, n), (m, n, k), (k, m, n)))
    return rates.matmul_unaligned * aligned_s / 3.0


def width_share(rates: Rates, k: int, n: int) -> float:
    """The share of the calibrated rate a matmul of widths k -> n reaches: 1, or unaligned_share where k or n (the
    operands' and the output's leading dimensions, in the forward and both gradients; the token count m is none) is
    not a multiple of ALIGN."""
    return 1.0 if k % ALIGN == n % ALIGN == 0 else unaligned_share(rates)


def gemm_seconds(run: Run, rates: Rates, tokens: int) -> float:
    """One micro-batch's matmuls, forward and backward (and the checkpointed forward again) on this rank."""
    layers = run.shape.n_layer / degree(run, "pp")
    trains_weights = run.trainable > 0.5 * run.shape.n_params  # LoRA: the frozen base computes no weight gradient
    total = 0.0
    for m, k, n, count in gemms(run.shape, tokens, degree(run, "tp")):
        times = layers * count if count > 0 else 1.0 / degree(run, "pp")
        flops = 2.0 * m * k * n / width_share(rates, k, n)  # what the aligned rate does in the same time
        forward = flops / (interpolate(rates.matmul, (m, k, n)) * 1e12)
        grad_input = flops / (interpolate(rates.matmul, (m, n, k)) * 1e12)
        grad_weight = flops / (interpolate(rates.matmul, (k, m, n)) * 1e12) if trains_weights else 0.0
        again = forward * run.matmuls_recomputed if run.checkpointing and count > 0 else 0.0
        total += times * (forward + grad_input + grad_weight + again)
    return total


def attention_seconds(run: Run, rates: Rates, samples: int) -> float:
    """One micro-batch's SDPA, forward and backward: causal for a language model (half the score matrix), full for
    a ViT's patches, at the calibrated rate of that mask."""
    s = run.shape
    causal = not s.vision
    heads = s.d // s.head_dim // degree(run, "tp")
    seq = run.tokens
    flops = 3.5 * 4 * samples * heads * seq * seq * s.head_dim / (2 if causal else 1) / degree(run, "cp")
    if run.checkpointing and not run.selective:
        flops *= 4.5 / 3.5
    curve = tuple(p[1:] for p in rates.sdpa if p[0] == causal)
    return s.n_layer / degree(run, "pp") * flops / (interpolate(curve, (seq, s.head_dim)) * 1e12)


def memory_block(run: Run) -> str:
    """The calibrated block (measure/block_kernels.BLOCKS) whose kernels stand for the run's memory-bound work, and
    how they run: LayerNorm + GELU (GPT-2, ViT) or RMSNorm, rotary and SiLU-gated (Qwen2, Llama, MoE); eager or
    compiled."""
    block = "layernorm_gelu" if run.shape.family == "gpt2" or run.shape.vision else "rmsnorm_rotary_silu"
    return f"{block},{'eager' if run.levers == 'eager' else 'compiled'}"


def memory_rate(run: Run, rates: Rates) -> float:
    """GB/s the memory term's bytes move at: the fitted machine's device copy bandwidth times the run's block's pace
    on this machine over the fitted machine's (MEMORY_FITTED); this machine's own copy bandwidth where either has no
    such block."""
    key = memory_block(run)
    mine, fitted = rates.memory_block.get(key), MEMORY_FITTED.get(key)
    return MEMORY_FITTED["hbm"] * mine / fitted if mine and fitted else rates.hbm


def memory_seconds(run: Run, rates: Rates, tokens: int) -> float:
    s = run.shape
    layer = MEMORY_BYTES["eager" if run.levers == "eager" else "blocks" if run.levers == "blocks" else "model"]
    per_token = layer * (s.d + s.active_ffn) / degree(run, "tp") * s.n_layer / degree(run, "pp")
    if run.checkpointing:
        per_token *= 1.5
    loss = LOSS_BYTES["compiled" if run.compile_loss else "eager"] * s.vocab / degree(run, "pp")
    if s.vision:
        loss /= s.loss_tokens
    return (tokens * (per_token + loss) + fsdp_cast_bytes(run)) / (memory_rate(run, rates) * GB)


def fsdp_cast_bytes(run: Run) -> float:
    """FSDP2's casts and copies of the parameters it gathers, a micro-batch (FSDP_CAST_BYTES): under a bf16
    param_dtype only. Gathered: the rank's pipeline stage and tensor shard, a MoE's routed experts split over ep."""
    if run.family != "fsdp" or not policy(run.precision).bf16_params:
        return 0.0
    s = run.shape
    gathered = (run.trainable - s.expert_params * (1 - 1 / degree(run, "ep"))) / (degree(run, "pp") * degree(run, "tp"))
    return FSDP_CAST_BYTES * gathered


def local_params(run: Run) -> float:
    """The parameters this rank updates: its pipeline stage and tensor shard, sharded over dp by ZeRO-1+ / FSDP."""
    p = run.trainable / (degree(run, "pp") * degree(run, "tp"))
    dp = max(1, degree(run, "dp") * degree(run, "cp"))
    return p / dp if run.zero_stage >= 1 else p


def optimizer_seconds(run: Run, rates: Rates, missing: list | None = None) -> tuple[float, float]:
    """(device seconds, offload seconds) of one AdamW step on this rank; offloaded, at the calibrated `cpu_adam`,
    `d2h` and `h2d` (NaN where the calibration lacks one, named in `missing`)."""
    p = local_params(run)
    if not run.offload_optimizer:
        return p * (ADAMW_BYTES + (CLIP_BYTES if run.grad_clip else 0)) / (rates.hbm * GB), 0.0
    host = rates.rate("cpu_adam_ms", missing) / 1e3 * p / 1e7
    copies = (p * run.grad_bytes / (rates.rate("d2h", missing) * GB)
              + p * 2 / (rates.rate("h2d", missing) * GB))
    return 0.0, host + copies


def sharding(run: Run) -> str | None:
    """The per-layer hooks that gather and release parameters (HOOK_OPS' key): fsdp; zero3, DeepSpeed's on every
    submodule; zero3_blocks, on each compiled block, a ZeRO-3 leaf module (one gather and one reduce a block:
    strategies/_deepspeed_engine.zero3_compile_blocks); or none."""
    if run.family == "fsdp":
        return "fsdp"
    if run.family == "deepspeed" and run.zero_stage == 3:
        return "zero3_blocks" if run.levers == "blocks" else "zero3"
    return None


def hook_ops(run: Run, layers: float, rates: Rates, missing: list | None = None) -> float:
    """Host launch-equivalents of a micro-batch's parameter hooks: FSDP2's per unit (each layer, or once where one
    unit holds the model), DeepSpeed ZeRO-3's per parameter tensor of the stage (its gather, release and
    gradient-reduce walk every tensor in Python, as a host profile of ViT-Huge showed); eager
    ZeRO-3's at the calibrated `zero3_tensor_us` where the calibration has it (a one-rank engine's forward, backward
    and step of a bare stack of linears: the step's share counted with every micro-batch), and `zero3_module_us` for
    each module beyond that stack's share of modules a tensor (ZeRO-3 hooks every module; the calibrations before
    that row priced tensors only: where the run has such modules and the calibration no such row, NaN, named in
    `missing`), else the fitted launches."""
    key = sharding(run)
    if key is None:
        return 0.0
    if key == "fsdp":
        return HOOK_OPS[key] * (layers if run.hooks_per_block else 1.0)
    if key == "zero3" and rates.zero3_tensor_us is not None:
        extra_modules = max(0.0, run.modules - run.tensors * ZERO3_STACK_MODULES_PER_TENSOR)
        module_us = rates.rate("zero3_module_us", missing) if extra_modules > 0 else 0.0
        # a module costs nothing less than nothing (a noisy calibration can measure the difference below zero)
        module_us = module_us if math.isnan(module_us) else max(0.0, module_us)
        us = zero3_tensor_us(run, rates) * run.tensors + module_us * extra_modules
        return us / rates.launch_us / degree(run, "pp")
    return HOOK_OPS[key] * run.tensors / degree(run, "pp") * zero3_ranks_share(run, rates)


def zero3_tensor_us(run: Run, rates: Rates) -> float:
    """ZeRO-3's calibrated host time per parameter tensor: of an engine over the run's data-parallel ranks where the
    calibration measured one at that count (`zero3_tensor_us_ranks[n]`, the nearest n: its gathers and
    reduce-scatters the ranks wait on together), else of a one-rank engine (`zero3_tensor_us`)."""
    ranks = degree(run, "dp") * degree(run, "cp")
    if ranks > 1 and rates.zero3_tensor_ranks:
        return at_ranks(rates.zero3_tensor_ranks, ranks)
    return rates.zero3_tensor_us


def zero3_ranks_share(run: Run, rates: Rates) -> float:
    """How much more ZeRO-3's hooks cost the host over the run's ranks than on one (zero3_tensor_us over the
    one-rank measure; 1 where either is missing): the compiled leaf blocks' fitted hooks (fitted at one rank) scaled
    by it."""
    if not rates.zero3_tensor_us or not rates.zero3_tensor_ranks:
        return 1.0
    return max(1.0, zero3_tensor_us(run, rates) / rates.zero3_tensor_us)


def replayed_forward(run: Run) -> float:
    """How many more host launches a block's recomputation issues, as a share of its forward's: a checkpoint
    around an eager block or around a compiled one (transformers checkpoints the block as a whole) runs its forward
    again from the host (+50 % of the block's launches); selective checkpointing inside a compiled block is part of
    the compiled backward (training/recompute.py): none."""
    if not run.checkpointing or run.selective and run.levers != "eager":
        return 0.0
    return 0.5


def tp_pair_us(run: Run, rates: Rates) -> float | None:
    """The calibrated DTensor dispatch of a lone split pair, µs a linear, forward + backward: on a mesh of the run's
    tp ranks where the calibration measured one (`tp_linear_us_ranks[n]`, the nearest n: the all-reduces the ranks wait
    on together cost two H200 ranks 1.35x one rank's dispatch), else on one rank
    (`tp_linear_us`); None where the calibration has neither."""
    if rates.tp_linear_ranks:
        return at_ranks(rates.tp_linear_ranks, degree(run, "tp"))
    return rates.tp_linear_us


def dtensor_seconds(run: Run, rates: Rates, layers: float, missing: list | None = None) -> float:
    """A micro-batch's DTensor dispatch on the host: eager tensor parallelism runs each parallel linear of a block
    (parallel/tensor.py's BLOCK_PLAN) through DTensor's Python, forward and backward, at TP_BLOCK_SHARE times the
    calibrated lone pair's cost per linear (tp_pair_us; NaN where the calibration has none, named in `missing`).
    Compiled blocks trace it away."""
    from workflow_scripts.training.parallel.tensor import BLOCK_PLAN

    if degree(run, "tp") == 1 or run.levers != "eager":
        return 0.0
    pair = tp_pair_us(run, rates)
    if pair is None:
        return lacking(missing, rates.lacks("tp_linear_us row"))
    return len(BLOCK_PLAN) * layers * pair * TP_BLOCK_SHARE * 1e-6


def tp_clip_seconds(run: Run, rates: Rates, layers: float, missing: list | None = None) -> float:
    """A step's clip over the DTensors of two meshes (training/grad_norm.clip_, eager whatever the levers): beyond
    one mesh's, TP_CLIP_PAIRS (at the nearest rank count measured) of the calibrated pair's cost per layer (NaN
    where the calibration has no pair, named in `missing`)."""
    tp = degree(run, "tp")
    if tp == 1 or not run.grad_clip:
        return 0.0
    pair = tp_pair_us(run, rates)
    if pair is None:
        return lacking(missing, rates.lacks("tp_linear_us row"))
    pairs = at_ranks(tuple(TP_CLIP_PAIRS.items()), tp)
    return layers * pair * pairs * 1e-6


def world(run: Run) -> int:
    return math.prod(degree(run, d) for d in ("dp", "tp", "pp", "cp"))


def node_ranks(run: Run, fabric=None) -> int:
    """The run's ranks on one node: all of them on the calibrated machine; on a simulated network, a node's GPUs."""
    return min(world(run), fabric.gpus_per_node) if fabric is not None else world(run)


def beside(rates: Rates, ranks: int) -> float:
    """How much slower a rank's host work runs with `ranks` ranks on its node: the calibration's host_beside at the
    nearest rank count it measured (1 for one rank, and where it measured none; never below 1)."""
    if ranks <= 1 or not rates.host_beside:
        return 1.0
    return max(1.0, at_ranks(rates.host_beside, ranks))


def host_seconds(run: Run, rates: Rates, missing: list | None = None) -> float:
    """The host's seconds a step (NaN where a calibrated cost it needs is missing, named in `missing`)."""
    layers = run.shape.n_layer / degree(run, "pp")
    # a recomputed block's forward is launched again and gathers its parameters again (the pre-forward hooks)
    blocks = HOST_OPS[run.levers] * run.kernel_ratio * layers + hook_ops(run, layers, rates, missing)
    per_micro = blocks * (1.0 + replayed_forward(run)) + FIXED_OPS
    optimizer = DS_OPS_PER_TENSOR * run.tensors if run.family == "deepspeed" and run.zero_stage in (1, 2) else 10.0
    reducer = DDP_OPS_PER_TENSOR * run.tensors if run.family == "ddp" and world(run) > 1 else 0.0  # once a step
    launches = (run.accum * per_micro + optimizer + reducer) * rates.launch_us * 1e-6
    return (launches + run.accum * (dtensor_seconds(run, rates, layers, missing) + input_seconds(run, rates, missing))
            + tp_clip_seconds(run, rates, layers, missing))


def input_seconds(run: Run, rates: Rates, missing: list | None = None) -> float:
    """A micro-batch's samples made ready on the host (gathered, widened, pinned: run.host_copy_bytes a sample) at
    the calibrated `host_memcpy`; NaN where there are bytes to copy and the calibration has no such row (named in
    `missing`)."""
    nbytes = run.micro_batch * run.host_copy_bytes
    return nbytes / (rates.rate("host_memcpy", missing) * GB) if nbytes > 0 else 0.0


COLLECTIVE_RATE = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "all_gather",
                   "all_to_all": "all_gather", "send": "all_gather"}  # the calibrated curve each is timed at
MOVED = {"all_reduce": lambda r: 2 * (r - 1) / r, "all_gather": lambda r: (r - 1) / r,
         "reduce_scatter": lambda r: (r - 1) / r, "all_to_all": lambda r: (r - 1) / r,
         "send": lambda r: 1.0}  # bytes one rank moves per byte of its buffer


class Collectives:
    """Seconds of one rank's collectives over a group of the layout's dimensions: at the calibrated bus bandwidth
    (the nearest rank count measured, on one node), or on a simulated network (plan/fabric.py). A collective over
    several ranks whose curve the rates lack (no rank count of it measured) is NaN, named in `missing`."""

    def __init__(self, run: Run, rates: Rates, fabric=None, missing: list | None = None):
        self.run, self.rates, self.fabric, self.notes = run, rates, fabric, []
        self.missing = [] if missing is None else missing

    def ranks(self, dims: tuple) -> int:
        return math.prod(degree(self.run, d) for d in dims)

    def seconds(self, kind: str, nbytes: float, message: float, dims: tuple, ranks: int | None = None) -> float:
        ranks = ranks or self.ranks(dims)
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        rate = COLLECTIVE_RATE[kind]
        if self.fabric is None:
            bw = busbw(self.rates, rate, ranks, message)
            if bw is None:
                return lacking(self.missing, self.rates.lacks(f"{rate} bus-bandwidth curve"))
            if (rate, ranks) not in self.rates.busbw:
                self.note(f"no {ranks}-rank {rate} bus bandwidth calibrated: the nearest rank count's")
        else:
            exact = self.rates.busbw.get((rate, ranks))
            bw = self.fabric.busbw(ranks, self.fabric.ranks_per_node(self.run.layout, dims, ranks), message,
                                   interpolate(exact, (message,)) if exact else None)
        if kind != rate:
            self.note(f"{kind} at the {rate} bus bandwidth")
        return nbytes * MOVED[kind](ranks) / (bw * GB)

    def note(self, text: str):
        if text not in self.notes:
            self.notes.append(text)


def beside_compute(t: float, exposed: float, compute_share: float) -> float:
    """What `t` seconds of collectives cost a step of which `exposed` run after the compute: the rest runs beside
    the backward and takes `compute_share` of its own time from it (the compute-bound share of the device's work:
    NCCL's kernels hold SMs). Measured on GPT-2-medium's step at two H200 under DDP (experiments/step_overheads):
    25 MB buckets overlapped with the backward
    cost the step as much as one bucket all-reduced after it (ddp_one_bucket / ddp 1.009 and 0.988 ± 0.033
    compiled, 1.012 eager), 4-7 ms over one rank's wrapper, where hiding them would cost nothing."""
    return exposed + (t - exposed) * compute_share


def compute_share(parts: dict) -> float:
    """The compute-bound share (matmuls, attention) of the device's work of the forward and backward."""
    compute = parts["gemm"] + parts["attention"]
    return compute / (compute + parts["memory"]) if compute + parts["memory"] > 0 else 0.0


def comm_seconds(run: Run, rates: Rates, backward_s: float, fabric=None,
                 compute: float = 0.0, missing: list | None = None) -> tuple[float, list]:
    """The exposed seconds of the strategy's and the layout's collectives, and notes on what was assumed; `compute`
    the compute-bound share of the device's work (compute_share: what a hidden collective costs it). NaN where a
    collective's curve is missing from the rates (named in `missing`)."""
    c = Collectives(run, rates, fabric, missing)
    dp_dims = ("dp", "cp")
    s, layers = run.shape, run.shape.n_layer / degree(run, "pp")
    p = run.trainable / (degree(run, "pp") * degree(run, "tp"))
    grads, total = p * run.grad_bytes, 0.0
    if c.ranks(dp_dims) > 1:
        if run.family == "ddp":  # buckets all-reduced as the backward of the last micro-batch produces them
            t = c.seconds("all_reduce", grads, run.bucket, dp_dims)
            total += beside_compute(t, max(t - backward_s / run.accum, t * min(1.0, run.bucket / max(grads, 1.0))),
                                    compute)
        elif run.zero_stage == 0:
            total += c.seconds("all_reduce", grads, 5e8, dp_dims)
        elif run.zero_stage in (1, 2):  # reduce-scatter of gradients, all-gather of parameters
            total += c.seconds("reduce_scatter", grads, 5e8, dp_dims) + c.seconds("all_gather", p * 2, 5e8, dp_dims)
        else:  # ZeRO-3 / FSDP: parameters gathered forward and backward, gradients reduce-scattered; FSDP2 prefetches
            layer = p / max(1, s.n_layer)
            t = (c.seconds("all_gather", 2 * p * 2, layer * 2, dp_dims)
                 + c.seconds("reduce_scatter", grads, layer * run.grad_bytes, dp_dims))
            exposed = max(t - backward_s * 1.5, t / max(1, s.n_layer))
            total += beside_compute(t, t * (1 - ZERO3_OVERLAP) if run.family == "deepspeed" else exposed, compute)
    tokens = run.micro_batch * run.tokens / degree(run, "cp")  # of one micro-batch on this rank
    if degree(run, "tp") > 1:  # two all-reduces of the activations per layer forward, two backward
        act = tokens * s.d * 2
        total += run.accum * 4 * layers * c.seconds("all_reduce", act, act, ("tp",))
    if degree(run, "cp") > 1:  # Ulysses: q, k, v and the output all-to-all'd forward, their gradients backward
        qkvo = tokens * (2 * s.d + 2 * s.kv) * 2 / degree(run, "tp")
        total += run.accum * 2 * layers * c.seconds("all_to_all", qkvo, qkvo / degree(run, "cp"), ("cp",))
    if degree(run, "ep") > 1:  # tokens dispatched to their experts and combined back, forward and backward
        routed = tokens * max(1, s.top_k) * s.d * 2
        total += run.accum * 4 * layers * c.seconds("all_to_all", routed, routed / degree(run, "ep"), dp_dims,
                                                    ranks=degree(run, "ep"))
    if degree(run, "pp") > 1:  # one stage's activations and their gradient to the next stage, per micro-batch
        act = tokens * s.d * 2
        total += run.accum * 2 * c.seconds("send", act, act, ("pp",), ranks=2)
    return total, c.notes


def not_modelled(run: Run) -> str | None:
    """Why the model has no prediction for a run (its rates are bf16 ones; deterministic kernels are others)."""
    if run.precision == "fp32":
        return "fp32: no fp32 matmul rate is calibrated"
    if run.deterministic:
        return "deterministic algorithms: other kernels than the calibrated ones"
    if run.deepcompile:
        return "DeepCompile: DeepSpeed's compiler backend (its reductions inside the graph) has no term"
    if run.traced_ds_linear:
        return "ZeRO-3 blocks compiled around DeepSpeed's linear (8 compiled, the rest eager): no lever set"
    return None


DEVICE_PARTS = ("gemm", "attention", "memory", "optimizer")  # the device's work; a device-bound step's bound is one


def predict(run: Run, rates: Rates, fabric=None) -> Prediction:
    """The step of `run` on the machine of `rates` (and, simulated, on the network `fabric`: plan/fabric.py); not
    modelled (step_s None, `why` naming it) where a term the run needs has no input in the rates."""
    missing: list = []
    tokens = run.micro_batch * run.tokens // degree(run, "cp")
    per_micro = {"gemm": gemm_seconds(run, rates, tokens), "attention": attention_seconds(run, rates, run.micro_batch),
                 "memory": memory_seconds(run, rates, tokens)}
    parts = {k: v * run.accum for k, v in per_micro.items()}
    parts["optimizer"], offload = optimizer_seconds(run, rates, missing)
    parts["host"] = host_seconds(run, rates, missing) * beside(rates, node_ranks(run, fabric))
    backward = (parts["gemm"] + parts["attention"]) * 2 / 3
    parts["comm"], notes = comm_seconds(run, rates, backward, fabric, compute_share(parts), missing)
    if missing:
        return Prediction(None, {**parts, "offload": offload}, None, notes, missing)
    device = sum(parts[k] for k in DEVICE_PARTS)
    step = (device ** OVERLAP + parts["host"] ** OVERLAP) ** (1 / OVERLAP) + parts["comm"] + offload
    pp = degree(run, "pp")
    if pp > 1:
        parts["bubble"] = step * (pp - 1) / (run.accum + pp - 1)
        step += parts["bubble"]
    parts["offload"] = offload
    shares = {"device": device, "host": parts["host"], "comm": parts["comm"], "offload": offload,
              "bubble": parts.get("bubble", 0.0)}
    bound = max(shares, key=shares.get)
    if bound == "device":
        bound = max(DEVICE_PARTS, key=parts.get)
    return Prediction(step, parts, bound, notes)


def run_for(*, model: str, strategy: str, precision: str, layout: dict, micro_batch: int, accum: int, seq_len: int,
            vocab: int, train: dict, options: dict | None = None, overrides: dict | None = None,
            n_params: int | None = None, trainable: int | None = None, applied: dict | None = None) -> Run:
    """The step-time model's view of a run from its settings (a plan's candidate, or a run's spec and summary):
    `train` its resolved train settings, `applied` the levers it recorded having applied (strategy_settings.json)."""
    import json

    from workflow_scripts.plan.predict import (
        count_modules,
        count_params,
        count_tensors,
        engine_choices,
        host_copy_bytes,
        kernel_ratio,
        recorded_wrap_blocks,
        shape,
        tokens_per_sample,
    )
    from workflow_scripts.training import recompute
    from workflow_scripts.training.levers import lever_set
    from workflow_scripts.training.models import MODELS
    from workflow_scripts.training.strategies import STRATEGIES
    from workflow_scripts.training.strategies._deepspeed import asks_deepcompile, traced_ds_linear

    tokens = tokens_per_sample(model, overrides, seq_len)
    built = (model, json.dumps(overrides or {}, sort_keys=True), vocab, seq_len,
             json.dumps(train.get("lora") or MODELS[model].lora))
    if n_params is None or trainable is None:
        counted = count_params(*built)
        n_params, trainable = n_params or counted[0], trainable if trainable is not None else counted[1]
    s = shape(model, overrides, n_params, vocab, tokens if MODELS[model].vision else 1)
    engine = STRATEGIES[strategy]
    levers, loss = lever_set(train, (applied or {}).get("harness"))
    options = options or {}
    choices = engine_choices(strategy, options, layout)
    per_block = recorded_wrap_blocks(applied)
    recomputes = recompute.mode(train)
    per_block = choices.hooks_per_block if per_block is None else per_block
    return Run(shape=s, family=engine.family, zero_stage=engine.zero_stage, strategy=strategy,
               micro_batch=int(micro_batch), accum=int(accum), tokens=tokens,
               layout={k: int(v) for k, v in layout.items() if int(v) > 1}, levers=levers, compile_loss=loss,
               checkpointing=recomputes is not None, selective=recomputes == "selective",
               matmuls_recomputed=recompute.MATMULS_RECOMPUTED.get(recomputes, 1.0),
               trainable=int(trainable),
               tensors=count_tensors(*built), modules=count_modules(*built), kernel_ratio=kernel_ratio(*built[:2]),
               host_copy_bytes=host_copy_bytes(model, seq_len, vocab),
               offload_optimizer=choices.offload_optimizer, hooks_per_block=per_block,
               precision=precision,
               deterministic=bool(train["deterministic"]), grad_bytes=policy(precision).module_bytes,
               grad_clip=bool(train["grad_clip"]),
               deepcompile=asks_deepcompile(options), traced_ds_linear=traced_ds_linear(applied, MODELS[model].family),
               bucket=float(((applied or {}).get("ddp") or options).get("bucket_cap_mb", DDP_BUCKET / MIB)) * MIB)


def run_of(spec: RunSpec, summary: dict, settings: dict | None = None) -> Run:
    """The step-time model's view of a run, from its run spec and summary.json (and strategy_settings.json: the
    levers and DDP buckets it applied)."""
    return run_for(model=spec.model, strategy=spec.strategy, precision=spec.precision, layout=spec.layout,
                   micro_batch=summary["micro_batch"], accum=summary["grad_accum"], seq_len=int(summary["seq_len"]),
                   vocab=int(summary["vocab_size"]), train=spec.train, options=spec.options,
                   overrides=spec.model_overrides, n_params=int(summary["n_params"]),
                   trainable=summary.get("trainable_params"), applied=settings)


def run_at(run_dir: Path) -> Run:
    """The step-time model's view of the run in `run_dir`, from the files it wrote (columns: RUN_SPEC, SUMMARY,
    SETTINGS where the run got as far as its engine)."""
    from workflow_scripts import columns as C

    run_dir = Path(run_dir)
    settings = run_dir / C.SETTINGS
    return run_of(RunSpec.committed(run_dir / C.RUN_SPEC), json.loads((run_dir / C.SUMMARY).read_text()),
                  json.loads(settings.read_text()) if settings.exists() else None)
