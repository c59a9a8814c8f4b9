"""A LLaMA-Factory train YAML (`llamafactory-cli train FILE`) read into the study's terms: the model and its weights,
the dataset (through LLaMA-Factory's dataset_info.json where it is readable) as the corpus, cutoff_len as the block
size, the Hugging Face Trainer's batch, optimizer, schedule and precision as `train` keys, and the DeepSpeed JSON it
names (`deepspeed:`, relative to the YAML or the working directory).

What a key the YAML leaves out means is what it meant to the original run: the Trainer's defaults (HF_DEFAULTS) and
LLaMA-Factory's own (LF_DEFAULTS, e.g. finetuning_type lora, gradient checkpointing on). The Trainer's values the
DeepSpeed JSON's "auto" fields are filled from travel in `Training.hf` (importers.deepspeed_json); the schedule is
decided once the world size is known (`schedule`), because a warmup_ratio is a share of the original's steps.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from workflow_scripts.importers.common import (
    Record,
    boolean,
    ceil_int,
    integral,
    model_entry,
    positive_int,
    tidy,
)

KIND = "LLaMA-Factory train YAML"

# transformers' TrainingArguments defaults (5.x) of the keys that shape a run
HF_DEFAULTS = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "learning_rate": 5e-5,
    "weight_decay": 0.0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "max_grad_norm": 1.0,
    "num_train_epochs": 3.0,
    "max_steps": -1,
    "lr_scheduler_type": "linear",
    "lr_scheduler_kwargs": None,
    "warmup_ratio": None,
    "warmup_steps": 0,
    "seed": 42,
    "logging_steps": 500,
    "bf16": False,
    "fp16": False,
    "optim": "adamw_torch_fused",
    "report_to": "none",
    "torch_compile": False,
}
# LLaMA-Factory's own defaults of the keys read here
LF_DEFAULTS = {
    "stage": "sft",
    "finetuning_type": "lora",
    "cutoff_len": 2048,
    "dataset_dir": "data",
    "disable_gradient_checkpointing": False,
    "flash_attn": "auto",
    "enable_liger_kernel": False,
    "pure_bf16": False,
    "val_size": 0.0,
    "train_on_prompt": False,
}
ATTENTION = {"auto": "sdpa", "sdpa": "sdpa", "disabled": "eager", "fa2": "flash_attention_2"}
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
ADAMW = ("adamw_torch", "adamw_torch_fused")
# keys that decide where the original wrote its outputs, how it was launched or how fast it read its data
NOT_APPLIED = {
    "output_dir": "where the original wrote its checkpoints",
    "overwrite_output_dir": "where the original wrote its checkpoints",
    "logging_dir": "where the original logged",
    "run_name": "the tracker's run name",
    "save_steps": "the original's saved checkpoints (checkpoint_every stays 0)",
    "save_strategy": "the original's saved checkpoints",
    "save_total_limit": "the original's saved checkpoints",
    "save_only_model": "the original's saved checkpoints",
    "plot_loss": "a figure of the original's loss",
    "overwrite_cache": "LLaMA-Factory's preprocessing cache",
    "preprocessing_num_workers": "LLaMA-Factory's preprocessing workers",
    "dataloader_num_workers": "data loader workers",
    "dataloader_pin_memory": "data loader pinning",
    "ddp_timeout": "the process group's timeout",
    "trust_remote_code": "the pipeline builds the model from its config",
    "cache_dir": "the Hugging Face cache directory",
    "resume_from_checkpoint": "the original's resumption",
    "include_num_input_tokens_seen": "a logged counter",
    "logging_strategy": "when the original logged",
    "do_train": "the original trained (llamafactory-cli train)",
}
EVALUATION = ("do_eval", "eval_strategy", "evaluation_strategy", "eval_steps", "per_device_eval_batch_size")
LORA = ("lora_rank", "lora_alpha", "lora_dropout", "lora_target", "additional_target", "use_rslora", "use_dora")
FREEZE = ("freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules")
READ = (
    set(HF_DEFAULTS)
    | set(LF_DEFAULTS)
    | set(NOT_APPLIED)
    | set(EVALUATION)
    | set(LORA)
    | set(FREEZE)
    | {
        "model_name_or_path",
        "dataset",
        "template",
        "max_samples",
        "packing",
        "neat_packing",
        "deepspeed",
        "gradient_checkpointing",
        "use_reentrant_gc",
        "ddp_find_unused_parameters",
        "ddp_bucket_cap_mb",
        "ddp_broadcast_buffers",
    }
)


def looks_like(data: dict) -> bool:
    return isinstance(data, dict) and any(k in data for k in ("model_name_or_path", "finetuning_type", "stage"))


@dataclass
class Training:
    """What a LLaMA-Factory YAML says of its runs, before a strategy file joins it."""

    path: str
    record: Record
    given: dict = field(default_factory=dict)  # the keys the YAML sets
    model: str | None = None
    weights: str | None = None  # what the original loaded: the hub id or the directory
    sections: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    hf: dict = field(default_factory=dict)  # the Trainer's values, defaults filled in
    precision: str = "fp32"  # without DeepSpeed or FSDP: autocast for bf16
    precision_why: str = ""
    deepspeed: str | None = None
    trackers: list = field(default_factory=list)
    ddp: tuple = ("ddp", {})  # the strategy of a run without DeepSpeed or FSDP
    samples: int | None = None  # training samples, where max_samples bounds them (a warmup_ratio's steps)


def read(path: str, data: dict, rec: Record) -> Training:
    base = os.path.dirname(os.path.abspath(path))
    rec.check_known(data, READ)
    given = {k: data[k] for k in data if k in READ}
    lf = {**LF_DEFAULTS, **{k: v for k, v in given.items() if k in LF_DEFAULTS}}
    hf = {**HF_DEFAULTS, **{k: v for k, v in given.items() if k in HF_DEFAULTS}}
    out = Training(path, rec, given=given, hf=hf)
    for key, why in NOT_APPLIED.items():
        if key in given:
            rec.not_applied(key, why)
    if given.get("do_train") is False:
        rec.refuse("do_train", "false: the YAML trains nothing")

    stage = lf["stage"]
    if stage not in ("sft", "pt"):
        rec.refuse("stage", f"{stage!r}: only sft (supervised fine-tuning) and pt (pre-training) have a counterpart")
    elif "stage" in given:
        rec.mapped("stage", "corpus kind chat (loss on the answers)" if stage == "sft" else "corpus kind text")
    if "model_name_or_path" not in given:
        rec.refuse("model_name_or_path", "missing: the model the YAML trains")
    else:
        out.model = model_entry(given["model_name_or_path"], base, rec, "model_name_or_path")
        registry = out.model and "/" not in out.model and not os.path.isabs(out.model)
        out.weights = given["model_name_or_path"] if registry else out.model
    finetuning(given, lf, rec)
    out.sections = dataset_sections(given, lf, base, rec, out.model)
    out.train, out.samples = train_keys(given, hf, lf, rec)
    out.samples = out.samples if given.get("max_samples") else None
    out.precision, out.precision_why = precision(given, hf, lf, rec)
    out.trackers = trackers(given, rec)
    out.ddp = ddp_strategy(given, out.train, rec)
    if "deepspeed" in given:
        out.deepspeed = deepspeed_path(given["deepspeed"], base, rec)
    return out


def finetuning(given: dict, lf: dict, rec: Record) -> None:
    kind = lf["finetuning_type"]
    lora = {k: given[k] for k in LORA if k in given}
    freeze = {k: given[k] for k in FREEZE if k in given}
    if kind == "full":
        rec.mapped("finetuning_type", "every parameter trains (no train.lora)")
    elif kind in ("lora", "freeze"):
        what = "LoRA adapters" if kind == "lora" else "freeze-tuning (only some layers train)"
        detail = f" ({', '.join(f'{k} {v}' for k, v in {**lora, **freeze}.items())})" if lora or freeze else ""
        rec.substituted(
            "finetuning_type",
            f"{kind}{' (LLaMA-Factory default)' if 'finetuning_type' not in given else ''}: full fine-tuning instead "
            f"of {what}{detail}; train.lora is wired for the vit-* models only, so every parameter trains",
        )
    else:
        rec.refuse("finetuning_type", f"{kind!r}: not full, lora or freeze")
    for key in (*LORA, *FREEZE):
        if key in given:
            if (key in LORA and kind == "lora") or (key in FREEZE and kind == "freeze"):
                rec.substituted(key, f"{given[key]!r}: no adapters or frozen layers (finetuning_type above)")
            else:
                rec.not_applied(key, f"finetuning_type is {kind}")


def packed_together(given: dict, lf: dict) -> bool:
    """Whether the original's samples attended to one another: packed (`packing`, the pt stage's default) without
    neat_packing. Otherwise each sample was alone, which train.separate_documents keeps in packed blocks."""
    packing = given.get("packing")
    packed = packing if packing is not None else lf["stage"] == "pt"
    return bool(packed) and not given.get("neat_packing")


def dataset_sections(given: dict, lf: dict, base: str, rec: Record, model: str | None) -> dict:
    """corpus, tokenizer and data: the dataset through LLaMA-Factory's dataset_info.json where it can be expressed
    as one hub dataset or file of single-turn records, else the offline corpus, recorded."""
    tokenizer_name = model_hub_name(given.get("model_name_or_path"), model)
    sections = {"tokenizer": {"kind": "hub", "name": tokenizer_name}}
    block = positive_int(rec, "cutoff_len", lf["cutoff_len"])
    data = {"block_size": block}
    if "cutoff_len" in given:
        rec.mapped("cutoff_len", "data.block_size")
    packing = given.get("packing")
    if (packing if packing is not None else lf["stage"] == "pt"):
        if "packing" in given:
            rec.mapped("packing", "packed blocks of data.block_size tokens (how every corpus is tokenised)")
    else:
        rec.substituted(
            "packing",
            f"{'not set (false for sft)' if packing is None else packing}: samples packed into blocks of "
            "cutoff_len tokens, each kept apart (train.separate_documents: its own positions, no attention across) "
            "instead of one padded, truncated sample per row",
        )
    if "neat_packing" in given:
        rec.mapped("neat_packing", "train.separate_documents" if given["neat_packing"] else "plain packing")
    val = given.get("val_size", lf["val_size"])
    if isinstance(val, float) and 0 < val <= 0.5:
        data["val_fraction"] = val
        rec.mapped("val_size", "data.val_fraction")
    else:
        data["val_fraction"] = 0.05
        text = (
            f"{val!r}: 5 % of the documents held out (data.val_fraction 0.05) for the validation loss the pipeline "
            "measures before and after training"
        )
        if "val_size" in given:
            rec.substituted("val_size", text)
        else:
            rec.substituted("val_size", f"0 (LLaMA-Factory's default, no evaluation) -> {text.split(': ', 1)[1]}")
    for key in EVALUATION:
        if key in given:
            rec.substituted(key, f"{given[key]!r}: validation loss before and after training (train.eval_batches)")
    sections["data"] = data
    sections["corpus"] = corpus(given, lf, base, rec)
    if "template" in given:
        if sections["corpus"].get("hub", {}).get("kind") == "chat":
            rec.substituted(
                "template",
                f"{given['template']!r}: the tokenizer's own chat template renders each record instead of "
                "LLaMA-Factory's template of that name",
            )
        else:
            rec.not_applied("template", "the corpus is plain text")
    if "train_on_prompt" in given:
        if given["train_on_prompt"]:
            rec.substituted("train_on_prompt", "true: the loss is on the answers only (corpus kind chat)")
        else:
            rec.mapped("train_on_prompt", "corpus kind chat: the loss on the answers only")
    return sections


def model_hub_name(value, model: str | None) -> str | None:
    """The tokenizer LLaMA-Factory loads: the model's own (its hub id, or its directory)."""
    return model if model and ("/" in model or os.path.isabs(model)) else value


