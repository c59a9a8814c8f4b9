"""Stage 3, tokenize: corpus -> packed fixed-length blocks (train.npy, val.npy) and a manifest of token counts.

Documents are split between train and validation before packing (every k-th document to validation, k =
round(1 / val_fraction)), so no block straddles the split. Each document is followed by the EOS token; the token
stream is cut into blocks of `block_size` tokens, the tail that does not fill a block is dropped. Encoding runs in
`threads` worker processes over document chunks; the order of the output does not depend on that number.
"""
from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from workflow_scripts.data.corpus import read_texts

_TOKENIZER = None


def _init(tokenizer_dir: str):
    global _TOKENIZER
    from transformers import AutoTokenizer

    _TOKENIZER = AutoTokenizer.from_pretrained(tokenizer_dir)


def _encode(texts: list[str]) -> list[list[int]]:
    eos = _TOKENIZER.eos_token_id
    return [ids + [eos] for ids in _TOKENIZER(texts, add_special_tokens=False)["input_ids"]]


def split_documents(texts: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    if val_fraction <= 0:
        return texts, []
    k = max(2, round(1 / val_fraction))
    val = [t for i, t in enumerate(texts) if i % k == k - 1]
    train = [t for i, t in enumerate(texts) if i % k != k - 1]
    return train, val


def encode_all(texts: list[str], tokenizer_dir: str, threads: int, chunk: int = 64) -> list[int]:
    chunks = [texts[i:i + chunk] for i in range(0, len(texts), chunk)]
    stream: list[int] = []
    if threads <= 1:
        _init(tokenizer_dir)
        for c in chunks:
            for ids in _encode(c):
                stream += ids
        return stream
    with ProcessPoolExecutor(threads, initializer=_init, initargs=(tokenizer_dir,)) as pool:
        for encoded in pool.map(_encode, chunks):  # map keeps chunk order
            for ids in encoded:
                stream += ids
    return stream


def pack(stream: list[int], block_size: int, dtype) -> np.ndarray:
    n = len(stream) // block_size
    return np.asarray(stream[: n * block_size], dtype=dtype).reshape(n, block_size)


def tokenize(corpus_jsonl: str, tokenizer_dir: str, block_size: int, val_fraction: float, threads: int,
             out_train: str, out_val: str, out_manifest: str) -> dict:
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tokenizer_dir))
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max else np.int32
    texts = list(read_texts(corpus_jsonl))
    train_texts, val_texts = split_documents(texts, val_fraction)
    train = pack(encode_all(train_texts, tokenizer_dir, threads), block_size, dtype)
    val = pack(encode_all(val_texts, tokenizer_dir, threads), block_size, dtype)
    if len(train) == 0:
        raise ValueError(f"tokenize: the corpus gives no training block of data.block_size={block_size} tokens")
    for path, arr in ((out_train, train), (out_val, val)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        np.save(path, arr)
    manifest = {"block_size": block_size, "vocab_size": vocab, "dtype": np.dtype(dtype).name,
                "train_blocks": int(train.shape[0]), "val_blocks": int(val.shape[0]),
                "train_tokens": int(train.size), "val_tokens": int(val.size),
                "train_documents": len(train_texts), "val_documents": len(val_texts),
                "val_fraction": val_fraction, "threads": threads}
    Path(out_manifest).write_text(json.dumps(manifest, indent=2))
    return manifest


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--val-fraction", type=float, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--manifest", required=True)
    a = ap.parse_args(argv)
    print(json.dumps(tokenize(a.corpus, a.tokenizer, a.block_size, a.val_fraction, a.threads,
                              a.train, a.val, a.manifest), indent=2))


if __name__ == "__main__":
    main()
