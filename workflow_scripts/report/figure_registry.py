"""Every figure the pipeline draws, listed once: its name (the file's stem and its caption,
report/captions/<name>.rst), the stage that draws it and the function that does. Light on purpose (no matplotlib):
the workflow reads the study figures' names from here at parse time.

Adding a figure: write its function in the stage's module (it takes what the stage has read and returns a
matplotlib figure; panels, notes and saving come from report/style.py), add one Entry below, and write its caption.
tests/test_figures.py checks that each entry resolves, has a caption, and that no `*_figure` function is left out.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

CAPTIONS = Path(__file__).resolve().parents[2] / "report/captions"


@dataclass(frozen=True)
class Entry:
    name: str
    stage: str  # the rule that draws it
    function: str  # "<module under workflow_scripts>:<function>"

    @property
    def caption(self) -> Path:
        return CAPTIONS / f"{self.name}.rst"

    def load(self):
        module, function = self.function.split(":")
        return getattr(importlib.import_module(f"workflow_scripts.{module}"), function)


def _study(name: str) -> Entry:
    return Entry(name, "figures", f"report.figures:{name}_figure")


ENTRIES = (
    *(_study(n) for n in ("loss_curves", "peak_memory", "throughput", "time_per_epoch", "mfu", "memory_timeline",
                          "memory_vs_throughput", "scaling", "layouts", "phases", "accuracy", "predicted_speed")),
    Entry("calibration", "calibration_figure", "report.calibration:calibration_figure"),
    Entry("claims", "claims", "report.claims:claims_figure"),
    Entry("traces", "trace_report", "report.traces:traces_figure"),
    Entry("scale", "scale", "report.scale_figure:scale_figure"),
    Entry("memory_prediction", "benchmark (python -m workflow_scripts.bench.memory)",
          "bench.memory:memory_prediction_figure"),
)


def names(stage: str) -> list[str]:
    """The figures one stage draws, in the registry's order."""
    return [e.name for e in ENTRIES if e.stage == stage]


def entry(name: str) -> Entry:
    return next(e for e in ENTRIES if e.name == name)
