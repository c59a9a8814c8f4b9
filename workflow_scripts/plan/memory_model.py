"""Analytic prediction of a run's peak torch-allocated memory per GPU (`max_memory_allocated`), by parts:

    parameters, optimizer states  per rank, sharded as the strategy shards them, minus what it offloads;
    engine buffers   DDP's gradient buckets; DeepSpeed's fp32 partition copy and ZeRO-3's gradient-partition buffer
                     (engine_bytes says which, and why);
    gradients        only where micro-batches accumulate them (no gradient is alive at the start of backward
                     otherwise: the loop frees them after every step);
    weight casts     under bf16-mixed autocast, the bf16 copy of every weight each matmul saves for backward;
    activations      what autograd saves per token and layer, counted op by op for the family's eager
                     transformers code (activation_bytes_per_token_layer); with gradient checkpointing the layer
                     inputs plus one layer recomputed (selective: the layer inputs and the matmul and attention
                     outputs, selective_bytes);
    loss             the logits chain at its backward peak (loss_bytes_per_token).

The peak is taken at the start of backward (all activations alive, the loss chain at its largest), which is where
the committed GPU runs peak for the strategies that keep their states on the GPU. Per rank, in bytes; N = tokens of
one micro-batch on the rank. Covered: GPT-2, dense Qwen2, Qwen2-MoE and ViT, fp32 / bf16-mixed / bf16-pure, gradient
checkpointing, LoRA, the data-parallel strategies (DDP and variants, ZeRO-0..3 and offloads, ZeRO++, FSDP2) at any
data-parallel size, and the pipeline, tensor, context and expert dimensions (predict); the device-wide peak from the
allocated one (device_peak). Compiled blocks or loss: the eager count as an upper bound (predict; inductor decides
what is saved).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from workflow_scripts.measure.metrics import partitioned
from workflow_scripts.training.layout import MODEL_PARALLEL, Layout
from workflow_scripts.training.precision import policy
from workflow_scripts.units import GIB


@dataclass(frozen=True)
class Shape:
    family: str
    n_params: int
    n_layer: int
    d: int  # hidden size
    ffn: int  # MLP inner size
    kv: int  # key/value width (kv heads x head dim)
    head_dim: int
    vocab: int  # embedding rows (padded); an image classifier's (padded) classes
    tied: bool = True  # LM head = input embedding
    loss_tokens: int = 1  # tokens per row of logits: 1 for a language model, the image's tokens for a ViT
    experts: int = 0  # MoE: routed experts per layer, top-k per token, an expert's and the shared expert's MLP size
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    vision: bool = False  # an image classifier's blocks (ModelSpec.vision): full attention, a head per image
    moe: bool = False  # routed experts in its blocks (ModelSpec.moe)

    @property
    def active_ffn(self) -> int:
        """The MLP inner width one token passes through: the MLP's; a MoE layer's shared expert and its top-k
        routed experts'."""
        return self.shared_ffn + self.top_k * self.expert_ffn if self.experts else self.ffn

    @property
    def expert_params(self) -> float:
        """Parameters of the routed experts (gate, up and down per expert, every layer): what ep shards."""
        return 3.0 * self.n_layer * self.experts * self.d * self.expert_ffn


