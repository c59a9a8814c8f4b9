"""A DeepSpeed JSON read into the study's terms: its ZeRO stage and offload devices pick a named strategy (zero0 ...
zero3_offload, zero_infinity, zeropp: training/strategies/), its other zero_optimization keys and DeepSpeed's
top-level communication keys become that strategy's `strategy_options`, and its batch, clipping, precision,
optimizer and scheduler sections become `train` keys.

"auto" values are resolved as the Hugging Face Trainer resolves them from the training settings imported beside the
JSON (a LLaMA-Factory YAML: `hf`, the Trainer's values with its defaults): the batch keys, gradient_clipping, the
optimizer's params, bf16/fp16 enabled, and from the model's hidden size reduce_bucket_size = hidden^2 and, at stage
3, stage3_prefetch_bucket_size = 0.9 hidden^2 and stage3_param_persistence_threshold = 10 hidden. A value that is
not "auto" and disagrees with the Trainer's is refused, as the Trainer refuses it. A JSON imported without training
settings keeps its numbers and has its "auto" values refused (nothing to fill them from).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from workflow_scripts.importers.common import Record, integral, tidy

KIND = "DeepSpeed JSON"
BATCH = (
    ("train_micro_batch_size_per_gpu", "per_device_train_batch_size", "micro_batch_size"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps", "grad_accum"),
    ("gradient_clipping", "max_grad_norm", "grad_clip"),
)
OPTIMIZER = (
    ("lr", "learning_rate", "lr"),
    ("eps", "adam_epsilon", "eps"),
    ("weight_decay", "weight_decay", "weight_decay"),
)
# DeepSpeed's top-level keys a ZeRO strategy takes as options (strategies/_deepspeed.TOP_LEVEL_KEYS)
OPTION_KEYS = ("communication_data_type", "prescale_gradients", "gradient_predivide_factor", "aio")
NOT_APPLIED = {
    "steps_per_print": "DeepSpeed's log interval",
    "wall_clock_breakdown": "DeepSpeed's timing log",
    "dump_state": "DeepSpeed's config dump",
    "flops_profiler": "DeepSpeed's profiler",
    "tensorboard": "DeepSpeed's monitor",
    "wandb": "DeepSpeed's monitor",
    "csv_monitor": "DeepSpeed's monitor",
    "comms_logger": "DeepSpeed's communication log",
    "checkpoint": "how DeepSpeed saved checkpoints",
    "activation_checkpointing": "DeepSpeed's own checkpointing API, which the Trainer's models never call",
}
HIDDEN_AUTO = {
    "reduce_bucket_size": (lambda h: h * h, "hidden^2", False),
    "stage3_prefetch_bucket_size": (lambda h: int(0.9 * h * h), "0.9 x hidden^2", True),
    "stage3_param_persistence_threshold": (lambda h: 10 * h, "10 x hidden", True),
}
QUANTIZED = ("zero_quantized_weights", "zero_quantized_gradients", "zero_hpz_partition_size")
KNOWN = {
    *(b[0] for b in BATCH),
    "train_batch_size",
    "zero_optimization",
    "bf16",
    "bfloat16",
    "fp16",
    "optimizer",
    "scheduler",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "timers",
    *OPTION_KEYS,
    *NOT_APPLIED,
}
FP16_KEYS = (
    "enabled",
    "auto_cast",
    "loss_scale",
    "loss_scale_window",
    "initial_scale_power",
    "hysteresis",
    "consecutive_hysteresis",
    "min_loss_scale",
    "fp16_master_weights_and_grads",
)


@dataclass
class Result:
    """What a DeepSpeed JSON decides of its runs."""

    strategy: str | None = None
    options: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)  # train keys it sets (a JSON without training settings: its numbers)
    precision: str = "fp32"
    precision_why: str = ""
    world_size: int | None = None
    schedule: dict | None = None  # min_lr / lr_warmup_steps of its scheduler section; None: the Trainer's


def load(path: str, rec: Record) -> dict:
    try:
        data = json.loads(open(path).read())
    except ValueError as exc:
        rec.refuse("", f"not JSON: {exc}")
        return {}
    if not isinstance(data, dict):
        rec.refuse("", "not a JSON object")
        return {}
    return data


def _auto(value) -> bool:
    return isinstance(value, str) and value.lower() == "auto"


class Filler:
    """Fills one JSON's "auto" values from the Trainer's settings, checks its numbers against them."""

    def __init__(self, rec: Record, hf: dict | None, train: dict, study_wins: bool = False):
        self.rec, self.hf, self.train = rec, hf, train
        self.study_wins = study_wins  # a study's strategy file: a number unlike the study's is overridden, said
        self.sets: dict = {}  # train keys the JSON itself sets (no training settings beside it)
        self.unfilled: list = []  # "auto" keys without training settings to fill them from

    def refuse_unfilled(self) -> None:
        if self.unfilled:
            self.rec.refuse(
                ", ".join(self.unfilled),
                "'auto' with no training settings to fill it from (import the LLaMA-Factory YAML with the JSON)",
            )

    def value(self, key: str, value, hf_key: str, ours: str, hf_value=None):
        """The value as the run has it: "auto" -> the Trainer's; a number -> checked against the Trainer's, or
        the run's own where no training settings came with the JSON."""
        if self.hf is not None:
            want = self.hf[hf_key] if hf_value is None else hf_value
        if _auto(value):
            if self.hf is None:
                self.unfilled.append(key)
                return None
            self.rec.mapped(key, f"train.{ours} (the Trainer's {hf_key}: {want})")
            return want
        if self.hf is not None:
            if value != want and self.study_wins:
                self.rec.substituted(key, f"{value!r}: the study's {want!r} (train.{ours}: one batch contract, "
                                          "optimizer and precision policy for every strategy of a study)")
            elif value != want:
                self.rec.refuse(
                    key,
                    f"{value!r}, but the Trainer's {hf_key} is {want!r} (the Trainer refuses the "
                    "mismatch; set it to auto)",
                )
            else:
                self.rec.mapped(key, f"train.{ours} (equal to the Trainer's {hf_key})")
            return value
        self.sets[ours] = value
        self.rec.mapped(key, f"train.{ours}")
        return value


