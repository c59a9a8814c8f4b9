"""The strategy registry: every module in this package that defines STRATEGY (one strategy per module)."""
from __future__ import annotations

import importlib
import pkgutil

from workflow_scripts.training.strategies.base import Strategy


def _discover() -> dict[str, Strategy]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name in ("base", "engine"):  # the record and the engine interface
            continue
        strategy = getattr(importlib.import_module(f"{__name__}.{info.name}"), "STRATEGY", None)
        if strategy is not None:
            found[strategy.name] = strategy
    return found


STRATEGIES: dict[str, Strategy] = _discover()


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
