"""A run's predicted peak memory per GPU, from what the run is (its spec and summary) or from a plan's settings:
the analytic model (memory_model.py) with its activations counted by hand, or traced (traced.py: the same model
with one real decoder layer's saved tensors counted by torch). Used by the parse stage (a `predicted_peak_bytes`
column), the benchmark (bench/memory.py) and the planner (plan/planner.py).
"""
from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace

from workflow_scripts.plan import memory_model as mm
from workflow_scripts.training.models import MODELS, build_config

METHODS = ("analytic", "traced")


def shape(model: str, overrides: dict | None, n_params: int, vocab: int) -> mm.Shape:
    spec = MODELS[model]
    s = dict(spec.shape, **(overrides or {}))
    d = s.get("n_embd", s.get("hidden_size"))
    heads = s.get("n_head", s.get("num_attention_heads"))
    kv_heads = s.get("num_key_value_heads", heads)
    ffn = s.get("n_inner") or s.get("intermediate_size") or 4 * d
    return mm.Shape(spec.family, int(n_params), s.get("n_layer", s.get("num_hidden_layers")), d, ffn,
                    kv_heads * d // heads, d // heads, int(vocab), bool(s.get("tie_word_embeddings", True)))


@lru_cache(maxsize=64)
def count_params(model: str, overrides_json: str, vocab: int, seq_len: int) -> int:
    """Parameters of the model built on the meta device (no memory, seconds)."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    config = build_config(model, vocab, seq_len, json.loads(overrides_json))
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())


@lru_cache(maxsize=64)
def _traced(model: str, overrides_json: str, precision: str, micro_batch: int, seq_len: int) -> float:
    import json

    from workflow_scripts.plan.traced import layer_saved_bytes

    return layer_saved_bytes(model, precision, micro_batch, seq_len, json.loads(overrides_json))["per_token"]


def offloads(strategy: str, options: dict) -> tuple[bool, bool]:
    from workflow_scripts.training.strategies import STRATEGIES

    s, ctx = STRATEGIES[strategy], SimpleNamespace(options=options or {})
    return bool(s.offload_optimizer(ctx)), bool(s.offload_params(ctx))


def predict(*, model: str, strategy: str, precision: str, world_size: int, micro_batch: int, seq_len: int,
            grad_accum: int, vocab: int, n_params: int | None = None, overrides: dict | None = None,
            layout: dict | None = None, options: dict | None = None, checkpointing: bool = False,
            compiled: bool = False, method: str = "analytic") -> mm.Prediction:
    """The predicted peak of one rank for these settings (`method`: analytic | traced)."""
    import json

    from workflow_scripts.training.strategies import STRATEGIES

    layout = layout or {}
    key = json.dumps(overrides or {}, sort_keys=True)
    if MODELS[model].family not in ("gpt2", "qwen2"):
        return mm.Prediction(False, f"family {MODELS[model].family} not modelled yet")
    n_params = n_params or count_params(model, key, vocab, seq_len)
    s = shape(model, overrides, n_params, vocab)
    strat = STRATEGIES[strategy]
    dp = world_size // max(1, layout.get("pp", 1) * layout.get("tp", 1))  # the strategy shards over dp x cp
    off_opt, off_par = offloads(strategy, options)
    per_layer = None
    if method == "traced":
        per_layer = _traced(model, key, precision, micro_batch, seq_len // layout.get("cp", 1))
    return mm.predict(shape=s, family=strat.family, zero_stage=strat.zero_stage,
                      precision=precision, dp=dp, micro_batch=micro_batch, seq_len=seq_len, grad_accum=grad_accum,
                      checkpointing=checkpointing, layout=layout, compiled=compiled, offload_optimizer=off_opt,
                      offload_params=off_par, traced_per_layer=per_layer,
                      reduce_bucket=float((options or {}).get("reduce_bucket_size", mm.REDUCE_BUCKET)))


def predict_run(spec: dict, summary: dict, method: str = "analytic") -> mm.Prediction:
    """From a run's run_spec.json and summary.json (ok runs: the summary has the model's size)."""
    t = spec["train"]
    return predict(model=spec["model"], strategy=spec["strategy"], precision=spec["precision"],
                   world_size=spec["world_size"], micro_batch=int(summary["micro_batch"]),
                   seq_len=int(summary["seq_len"]), grad_accum=int(summary["grad_accum"]),
                   vocab=int(summary["vocab_size"]), n_params=int(summary["n_params"]),
                   overrides=spec.get("model_overrides"), layout=spec.get("layout"), options=spec.get("options"),
                   checkpointing=bool(t.get("gradient_checkpointing")),
                   compiled=bool(t.get("compile_blocks") or t.get("compile_loss")), method=method)