def read(
    cfg: dict, rec: Record, hf: dict | None, train: dict, hidden: tuple, world: int | None, prefix: str = "",
    study_wins: bool = False,
) -> Result:
    """The JSON `cfg` (as loaded) against the training settings: `hf` (the Trainer's values, None without a
    training file), `train` (the study's train keys so far), `hidden` ((size or None, where it was read)),
    `world` (the world size, where known); `study_wins`: a study's strategy file, whose numbers that differ from
    the study's are recorded as overridden instead of refused (study_strategies)."""
    out = Result()
    rec.check_known(cfg, KNOWN, prefix)
    fill = Filler(rec, hf, train, study_wins)
    for key, why in NOT_APPLIED.items():
        if key in cfg:
            rec.not_applied(prefix + key, why)
    micro = train.get("micro_batch_size")
    accum = train.get("grad_accum")
    for key, hf_key, ours in BATCH:
        if key in cfg:
            value = fill.value(prefix + key, integral(cfg[key]), hf_key, ours)
            micro = value if ours == "micro_batch_size" and value else micro
            accum = value if ours == "grad_accum" and value else accum
    if "train_batch_size" in cfg:
        out.world_size = batch_world(cfg["train_batch_size"], micro, accum, world, rec, prefix, hf)
        if _auto(cfg["train_batch_size"]) and hf is None:
            fill.unfilled.append(prefix + "train_batch_size")
    out.precision, out.precision_why = precision(cfg, fill, rec, prefix)
    zero = cfg.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        rec.refuse(prefix + "zero_optimization", "not a mapping")
        zero = {}
    out.strategy, options = strategy(zero, cfg, rec, hidden, prefix)
    out.options = options
    bf16 = cfg.get("bf16", cfg.get("bfloat16")) or {}
    if isinstance(bf16, dict) and "check_grad_overflow" in bf16:
        out.options["check_grad_overflow"] = bf16["check_grad_overflow"]
        rec.mapped(f"{prefix}bf16.check_grad_overflow", f"strategy_options.{out.strategy}.check_grad_overflow")
    offloads = bool(zero.get("offload_optimizer", {}).get("device", "none") not in ("none", None))
    optimizer(cfg.get("optimizer"), fill, rec, prefix, offloads)
    if "scheduler" in cfg:
        out.schedule = scheduler(cfg["scheduler"], fill, rec, prefix, train)
    for key in ("zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"):
        if key in cfg:
            if cfg[key] is True:
                rec.mapped(prefix + key, "true, as the strategies set it")
            else:
                rec.substituted(prefix + key, f"{cfg[key]!r}: true, as the strategies set it")
    if "timers" in cfg:
        rec.substituted(prefix + "timers", f"{cfg['timers']!r}: DeepSpeed's default timers")
    out.train = fill.sets
    fill.refuse_unfilled()
    if out.strategy:
        check_options(out.strategy, out.options, rec, prefix)
    return out