def activation_bytes_per_token_layer(s: Shape, precision: str) -> float:
    """Bytes autograd keeps per token for one transformer block, eager transformers code, counted op by op (CUDA
    autocast op lists; d hidden, f MLP inner size, kv key/value width, e head dim). Checked against the traced count
    (traced.py) in tests/test_memory_plan.py.

    GPT-2 (LayerNorm, fused qkv, SDPA, gelu_new written out in torch ops):
      fp32: LayerNorm inputs and outputs 2 x (4d + 4d), qkv 12d, SDPA output 4d (also c_proj's input: flash
        writes it in (batch, seq, head) order), MLP input 4f to gelu_new's pow, tanh's output, 1 + tanh, 0.5 x
        (4 x 4f), c_proj's input 4f                                ->  32d + 20f
      bf16-mixed: residual stream fp32; LayerNorm inputs 2 x 4d, bf16 casts of the c_attn / c_fc inputs 2 x 2d,
        qkv 6d, SDPA output 2d; gelu_new: `pow` is an fp32 op under CUDA autocast, so the fp32 copy of its input
        (4f), tanh's output (4f), 1 + tanh (4f), 0.5 x (2f) and the bf16 cast of the product for c_proj (2f)
                                                                   ->  20d + 16f
      bf16-pure: the fp32 case in 2 bytes                          ->  16d + 10f
    Qwen2 (RMSNorm with an fp32 upcast, separate projections, RoPE, SDPA with GQA, SiLU MLP). RoPE's products save
    cos and sin (8e fp32, 4e bf16), not q and k.
      fp32: per norm the input, the normalised and the weighted output (3 x 4d, twice), q and SDPA output 8d,
        k and v 8kv, gate, up, SiLU output and product 16f        ->  32d + 8kv + 16f + 8e
      bf16-mixed: per norm input and normalised output (2 x 4d, twice), one bf16 cast per projection input (q, k,
        v: 6d; gate, up: 4d), q and SDPA output cast to bf16 4d, k and v 4kv, MLP in bf16 8f
                                                                   ->  30d + 4kv + 8f + 8e
      bf16-pure: per norm the fp32 upcast 4d, normalised 2d, weighted 2d (twice), q and output 4d, k and v 4kv,
        MLP 8f                                                     ->  20d + 4kv + 8f + 4e
    Qwen2-MoE (Qwen1.5-MoE, transformers' default grouped_mm experts): attention and norms as Qwen2, the MLP
    replaced by the router, k routed experts and a gated shared expert. Per (token, expert) pair in bf16: the
    token's row permuted to its expert and the expert's output (2 x 2d), gate/up output, SiLU output and product
    (4 x 2f_e), three int64 indices; per token the fp32 router softmax (4E), the shared expert's MLP (8f_s, as
    Qwen2's) and its gated output 2d. bf16-pure:
        20d + 4kv + 4e + k (4d + 8f_e + 24) + 4E + 8f_s + 2d        (the traced count of a real layer: within 0.1 %)
      fp32: the bf16-pure count in 4 bytes with the norms' fp32 copies as Qwen2's fp32; bf16-mixed: Qwen2's
      bf16-mixed attention part with the bf16-pure MoE MLP plus the router's input cast (2d) -- no GPU run checks
      those two yet.
    """
    d, f, kv, e = s.d, s.ffn, s.kv, s.head_dim
    if s.moe:
        moe = s.top_k * (4 * d + 8 * s.expert_ffn + 24) + 4 * s.experts + 8 * s.shared_ffn + 2 * d
        return {"bf16-pure": 20 * d + 4 * kv + 4 * e + moe,
                "fp32": 32 * d + 8 * kv + 8 * e + 2 * moe,
                "bf16-mixed": 26 * d + 4 * kv + 8 * e + moe + 2 * d}[precision]
    if s.family == "gpt2":
        return {"bf16-mixed": 20 * d + 16 * f, "fp32": 32 * d + 20 * f, "bf16-pure": 16 * d + 10 * f}[precision]
    if s.vision:  # ViT layer: LayerNorm, separate q/k/v, SDPA, GELU (one op: saves its input)
        # fp32: LN inputs 2 x 4d, LN outputs 2 x 4d (q/k/v share theirs), q, k, v 12d, SDPA output 4d, fc1 output
        # and GELU output 8f; bf16-mixed: LN inputs 8d, a bf16 cast per projection input (q, k, v, fc1: 8d),
        # q, k, v, output 8d, fc1 and GELU outputs 4f; bf16-pure: the fp32 case in 2 bytes
        return {"bf16-mixed": 24 * d + 4 * f, "fp32": 32 * d + 8 * f, "bf16-pure": 16 * d + 4 * f}[precision]
    if s.family == "qwen2":
        return {"bf16-mixed": 30 * d + 4 * kv + 8 * f + 8 * e,
                "fp32": 32 * d + 8 * kv + 16 * f + 8 * e,
                "bf16-pure": 20 * d + 4 * kv + 8 * f + 4 * e}[precision]
    raise ValueError(f"no activation model for family {s.family!r}")


def checkpoint_input_bytes(s: Shape, precision: str) -> float:
    """Per token and layer with gradient checkpointing: the block's input (the residual stream)."""
    return policy(precision).module_bytes * s.d


def selective_bytes(s: Shape, precision: str) -> float:
    """Per token and layer under selective checkpointing (training/recompute.py): the block's input and what its
    policy keeps, the outputs of the matmuls and of attention in the compute dtype, and attention's fp32
    log-sum-exp per head. GPT-2 and ViT: q, k, v 3d, attention output d, its projection d, fc f, fc's projection d
    (6d + f); Qwen2: q d, k and v 2kv, attention output d, o d, gate and up 2f, down d (4d + 2kv + 2f)."""
    kept = 4 * s.d + 2 * s.kv + 2 * s.ffn if s.family == "qwen2" else 6 * s.d + s.ffn
    return checkpoint_input_bytes(s, precision) + (4 if precision == "fp32" else 2) * kept + 4 * s.d / s.head_dim


