"""Checkpoints of a run under its work_dir, `ckpt/`:

    step_<N>/          a complete checkpoint: the engine's own format, state.json (the step, the rows logged so far,
                       the initial validation loss, the configuration's hash) and checksums.json (SHA-256 and size
                       of every other file in it, by relative path)
    step_<N>.tmp/      a checkpoint being written; renamed to step_<N> only once every rank has written its part
                       and rank 0 has written state.json and checksums.json
    latest             the name of the newest complete checkpoint, replaced atomically

The last two complete checkpoints are kept: older ones are deleted once the new one is complete. A job killed at any
moment leaves its complete checkpoints as they were (a step_<N>.tmp is never loaded). A checkpoint damaged later (a
flipped or truncated file) is found by its checksums before anything of it is loaded: the run falls back to the
previous checkpoint, and the damaged one is moved to `ckpt.damaged-<time>-<random>/` beside `ckpt/`. If none can be
loaded, the whole `ckpt/` is moved to such a directory and the run starts at step 0. Damaged checkpoints are never
deleted; what happened is said in one log line and returned for the run's row (`checkpoint_fallback`).

A run resumes only a checkpoint of its own configuration: `resume_hash` covers everything in the run spec that can
change a number (model, strategy, layout, precision, the token data, every train setting but logging, checkpoint
frequency and fault injection). A checkpoint written under another configuration is never loaded: `ckpt/` is moved
aside to `ckpt.superseded-<its hash>` (replacing an earlier one of that hash) and the run starts at step 0, saying so
in its log.

Rank 0 checks the files and decides which checkpoint to load; the other ranks receive its decision.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch.distributed as dist

from workflow_scripts import columns as C
from workflow_scripts.data import checksum
from workflow_scripts.units import MIB

STATE, MANIFEST, KEPT = "state.json", "checksums.json", 2
COMPLETE_NAME = re.compile(r"step_\d{8}")
HASH_THREADS = 8  # hashlib releases the GIL: a sharded checkpoint's files are hashed side by side


def resume_hash(spec: dict) -> str:
    """What shapes the run's trajectory: the spec's settings and the token data itself. The data's paths stay the
    same when the corpus changes, so its manifest and the block files' size and modification time count too
    (regenerated data never resumes an older checkpoint, even if it came out identical: the safe side)."""
    kept = {k: v for k, v in spec.items() if k not in C.SPEC_NOT_SETTINGS}
    kept["train"] = {k: v for k, v in spec["train"].items() if k not in C.TRAIN_NOT_SETTINGS}
    manifest = Path(spec["data"]["manifest"])
    kept["tokens_manifest"] = manifest.read_text() if manifest.exists() else None
    kept["token_files"] = [(os.stat(p).st_size, os.stat(p).st_mtime_ns) if os.path.exists(p) else None
                           for p in (spec["data"]["train"], spec["data"]["val"])]
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- checksums
def hash_files(root: Path, names: list[str]) -> list[str]:
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
        return list(pool.map(lambda name: checksum.digest(root / name), names))


def write_manifest(path: Path) -> None:
    """checksums.json: every file under the checkpoint (but itself), relative path -> SHA-256 and size."""
    names = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p != path / MANIFEST)
    digests = hash_files(path, names)
    manifest = {name: {"sha256": digest, "size": (path / name).stat().st_size} for name, digest in zip(names, digests)}
    (path / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def read_manifest(path: Path) -> dict:
    manifest = json.loads((path / MANIFEST).read_text())
    if not isinstance(manifest, dict) or STATE not in manifest or not all(
            isinstance(v, dict) and {"sha256", "size"} <= v.keys() for v in manifest.values()):
        raise ValueError(f"{MANIFEST} does not list the checkpoint's files")
    return manifest


def damage(path: Path) -> str | None:
    """What is wrong with a complete checkpoint's files (the first difference from its manifest), or None."""
    try:
        manifest = read_manifest(path)
    except (OSError, ValueError) as exc:
        return f"unreadable {MANIFEST}: {exc}"
    for name, want in sorted(manifest.items()):
        if not (path / name).is_file():
            return f"missing {name}"
        if (path / name).stat().st_size != want["size"]:
            return f"size mismatch in {name}"
    names = sorted(manifest)
    for name, digest in zip(names, hash_files(path, names)):
        if digest != manifest[name]["sha256"]:
            return f"checksum mismatch in {name}"
    return None


