"""A random initialisation made once (rule random_init) and loaded by every run that starts from it.

Building a model on the CPU draws every weight from torch's CPU generator one number at a time: about 20 ns a
parameter whatever the threads (gpt2-large's 774 M, 20 s; Qwen2.5-Coder-1.5B's, 19-24 s of each launch's set-up on
an H200's host), and every rank of every run and lever-trial candidate drew the same numbers again. Here the
initialisation of one (model, seed, embedding rows, sequence length, overrides) is built once, exactly as a
launch builds it (torch.manual_seed(seed), then batches.make_model's build), written with `save_pretrained` beside
the CPU generator's state after the build, and a run loads it in a fraction of a second: its parameters, buffers
and generator state are the ones its own build would have made, so LoRA adapters, dropout and everything after
draw the same numbers as before (tests/test_random_init.py). A run from pretrained weights has no random_init.

The folder: `config.json` + `model.safetensors` (transformers' own format), `rng_state.pt`, and `random_init.json`
(the recipe it was built from, the weight file's sha256, the parameters and the build's seconds).
Rule random_init runs it through workflow_scripts/job/random_init.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

RECIPE = "random_init.json"
RNG_STATE = "rng_state.pt"
WEIGHTS = "model.safetensors"


class RandomInitError(ValueError):
    """A random initialisation folder that does not match the run that loads it (the message names the folder)."""


def key(recipe: dict) -> str:
    """The folder name of a recipe: a hash of every setting the initialisation depends on."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def build(recipe: dict, out: Path) -> dict:
    """Build the recipe's model as a launch does and write the folder (atomically: a folder that exists is whole)."""
    import torch

    from workflow_scripts.training.models import build_model, data_rows

    t0 = time.perf_counter()
    data = json.loads(Path(recipe["data"]["manifest"]).read_text())
    vocab = data_rows(data, recipe["train"])
    torch.manual_seed(recipe["seed"])
    model = build_model(recipe["model"], vocab, data["block_size"], overrides=recipe["model_overrides"])
    state = torch.get_rng_state()
    build_s = time.perf_counter() - t0
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    torch.save(state, tmp / RNG_STATE)
    info = {"recipe": recipe, "vocab": vocab, "seq_len": data["block_size"],
            "parameters": sum(p.numel() for p in model.parameters()), "build_s": round(build_s, 3),
            "weights_sha256": _sha256(tmp / WEIGHTS)}
    (tmp / RECIPE).write_text(json.dumps(info, indent=2, sort_keys=True))
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return info


def load(folder: str, model: str, vocab: int, seq_len: int, attn_implementation: str):
    """The model a run's build would have made (fp32, on the CPU), and the CPU generator left where that build left
    it. A folder built for another model, vocabulary or sequence length is an error naming it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageClassification

    from workflow_scripts.training import attention
    from workflow_scripts.training.models import MODELS

    path = Path(folder)
    try:
        info = json.loads((path / RECIPE).read_text())
    except (OSError, ValueError) as exc:
        raise RandomInitError(f"{path}: not a random initialisation folder ({exc}); "
                              "rule random_init makes it") from None
    made = (info["recipe"]["model"], info["vocab"], info["seq_len"])
    if made != (model, vocab, seq_len):
        raise RandomInitError(f"{path}: built for model {made[0]}, {made[1]} embedding rows, sequence {made[2]}; "
                              f"this run trains {model}, {vocab} rows, sequence {seq_len}")
    attention.register(attn_implementation)
    loader = AutoModelForImageClassification if MODELS[model].vision else AutoModelForCausalLM
    loaded = loader.from_pretrained(path, dtype=torch.float32, attn_implementation=attn_implementation)
    torch.set_rng_state(torch.load(path / RNG_STATE))
    return loaded