def loss_bytes_per_token(s: Shape, precision: str) -> float:
    """The logits chain at the loss's backward peak, per token: logits in the compute dtype, their fp32 copy's
    log-softmax output (saved), its gradient and the gradient of the fp32 logits (4 + 4 + 4 bytes), the bf16 logits
    (2 bytes) alive until the loss returns."""
    return s.vocab * (12 if precision == "fp32" else 14) / s.loss_tokens


def state_bytes(family: str, precision: str) -> tuple[int, int, int]:
    """Bytes per parameter of (parameters, gradients, optimizer states) as the engine family keeps them
    (training.precision: the policy's own rule)."""
    return policy(precision).engine_state_bytes(family)


FAMILIES = ("gpt2", "qwen2", "qwen2_moe", "vit")  # the families whose saved tensors are counted
REDUCE_BUCKET = 5e8  # DeepSpeed's default reduce_bucket_size (elements)


def engine_bytes(family: str, zero_stage: int, p: float, dp: int, precision: str, offload_optimizer: bool,
                 reduce_bucket: float = REDUCE_BUCKET, ddp_wrapped: bool = True, gathered_kept: bool = False) -> float:
    """What the strategy's engine holds beyond parameters and optimizer states at the start of backward (bytes);
    `p` = parameters on the rank before data-parallel sharding.
    - DDP: its gradient buckets, a flat copy of every gradient (in the gradients' dtype); they stay allocated
      between steps also when the gradients are views into them (gradient_as_bucket_view only saves the separate
      .grad tensors). DDP rebuilds its buckets after the first step (measured: a transient second copy, at a
      moment of low memory, so not the peak). None when the model is not wrapped (`ddp_wrapped`: one rank,
      training/strategies/_ddp_engine.py; runs made before that change were wrapped at one rank too).
    - DeepSpeed with fp32 parameters (fp32, bf16-mixed): the optimizer's fp32 partition is a clone of the fp32
      parameters, 4p/dp more (under bf16-pure that master copy is already in the optimizer states); with the
      optimizer offloaded it lives on the host. ZeRO-3 adds its flat gradient-partition buffer (gradient dtype;
      on the host with offload) and its reduce (IPG) bucket, `reduce_bucket_size` elements in the parameters' dtype,
      allocated on the GPU at start-up whatever the offload (DeepSpeed 0.19 stage3.py).
      Stage 2's gradient partition is not alive at the start of backward (measured: ZeRO-2 peaks as ZeRO-1).
    - FSDP2: nothing beyond the shards at that point when it reshards each block after its forward; when the whole
      model's gathered parameters are alive there (`gathered_kept`: strategies.fsdp.keeps_gathered_params: no
      resharding, or one unit over the whole model, both fsdp's default in a one-rank run), p in the dtype it
      computes in (bf16 under bf16-pure, its MixedPrecisionPolicy; else fp32): measured +0.66 GiB for GPT-2-medium
      under bf16-pure on one H100."""
    if family == "ddp":
        return state_bytes(family, precision)[1] * p if ddp_wrapped else 0.0
    if family == "fsdp":
        return float(policy(precision).module_bytes) * p if gathered_kept else 0.0
    if family != "deepspeed":
        return 0.0
    module = policy(precision).module_bytes
    out = 4.0 * p / dp if zero_stage >= 1 and module == 4 and not offload_optimizer else 0.0
    if zero_stage == 3:
        out += float(module) * (reduce_bucket + (0.0 if offload_optimizer else p / dp))
    return out


CONTEXT_BYTES = 1.8 * GIB  # one process's CUDA context, cuBLAS workspaces and torch's own (torch 2.11, CUDA 13)
COMMUNICATOR_BYTES = 0.45 * GIB  # one NCCL communicator's buffers on a rank
ALLOCATOR_SLACK = 0.17  # the caching allocator's reserve beyond its allocated peak


def device_peak(allocated: float, family: str, world_size: int, layout: dict | None = None) -> float:
    """The device-wide peak (what NVML / amdsmi see) from the predicted torch-allocated peak:

        allocated x (1 + slack) + context + communicators x per-communicator buffers

    The constants are read off the committed runs, so this part is a calibration, not a derivation: device-wide
    minus torch-reserved is 1.77 GiB for a one-GPU torch run on H100 (1.90 on H200), plus 0.3-0.5 GiB for each
    NCCL communicator (the data-parallel group when there is more than one rank, one per pp / tp / cp / ep
    dimension, DeepSpeed's own even on one GPU); reserved over allocated is 1.02-1.63 (median 1.17: fragmentation,
    highest with offload, whose pinned transfers the allocator cannot pack). The slack is what this misses most."""
    layout = layout or {}
    dims = sum(int(layout.get(k, 1)) > 1 for k in MODEL_PARALLEL)
    comms = (world_size > 1) + (family == "deepspeed") + dims
    return allocated * (1 + ALLOCATOR_SLACK) + CONTEXT_BYTES + comms * COMMUNICATOR_BYTES


