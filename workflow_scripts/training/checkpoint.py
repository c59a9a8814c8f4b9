"""Checkpoints of a run under its work_dir: `step_<N>/` (the engine's own format + state.json: the step, the rows
logged so far, the initial validation loss, the configuration's hash) and a `latest` pointer replaced atomically,
so a job killed at any moment resumes from the last complete checkpoint.

A run resumes only a checkpoint of its own configuration: `resume_hash` covers everything in the run spec that can
change a number (model, strategy, layout, precision, the token data, every train setting but logging, checkpoint
frequency and fault injection). A checkpoint written under another configuration is never loaded: it is moved aside to
`ckpt.superseded-<its hash>` (nothing is deleted) and the run starts at step 0, saying so in its log.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch.distributed as dist

# spec keys that never change a result: where files go, how it is observed
NOT_HASHED = ("run_id", "study", "out_dir", "work_dir", "sampler", "ops", "torch_extensions_dir", "substitutions",
              "profile", "trace_dir", "memory_guard")
NOT_HASHED_TRAIN = ("log_every", "checkpoint_every", "tensorboard", "fault_injection",
                    "compile_auto")  # why auto decided: prose; the decided compile_blocks/compile_loss are hashed


def resume_hash(spec: dict) -> str:
    """What shapes the run's trajectory: the spec's settings and the token data itself. The data's paths stay the
    same when the corpus changes, so its manifest and the block files' size and modification time count too
    (regenerated data never resumes an older checkpoint, even if it came out identical: the safe side)."""
    kept = {k: v for k, v in spec.items() if k not in NOT_HASHED}
    kept["train"] = {k: v for k, v in spec["train"].items() if k not in NOT_HASHED_TRAIN}
    manifest = Path(spec["data"]["manifest"])
    kept["tokens_manifest"] = manifest.read_text() if manifest.exists() else None
    kept["token_files"] = [(os.stat(p).st_size, os.stat(p).st_mtime_ns) if os.path.exists(p) else None
                           for p in (spec["data"]["train"], spec["data"]["val"])]
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


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


def load_checkpoint(engine, ckpt_dir: Path, config_hash: str, rank: int) -> dict | None:
    """Restore the engine from the last complete checkpoint of this configuration; its state.json, or None."""
    last = latest_checkpoint(ckpt_dir)
    if last is None:
        return None
    state = json.loads((last / "state.json").read_text())
    old = state.get("config_hash") or "unknown"
    if old != config_hash:
        dist.barrier()  # every rank has read the pointer before rank 0 moves the directory
        if rank == 0:
            aside = ckpt_dir.with_name(f"{ckpt_dir.name}.superseded-{old}")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(ckpt_dir, aside)
            ckpt_dir.mkdir(parents=True)
            print(f"resume: not resuming {last.name}: it was written under another configuration (config hash "
                  f"{old}, this run {config_hash}); moved to {aside}; starting at step 0", flush=True)
        dist.barrier()
        return None
    engine.load(str(last))
    if rank == 0:
        print(f"resume: resuming from {last.name} (step {state['step']}, config hash {config_hash})", flush=True)
    return state
