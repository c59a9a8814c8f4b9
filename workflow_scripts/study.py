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
