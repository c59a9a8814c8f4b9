"""Input files -> one study: each file read by the module of its format, training files paired with strategy files
into training configurations (`Variant`s), the variants made one study (one strategy per variant, groups where their
train settings differ), checked by the pipeline's own config check, written as YAML with a header that says what
became of every key.

Pairing: a LLaMA-Factory YAML that names its DeepSpeed JSON (`deepspeed:`) is one variant with it; a YAML that names
none pairs with every strategy file given beside it that no YAML names (DeepSpeed JSONs, accelerate configs), one
variant each, or is one DDP variant alone; a torchtitan TOML is a variant of its own; strategy files without any
training file are variants of their own (the written study then holds only what they say: an overlay to give after
a study). Several variants that map to one named strategy are one variant if they agree, two DDP variants at one
effective batch that differ only in their split become ddp and grad_accum, and any other clash is refused:
strategy_options holds one section per strategy name and groups carry none.
"""

from __future__ import annotations

import json
import os
import tomllib

import yaml

from workflow_scripts import schema
from workflow_scripts.importers import accelerate, deepspeed_json, llamafactory, torchtitan
from workflow_scripts.importers.common import ImportRefused, Ledger, Record, Variant, hidden_size

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# what the written study says first, in this order (every other key follows)
ORDER = (
    "study",
    "results_dir",
    "work_dir",
    "platform",
    "nodes",
    "substitutions",
    "corpus",
    "tokenizer",
    "data",
    "models",
    "pretrained",
    "strategies",
    "world_sizes",
    "layouts",
    "groups",
    "repeats",
    "train",
    "strategy_options",
    "trackers",
)


def read_files(paths: list[str], ledger: Ledger, world: int | None) -> dict:
    """Every file by its format: {"trainings": [...], "launches": [...], "jsons": {path: cfg}, "titans": [...]}."""
    found = {"trainings": [], "launches": [], "jsons": {}, "titans": []}
    for path in paths:
        low = path.lower()
        if not os.path.isfile(path):
            ledger.record(path, "file").refuse("", "no such file")
            continue
        if low.endswith(".json"):
            rec = ledger.record(path, deepspeed_json.KIND)
            found["jsons"][os.path.abspath(path)] = rec.data = deepspeed_json.load(path, rec)
        elif low.endswith(".toml"):
            rec = ledger.record(path, torchtitan.KIND)
            try:
                data = tomllib.loads(open(path).read())
            except tomllib.TOMLDecodeError as exc:
                rec.refuse("", f"not TOML: {exc}")
                continue
            rec.data = data
            found["titans"].append(torchtitan.read(path, data, rec, world))
        elif low.endswith((".yaml", ".yml")):
            try:
                data = yaml.safe_load(open(path).read())
            except yaml.YAMLError as exc:
                ledger.record(path, "YAML").refuse("", f"not YAML: {str(exc).splitlines()[0]}")
                continue
            if accelerate.looks_like(data):
                rec = ledger.record(path, accelerate.KIND)
                rec.data = data
                found["launches"].append(accelerate.read(path, data, rec))
            elif llamafactory.looks_like(data):
                rec = ledger.record(path, llamafactory.KIND)
                rec.data = data
                found["trainings"].append(llamafactory.read(path, data, rec))
            else:
                ledger.record(path, "YAML").refuse(
                    "",
                    "neither a LLaMA-Factory train YAML (model_name_or_path, "
                    "stage, finetuning_type) nor an accelerate config "
                    "(distributed_type)",
                )
        else:
            ledger.record(path, "file").refuse("", "not .yaml, .yml, .json or .toml")
    return found


