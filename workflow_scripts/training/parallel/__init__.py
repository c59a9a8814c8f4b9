"""Parallel dimensions, one module per dimension (data.py dp, pipeline.py pp, tensor.py tp, sequence.py cp,
expert.py ep). Each module defines DIMENSION: its key in a layout
(training/layout.py), what it does, how it builds the run's engine around the strategy (which stays the
data-parallel dimension), and what it needs from the rest of the run (checked before any job starts).

A layout with a degree above one for a dimension that no module implements is refused before any job starts.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Dimension:
    key: str  # dp | pp | tp | cp | ep (training.layout.KEY_ORDER)
    description: str
    # (model, ctx, family) -> None: parallelises the model in place (before any engine wraps it)
    apply: Callable | None = None
    # (strategy, model, ctx, family) -> Engine: builds the run's engine around the strategy (pipeline stages)
    build: Callable | None = None
    # (layout, strategy, train settings, where) -> problems: what the dimension needs from the rest of the run
    problems: Callable | None = None
    # (layout, model name, where) -> problems: what the dimension needs from the model (beyond training.layout's
    # divisibility checks)
    model_problems: Callable | None = None
    # the GPU fast path (train.compile_blocks / compile_loss: auto) compiles layouts with this dimension: true only
    # for a dimension whose compiled runs are checked on a GPU
    compiled_on_gpu: bool = False


def _discover() -> dict[str, Dimension]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):  # an engine module (torch), not a dimension
            continue
        dim = getattr(importlib.import_module(f"{__name__}.{info.name}"), "DIMENSION", None)
        if dim is not None:
            found[dim.key] = dim
    return found


DIMENSIONS: dict[str, Dimension] = _discover()


def build_engine(strategy, model, ctx, family: str):
    """The run's engine, in a fixed order: dimensions that transform the model in place (`apply`: tensor, ...)
    first, then the one that builds an engine around the strategy (`build`: pipeline stages), else the
    data-parallel dimension: the strategy's own engine, or its model-parallel form (parallel/data.py)."""
    from workflow_scripts.training.parallel._data_engine import data_parallel_engine

    active = [dim for key, dim in DIMENSIONS.items() if key != "dp" and getattr(ctx.layout, key) > 1]
    for dim in active:
        if dim.apply is not None:
            dim.apply(model, ctx, family)
    for dim in active:
        if dim.build is not None:
            return dim.build(strategy, model, ctx, family)
    return strategy.build(model, ctx) if ctx.layout.data_only else data_parallel_engine(strategy, model, ctx)


def run_problems(layout, strategy, train: dict, where: str) -> list[str]:
    """What the layout's dimensions need from the rest of the run (strategy, train settings)."""
    return [p for key, dim in DIMENSIONS.items()
            if dim.problems is not None and (key == "dp" or getattr(layout, key) > 1)
            for p in dim.problems(layout, strategy, train, where)]


def model_problems(layout, model_name: str, where: str) -> list[str]:
    return [p for key, dim in DIMENSIONS.items() if dim.model_problems is not None and getattr(layout, key) > 1
            for p in dim.model_problems(layout, model_name, where)]


def unimplemented(layout, where: str = "layouts") -> list[str]:
    """A problem per degree above one that no module in this package implements."""
    from workflow_scripts.training.layout import KEY_ORDER, NAMES

    return [f"{where}.{key}: {getattr(layout, key)}, but no module implements {NAMES[key]} parallelism yet "
            f"(workflow_scripts/training/parallel/; implemented: {', '.join(DIMENSIONS)})"
            for key in KEY_ORDER if getattr(layout, key) > 1 and key not in DIMENSIONS]
