"""What every importer shares: the ledger of what became of each key of each input file (mapped to a study key,
recorded as a substitution, not applied, or refused), the one error an import is refused with, and the record of
one training configuration (`Variant`) that the source-format modules fill and `assemble` turns into a study.

A key is
  mapped       -- it became a key of the study (the note names it);
  substituted  -- the study does something else than the original run did; the line goes into the study's
                  `substitutions`, so every run's provenance carries it;
  not applied  -- it decides nothing a run trains or measures (where the original wrote its outputs, how it was
                  launched, a setting its own run ignored); the file's such keys are one `substitutions` line;
  refused      -- an unknown key, or a value the pipeline has no counterpart for: the import stops with one
                  ImportRefused naming every such key and its file.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from workflow_scripts.schema import did_you_mean


class ImportRefused(ValueError):
    """An import that cannot be written: unknown keys, values without a counterpart, files that disagree. The
    message is one line naming each file and key at fault."""


@dataclass
class Record:
    """What became of every key of one input file."""

    path: str
    kind: str
    data: dict | None = None  # the file as read (Record.sweep)
    notes: dict = field(default_factory=dict)  # key -> (what, detail): mapped / substituted / not applied
    unknown: list = field(default_factory=list)
    hints: dict = field(default_factory=dict)  # unknown key -> the closest known name (schema.did_you_mean)
    refused: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def mapped(self, key: str, where: str) -> None:
        self.notes[key] = ("mapped", where)

    def substituted(self, key: str, text: str) -> None:
        self.notes[key] = ("substituted", text)

    def not_applied(self, key: str, why: str) -> None:
        self.notes[key] = ("not applied", why)

    def refuse(self, key: str, why: str) -> None:
        line = f"{key}: {why}" if key else why
        if line not in self.refused:
            self.refused.append(line)

    def check_known(self, data: dict, known, prefix: str = "") -> None:
        """Every key of `data` not in `known` is unknown (refused, named with its section)."""
        for key in data:
            if key not in known and f"{prefix}{key}" not in self.unknown:
                self.unknown.append(f"{prefix}{key}")
                self.hints[f"{prefix}{key}"] = did_you_mean(key, known)

    def substitutions(self) -> list[tuple[str, str]]:
        """(key, text) of this file's lines of the study's `substitutions`: one per substituted key, one for all its
        keys not applied."""
        out = [(key, text) for key, (what, text) in self.notes.items() if what == "substituted"]
        idle = [key for key, (what, _) in self.notes.items() if what == "not applied"]
        if idle:
            out.append(
                (
                    "not applied",
                    f"{', '.join(idle)}: no bearing on what a run trains or measures (outputs, "
                    "launcher, logging, or off in the original run)",
                )
            )
        return out

    def sweep(self, data) -> None:
        """Every leaf key of the file that no reader noted (nor refused) is recorded as a substitution: nothing an
        import reads is dropped without a line saying so."""
        if not isinstance(data, dict):
            return
        seen = [*self.notes, *self.unknown]

        def accounted(path: str) -> bool:
            return any(n == path or path.startswith(n + ".") or n.startswith(path + ".") for n in seen)

        def walk(node: dict, prefix: str) -> None:
            for key, value in node.items():
                path = f"{prefix}{key}"
                if isinstance(value, dict) and value and not accounted(path):
                    walk(value, path + ".")
                elif not accounted(path):
                    self.substituted(path, f"{value!r}: not read by the importer; the pipeline's own setting instead")

        walk(data, "")

    def problems(self) -> list[str]:
        out = []
        if self.unknown:
            named = ", ".join(f"{key} ({self.hints[key]})" if key in self.hints else key for key in self.unknown)
            out.append(f"{self.path}: unknown key{'s' if len(self.unknown) > 1 else ''} {named}")
        out += [f"{self.path}: {line}" for line in self.refused]
        return out


class Ledger:
    """The records of every file an import reads, in the order first read."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}

    def record(self, path: str, kind: str) -> Record:
        key = os.path.abspath(path)
        if key not in self.records:
            self.records[key] = Record(path, kind)
        return self.records[key]

    def problems(self) -> list[str]:
        return [p for r in self.records.values() for p in r.problems()]

    def raise_problems(self) -> None:
        found = self.problems()
        if found:
            raise ImportRefused("import refused: " + "; ".join(found))

    def substitutions(self, applied_only: bool = False) -> list[str]:
        """The study's `substitutions`: each file's lines, one line for files that say the same; `applied_only`:
        without the lines of keys not applied."""
        files: dict[tuple, list[str]] = {}
        for r in self.records.values():
            for line in r.substitutions():
                if applied_only and line[0] == "not applied":
                    continue
                files.setdefault(line, []).append(r.name)
        return [f"{', '.join(dict.fromkeys(names))}: {key}: {text}" for (key, text), names in files.items()]


