"""Checks of a study config that a schema cannot express, run when the Snakefile is parsed: before any job starts.

All problems are collected and raised as one error, each naming the key or file at fault.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from workflow_scripts import study
from workflow_scripts.schema import did_you_mean, filled, unknown_key
from workflow_scripts.training import models as own
from workflow_scripts.training import trackers
from workflow_scripts.training.layout import Layout
from workflow_scripts.training.models import MODELS
from workflow_scripts.training.parallel import model_problems, run_problems, unimplemented
from workflow_scripts.training.strategies import STRATEGIES
from workflow_scripts.training.strategies._deepspeed import (
    BF16_KEYS,
    COMPILED_ZERO3_KEYS,
    asks_deepcompile,
    no_bf16_section,
)

PRECISIONS = ("fp32", "bf16-mixed", "bf16-pure")
# jsonschema checks the `iri` formats with rfc3987_syntax where it is installed (JupyterLab, through HTA, brings it):
# building its grammar took 1.5 s of every Snakefile parse on two cores. The schemas use no such format: keep it out.
sys.modules.setdefault("rfc3987_syntax", None)


class ConfigError(ValueError):
    pass


def detect_devices(platform: str) -> int:
    """Devices on this node: CPU cores for cpu; GPUs through nvidia-smi / amd-smi (no torch import at parse)."""
    if platform == "cpu":
        return os.cpu_count() or 1
    tool = {"cuda": ["nvidia-smi", "--list-gpus"], "rocm": ["amd-smi", "list"]}[platform]
    if shutil.which(tool[0]) is None:
        return 0
    out = subprocess.run(tool, capture_output=True, text=True, timeout=30).stdout
    if platform == "cuda":
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))
    return sum(1 for line in out.splitlines() if line.strip().startswith("GPU:"))


def _is_local(path: str) -> bool:
    """A path, not a hub id ('org/name'): absolute or starting with '.'."""
    return os.path.isabs(path) or path.startswith(".")


PLANNING_TARGETS = ("plan", "scale")  # targets that train nothing: they need no device of this node


def planning_only(argv: list[str]) -> bool:
    """Whether the command line names only planning targets (`snakemake plan ...`, `snakemake scale ...`): then
    the node's devices are not counted, the plan's own `gpus` say how many."""
    words = [a for a in argv[1:] if not a.startswith("-")]
    return any(a in PLANNING_TARGETS for a in words) and "all" not in words


def problems(config: dict, devices: int | None = None, planning: bool = False, before=None) -> list[str]:
    """Every problem of a study config, one line each. `before`: a step that names more of the study before the
    checks (rules/common.smk: the strategies from DeepSpeed files, importers/study_strategies.py), after its own
    models are named; its problems alone stop the checks (they would read its entries unnamed)."""
    named = own_model_problems(config)  # first: every check after it sees the study's own models by their names
    if before is not None:
        files = before(config)
        if files:
            return named + files
    sizes = [] if planning else size_problems(config, devices)
    found = (named + name_problems(config) + batch_problems(config) + layout_problems(config)
             + sizes + data_problems(config) + bench_problems(config)
             + verify_problems(config) + study.precision_problems(config) + published_problems(config)
             + data_kind_problems(config) + bf16_option_problems(config) + chunked_loss_problems(config)
             + separate_documents_problems(config)
             + auto_levers_problems(config) + compiled_zero3_problems(config) + profile_problems(config)
             + ([] if planning else pretrained_problems(config) + trackers.missing(config["trackers"])))
    return list(dict.fromkeys(found))  # a problem found by two checks is reported once


def auto_levers_problems(config: dict) -> list[str]:
    """A measured `auto` runs its trial through the one-node launcher (job/lever_trial.py)."""
    if (config.get("auto_levers") or {}).get("by") == "measurement" and config["nodes"] > 1:
        return [f"auto_levers.by: measurement runs its trial on one node (nodes: {config['nodes']}): decide by rule "
                "or set the levers (train.compile_blocks, compile_loss, compile_model)"]
    return []


def profile_problems(config: dict) -> list[str]:
    """`wait` places a window that opens after the timing warm-up: meaningless for one at the run's end."""
    given = filled("profile", config.get("profile"))
    if given["wait"] and given["at"] == "end":
        return [(f"profile.wait: {given['wait']} places a window after the timing warm-up, but the window is at the "
                 "run's end (profile.at: end, the default): set profile.at: start, or leave wait out")]
    return []


