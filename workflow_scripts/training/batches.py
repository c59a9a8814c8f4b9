"""The data of a run: the token blocks, the model built for them, and the order in which every strategy and layout
sees them (same samples, same order, whatever the split), plus the validation loss over the same blocks."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from workflow_scripts.run_spec import RunSpec
from workflow_scripts.training import random_init
from workflow_scripts.training.models import MODELS, build_model, data_rows, with_lora
from workflow_scripts.training.run_context import RunContext

BATCH_DTYPE = np.int64  # the stored rows widened to what the model takes (token ids, and image rows before scaling)


class DataFileError(ValueError):
    """A prepared data file a run cannot read as its manifest describes it; the message names the file."""


MANIFEST_KEYS = ("block_size", "vocab_size", "train_blocks", "val_blocks")  # every tokens manifest (text, images)


def read_manifest(path: str | Path) -> dict:
    """The tokens manifest (data/tokenize.py, data/images.py), checked: JSON, with the keys a run reads."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataFileError(f"{path}: missing (the data stages write it: run the study again)") from None
    except json.JSONDecodeError as exc:
        raise DataFileError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    missing = [k for k in MANIFEST_KEYS if k not in data] + (
        ["num_classes"] if data.get("kind") == "images" and "num_classes" not in data else [])
    if missing:
        raise DataFileError(f"{path}: no {', '.join(missing)} (a manifest of another version of the data stages, or "
                            "edited: prepare the data again)")
    return data


def read_blocks(path: str | Path, manifest: dict, split: str, manifest_path: str | Path) -> np.ndarray:
    """The `split` blocks of a run (memory-mapped), checked against the manifest: a NumPy array of integers,
    `<split>_blocks` rows of `block_size`."""
    try:
        blocks = np.load(path, mmap_mode="r")
    except FileNotFoundError:
        raise DataFileError(f"{path}: missing (the data stages write it: run the study again)") from None
    except (ValueError, OSError, EOFError) as exc:
        raise DataFileError(f"{path}: not a NumPy array file ({type(exc).__name__}: {exc})") from None
    want = (manifest[f"{split}_blocks"], manifest["block_size"])
    if not np.issubdtype(blocks.dtype, np.integer) or blocks.shape != want:
        raise DataFileError(f"{path}: {blocks.dtype} array of shape {blocks.shape}, {manifest_path} says "
                            f"{want[0]} rows of {want[1]} integers (a file of another data preparation: prepare "
                            "the data again)")
    return blocks


def load_data(spec: RunSpec) -> tuple[dict, np.ndarray, np.ndarray, int]:
    """The tokens manifest, the training blocks (the first max_train_samples), the validation blocks, and the
    embedding rows: the tokenizer's vocabulary padded to vocab_multiple, or the original model's row count. Each
    file is checked where it is read (DataFileError names it)."""
    t, files = spec["train"], spec["data"]
    data = read_manifest(files["manifest"])
    blocks = read_blocks(files["train"], data, "train", files["manifest"])
    if len(blocks) == 0:
        raise DataFileError(f"{files['train']}: no training block ({files['manifest']}: train_blocks 0)")
    if t["max_train_samples"]:
        blocks = blocks[: t["max_train_samples"]]
    val = read_blocks(files["val"], data, "val", files["manifest"])
    return data, blocks, val, data_rows(data, t)


def make_model(spec: RunSpec, vocab: int, seq_len: int):
    """The run's model (registry shape or pretrained weights), fp32 on the CPU, no generation cache: its random
    initialisation loaded where rule random_init made it (the same weights and generator state as building it
    here), else built."""
    attn = spec.train["attn_implementation"]
    if spec.random_init:
        model = random_init.load(spec.random_init, spec.model, vocab, seq_len, attn)
    else:
        model = build_model(spec.model, vocab, seq_len, pretrained=spec.pretrained, attn_implementation=attn,
                            overrides=spec.model_overrides)
    model.config.use_cache = False
    lora = lora_settings(spec)
    return with_lora(model, lora) if lora else model


def lora_settings(spec: RunSpec) -> dict | None:
    """The run's LoRA (a `-lora` registry model, its keys overridden by train.lora where the study sets it: the
    schema gives it no default), or None."""
    base = MODELS[spec.model].lora
    given = spec.train.get("lora")
    return {**(base or {}), **given} if given else base


class Batches:
    """Same samples, same order, for every strategy and layout: epoch e uses permutation(seed + e) of the training
    blocks; step s takes the next `effective_batch` of them; data-parallel rank r's micro-step m takes slots
    (m * dp_size + r) * micro (ranks that differ only in other dimensions read the same slots)."""

    def __init__(self, blocks: np.ndarray, ctx: RunContext, seed: int, pin: bool):
        self.blocks, self.ctx, self.seed, self.pin = blocks, ctx, seed, pin
        self.steps_per_epoch = len(blocks) // ctx.effective_batch
        self._epoch, self._perm = None, None

    def micro_batches(self, step: int):
        epoch, s = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng(self.seed + epoch).permutation(len(self.blocks))
        c = self.ctx
        base = s * c.effective_batch
        for m in range(c.accum):
            start = base + (m * c.dp_size + c.dp_rank) * c.micro_batch
            idx = np.sort(self._perm[start:start + c.micro_batch])
            batch = torch.from_numpy(self.blocks[idx].astype(BATCH_DTYPE))
            if self.pin:
                batch = batch.pin_memory()
            yield batch.to(c.device, non_blocking=True)


def rank_chunks(val: np.ndarray, ctx: RunContext, samples: int, chunk: int):
    """This data-parallel rank's validation rows (`samples` at most) as device tensors of `chunk` rows; whole chunks
    only where the chunk is not the micro-batch (an engine that cannot take a short one: a pipeline)."""
    per_rank = min(samples, len(val) // ctx.dp_size)
    if chunk != ctx.micro_batch:
        per_rank -= per_rank % chunk
    mine = val[ctx.dp_rank::ctx.dp_size][:per_rank]
    for i in range(0, per_rank, chunk):
        yield torch.from_numpy(mine[i:i + chunk].astype(BATCH_DTYPE)).to(ctx.device)


def evaluate(engine, val: np.ndarray, ctx: RunContext, samples: int) -> float:
    """Mean next-token loss over the same validation blocks for every strategy (`samples` per data-parallel rank,
    read in chunks of the strategy's micro-batch), averaged over ranks."""
    total = torch.zeros(2, device=ctx.device, dtype=torch.float64)
    with engine.eval_mode():
        for tokens in rank_chunks(val, ctx, samples, engine.eval_chunk):
            total[0] += engine.forward_loss(tokens).double() * len(tokens)
            total[1] += len(tokens)
    dist.all_reduce(total)  # ranks along other dimensions add the same loss and count: the mean is unchanged
    return float(total[0] / total[1]) if total[1] > 0 else float("nan")
