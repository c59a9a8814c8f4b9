"""The runs of a study: the cross product models x strategies x layouts x repeats, or a list of `groups`, each a
cross product with its own training overrides (e.g. gpt2-medium at batch 4 under DDP/ZeRO-1/ZeRO-2 and gpt2-large
at batch 2 under ZeRO-3 in one study).

Layouts (training/layout.py): every entry of `world_sizes` is a pure data-parallel layout of that many ranks;
`layouts` adds layouts with other dimensions (a mapping of degrees, e.g. {dp: 2, pp: 2}).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from workflow_scripts import columns as C
from workflow_scripts import replay, schema
from workflow_scripts.run_spec import SCHEMA_VERSION, RunSpec
from workflow_scripts.training import levers, random_init
from workflow_scripts.training.layout import Layout
from workflow_scripts.training.models import MODELS, model_spec
from workflow_scripts.training.strategies import micro_and_accum
from workflow_scripts.units import GIB


def groups(config: dict) -> list[dict]:
    top = {"models": config["models"], "strategies": config["strategies"], "world_sizes": config["world_sizes"],
           "layouts": config.get("layouts") or [], "train": {}}
    return [{**top, **g} for g in config.get("groups") or [top]]


def group_layouts(g: dict, where: str = "layouts") -> list[Layout]:
    """The group's layouts, world sizes first, without duplicates. Raises ValueError naming the key."""
    out = [Layout.data_parallel(w) for w in g.get("world_sizes") or []]
    for i, entry in enumerate(g.get("layouts") or []):
        out.append(Layout.from_config(entry, f"{where}[{i}]"))
    return list(dict.fromkeys(out))


def runs(config: dict) -> dict[tuple, dict]:
    """(model, strategy, layout key) -> training overrides of its group. Raises on a run claimed twice."""
    out = {}
    for i, g in enumerate(groups(config)):
        where = f"groups[{i}].layouts" if config.get("groups") else "layouts"
        for m in g["models"]:
            for s in g["strategies"]:
                for layout in group_layouts(g, where):
                    key = (m, s, layout.key)
                    if key in out and out[key] != g.get("train", {}):
                        raise ValueError(f"groups[{i}]: {m}/{s}/{layout.key} is already in an earlier group with "
                                         "other train settings")
                    out[key] = g.get("train", {})
    return out


def published_runs(config: dict) -> dict[tuple, dict]:
    """The as-published variant (config `published`): (model, strategy, layout key) -> the fair run's train
    overrides with the publication's own settings for that strategy on top. One run per claimed (model, strategy),
    at the publication's layout. Raises ValueError naming the claim that is not a run of this study."""
    pub = config.get("published") or {}
    if not pub.get("source"):
        return {}
    fair, out = runs(config), {}
    layout = Layout.from_key(pub.get("layout", "ws1")).key
    for i, claim in enumerate(pub.get("claims") or []):
        key = (claim["model"], claim["strategy"], layout)
        if key not in fair:
            raise ValueError(f"published.claims[{i}]: {'/'.join(key)} is not a run of this study (the claims are "
                             "compared with the study's fair rows)")
        out[key] = {**fair[key], **(pub.get("as_published") or {}).get(claim["strategy"], {})}
    return out


def precision_problems(config: dict) -> list[str]:
    """Fairness: every run of one model trains under one precision policy; only published.as_published may differ."""
    seen, out = {}, []
    for i, g in enumerate(groups(config)):
        precision = g.get("train", {}).get("precision", config["train"]["precision"])
        for m in g["models"]:
            first = seen.setdefault(m, (precision, i))
            if first[0] != precision:
                out.append(f"groups[{i}].train.precision: {m} trains under {precision} here and {first[0]} in "
                           f"groups[{first[1]}]: one precision policy per model (fairness); a publication's own "
                           "setup belongs in published.as_published")
    return out


