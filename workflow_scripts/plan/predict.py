"""A run's predicted peak memory per GPU, from what the run is (its spec and summary) or from a plan's settings:
the analytic model (memory_model.py) with its activations counted by hand, or traced (traced.py: the same model
with one real decoder layer's saved tensors counted by torch). Used by the parse stage (a `predicted_peak_bytes`
column), the benchmark (experiments/memory) and the planner (plan/planner.py).
"""
from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace
from typing import NamedTuple

from workflow_scripts.plan import memory_model as mm
from workflow_scripts.run_spec import RunSpec
from workflow_scripts.training import recompute
from workflow_scripts.training.layout import Layout
from workflow_scripts.training.models import MODELS, image_size, model_spec


def shape(model: str, overrides: dict | None, n_params: int, vocab: int, loss_tokens: int = 1) -> mm.Shape:
    spec = model_spec(model, overrides)
    s = spec.shape
    d = s.get("n_embd", s.get("hidden_size"))
    heads = s.get("n_head", s.get("num_attention_heads"))
    kv_heads = s.get("num_key_value_heads", heads)
    ffn = s.get("n_inner") or s.get("intermediate_size") or 4 * d
    return mm.Shape(spec.family, int(n_params), s.get("n_layer", s.get("num_hidden_layers")), d, ffn,
                    kv_heads * d // heads, d // heads, int(vocab), bool(s.get("tie_word_embeddings", True)),
                    loss_tokens, int(s.get("num_experts", 0) or 0), int(s.get("num_experts_per_tok", 0) or 0),
                    int(s.get("moe_intermediate_size", 0) or 0), int(s.get("shared_expert_intermediate_size", 0) or 0),
                    vision=spec.vision, moe=spec.moe)


def tokens_per_sample(model: str, overrides: dict | None, seq_len: int) -> int:
    """Tokens one sample puts through every layer: the block for a language model; a ViT's patches + 1 for an
    image row (seq_len = 1 + 3 x size x size, data/images.py)."""
    if not MODELS[model].vision:
        return seq_len
    return model_spec(model, overrides).patches(image_size(seq_len)) + 1


def sample_bytes(model: str, seq_len: int) -> float:
    """One sample as the model receives it: int64 token ids; an image row's int64 copy plus, per pixel value, the
    pixels scaled to [0, 1], normalised and cast for the patch convolution (4 + 4 + 2 bytes: training/vision.py)."""
    return 8.0 * seq_len + (10.0 * (seq_len - 1) if MODELS[model].vision else 0.0)


def host_copy_bytes(model: str, seq_len: int, vocab: int) -> float:
    """Bytes the host copies to hand one sample to the device (training/batches.Batches.micro_batches), in the units
    of calibrate's host_memcpy (a copy of n bytes reads n and writes n): its stored row gathered from the
    memory-mapped blocks (uint8 pixels, or the token ids' stored width s: data.tokenize), widened to int64 (s read,
    8 written: (s + 8) / 2) and copied into pinned memory (8): s + (s + 8) / 2 + 8 a value. An image row of 150,529
    values is 2.0 MB (a ViT-Base micro-batch of 64: 130 MB, 19 ms at a host's 6.9 GB/s; one H100 host readied it in
    25-27 ms, 0.87-0.99x what its own copy predicted), a block of 1,024 tokens
    15 kB."""
    import numpy as np

    from workflow_scripts.data.images import ROW_DTYPE
    from workflow_scripts.data.tokenize import token_dtype
    from workflow_scripts.training.batches import BATCH_DTYPE

    stored = np.dtype(ROW_DTYPE if MODELS[model].vision else token_dtype(vocab)).itemsize
    wide = np.dtype(BATCH_DTYPE).itemsize
    return seq_len * (stored + (stored + wide) / 2 + wide)