def verify_problems(config: dict) -> list[str]:
    """verify.against is a result set whose runs can be replayed, and not the one this study writes."""
    from workflow_scripts import columns, replay

    against = (config.get("verify") or {}).get("against")
    if not against:
        return []
    if not os.path.exists(os.path.join(against, columns.RUNS_TABLE)):
        return [f"verify.against: {against} has no {columns.RUNS_TABLE} (not a result set)"]
    if os.path.abspath(against) == os.path.abspath(config["results_dir"]):
        return [f"verify.against: {against} is this study's results_dir: set results_dir to a new folder for the "
                "rerun (the committed set is never overwritten)"]
    return replay.problems(against)


def data_kind_problems(config: dict) -> list[str]:
    """Image classifiers train on image rows (data.kind: images), language models on token blocks; LoRA only on
    image classifiers so far; a local image folder exists."""
    kind, out = config["data"]["kind"], []
    for m in study.all_names(config, "models"):
        if m in MODELS and MODELS[m].vision != (kind == "images"):
            what, wants = ("an image classifier", "images") if MODELS[m].vision else ("a language model", "text")
            out.append(f"data.kind: {kind}, but {m} is {what} (set data.kind: {wants})")
    if config["train"].get("lora") and any(not MODELS[m].vision for m in study.all_names(config, "models")
                                           if m in MODELS):
        out.append("train.lora: LoRA is wired for the vit-* models only")
    local = (config.get("images") or {}).get("local") or {}
    if kind == "images" and config["images"]["source"] == "local" and not os.path.isdir(local.get("path") or ""):
        out.append(f"images.local.path: {local.get('path')!r} is not a directory")
    return out


def published_problems(config: dict) -> list[str]:
    """Claims name runs of this study; headlines name claimed strategies; as_published only claimed strategies."""
    pub = config.get("published") or {}
    if not pub.get("source"):
        extra = [k for k in ("claims", "headlines", "as_published") if pub.get(k)]
        return [f"published.{k}: set published.source (where the numbers come from) first" for k in extra]
    out = []
    try:
        study.published_runs(config)
    except ValueError as exc:
        out.append(str(exc))
    claimed = {(c["model"], c["strategy"]) for c in pub.get("claims") or []}
    for s, settings in (pub.get("as_published") or {}).items():
        if s not in {s for _, s in claimed}:
            out.append(f"published.as_published.{s}: not a claimed strategy (published.claims)")
        for key in sorted(set(settings or {}) - set(config["train"])):
            out.append(f"published.as_published.{s}.{key}: not a train setting")
        if (settings or {}).get("precision", "fp32") not in PRECISIONS:
            out.append(f"published.as_published.{s}.precision: {settings['precision']!r} is not one of "
                       f"{', '.join(PRECISIONS)}")
    for i, h in enumerate(pub.get("headlines") or []):
        for s in [h["slower"], *h["faster"]]:
            if (h["model"], s) not in claimed:
                out.append(f"published.headlines[{i}]: {h['model']}/{s} has no claim row (published.claims)")
    return out


