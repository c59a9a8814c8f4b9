"""The strategy registry: every module in this package that defines STRATEGY (one strategy per module)."""
from __future__ import annotations

import importlib
import pkgutil

from workflow_scripts.training.strategies.base import Strategy


def _discover() -> dict[str, Strategy]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name == "base":
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
