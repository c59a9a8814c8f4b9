"""Parallel dimensions, one module per dimension (data.py today; pipeline, tensor, context and expert parallelism
land here as pipeline.py, tensor.py, context.py, expert.py). Each module defines DIMENSION: its key in a layout
(training/layout.py), what it does, and `apply(model, ctx)`, which parallelises the model along that dimension
before the strategy wraps it for the data-parallel dimension.

A layout with a degree above one for a dimension that no module implements is refused before any job starts.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Dimension:
    key: str  # dp | pp | tp | cp | ep (training.layout.KEY_ORDER)
    description: str
    apply: Callable | None = None  # (model, ctx) -> dict of settings to record; None: the strategy does it


def _discover() -> dict[str, Dimension]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        dim = getattr(importlib.import_module(f"{__name__}.{info.name}"), "DIMENSION", None)
        if dim is not None:
            found[dim.key] = dim
    return found


DIMENSIONS: dict[str, Dimension] = _discover()


def unimplemented(layout, where: str = "layouts") -> list[str]:
    """A problem per degree above one that no module in this package implements."""
    from workflow_scripts.training.layout import KEY_ORDER, NAMES

    return [f"{where}.{key}: {getattr(layout, key)}, but no module implements {NAMES[key]} parallelism yet "
            f"(workflow_scripts/training/parallel/; implemented: {', '.join(DIMENSIONS)})"
            for key in KEY_ORDER if getattr(layout, key) > 1 and key not in DIMENSIONS]