def variants(found: dict, ledger: Ledger, world: int | None, problems: list) -> list[Variant]:
    jsons = found["jsons"]
    named = {t.deepspeed for t in found["trainings"] if t.deepspeed}
    named |= {a.deepspeed_file for a in found["launches"] if a.deepspeed_file}
    for path in sorted(p for p in named if p not in jsons):  # named by a file, not given: read it too
        rec = ledger.record(path, deepspeed_json.KIND)
        jsons[path] = rec.data = deepspeed_json.load(path, rec)
    loose = [("json", p) for p in jsons if p not in named] + [("launch", a) for a in found["launches"]]
    out = []
    for t in found["trainings"]:
        if t.deepspeed:
            out.append(variant(t, ("json", t.deepspeed), jsons, ledger, world, problems))
        elif loose:
            out += [variant(t, s, jsons, ledger, world, problems) for s in loose]
        else:
            out.append(variant(t, None, jsons, ledger, world, problems))
    if loose and found["trainings"] and all(t.deepspeed for t in found["trainings"]):
        names = ", ".join(os.path.basename(p if k == "json" else p.path) for k, p in loose)
        problems.append(
            f"{names}: no training file to pair with (every LLaMA-Factory YAML names its own DeepSpeed JSON)"
        )
    if not found["trainings"]:
        if loose and found["titans"]:
            names = ", ".join(os.path.basename(p if k == "json" else p.path) for k, p in loose)
            problems.append(f"{names}: a torchtitan TOML takes no strategy file (its [parallelism] is its strategy)")
        elif loose:
            out += [variant(None, s, jsons, ledger, world, problems) for s in loose]
    out += found["titans"]
    return out


def variant(t, strategy_file, jsons: dict, ledger: Ledger, world: int | None, problems: list) -> Variant:
    """One training configuration: a LLaMA-Factory YAML's settings (or none) with one strategy file (or none)."""
    v = Variant(sources=[t.path] if t else [])
    train = dict(t.train) if t else {}
    v.strategy, v.options = (t.ddp[0], dict(t.ddp[1])) if t else ("ddp", {})
    v.precision, v.precision_why = (t.precision, t.precision_why) if t else (None, "")
    launch = strategy_file[1] if strategy_file and strategy_file[0] == "launch" else None
    if launch:
        v.sources.append(launch.path)
        v.nodes, v.platform = launch.nodes, launch.platform
        if launch.world_size is not None:
            if world is not None and world != launch.world_size:
                launch.record.refuse("num_processes", f"{launch.world_size}, but --world-size says {world}")
            world = launch.world_size
        train.update({k: v_ for k, v_ in launch.train.items() if k != "gradient_checkpointing"})
        if launch.train.get("gradient_checkpointing"):
            train["gradient_checkpointing"] = train.get("gradient_checkpointing") or True
        if t is not None:
            agree_precision(t, launch)
    cfg, rec, prefix = None, None, ""
    if strategy_file and strategy_file[0] == "json":
        cfg, rec = jsons[strategy_file[1]], ledger.record(strategy_file[1], deepspeed_json.KIND)
        v.sources.append(strategy_file[1])
    elif launch and launch.family == "deepspeed":
        if launch.deepspeed_file:
            cfg, rec = dict(jsons[launch.deepspeed_file]), ledger.record(launch.deepspeed_file, deepspeed_json.KIND)
            v.sources.append(launch.deepspeed_file)
            if t is None:  # accelerate fills bf16/fp16 "auto" from its mixed_precision
                for name in ("bf16", "fp16"):
                    if isinstance(cfg.get(name), dict) and cfg[name].get("enabled") == "auto":
                        cfg[name] = {**cfg[name], "enabled": launch.mixed == name}
        else:
            cfg, rec, prefix = dict(launch.deepspeed_inline), Record(launch.path, "inline"), "deepspeed_config: "
            if t is not None:  # the Trainer's values decide these
                for key in ("gradient_accumulation_steps", "gradient_clipping"):
                    if key in cfg:
                        cfg[key] = "auto"
                        launch.record.not_applied(f"deepspeed_config.{key}", "the Trainer's value decides")
                for name in ("bf16", "fp16"):
                    cfg[name] = {"enabled": "auto"}
    if cfg is not None:
        hidden = hidden_size(t.model) if t else (None, "no training file names the model")
        ds = deepspeed_json.read(cfg, rec, t.hf if t else None, train, hidden, world, prefix)
        if rec.path == getattr(launch, "path", None) and rec.kind == "inline":
            absorb(launch.record, rec)
        train.update(ds.train)
        if ds.world_size is not None:
            if world is not None and world != ds.world_size:
                rec.refuse("train_batch_size", f"makes world size {ds.world_size}, not {world}")
            world = ds.world_size
        v.strategy, v.options, v.precision, v.precision_why = ds.strategy, ds.options, ds.precision, ds.precision_why
        if t is not None:
            schedule(t, train, world, ds.schedule)
        elif ds.schedule:
            train.update({k: x for k, x in ds.schedule.items() if x is not None})
    else:
        if launch and launch.family == "fsdp":
            v.strategy, v.options = "fsdp", dict(launch.options)
            v.precision, v.precision_why = accelerate.precision(launch)
        elif launch and t is None:
            v.precision, v.precision_why = accelerate.precision(launch)
        if t is not None:
            schedule(t, train, world, None)
    if t is not None:
        v.model, v.pretrained, v.sections, v.trackers = t.model, t.weights, t.sections, t.trackers
    if world is None and t is not None:
        problems.append(
            f"{', '.join(os.path.basename(s) for s in v.sources)}: the world size is in none of the "
            "files (LLaMA-Factory runs on the ranks torchrun starts): give --world-size"
        )
    v.world_size, v.train = world, train
    return v


