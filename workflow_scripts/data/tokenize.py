"""Stage 3, tokenize: corpus -> packed fixed-length blocks (train.npy, val.npy) and a manifest of token counts.

Documents are split between train and validation before packing (every k-th document to validation, k =
round(1 / val_fraction)), so no block straddles the split. Each document is followed by the EOS token (its id in
the manifest: train.separate_documents keeps the documents of a block apart by it); the token stream is cut into
blocks of `block_size` tokens, the tail that does not fill a block is dropped. Encoding runs in
`threads` worker processes over document chunks; the order of the output does not depend on that number.

Chat corpora (corpus kind `chat`, supervised fine-tuning) are rendered with the tokenizer's chat template (a
ChatML template, Qwen2.5's format, where the tokenizer has none: recorded in the manifest); only the assistant's
answer and the EOS after it are trained. The blocks then hold int32 and every other token (system and user turns,
the template's framing up to the answer) is stored as -(id + 1): the model reads id, no loss predicts it
(`training.strategies.engine.input_ids` / `targets`). The manifest's `loss_on` says which: "all" or "response".
"""
from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from workflow_scripts.data import checksum
from workflow_scripts.data.corpus import read_records

_TOKENIZER = None
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _init(tokenizer_dir: str):
    global _TOKENIZER
    from transformers import AutoTokenizer

    _TOKENIZER = AutoTokenizer.from_pretrained(tokenizer_dir)
    if not _TOKENIZER.chat_template:
        _TOKENIZER.chat_template = CHATML


def chat_template_source(tokenizer_dir: str) -> str:
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(tokenizer_dir).chat_template
    return "the tokenizer's own" if own else "ChatML (Qwen2.5's format; the tokenizer has none)"


def _encode(texts: list[str]) -> list[list[int]]:
    eos = _TOKENIZER.eos_token_id
    return [ids + [eos] for ids in _TOKENIZER(texts, add_special_tokens=False)["input_ids"]]


def _template_ids(messages: list[dict], prompt: bool) -> list[int]:
    out = _TOKENIZER.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _encode_chat(conversations: list[list[dict]]) -> list[list[int]]:
    """Each conversation's tokens + EOS, the context tokens (everything before the last answer) as -(id + 1)."""
    out = []
    for messages in conversations:
        prompt, full = _template_ids(messages[:-1], True), _template_ids(messages, False)
        if full[:len(prompt)] != prompt:
            raise ValueError("tokenize: the chat template's rendering of the prompt is not a prefix of the "
                             "conversation's: the answer cannot be told apart")
        out.append([-t - 1 for t in prompt] + full[len(prompt):] + [_TOKENIZER.eos_token_id])
    return out


def split_documents(texts: list, val_fraction: float) -> tuple[list, list]:
    if val_fraction <= 0:
        return texts, []
    k = max(2, round(1 / val_fraction))
    val = [t for i, t in enumerate(texts) if i % k == k - 1]
    train = [t for i, t in enumerate(texts) if i % k != k - 1]
    return train, val


def encode_all(docs: list, tokenizer_dir: str, threads: int, chunk: int = 64, chat: bool = False) -> list[int]:
    """Documents (texts, or conversations when `chat`) -> one token stream, in document order."""
    encode = _encode_chat if chat else _encode
    chunks = [docs[i:i + chunk] for i in range(0, len(docs), chunk)]
    stream: list[int] = []
    if threads <= 1:
        _init(tokenizer_dir)
        for c in chunks:
            for ids in encode(c):
                stream += ids
        return stream
    with ProcessPoolExecutor(threads, initializer=_init, initargs=(tokenizer_dir,)) as pool:
        for encoded in pool.map(encode, chunks):  # map keeps chunk order
            for ids in encoded:
                stream += ids
    return stream


def token_dtype(vocab: int, chat: bool = False):
    """How the token blocks are stored: uint16 where every id fits (and no -100 response mask: chat), else int32."""
    return np.int32 if chat or vocab > np.iinfo(np.uint16).max else np.uint16


def pack(stream: list[int], block_size: int, dtype) -> np.ndarray:
    n = len(stream) // block_size
    return np.asarray(stream[: n * block_size], dtype=dtype).reshape(n, block_size)


def tokenize(corpus_jsonl: str, tokenizer_dir: str, block_size: int, val_fraction: float, threads: int,
             out_train: str, out_val: str, out_manifest: str) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = len(tok)
    records = list(read_records(corpus_jsonl))
    chat = bool(records) and "messages" in records[0]
    dtype = token_dtype(vocab, chat)
    docs = [r["messages"] if chat else r["text"] for r in records]
    train_texts, val_texts = split_documents(docs, val_fraction)
    train = pack(encode_all(train_texts, tokenizer_dir, threads, chat=chat), block_size, dtype)
    val = pack(encode_all(val_texts, tokenizer_dir, threads, chat=chat), block_size, dtype)
    if len(train) == 0:
        raise ValueError(f"tokenize: the corpus gives no training block of data.block_size={block_size} tokens")
    for path, arr in ((out_train, train), (out_val, val)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        np.save(path, arr)
    manifest = {"block_size": block_size, "vocab_size": vocab, "dtype": np.dtype(dtype).name,
                "train_blocks": int(train.shape[0]), "val_blocks": int(val.shape[0]),
                "train_tokens": int(train.size), "val_tokens": int(val.size),
                "train_documents": len(train_texts), "val_documents": len(val_texts),
                "val_fraction": val_fraction, "threads": threads, "loss_on": "response" if chat else "all",
                "eos_id": tok.eos_token_id,  # ends every document (train.separate_documents starts the next)
                checksum.KEY: checksum.entries({"train": out_train, "val": out_val})}
    if chat:
        manifest["chat_template"] = chat_template_source(tokenizer_dir)
        manifest["trained_token_fraction"] = float((train >= 0).mean())
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
