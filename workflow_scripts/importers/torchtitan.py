"""A torchtitan TOML (the job config of `torchtitan/train.py --job.config_file FILE`, read with tomllib) as one
training configuration of the study: [parallelism]'s degrees as its layout (dp = replicate x shard, pp, tp, cp, ep;
FSDP2 as the data-parallel dimension, `fsdp`, or `ddp` where it only replicates), [training]'s batch, sequence,
steps, clipping and mixed precision, [optimizer] and [lr_scheduler] as the train keys, [activation_checkpoint] and
[compile] as the recomputation and compile levers, [model]'s hf_assets_path (a directory with the Hugging Face
config.json of its architecture) as the model.

torchtitan's defaults (DEFAULTS) stand for the keys a TOML leaves out, as they did for the original run.
"""

from __future__ import annotations

import os

from workflow_scripts.importers.common import Record, Variant, positive_int, tidy

KIND = "torchtitan TOML"
DEFAULTS = {
    "training": {
        "local_batch_size": 8,
        "global_batch_size": -1,
        "seq_len": 2048,
        "max_norm": 1.0,
        "steps": 10000,
        "mixed_precision_param": "bfloat16",
        "mixed_precision_reduce": "float32",
        "dataset": "c4_test",
        "enable_cpu_offload": False,
    },
    "optimizer": {"name": "AdamW", "lr": 8e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1},
    "lr_scheduler": {"warmup_steps": 200, "decay_ratio": None, "decay_type": "linear", "min_lr_factor": 0.0},
    "parallelism": {
        "data_parallel_replicate_degree": 1,
        "data_parallel_shard_degree": -1,
        "tensor_parallel_degree": 1,
        "pipeline_parallel_degree": 1,
        "context_parallel_degree": 1,
        "expert_parallel_degree": 1,
        "expert_tensor_parallel_degree": 1,
        "pipeline_parallel_schedule": "1F1B",
        "pipeline_parallel_microbatch_size": 1,
        "fsdp_reshard_after_forward": "default",
    },
    "activation_checkpoint": {"mode": "selective", "selective_ac_option": "2"},
    "compile": {"enable": False, "components": ["model", "loss"]},
}
NOT_APPLIED_SECTIONS = {
    "job": "where the original wrote its outputs",
    "comm": "the process group's timeouts and traces",
    "memory_estimation": "torchtitan's memory estimator",
    "checkpoint": "the original's checkpoints",
}
KNOWN = {
    "model": ("name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"),
    "training": (
        "local_batch_size",
        "batch_size",
        "global_batch_size",
        "seq_len",
        "max_norm",
        "steps",
        "dataset",
        "dataset_path",
        "mixed_precision_param",
        "mixed_precision_reduce",
        "enable_cpu_offload",
        "gc_freq",
        "gc_debug",
        "seed",
        "deterministic",
        "compile",
    ),
    "optimizer": ("name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation", "early_step_in_backward"),
    "lr_scheduler": ("warmup_steps", "decay_ratio", "decay_type", "min_lr_factor", "lr_min"),
    "parallelism": (
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "context_parallel_degree",
        "expert_parallel_degree",
        "expert_tensor_parallel_degree",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "fsdp_reshard_after_forward",
        "enable_async_tensor_parallel",
        "disable_loss_parallel",
        "enable_compiled_autograd",
        "context_parallel_rotate_method",
        "pipeline_parallel_split_points",
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_schedule_csv",
        "module_fqns_per_model_part",
        "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers",
    ),
    "activation_checkpoint": (
        "mode",
        "selective_ac_option",
        "per_op_sac_force_recompute_mm_shapes_by_fqns",
        "early_stop",
        "memory_budget",
    ),
    "compile": ("enable", "components"),
    "metrics": (
        "log_freq",
        "enable_tensorboard",
        "enable_wandb",
        "disable_color_printing",
        "save_tb_folder",
        "save_for_all_ranks",
        "enable_color_printing",
    ),
    "profiling": (
        "enable_profiling",
        "save_traces_folder",
        "profile_freq",
        "enable_memory_snapshot",
        "save_memory_snapshot_folder",
    ),
    "debug": ("seed", "deterministic"),
    "validation": ("enable", "dataset", "dataset_path", "local_batch_size", "seq_len", "freq", "steps"),
    "float8": None,
    "mx": None,
    "fault_tolerance": None,
    "experimental": ("custom_import", "custom_args_module"),
}
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe"}
C4_SHARD = "en/c4-train.00000-of-01024.json.gz"