# ---------------------------------------------------------------- saving
def step_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(ckpt_dir: Path) -> list[Path]:
    """The renamed (complete) checkpoints, newest first."""
    found = [p for p in ckpt_dir.glob("step_*") if COMPLETE_NAME.fullmatch(p.name) and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: p.name, reverse=True)


def point_latest(ckpt_dir: Path, name: str) -> None:
    tmp = ckpt_dir / "latest.tmp"
    tmp.write_text(name)
    os.replace(tmp, ckpt_dir / "latest")


def publish(tmp: Path, final: Path) -> None:
    """Rank 0, once every file of `tmp` is written: checksum it, rename it to its final name (a kill before the
    rename leaves the previous checkpoints as they were), point `latest` at it, and delete everything under step_*
    but the last KEPT complete checkpoints (older ones, a step_<N>.tmp left by a killed job)."""
    write_manifest(tmp)
    if final.exists():  # the same step written before (no manifest: not a checkpoint this code resumes)
        shutil.rmtree(final)
    os.replace(tmp, final)
    point_latest(final.parent, final.name)
    kept = complete_checkpoints(final.parent)[:KEPT]
    for old in final.parent.glob("step_*"):
        if old not in kept:
            shutil.rmtree(old, ignore_errors=True)


class NoSpaceError(OSError):
    """A checkpoint that did not fit on its filesystem: the path, the bytes free and the bytes it needs."""


def save_checkpoint(engine, ckpt_dir: Path, step: int, state: dict, rank: int, inject_no_space: bool = False) -> None:
    """Every rank writes its part into step_<N>.tmp, rank 0 publishes it. A rank whose write fails on a full
    filesystem (errno 28, or a library's write error with less free than the checkpoint needs) removes the partial
    checkpoint and raises NoSpaceError (no_space); the complete checkpoints before it stay as they were.
    `inject_no_space` (train.fault_injection.no_space_at_checkpoint_step, rank 0): the write fails as a full disk's."""
    final = ckpt_dir / step_name(step)
    tmp = final.with_name(f"{final.name}.tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    try:
        if inject_no_space:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
        engine.save(str(tmp))
        if rank == 0:
            (tmp / STATE).write_text(json.dumps(state))
    except Exception as exc:
        # read before anything is removed: another rank's cleanup of the same folder (below) frees the space, and
        # the rank that failed first is the one the launcher names (its marker's time)
        failed_at, free = time.time(), shutil.disk_usage(ckpt_dir).free
        problem = no_space(exc, ckpt_dir, tmp, step, free)
        if problem is None:
            exc.failed_at = failed_at
            raise
        problem.failed_at = failed_at
        shutil.rmtree(tmp, ignore_errors=True)  # what was written of it goes: the disk is not left full
        raise problem from exc
    dist.barrier()
    if rank == 0:
        publish(tmp, final)
    dist.barrier()


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def no_space(exc: BaseException, ckpt_dir: Path, tmp: Path, step: int, free: int) -> NoSpaceError | None:
    """The full-disk error a failed checkpoint write is, or None where it is another failure: errno 28 in the
    exception's chain, or (a library's own write error, e.g. torch.save's "file write failed") less space `free` on
    the filesystem when the write failed than the newest complete checkpoint took."""
    chain, seen = [], exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    enospc = any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in chain)
    previous = complete_checkpoints(ckpt_dir)
    needed = tree_bytes(previous[0]) if previous else None
    if not enospc and (needed is None or free >= needed):
        return None
    written = tree_bytes(tmp) if tmp.exists() else 0
    size = (f"it needs about {needed / MIB:,.1f} MiB (the size of {previous[0].name})" if needed is not None
            else f"it needs more than the {written / MIB:,.1f} MiB written before the failure")
    kept = (f"the previous checkpoint {previous[0].name} is intact: free space and rerun, the run resumes from it"
            if previous else "no earlier checkpoint: a rerun starts at step 0")
    return NoSpaceError(errno.ENOSPC, f"no space left for the checkpoint at step {step} in {tmp}: {free / MIB:,.1f} "
                                      f"MiB free on its filesystem, {size}; {kept}")