def model_places(config: dict):
    """(key, entry) of every place a study names a model: models, groups[].models, plan.models, bench.model, the keys
    of pretrained and model_overrides, published claims and headlines."""
    def entries(where, value):
        return [(where, m) for m in value] if isinstance(value, list) else []

    found = entries("models", config.get("models"))
    for i, g in enumerate(config.get("groups") or []):
        found += entries(f"groups[{i}].models", g.get("models") if isinstance(g, dict) else None)
    sections = {k: config.get(k) if isinstance(config.get(k), dict) else {} for k in ("plan", "bench", "published")}
    found += entries("plan.models", sections["plan"].get("models"))
    found += entries("bench.model", [sections["bench"]["model"]] if "model" in sections["bench"] else None)
    for key in ("pretrained", "model_overrides"):
        found += [(key, m) for m in (config.get(key) if isinstance(config.get(key), dict) else {})]
    for part in ("claims", "headlines"):
        for i, row in enumerate(sections["published"].get(part) or []):
            found += entries(f"published.{part}[{i}].model", [row["model"]] if isinstance(row, dict)
                             and "model" in row else None)
    return found


def rename_models(config: dict, names: dict) -> None:
    """Every place of model_places with an entry of `names` given its name instead (in place)."""
    def renamed(value):
        return list(dict.fromkeys(names.get(m, m) for m in value)) if isinstance(value, list) else value

    if "models" in config:
        config["models"] = renamed(config["models"])
    for g in config.get("groups") or []:
        if isinstance(g, dict) and "models" in g:
            g["models"] = renamed(g["models"])
    for key, field in (("plan", "models"), ("bench", "model")):
        section = config.get(key)
        if isinstance(section, dict) and section.get(field) is not None:
            value = section[field]
            section[field] = renamed(value) if isinstance(value, list) else names.get(value, value)
    for key in ("pretrained", "model_overrides"):
        if isinstance(config.get(key), dict):
            config[key] = {names.get(m, m): v for m, v in config[key].items()}
    published = config.get("published") if isinstance(config.get("published"), dict) else {}
    for part in ("claims", "headlines"):
        for row in published.get(part) or []:
            if isinstance(row, dict) and row.get("model") in names:
                row["model"] = names[row["model"]]


def own_model_problems(config: dict) -> list[str]:
    """A study's own models (training/models.py: a local directory holding a Hugging Face config.json, or a hub id),
    read now, each once: one problem naming the key and the entry for a model that cannot be read or trained here,
    or two different sources that would be named alike. Each readable one is registered under its name (the
    directory's, a hub id's org--name: models.own_name), for this process and every job it starts, and every place
    that names it (model_places) then holds that name, as its runs and result folders do."""
    out, names, first, seen = [], {}, {}, set()
    for where, entry in model_places(config):
        if entry in seen or not own.is_source(entry):
            continue
        seen.add(entry)
        try:
            name, source = own.own_name(entry), own.source_of(entry)
            if name in own.NAMED:
                raise own.ModelSourceError(f"{entry!r}: its name {name!r} is a registry model's: rename the "
                                           "directory")
            if name in first and first[name][1] != source:
                raise own.ModelSourceError(f"{entry!r} and {first[name][0]!r} are different models both named "
                                           f"{name!r} (their directory's name; runs/{name}/ would hold both): "
                                           "rename one directory")
            own.own_spec(name, source, entry)
        except own.ModelSourceError as exc:
            out.append(f"{where}: {exc}")
            continue
        first.setdefault(name, (entry, source))
        names[entry] = name
    for name, (_, source) in first.items():
        own.register(name, source)
    rename_models(config, names)
    return out