@lru_cache(maxsize=64)
def meta_model(model: str, overrides_json: str, vocab: int, seq_len: int, lora_json: str = "null"):
    """The run's model built on the meta device (no memory, seconds), with its LoRA adapters."""
    import json

    import torch

    from workflow_scripts.training.models import build_model, with_lora

    with torch.device("meta"):
        m = build_model(model, vocab, seq_len, overrides=json.loads(overrides_json))
        lora = json.loads(lora_json)
        return with_lora(m, lora) if lora else m


def count_params(model: str, overrides_json: str, vocab: int, seq_len: int, lora_json: str = "null") -> tuple[int, int]:
    """(parameters, trainable parameters) of the run's model."""
    from workflow_scripts.training.models import count_params as total
    from workflow_scripts.training.models import count_trainable

    m = meta_model(model, overrides_json, vocab, seq_len, lora_json)
    return total(m), count_trainable(m)


def count_tensors(model: str, overrides_json: str, vocab: int, seq_len: int, lora_json: str = "null") -> int:
    """Trainable parameter tensors of the run's model (tied ones once): what DeepSpeed's per-tensor work walks (its
    ZeRO-1/2 optimizer step, ZeRO-3's gather, release and gradient-reduce hooks)."""
    m = meta_model(model, overrides_json, vocab, seq_len, lora_json)
    return sum(p.requires_grad for p in {id(p): p for p in m.parameters()}.values())


def count_modules(model: str, overrides_json: str, vocab: int, seq_len: int, lora_json: str = "null") -> int:
    """Modules of the run's model, the root, the containers and those without parameters included: DeepSpeed
    ZeRO-3 hooks every one."""
    return sum(1 for _ in meta_model(model, overrides_json, vocab, seq_len, lora_json).modules())


@lru_cache(maxsize=64)
def kernel_ratio(model: str, overrides_json: str) -> float:
    """The kernels one layer of the run's model issues against a dense layer of its family (plan.traced: 1 for a
    dense family, 1.52 for Qwen2-MoE)."""
    import json

    from workflow_scripts.plan.traced import REFERENCE_MODEL, layer_kernels

    return layer_kernels(model, json.loads(overrides_json)) / layer_kernels(REFERENCE_MODEL[MODELS[model].family])


@lru_cache(maxsize=64)
def _traced(model: str, overrides_json: str, precision: str, micro_batch: int, seq_len: int) -> float:
    import json

    from workflow_scripts.plan.traced import layer_saved_bytes

    return layer_saved_bytes(model, precision, micro_batch, seq_len, json.loads(overrides_json))["per_token"]


class EngineChoices(NamedTuple):
    offload_optimizer: bool
    offload_params: bool
    keeps_gathered: bool  # the gathered parameters kept from forward to backward
    hooks_per_block: bool  # a sharding engine's gathers and reductions block by block (else once per step)


def engine_choices(strategy: str, options: dict | None, layout: dict | None, world_size: int = 1) -> EngineChoices:
    """What the strategy's engine decides from its options and layout (`world_size` ranks of data parallelism where
    there is no layout), by the strategy's own rules."""
    from workflow_scripts.training.strategies import STRATEGIES

    s = STRATEGIES[strategy]
    ctx = SimpleNamespace(options=options or {}, layout=Layout.from_dict(layout, world_size))
    return EngineChoices(bool(s.offload_optimizer(ctx)), bool(s.offload_params(ctx)),
                         bool(s.keeps_gathered_params(ctx)), bool(s.hooks_per_block(ctx)))


