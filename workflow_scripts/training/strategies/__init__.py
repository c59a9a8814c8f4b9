"""The strategy registry: every module in this package that defines STRATEGY (one strategy per module)."""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil

from workflow_scripts.training.strategies.base import Strategy

# a study's strategies from DeepSpeed JSON files (importers/study_strategies.py): {name: registry strategy it runs
# as}, for the process that checked the study and every job and rank it starts
STRATEGIES_ENV = "PIPELINE_STRATEGIES"


def _discover() -> dict[str, Strategy]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name in ("base", "engine"):  # the record and the engine interface
            continue
        strategy = getattr(importlib.import_module(f"{__name__}.{info.name}"), "STRATEGY", None)
        if strategy is not None:
            found[strategy.name] = strategy
    return found


def study_strategies() -> dict[str, str]:
    """The strategies a study named from files, registered in this process or inherited: {name: base}."""
    try:
        given = json.loads(os.environ.get(STRATEGIES_ENV) or "{}")
    except ValueError:
        raise ValueError(f"${STRATEGIES_ENV}: not a JSON mapping of strategy name to registry strategy") from None
    return given if isinstance(given, dict) else {}


class Registry(dict):
    """The registry's strategies (iteration and len: those only); a lookup (`[]`, `in`, `get`) also finds a study's
    strategies from files: the registry strategy they run as, under their own name."""

    def __missing__(self, key):
        base = study_strategies().get(key)
        if base is None or not dict.__contains__(self, base):
            raise KeyError(key)
        return dataclasses.replace(dict.__getitem__(self, base), name=key)

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or key in study_strategies()

    def get(self, key, default=None):
        return self[key] if key in self else default


STRATEGIES: dict[str, Strategy] = Registry(_discover())


def register(name: str, base: str) -> None:
    """Name a study's strategy from a file for this process and every process it starts ($PIPELINE_STRATEGIES)."""
    if dict.__contains__(STRATEGIES, name):
        raise ValueError(f"{name!r} is a registry strategy's name")
    os.environ[STRATEGIES_ENV] = json.dumps({**study_strategies(), name: base}, sort_keys=True)


def register_from(spec) -> None:
    """A run spec's strategy from a file (its `strategy_source`) named for this process and the ranks it starts."""
    source = spec.strategy_source
    if source and study_strategies().get(spec.strategy) != source["base"]:
        register(spec.strategy, source["base"])


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}") from None


def micro_and_accum(spec: dict) -> tuple[int, int]:
    """The micro-batch of one forward and the accumulation steps: the train settings, or a strategy's own
    accumulation (grad_accum) at the same effective batch."""
    t, strategy = spec["train"], get(spec["strategy"])
    micro, accum = t["micro_batch_size"], t["grad_accum"]
    if strategy.accumulation is not None:  # e.g. grad_accum: its own accumulation, same effective batch
        own, keep_effective_batch = strategy.accumulation(spec["options"])
        if keep_effective_batch:
            micro = micro * accum // own
        accum = own
    return micro, accum