def agree_precision(t, launch) -> None:
    """accelerate's mixed_precision and the Trainer's bf16/fp16 name one precision, or the import is refused."""
    mixed = "bf16" if t.hf["bf16"] else "fp16" if t.hf["fp16"] else "no"
    if launch.mixed != mixed:
        launch.record.refuse(
            "mixed_precision",
            f"{launch.mixed}, but {os.path.basename(t.path)} trains with bf16 {t.hf['bf16']}, fp16 {t.hf['fp16']}",
        )


def schedule(t, train: dict, world: int | None, ds_schedule: dict | None) -> None:
    """The Trainer's schedule (llamafactory.schedule), or the DeepSpeed JSON's scheduler, which replaces it."""
    rec = t.record
    train.update(llamafactory.schedule(t, world or 1, rec))
    if ds_schedule is None:
        return
    for key in ("lr_scheduler_type", "lr_scheduler_kwargs"):
        if key in t.given:
            rec.not_applied(key, "the DeepSpeed JSON's scheduler replaces it")
    train.update({k: x for k, x in ds_schedule.items() if x is not None})


def absorb(into: Record, scratch: Record) -> None:
    """A synthesised JSON's notes (accelerate's inline DeepSpeed keys) into the accelerate config's record: what it
    substitutes and refuses."""
    for key, (what, text) in scratch.notes.items():
        if what == "substituted":
            into.substituted(f"deepspeed_config ({key.removeprefix('deepspeed_config: ')})", text)
    into.refused += [line for line in scratch.refused if line not in into.refused]
    into.unknown += scratch.unknown


# ---------------------------------------------------------------- variants -> one study
def settle_names(vs: list[Variant], problems: list) -> list[Variant]:
    """One variant per (strategy name, model, layout): agreeing duplicates merged, two DDP splits of one effective
    batch made ddp + grad_accum, any other clash refused."""
    out: list[Variant] = []
    for v in vs:
        clash = [u for u in out if u.strategy == v.strategy]
        if not clash:
            out.append(v)
            continue
        u = clash[0]
        if same(u, v):
            u.sources += [s for s in v.sources if s not in u.sources]
            continue
        split = split_of(u, v)
        if split is not None and not any(w.strategy == "grad_accum" for w in out):
            low, high = split
            high.strategy = "grad_accum"
            high.options = {"accum_steps": high.train["grad_accum"], "keep_effective_batch": True}
            high.train = {
                **high.train,
                "micro_batch_size": low.train["micro_batch_size"],
                "grad_accum": low.train["grad_accum"],
            }
            out.append(v)  # u is in already: one of them is now grad_accum
            continue
        first, second = (" + ".join(os.path.basename(s) for s in w.sources) for w in (u, v))
        problems.append(
            f"{first} and {second}: both are strategy {v.strategy} with other {differences(u, v)}; a study has one "
            "strategy_options section per strategy name and groups carry none: import them into two studies"
        )
    return out


def same(u: Variant, v: Variant) -> bool:
    keys = ("model", "options", "train", "world_size", "layout", "precision", "sections")
    return all(getattr(u, k) == getattr(v, k) for k in keys)


