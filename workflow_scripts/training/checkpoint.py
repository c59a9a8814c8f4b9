"""Checkpoints of a run under its work_dir: `step_<N>/` (the engine's own format + state.json: the step, the rows
logged so far, the initial validation loss) and a `latest` pointer replaced atomically, so a job killed at any
moment resumes from the last complete checkpoint."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch.distributed as dist


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    pointer = ckpt_dir / "latest"
    if not pointer.exists():
        return None
    path = ckpt_dir / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def save_checkpoint(engine, ckpt_dir: Path, step: int, state: dict, rank: int) -> None:
    path = ckpt_dir / f"step_{step:08d}"
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    dist.barrier()
    engine.save(str(path))
    dist.barrier()
    if rank == 0:
        (path / "state.json").write_text(json.dumps(state))
        tmp = ckpt_dir / "latest.tmp"
        tmp.write_text(path.name)
        os.replace(tmp, ckpt_dir / "latest")  # atomic: a kill before this line keeps the previous checkpoint
        for old in ckpt_dir.glob("step_*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load_checkpoint(engine, ckpt_dir: Path) -> dict | None:
    """Restore the engine from the last complete checkpoint; its state.json, or None if there is none."""
    last = latest_checkpoint(ckpt_dir)
    if last is None:
        return None
    state = json.loads((last / "state.json").read_text())
    engine.load(str(last))
    return state
