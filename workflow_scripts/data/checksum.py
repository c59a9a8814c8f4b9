"""The data files' SHA-256, written into their manifest by the stage that makes them (tokenize, images) and
checked by the launcher before any rank starts (job/launch.py): a cut, overwritten or swapped `train.npy`
is one error naming the file and the rule to rerun, never numpy's mmap error on every rank or a run that trains
on garbage to an `ok` row.

A file's hash is cached beside it (`<file>.sha256`, keyed by size and modification time), so a rerun reads each
file once per change, not once per run.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

KEY = "files"  # the manifest's section: {"train": {"sha256": ..., "bytes": ...}, "val": {...}}
SPLITS = ("train", "val")
CHUNK = 1 << 22


def _stamp(path: Path) -> dict:
    st = os.stat(path)
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def _cache(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def digest(path: str | Path) -> str:
    """The file's SHA-256, read in chunks (hashlib releases the GIL: threads hash files side by side)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256(path: str | Path) -> str:
    """The file's SHA-256, from its cache when the file has not changed since it was hashed."""
    path = Path(path)
    stamp, cache = _stamp(path), _cache(path)
    try:
        cached = json.loads(cache.read_text())
        if {k: cached.get(k) for k in stamp} == stamp:
            return cached["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    value = digest(path)
    try:
        cache.write_text(json.dumps({**stamp, "sha256": value}))
    except OSError:  # a read-only data directory: hash again next time
        pass
    return value


def entries(paths: dict[str, str]) -> dict:
    """The manifest's `files` section for {split: path}."""
    return {split: {"sha256": sha256(p), "bytes": os.path.getsize(p)} for split, p in paths.items()}


def problems(data: dict, rerun: str) -> list[str]:
    """What is wrong with a run's data files ({train, val, manifest} paths, as in a run spec) against the hashes
    in their manifest; `rerun` names what regenerates them. A manifest that records no hashes is one problem too:
    the files cannot be trusted."""
    manifest = Path(data["manifest"])
    if not manifest.exists():
        return [f"{manifest}: missing (the data manifest): {rerun}"]
    recorded = json.loads(manifest.read_text()).get(KEY)
    if not recorded:
        return [f"{manifest}: records no SHA-256 of the data files (made by an older version): {rerun}"]
    out = []
    for split in SPLITS:
        path, want = Path(data[split]), recorded.get(split) or {}
        if not path.exists():
            out.append(f"{path}: missing: {rerun}")
        elif os.path.getsize(path) != want.get("bytes"):
            out.append(f"{path}: {os.path.getsize(path)} bytes, its manifest {manifest} says {want.get('bytes')} "
                       f"(the file was cut or replaced): {rerun}")
        elif sha256(path) != want.get("sha256"):
            out.append(f"{path}: SHA-256 differs from its manifest {manifest} (the file changed after it was "
                       f"made): {rerun}")
    return out
