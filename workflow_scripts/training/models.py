"""Model registry: a name -> a transformers config, randomly initialised unless pretrained weights are asked for.

Shapes are written out here (from the models' published configs) so that every study runs offline; with
`pretrained: <hub id or local dir>` the real `from_pretrained` path loads config and weights instead.
Adding a model is one entry in MODELS.

A study may also name its own causal LM instead of a registry name (`own_spec`): a local directory holding a Hugging
Face config.json, or a hub id, read with `AutoConfig.from_pretrained` (the Hugging Face cache first, so a cached hub
id reads offline). Its shape is the config's, its family the pipeline's family of its block structure (OWN_FAMILIES),
so the memory and step-time models, MFU and the plan take it as they take a registry model. Runs name it by a name
that fits a path and a Snakemake wildcard (own_name: the directory's name, a hub id's `org--name`); the study's check
registers that name with its source (`register`: $PIPELINE_MODELS, which every job the workflow starts inherits), and
MODELS[name] finds it there.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace

GPT2_BASE = dict(
    n_positions=1024,
    activation_function="gelu_new",
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    layer_norm_epsilon=1e-5,
    initializer_range=0.02,
    tie_word_embeddings=True,
)
QWEN2_BASE = dict(
    hidden_act="silu",
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    attention_dropout=0.0,
    tie_word_embeddings=True,
    use_sliding_window=False,
)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # "gpt2" | "qwen2" | "qwen2_moe" | "vit"
    hub_id: str | None  # where pretrained weights / the original config live
    shape: dict  # architecture keys for the transformers config class
    lora: dict | None = None  # a LoRA variant: peft's LoraConfig keys (train.lora overrides them)
    vision: bool = False  # an image classifier (data.kind: images; its loss is its classifier's, not lm_loss)
    source: str | None = None  # a study's own model: the directory (absolute) or hub id its config is read from

    # ---------------------------------------------------------------- capabilities
    @property
    def moe(self) -> bool:
        """Routed experts in its blocks (expert parallelism applies; grouped_mm experts)."""
        return self.n_experts > 0

    @property
    def tied_embeddings(self) -> bool:
        """The LM head shares the input embedding's weight."""
        return bool(self.shape.get("tie_word_embeddings", False))

    @property
    def n_layer(self) -> int:
        return self.shape.get("n_layer", self.shape.get("num_hidden_layers"))

    @property
    def d_model(self) -> int:
        return self.shape.get("n_embd", self.shape.get("hidden_size"))

    @property
    def n_heads(self) -> int:
        return self.shape.get("n_head", self.shape.get("num_attention_heads"))

    @property
    def n_kv_heads(self) -> int:
        return self.shape.get("num_key_value_heads", self.n_heads)

    @property
    def n_experts(self) -> int:
        """Routed experts per MoE layer; 0 for a dense model."""
        return int(self.shape.get("num_experts", 0) or 0)

    def patches(self, image_size: int) -> int:
        """A ViT's patches per image of that size (its sequence: these + the class token)."""
        return (image_size // self.shape["patch_size"]) ** 2

    @property
    def block_matmul_params(self) -> int:
        """Weight elements one token passes through in one block's matmuls: attention projections and the MLP (a
        MoE block: its top-k routed experts and the shared expert). 2x this is a block's forward FLOPs per token."""
        d, kv_dim = self.d_model, self.n_kv_heads * (self.d_model // self.n_heads)
        attn = 2 * d * d + 2 * d * kv_dim  # q, o; k, v
        if self.family == "gpt2":
            return attn + 2 * d * (self.shape.get("n_inner") or 4 * d)
        if self.vision:
            return attn + 2 * d * self.shape["intermediate_size"]
        if self.n_experts:
            routed = self.shape["num_experts_per_tok"] * self.shape["moe_intermediate_size"]
            return attn + 3 * d * (routed + self.shape["shared_expert_intermediate_size"])
        return attn + 3 * d * self.shape["intermediate_size"]  # gate, up, down

    @property
    def idle_expert_params(self) -> int:
        """Parameters a token does not pass through: the routed experts beyond its top-k, in every MoE layer
        (model FLOPs count only the active parameters)."""
        if not self.n_experts:
            return 0
        per_expert = 3 * self.d_model * self.shape["moe_intermediate_size"]  # gate, up, down
        return self.n_layer * (self.n_experts - self.shape["num_experts_per_tok"]) * per_expert


def _gpt2(name, hub_id, n_layer, n_embd, n_head):
    return ModelSpec(name, "gpt2", hub_id, dict(GPT2_BASE, n_layer=n_layer, n_embd=n_embd, n_head=n_head))


def _qwen2(name, hub_id, layers, hidden, inter, heads, kv_heads):
    shape = dict(QWEN2_BASE, num_hidden_layers=layers, hidden_size=hidden, intermediate_size=inter,
                 num_attention_heads=heads, num_key_value_heads=kv_heads)
    return ModelSpec(name, "qwen2", hub_id, shape)


def _qwen2_moe(name, hub_id, layers, hidden, heads, kv_heads, experts, top_k, moe_inter, shared_inter):
    """Qwen1.5-MoE / Qwen2-MoE: every block's MLP is `experts` routed experts (top_k per token) plus a gated
    shared expert; norm_topk_prob false as published."""
    shape = dict(QWEN2_BASE, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                 num_key_value_heads=kv_heads, num_experts=experts, num_experts_per_tok=top_k,
                 moe_intermediate_size=moe_inter, shared_expert_intermediate_size=shared_inter,
                 intermediate_size=shared_inter, decoder_sparse_step=1, norm_topk_prob=False,
                 tie_word_embeddings=False)
    return ModelSpec(name, "qwen2_moe", hub_id, shape)


VIT_BASE = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, hidden_act="gelu", layer_norm_eps=1e-12,
                qkv_bias=True)
VIT_LORA = {"r": 16, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"],
            "modules_to_save": ["classifier"]}


def _vit(name, hub_id, layers, hidden, inter, heads, patch, lora=None):
    """ViT image classifier (transformers ViTForImageClassification); the image size comes from the data."""
    shape = dict(VIT_BASE, num_hidden_layers=layers, hidden_size=hidden, intermediate_size=inter,
                 num_attention_heads=heads, patch_size=patch)
    return ModelSpec(name, "vit", hub_id, shape, lora, vision=True)


NAMED: dict[str, ModelSpec] = {m.name: m for m in [
    # CPU-sized models for the default study and tests
    _gpt2("gpt2-tiny", None, 2, 128, 4),
    _gpt2("gpt2-mini", None, 4, 256, 4),
    _qwen2("qwen2-tiny", None, 2, 128, 384, 4, 2),
    _qwen2_moe("qwen2-moe-tiny", None, 2, 128, 4, 2, 4, 2, 64, 128),
    # the studied shapes
    _gpt2("gpt2", "openai-community/gpt2", 12, 768, 12),
    _gpt2("gpt2-medium", "openai-community/gpt2-medium", 24, 1024, 16),
    _gpt2("gpt2-large", "openai-community/gpt2-large", 36, 1280, 20),
    _gpt2("gpt2-xl", "openai-community/gpt2-xl", 48, 1600, 25),
    _qwen2("qwen2.5-coder-1.5b", "Qwen/Qwen2.5-Coder-1.5B", 28, 1536, 8960, 12, 2),
    _qwen2("qwen2.5-3b", "Qwen/Qwen2.5-3B", 36, 2048, 11008, 16, 2),
    _qwen2_moe("qwen1.5-moe-a2.7b", "Qwen/Qwen1.5-MoE-A2.7B", 24, 2048, 16, 16, 60, 4, 1408, 5632),
    # vision: ViT-Base/16 (86M) full and with LoRA on query/value, ViT-Huge/14 (632M); a CPU-sized ViT
    _vit("vit-tiny", None, 2, 64, 128, 4, 8),
    _vit("vit-tiny-lora", None, 2, 64, 128, 4, 8, lora=VIT_LORA),
    _vit("vit-base-16", "google/vit-base-patch16-224-in21k", 12, 768, 3072, 12, 16),
    _vit("vit-base-16-lora", "google/vit-base-patch16-224-in21k", 12, 768, 3072, 12, 16, lora=VIT_LORA),
    _vit("vit-huge-14", "google/vit-huge-patch14-224-in21k", 32, 1280, 5120, 16, 14),
    # its shape at half the depth (7.4B parameters, 1.6B active): FSDP2 fits it on 2 GPUs of 141 GB
    _qwen2_moe("qwen1.5-moe-a2.7b-12l", "Qwen/Qwen1.5-MoE-A2.7B", 12, 2048, 16, 16, 60, 4, 1408, 5632),
]}


# ---------------------------------------------------------------- a study's own models
MODELS_ENV = "PIPELINE_MODELS"  # {name: source} of the study's own models (register), inherited by every job
NAME = re.compile(r"[A-Za-z0-9_.-]+")  # what a {model} wildcard matches (rules/common.smk)
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
# a causal LM's model_type -> the pipeline's family of its block structure, the one the memory model counts, the
# step-time model times and the parallel plans split: GPT-2's; Qwen2's (RMSNorm, rotary attention with separate
# q/k/v projections, SiLU-gated MLP; Llama and Mistral blocks are that, without the q/k/v biases); Qwen2-MoE's
OWN_FAMILIES = {"gpt2": "gpt2", "qwen2": "qwen2", "llama": "qwen2", "mistral": "qwen2", "qwen2_moe": "qwen2_moe"}
# config.json keys that are no part of the architecture
NOT_SHAPE = {"transformers_version", "architectures", "_name_or_path", "model_type", "id2label", "label2id", "dtype",
             "torch_dtype", "output_hidden_states", "output_attentions", "return_dict", "problem_type",
             "chunk_size_feed_forward", "is_encoder_decoder", "use_cache", "tokenizer_class", "task_specific_params"}


class ModelSourceError(ValueError):
    """A study's own model that cannot be read or trained here; the message names it."""


def is_local(entry: str) -> bool:
    """A path, not a hub id: absolute, starting with '.' or '~', or an existing path."""
    return os.path.isabs(entry) or entry.startswith((".", "~")) or os.path.exists(entry)


def is_source(entry) -> bool:
    """A models entry that names a model by its source (a local directory or a hub id), not a registry name."""
    return isinstance(entry, str) and entry not in NAMED and (is_local(entry) or bool(HUB_ID.fullmatch(entry)))


def source_of(entry: str) -> str:
    """Where an own model's config is read from: the directory, absolute; or the hub id."""
    return os.path.abspath(os.path.expanduser(entry)) if is_local(entry) else entry


def own_name(entry: str) -> str:
    """The name runs give an own model (run ids, result folders runs/<name>/..., the {model} wildcard): the directory's
    name, a hub id's `org--name`; characters a wildcard does not take become '-'."""
    base = os.path.basename(source_of(entry)) if is_local(entry) else entry.replace("/", "--")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-")
    if not NAME.fullmatch(name) or name.startswith("."):
        raise ModelSourceError(f"{entry!r}: its directory's name {base!r} makes no model name (letters, digits, "
                               "'_', '.', '-'): rename the directory")
    return name


def read_config(source: str, entry: str | None = None):
    """The transformers config of an own model: `AutoConfig.from_pretrained` of the directory, or of the hub id from
    the Hugging Face cache (offline), else downloaded. ModelSourceError naming `entry` where it cannot be read."""
    from transformers import AutoConfig

    entry = entry or source
    if os.path.isabs(source):
        if not os.path.isdir(source):
            raise ModelSourceError(f"{entry!r}: {source} is not a directory (a local model is a directory holding "
                                   "a Hugging Face config.json)")
        if not os.path.isfile(os.path.join(source, "config.json")):
            raise ModelSourceError(f"{entry!r}: no config.json in {source} (a local model is a directory holding a "
                                   "Hugging Face config.json)")
    try:
        try:
            return AutoConfig.from_pretrained(source, local_files_only=True)
        except OSError:
            if os.path.isabs(source):
                raise
        return AutoConfig.from_pretrained(source)  # a hub id not in the cache
    except OSError as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        where = "" if os.path.isabs(source) else " (a hub id: not in the Hugging Face cache, nor downloadable)"
        raise ModelSourceError(f"{entry!r}: its config cannot be read{where}: {why}") from None
    except (ValueError, KeyError) as exc:  # no or an unknown model_type, a config.json that is no JSON
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelSourceError(f"{entry!r}: transformers cannot read its config.json: {why}") from None


def own_spec(name: str, source: str, entry: str | None = None) -> ModelSpec:
    """The ModelSpec of an own model: its config read (read_config), refused where it is no causal LM of a family
    the pipeline models, its shape the config's architecture keys (tie_word_embeddings and vocab_size among them)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    entry = entry or source
    config = read_config(source, entry)
    kind = config.model_type
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelSourceError(f"{entry!r}: model_type {kind!r} ({type(config).__name__}) is not a causal language "
                               "model (transformers' AutoModelForCausalLM has no class for it)")
    if kind not in OWN_FAMILIES:
        raise ModelSourceError(f"{entry!r}: model_type {kind!r} is a causal LM whose block the pipeline does not "
                               f"model (its memory, step time, parallel plans); model types: {', '.join(OWN_FAMILIES)}")
    shape = {k: v for k, v in config.to_dict().items() if k not in NOT_SHAPE}
    shape["tie_word_embeddings"] = bool(getattr(config, "tie_word_embeddings", False))
    spec = ModelSpec(name, OWN_FAMILIES[kind], None if os.path.isabs(source) else source, shape, source=source)
    heads, d = spec.n_heads, spec.d_model
    if d % heads or spec.n_heads % spec.n_kv_heads:
        raise ModelSourceError(f"{entry!r}: {heads} attention heads do not divide hidden size {d}, or "
                               f"{spec.n_kv_heads} KV heads do not divide them")
    if shape.get("head_dim") not in (None, d // heads):
        raise ModelSourceError(f"{entry!r}: head_dim {shape['head_dim']} is not hidden_size / num_attention_heads "
                               f"= {d // heads}, which the memory and step-time models take")
    if spec.moe and (shape.get("decoder_sparse_step", 1) != 1 or shape.get("mlp_only_layers")):
        raise ModelSourceError(f"{entry!r}: dense layers between the MoE ones (decoder_sparse_step, mlp_only_layers) "
                               "are not modelled: every layer's MLP is taken for experts")
    return spec


_LOADED: dict[tuple[str, str], ModelSpec] = {}


def own_models() -> dict[str, str]:
    """The own models registered in this process or inherited from the process that checked the study:
    {name: source}."""
    try:
        given = json.loads(os.environ.get(MODELS_ENV) or "{}")
    except ValueError:
        raise ModelSourceError(f"${MODELS_ENV}: not a JSON mapping of model name to source") from None
    return given if isinstance(given, dict) else {}


def register(name: str, source: str) -> None:
    """Name an own model for this process and every process it starts ($PIPELINE_MODELS)."""
    if name in NAMED:
        raise ModelSourceError(f"{source!r}: is named {name!r}, a registry model's name: rename the directory")
    os.environ[MODELS_ENV] = json.dumps({**own_models(), name: source}, sort_keys=True)


def register_from(spec) -> None:
    """A run spec's own model (its `model_source`) named for this process and the ranks it starts: a spec launched
    by hand, outside the workflow whose check registered it."""
    own = spec.model_source
    if own and own_models().get(spec.model) != own["source"]:
        register(spec.model, own["source"])


def _own(key: str) -> ModelSpec:
    known = own_models()
    if key in known:
        name, source, entry = key, known[key], key
    elif is_source(key):  # asked for by its source (a plan or a build outside a study)
        name, source, entry = own_name(key), source_of(key), key
    else:
        raise KeyError(f"unknown model {key!r}: not a registry model (models.py), not a study's own model named in "
                       f"${MODELS_ENV}, not a local directory or hub id")
    if (name, source) not in _LOADED:
        _LOADED[(name, source)] = own_spec(name, source, entry)
    return _LOADED[(name, source)]


class Registry(dict):
    """The named models (iteration and len: those only); a lookup (`[]`, `in`, `get`) also finds a study's own
    models registered by name (register, $PIPELINE_MODELS), and `[]` one given by its source (a directory, a hub
    id: a plan or a build outside a study)."""

    def __missing__(self, key):
        if not isinstance(key, str):
            raise KeyError(key)
        return _own(key)

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or (isinstance(key, str) and key in own_models())

    def get(self, key, default=None):
        return self[key] if key in self else default


MODELS: dict[str, ModelSpec] = Registry(NAMED)

# what a family can do (vision, MoE) is what every model of it can: the first registry model of each family
FAMILIES: dict[str, ModelSpec] = {}
for _m in NAMED.values():
    FAMILIES.setdefault(_m.family, _m)


def padded_vocab(vocab_size: int, multiple: int) -> int:
    """Round the embedding rows up to a multiple (64/128 keeps the LM-head matmul on fast tiles)."""
    if multiple <= 1:
        return vocab_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


def embedding_rows(tokenizer_vocab: int, train: dict) -> int:
    """The run's embedding rows: the tokenizer's vocabulary padded to train.vocab_multiple, or the original model's
    row count (train.embedding_rows) where that is larger."""
    return max(padded_vocab(tokenizer_vocab, train["vocab_multiple"]), train["embedding_rows"] or 0)


def data_rows(manifest: dict, train: dict) -> int:
    """The embedding rows of a run on the data a tokens manifest describes. An image classifier's head is padded like
    a vocabulary (classes never seen as labels): ZeRO++'s quantized weights need every partition to be a multiple
    of 8 elements, and 100 classes x 1280 + 100 over 2 ranks is not."""
    rows = manifest["num_classes"] if manifest.get("kind") == "images" else manifest["vocab_size"]
    return embedding_rows(rows, train)


def build_config(name: str, vocab_size: int, block_size: int, overrides: dict | None = None):
    """The transformers config for a registry model with the study's vocabulary and sequence length."""
    from transformers import GPT2Config, Qwen2Config, Qwen2MoeConfig

    spec = model_spec(name, overrides)
    if spec.source:
        return own_config(spec, vocab_size, block_size, overrides)
    shape = dict(spec.shape)
    if spec.vision:  # vocab_size: the classes; block_size: one image row (label + 3 x size x size)
        from transformers import ViTConfig

        return ViTConfig(num_labels=vocab_size, image_size=image_size(block_size), **shape)
    if spec.family == "gpt2":
        shape["n_positions"] = max(shape.get("n_positions", 1024), block_size)
        return GPT2Config(vocab_size=vocab_size, bos_token_id=0, eos_token_id=0, **shape)
    config = Qwen2MoeConfig if spec.moe else Qwen2Config
    return config(vocab_size=vocab_size, **shape)


def own_config(spec: ModelSpec, vocab_size: int, block_size: int, overrides: dict | None = None):
    """An own model's config as read from its source (read_config), with the study's overrides, vocabulary and
    sequence length; token ids the vocabulary does not hold are dropped (random init: the study's tokenizer)."""
    config = read_config(spec.source, spec.name)
    if overrides:  # through the config's class, so that what it derives (a Qwen2's layer_types) follows them
        given = {**config.to_dict(), **overrides}
        if "layer_types" not in overrides and len(given.get("layer_types") or []) not in (0, spec.n_layer):
            given.pop("layer_types")
        config = type(config).from_dict(given)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(getattr(config, key, None), int) and getattr(config, key) >= vocab_size:
            setattr(config, key, None)
    config.vocab_size = vocab_size
    positions = "n_positions" if spec.family == "gpt2" else "max_position_embeddings"
    if getattr(config, positions, None) is not None:
        setattr(config, positions, max(getattr(config, positions), block_size))
    return config


def build_model(name: str, vocab_size: int, block_size: int, *, pretrained: str | None = None,
                attn_implementation: str = "sdpa", overrides: dict | None = None):
    """Instantiate the model in fp32 on the CPU; strategies move/cast/shard it."""
    import torch
    from transformers import AutoModelForCausalLM

    from workflow_scripts.training import attention

    attention.register(attn_implementation)

    if MODELS[name].vision:
        return build_vit(name, vocab_size, block_size, pretrained, attn_implementation, overrides)
    if pretrained:
        model = AutoModelForCausalLM.from_pretrained(pretrained, dtype=torch.float32,
                                                     attn_implementation=attn_implementation)
        if model.get_input_embeddings().num_embeddings < vocab_size:
            model.resize_token_embeddings(vocab_size)
        return model
    config = build_config(name, vocab_size, block_size, overrides)
    config._attn_implementation = attn_implementation
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def build_vit(name: str, classes: int, block_size: int, pretrained: str | None, attn_implementation: str,
              overrides: dict | None):
    """ViTForImageClassification: random init, or pretrained weights with a new head of `classes` outputs."""
    import torch
    from transformers import AutoModelForImageClassification

    if pretrained:
        return AutoModelForImageClassification.from_pretrained(
            pretrained, dtype=torch.float32, num_labels=classes, image_size=image_size(block_size),
            ignore_mismatched_sizes=True, attn_implementation=attn_implementation)
    config = build_config(name, classes, block_size, overrides)
    config._attn_implementation = attn_implementation
    return AutoModelForImageClassification.from_config(config, dtype=torch.float32)


def with_lora(model, settings: dict):
    """peft's LoRA on the model: only the adapters (and modules_to_save) train, the base weights stay as loaded."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(**settings))


def count_trainable(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def count_params(model) -> int:
    """Unique parameters (tied embeddings counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def flops_per_token(n_params: int, n_layer: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N + 12·L·d·T (PaLM appendix B; nanoGPT's estimate_mfu)."""
    return 6.0 * n_params + 12.0 * n_layer * d_model * seq_len


def image_size(row_length: int) -> int:
    """The side of the square RGB image stored in a row of 1 + 3 x size x size values (data/images.py)."""
    size = int(round(((row_length - 1) / 3) ** 0.5))
    if 1 + 3 * size * size != row_length:
        raise ValueError(f"a row of {row_length} values is not a label and a square RGB image")
    return size


def vit_flops_per_image(n_params: int, trainable: int, n_layer: int, d_model: int, patches: int) -> float:
    """Training FLOPs per image of a ViT: T = patches + 1 (class token) tokens, 2N forward and 2N backward
    (activation gradients) per token for every weight, 2N more for the weights that train (all of them, or LoRA's
    adapters and the head), plus attention's 12·L·d·T per token."""
    tokens = patches + 1
    return tokens * (4.0 * n_params + 2.0 * trainable + 12.0 * n_layer * d_model * tokens)


def model_spec(name: str, overrides: dict | None = None) -> ModelSpec:
    """A registry model (or a study's own, MODELS) with a study's model_overrides (shape keys) applied."""
    spec = MODELS[name]
    return replace(spec, shape={**spec.shape, **overrides}) if overrides else spec


def model_flops_per_token(name: str, n_params: int, seq_len: int, trainable: int | None = None,
                          overrides: dict | None = None) -> float:
    """flops_per_token of a registry model with N its active parameters (a MoE token skips the idle experts). For
    a ViT the "tokens" of a step are the stored values of its image rows: FLOPs per image / row length, so that
    tokens/s x flops_per_token = images/s x FLOPs per image."""
    spec = model_spec(name, overrides)
    if spec.vision:
        per_image = vit_flops_per_image(n_params, n_params if trainable is None else trainable, spec.n_layer,
                                        spec.d_model, spec.patches(image_size(seq_len)))
        return per_image / seq_len
    return flops_per_token(n_params - spec.idle_expert_params, spec.n_layer, spec.d_model, seq_len)


def transformer_blocks(model) -> list:
    """The repeated decoder blocks (the unit FSDP shards and activation checkpointing wraps)."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise ValueError(f"{type(model).__name__}: no ModuleList of transformer blocks found")
    return list(max(lists, key=len))