def batch_world(value, micro, accum, world, rec: Record, prefix: str, hf) -> int | None:
    key = prefix + "train_batch_size"
    if _auto(value):
        if hf is None:
            return None
        else:
            rec.mapped(key, "micro-batch x accumulation x world size, as the strategies compute it")
        return None
    value = integral(value)
    if not isinstance(value, int) or not micro or not accum:
        rec.refuse(key, f"{value!r}: not an integer, or the micro-batch and accumulation are unknown")
        return None
    if world is not None:
        if value != micro * accum * world:
            rec.refuse(key, f"{value} is not micro-batch {micro} x accumulation {accum} x world size {world}")
        else:
            rec.mapped(key, "micro-batch x accumulation x world size")
        return None
    if value % (micro * accum):
        rec.refuse(key, f"{value} is not a multiple of micro-batch {micro} x accumulation {accum}")
        return None
    rec.mapped(key, f"world_sizes: [{value // (micro * accum)}] (train_batch_size / micro-batch / accumulation)")
    return value // (micro * accum)


def precision(cfg: dict, fill: Filler, rec: Record, prefix: str) -> tuple[str, str]:
    """DeepSpeed's bf16 mode is bf16-pure (bf16 parameters, fp32 master weights in the ZeRO optimizer); fp16 has
    no policy here and becomes bf16-pure, recorded."""
    on = {}
    for name, hf_key in (("bf16", "bf16"), ("fp16", "fp16")):
        key = "bfloat16" if name == "bf16" and "bfloat16" in cfg and "bf16" not in cfg else name
        section = cfg.get(key)
        if section is None:
            on[name] = False
            continue
        if not isinstance(section, dict):
            rec.refuse(prefix + key, "not a mapping")
            on[name] = False
            continue
        enabled = section.get("enabled", False)
        value = fill.value(f"{prefix}{key}.enabled", enabled, hf_key, "precision") if "enabled" in section else False
        fill.sets.pop("precision", None)
        on[name] = bool(value) and not _auto(value)
        if name == "bf16":
            rec.check_known(section, ("enabled", "check_grad_overflow"), f"{prefix}{key}.")
        else:
            rec.check_known(section, FP16_KEYS, f"{prefix}{key}.")
            for k in section:
                if k != "enabled":
                    if on[name]:
                        rec.substituted(f"{prefix}fp16.{k}", "no loss scaling (bf16, fp16 above)")
                    else:
                        rec.not_applied(f"{prefix}fp16.{k}", "fp16 is off")
    if on["bf16"] and on["fp16"]:
        rec.refuse(prefix + "fp16.enabled", "bf16 and fp16 both enabled")
    if on["fp16"]:
        rec.substituted(
            prefix + "fp16.enabled",
            "true: DeepSpeed's bf16 mode (bf16-pure) instead of fp16 with loss scaling (no fp16 policy here)",
        )
        return "bf16-pure", "DeepSpeed fp16"
    if on["bf16"]:
        return "bf16-pure", "DeepSpeed's bf16 mode"
    return "fp32", "DeepSpeed without bf16 or fp16"