def split_of(u: Variant, v: Variant):
    """(the variant with the smaller accumulation, the other) where u and v are DDP at one effective batch that
    differ only in the micro-batch split; None otherwise."""
    if u.strategy != "ddp" or u.options or v.options:
        return None
    rest = ("micro_batch_size", "grad_accum")
    if any(getattr(u, k) != getattr(v, k) for k in ("model", "world_size", "layout", "precision", "sections")):
        return None
    if {k: x for k, x in u.train.items() if k not in rest} != {k: x for k, x in v.train.items() if k not in rest}:
        return None
    a, b = u.train, v.train
    if a["micro_batch_size"] * a["grad_accum"] != b["micro_batch_size"] * b["grad_accum"] or a == b:
        return None
    return (u, v) if a["grad_accum"] < b["grad_accum"] else (v, u)


def differences(u: Variant, v: Variant) -> str:
    out = []
    if u.options != v.options:
        out.append(f"strategy_options ({diff(u.options, v.options)})")
    if u.train != v.train:
        out.append(f"train settings ({diff(u.train, v.train)})")
    for k in ("model", "world_size", "layout", "precision"):
        if getattr(u, k) != getattr(v, k):
            out.append(f"{k} ({getattr(u, k)} vs {getattr(v, k)})")
    return ", ".join(out) or "sources"


def diff(a: dict, b: dict) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return "; ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys[:4])


def one_of(vs: list[Variant], field: str, problems: list, default=None):
    values = [getattr(v, field) for v in vs if getattr(v, field) is not None]
    distinct = [json.dumps(x, sort_keys=True) for x in values]
    if len(set(distinct)) > 1:
        problems.append(
            f"the files name more than one {field}: {', '.join(dict.fromkeys(distinct))} (one study has one)"
        )
    return values[0] if values else default


def study_config(vs: list[Variant], name: str, platform: str | None, problems: list, notes: list) -> dict:
    """The study of the variants."""
    chosen = next((v.precision for v in vs if v.precision), None)
    for v in vs:
        if v.precision and v.precision != chosen:
            files = " + ".join(os.path.basename(x) for x in v.sources)
            notes.append(
                f"{v.strategy} ({files}): precision {chosen} instead of {v.precision} ({v.precision_why}): "
                "one precision policy per study, the first file's"
            )
    sections = one_of(vs, "sections", problems, {})
    platforms = {v.platform for v in vs if v.platform}
    if platform and platforms and platforms != {platform}:
        problems.append(f"--platform {platform}, but the files say {', '.join(sorted(platforms))}")
    platform = platform or (platforms.pop() if len(platforms) == 1 else None) or "cuda"
    config = {
        "study": name,
        # beside the schema's default results_dir and work_dir: <its folder>/<study>/<platform>, <its folder>/<study>
        "results_dir": os.path.join(os.path.dirname(schema.default("results_dir")), name, platform),
        "work_dir": os.path.join(os.path.dirname(schema.default("work_dir")), name),
        "platform": platform,
    }
    nodes = one_of(vs, "nodes", problems)
    if nodes:
        config["nodes"] = nodes
    config.update(sections)
    models = [v.model for v in vs if v.model]
    if models:
        config["models"] = list(dict.fromkeys(models))
        weights = {v.model: v.pretrained for v in vs if v.pretrained}
        if weights:
            config["pretrained"] = weights
    config["strategies"] = list(dict.fromkeys(v.strategy for v in vs))
    sizes = [v.world_size for v in vs if v.world_size]
    if sizes:
        config["world_sizes"] = list(dict.fromkeys(sizes))
    groups = {}
    for v in vs:
        key = json.dumps([v.model, v.train, v.world_size, v.layout], sort_keys=True)
        groups.setdefault(key, []).append(v)
    common = shared([v.train for v in vs])
    if chosen:
        common = {"precision": chosen, **common}
    if len(groups) == 1:
        g = next(iter(groups.values()))
        if g[0].layout:
            config["layouts"] = [g[0].layout]
    else:
        config["groups"] = []
        for g in groups.values():
            v = g[0]
            entry = {
                "models": [v.model] if v.model else config.get("models", []),
                "strategies": [u.strategy for u in g],
            }
            if v.world_size:
                entry["world_sizes"] = [v.world_size]
            if v.layout:
                entry["layouts"] = [v.layout]
            own = {k: x for k, x in v.train.items() if k not in common or common[k] != x}
            if own:
                entry["train"] = own
            config["groups"].append(entry)
        if not all(e["models"] for e in config["groups"]):
            problems.append("the strategy files' variants differ, but no file names the model their groups train")
    config["repeats"] = 1
    config["train"] = common
    options = {v.strategy: v.options for v in vs if v.options}
    if options:
        config["strategy_options"] = options
    trackers = one_of(vs, "trackers", problems)
    if trackers is not None and any(v.trackers is not None for v in vs):
        config["trackers"] = trackers
    return config