@dataclass
class Prediction:
    modelled: bool
    why: str = ""
    parts: dict | None = None
    method: str = "analytic"

    device: float | None = None  # the device-wide peak (device_peak), bytes
    bound: str = ""  # "upper": a compiled run, bounded from above by the eager count (predict)

    @property
    def total(self) -> float | None:
        return None if not self.parts else sum(self.parts.values())


def tp_split(s: Shape, precision: str) -> tuple[float, float]:
    """(replicated, sharded) bytes per token and layer under tensor parallelism (parallel/tensor.py: q/k/v and
    gate/up column-parallel, o/down row-parallel, norms and residual replicated, every column-parallel projection
    casting its full input): the sharded part is divided by tp. Qwen2 only (GPT-2 is refused for tp)."""
    d, f, kv = s.d, s.ffn, s.kv
    sharded = {"bf16-mixed": 4 * d + 4 * kv + 8 * f, "fp32": 8 * d + 8 * kv + 16 * f,
               "bf16-pure": 4 * d + 4 * kv + 8 * f}[precision]
    return activation_bytes_per_token_layer(s, precision) - sharded, sharded


def predict(*, compiled: bool = False, **run) -> Prediction:
    """The peak of the fullest rank (eager_peak's arguments). A compiled run (blocks or loss) gets the eager count
    as an upper bound (Prediction.bound): inductor's partitioner saves for backward a subset of what eager autograd
    saves, fused into fewer buffers, and the compiled loss drops the fp32 logits copy; how far below it lands
    depends on its choices (GPT-2-medium mb16: 22.7 GiB compiled against 46.8 eager)."""
    p = eager_peak(**run)
    if not compiled or not p.modelled:
        return p
    if run["family"] == "deepspeed" and run["checkpointing"]:
        # measured: ZeRO-1/2 with compiled blocks and checkpointing passed the eager count by 1.9 GiB (5.7 %) on one
        # H200; the bound is claimed only where no measured run passed it
        return Prediction(False, "compiled blocks with checkpointing under DeepSpeed: the eager count is no upper "
                                 "bound there (a measured run passed it by 5.7 %)")
    return replace(p, bound="upper", why="compiled: the eager count, an upper bound (inductor saves less)")