def all_names(config: dict, field: str) -> list:
    seen = []
    for g in groups(config):
        seen += [x for x in g[field] if x not in seen]
    return seen


# the config sections that decide the prepared data, per data kind (data_dir: one folder per value of them)
DATA_SETTINGS = {"text": ("corpus", "tokenizer", "data"), "images": ("images", "data")}
DATA_MANIFESTS = {"text": ("corpus_manifest.json", "tokens_manifest.json"), "images": ("tokens_manifest.json",)}


def data_dir(config: dict) -> str:
    """Where the study's prepared data lives (corpus, tokenizer and token blocks, or image rows, with their
    manifests): one folder per data setting under config `data_dir`, named by a hash of the sections that decide
    it, so every study and overlay asking for the same data shares one copy and another setting never overwrites it."""
    kind = config["data"]["kind"]
    settings = json.dumps({k: config.get(k) for k in DATA_SETTINGS[kind]}, sort_keys=True, default=str)
    return f"{config['data_dir']}/{kind}-{hashlib.sha256(settings.encode()).hexdigest()[:12]}"


def data_paths(config: dict) -> dict:
    """The data every run reads: the blocks in data_dir, the manifest as copied into the study's results."""
    d = data_dir(config)
    return {"train": f"{d}/train.npy", "val": f"{d}/val.npy",
            "manifest": f"{config['results_dir']}/{C.TOKENS_MANIFEST}"}


def resolve(config: dict, model: str, strategy: str, layout: Layout | int, repeat: int, overrides: dict,
            out_dir: str, work_dir: str, ops: list, measured: bool = False) -> RunSpec:
    """Everything one training run depends on (and nothing else: editing figures never reruns training), resolved
    once: the train settings (the config's, defaults filled in by its validation) with `auto` levers decided where
    the rule decides, the micro-batch split, the paths. `layout`: the run's layout (an int: pure data parallel
    over that many ranks); `overrides`: the run's group train settings (and a benchmark variant's levers) over the
    top-level train; `measured`: a study run whose `auto` levers the lever trial decides where config
    auto_levers.by says measurement (the launcher applies the trial's verdict, the one decision that needs the
    machine)."""
    if not isinstance(layout, Layout):
        layout = Layout.data_parallel(layout)
    train = {k: v for k, v in {**config["train"], **overrides}.items() if k != "precision"}
    options = config["strategy_options"].get(strategy, {})
    micro, accum = micro_and_accum({"train": train, "strategy": strategy, "options": options})
    # auto levers made true/false: the spec says what the run does (training/levers.py: the GPU fast path)
    auto = [k for k, v in train.items() if v == replay.AUTO]
    trial = lever_trial_path(config, model, strategy, layout.key) if measured else None
    train = levers.resolve(train, config["platform"], layout.degrees(), MODELS[model].family,
                           block_flops(config, model, micro, layout.degrees()),
                           levers.evidence_family(strategy, options), trial)
    train["seed"] = run_seed(train, repeat)
    guard, profile = None, None
    if config["plan"].get("refuse_oom") and config["platform"] != "cpu":  # opt-in: launch.predicted_oom
        plan = config["plan"]
        guard = {"usable_bytes": (plan["gpu_memory_gib"] - plan["headroom_gib"]) * GIB,
                 "gpu_memory_gib": plan["gpu_memory_gib"], "headroom_gib": plan["headroom_gib"]}
    if config["profile"].get("enabled"):  # only then: a spec without traces stays what it was
        profile = config["profile"]
    weights, subs = initial_weights(config, model)
    source = (config.get("strategy_sources") or {}).get(strategy)
    if source:
        subs = [*subs, *source["substitutions"]]
    spec = RunSpec(
        run_id=f"{model}__{strategy}__{layout.key}__r{repeat}", study=config["study"], model=model,
        strategy=strategy, world_size=layout.world_size, layout=layout.degrees(), repeat=int(repeat),
        nodes=config["nodes"], platform=config["platform"],
        precision=overrides.get("precision", config["train"]["precision"]), train=train, options=options,
        pretrained=weights, model_overrides=config["model_overrides"].get(model, {}),
        sampler=config["sampler"], substitutions=subs, data=data_paths(config), ops=list(ops),
        out_dir=out_dir, work_dir=work_dir, memory_guard=guard, profile=profile,
        trace_dir=trace_dir(config, model, strategy, layout.key, repeat) if profile else None,
        batch={"micro_batch": micro, "accum": accum}, model_source=model_source(model),
        trackers=list(config["trackers"]) or None,
        random_init=None if weights else random_init_dir(config, random_init_recipe(config, model, train)),
        strategy_source={k: source[k] for k in ("base", "deepspeed", "sha256")} if source else None)
    against = (config.get("verify") or {}).get("against")
    if against:  # a verification rerun: the committed run's decisions, not today's (replay.py)
        spec = spec.replace(train={**replay.decisions(spec, auto, against), "seed": train["seed"]})
    return spec


