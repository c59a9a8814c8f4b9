"""What a verification rerun takes from the committed set it is checked against (config `verify.against`), and
what it compares: every run records its resolved settings (`run_spec.json`: the train settings with `auto`
decided and the defaults filled in; `summary.json`: the micro-batch split the strategy made; `provenance.json`:
the versions), so a rerun can

* replay the decisions: where the study says `auto` (train.compile_blocks, train.compile_loss), the rerun takes
  the committed run's resolved value, never a fresh decision on today's code and machine (`decisions`); a
  measured decision (config auto_levers) replays every lever the trial set, and no trial runs;
* name every setting that differs between the two (`settings_diff`): those rows read `settings-changed` in
  verify, with the keys listed, and are never compared as if they were the same run.

A committed run without its `run_spec.json` cannot be replayed: the study stops before any job, naming the file
(`problems`).
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from workflow_scripts import columns as C
from workflow_scripts.status import RunStatus

VERSIONS = ("torch", "deepspeed", "transformers", "cuda")  # provenance: what the run ran on
SPLIT = ("micro_batch", "grad_accum", "effective_batch")  # the run's micro-batch split (summary.json)
DATA_KEYS = ("block_size", "vocab_size", "dtype", "train_blocks", "val_blocks", "loss_on")  # in every manifest
AUTO = "auto"


def run_dir(results_dir: str | Path, model: str, strategy: str, layout: str, repeat) -> Path:
    return Path(results_dir) / C.RUN_DIR.format(model=model, strategy=strategy, layout=layout, repeat=repeat)


@cache
def _read(path: str) -> dict | None:
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else None


@cache
def _committed(path: str) -> dict | None:
    """A committed run's spec as this version's mapping (RunSpec.committed: its migrations), None where absent."""
    from workflow_scripts.run_spec import RunSpec

    return RunSpec.committed(path).to_dict() if Path(path).exists() else None


def committed_spec(against: str, spec) -> dict | None:
    return _committed(str(run_dir(against, spec["model"], spec["strategy"], spec_layout(spec), spec["repeat"])
                          / C.RUN_SPEC))


def spec_layout(spec: dict) -> str:
    from workflow_scripts.training.layout import Layout

    return Layout(**spec["layout"]).key


def decisions(spec: dict, auto_keys: list[str], against: str) -> dict:
    """The run's train settings with the committed run's resolved value for each key the study leaves `auto`;
    `compile_auto` says so where that changed a decision (a run the committed set does not have decides on its
    own: verify reports it `missing`)."""
    old = committed_spec(against, spec)
    if old is None:
        return spec["train"]
    train = spec["train"]
    if train.get("lever_trial"):  # measured levers: the committed run's measurement, no new trial
        from workflow_scripts.training.levers import TRIAL_KEYS

        train = {k: v for k, v in train.items() if k != "lever_trial"}
        auto_keys = list(dict.fromkeys([*auto_keys, *TRIAL_KEYS]))
    replayed = {k: old["train"][k] for k in auto_keys if k in old["train"] and old["train"][k] != train.get(k)}
    if not replayed:
        return train
    return {**train, **replayed,
            "compile_auto": f"replayed from {against}: {old['train'].get('compile_auto', 'no reason recorded there')}"}


def problems(against: str | None) -> list[str]:
    """Committed runs whose resolved settings cannot be read, one line each (config_check, before any job)."""
    if not against or not (Path(against) / C.RUNS_TABLE).exists():
        return []
    import csv

    with open(Path(against) / C.RUNS_TABLE, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        if r.get("status") != RunStatus.OK:
            continue
        layout = C.layout_key(r.get("layout"), r["world_size"])
        path = run_dir(against, r["model"], r["strategy"], layout, int(float(r["repeat"]))) / C.RUN_SPEC
        if not path.exists():
            out.append(f"verify.against: {path} is missing: the committed run's resolved settings cannot be "
                       "replayed (a set made before run specs were kept cannot be verified)")
            continue
        from workflow_scripts.run_spec import RunSpec, RunSpecError

        try:
            RunSpec.committed(path)  # its version migrated, every train key there
        except (RunSpecError, ValueError) as exc:
            out.append(f"verify.against: {exc}")
    return out[:5] + ([f"verify.against: ... and {len(out) - 5} more"] if len(out) > 5 else [])


# ---------------------------------------------------------------- what differs between two runs
def settings(spec: dict | None, summary: dict | None, provenance: dict | None, manifest: dict | None) -> dict:
    """A run's resolved settings as flat `key: value` pairs (dotted keys), the versions and the data's hash."""
    out = {}
    for k, v in (spec or {}).items():
        if k in C.SPEC_NOT_SETTINGS:
            continue
        if k == "train":
            out.update({f"train.{tk}": tv for tk, tv in v.items() if tk not in C.TRAIN_NOT_SETTINGS})
        else:
            out[k] = v
    out.update({k: (summary or {}).get(k) for k in SPLIT})
    packages = (provenance or {}).get("packages") or {}
    devices = (provenance or {}).get("devices") or {}
    out.update({k: packages.get(k) for k in VERSIONS if k != "cuda"})
    out["cuda"] = devices.get("torch_cuda")
    out.update(data_identity(manifest))
    return out


def data_identity(manifest: dict | None) -> dict:
    """The training data's identity, `data.<key>`: the files' SHA-256 where the manifest records them, and the
    counts every manifest has (a set made before the hashes were recorded is compared on those)."""
    if not manifest:
        return {}
    out = {f"data.{k}": manifest[k] for k in DATA_KEYS if k in manifest}
    for split, entry in sorted((manifest.get("files") or {}).items()):
        out[f"data.{split}.sha256"] = entry["sha256"]
    return out


def settings_diff(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every setting that differs. Both specs are read as this version's (a set made before
    a train key existed says, through its migration, what its run did); a key one side leaves unset (a spec's
    optional field: no traces, no own model) is not compared, a missing value being no evidence of a change."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a is None or b is None or _same(a, b):
            continue
        out.append(f"{k}: {_short(a)} -> {_short(b)}")
    return out


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _short(v) -> str:
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


def run_settings(results_dir: str | Path, model: str, strategy: str, layout: str, repeat) -> dict:
    """The settings of one run of a result set, read from its files."""
    d = run_dir(results_dir, model, strategy, layout, repeat)
    return settings(_committed(str(d / C.RUN_SPEC)), _read(str(d / C.SUMMARY)), _read(str(d / C.PROVENANCE)),
                    _read(str(Path(results_dir) / C.TOKENS_MANIFEST)))
