"""Stage 2, tokenizer: a hub tokenizer by name, or (default) a byte-level BPE trained on the corpus.

Either way the result is saved as a transformers `PreTrainedTokenizerFast` directory, so the tokenize and train
stages load it the same way (`AutoTokenizer.from_pretrained(dir)`).
"""
from __future__ import annotations

import json
from pathlib import Path

from workflow_scripts.data.corpus import read_texts

EOS = "<|endoftext|>"


def train_bpe(texts, vocab_size: int, min_frequency: int = 2):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=None)


def build_tokenizer(cfg: dict, corpus_jsonl: str, out_dir: str) -> dict:
    if cfg.get("kind", "bpe") == "hub":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cfg["name"])
        source = {"kind": "hub", "name": cfg["name"]}
    else:
        tok = train_bpe(read_texts(corpus_jsonl), cfg["vocab_size"], cfg.get("min_frequency", 2))
        source = {"kind": "bpe", "trained_on": corpus_jsonl, "requested_vocab_size": cfg["vocab_size"]}
    if tok.eos_token is None:
        tok.eos_token = EOS
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out_dir)
    info = {**source, "vocab_size": len(tok), "eos_token_id": tok.eos_token_id}
    Path(out_dir, "pipeline_tokenizer.json").write_text(json.dumps(info, indent=2))
    return info


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", required=True, help="the config's `tokenizer` section as JSON")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    print(json.dumps(build_tokenizer(json.loads(args.params), args.corpus, args.out), indent=2))


if __name__ == "__main__":
    main()