def name_problems(config: dict) -> list[str]:
    """Unknown models, strategies and their options; runs claimed twice; pretrained paths."""
    out = []
    where = "groups[].models" if config.get("groups") else "models"
    for m in study.all_names(config, "models"):
        if m not in MODELS and not own.is_source(m):  # a source that cannot be read: own_model_problems says why
            out.append(f"{where}: unknown model {m!r} (known: {', '.join(MODELS)}; or a local directory holding a "
                       "config.json, or a hub id)")
    where = "groups[].strategies" if config.get("groups") else "strategies"
    for s in study.all_names(config, "strategies"):
        if s not in STRATEGIES:
            out.append(f"{where}: unknown strategy {s!r}, {did_you_mean(s, STRATEGIES)}")
    try:
        study.runs(config)
    except ValueError as exc:
        out.append(str(exc))
    for s, options in (config.get("strategy_options") or {}).items():
        if s not in STRATEGIES:
            out.append(f"strategy_options.{s}: no such strategy, {did_you_mean(s, STRATEGIES)}")
        else:
            out += option_problems(STRATEGIES[s], options)
    for model, path in config["pretrained"].items():
        if own.is_source(model) and model not in MODELS:
            continue  # said by own_model_problems
        if model not in MODELS:
            out.append(f"pretrained.{model}: unknown model")
        elif _is_local(str(path)) and not os.path.exists(path) and config["weights"] == "pretrained":
            out.append(f"pretrained.{model}: {path!r} does not exist; {WITHOUT_WEIGHTS}")
    return out


WITHOUT_WEIGHTS = ("on a machine without the weights, weights: random (studies/offline_gpu.yaml) starts from a random "
                   "initialisation, recorded as a substitution in every run")


def pretrained_problems(config: dict) -> list[str]:
    """The hub ids in `pretrained` of the study's own models that this machine cannot load (weights: pretrained)."""
    if config["weights"] != "pretrained":
        return []
    out = []
    for model in study.all_names(config, "models"):
        source = config["pretrained"].get(model)
        if source is None or _is_local(str(source)):
            continue  # a local directory: name_problems
        try:  # as a study's own model is read: the Hugging Face cache first, then the hub
            own.read_config(str(source), f"pretrained.{model}: {source}")
        except own.ModelSourceError as exc:
            out.append(f"{exc}; download it once and name its directory, or, {WITHOUT_WEIGHTS}")
    return out


def option_problems(strategy, options) -> list[str]:
    """A strategy's `strategy_options` section: against the keys it takes (option_keys), or by its own check
    (Strategy.option_problems: DeepSpeed's config models, training/strategies/_deepspeed.py)."""
    where = f"strategy_options.{strategy.name}"
    if options is None:
        return []
    if not isinstance(options, dict):
        return [f"{where}: must be a mapping of option: value, got {options!r}"]
    if strategy.option_problems is not None:
        return strategy.option_problems(options)
    known = strategy.option_keys
    return [unknown_key(where, key, known) for key in sorted(options) if known is not None and key not in known]


def batch_problems(config: dict) -> list[str]:
    """Batch sizes per group, and grad_accum's accumulation that must divide them."""
    out = []
    for i, g in enumerate(study.groups(config)):
        t = {**config["train"], **g.get("train", {})}
        where = f"groups[{i}].train" if config.get("groups") else "train"
        for key in ("micro_batch_size", "grad_accum"):
            if not isinstance(t[key], int) or t[key] <= 0:
                out.append(f"{where}.{key}: must be a positive integer, got {t[key]!r}")
        for name in g["strategies"]:
            own = STRATEGIES[name].accumulation if name in STRATEGIES else None
            if own is None:
                continue
            steps, keep_effective_batch = own((config.get("strategy_options") or {}).get(name, {}))
            samples = t["micro_batch_size"] * t["grad_accum"] if isinstance(t["micro_batch_size"], int) else 0
            if keep_effective_batch and samples and (steps <= 0 or samples % steps):
                out.append(f"strategy_options.{name}.accum_steps: {steps} must divide {where}.micro_batch_size"
                           f" x grad_accum = {samples} to keep the effective batch")
    return out


