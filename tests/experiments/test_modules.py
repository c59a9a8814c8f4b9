"""Every module under experiments/ imports: a probe moved or a product module renamed leaves no stale import."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
MODULES = sorted(".".join(p.relative_to(EXPERIMENTS.parent).with_suffix("").parts)
                 for p in EXPERIMENTS.rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("name", MODULES)
def test_every_experiment_imports(name):
    module = importlib.import_module(name)
    assert module.__doc__, f"{name}: its docstring says what it measures and how to run it"