def shared(trains: list[dict]) -> dict:
    """The train keys every variant sets to one value."""
    if not trains:
        return {}
    first = trains[0]
    return {k: x for k, x in first.items() if all(k in t and t[k] == x for t in trains[1:])}


def check(config: dict) -> list[str]:
    """The pipeline's config check of the study over config.yaml, as Snakemake reads them (planning: no device
    count, no hub download)."""
    import copy

    from snakemake.utils import update_config

    from workflow_scripts import config_check

    merged = yaml.safe_load(open(os.path.join(REPO, "config.yaml")).read())
    update_config(merged, copy.deepcopy(config))
    try:
        config_check.validate_study(merged, str(schema.PATH), planning=True)
    except config_check.ConfigError as exc:
        return [line.strip() for line in str(exc).splitlines()[1:]]
    except Exception as exc:  # Snakemake's own validation error
        return [str(exc).splitlines()[0]]
    return []


def import_files(
    paths: list[str],
    study: str,
    world: int | None = None,
    platform: str | None = None,
    strict: bool = False,
    run_check: bool = True,
) -> tuple[dict, Ledger]:
    """The study of the files and the ledger of what became of their keys. ImportRefused (one line) for unknown
    keys, values without a counterpart, files that disagree, a study the config check refuses, and with `strict`
    any substitution."""
    ledger, problems, notes = Ledger(), [], []
    found = read_files(paths, ledger, world)
    vs = variants(found, ledger, world, problems)
    for rec in ledger.records.values():
        rec.sweep(rec.data)
    ledger.raise_problems()
    if problems:
        raise ImportRefused("import refused: " + "; ".join(dict.fromkeys(problems)))
    vs = settle_names(vs, problems)
    config = study_config(vs, study, platform, problems, notes)
    if problems:
        raise ImportRefused("import refused: " + "; ".join(dict.fromkeys(problems)))
    subs = ledger.substitutions() + notes
    deviations = ledger.substitutions(applied_only=True) + notes
    if strict and deviations:
        raise ImportRefused("import refused (--strict): " + "; ".join(deviations))
    if subs:
        config["substitutions"] = subs
    config = {**{k: config[k] for k in ORDER if k in config}, **{k: x for k, x in config.items() if k not in ORDER}}
    if run_check:
        found = check(config)
        if found:
            raise ImportRefused("import refused: the imported study fails the study check: " + "; ".join(found))
    return config, ledger


def text(config: dict, ledger: Ledger, command: str) -> str:
    """The study as YAML, its header saying where it came from and what became of every key."""
    lines = [f"# Imported by `{command}` (docs/importing.md) from:"]
    lines += [f"#   {r.path} ({r.kind})" for r in ledger.records.values()]
    lines.append("# What became of every key (mapped -> study key; substituted and not applied: `substitutions`):")
    for r in ledger.records.values():
        for key, (what, detail) in r.notes.items():
            lines.append(f"#   {r.name}: {key}: {what}" + (f": {detail}" if what != "substituted" else ""))
    body = yaml.dump(config, Dumper=Dumper, sort_keys=False, width=118)
    return "\n".join(lines) + "\n" + body


class Dumper(yaml.SafeDumper):
    """Short lists and mappings of plain values on one line (as the studies write them), the rest as blocks."""


def _short(values) -> bool:
    return all(isinstance(x, (str, int, float, bool, type(None))) for x in values) and len(str(values)) <= 100


Dumper.add_representer(list, lambda d, x: d.represent_sequence("tag:yaml.org,2002:seq", x, flow_style=_short(x)))
Dumper.add_representer(
    dict, lambda d, x: d.represent_mapping("tag:yaml.org,2002:map", x.items(), flow_style=_short(x.values()))
)