def corpus(given: dict, lf: dict, base: str, rec: Record) -> dict:
    fallback = {"source": "stdlib"}
    names = [n.strip() for n in str(given.get("dataset") or "").split(",") if n.strip()]
    if not names:
        rec.substituted("dataset", "none named: the offline corpus (this Python's standard library)")
        return fallback
    dataset_dir = given.get("dataset_dir", lf["dataset_dir"])
    info_path = next(
        (
            p
            for p in (os.path.join(root, dataset_dir, "dataset_info.json") for root in (base, os.getcwd()))
            if os.path.isfile(p)
        ),
        None,
    )
    if "dataset_dir" in given:
        rec.mapped("dataset_dir", "where dataset_info.json is read")
    if info_path is None:
        rec.substituted(
            "dataset",
            f"{given['dataset']!r}: no {dataset_dir}/dataset_info.json beside the YAML or here to say what it is; "
            "the offline corpus (this Python's standard library) instead",
        )
        return fallback
    try:
        info = json.loads(open(info_path).read())
    except ValueError as exc:
        rec.refuse("dataset", f"{info_path} is not JSON: {exc}")
        return fallback
    name = names[0]
    entry = info.get(name) if isinstance(info, dict) else None
    if not isinstance(entry, dict):
        rec.refuse("dataset", f"{name!r} is not in {info_path}")
        return fallback
    out, why = dataset_entry(entry, os.path.dirname(info_path), lf["stage"])
    if out is None:
        rec.substituted("dataset", f"{name!r} ({why}): the offline corpus (this Python's standard library) instead")
        return fallback
    extra = f"; only the first of {', '.join(names)}" if len(names) > 1 else ""
    notes = f"; {why}" if why else ""
    if extra or notes:
        rec.substituted("dataset", f"{name!r} -> corpus.hub {out['hub']['path']}{notes}{extra}")
    else:
        rec.mapped("dataset", f"corpus.hub ({out['hub']['path']}, through {info_path})")
    if given.get("max_samples") is not None:
        n = positive_int(rec, "max_samples", given["max_samples"])
        out["max_documents"] = n
        rec.mapped("max_samples", "corpus.max_documents")
    return out


