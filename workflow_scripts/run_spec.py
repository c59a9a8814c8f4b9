"""One training run's spec, resolved once when the study expands (workflow_scripts.study.resolve): what the run
trains (model, strategy, layout, precision, the train settings with the schema's defaults filled in and the `auto`
levers decided where no machine is needed), its micro-batch split (`batch`) and its paths (data, ops, results,
scratch, traces). The launcher, the ranks, parse and verify read its fields; none of them derives one again.

It is written into the run's folder as `run_spec.json` (`to_json`; `from_json` reads it back) with its
`schema_version`: a spec of another version is one error naming the file, never a run with keys read as
something else. Its mapping view (`spec["train"]`, `spec.get("trace_dir")`) reads the same keys as the JSON, so a
reader of run_spec.json takes either. Nothing here imports torch or the training code: the Snakefile's parse
builds every run's spec.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1
# written only where set: a run without traces, a memory guard or a variant has a spec without those keys
OPTIONAL = ("memory_guard", "profile", "trace_dir", "variant", "torch_extensions_dir", "model_source", "trackers",
            "random_init", "strategy_source")


class RunSpecError(ValueError):
    """A run spec that cannot be read: another schema version, a missing or unknown key (the message names it)."""


@dataclass(frozen=True, kw_only=True)
class RunSpec(Mapping):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    study: str
    model: str
    strategy: str
    world_size: int
    layout: dict  # the degrees of every dimension (training/layout.Layout.degrees)
    repeat: int
    nodes: int = 1
    platform: str
    precision: str
    train: dict  # the train settings, defaults filled in, `auto` levers decided (or `lever_trial`: the launcher's)
    options: dict = field(default_factory=dict)  # the strategy's section of strategy_options
    pretrained: str | None = None
    model_overrides: dict = field(default_factory=dict)
    sampler: dict
    substitutions: dict = field(default_factory=dict)
    data: dict  # train, val: the token blocks or image rows; manifest: its copy in the study's results
    ops: list = field(default_factory=list)  # the build_op results of the DeepSpeed ops the strategy needs
    out_dir: str  # the run's folder under results_dir
    work_dir: str  # the run's scratch (checkpoints, offload files)
    memory_guard: dict | None = None  # config plan.refuse_oom: the usable bytes per GPU
    profile: dict | None = None  # config profile, when enabled
    trace_dir: str | None = None  # where the raw profiler traces go, when profiling
    batch: dict  # micro_batch: samples per forward per rank; accum: forwards per optimizer step
    variant: str | None = None  # "as_published": the publication's own settings (rules/published.smk)
    torch_extensions_dir: str | None = None  # a spec run by hand may name its own compiled-ops directory
    # a study's own model (training/models.py own_spec): {"source": its directory or hub id, "config_sha256": of
    # its config.json, None for a hub id}; so an edited config.json is another spec (rerun, never resumed)
    model_source: dict | None = None
    trackers: list | None = None  # config trackers: where rank 0 logs its scalars besides metrics.csv
    # the folder of the run's random initialisation (rule random_init, training/random_init.py), None for a run
    # from pretrained weights or one that builds its model in its own process (the bench harness)
    random_init: str | None = None
    # a strategy from a study's DeepSpeed JSON (importers/study_strategies.py): {"base": the registry strategy it
    # runs as, "deepspeed": the file, "sha256": of the file}; None for a registry strategy
    strategy_source: dict | None = None

    # ---------------------------------------------------------------- what readers ask
    @property
    def micro_batch(self) -> int:
        return self.batch["micro_batch"]

    @property
    def accum(self) -> int:
        return self.batch["accum"]

    def replace(self, **changes) -> RunSpec:
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------- the JSON form
    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not (f.name in OPTIONAL and getattr(self, f.name) is None)}

    def to_json(self, indent: int | None = 2, sort_keys: bool = False) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=sort_keys)

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "run spec") -> RunSpec:
        """A spec from its JSON mapping; RunSpecError naming `where` and the key for another schema version, a
        missing or an unknown key."""
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise RunSpecError(f"{where}: schema_version {version}, this code reads {SCHEMA_VERSION} (a spec "
                               "written by another version of the pipeline: expand the study again)")
        unknown = sorted(set(d) - FIELDS)
        if unknown:
            raise RunSpecError(f"{where}: unknown key {unknown[0]!r}")
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in d
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise RunSpecError(f"{where}: missing key {missing[0]!r}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str, where: str = "run spec") -> RunSpec:
        return cls.from_dict(json.loads(text), where)

    @classmethod
    def load(cls, path: str | Path) -> RunSpec:
        return cls.from_json(Path(path).read_text(), str(path))

    @classmethod
    def of(cls, spec: Mapping) -> RunSpec:
        """The spec itself, or one read from a mapping that carries a spec's keys among others (a benchmark's
        runner adds its own)."""
        if isinstance(spec, cls):
            return spec
        return cls.from_dict({k: v for k, v in spec.items() if k in FIELDS})

    # ---------------------------------------------------------------- the mapping view (the JSON's keys)
    def __getitem__(self, key: str):
        if key not in FIELDS or (key in OPTIONAL and getattr(self, key) is None):
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


FIELDS = frozenset(f.name for f in dataclasses.fields(RunSpec))