def predict(*, model: str, strategy: str, precision: str, world_size: int, micro_batch: int, seq_len: int,
            grad_accum: int, vocab: int, n_params: int | None = None, overrides: dict | None = None,
            layout: dict | None = None, options: dict | None = None, checkpointing: str | None = None,
            compiled: bool = False, method: str = "analytic", trainable: int | None = None,
            lora: dict | None = None, ddp_wrapped: bool | None = None,
            gathered_kept: bool | None = None) -> mm.Prediction:
    """The predicted peak of one rank for these settings (`method`: analytic | traced; `ddp_wrapped`,
    `gathered_kept`: see memory_model.eager_peak; by default what the engine would decide, engine_choices)."""
    import json

    from workflow_scripts.training.strategies import STRATEGIES

    layout = layout or {}
    key = json.dumps(overrides or {}, sort_keys=True)
    if MODELS[model].family not in mm.FAMILIES:
        return mm.Prediction(False, f"family {MODELS[model].family} not modelled yet")
    if n_params is None:
        n_params, trainable = count_params(model, key, vocab, seq_len, json.dumps(lora or MODELS[model].lora))
    tokens = tokens_per_sample(model, overrides, seq_len)
    strat = STRATEGIES[strategy]
    precision = strat.engine_precision(precision, options or {})  # e.g. ZeRO++ runs DeepSpeed's bf16 mode
    s = shape(model, overrides, n_params, vocab, tokens if MODELS[model].vision else 1)
    dp = Layout.from_dict(layout, world_size).shard_ranks
    off_opt, off_par, kept, _ = engine_choices(strategy, options, layout, world_size)
    per_layer = None
    if method == "traced":
        from workflow_scripts.plan.traced import cannot_trace

        if why := cannot_trace(model, precision):
            return mm.Prediction(False, f"traced: {why}")
        per_layer = _traced(model, key, precision, micro_batch, tokens // layout.get("cp", 1))
    return mm.predict(shape=s, family=strat.family, zero_stage=strat.zero_stage,
                      precision=precision, dp=dp, micro_batch=micro_batch, seq_len=tokens, grad_accum=grad_accum,
                      checkpointing=checkpointing, layout=layout, compiled=compiled, offload_optimizer=off_opt,
                      offload_params=off_par, traced_per_layer=per_layer,
                      reduce_bucket=float((options or {}).get("reduce_bucket_size", mm.REDUCE_BUCKET)),
                      trainable=trainable, input_bytes=micro_batch * sample_bytes(model, seq_len),
                      ddp_wrapped=ddp_wrapped, gathered_kept=kept if gathered_kept is None else gathered_kept)


def predict_run(spec: RunSpec, summary: dict, method: str = "analytic", settings: dict | None = None) -> mm.Prediction:
    """From a run's run_spec.json and summary.json (ok runs: the summary has the model's size), and its
    strategy_settings.json where there is one (the engine it recorded: whether DDP wrapped the model, whether FSDP2
    kept its gathered parameters)."""
    from workflow_scripts.training.levers import compiles

    t = spec.train
    return predict(model=spec.model, strategy=spec.strategy, precision=spec.precision,
                   world_size=spec.world_size, micro_batch=int(summary["micro_batch"]),
                   seq_len=int(summary["seq_len"]), grad_accum=int(summary["grad_accum"]),
                   vocab=int(summary["vocab_size"]), n_params=int(summary["n_params"]),
                   overrides=spec.model_overrides, layout=spec.layout, options=spec.options,
                   checkpointing=recompute.mode(t),
                   compiled=compiles(t, MODELS[spec.model].family, spec.layout), method=method,
                   trainable=summary.get("trainable_params"),
                   ddp_wrapped=str((settings or {}).get("engine", "")).startswith("torch.nn.parallel.Distributed")
                   if settings and "engine" in settings else None,
                   gathered_kept=recorded_gathered(settings))


def recorded_gathered(settings: dict | None) -> bool | None:
    """Whether a run's FSDP2 engine kept the gathered parameters into backward, as it recorded it; a record with
    only reshard_after_forward (every block wrapped) kept them exactly when it did not reshard after forward."""
    if not settings:
        return None
    if "gathered_kept" in settings:
        return bool(settings["gathered_kept"])
    return not settings["reshard_after_forward"] if "reshard_after_forward" in settings else None


def recorded_wrap_blocks(settings: dict | None) -> bool | None:
    """Whether a run's FSDP2 engine wrapped each block as a unit, as it recorded it (None: no record, a plan's
    candidate); a record without the key wrapped every block."""
    return None if settings is None else bool(settings.get("wrap_blocks", True))