def dataset_entry(entry: dict, root: str, stage: str) -> tuple[dict | None, str]:
    """A dataset_info.json entry as the corpus section ({source: hub, hub: {...}}), and what it leaves out; (None,
    why) where it is not expressible."""
    if entry.get("ranking"):
        return None, "preference pairs (ranking)"
    formatting = entry.get("formatting", "alpaca")
    if formatting != "alpaca":
        return None, f"{formatting} formatting: multi-turn conversations"
    if "columns" in entry:
        columns = {k: entry["columns"].get(k) for k in ("prompt", "query", "response", "history", "system")}
    else:
        columns = {"prompt": "instruction", "query": "input", "response": "output", "history": None, "system": None}
    left = []
    if "hf_hub_url" in entry:
        hub = {"path": entry["hf_hub_url"], "name": entry.get("subset"), "split": entry.get("split", "train")}
        if entry.get("folder"):
            left.append(f"folder {entry['folder']!r} not selected")
    elif "file_name" in entry:
        path = os.path.join(root, entry["file_name"])
        hub = {"path": "json", "name": None, "split": "train", "data_files": path}
    else:
        return None, "neither hf_hub_url nor file_name (ModelScope, a script or another hub)"
    if stage == "pt":
        hub.update(kind="text", text_field=columns["prompt"] or "text")
    else:
        if not (columns["prompt"] and columns["response"]):
            return None, "no prompt or response column"
        hub.update(kind="chat", prompt_field=columns["prompt"], response_field=columns["response"], system=None)
        for key in ("query", "history", "system"):
            if columns[key]:
                left.append(f"its {key} column ({columns[key]!r}) is not part of the conversation")
    out = {"source": "hub", "max_bytes": None, "max_documents": None, "hub": hub}
    if entry.get("num_samples"):
        out["max_documents"] = int(entry["num_samples"])
    return out, "; ".join(left)