def read(path: str, data: dict, rec: Record, world: int | None) -> Variant:
    base = os.path.dirname(os.path.abspath(path))
    out = Variant(sources=[path], strategy="fsdp")
    rec.check_known(data, {*KNOWN, *NOT_APPLIED_SECTIONS})
    for name, why in NOT_APPLIED_SECTIONS.items():
        for key, value in (data.get(name) or {}).items():
            if name == "checkpoint" and key == "initial_load_path" and value:
                rec.substituted("checkpoint.initial_load_path", f"{value!r}: a random initialisation instead")
            else:
                rec.not_applied(f"{name}.{key}", why)
    s = {}
    for name, keys in KNOWN.items():
        section = data.get(name) or {}
        if not isinstance(section, dict):
            rec.refuse(f"[{name}]", "not a table")
            section = {}
        if keys is not None:
            rec.check_known(section, keys, f"{name}.")
        s[name] = {**DEFAULTS.get(name, {}), **section}
        s[name + "!"] = section  # what the file itself set
    features(s, rec)
    out.model, out.sections = model_and_data(s, base, rec)
    degrees, out.strategy, out.world_size = parallelism(s, rec, world)
    if any(v > 1 for k, v in degrees.items() if k != "dp"):
        out.layout = {k: v for k, v in degrees.items() if k == "dp" or v > 1}
    out.train, out.options = train_keys(s, degrees, rec)
    out.precision, out.precision_why = precision(s, degrees, rec)
    out.trackers = [
        t for t, k in (("tensorboard", "enable_tensorboard"), ("wandb", "enable_wandb")) if s["metrics"].get(k)
    ]
    for key in ("enable_tensorboard", "enable_wandb"):
        if key in s["metrics!"]:
            rec.mapped(f"metrics.{key}", "trackers")
    for key in ("disable_color_printing", "save_tb_folder", "save_for_all_ranks", "enable_color_printing"):
        if key in s["metrics!"]:
            rec.not_applied(f"metrics.{key}", "how the original logged")
    if "log_freq" in s["metrics!"]:
        out.train["log_every"] = positive_int(rec, "metrics.log_freq", s["metrics"]["log_freq"])
        rec.mapped("metrics.log_freq", "train.log_every")
    return out


def features(s: dict, rec: Record) -> None:
    """Sections of features without a counterpart: refused where on, not applied where off."""
    for name in ("float8", "mx", "fault_tolerance", "experimental", "profiling", "validation"):
        section = s[name + "!"]
        on = {
            k: v
            for k, v in section.items()
            if v not in (False, None, "", [], 0)
            and not (name == "profiling" and k != "enable_profiling")
            and not (name == "validation" and k != "enable")
        }
        for key in section:
            if key in on and name in ("float8", "mx", "fault_tolerance", "experimental"):
                rec.refuse(f"{name}.{key}", f"{section[key]!r}: {name} has no counterpart")
            elif key in on and name == "profiling":
                rec.substituted(f"{name}.{key}", "true: no traces (the study's own profile section makes them)")
            elif key in on and name == "validation":
                rec.substituted(f"{name}.{key}", "true: the validation loss before and after training")
            else:
                rec.not_applied(f"{name}.{key}", f"{name} is off" if name != "profiling" else "profiling is off")
    converters = s["model!"].get("converters")
    if converters:
        rec.refuse("model.converters", f"{converters!r}: model converters (float8, mx) have no counterpart")
    elif "converters" in s["model!"]:
        rec.not_applied("model.converters", "none")
    if "print_after_conversion" in s["model!"]:
        rec.not_applied("model.print_after_conversion", "a log line")
    for key in ("gc_freq", "gc_debug"):
        if key in s["training!"]:
            rec.not_applied(f"training.{key}", "Python's garbage collector")


