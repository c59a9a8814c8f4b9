"""An accelerate config YAML (`accelerate launch --config_file FILE`) read into the study's terms: its
distributed_type picks the strategy family (DEEPSPEED: a ZeRO strategy, from its deepspeed_config_file or its inline
keys through importers.deepspeed_json; FSDP: fsdp, FSDP2, with its fsdp_config as options; MULTI_GPU / NO: ddp), its
mixed_precision the policy, num_processes the world size, num_machines the nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from workflow_scripts.importers.common import Record, boolean, positive_int

KIND = "accelerate config YAML"
NOT_APPLIED = {
    k: "how the original was launched"
    for k in (
        "compute_environment",
        "debug",
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "rdzv_backend",
        "same_network",
        "main_training_function",
        "gpu_ids",
        "enable_cpu_affinity",
        "downcast_bf16",
        "tpu_env",
        "tpu_use_cluster",
        "tpu_use_sudo",
        "tpu_name",
        "tpu_zone",
        "tpu_vm",
        "command_file",
        "commands",
        "mpirun_config",
        "ipex_config",
    )
}
REFUSED = {
    "parallelism_config": "accelerate's N-D parallelism: write the layout as `layouts` instead",
    "megatron_lm_config": "Megatron-LM has no counterpart",
}
KNOWN = {
    *NOT_APPLIED,
    *REFUSED,
    "distributed_type",
    "mixed_precision",
    "use_cpu",
    "num_processes",
    "num_machines",
    "deepspeed_config",
    "fsdp_config",
    "dynamo_config",
}
DS_LAUNCH = (
    "deepspeed_multinode_launcher",
    "deepspeed_hostfile",
    "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter",
    "zero3_init_flag",
    "zero3_save_16bit_model",
    "deepspeed_moe_layer_cls_names",
)
DS_INLINE = (
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_optimizer_nvme_path",
    "offload_param_nvme_path",
    "gradient_accumulation_steps",
    "gradient_clipping",
)
FSDP_NOT_APPLIED = (
    "fsdp_state_dict_type",
    "fsdp_cpu_ram_efficient_loading",
    "fsdp_sync_module_states",
    "fsdp_use_orig_params",
)
FSDP_KNOWN = (
    *FSDP_NOT_APPLIED,
    "fsdp_version",
    "fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params",
    "fsdp_reshard_after_forward",
    "fsdp_sharding_strategy",
    "fsdp_offload_params",
    "fsdp_activation_checkpointing",
    "fsdp_forward_prefetch",
    "fsdp_backward_prefetch",
)
RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, True: True, False: False, "true": True, "false": False}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def looks_like(data: dict) -> bool:
    return isinstance(data, dict) and ("distributed_type" in data or "compute_environment" in data)


@dataclass
class Launch:
    """What an accelerate config says of its runs."""

    path: str
    record: Record
    family: str = "ddp"  # ddp | fsdp | deepspeed
    deepspeed_file: str | None = None
    deepspeed_inline: dict | None = None  # its inline keys as a DeepSpeed JSON
    options: dict = field(default_factory=dict)  # fsdp's
    mixed: str = "no"
    world_size: int | None = None
    nodes: int | None = None
    platform: str | None = None
    train: dict = field(default_factory=dict)


def read(path: str, data: dict, rec: Record) -> Launch:
    out = Launch(path, rec)
    rec.check_known(data, KNOWN)
    for key, why in NOT_APPLIED.items():
        if key in data:
            rec.not_applied(key, why)
    for key, why in REFUSED.items():
        if data.get(key):
            rec.refuse(key, why)
        elif key in data:
            rec.not_applied(key, "empty")
    kind = str(data.get("distributed_type", "NO"))
    mixed = str(data.get("mixed_precision", "no"))
    if mixed not in ("no", "bf16", "fp16"):
        rec.refuse("mixed_precision", f"{mixed!r}: not no, bf16 or fp16")
    out.mixed = mixed
    if data.get("num_processes") not in (None, -1):
        out.world_size = positive_int(rec, "num_processes", data["num_processes"])
        rec.mapped("num_processes", "world_sizes")
    if "num_machines" in data:
        out.nodes = positive_int(rec, "num_machines", data["num_machines"])
        rec.mapped("num_machines", "nodes")
    if "use_cpu" in data:
        if boolean(rec, "use_cpu", data["use_cpu"]):
            out.platform = "cpu"
            rec.mapped("use_cpu", "platform: cpu")
        else:
            rec.mapped("use_cpu", "the platform's devices")
    if "dynamo_config" in data:
        dynamo(data["dynamo_config"] or {}, out, rec)
    if kind == "DEEPSPEED":
        out.family = "deepspeed"
        rec.mapped("distributed_type", "a ZeRO strategy (deepspeed_config)")
        deepspeed(data.get("deepspeed_config") or {}, os.path.dirname(os.path.abspath(path)), out, rec)
    elif kind == "FSDP":
        out.family = "fsdp"
        rec.mapped("distributed_type", "strategies: [fsdp] (FSDP2)")
        fsdp(data.get("fsdp_config") or {}, out, rec)
    elif kind in ("MULTI_GPU", "NO", "MULTI_CPU"):
        rec.mapped("distributed_type", "strategies: [ddp]")
    else:
        rec.refuse("distributed_type", f"{kind!r}: not DEEPSPEED, FSDP, MULTI_GPU, MULTI_CPU or NO")
    for section, family in (("deepspeed_config", "deepspeed"), ("fsdp_config", "fsdp")):
        if section in data and out.family != family:
            rec.not_applied(section, f"distributed_type is {kind}")
    mixed_key = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}.get(mixed)
    if "mixed_precision" in data and mixed_key:
        rec.mapped("mixed_precision", "train.precision")
    return out


def dynamo(section: dict, out: Launch, rec: Record) -> None:
    backend = str(section.get("dynamo_backend", "NO")).upper()
    rec.check_known(
        section,
        (
            "dynamo_backend",
            "dynamo_mode",
            "dynamo_use_fullgraph",
            "dynamo_use_dynamic",
            "dynamo_use_regional_compilation",
        ),
        "dynamo_config.",
    )
    if backend == "NO":
        out.train["compile_model"] = False
        rec.mapped("dynamo_config.dynamo_backend", "train.compile_model: false")
        return
    if backend != "INDUCTOR":
        rec.refuse("dynamo_config.dynamo_backend", f"{backend!r}: only INDUCTOR (torch.compile's default) or NO")
        return
    if section.get("dynamo_use_regional_compilation"):
        out.train.update(compile_blocks=True, compile_model=False)
        rec.mapped("dynamo_config.dynamo_use_regional_compilation", "train.compile_blocks: true")
    else:
        out.train["compile_model"] = True
    rec.mapped("dynamo_config.dynamo_backend", "train.compile_model (or compile_blocks, regional)")
    mode = section.get("dynamo_mode", "default")
    if mode in COMPILE_MODES:
        out.train["compile_mode"] = mode
        if "dynamo_mode" in section:
            rec.mapped("dynamo_config.dynamo_mode", "train.compile_mode")
    else:
        rec.refuse("dynamo_config.dynamo_mode", f"{mode!r}: not one of {', '.join(COMPILE_MODES)}")
    for key in ("dynamo_use_fullgraph", "dynamo_use_dynamic"):
        if key in section:
            rec.substituted(f"dynamo_config.{key}", f"{section[key]!r}: torch.compile's default")


def deepspeed(section: dict, base: str, out: Launch, rec: Record) -> None:
    rec.check_known(section, ("deepspeed_config_file", *DS_LAUNCH, *DS_INLINE), "deepspeed_config.")
    for key in DS_LAUNCH:
        if key in section:
            rec.not_applied(f"deepspeed_config.{key}", "how the original was launched or saved")
    given = section.get("deepspeed_config_file")
    if given and str(given).lower() != "none":
        inline = [k for k in DS_INLINE if k in section]
        if inline:
            rec.refuse(
                "deepspeed_config", f"{', '.join(inline)} beside deepspeed_config_file (accelerate refuses both)"
            )
        for root in (base, os.getcwd()):
            path = os.path.normpath(os.path.join(root, os.path.expanduser(str(given))))
            if os.path.isfile(path):
                out.deepspeed_file = path
                rec.mapped("deepspeed_config.deepspeed_config_file", f"{path}: the strategy and its options")
                return
        rec.refuse("deepspeed_config.deepspeed_config_file", f"{given!r} is not a file beside the YAML or here")
        return
    zero = {"stage": section.get("zero_stage", 2)}
    for part in ("optimizer", "param"):
        device = section.get(f"offload_{part}_device", "none")
        if device not in (None, "none"):
            zero[f"offload_{part}"] = {"device": device}
            path = section.get(f"offload_{part}_nvme_path")
            if device == "nvme" and path and str(path).lower() != "none":
                zero[f"offload_{part}"]["nvme_path"] = path
    cfg = {
        "zero_optimization": zero,
        "bf16": {"enabled": out.mixed == "bf16"},
        "fp16": {"enabled": out.mixed == "fp16"},
    }
    for key in ("gradient_accumulation_steps", "gradient_clipping"):
        if section.get(key) is not None:
            cfg[key] = section[key]
    out.deepspeed_inline = cfg
    for key in DS_INLINE:
        if key in section:
            rec.mapped(f"deepspeed_config.{key}", "the ZeRO strategy and its options, as a DeepSpeed JSON")


def fsdp(section: dict, out: Launch, rec: Record) -> None:
    where = "fsdp_config."
    rec.check_known(section, FSDP_KNOWN, where)
    for key in FSDP_NOT_APPLIED:
        if key in section:
            rec.not_applied(where + key, "how the original saved or loaded its weights")
    version = int(section.get("fsdp_version", 1))
    if version == 2:
        rec.mapped(where + "fsdp_version", "fsdp (FSDP2, fully_shard)")
    else:
        rec.substituted(
            where + "fsdp_version",
            f"{version}{'' if 'fsdp_version' in section else ' (default)'}: FSDP2 (fully_shard) instead of FSDP1",
        )
    policy = section.get("fsdp_auto_wrap_policy", "NO_WRAP")
    if policy == "TRANSFORMER_BASED_WRAP":
        out.options["wrap_blocks"] = True
        rec.mapped(where + "fsdp_auto_wrap_policy", "strategy_options.fsdp.wrap_blocks: true (one unit per block)")
        if "fsdp_transformer_layer_cls_to_wrap" in section:
            rec.mapped(where + "fsdp_transformer_layer_cls_to_wrap", "the model's transformer blocks")
    elif policy == "NO_WRAP":
        out.options["wrap_blocks"] = False
        rec.mapped(where + "fsdp_auto_wrap_policy", "strategy_options.fsdp.wrap_blocks: false (one unit)")
    else:
        out.options["wrap_blocks"] = True
        rec.substituted(where + "fsdp_auto_wrap_policy", f"{policy}: one FSDP unit per transformer block")
    for key in ("fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params"):
        if key in section and key not in {k.removeprefix(where) for k in rec.notes}:
            rec.not_applied(where + key, f"not read under {policy}")
    for key in ("fsdp_reshard_after_forward", "fsdp_sharding_strategy"):
        if key not in section:
            continue
        value = section[key]
        if value in RESHARD:
            out.options["reshard_after_forward"] = RESHARD[value]
            rec.mapped(where + key, "strategy_options.fsdp.reshard_after_forward")
        else:
            rec.refuse(where + key, f"{value!r}: only full sharding, resharded after forward or not")
    if "fsdp_offload_params" in section:
        out.options["cpu_offload"] = boolean(rec, where + "fsdp_offload_params", section["fsdp_offload_params"])
        rec.mapped(where + "fsdp_offload_params", "strategy_options.fsdp.cpu_offload")
    if section.get("fsdp_activation_checkpointing"):
        out.train["gradient_checkpointing"] = True
        rec.mapped(where + "fsdp_activation_checkpointing", "train.gradient_checkpointing: true")
    elif "fsdp_activation_checkpointing" in section:
        rec.mapped(where + "fsdp_activation_checkpointing", "no recomputation from the launcher")
    for key in ("fsdp_forward_prefetch", "fsdp_backward_prefetch"):
        if key in section:
            rec.substituted(where + key, f"{section[key]!r}: FSDP2's own prefetching")


def precision(launch: Launch) -> tuple[str, str]:
    """The policy of accelerate's mixed_precision: FSDP2's bf16 MixedPrecisionPolicy (bf16 parameters and gradient
    reduction over fp32 shards) is bf16-pure; DDP's autocast bf16-mixed; DeepSpeed's decides in its JSON."""
    rec = launch.record
    if launch.mixed == "fp16":
        rec.substituted("mixed_precision", "fp16: bf16 (no fp16 policy here)")
    if launch.mixed == "no":
        return "fp32", "mixed_precision no"
    return ("bf16-pure", "FSDP2 bf16 mixed precision") if launch.family == "fsdp" else ("bf16-mixed", "bf16 autocast")