def candidate(config: dict, model: str, strategy: str, layout: Layout | int, micro_batch: int,
              seq_len: int | None = None, precision: str | None = None) -> RunSpec:
    """A plan's candidate (rules plan and scale): the run this study would make of `model` under `strategy` at
    `layout` with `micro_batch` samples per optimizer-step share (train.micro_batch_size), resolved by `resolve`
    itself: its train settings, the levers the rule decides (never a measurement: a plan runs nothing), the
    strategy's micro-batch split, options and overrides. `seq_len`, `precision`: the plan's own, where it sets
    them. Its paths are under the study's plan folder: it never runs."""
    if seq_len is not None:
        config = {**config, "data": {**config["data"], "block_size": seq_len}}
    if not isinstance(layout, Layout):
        layout = Layout.data_parallel(layout)
    overrides = {"micro_batch_size": micro_batch, **({"precision": precision} if precision else {})}
    root = f"{config['results_dir']}/plan/{model}/{strategy}/{layout.key}/mb{micro_batch}"
    return resolve(config, model, strategy, layout, 0, overrides, out_dir=root, work_dir=root, ops=[])


def initial_weights(config: dict, model: str) -> tuple[str | None, list[str]]:
    """The weights a run of `model` starts from (its `pretrained` source, None for a random initialisation) and the
    run's substitutions: the study's, and with `weights: random` the pretrained weights it does not load."""
    named = config["pretrained"].get(model)
    if named is None or config["weights"] == "pretrained":
        return named, list(config["substitutions"])
    return None, [*config["substitutions"],
                  f"weights: random initialisation instead of the pretrained {named} (weights: random)"]


def run_seed(train: dict, repeat: int) -> int:
    """A run's seed: a different repeat trains with a different seed, so repeats measure variance, not the same run
    twice; the base is the group's seed where its train section sets one."""
    return int(train["seed"]) + int(repeat)


def random_inits(config: dict, runs) -> dict[str, dict]:
    """{folder: recipe} of every random initialisation that the runs (model, group train overrides, repeat) start
    from: rule random_init's outputs. A run from pretrained weights has none."""
    inits = {}
    for model, overrides, repeat in runs:
        if initial_weights(config, model)[0] is None:
            train = {**config["train"], **overrides}
            recipe = random_init_recipe(config, model, {**train, "seed": run_seed(train, repeat)})
            inits[random_init_dir(config, recipe)] = recipe
    return inits


def random_init_recipe(config: dict, model: str, train: dict) -> dict:
    """Everything a random initialisation of `model` depends on (training/random_init.py): the model and its
    source, its overrides, the seed, the embedding-row settings and the prepared data (its vocabulary and
    sequence length)."""
    d = data_dir(config)
    return {"model": model, "model_source": model_source(model),
            "model_overrides": config["model_overrides"].get(model, {}), "seed": int(train["seed"]),
            "train": {"vocab_multiple": train["vocab_multiple"], "embedding_rows": train.get("embedding_rows")},
            "data": {"train": f"{d}/train.npy", "val": f"{d}/val.npy", "manifest": f"{d}/tokens_manifest.json"}}