def model_and_data(s: dict, base: str, rec: Record) -> tuple[str | None, dict]:
    m = s["model!"]
    flavor = f"{m.get('name', '?')} {m.get('flavor', '?')!r}"
    assets = m.get("hf_assets_path") or m.get("tokenizer_path")
    key = "model.hf_assets_path" if "hf_assets_path" in m else "model.tokenizer_path"
    model = None
    if assets:
        for root in (base, os.getcwd()):
            path = os.path.normpath(os.path.join(root, os.path.expanduser(str(assets))))
            if os.path.isfile(os.path.join(path, "config.json")):
                model = path
                break
    if model is None:
        rec.refuse(
            "model",
            f"{flavor}: torchtitan builds it from its own table; give [model] hf_assets_path a "
            "directory holding the Hugging Face config.json of that architecture",
        )
        return None, {}
    for k in ("name", "flavor"):
        if k in m:
            rec.mapped(f"model.{k}", f"models: [{model}]")
    rec.substituted(
        key,
        f"{assets!r}: the architecture of its config.json stands for torchtitan's {flavor}, "
        "randomly initialised as torchtitan trains it",
    )
    t, given = s["training"], s["training!"]
    sections = {"tokenizer": {"kind": "hub", "name": model}}
    block = positive_int(rec, "training.seq_len", t["seq_len"])
    sections["data"] = {"block_size": block, "val_fraction": 0.05}
    if "seq_len" in given:
        rec.mapped("training.seq_len", "data.block_size")
    dataset = t["dataset"]
    key = "training.dataset"
    if dataset == "c4":
        sections["corpus"] = {
            "source": "hub",
            "max_bytes": None,
            "max_documents": None,
            "hub": {
                "path": "allenai/c4",
                "name": None,
                "split": "train",
                "data_files": C4_SHARD,
                "kind": "text",
                "text_field": "text",
            },
        }
        rec.substituted(key, f"c4: its first shard ({C4_SHARD}) of allenai/c4, read whole instead of streamed")
    else:
        sections["corpus"] = {"source": "stdlib"}
        rec.substituted(
            key,
            f"{dataset!r}{'' if 'dataset' in given else ' (default)'}: the offline corpus (this "
            "Python's standard library) instead",
        )
    if "dataset_path" in given:
        rec.substituted("training.dataset_path", f"{given['dataset_path']!r}: the corpus above")
    rec.substituted("validation", "5 % of the documents held out for the validation loss before and after training")
    return model, sections