def strategy(zero: dict, cfg: dict, rec: Record, hidden: tuple, prefix: str) -> tuple[str | None, dict]:
    """The named strategy of the stage and offload devices, and its options: the JSON's other zero keys (auto
    resolved) and its top-level communication keys."""
    where = prefix + "zero_optimization"
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        rec.refuse(f"{where}.stage", f"{stage!r} is not 0, 1, 2 or 3")
        return None, {}
    devices = {}
    for part in ("offload_optimizer", "offload_param"):
        section = zero.get(part) or {}
        if not isinstance(section, dict):
            rec.refuse(f"{where}.{part}", "not a mapping")
            section = {}
        devices[part] = section.get("device", "none") or "none"
    opt, par = devices["offload_optimizer"], devices["offload_param"]
    quantized = any(zero.get(k) for k in QUANTIZED)
    name, why = None, None
    if stage < 2 and (opt != "none" or par != "none"):
        why = f"offload at stage {stage}: no strategy offloads below stage 2"
    elif stage in (0, 1):
        name = f"zero{stage}"
    elif stage == 2:
        if par != "none":
            why = "offload_param at stage 2: DeepSpeed offloads parameters at stage 3 only"
        elif opt == "nvme":
            why = "offload_optimizer nvme at stage 2: DeepSpeed silently means cpu there; use stage 3 (zero_infinity)"
        elif opt == "cpu":
            name = "zero2_offload"
        else:
            name = "zero2_compress" if "communication_data_type" in cfg else "zero2"
    elif quantized:
        name = "zeropp" if opt == par == "none" else None
        why = None if name else "ZeRO++ quantization with offload: no strategy combines them"
    elif (opt, par) == ("none", "none"):
        name = "zero3"
    elif (opt, par) == ("cpu", "cpu"):
        name = "zero3_offload"
    elif (opt, par) == ("nvme", "nvme"):
        name = "zero_infinity"
    else:
        why = f"offload_optimizer {opt} with offload_param {par} at stage 3: no strategy offloads them apart"
    if name is None:
        rec.refuse(where, why)
        return None, {}
    rec.mapped(f"{where}.stage", f"strategies: [{name}]")
    options = {}
    for part in ("offload_optimizer", "offload_param"):
        if part in zero:
            offload(zero[part], devices[part], name, options, rec, f"{where}.{part}")
    for key, value in zero.items():
        if key in ("stage", "offload_optimizer", "offload_param"):
            continue
        if _auto(value):
            value = auto_zero(key, stage, hidden, rec, f"{where}.{key}")
            if value is None:
                continue
        else:
            rec.mapped(f"{where}.{key}", f"strategy_options.{name}.{key}")
        options[key] = integral(value)
    for key in OPTION_KEYS:
        if key in cfg:
            options[key] = cfg[key]
            rec.mapped(prefix + key, f"strategy_options.{name}.{key}")
    return name, options