def random_init_dir(config: dict, recipe: dict) -> str:
    """The folder rule random_init writes a recipe's initialisation into, beside the data it was built for."""
    return f"{data_dir(config)}/random_init/{recipe['model']}-{random_init.key(recipe)}"


def model_source(model: str) -> dict | None:
    """Where a study's own model is read from and a hash of its config.json (RunSpec.model_source); None for a
    registry model."""
    source = MODELS[model].source
    if source is None:
        return None
    config = Path(source) / "config.json"
    digest = hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None
    return {"source": source, "config_sha256": digest}


def run_spec(config: dict, *args, **kwargs) -> dict:
    """resolve's spec as its JSON mapping, for a caller that edits it before writing it (the bench harness)."""
    return resolve(config, *args, **kwargs).to_dict()


def from_request(request: dict) -> RunSpec:
    """A run spec written by hand (a test's run, a run started without the workflow), without a schema_version:
    the keys it leaves out take the schema's defaults (train, sampler, nodes), a pure data-parallel layout over
    its world_size and the micro-batch split of its strategy, as `resolve` gives them."""
    train = {k: v for k, v in schema.filled("train", request.get("train")).items() if k != "precision"}
    world = request["world_size"]
    layout = request["layout"] if "layout" in request else Layout.data_parallel(world).degrees()
    options = request.get("options") or {}
    micro, accum = micro_and_accum({"train": train, "strategy": request["strategy"], "options": options})
    return RunSpec.from_dict({**request, "schema_version": SCHEMA_VERSION, "train": train, "layout": layout,
                              "options": options, "nodes": request.get("nodes", schema.default("nodes")),
                              "sampler": schema.filled("sampler", request.get("sampler")),
                              "batch": request.get("batch") or {"micro_batch": micro, "accum": accum}},
                             "run spec (by hand)")


def lever_run(config: dict, lever: dict) -> tuple[str, dict]:
    """A bench lever's strategy (its own or bench.lever_strategy) and its strategy options: the lever's over the
    study's strategy_options of that strategy (what its runs get, and which ops they need)."""
    strategy = lever.get("strategy", config["bench"]["lever_strategy"])
    return strategy, {**config["strategy_options"].get(strategy, {}), **(lever.get("options") or {})}


def lever_trial_path(config: dict, model: str, strategy: str, layout: str) -> str | None:
    """Where the lever trial of a configuration writes its verdict (rule lever_trial), if the study measures."""
    evidence = levers.evidence_family(strategy, config["strategy_options"].get(strategy, {}))
    if levers.decided_by(config.get("auto_levers"), config["platform"], config["nodes"], evidence) != "measurement":
        return None
    return f"{config['results_dir']}/{C.LEVER_TRIAL.format(model=model, strategy=strategy, layout=layout)}"


def lever_trial_root(config: dict, model: str, strategy: str, layout: str) -> str:
    """The lever trial's scratch: its candidates' runs and the trial file (not results: the verdict is)."""
    return f"{config['work_dir']}/lever_trial/{model}/{strategy}/{layout}"


# train settings that leave a step's speed as it is: a cached lever decision holds across them (the levers
# themselves are the candidates')
NOT_SHAPE = ("seed", "epochs", "max_steps", "max_train_samples", "lr", "min_lr", "lr_warmup_steps", "weight_decay",
             "betas", "eps", "timing_warmup_steps", "log_every", "eval_batches", "checkpoint_every",
             "fault_injection", "micro_batch_size", "grad_accum", "compile_auto", "lever_trial", *levers.TRIAL_KEYS)