def parallelism(s: dict, rec: Record, world: int | None) -> tuple[dict, str, int | None]:
    p, given = s["parallelism"], s["parallelism!"]
    w = "parallelism."
    tp, pp, cp = (int(p[k]) for k in ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree"))
    ep, replicate, shard = (
        int(p["expert_parallel_degree"]),
        int(p["data_parallel_replicate_degree"]),
        int(p["data_parallel_shard_degree"]),
    )
    for key in (
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "context_parallel_degree",
        "expert_parallel_degree",
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
    ):
        if key in given:
            rec.mapped(w + key, "layouts" if key != "data_parallel_shard_degree" else "layouts.dp (FSDP2)")
    if int(p["expert_tensor_parallel_degree"]) > 1:
        rec.refuse(w + "expert_tensor_parallel_degree", "tensor parallelism inside experts has no counterpart")
    elif "expert_tensor_parallel_degree" in given:
        rec.mapped(w + "expert_tensor_parallel_degree", "experts whole on their ranks")
    if shard == -1:
        if world is None:
            rec.refuse(
                w + "data_parallel_shard_degree", "-1 (the ranks left over) needs the world size: give --world-size"
            )
            shard = 1
        elif world % (replicate * tp * pp * cp):
            rec.refuse(
                w + "data_parallel_shard_degree",
                f"-1: world size {world} is not a multiple of replicate x tp x pp x cp = {replicate * tp * pp * cp}",
            )
            shard = 1
        else:
            shard = world // (replicate * tp * pp * cp)
    if replicate > 1 and shard > 1:
        rec.refuse(
            w + "data_parallel_replicate_degree",
            "replicated and sharded data parallelism together (HSDP) has no counterpart",
        )
    strategy = "ddp" if replicate > 1 else "fsdp"
    dp = replicate * shard
    size = dp * tp * pp * cp
    if world is not None and size != world:
        rec.refuse("parallelism", f"its degrees make {size} ranks, --world-size says {world}")
    degrees = {"dp": dp, "pp": pp, "tp": tp, "cp": cp, "ep": ep}
    schedule = p["pipeline_parallel_schedule"]
    if pp > 1:
        if schedule in SCHEDULES:
            if "pipeline_parallel_schedule" in given:
                rec.mapped(w + "pipeline_parallel_schedule", "train.pipeline_schedule")
        else:
            rec.substituted(w + "pipeline_parallel_schedule", f"{schedule}: 1F1B over one stage per rank")
        for key in (
            "pipeline_parallel_split_points",
            "pipeline_parallel_layers_per_stage",
            "pipeline_parallel_schedule_csv",
            "module_fqns_per_model_part",
            "pipeline_parallel_first_stage_less_layers",
            "pipeline_parallel_last_stage_less_layers",
        ):
            if key in given:
                rec.substituted(w + key, f"{given[key]!r}: consecutive blocks split evenly over the stages")
    else:
        for key in (
            "pipeline_parallel_schedule",
            "pipeline_parallel_microbatch_size",
            "pipeline_parallel_split_points",
            "pipeline_parallel_layers_per_stage",
        ):
            if key in given:
                rec.not_applied(w + key, "no pipeline (pipeline_parallel_degree 1)")
    if "context_parallel_rotate_method" in given:
        if cp > 1:
            rec.substituted(
                w + "context_parallel_rotate_method",
                f"{given['context_parallel_rotate_method']!r}: "
                "DeepSpeed-Ulysses (attention heads all-to-all'd) instead of ring attention",
            )
        else:
            rec.not_applied(w + "context_parallel_rotate_method", "no context parallelism")
    elif cp > 1:
        rec.substituted(
            w + "context_parallel_degree", f"{cp}: DeepSpeed-Ulysses instead of torchtitan's ring attention"
        )
    for key, what in (
        ("enable_async_tensor_parallel", "synchronous tensor-parallel collectives"),
        ("enable_compiled_autograd", "eager autograd"),
    ):
        if given.get(key):
            rec.substituted(w + key, f"true: {what}")
        elif key in given:
            rec.mapped(w + key, what)
    if "disable_loss_parallel" in given:
        if tp > 1 and not given["disable_loss_parallel"]:
            rec.substituted(w + "disable_loss_parallel", "false: the loss on the gathered logits")
        else:
            rec.mapped(w + "disable_loss_parallel", "the loss on the whole logits")
    if shard > 1 or strategy == "fsdp":
        reshard = p["fsdp_reshard_after_forward"]
        if "fsdp_reshard_after_forward" in given:
            if reshard not in ("default", "always", "never"):
                rec.refuse(w + "fsdp_reshard_after_forward", f"{reshard!r}: not default, always or never")
            rec.mapped(w + "fsdp_reshard_after_forward", "strategy_options.fsdp.reshard_after_forward")
    return degrees, strategy, size


def train_keys(s: dict, degrees: dict, rec: Record) -> tuple[dict, dict]:
    t, tg = s["training"], s["training!"]
    o, og = s["optimizer"], s["optimizer!"]
    sched, sg = s["lr_scheduler"], s["lr_scheduler!"]
    train, options = {}, {}
    local = positive_int(
        rec, "training.local_batch_size", tg.get("local_batch_size", tg.get("batch_size", t["local_batch_size"]))
    )
    local = local or 1
    dp = degrees["dp"]
    glob = int(t["global_batch_size"])
    accum = 1
    if glob > 0:
        if glob % (local * dp):
            rec.refuse("training.global_batch_size", f"{glob} is not a multiple of local_batch_size {local} x dp {dp}")
        else:
            accum = glob // (local * dp)
        rec.mapped("training.global_batch_size", f"train.grad_accum: {accum} (global / local / dp)")
    micro = local
    if degrees["pp"] > 1:
        pmb = int(s["parallelism"]["pipeline_parallel_microbatch_size"])
        if local % pmb:
            rec.refuse(
                "parallelism.pipeline_parallel_microbatch_size", f"{pmb} does not divide local_batch_size {local}"
            )
        else:
            micro, accum = pmb, accum * (local // pmb)
            rec.mapped(
                "parallelism.pipeline_parallel_microbatch_size",
                "train.micro_batch_size (the pipeline's micro-batches: train.grad_accum)",
            )
        schedule = s["parallelism"]["pipeline_parallel_schedule"]
        train["pipeline_schedule"] = SCHEDULES.get(schedule, "1f1b")
    for key in ("local_batch_size", "batch_size"):
        if key in tg:
            rec.mapped(f"training.{key}", "train.micro_batch_size (per data-parallel rank)")
    train.update(micro_batch_size=micro, grad_accum=accum, max_train_samples=None, checkpoint_every=0)
    steps = positive_int(rec, "training.steps", t["steps"])
    train.update(max_steps=steps, epochs=1)
    rec.substituted(
        "training.steps",
        f"{t['steps']}: train.max_steps, within one pass over the corpus (torchtitan re-reads its data past its end)",
    )
    train["grad_clip"] = float(t["max_norm"])
    if "max_norm" in tg:
        rec.mapped("training.max_norm", "train.grad_clip")
    if tg.get("enable_cpu_offload"):
        options["cpu_offload"] = True
        rec.mapped("training.enable_cpu_offload", "strategy_options.fsdp.cpu_offload")
    elif "enable_cpu_offload" in tg:
        rec.mapped("training.enable_cpu_offload", "no offload")
    reshard = s["parallelism"]["fsdp_reshard_after_forward"]
    if reshard in ("always", "never"):
        options["reshard_after_forward"] = reshard == "always"
    for section, given in (("training", tg), ("debug", s["debug!"])):
        if "seed" in given and given["seed"] is not None:
            train["seed"] = int(given["seed"])
            rec.mapped(f"{section}.seed", "train.seed")
        if "deterministic" in given:
            train["deterministic"] = bool(given["deterministic"])
            rec.mapped(f"{section}.deterministic", "train.deterministic")
    name = str(o["name"])
    if name.lower() != "adamw":
        rec.substituted("optimizer.name", f"{name}: AdamW, the one optimizer of every strategy")
    elif "name" in og:
        rec.mapped("optimizer.name", "torch AdamW")
    train.update(
        lr=float(o["lr"]),
        betas=[float(o["beta1"]), float(o["beta2"])],
        eps=float(o["eps"]),
        weight_decay=float(o["weight_decay"]),
    )
    for key, where in (
        ("lr", "train.lr"),
        ("beta1", "train.betas[0]"),
        ("beta2", "train.betas[1]"),
        ("eps", "train.eps"),
        ("weight_decay", "train.weight_decay"),
    ):
        if key in og:
            rec.mapped(f"optimizer.{key}", where)
    if "implementation" in og:
        rec.mapped("optimizer.implementation", "torch AdamW (fused on a GPU): the same update")
    if og.get("early_step_in_backward"):
        rec.substituted("optimizer.early_step_in_backward", "true: the optimizer steps after the backward")
    elif "early_step_in_backward" in og:
        rec.mapped("optimizer.early_step_in_backward", "the optimizer steps after the backward")
    train["lr_warmup_steps"] = int(sched["warmup_steps"])
    if "warmup_steps" in sg:
        rec.mapped("lr_scheduler.warmup_steps", "train.lr_warmup_steps")
    factor = sched.get("min_lr_factor", sched.get("lr_min", 0.0))
    train["min_lr"] = tidy(train["lr"] * float(factor or 0.0))
    for key in ("min_lr_factor", "lr_min"):
        if key in sg:
            rec.mapped(f"lr_scheduler.{key}", "train.min_lr = lr x min_lr_factor")
    decay, ratio = sched["decay_type"], sched["decay_ratio"]
    if decay == "cosine" and ratio in (None, 1.0):
        rec.mapped("lr_scheduler.decay_type", "the loop's warm-up + cosine")
        if "decay_ratio" in sg:
            rec.mapped("lr_scheduler.decay_ratio", "decay over every step after the warm-up")
    else:
        text = f"decay_type {decay}{'' if 'decay_type' in sg else ' (default)'}"
        if ratio not in (None, 1.0):
            text += f", decay_ratio {ratio} (a stable phase first)"
        rec.substituted("lr_scheduler", f"{text}: linear warm-up, then cosine decay over every later step")
        if "decay_ratio" in sg:
            rec.notes.setdefault("lr_scheduler.decay_ratio", ("mapped", "see lr_scheduler"))
    train.update(recompute(s, rec))
    train.update(compiling(s, rec))
    return train, options


def recompute(s: dict, rec: Record) -> dict:
    ac, given = s["activation_checkpoint"], s["activation_checkpoint!"]
    mode = ac["mode"]
    w = "activation_checkpoint."
    for key in ("per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop", "memory_budget"):
        if key in given:
            rec.substituted(w + key, f"{given[key]!r}: the pipeline's recomputation policy")
    if mode == "none":
        rec.mapped(w + "mode", "train.gradient_checkpointing: false") if "mode" in given else None
        return {"gradient_checkpointing": False}
    if mode == "full":
        rec.mapped(w + "mode", "train.gradient_checkpointing: full") if "mode" in given else None
        return {"gradient_checkpointing": "full"}
    if mode != "selective":
        rec.refuse(w + "mode", f"{mode!r}: not none, selective or full")
        return {}
    option = str(ac["selective_ac_option"])
    if option == "op":
        rec.mapped(
            w + "selective_ac_option", "train.gradient_checkpointing: selective (per op: matmuls and attention kept)"
        )
        if "mode" in given:
            rec.mapped(w + "mode", "train.gradient_checkpointing")
        return {"gradient_checkpointing": "selective"}
    default = "" if "selective_ac_option" in given else " (default)"
    if option == "1":
        rec.mapped(w + "selective_ac_option", "train.gradient_checkpointing: full (every block)")
        return {"gradient_checkpointing": "full"}
    rec.substituted(
        w + "selective_ac_option",
        f"{option}{default}: every transformer block recomputed (full) instead of every {option}th",
    )
    if "mode" in given:
        rec.mapped(w + "mode", "train.gradient_checkpointing")
    elif "selective_ac_option" not in given:
        rec.notes[w + "mode"] = (
            "substituted",
            f"selective, option {option} (defaults): full recomputation of every block instead of every {option}th",
        )
        rec.notes.pop(w + "selective_ac_option", None)
    return {"gradient_checkpointing": "full"}


def compiling(s: dict, rec: Record) -> dict:
    c, given = s["compile"], s["compile!"]
    old = s["training!"].get("compile")
    if old is not None:
        c = {**c, "enable": bool(old)}
        rec.mapped("training.compile", "train.compile_blocks / compile_loss")
    if not c["enable"]:
        if "enable" in given:
            rec.mapped("compile.enable", "train.compile_blocks, compile_loss, compile_model: false")
        if "components" in given:
            rec.not_applied("compile.components", "compile is off")
        return {"compile_blocks": False, "compile_loss": False, "compile_model": False}
    parts = list(c["components"])
    unknown = [p for p in parts if p not in ("model", "loss")]
    if unknown:
        rec.refuse("compile.components", f"{unknown!r}: only model and loss")
    for key in ("enable", "components"):
        if key in given:
            rec.mapped(f"compile.{key}", "train.compile_blocks (each block), train.compile_loss")
    return {"compile_blocks": "model" in parts, "compile_loss": "loss" in parts, "compile_model": False}


def precision(s: dict, degrees: dict, rec: Record) -> tuple[str, str]:
    """FSDP2's mixed precision: bf16 parameters over fp32 shards is bf16-pure (whose gradients are reduced in
    bf16); without FSDP2 torchtitan autocasts (bf16-mixed)."""
    t, given = s["training"], s["training!"]
    param, reduce = t["mixed_precision_param"], t["mixed_precision_reduce"]
    if param not in ("bfloat16", "float32"):
        rec.refuse("training.mixed_precision_param", f"{param!r}: not bfloat16 or float32")
        return "fp32", ""
    if "mixed_precision_param" in given:
        rec.mapped("training.mixed_precision_param", "train.precision")
    if param == "float32":
        if "mixed_precision_reduce" in given:
            rec.not_applied("training.mixed_precision_reduce", "parameters are fp32")
        return "fp32", "float32 parameters"
    sharded = degrees["dp"] > 1 and s["parallelism"]["data_parallel_replicate_degree"] == 1
    if not sharded:
        if "mixed_precision_reduce" in given:
            rec.not_applied("training.mixed_precision_reduce", "no FSDP2")
        return "bf16-mixed", "bf16 autocast (no FSDP2)"
    if reduce == "bfloat16":
        if "mixed_precision_reduce" in given:
            rec.mapped("training.mixed_precision_reduce", "bf16-pure's bf16 reduction")
    else:
        rec.substituted(
            "training.mixed_precision_reduce",
            f"{reduce}{'' if 'mixed_precision_reduce' in given else ' (default)'}: gradients reduced in bf16 "
            "(bf16-pure's MixedPrecisionPolicy) instead",
        )
    return "bf16-pure", "FSDP2 bf16 parameters"
