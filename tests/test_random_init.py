"""A random initialisation built once (rule random_init) is what each run's own build would have made: the same
parameters, buffers and CPU generator state, for a language model, an MoE model and a ViT with LoRA; a folder built
for another shape is refused by name."""
import json

import numpy as np
import pytest
import torch
from conftest import by_hand

from workflow_scripts.training import random_init
from workflow_scripts.training.batches import make_model


def _data(tmp_path, vocab, block, images=False):
    """A prepared-data folder as rule tokenize (or images) writes it; only the manifest's vocabulary (classes) and
    block are read."""
    d = tmp_path / "data"
    d.mkdir()
    np.save(d / "train.npy", np.zeros((4, block), dtype=np.uint16))
    np.save(d / "val.npy", np.zeros((2, block), dtype=np.uint16))
    manifest = {"kind": "images", "num_classes": vocab} if images else {"vocab_size": vocab}
    (d / "tokens_manifest.json").write_text(json.dumps({**manifest, "block_size": block}))
    return {"train": str(d / "train.npy"), "val": str(d / "val.npy"), "manifest": str(d / "tokens_manifest.json")}


def _spec(model, data, seed, lora=None, folder=None):
    train = {"vocab_multiple": 64, "embedding_rows": None, "attn_implementation": "sdpa", "seed": seed}
    if lora:
        train["lora"] = lora
    return by_hand(model=model, train=train, data=data, random_init=folder)


def _built(spec, vocab, block):
    """The model and the generator's next draws as a launch without random_init makes them."""
    torch.manual_seed(spec.train["seed"])
    model = make_model(spec, vocab, block)
    return model, torch.rand(8)


@pytest.mark.parametrize("model, vocab, block, lora", [
    ("gpt2-tiny", 300, 32, None),
    ("qwen2-moe-tiny", 300, 32, None),
    ("vit-tiny-lora", 10, 1 + 3 * 16 * 16, None),
    ("qwen2-tiny", 300, 32, {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}),
])
def test_a_loaded_initialisation_is_the_build_to_the_bit(tmp_path, model, vocab, block, lora):
    data = _data(tmp_path, vocab, block, images=model.startswith("vit"))
    rows = -(-vocab // 64) * 64  # the vocabulary (or the classes) padded to train.vocab_multiple
    folder = tmp_path / "init"
    recipe = {"model": model, "model_source": None, "model_overrides": {}, "seed": 7,
              "train": {"vocab_multiple": 64, "embedding_rows": None}, "data": data}
    info = random_init.build(recipe, folder)
    assert info["vocab"] == rows and info["seq_len"] == block

    want, want_draws = _built(_spec(model, data, 7, lora), rows, block)
    torch.manual_seed(12345)  # whatever the generator held before: the load leaves it where the build did
    got = make_model(_spec(model, data, 7, lora, str(folder)), rows, block)
    got_draws = torch.rand(8)

    w, g = dict(want.named_parameters()), dict(got.named_parameters())
    assert w.keys() == g.keys()
    assert all(torch.equal(w[k], g[k]) for k in w)
    wb, gb = dict(want.named_buffers()), dict(got.named_buffers())
    assert wb.keys() == gb.keys() and all(torch.equal(wb[k], gb[k]) for k in wb)
    assert torch.equal(want_draws, got_draws)
    assert got.config.use_cache is False


def test_a_folder_of_another_shape_is_refused_by_name(tmp_path):
    data = _data(tmp_path, 300, 32)
    folder = tmp_path / "init"
    random_init.build({"model": "gpt2-tiny", "model_source": None, "model_overrides": {}, "seed": 1,
                       "train": {"vocab_multiple": 64, "embedding_rows": None}, "data": data}, folder)
    with pytest.raises(random_init.RandomInitError, match=r"init: built for model gpt2-tiny, 320 embedding rows"):
        make_model(_spec("gpt2-tiny", data, 1, folder=str(folder)), 384, 32)
    with pytest.raises(random_init.RandomInitError, match="not a random initialisation folder"):
        make_model(_spec("gpt2-tiny", data, 1, folder=str(tmp_path / "missing")), 320, 32)