def lever_trial_specs(config: dict, model: str, strategy: str, layout: Layout, overrides: dict,
                      ops: list) -> dict:
    """The lever trial of one configuration: {"specs": {candidate: RunSpec}, "skipped": {candidate: why},
    "shape": ..., "cache": auto_levers.cache}. Each spec is the configuration's repeat 0 with the candidate's levers,
    `auto_levers.steps` timed steps, no checkpoints, no sampler and no traces; results and scratch under
    work_dir/lever_trial (not results: the verdict is). `shape`: what a cached decision is keyed by besides the
    machine (job/lever_trial.py): the model and its overrides, the strategy and its options, the layout, precision,
    the micro-batch split, the sample's size (tokens, or the image's side), the train settings that change a step's
    speed (all but NOT_SHAPE) and the candidates."""
    cfg = config["auto_levers"]
    train = {**config["train"], **overrides}
    root = lever_trial_root(config, model, strategy, layout.key)
    one = resolve(config, model, strategy, layout, 0, overrides, out_dir=root, work_dir=root, ops=ops)
    evidence = levers.evidence_family(strategy, one.options)
    names, skipped = levers.trial_candidates(cfg["candidates"], config["platform"], layout.data_only,
                                             MODELS[model].family, train,
                                             block_flops(config, model, one.micro_batch, layout.degrees()),
                                             evidence=evidence)
    steps = {"max_steps": train["timing_warmup_steps"] + cfg["steps"], "checkpoint_every": 0,
             "log_every": max(1, cfg["steps"]), "eval_batches": 1}
    specs = {}
    for name, settings in names.items():
        spec = resolve(config, model, strategy, layout, 0, {**overrides, **settings, **steps},
                       out_dir=f"{root}/{name}", work_dir=f"{root}/{name}/work", ops=ops)
        specs[name] = spec.replace(sampler={**spec.sampler, "backend": "none"}, profile=None, trace_dir=None)
    vision = model_spec(model, (config.get("model_overrides") or {}).get(model)).vision
    sample = {"image_size": config["images"]["image_size"]} if vision else {"tokens": config["data"]["block_size"]}
    shape = {"model": model, "model_overrides": one.model_overrides, "strategy": strategy, "options": one.options,
             "layout": one.layout, "nodes": one.nodes, "platform": one.platform, "precision": one.precision,
             "batch": one.batch, "sample": sample, "substitutions": one.substitutions,
             "train": {k: v for k, v in sorted(one.train.items()) if k not in NOT_SHAPE},
             "candidates": names, "skipped": sorted(skipped), "min_compiled_share": cfg["min_compiled_share"]}
    return {"specs": specs, "skipped": skipped, "shape": shape, "cache": cfg.get("cache", "auto"),
            "min_compiled_share": cfg["min_compiled_share"]}


def block_flops(config: dict, model: str, micro_batch: int, layout: dict, seq_len: int | None = None) -> float:
    """Forward matmul FLOPs of one transformer block call: 2 x the block's matmul weights x the tokens of a
    micro-batch on the rank (cp splits the sequence); a ViT's tokens are its patches + 1. Not divided by tp: eager
    tensor parallel pays DTensor dispatch on the host per op, which compiling removes (3.7x on the 3B shape on two
    H200). `seq_len`: a language model's tokens per sample, if not the data's
    block size (the planner's plan.seq_len); the study's model_overrides change the shape."""
    spec = model_spec(model, (config.get("model_overrides") or {}).get(model))
    if spec.vision:
        tokens = spec.patches(config["images"]["image_size"]) + 1
    else:
        tokens = seq_len or config["data"]["block_size"]
    per_rank = micro_batch * tokens / layout.get("cp", 1)
    return 2.0 * spec.block_matmul_params * per_rank


def trace_dir(config: dict, model: str, strategy: str, layout: str, repeat) -> str:
    """Where a run's raw profiler traces go (work_dir: large, compressed, not results)."""
    return f"{config['work_dir']}/traces/{model}/{strategy}/{layout}/r{repeat}"
