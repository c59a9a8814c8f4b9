"""The study schema (schemas/config.schema.yaml) as code reads it: a key's default lives there, once, and every
module that needs one asks here instead of restating it."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PATH = Path(__file__).resolve().parents[1] / "schemas/config.schema.yaml"


@lru_cache(maxsize=1)
def schema() -> dict:
    import yaml

    return yaml.safe_load(PATH.read_text())


def default(*keys: str):
    """The default of a config key, e.g. default("verify", "tolerances") -> {"loss_abs": 0.001, ...}; an object
    without a default of its own collects its properties' defaults."""
    node = schema()
    for k in keys:
        node = node["properties"][k]
    return _default(node)


def _default(node: dict):
    props = node.get("properties")
    if props and node.get("default") in (None, {}):
        return {k: _default(v) for k, v in props.items() if "default" in v or "properties" in v}
    return node.get("default")
