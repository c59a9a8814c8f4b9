"""One training run's spec, resolved once when the study expands (workflow_scripts.study.resolve): what the run
trains (model, strategy, layout, precision, the train settings with the schema's defaults filled in and the `auto`
levers decided where no machine is needed), its micro-batch split (`batch`) and its paths (data, ops, results,
scratch, traces). The launcher, the ranks, parse and verify read its fields; none of them derives one again.

It is written into the run's folder as `run_spec.json` (`to_json`; `from_json` reads it back) with its
`schema_version`: a spec of another version given to a run is one error naming the file, never a run with keys read
as something else. A committed set's specs are read through `RunSpec.committed`, the one loader of specs of earlier
versions: it applies the migrations below in order (each states what a spec of the version before meant) and then
checks that every train key of this version is there, so a reader takes `spec.train[key]` and a key added without
its migration fails loudly, naming the file. Readers take the fields (`spec.layout`, `spec.train["seed"]`); the
mapping view (`spec["train"]`) is the JSON's, for what writes or compares it whole. Nothing here imports torch or
the training code: the Snakefile's parse builds every run's spec.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 2
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
    def committed(cls, path: str | Path) -> RunSpec:
        """A spec a run wrote, of this version or an earlier one (a committed set's), migrated to this version
        (MIGRATIONS) and checked: every train key of this version is there. RunSpecError names the file."""
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise RunSpecError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
        d = migrated(d, path.parent)
        if problems := train_problems(d["train"], str(path)):
            raise RunSpecError(problems[0])
        return cls.from_dict(d, str(path))

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
# keys of `train` that study.resolve adds to the schema's (why an `auto` lever was decided so; where a measured
# decision is read) and the LoRA settings of a run that has them
TRAIN_RESOLVED = ("compile_auto", "lever_trial", "lora")

# ---------------------------------------------------------------- the versions before, and what they meant
# version 0 (specs written before schema_version): train keys added since, each with what a run of that time did
# (the feature did not exist: it was off), never this version's default read from the schema
V0_TRAIN = {"chunked_loss": False, "compile_model": False, "compile_blocks": False, "compile_loss": False,
            "compile_mode": "default", "deterministic": False,
            "pipeline_schedule": "1f1b"}  # no pipeline stage existed: a schedule no run of that time used
V0_BENCH = ("trainer_setting", "ceiling")  # the benchmark runner's own keys, written into its specs then


def _from_v0(d: dict, run_dir: Path) -> dict:
    """Version 0 -> 1: the layout (a pure data-parallel one over world_size: other layouts came with the key), the
    micro-batch split (`batch`: the one the run's summary.json records), the train keys of V0_TRAIN."""
    out = {k: v for k, v in d.items() if k not in V0_BENCH}
    out.setdefault("layout", {"dp": d["world_size"], "pp": 1, "tp": 1, "cp": 1, "ep": 1})
    if "batch" not in out:
        summary = run_dir / "summary.json"
        if not summary.exists():
            raise RunSpecError(f"{run_dir / 'run_spec.json'}: version 0 records no micro-batch split and "
                               f"{summary} is missing (the split is read from it)")
        s = json.loads(summary.read_text())
        out["batch"] = {"micro_batch": int(s["micro_batch"]), "accum": int(s["grad_accum"])}
    out["train"] = {**V0_TRAIN, **d["train"]}
    return out


def _from_v1(d: dict, run_dir: Path) -> dict:
    """Version 1 -> 2: train.separate_documents (before it, packed documents attended to each other: False);
    train.tensorboard moved to the spec's `trackers` (["tensorboard"] where it was on)."""
    train = {"separate_documents": False, **d["train"]}
    tensorboard = train.pop("tensorboard", False)
    trackers = d.get("trackers") or (["tensorboard"] if tensorboard else None)
    return {**d, "train": train, **({"trackers": trackers} if trackers else {})}


MIGRATIONS = {0: _from_v0, 1: _from_v1}  # version -> the function that reads it as the next version


def migrated(d: Mapping, run_dir: Path) -> dict:
    """A spec's mapping of any earlier version as this version's (MIGRATIONS, in order)."""
    d, version = dict(d), d.get("schema_version", 0)
    while version != SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise RunSpecError(f"{run_dir / 'run_spec.json'}: schema_version {version}, this code reads up to "
                               f"{SCHEMA_VERSION}")
        d = {**MIGRATIONS[version](d, run_dir), "schema_version": version + 1}
        version += 1
    return d


def train_problems(train: Mapping, where: str) -> list[str]:
    """The train keys of this version a spec's train lacks, and those it has that this version does not know."""
    from workflow_scripts import schema

    known = set(schema.schema()["properties"]["train"]["properties"]) - {"precision"}
    needed = set(schema.default("train")) - {"precision"}
    return ([f"{where}: train.{k} missing (a key added without a migration in run_spec.MIGRATIONS)"
             for k in sorted(needed - set(train))]
            + [f"{where}: train.{k}: unknown key" for k in sorted(set(train) - known - set(TRAIN_RESOLVED))])
