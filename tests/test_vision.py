"""The image workload's parts: the image data stage (real `datasets` loader on local files, the offline set),
LoRA through peft (only the adapters train, the base weights stay bit for bit), the ViT FLOPs, the config check.
The ViT study itself runs in test_studies_cpu.py (every strategy, accuracy above chance)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import by_hand

from workflow_scripts.data import images


def image_folder(root, classes=("cat", "dog"), per_class=3):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):  # different sizes: the stage resizes every image
            arr = rng.integers(0, 255, (20 + 4 * i, 24, 3), dtype=np.uint8)
            arr[..., c] = 255
            Image.fromarray(arr).save(root / name / f"{i}.png")
    return root


def test_a_local_image_folder_goes_through_load_dataset_into_rows(tmp_path):
    folder = image_folder(tmp_path / "imgs")
    params = {"source": "local", "image_size": 16, "seed": 0, "local": {"path": str(folder)}}
    m = images.build(params, 0.34, tmp_path / "t.npy", tmp_path / "v.npy", tmp_path / "m.json")
    train, val = np.load(tmp_path / "t.npy"), np.load(tmp_path / "v.npy")
    assert m["classes"] == ["cat", "dog"] and m["block_size"] == 1 + 3 * 16 * 16 == train.shape[1]
    assert (m["train_images"], m["val_images"]) == (4, 2) and set(train[:, 0]) | set(val[:, 0]) == {0, 1}
    pixels = train[:, 1:].reshape(-1, 3, 16, 16)
    for row, img in zip(train[:, 0], pixels):  # the class's own channel is saturated after resizing
        assert img[row].min() == 255
    again = images.build(params, 0.34, tmp_path / "t2.npy", tmp_path / "v2.npy", tmp_path / "m2.json")
    assert again["files"]["train"]["sha256"] == m["files"]["train"]["sha256"]


def test_the_offline_set_is_deterministic_and_balanced():
    a, la, names = images.synthetic(5, 4, 12, seed=3)
    b, lb, _ = images.synthetic(5, 4, 12, seed=3)
    assert a.shape == (20, 12, 12, 3) and (a == b).all() and (la == lb).all()
    assert np.bincount(la).tolist() == [4] * 5 and len(names) == 5
    assert not (images.synthetic(5, 4, 12, seed=4)[0] == a).all()


def test_lora_trains_the_adapters_and_leaves_the_base_weights_bit_identical(tmp_path):
    from workflow_scripts.training import vision
    from workflow_scripts.training.batches import make_model
    from workflow_scripts.training.models import count_trainable
    from workflow_scripts.training.precision import POLICIES

    images.build({"source": "synthetic", "image_size": 16, "seed": 0, "synthetic": {"classes": 4, "per_class": 8}},
                 0.1, tmp_path / "t.npy", tmp_path / "v.npy", tmp_path / "m.json")
    rows = torch.from_numpy(np.load(tmp_path / "t.npy").astype(np.int64))
    spec = by_hand(model="vit-tiny-lora", train={"attn_implementation": "sdpa", "lora": None})
    torch.manual_seed(0)
    model = make_model(spec, 4, rows.shape[1])
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert base and all("lora_" in n or "classifier" in n for n in adapters)
    assert count_trainable(model) == sum(p.numel() for p in adapters.values())
    ctx = type("Ctx", (), {"precision": POLICIES["fp32"], "device": torch.device("cpu")})()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for i in range(3):
        loss = vision.forward_loss(model, rows[8 * i:8 * i + 8], ctx)
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in base.items())
    assert any(not torch.equal(after[n], p) for n, p in adapters.items() if "lora_B" in n)


def test_vit_flops_count_tokens_per_image():
    from workflow_scripts.training.models import model_flops_per_token, vit_flops_per_image

    row = 1 + 3 * 224 * 224
    per_image = model_flops_per_token("vit-base-16", 86_000_000, row) * row
    assert per_image == pytest.approx(vit_flops_per_image(86_000_000, 86_000_000, 12, 768, 196))
    assert per_image == pytest.approx(197 * (6 * 86e6 + 12 * 12 * 768 * 197))
    lora = model_flops_per_token("vit-base-16-lora", 86_000_000, row, trainable=300_000) * row
    assert lora < per_image  # frozen weights need no weight gradients


def test_a_vit_on_token_blocks_is_refused_naming_data_kind():
    from workflow_scripts.config_check import data_kind_problems

    config = {"models": ["vit-tiny"], "strategies": ["ddp"], "world_sizes": [2], "data": {"kind": "text"},
              "train": {"lora": None}, "images": {"source": "synthetic"}}
    assert data_kind_problems(config) == ["data.kind: text, but vit-tiny is an image classifier "
                                          "(set data.kind: images)"]
    config["data"]["kind"], config["models"] = "images", ["gpt2-tiny"]
    assert data_kind_problems(config)[0].startswith("data.kind: images, but gpt2-tiny is a language model")