def train_keys(given: dict, hf: dict, lf: dict, rec: Record) -> tuple[dict, int | None]:
    """The train keys of the Trainer's settings (precision and the schedule apart), and max_samples."""
    t = {}
    t["micro_batch_size"] = positive_int(rec, "per_device_train_batch_size", hf["per_device_train_batch_size"])
    t["grad_accum"] = positive_int(rec, "gradient_accumulation_steps", hf["gradient_accumulation_steps"])
    t["lr"] = float(hf["learning_rate"])
    t["weight_decay"] = float(hf["weight_decay"])
    t["betas"] = [float(hf["adam_beta1"]), float(hf["adam_beta2"])]
    t["eps"] = float(hf["adam_epsilon"])
    t["grad_clip"] = float(hf["max_grad_norm"])
    t["seed"] = int(hf["seed"])
    t["log_every"] = positive_int(rec, "logging_steps", hf["logging_steps"])
    t["checkpoint_every"] = 0
    t["separate_documents"] = not packed_together(given, lf)
    t["max_train_samples"] = None
    for key, where in (
        ("per_device_train_batch_size", "train.micro_batch_size"),
        ("gradient_accumulation_steps", "train.grad_accum"),
        ("learning_rate", "train.lr"),
        ("weight_decay", "train.weight_decay"),
        ("adam_beta1", "train.betas[0]"),
        ("adam_beta2", "train.betas[1]"),
        ("adam_epsilon", "train.eps"),
        ("max_grad_norm", "train.grad_clip"),
        ("seed", "train.seed"),
        ("logging_steps", "train.log_every"),
    ):
        if key in given:
            rec.mapped(key, where)
    epochs = float(hf["num_train_epochs"])
    t["epochs"] = max(1, ceil_int(epochs))
    if "num_train_epochs" in given:
        if epochs.is_integer() and epochs >= 1:
            rec.mapped("num_train_epochs", "train.epochs")
        else:
            rec.substituted("num_train_epochs", f"{epochs}: {t['epochs']} whole epochs (train.epochs is an integer)")
    steps = integral(hf["max_steps"])
    t["max_steps"] = steps if isinstance(steps, int) and steps > 0 else None
    if "max_steps" in given:
        rec.mapped("max_steps", "train.max_steps" if t["max_steps"] else "train.max_steps: null (epochs decide)")
    optim = hf["optim"]
    if optim in ADAMW:
        if "optim" in given:
            rec.mapped("optim", "torch AdamW (fused on a GPU), the optimizer of every strategy")
    else:
        rec.substituted("optim", f"{optim!r}: torch AdamW, the one optimizer of every strategy (fairness)")
    checkpointing = not lf["disable_gradient_checkpointing"] or bool(given.get("gradient_checkpointing"))
    t["gradient_checkpointing"] = checkpointing
    for key in ("disable_gradient_checkpointing", "gradient_checkpointing"):
        if key in given:
            rec.mapped(key, f"train.gradient_checkpointing: {str(checkpointing).lower()}")
    if "use_reentrant_gc" in given:
        rec.not_applied("use_reentrant_gc", "reentrant or not, the same recomputation")
    attn = lf["flash_attn"]
    if attn in ATTENTION:
        t["attn_implementation"] = ATTENTION[attn]
        if "flash_attn" in given:
            rec.mapped("flash_attn", f"train.attn_implementation: {ATTENTION[attn]}")
    else:
        rec.refuse("flash_attn", f"{attn!r}: not one of {', '.join(ATTENTION)}")
    compiled = boolean(rec, "torch_compile", hf["torch_compile"])
    t.update(compile_model=compiled, compile_blocks=False, compile_loss=False)
    if "torch_compile" in given:
        rec.mapped("torch_compile", f"train.compile_model: {str(compiled).lower()} (the whole model, once)")
    if lf["enable_liger_kernel"]:
        rec.substituted(
            "enable_liger_kernel", "true: the model's own modules and loss; Liger's fused kernels are not used"
        )
    elif "enable_liger_kernel" in given:
        rec.mapped("enable_liger_kernel", "the model's own modules and loss")
    return t, given.get("max_samples")