def eager_peak(*, shape: Shape, family: str, zero_stage: int, precision: str, dp: int,
               micro_batch: int, seq_len: int, grad_accum: int, checkpointing: bool | str | None,
               layout: dict | None = None,
               offload_optimizer: bool = False, offload_params: bool = False,
               traced_per_layer: float | None = None, reduce_bucket: float = REDUCE_BUCKET,
               trainable: float | None = None, input_bytes: float = 0.0, ddp_wrapped: bool | None = None,
               gathered_kept: bool = False) -> Prediction:
    """The peak of the fullest rank (Prediction.parts in bytes; total = the predicted max_memory_allocated).
    `dp`: the ranks the data-parallel strategy shards over (dp x cp). `traced_per_layer`: a decoder layer's saved
    bytes per token counted by torch (traced.py), its bf16 weight casts included, in place of the hand count.
    `trainable`: parameters that train (LoRA: the adapters and the head), default all; only they have gradients,
    optimizer states and gradient buckets. `input_bytes`: the micro-batch as the model receives it (token ids; for
    an image row its int64 copy, the pixels, their normalised copy and its cast: 10 bytes per pixel value).
    `ddp_wrapped`: whether a DDP-family model is wrapped (its gradient buckets); default: on more than one rank.
    `gathered_kept`: whether FSDP2 keeps the gathered parameters from forward to backward (engine_bytes).

    Layouts: tp divides the block parameters and the sharded part of the activations (tp_split); cp divides the
    tokens of every rank (Ulysses: each rank keeps 1/cp of the sequence); pp gives stage s the blocks L/pp, the
    embedding (first stage), the LM head and the loss (last stage), and min(M, pp - s) micro-batches in flight under
    1F1B (torch's warm-up), each with its own activations and weight casts. The fullest stage is the prediction."""
    layout = layout or {}
    if shape.family not in FAMILIES:
        return Prediction(False, f"the {shape.family} family is not modelled yet")
    degrees = Layout(**{k: int(v) for k, v in layout.items()})
    pp, tp, cp, ep = degrees.pp, degrees.tp, degrees.cp, degrees.ep
    if checkpointing == "selective" and (shape.moe or tp > 1):
        return Prediction(False, "selective checkpointing is modelled for dense blocks without tp only")
    embed = shape.vocab * shape.d if shape.loss_tokens == 1 else 0.0  # a ViT's head is small: in the blocks
    blocks = shape.n_params - embed * (1 if shape.tied else 2)
    if ep > 1 and family != "fsdp":  # ep shards the experts (FSDP2 already shards them over the same ranks)
        blocks -= shape.expert_params * (1 - 1 / ep)
    replicated, sharded = (tp_split(shape, precision) if tp > 1
                           else (activation_bytes_per_token_layer(shape, precision), 0.0))
    act_layer = replicated + sharded / tp
    if traced_per_layer is not None:  # torch's count, scaled by the same tp split
        act_layer = traced_per_layer * act_layer / (replicated + sharded)
    world = dp * pp * tp
    stages = [stage_parts(shape, family, zero_stage, precision, dp, micro_batch * seq_len / cp, grad_accum,
                          checkpointing, s, pp, tp, embed, blocks, act_layer, offload_optimizer, offload_params,
                          traced=traced_per_layer is not None, reduce_bucket=reduce_bucket,
                          train_frac=(trainable or shape.n_params) / shape.n_params,
                          ddp_wrapped=world > 1 if ddp_wrapped is None else ddp_wrapped,
                          gathered_kept=gathered_kept) for s in range(pp)]
    for stage in stages:
        stage["input batch"] = input_bytes
    parts = max(stages, key=lambda x: sum(x.values()))
    return Prediction(True, "", parts, "traced" if traced_per_layer is not None else "analytic",
                      device_peak(sum(parts.values()), family, world, layout))


def stage_parts(shape: Shape, family: str, zero_stage: int, precision: str, dp: int, n: float, accum: int,
                checkpointing: bool | str | None, stage: int, pp: int, tp: int, embed: float, blocks: float,
                act_layer: float,
                offload_optimizer: bool, offload_params: bool, traced: bool, reduce_bucket: float,
                train_frac: float = 1.0, ddp_wrapped: bool = True, gathered_kept: bool = False) -> dict:
    """One pipeline stage's parts (the whole model when pp = 1)."""
    first, last = stage == 0, stage == pp - 1
    layers = shape.n_layer / pp
    head = embed if last and not (shape.tied and pp == 1) else 0.0
    p = blocks / pp / tp + (embed if first else 0.0) + head
    param_b, grad_b, opt_b = (b * p for b in state_bytes(family, precision))
    opt_b *= train_frac
    in_flight = min(accum, pp - stage) if pp > 1 else 1
    if checkpointing:  # "full" keeps each block's input, "selective" also its matmul outputs
        kept = selective_bytes if checkpointing == "selective" else checkpoint_input_bytes
        activations = in_flight * n * layers * kept(shape, precision) + n * act_layer
    else:
        activations = in_flight * n * layers * act_layer
    casts = 0.0
    if precision == "bf16-mixed":  # every micro-batch in flight saved its own bf16 copies
        layer_weights = blocks / shape.n_layer / tp
        cast_layers = 0.0 if traced else (1 if checkpointing else in_flight * layers)
        casts = 2.0 * (layer_weights * cast_layers + (embed if last else 0.0))
    grads = 0.0
    if accum > 1:  # gradients of earlier micro-batches stay until the optimizer step: unsharded for DDP and for
        # FSDP2, which skips the reduce-scatter (set_requires_gradient_sync(False)) until the last micro-batch
        grads = grad_b * train_frac / (dp if family == "deepspeed" and partitioned("gradients", zero_stage) else 1)
    return {
        "parameters": 0.0 if offload_params else param_b / (dp if partitioned("parameters", zero_stage) else 1),
        "optimizer states": 0.0 if offload_optimizer else opt_b / (dp if partitioned("optimizer states", zero_stage)
                                                                    else 1),
        "engine buffers": engine_bytes(family, zero_stage, p * train_frac, dp, precision, offload_optimizer,
                                       reduce_bucket, ddp_wrapped, gathered_kept),
        "gradients (accumulating)": grads,
        "weight casts": casts,
        "activations": activations,
        "loss": n * loss_bytes_per_token(shape, precision) if last else 0.0,
    }