def bf16_option_problems(config: dict) -> list[str]:
    """DeepSpeed's bf16-section options (strategies/_deepspeed.BF16_KEYS) where a group's runs have that section."""
    out = []
    for i, g in enumerate(study.groups(config)):
        precision = g.get("train", {}).get("precision", config["train"]["precision"])
        for s in g["strategies"]:
            options = (config.get("strategy_options") or {}).get(s)
            keys = [k for k in BF16_KEYS if isinstance(options, dict) and k in options]
            if not keys or s not in STRATEGIES:
                continue
            if STRATEGIES[s].engine_precision(precision, options) != "bf16-pure":  # no bf16 section
                where = f"groups[{i}].train.precision" if "precision" in g.get("train", {}) else "train.precision"
                out.append(no_bf16_section(s, keys[0], where, precision))
    return out


def compiled_zero3_problems(config: dict) -> list[str]:
    """A stage-3 strategy's option against what its runs compiled around DeepSpeed's hooks must keep
    (strategies/_deepspeed.COMPILED_ZERO3_KEYS): where a group compiles (compile_blocks or compile_model true, or
    compile_blocks `auto` on a GPU platform), DeepSpeed's memory-efficient linear left parameters without gradients."""
    out = []
    for i, g in enumerate(study.groups(config)):
        t = {**config["train"], **g.get("train", {})}
        where = f"groups[{i}].train" if config.get("groups") else "train"
        compiles = [k for k in ("compile_blocks", "compile_model") if t.get(k) is True
                    or k == "compile_blocks" and t.get(k, "auto") == "auto" and config["platform"] != "cpu"]
        for s in g["strategies"]:
            options = (config.get("strategy_options") or {}).get(s)
            stage3 = s in STRATEGIES and STRATEGIES[s].family == "deepspeed" and STRATEGIES[s].zero_stage == 3
            if not (compiles and stage3 and isinstance(options, dict)) or asks_deepcompile(options):
                continue
            out += [f"strategy_options.{s}.{k}: {options[k]!r} traces DeepSpeed's own linear into the code that "
                    f"{where}.{compiles[0]} compiles, which leaves parameters without gradients "
                    "(experiments/zero3_grads): drop the key or compile nothing"
                    for k, v in COMPILED_ZERO3_KEYS.items() if k in options and options[k] != v]
    return out


def size_problems(config: dict, devices: int | None) -> list[str]:
    """World sizes against nodes and the devices of this node."""
    out = []
    nodes = config["nodes"]
    sizes = sorted(set(study.all_names(config, "world_sizes")) | set(layout_sizes(config)))
    for w in sizes:
        if w <= 0 or w % nodes:
            out.append(f"world_sizes: {w} is not a positive multiple of nodes={nodes}")
    per_node = config["devices_per_node"]
    if per_node == "auto":
        per_node = devices if devices is not None else detect_devices(config["platform"])
    biggest = max(sizes) // max(1, nodes)
    if isinstance(per_node, int) and biggest > per_node:
        what = "CPU cores" if config["platform"] == "cpu" else f"{config['platform']} GPUs"
        out.append(f"world_sizes: {biggest} ranks per node but this node has {per_node} {what} "
                   f"(set devices_per_node to override on a cluster submit host)")
    return out


def data_problems(config: dict) -> list[str]:
    out = []
    c = config["corpus"]
    if c["source"] == "local":
        import glob

        if not c["local"].get("paths"):
            out.append("corpus.local.paths: empty, but corpus.source is local")
        for pattern in c["local"].get("paths", []):
            if not glob.glob(pattern):
                out.append(f"corpus.local.paths: no file matches {pattern!r}")
    if c["source"] == "hub" and _is_local(c["hub"]["path"]) and not os.path.exists(c["hub"]["path"]):
        out.append(f"corpus.hub.path: {c['hub']['path']!r} does not exist")
    return out