def precision(given: dict, hf: dict, lf: dict, rec: Record) -> tuple[str, str]:
    """The policy of a run without DeepSpeed or FSDP: the Trainer's bf16 autocasts (bf16-mixed); a strategy file
    decides its own."""
    bf16, fp16, pure = (
        boolean(rec, k, v) for k, v in (("bf16", hf["bf16"]), ("fp16", hf["fp16"]), ("pure_bf16", lf["pure_bf16"]))
    )
    if pure:
        rec.substituted(
            "pure_bf16",
            "true: bf16-pure (bf16 parameters, fp32 master weights and optimizer states) instead of "
            "bf16 weights and optimizer states without fp32 masters",
        )
        return "bf16-pure", "pure_bf16"
    if bf16 and fp16:
        rec.refuse("fp16", "bf16 and fp16 both true")
    if fp16:
        rec.substituted("fp16", "true: bf16 autocast (bf16-mixed) instead of fp16 autocast with loss scaling")
        return "bf16-mixed", "fp16"
    if "bf16" in given:
        rec.mapped("bf16", "train.precision (bf16-mixed: autocast; DeepSpeed's bf16 mode with a DeepSpeed JSON)")
    if "fp16" in given and not fp16:
        rec.mapped("fp16", "no fp16")
    return ("bf16-mixed", "bf16 autocast") if bf16 else ("fp32", "no bf16 or fp16")


