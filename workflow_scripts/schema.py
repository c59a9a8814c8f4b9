"""The study schema (schemas/config.schema.yaml) as code reads it: a key's default lives there, once, and every
module that needs one asks here instead of restating it; and how an unknown key is named (with the closest known
one), the same for the schema's keys and for what a library validates (DeepSpeed's config models)."""
from __future__ import annotations

import difflib
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


def plan_keys() -> tuple[str, ...]:
    """The top-level sections the plan and scale rules read (the schema's `x-plan: true`): their config."""
    return tuple(k for k, v in schema()["properties"].items() if v.get("x-plan"))


def bench_keys(part: str) -> tuple[str, ...]:
    """The keys of config `bench` that one part of the harness benchmark reads (the schema's `x-bench`)."""
    return tuple(k for k, v in schema()["properties"]["bench"]["properties"].items() if part in v.get("x-bench", ()))


def presentation_keys() -> tuple[str, ...]:
    """The top-level sections that only shape figures and tables (the schema's `x-presentation: true`)."""
    return tuple(k for k, v in schema()["properties"].items() if v.get("x-presentation"))


def filled(section: str, given: dict | None) -> dict:
    """A config section as a run spec carries it, the schema's defaults under the keys it gives: a spec written
    before a key existed (a committed run rerun by hand) reads the key's default from here, not from the caller."""
    return {**default(section), **(given or {})}


def _default(node: dict):
    props = node.get("properties")
    if props and node.get("default") in (None, {}):
        return {k: _default(v) for k, v in props.items() if "default" in v or "properties" in v}
    return node.get("default")


def did_you_mean(name: str, known) -> str:
    """'did you mean <the closest known name>?', or the known names where none is close."""
    known = sorted(known)
    hint = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
    return f"did you mean {hint[0]}?" if hint else f"known: {', '.join(known) or 'none'}"


def unknown_key(where: str, key: str, known) -> str:
    at = f"{where}.{key}" if where else key
    return f"{at}: unknown key, {did_you_mean(key, known)}"
