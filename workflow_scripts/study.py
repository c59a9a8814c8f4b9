"""The runs of a study: the cross product models x strategies x world_sizes x repeats, or a list of `groups`,
each a cross product with its own training overrides (e.g. gpt2-medium at batch 4 under DDP/ZeRO-1/ZeRO-2 and
gpt2-large at batch 2 under ZeRO-3 in one study)."""
from __future__ import annotations


def groups(config: dict) -> list[dict]:
    top = {"models": config["models"], "strategies": config["strategies"], "world_sizes": config["world_sizes"],
           "train": {}}
    return [{**top, **g} for g in config.get("groups") or [top]]


def runs(config: dict) -> dict[tuple, dict]:
    """(model, strategy, world_size) -> training overrides of its group. Raises on a run claimed twice."""
    out = {}
    for i, g in enumerate(groups(config)):
        for m in g["models"]:
            for s in g["strategies"]:
                for w in g["world_sizes"]:
                    key = (m, s, int(w))
                    if key in out and out[key] != g.get("train", {}):
                        raise ValueError(f"groups[{i}]: {m}/{s}/ws{w} is already in an earlier group with other "
                                         "train settings")
                    out[key] = g.get("train", {})
    return out


def all_names(config: dict, field: str) -> list:
    seen = []
    for g in groups(config):
        seen += [x for x in g[field] if x not in seen]
    return seen


def run_spec(config: dict, model: str, strategy: str, world: int, repeat: int, overrides: dict, out_dir: str,
             work_dir: str, ops: list) -> dict:
    """Everything one training run depends on (and nothing else: editing figures never reruns training).
    `overrides`: the run's group train settings (and a benchmark variant's levers) over the top-level train."""
    R, W = config["results_dir"], config["work_dir"]
    spec = {
        "run_id": f"{model}__{strategy}__ws{world}__r{repeat}",
        "study": config["study"],
        "model": model,
        "strategy": strategy,
        "world_size": int(world),
        "repeat": int(repeat),
        "nodes": config["nodes"],
        "platform": config["platform"],
        "precision": overrides.get("precision", config["train"]["precision"]),
        "train": {k: v for k, v in {**config["train"], **overrides}.items() if k != "precision"},
        "options": config["strategy_options"].get(strategy, {}),
        "pretrained": config["pretrained"].get(model),
        "model_overrides": config["model_overrides"].get(model, {}),
        "sampler": config["sampler"],
        "substitutions": config["substitutions"],
        "data": {"train": f"{W}/data/train.npy", "val": f"{W}/data/val.npy",
                 "manifest": f"{R}/data/tokens_manifest.json"},
        "ops": list(ops),
        "torch_extensions_dir": f"{W}/torch_extensions",
        "out_dir": out_dir,
        "work_dir": work_dir,
    }
    # a different repeat trains with a different seed, so repeats measure variance, not the same run twice
    spec["train"]["seed"] = config["train"]["seed"] + int(repeat)
    return spec