def trackers(given: dict, rec: Record) -> list:
    value = given.get("report_to", "none")
    names = [value] if isinstance(value, str) else list(value or [])
    names = [n for n in names if n not in ("none", None)]
    out, other = [], []
    for n in names:
        (out if n in TRACKERS else other).append(TRACKERS.get(n, n))
    if other:
        rec.substituted("report_to", f"{', '.join(other)}: not logged (trackers: tensorboard, wandb, mlflow)")
    elif "report_to" in given:
        rec.mapped("report_to", f"trackers: [{', '.join(out)}]")
    return out


def ddp_strategy(given: dict, train: dict, rec: Record) -> tuple[str, dict]:
    """The Trainer's DistributedDataParallel: torch's defaults (ddp) unless the YAML sets its bucket or asks for
    unused parameters (then ddp_overlap with exactly the Trainer's keyword arguments). The Trainer's
    find_unused_parameters, where not given, is `not gradient checkpointing`."""
    unused = given.get("ddp_find_unused_parameters")
    if unused is None:
        unused = not train["gradient_checkpointing"]
    else:
        rec.mapped("ddp_find_unused_parameters", "DDP find_unused_parameters")
    bucket = given.get("ddp_bucket_cap_mb")
    if "ddp_broadcast_buffers" in given:
        if given["ddp_broadcast_buffers"] is False:
            rec.substituted("ddp_broadcast_buffers", "false: DDP broadcasts buffers (torch's default)")
        else:
            rec.mapped("ddp_broadcast_buffers", "DDP broadcast_buffers (torch's default)")
    if bucket is None and not unused:
        return "ddp", {}
    if bucket is not None:
        rec.mapped("ddp_bucket_cap_mb", "strategy_options.ddp_overlap.bucket_cap_mb")
    options = {
        "bucket_cap_mb": integral(bucket) if bucket is not None else 25,
        "gradient_as_bucket_view": False,
        "static_graph": False,
        "find_unused_parameters": bool(unused),
    }
    return "ddp_overlap", options


def deepspeed_path(value, base: str, rec: Record) -> str | None:
    if not isinstance(value, str) or not value:
        rec.refuse("deepspeed", f"{value!r} is not a path to a DeepSpeed JSON")
        return None
    for root in (base, os.getcwd()):
        path = os.path.normpath(os.path.join(root, os.path.expanduser(value)))
        if os.path.isfile(path):
            rec.mapped("deepspeed", f"{path}: the strategy and its options")
            return path
    rec.refuse("deepspeed", f"{value!r} is not a file beside the YAML or here")
    return None


