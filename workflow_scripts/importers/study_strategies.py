"""A study's strategies from DeepSpeed JSON files: `strategies: [ddp, {name: my_z3, deepspeed: ds_z3.json}]`
(docs/importing.md).

Each file is read as the importer reads a DeepSpeed JSON (deepspeed_json.read), against the study's own settings:
`"auto"` is filled as the Hugging Face Trainer fills it (the batch keys, clipping and the optimizer's params from
the study's `train`, the hidden-size keys from the study's models), and the file's ZeRO stage and offload devices
name the registry strategy it runs as (its `base`). The name is registered for this process and every job it
starts (training/strategies: $PIPELINE_STRATEGIES), the file's other settings become `strategy_options.<name>`,
checked by DeepSpeed's own config models as every strategy's options are, and its runs build their DeepSpeed JSON
from them (their `strategy_settings.json` holds the resolved JSON). Fairness stays the study's: where the file sets
a batch, clipping, optimizer, schedule or precision other than the study's, the study's wins and each such key is
a line of the runs' substitutions, as is every key that decides nothing here. A file that cannot be read, an
unknown key, a stage or offload without a strategy: one problem naming the file and the key, before any job.
"""
from __future__ import annotations

import hashlib
import os

from workflow_scripts.importers import deepspeed_json
from workflow_scripts.importers.common import Record
from workflow_scripts.training.models import MODELS
from workflow_scripts.training.strategies import STRATEGIES, register


def entries(config: dict):
    """(where, entry) of every strategy given as a mapping, in the top list and in each group's."""
    for where, names in [("strategies", config.get("strategies"))] + [
            (f"groups[{i}].strategies", g.get("strategies")) for i, g in enumerate(config.get("groups") or [])
            if isinstance(g, dict)]:
        for j, entry in enumerate(names or []):
            if isinstance(entry, dict):
                yield f"{where}[{j}]", entry


def trainer_values(train: dict) -> dict:
    """The Trainer's values a DeepSpeed JSON's `"auto"` is filled from, as the study's train settings give them."""
    bf16 = train["precision"] != "fp32"
    return {"per_device_train_batch_size": train["micro_batch_size"],
            "gradient_accumulation_steps": train["grad_accum"], "max_grad_norm": train["grad_clip"],
            "learning_rate": train["lr"], "adam_epsilon": train["eps"], "weight_decay": train["weight_decay"],
            "adam_beta1": train["betas"][0], "adam_beta2": train["betas"][1], "bf16": bf16, "fp16": False}


def study_hidden(config: dict) -> tuple:
    """The hidden size the hidden-size `"auto"` keys are filled from: the study's models' one size, else
    (None, why): the options are per strategy, not per model."""
    from workflow_scripts import study

    sizes = {m: MODELS[m].d_model for m in study.all_names(config, "models") if m in MODELS}
    if len(set(sizes.values())) == 1:
        return next(iter(sizes.values())), f"the study's models ({', '.join(sizes)})"
    return None, ("the study's models have different hidden sizes ("
                  + ", ".join(f"{m} {h}" for m, h in sizes.items()) + "): give numbers")


def resolve(path: str, name: str, config: dict) -> tuple[str | None, dict, list[str], list[str]]:
    """(base strategy, its options, the runs' substitutions, problems) of one strategy file."""
    rec = Record(path, deepspeed_json.KIND)
    if not os.path.isfile(path):
        return None, {}, [], [f"{path}: no such file"]
    data = deepspeed_json.load(path, rec)
    train = config["train"]
    cfg = dict(data)
    if "train_batch_size" in cfg:  # the study's micro-batch x accumulation x data-parallel ranks, per run
        value = cfg.pop("train_batch_size")
        if isinstance(value, str) and value.lower() == "auto":
            rec.mapped("train_batch_size", "micro-batch x accumulation x data-parallel ranks, as the strategies "
                                           "compute it")
        else:
            rec.substituted("train_batch_size", f"{value!r}: the study's micro-batch x accumulation x data-parallel "
                                                "ranks of each run (one batch contract for every strategy)")
    if "scheduler" in cfg:
        cfg.pop("scheduler")
        rec.substituted("scheduler", "the study's warm-up + cosine (train.lr_warmup_steps, min_lr) for every "
                                     "strategy")
    out = deepspeed_json.read(cfg, rec, trainer_values(train), train, study_hidden(config), None,
                              study_wins=True)
    policy = train["precision"]
    if out.strategy and out.precision != policy:
        rec.substituted("bf16" if out.precision == "bf16-pure" else "precision",
                        f"{out.precision_why} ({out.precision}): the study's precision policy {policy} for every "
                        "strategy")
    rec.sweep(data)
    problems = [line.replace(f"strategy_options.{out.strategy}.", "").replace(" (from this JSON)", "")
                for line in rec.problems()]  # DeepSpeed's checks name the options: here they are the file's keys
    if not out.strategy and not problems:
        problems.append(f"{path}: names no strategy")
    subs = [f"{name} ({os.path.basename(path)}): {key}: {text}" for key, text in rec.substitutions()]
    return out.strategy, out.options, subs, problems


def expand(config: dict) -> list[str]:
    """Every strategy given as {name, deepspeed} made a named strategy of the study (in place): registered, its
    options under strategy_options.<name>, its substitutions recorded (config `strategy_sources`); the problems,
    one line each naming the key or the file."""
    out, seen = [], {}
    for where, entry in entries(config):
        name, path = entry.get("name"), entry.get("deepspeed")
        if not isinstance(name, str) or not isinstance(path, str) or set(entry) != {"name", "deepspeed"}:
            out.append(f"{where}: a strategy from a file is {{name: NAME, deepspeed: PATH}}, got {entry!r}")
            continue
        if name in STRATEGIES and name not in seen:
            out.append(f"{where}: {name!r} is a registry strategy's name: name the file's strategy otherwise")
            continue
        if name in seen and seen[name] != path:
            out.append(f"{where}: {name!r} names {path} and {seen[name]}: one name, one file")
            continue
        if name in (config.get("strategy_options") or {}) and name not in seen:
            out.append(f"strategy_options.{name}: {name} takes its options from {path}; give them there")
            continue
        if name not in seen:
            base, options, subs, problems = resolve(path, name, config)
            out += [f"{where}: {p}" for p in problems]
            if problems:
                continue
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            register(name, base)
            config.setdefault("strategy_options", {})[name] = options
            config.setdefault("strategy_sources", {})[name] = {"base": base, "deepspeed": path, "sha256": digest,
                                                                "substitutions": subs}
            seen[name] = path
    if out:
        return out
    for section in [config] + [g for g in config.get("groups") or [] if isinstance(g, dict)]:
        if isinstance(section.get("strategies"), list):
            section["strategies"] = [e["name"] if isinstance(e, dict) else e for e in section["strategies"]]
    return out