def bench_problems(config: dict) -> list[str]:
    out = []
    b = config.get("bench") or {}
    if b:
        if b.get("model") not in MODELS and not own.is_source(b.get("model")):
            out.append(f"bench.model: unknown model {b.get('model')!r} (known: {', '.join(MODELS)})")
        for s in list(b.get("strategies", [])) + [b.get("lever_strategy")] + list(b.get("harness_by_strategy", {})) + [
                lever["strategy"] for lever in b.get("levers", []) if "strategy" in lever]:
            if s not in STRATEGIES:
                out.append(f"bench: unknown strategy {s!r} (known: {', '.join(STRATEGIES)})")
        names = [lever["name"] for lever in b.get("levers", [])]
        for name in sorted({n for n in names if names.count(n) > 1}):
            out.append(f"bench.levers: name {name!r} is used twice")
    return out


def separate_documents_problems(config: dict) -> list[str]:
    """train.separate_documents keeps a language model's documents apart; image rows have none."""
    if config.get("data", {}).get("kind") != "images":
        return []
    return [f"{where}.separate_documents: image rows are not documents (data.kind images)"
            for where, t in [("train", config.get("train") or {})] + [
                (f"groups[{i}].train", g.get("train") or {}) for i, g in enumerate(config.get("groups") or [])]
            if t.get("separate_documents")]


def chunked_loss_problems(config: dict) -> list[str]:
    """train.chunked_loss replaces the LM head's forward and the loss: language models, data-parallel layouts,
    neither the compiled loss it replaces nor the whole-model compile (training/chunked_loss.py)."""
    out = []
    for i, g in enumerate(study.groups(config)):
        train, where = {**config["train"], **g.get("train", {})}, (f"groups[{i}]." if config.get("groups") else "")
        if not train.get("chunked_loss"):
            continue
        key = f"{where}train.chunked_loss"
        out += [f"{key}: {m} is an image classifier (no LM head)" for m in g["models"]
                if m in MODELS and MODELS[m].vision]
        out += [f"{key}: not with train.{k}: true ({why})" for k, why in
                (("compile_loss", "the chunked loss replaces it"), ("compile_model", "not checked compiled yet"))
                if train.get(k) is True]
        try:
            out += [f"{key}: data-parallel layouts only ({layout.key})" for layout in study.group_layouts(g)
                    if not layout.data_only]
        except ValueError:
            pass  # reported by layout_problems
    return out


def layout_sizes(config: dict) -> list[int]:
    sizes = []
    for g in study.groups(config):
        try:
            sizes += [layout.world_size for layout in study.group_layouts(g)]
        except ValueError:
            pass  # reported by layout_problems
    return sizes