# ---------------------------------------------------------------- loading
def aside_name(ckpt_dir: Path, why: str) -> Path:
    return ckpt_dir.with_name(f"{ckpt_dir.name}.{why}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")


def describe(damaged: list[tuple[Path, str]]) -> str:
    return ", ".join(f"{path.name} damaged ({why})" for path, why in damaged)


def set_aside_superseded(ckpt_dir: Path, path: Path, old: str, config_hash: str) -> dict:
    aside = ckpt_dir.with_name(f"{ckpt_dir.name}.superseded-{old}")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(ckpt_dir, aside)
    ckpt_dir.mkdir(parents=True)
    return {"path": None, "state": None, "fallback": None,
            "log": f"resume: not resuming {path.name}: it was written under another configuration (config hash "
                   f"{old}, this run {config_hash}); moved to {aside}; starting at step 0"}


def set_aside_all_damaged(ckpt_dir: Path, damaged: list[tuple[Path, str]]) -> dict:
    aside = aside_name(ckpt_dir, "damaged")
    os.replace(ckpt_dir, aside)
    ckpt_dir.mkdir(parents=True)
    note = f"{describe(damaged)}; none loadable, moved to {aside.name}, started from step 0"
    return {"path": None, "state": None, "fallback": note,
            "log": f"resume: no checkpoint loadable: {describe(damaged)}; moved to {aside}; starting at step 0"}


def resume_after(ckpt_dir: Path, path: Path, state: dict, damaged: list[tuple[Path, str]]) -> dict:
    """Resume `path`; the damaged newer checkpoints go to a ckpt.damaged-* directory and `latest` points at `path`."""
    log = f"resume: resuming from {path.name} (step {state['step']}, config hash {state['config_hash']})"
    note = state.get("checkpoint_fallback")  # a fallback earlier in this run's life stays on its row
    if damaged:
        aside = aside_name(ckpt_dir, "damaged")
        aside.mkdir()
        for bad, _ in damaged:
            os.replace(bad, aside / bad.name)
        point_latest(ckpt_dir, path.name)
        fallback = f"{describe(damaged)}, resumed from {path.name}"
        note = f"{note}; {fallback}" if note else fallback
        log += f"; {describe(damaged)}: moved to {aside}"
    return {"path": str(path), "state": state, "fallback": note, "log": log}


def choose_checkpoint(ckpt_dir: Path, config_hash: str) -> dict:
    """Rank 0's decision, acted on: the newest complete checkpoint whose files match their checksums, if it is of
    this configuration. {"path", "state", "fallback" (for the row), "log" (one line)}; path None: start at step 0."""
    damaged = []
    for path in complete_checkpoints(ckpt_dir):
        why = damage(path)
        if why:
            damaged.append((path, why))
            continue
        state = json.loads((path / STATE).read_text())
        old = state.get("config_hash") or "unknown"
        if old != config_hash:
            return set_aside_superseded(ckpt_dir, path, old, config_hash)
        return resume_after(ckpt_dir, path, state, damaged)
    if damaged:
        return set_aside_all_damaged(ckpt_dir, damaged)
    return {"path": None, "state": None, "fallback": None, "log": None}


def load_checkpoint(engine, ckpt_dir: Path, config_hash: str, rank: int) -> tuple[dict | None, str | None]:
    """Restore the engine from the newest intact checkpoint of this configuration: its state.json (None: start at
    step 0) and the run's fallbacks so far (None if no checkpoint it resumed was ever passed over as damaged).
    Only checkpoints whose checksums match are loaded, so a failure of engine.load is not damage: it is raised."""
    decision = [choose_checkpoint(ckpt_dir, config_hash) if rank == 0 else None]
    dist.broadcast_object_list(decision, src=0)
    decision = decision[0]
    if decision["path"] is not None:
        engine.load(decision["path"])
    if rank == 0 and decision["log"]:
        print(decision["log"], flush=True)
    return decision["state"], decision["fallback"]
