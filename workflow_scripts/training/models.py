"""Model registry: a name -> a transformers config, randomly initialised unless pretrained weights are asked for.

Shapes are written out here (from the models' published configs) so that every study runs offline; with
`pretrained: <hub id or local dir>` the real `from_pretrained` path loads config and weights instead.
Adding a model is one entry in MODELS.
"""
from __future__ import annotations

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


MODELS: dict[str, ModelSpec] = {m.name: m for m in [
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


# what a family can do (vision, MoE) is what every model of it can: the first registry model of each family
FAMILIES: dict[str, ModelSpec] = {}
for _m in MODELS.values():
    FAMILIES.setdefault(_m.family, _m)


def padded_vocab(vocab_size: int, multiple: int) -> int:
    """Round the embedding rows up to a multiple (64/128 keeps the LM-head matmul on fast tiles)."""
    if multiple <= 1:
        return vocab_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


def embedding_rows(tokenizer_vocab: int, train: dict) -> int:
    """The run's embedding rows: the tokenizer's vocabulary padded to train.vocab_multiple, or the original model's
    row count (train.embedding_rows) where that is larger."""
    return max(padded_vocab(tokenizer_vocab, train["vocab_multiple"]), train.get("embedding_rows") or 0)


def build_config(name: str, vocab_size: int, block_size: int, overrides: dict | None = None):
    """The transformers config for a registry model with the study's vocabulary and sequence length."""
    from transformers import GPT2Config, Qwen2Config, Qwen2MoeConfig

    spec = model_spec(name, overrides)
    shape = dict(spec.shape)
    if spec.vision:  # vocab_size: the classes; block_size: one image row (label + 3 x size x size)
        from transformers import ViTConfig

        return ViTConfig(num_labels=vocab_size, image_size=image_size(block_size), **shape)
    if spec.family == "gpt2":
        shape["n_positions"] = max(shape.get("n_positions", 1024), block_size)
        return GPT2Config(vocab_size=vocab_size, bos_token_id=0, eos_token_id=0, **shape)
    config = Qwen2MoeConfig if spec.moe else Qwen2Config
    return config(vocab_size=vocab_size, **shape)


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
    """A registry model with a study's model_overrides (shape keys) applied."""
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