def warmup(hf: dict, given: dict, rec: Record, total: int | None, total_why: str) -> int | None:
    """The Trainer's warmup steps: warmup_steps (>= 1), else the ratio (warmup_ratio, or a warmup_steps below 1)
    of the original's optimizer steps, where they are known. None where they are not."""
    ratio = hf["warmup_ratio"]
    steps = hf["warmup_steps"] or 0
    key = "warmup_ratio" if ratio else "warmup_steps"
    if not ratio and steps >= 1:
        if "warmup_steps" in given:
            rec.mapped("warmup_steps", "train.lr_warmup_steps")
        return int(steps)
    ratio = ratio if ratio else steps
    if not ratio:
        if "warmup_steps" in given:
            rec.mapped("warmup_steps", "train.lr_warmup_steps: 0")
        return 0
    if total is None:
        return None
    out = math.ceil(total * float(ratio))
    rec.mapped(key, f"train.lr_warmup_steps: {out} ({ratio} of the original's {total} steps: {total_why})")
    return out


def original_steps(t: Training, world: int) -> tuple[int | None, str]:
    """The original's optimizer steps: max_steps, else num_train_epochs x its steps per epoch where max_samples
    bounds its samples (assuming the dataset holds that many), as the Trainer counts them. (None, why) otherwise."""
    hf = t.hf
    if t.train.get("max_steps"):
        return t.train["max_steps"], "max_steps"
    if not t.samples:
        return None, "neither max_steps nor max_samples"
    samples = t.samples
    val = t.sections.get("data", {}).get("val_fraction") if "val_size" in t.record.notes else None
    if val and t.record.notes["val_size"][0] == "mapped":
        samples = samples - math.ceil(samples * val)
    micro, accum = t.train["micro_batch_size"], t.train["grad_accum"]
    batches = math.ceil(math.ceil(samples / world) / micro)
    per_epoch = max(1, batches // accum + int(batches % accum > 0))
    total = math.ceil(float(hf["num_train_epochs"]) * per_epoch)
    return total, f"{hf['num_train_epochs']} epochs of {per_epoch} steps, max_samples {t.samples} over {world} ranks"


def schedule(t: Training, world: int, rec: Record) -> dict:
    """min_lr and lr_warmup_steps of the Trainer's lr_scheduler_type. The loop warms up linearly, then decays by
    a cosine to min_lr: cosine (to 0), cosine_with_min_lr and the constant schedules (min_lr = lr) are that;
    another shape is a substitution."""
    hf, given = t.hf, t.given
    total, why = original_steps(t, world)
    kind = hf["lr_scheduler_type"]
    kwargs = hf["lr_scheduler_kwargs"] or {}
    lr = t.train["lr"]
    out = {}
    steps = warmup(hf, given, rec, total, why)
    if kind == "constant":
        out["min_lr"], steps = lr, 0
        for key in ("warmup_ratio", "warmup_steps"):
            if key in given:
                rec.not_applied(key, "the constant schedule has no warm-up")
    elif kind == "constant_with_warmup":
        out["min_lr"] = lr
    elif kind == "cosine":
        out["min_lr"] = 0.0
    elif kind == "cosine_with_min_lr" and ("min_lr" in kwargs or "min_lr_rate" in kwargs):
        out["min_lr"] = float(kwargs["min_lr"]) if "min_lr" in kwargs else tidy(lr * float(kwargs["min_lr_rate"]))
        rec.mapped("lr_scheduler_kwargs", "train.min_lr")
    else:
        out["min_lr"] = 0.0
        rec.substituted(
            "lr_scheduler_type",
            f"{kind}{' (the Trainer default)' if 'lr_scheduler_type' not in given else ''}: linear warm-up, then "
            "cosine decay to 0 (the loop's one schedule)",
        )
    if "lr_scheduler_type" in given and rec.notes.get("lr_scheduler_type", ("",))[0] != "substituted":
        rec.mapped("lr_scheduler_type", f"train.min_lr: {out['min_lr']} (the loop's warm-up + cosine)")
    if "lr_scheduler_kwargs" in given and "lr_scheduler_kwargs" not in rec.notes:
        rec.substituted("lr_scheduler_kwargs", f"{kwargs!r}: not read by the loop's schedule")
    if steps is None:
        steps = 5
        key = "warmup_ratio" if hf["warmup_ratio"] else "warmup_steps"
        rec.substituted(
            key,
            f"{hf[key]}: a share of the original's steps, which the files do not fix ({why}): lr_warmup_steps 5 "
            "(the schema's default)",
        )
    out["lr_warmup_steps"] = steps
    return out