def offload(section: dict, device: str, name: str, options: dict, rec: Record, where: str) -> None:
    """The strategy's own offload section holds the device (and pins host memory on a GPU); the JSON's other
    offload keys are DeepSpeed's defaults there; zero_infinity takes the NVMe path as its option."""
    if device == "none":
        for key in section:
            rec.mapped(f"{where}.{key}", "no offload") if key == "device" else rec.not_applied(
                f"{where}.{key}", "nothing is offloaded"
            )
        return
    for key, value in section.items():
        if key == "device":
            rec.mapped(f"{where}.device", f"strategies: [{name}] ({value})")
        elif key == "pin_memory":
            if value is True:
                rec.mapped(f"{where}.pin_memory", "pinned host memory on a GPU, as the strategy sets it")
            else:
                rec.substituted(
                    f"{where}.pin_memory", f"{value!r}: pinned host memory on a GPU, as the strategy sets it"
                )
        elif key == "nvme_path" and name == "zero_infinity":
            if options.get("nvme_path", value) != value:
                rec.refuse(f"{where}.nvme_path", "differs between offload_optimizer and offload_param")
            options["nvme_path"] = value
            rec.mapped(f"{where}.nvme_path", "strategy_options.zero_infinity.nvme_path")
        else:
            rec.substituted(f"{where}.{key}", f"{value!r}: DeepSpeed's default (the strategy's own offload section)")
    if "pin_memory" not in section:
        rec.substituted(
            f"{where}.pin_memory", "not set (DeepSpeed: false): pinned host memory on a GPU, as the strategy sets it"
        )


def auto_zero(key: str, stage: int, hidden: tuple, rec: Record, where: str):
    """A zero key's "auto" as the Trainer fills it from the model's hidden size; None (recorded) where it cannot."""
    if key not in HIDDEN_AUTO:
        rec.refuse(where, "'auto': the Trainer fills no value for it")
        return None
    formula, text, stage3_only = HIDDEN_AUTO[key]
    if stage3_only and stage != 3:
        rec.refuse(
            where, f"'auto' at stage {stage}: the Trainer fills it at stage 3 only, and DeepSpeed refuses the string"
        )
        return None
    size, source = hidden
    if size is None:
        rec.substituted(
            where,
            f"'auto': DeepSpeed's default; the Trainer's {text} needs the model's hidden size, "
            f"which is unknown here ({source})",
        )
        return None
    rec.mapped(where, f"{formula(size)} ({text}, hidden {size} from {source})")
    return formula(size)


def optimizer(section, fill: Filler, rec: Record, prefix: str, offloads: bool) -> None:
    """The optimizer section's params are the train keys (the Trainer's where "auto"); its type is AdamW."""
    if section is None:
        return
    where = prefix + "optimizer"
    if not isinstance(section, dict):
        rec.refuse(where, "not a mapping")
        return
    rec.check_known(section, ("type", "params"), f"{where}.")
    kind = str(section.get("type", ""))
    params = section.get("params") or {}
    rec.check_known(params, ("lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam"), f"{where}.params.")
    if kind.lower() in ("adamw", "adam") and params.get("adam_w_mode", True):
        if offloads:
            rec.mapped(f"{where}.type", "DeepSpeedCPUAdam (AdamW mode), as the offload strategies build it")
        else:
            rec.substituted(
                f"{where}.type",
                f"{kind}: torch AdamW (the one optimizer of every strategy) instead of DeepSpeed's fused Adam, the "
                "same update",
            )
    else:
        rec.substituted(f"{where}.type", f"{kind}: torch AdamW, the one optimizer of every strategy (fairness)")
    for key in ("adam_w_mode", "torch_adam"):
        if key in params:
            rec.not_applied(f"{where}.params.{key}", "the optimizer is AdamW (type above)")
    for key, hf_key, ours in OPTIMIZER:
        if key in params:
            fill.value(f"{where}.params.{key}", params[key], hf_key, ours)
    if "betas" in params:
        hf = fill.hf
        want = [hf["adam_beta1"], hf["adam_beta2"]] if hf is not None else None
        value = params["betas"]
        fill.value(
            f"{where}.params.betas", value if _auto(value) else [float(b) for b in value], "adam_beta1+2", "betas", want
        )