def layout_problems(config: dict) -> list[str]:
    """Every layout of every group: well formed, fits each model of its group, implemented here."""
    out = []
    for i, g in enumerate(study.groups(config)):
        where = f"groups[{i}].layouts" if config.get("groups") else "layouts"
        for j, entry in enumerate(g.get("layouts") or []):
            try:
                layout = Layout.from_config(entry, f"{where}[{j}]")
            except ValueError as exc:
                out.append(str(exc))
                continue
            block = (config.get("data") or {}).get("block_size")
            out += [p for m in g["models"] if m in MODELS
                    for p in layout.problems(MODELS[m], f"{where}[{j}]", block)]
            out += unimplemented(layout, f"{where}[{j}]")
            out += [p for m in g["models"] for p in model_problems(layout, m, f"{where}[{j}]")]
            train = {**config["train"], **g.get("train", {})}
            if train.get("compile_model") is True and not layout.data_only:
                out.append(f"{where}[{j}]: train.compile_model compiles data-parallel layouts only ({layout.key}); "
                           f"use train.compile_blocks")
            out += [p for s in g["strategies"] if s in STRATEGIES
                    for p in run_problems(layout, STRATEGIES[s], train, f"{where}[{j}]")]
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------- the schema, every violation at once
def dotted(path) -> str:
    """['groups', 0, 'train', 'lr'] -> 'groups[0].train.lr'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(err) -> list[str]:
    """One line per problem of a jsonschema error; for oneOf/anyOf, the branch that matched best."""
    from jsonschema.exceptions import best_match

    if err.validator in ("oneOf", "anyOf") and err.context:
        right_type = [e for e in err.context if e.validator != "type"]  # the branch of the instance's type
        if right_type:
            return describe(best_match(right_type))
        types = " or ".join(str(e.validator_value) for e in err.context)
        return [f"{dotted(err.absolute_path) or 'config'}: {err.instance!r} is not of type {types}"]
    where = dotted(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        known = err.schema.get("properties", {})
        return [unknown_key(where, k, known) for k in err.instance if k not in known]
    message = err.message if len(err.message) <= 200 else err.message[:197] + "..."
    return [f"{where or 'config'}: {message}"]


def schema_problems(config: dict, schema: dict) -> list[str]:
    """Every violation of the schema, one line each, naming the dotted path (and the closest valid key for a
    typo); train overrides (groups[].train, bench.train, bench.levers[].train) are checked against train's keys."""
    from jsonschema import Draft202012Validator

    out = []
    for err in sorted(Draft202012Validator(schema).iter_errors(config), key=lambda e: [str(p) for p in e.path]):
        out += describe(err)
    train_keys = schema["properties"]["train"]["properties"]
    sections = [(f"groups[{i}].train", g.get("train")) for i, g in enumerate(config.get("groups") or [])
                if isinstance(g, dict)]
    bench = config.get("bench") if isinstance(config.get("bench"), dict) else {}
    sections += [("bench.train", bench.get("train")), ("bench.harness", bench.get("harness"))]
    sections += [(f"bench.levers[{i}].train", lv.get("train")) for i, lv in enumerate(bench.get("levers") or [])
                 if isinstance(lv, dict)]
    sections += [(f"bench.harness_by_strategy.{s}", h) for s, h in (bench.get("harness_by_strategy") or {}).items()
                 if isinstance(h, dict)]
    for where, overrides in sections:
        out += [unknown_key(where, k, train_keys) for k in (overrides or {}) if k not in train_keys]
    return out


def check_schema(config: dict, schema_path: str) -> None:
    import yaml

    found = schema_problems(config, yaml.safe_load(Path(schema_path).read_text()))
    if found:
        raise ConfigError("invalid study config:\n  " + "\n  ".join(found))


def validate_study(config: dict, schema_path: str, planning: bool = False) -> None:
    """The whole check of a study config, as rules/common.smk runs it: every schema violation at once (one line
    each), then Snakemake's validation filling the defaults, then the checks that need them (with `planning`, all
    but the node's device count: planning_only)."""
    fill_defaults(config, schema_path)
    check(config, planning=planning)


def add_up_substitutions(config: dict, config_files: list) -> None:
    """`substitutions` of every config file in order, each line once: Snakemake replaces a list with a later file's,
    which would drop a study's own lines (an imported study's) under an overlay that records its own
    (studies/offline_gpu.yaml). Lines given otherwise (`--config`) come after the files'."""
    import yaml

    lines = []
    for path in config_files:
        text = Path(path).read_text(encoding="utf-8") if Path(path).is_file() else ""
        data = yaml.safe_load(text) if text else None
        given = data.get("substitutions") if isinstance(data, dict) else None
        lines += given if isinstance(given, list) else []
    given = config.get("substitutions")
    lines += given if isinstance(given, list) else []
    if lines:
        config["substitutions"] = list(dict.fromkeys(lines))


def fill_defaults(config: dict, schema_path: str) -> None:
    """Every schema violation at once (one line each), then Snakemake's validation filling the defaults."""
    from snakemake.utils import validate

    check_schema(config, schema_path)
    validate(config, schema=schema_path, set_default=True)


def check(config: dict, devices: int | None = None, planning: bool = False, before=None) -> None:
    found = problems(config, devices, planning, before)
    if found:
        raise ConfigError("invalid study config:\n  " + "\n  ".join(found))
