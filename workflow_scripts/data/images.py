"""Stage 1-3 for image studies: labelled images -> resized, fixed-size uint8 rows the trainer memory-maps.

    python -m workflow_scripts.data.images --params '<config images as JSON>' --val-fraction 0.05 \\
        --train work/data/<key>/train.npy --val work/data/<key>/val.npy --manifest work/data/<key>/tokens_manifest.json

Sources (config `images.source`):
- hub: `datasets.load_dataset(path, name, split)` (CIFAR-100: `cifar100`, fields img / fine_label; Food-101:
  `food101`, image / label); a local dataset directory works the same way (`imagefolder` with data_dir);
- local: `datasets.load_dataset("imagefolder", data_dir=...)`: one sub-folder per class;
- synthetic (offline default, recorded as a substitution): an image set this stage makes, `classes` x `per_class`
  images of oriented colour gratings: each class its own orientation, spatial frequency and colour, each image its
  own phase, contrast, offset and pixel noise; learnable, not trivial, the same bytes for the same seed.

Every image is converted to RGB and resized once to `image_size` (bilinear), then stored as one uint8 row
[label, channel-first pixels] (3 x size x size + 1 values): the trainer reads rows like token blocks and the vision
forward (training/vision.py) splits label and pixels. The split is a seeded permutation. The manifest uses the token
manifest's keys where they mean the same (block_size: the row length; vocab_size: the number of classes, i.e. the
classifier's outputs) and adds the image facts and the arrays' SHA-256 (content-hashed like the token blocks).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from workflow_scripts.data import checksum

ROW_DTYPE = np.uint8  # how an image row (its label, then its pixels) is stored: what the trainer memory-maps


def synthetic(classes: int, per_class: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images N x size x size x 3 uint8, labels N) of oriented colour gratings, one pattern family per class."""
    rng = np.random.default_rng(seed)
    crng = np.random.default_rng(seed + 1)  # the classes' own parameters, independent of the image count
    angle = np.linspace(0, np.pi, classes, endpoint=False)
    freq = 1.5 + 3.5 * crng.random(classes)
    colour = 0.25 + 0.75 * crng.random((classes, 3))
    y, x = np.mgrid[0:size, 0:size] / size
    images = np.empty((classes * per_class, size, size, 3), np.uint8)
    labels = np.repeat(np.arange(classes), per_class)
    for i, c in enumerate(labels):
        a = angle[c] + rng.normal(0, 0.08)
        wave = np.sin(2 * np.pi * freq[c] * (x * np.cos(a) + y * np.sin(a)) + rng.uniform(0, 2 * np.pi))
        contrast, offset = rng.uniform(0.5, 1.0), rng.uniform(-0.15, 0.15)
        img = 0.5 + 0.5 * contrast * wave[..., None] * colour[c] + offset + rng.normal(0, 0.08, (size, size, 3))
        images[i] = np.clip(img * 255, 0, 255).astype(np.uint8)
    return images, labels, [f"grating{c}" for c in range(classes)]


def from_datasets(ds, image_field: str, label_field: str, size: int, limit: int | None):
    """A `datasets` split -> (images resized to size x size RGB uint8, labels, class names)."""
    from PIL import Image

    if limit:
        ds = ds.select(range(min(limit, len(ds))))
    feature = ds.features[label_field]
    names = list(getattr(feature, "names", None) or sorted({int(v) for v in ds[label_field]}))
    images = np.empty((len(ds), size, size, 3), np.uint8)
    for i, img in enumerate(ds[image_field]):
        images[i] = np.asarray(img.convert("RGB").resize((size, size), Image.BILINEAR))
    return images, np.asarray(ds[label_field], np.int64), [str(n) for n in names]


def load(params: dict):
    """The configured source's images, labels, class names and what was used (for the manifest)."""
    size, source = params["image_size"], params["source"]
    if source == "synthetic":
        s = params["synthetic"]
        images, labels, names = synthetic(s["classes"], s["per_class"], size, params["seed"])
        return images, labels, names, {"source": "synthetic", **s}
    from datasets import load_dataset

    if source == "local":
        ds = load_dataset("imagefolder", data_dir=params["local"]["path"], split="train")
        fields = ("image", "label")
        used = {"source": "local", "path": params["local"]["path"]}
    else:
        hub = params["hub"]
        ds = load_dataset(hub["path"], hub.get("name"), split=hub["split"])
        fields = (hub["image_field"], hub["label_field"])
        used = {"source": "hub", **hub}
    images, labels, names = from_datasets(ds, *fields, size, params.get("max_images"))
    return images, labels, names, used


def rows(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[label, channel-first pixels] per image, ROW_DTYPE (uint8: at most 256 classes)."""
    if labels.max(initial=0) > np.iinfo(ROW_DTYPE).max:
        raise ValueError("images: more than 256 classes do not fit the uint8 label column")
    flat = images.transpose(0, 3, 1, 2).reshape(len(images), -1)
    return np.concatenate([labels.astype(ROW_DTYPE)[:, None], flat], axis=1)


def build(params: dict, val_fraction: float, train_path: str, val_path: str, manifest_path: str) -> dict:
    images, labels, names, used = load(params)
    data = rows(images, labels)
    perm = np.random.default_rng(params["seed"]).permutation(len(data))
    n_val = max(1, int(round(len(data) * val_fraction)))
    val, train = data[np.sort(perm[:n_val])], data[np.sort(perm[n_val:])]
    for path, arr in ((train_path, train), (val_path, val)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        np.save(path, arr)
    manifest = {"kind": "images", "block_size": int(data.shape[1]), "vocab_size": len(names),
                "num_classes": len(names), "classes": names, "image_size": params["image_size"],
                "dtype": "uint8", "layout": "label, then channels x height x width",
                "normalise": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
                "train_blocks": len(train), "val_blocks": len(val), "train_images": len(train),
                "val_images": len(val), "val_fraction": val_fraction, "loss_on": "label",
                checksum.KEY: checksum.entries({"train": train_path, "val": val_path}),
                **{f"source_{k}": v for k, v in used.items()}}
    Path(manifest_path).parent.mkdir(parents=True, exist_ok=True)
    Path(manifest_path).write_text(json.dumps(manifest, indent=2))
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", required=True, help="config `images` as JSON")
    ap.add_argument("--val-fraction", type=float, required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--manifest", required=True)
    args = ap.parse_args(argv)
    m = build(json.loads(args.params), args.val_fraction, args.train, args.val, args.manifest)
    print(json.dumps({k: m[k] for k in ("train_images", "val_images", "num_classes", "image_size")}))


if __name__ == "__main__":
    main()