def scheduler(section, fill: Filler, rec: Record, prefix: str, train: dict) -> dict | None:
    """DeepSpeed's scheduler, which replaces the Trainer's lr_scheduler_type: min_lr and the warm-up steps of the
    loop's warm-up + cosine that it is, or the closest, recorded. lr_warmup_steps is left to the Trainer's warm-up
    where warmup_num_steps is "auto"."""
    where = prefix + "scheduler"
    if not isinstance(section, dict):
        rec.refuse(where, "not a mapping")
        return None
    rec.check_known(section, ("type", "params"), f"{where}.")
    kind = section.get("type")
    params = section.get("params") or {}
    known = (
        "warmup_min_lr",
        "warmup_max_lr",
        "warmup_num_steps",
        "warmup_type",
        "total_num_steps",
        "warmup_min_ratio",
        "cos_min_ratio",
        "last_batch_iteration",
    )
    rec.check_known(params, known, f"{where}.params.")
    lr = fill.sets.get("lr", train.get("lr")) if fill.hf is None else fill.hf["learning_rate"]
    out = {}
    if "warmup_max_lr" in params:
        got = fill.value(f"{where}.params.warmup_max_lr", params["warmup_max_lr"], "learning_rate", "lr")
        lr = got if got is not None else lr
    if "warmup_min_lr" in params:
        value = params["warmup_min_lr"]
        if _auto(value) or value == 0:
            rec.mapped(f"{where}.params.warmup_min_lr", "the warm-up starts near 0")
        else:
            rec.substituted(f"{where}.params.warmup_min_lr", f"{value}: the warm-up starts near 0")
    if "warmup_min_ratio" in params:
        value = params["warmup_min_ratio"]
        (rec.mapped if value == 0 else rec.substituted)(f"{where}.params.warmup_min_ratio", "the warm-up starts near 0")
    if kind == "WarmupLR":
        out["min_lr"] = lr
        rec.mapped(f"{where}.type", "train.min_lr = lr: warm-up, then constant")
    elif kind == "WarmupCosineLR":
        ratio = float(params.get("cos_min_ratio", 0.0001))
        out["min_lr"] = tidy(lr * ratio) if lr is not None else None
        rec.mapped(f"{where}.type", "warm-up, then cosine")
        if "cos_min_ratio" in params:
            rec.mapped(f"{where}.params.cos_min_ratio", "train.min_lr = lr x cos_min_ratio")
    else:
        out["min_lr"] = 0.0
        rec.substituted(f"{where}.type", f"{kind}: linear warm-up, then cosine decay to 0 (the loop's one schedule)")
    if kind in ("WarmupLR", "WarmupCosineLR", "WarmupDecayLR"):
        warm = params.get("warmup_type", "log")
        if warm == "linear":
            rec.mapped(f"{where}.params.warmup_type", "linear warm-up")
        else:
            rec.substituted(
                f"{where}.params.warmup_type",
                f"{warm}{'' if 'warmup_type' in params else ' (default)'}: a linear warm-up",
            )
    steps = params.get("warmup_num_steps")
    if steps is not None and not _auto(steps):
        out["lr_warmup_steps"] = int(steps)
        rec.mapped(f"{where}.params.warmup_num_steps", "train.lr_warmup_steps")
    elif steps is not None:
        rec.mapped(f"{where}.params.warmup_num_steps", "train.lr_warmup_steps (the Trainer's warm-up)")
    total = params.get("total_num_steps")
    if total is not None:
        if _auto(total):
            rec.mapped(f"{where}.params.total_num_steps", "the run's steps")
        elif train.get("max_steps") not in (None, int(total)) and fill.hf is not None:
            rec.refuse(f"{where}.params.total_num_steps", f"{total}, but the run has {train['max_steps']} steps")
        else:
            fill.sets.setdefault("max_steps", int(total)) if fill.hf is None else None
            rec.mapped(f"{where}.params.total_num_steps", "the run's steps")
    if "last_batch_iteration" in params:
        rec.not_applied(f"{where}.params.last_batch_iteration", "a resumed schedule's position")
    return out


def check_options(name: str, options: dict, rec: Record, prefix: str) -> None:
    """The options as the study's check will see them: DeepSpeed's own config models (config_check)."""
    from workflow_scripts import config_check
    from workflow_scripts.training.strategies import STRATEGIES

    for line in config_check.option_problems(STRATEGIES[name], options):
        rec.refuse("", f"{line} (from {prefix or 'this JSON'})")
