"""Every figure the pipeline draws, listed once: its name (the file's stem and its caption,
report/captions/<name>.rst), the stage that draws it, the function that does, and which studies can have its data.
Light on purpose (no matplotlib): the workflow reads the study's figures from here at parse time.

A figure is made only where its data can exist: `Entry.applies(config)` answers from the study config (after the
schema filled its defaults), so `rule all`, the rules' outputs and the report list only figures with data:

    accuracy          image-classification studies (data.kind: images)
    mfu               GPU platforms (cuda, rocm); MFU divides by the device's datasheet peak (measure/metrics.py)
    predicted_speed   GPU platforms (the step-time model predicts GPU steps)
    memory_timeline   a sampler (sampler.backend other than none)
    scaling           a model run at more than one data-parallel world size
    layouts           a model run in more than one parallel layout at one world size
    traces            profile.enabled
    claims            published.source (a publication's numbers to compare)
    the others        every study

Adding a figure: write its function in the stage's module (it takes what the stage has read and returns a
matplotlib figure; panels, notes and saving come from report/style.py), add one Entry below (with `when` if only
some studies can have its data), and write its caption. tests/test_figures.py checks that each entry resolves, has a
caption, that no `*_figure` function is left out, and the figure sets of a CPU text study and a GPU vision study.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CAPTIONS = Path(__file__).resolve().parents[2] / "report/captions"
EXTENSIONS = ("png", "pdf")
STUDY_STAGES = ("figures", "calibration_figure", "trace_report", "claims")  # the stages `rule all` asks for


@dataclass(frozen=True)
class Shape:
    """What a study config says about the data its runs can have."""

    platform: str
    images: bool
    sampler: bool
    profile: bool
    published: bool
    layouts: dict  # model -> world size -> the layout keys run at it

    @classmethod
    def of(cls, config: dict) -> Shape:
        from workflow_scripts import study
        from workflow_scripts.training.layout import Layout

        layouts: dict = {}
        for model, _, key in study.runs(config):
            layouts.setdefault(model, {}).setdefault(Layout.from_key(key).world_size, set()).add(key)
        return cls(platform=config["platform"], images=config["data"]["kind"] == "images",
                   sampler=config["sampler"]["backend"] != "none", profile=bool(config["profile"]["enabled"]),
                   published=bool(study.published_runs(config)), layouts=layouts)

    def scales(self) -> bool:
        """Some model ran in pure data-parallel layouts (ws<N>) at more than one world size."""
        return any(sum(f"ws{w}" in keys for w, keys in sizes.items()) > 1 for sizes in self.layouts.values())

    def compares_layouts(self) -> bool:
        """Some model ran in more than one layout at one world size (e.g. ws2 and dp1-pp2)."""
        return any(len(keys) > 1 for sizes in self.layouts.values() for keys in sizes.values())

    @property
    def gpu(self) -> bool:
        return self.platform != "cpu"


def every_study(shape: Shape) -> bool:
    return True


@dataclass(frozen=True)
class Entry:
    name: str
    stage: str  # the rule that draws it
    function: str  # "<dotted module>:<function>"
    when: Callable[[Shape], bool] = every_study  # whether a study of this shape can have the figure's data

    @property
    def caption(self) -> Path:
        return CAPTIONS / f"{self.name}.rst"

    def load(self):
        module, function = self.function.split(":")
        return getattr(importlib.import_module(module), function)

    def applies(self, config: dict) -> bool:
        return self.when(Shape.of(config))


def _study(name: str, when: Callable[[Shape], bool] = every_study) -> Entry:
    return Entry(name, "figures", f"workflow_scripts.report.figures:{name}_figure", when)


ENTRIES = (
    _study("loss_curves"),
    _study("peak_memory"),
    _study("throughput"),
    _study("time_per_epoch"),
    _study("mfu", lambda s: s.gpu),
    _study("memory_timeline", lambda s: s.sampler),
    _study("memory_vs_throughput"),
    _study("scaling", Shape.scales),
    _study("layouts", Shape.compares_layouts),
    _study("phases"),
    _study("accuracy", lambda s: s.images),
    _study("predicted_speed", lambda s: s.gpu),
    Entry("calibration", "calibration_figure", "workflow_scripts.report.calibration:calibration_figure"),
    Entry("claims", "claims", "workflow_scripts.report.claims:claims_figure", lambda s: s.published),
    Entry("traces", "trace_report", "workflow_scripts.report.traces:traces_figure", lambda s: s.profile),
    Entry("scale", "scale", "workflow_scripts.report.scale_figure:scale_figure"),
)


def names(stage: str, config: dict | None = None) -> list[str]:
    """The figures one stage draws, in the registry's order: with `config`, only those the study can have data for."""
    shape = Shape.of(config) if config is not None else None
    return [e.name for e in ENTRIES if e.stage == stage and (shape is None or e.when(shape))]


def study_files(config: dict, results_dir: str) -> list[str]:
    """Every figure file `rule all` asks for: the study stages' figures the study has data for, PNG and PDF."""
    return [f"{results_dir}/figures/{name}.{ext}" for stage in STUDY_STAGES for name in names(stage, config)
            for ext in EXTENSIONS]


def entry(name: str) -> Entry:
    return next(e for e in ENTRIES if e.name == name)
