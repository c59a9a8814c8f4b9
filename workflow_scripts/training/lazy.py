"""A function of a module imported on its first call: how the strategy and parallel-dimension registries name their
engines without importing torch (every Snakefile parse and config check reads the registries; only a rank builds
an engine)."""
from __future__ import annotations

import importlib
from collections.abc import Callable


def part(module: str, name: str) -> Callable:
    """`module.name`, imported when the returned function is first called."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call