@dataclass
class Variant:
    """One training configuration of the imported study: one run per repeat, one strategy (a name of the
    registry, training/strategies/) with its options, the model, the data sections, the train keys."""

    sources: list  # the files it was read from
    model: str | None = None  # a registry name, a local directory or a hub id
    pretrained: str | None = None  # the weights it starts from, None: a random initialisation
    sections: dict = field(default_factory=dict)  # corpus, tokenizer, data: as the study writes them
    train: dict = field(default_factory=dict)
    precision: str | None = None
    precision_why: str = ""  # where the policy came from (for a substitution when the study takes another)
    strategy: str = "ddp"
    options: dict = field(default_factory=dict)
    world_size: int | None = None
    layout: dict | None = None  # degrees with a model-parallel dimension; None: pure data parallel
    nodes: int | None = None
    platform: str | None = None
    trackers: list | None = None


def integral(value):
    """A float that is an integer (1e9 in a JSON) as an int; everything else as it is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def tidy(value: float) -> float:
    """A product of two decimals without its binary noise (3e-4 x 0.1 = 3e-05, not 2.9999999999999997e-05)."""
    return float(f"{value:.10g}")


def ceil_int(value) -> int:
    return int(math.ceil(float(value)))


def hidden_size(model: str | None) -> tuple[int | None, str]:
    """The model's hidden size, as the Hugging Face Trainer reads it from the model's config (for DeepSpeed's
    hidden-size `auto` values), and where it was read: a registry model's written-out shape, a local directory's
    config.json, a hub id's config in the Hugging Face cache (offline). (None, why) where it cannot be read."""
    from workflow_scripts.training.models import NAMED, is_local

    if model is None:
        return None, "no model named"
    if model in NAMED:
        return NAMED[model].d_model, f"the registry's {model} shape"
    if is_local(model):
        path = os.path.join(os.path.expanduser(model), "config.json")
        try:
            config = json.loads(open(path).read())
        except (OSError, ValueError):
            return None, f"{path} cannot be read"
        for key in ("hidden_size", "n_embd", "d_model"):
            if isinstance(config.get(key), int):
                return config[key], path
        sizes = config.get("hidden_sizes")
        if isinstance(sizes, list) and sizes:
            return max(sizes), path
        return None, f"{path} has no hidden_size"
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError):
        return None, f"{model} is not in the local Hugging Face cache"
    size = getattr(config, "hidden_size", None)
    return (size, f"{model}'s cached config") if isinstance(size, int) else (None, f"{model}'s config has none")


def registry_name(model: str) -> str | None:
    """The registry model whose original is this hub id (the first of its entries that is no LoRA variant)."""
    from workflow_scripts.training.models import NAMED

    for name, spec in NAMED.items():
        if spec.hub_id == model and spec.lora is None:
            return name
    return None


def model_entry(value: str, base: str, rec: Record, key: str) -> str | None:
    """A model named by a file (a hub id, or a directory relative to the file or the working directory) as the
    study names it: a registry name where the hub id is a registry model's original, else the directory
    (absolute) or the hub id. None (refused) where it is neither."""
    from workflow_scripts.training.models import HUB_ID

    if not isinstance(value, str) or not value:
        rec.refuse(key, f"{value!r} is not a model name or directory")
        return None
    named = registry_name(value)
    if named:
        rec.mapped(key, f"models: [{named}] (the registry's shape of {value}), pretrained: {value}")
        return named
    for root in (base, os.getcwd()):
        path = os.path.normpath(os.path.join(root, os.path.expanduser(value)))
        if os.path.isdir(path):
            rec.mapped(key, f"models: [{path}] (a local directory), pretrained: the same")
            return path
    if HUB_ID.fullmatch(value):
        rec.mapped(key, f"models: [{value}] (a hub id: its config from the Hugging Face cache or hub)")
        return value
    rec.refuse(key, f"{value!r} is neither a directory (beside the file or here) nor a hub id")
    return None


def boolean(rec: Record, key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    rec.refuse(key, f"expected true or false, got {value!r}")
    return False


def positive_int(rec: Record, key: str, value) -> int | None:
    value = integral(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    rec.refuse(key, f"expected a positive integer, got {value!r}")
    return None
