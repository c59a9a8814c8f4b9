"""Stages 1-3: corpus sources (stdlib, hub code path on local files, local files), tokenizer, packed blocks."""
from __future__ import annotations

import json

import numpy as np
import pytest

from workflow_scripts.data import corpus, tokenizer
from workflow_scripts.data import tokenize as tokenize_data


def test_stdlib_corpus_is_deterministic_and_capped(tmp_path):
    cfg = {"source": "stdlib", "max_bytes": 200_000}
    a = corpus.build_corpus(cfg, str(tmp_path / "a.jsonl"), str(tmp_path / "a.json"))
    b = corpus.build_corpus(cfg, str(tmp_path / "b.jsonl"), str(tmp_path / "b.json"))
    assert a["sha256"] == b["sha256"] and a["documents"] == b["documents"] > 3
    assert a["bytes"] <= 200_000
    first = json.loads((tmp_path / "a.jsonl").read_text().splitlines()[0])
    assert first["id"].endswith(".py") and "\r" not in first["text"]


def test_hub_source_goes_through_load_dataset(tmp_path):
    """The hub path (datasets.load_dataset) on a local dataset directory shaped like MetaMathQA."""
    ds = tmp_path / "metamath"
    ds.mkdir()
    rows = [{"query": f"What is {i} + {i}?", "response": f"The answer is {2 * i}.", "type": "x"} for i in range(20)]
    (ds / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = {"source": "hub", "hub": {"path": str(ds), "split": "train", "kind": "prompt_response",
                                    "prompt_field": "query", "response_field": "response"}}
    m = corpus.build_corpus(cfg, str(tmp_path / "c.jsonl"), str(tmp_path / "c.json"))
    assert m["documents"] == 20 and m["source"] == "hub"
    text = json.loads((tmp_path / "c.jsonl").read_text().splitlines()[3])["text"]
    assert "What is 3 + 3?" in text and "The answer is 6." in text


def test_hub_text_source_drops_empty_rows(tmp_path):
    ds = tmp_path / "wiki"
    ds.mkdir()
    (ds / "train.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in ["", " = Title = \n", "", "Body."]))
    m = corpus.build_corpus({"source": "hub", "hub": {"path": str(ds), "split": "train"}},
                            str(tmp_path / "w.jsonl"), str(tmp_path / "w.json"))
    assert m["documents"] == 2


def test_local_text_and_jsonl_sources(tmp_path):
    (tmp_path / "a.txt").write_text("first document\r\nline two  \n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "second"}) + "\n" + json.dumps({"text": "third"}) + "\n")
    cfg = {"source": "local", "local": {"paths": [str(tmp_path / "*.txt"), str(tmp_path / "*.jsonl")]}}
    m = corpus.build_corpus(cfg, str(tmp_path / "l.jsonl"), str(tmp_path / "l.json"))
    texts = list(corpus.read_texts(str(tmp_path / "l.jsonl")))
    assert m["documents"] == 3 and texts[0] == "first document\nline two"


def test_missing_local_file_names_the_pattern(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        corpus.build_corpus({"source": "local", "local": {"paths": ["nothing_here/*.txt"]}},
                            str(tmp_path / "x.jsonl"), str(tmp_path / "x.json"))


def test_bpe_tokenizer_has_the_configured_vocab_and_round_trips(token_data):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(token_data["tokenizer"])
    assert len(tok) == 512
    text = "def f(x):\n    return x + 1\n"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_hub_tokenizer_kind_loads_by_name(token_data, tmp_path):
    info = tokenizer.build_tokenizer({"kind": "hub", "name": token_data["tokenizer"]}, token_data["corpus"],
                                     str(tmp_path / "tok"))
    assert info["kind"] == "hub" and info["vocab_size"] == 512


def test_blocks_are_packed_split_by_document_and_independent_of_threads(token_data, tmp_path):
    m = json.loads(open(token_data["manifest"]).read())
    train = np.load(token_data["train"])
    assert train.shape == (m["train_blocks"], 64) and m["train_tokens"] == train.size
    assert m["val_documents"] > 0 and m["val_blocks"] > 0
    out = {k: str(tmp_path / f"{k}.npy") for k in ("train", "val")}
    tokenize_data.tokenize(token_data["corpus"], token_data["tokenizer"], 64, 0.1, 2, out["train"], out["val"],
                           str(tmp_path / "m.json"))
    assert np.array_equal(np.load(out["train"]), train)
    assert np.array_equal(np.load(out["val"]), np.load(token_data["val"]))


def test_split_documents_every_kth_to_validation():
    train, val = tokenize_data.split_documents([str(i) for i in range(10)], 0.2)
    assert val == ["4", "9"] and len(train) == 8


def test_chat_corpus_trains_on_the_answers_only(tmp_path):
    """MetaMathQA-shaped records as `chat`: rendered through the (ChatML) chat template, every token of the
    question and the template's framing stored as context (-(id + 1)), the answers and their end tokens trained;
    then a run on those blocks learns (its loss over the answers goes down)."""
    import subprocess
    import sys

    from conftest import REPO, launch_spec

    ds = tmp_path / "metamath"
    ds.mkdir()
    rows = [{"query": f"What is {i} plus {i + 1}?", "response": f"The answer is {2 * i + 1}."} for i in range(400)]
    (ds / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = {"source": "hub", "hub": {"path": str(ds), "split": "train", "kind": "chat", "system": "Solve it."}}
    corpus.build_corpus(cfg, str(tmp_path / "c.jsonl"), str(tmp_path / "c.json"))
    first = json.loads((tmp_path / "c.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    tokenizer.build_tokenizer({"kind": "bpe", "vocab_size": 400, "min_frequency": 1}, str(tmp_path / "c.jsonl"),
                              str(tmp_path / "tok"))
    m = tokenize_data.tokenize(str(tmp_path / "c.jsonl"), str(tmp_path / "tok"), 32, 0.1, 1,
                               str(tmp_path / "train.npy"), str(tmp_path / "val.npy"), str(tmp_path / "tokens.json"))
    assert m["loss_on"] == "response" and m["chat_template"].startswith("ChatML")
    stream = np.load(tmp_path / "train.npy").ravel()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    runs = np.split(stream, np.flatnonzero(np.diff(stream >= 0)) + 1)  # alternating context / trained runs
    trained = [tok.decode(r) for r in runs if r[0] >= 0]
    context = [tok.decode(-r - 1) for r in runs if r[0] < 0]
    assert all("What is" not in t for t in trained) and sum("The answer is" in t for t in trained) > 300
    assert sum("What is" in c and "Solve it." in c for c in context) > 300
    assert not any("The answer" in c for c in context)
    assert m["trained_token_fraction"] == pytest.approx((stream >= 0).mean())
    assert 0.05 < m["trained_token_fraction"] < 0.5

    data = {"train": str(tmp_path / "train.npy"), "val": str(tmp_path / "val.npy"),
            "manifest": str(tmp_path / "tokens.json")}
    spec = launch_spec(data, tmp_path, "sft", world_size=1,  # deterministic: torch has such kernels for every op
                       train={"max_steps": 12, "log_every": 3, "deterministic": True})
    subprocess.run([sys.executable, "-m", "workflow_scripts.job.launch", "--spec", str(spec)], cwd=REPO,
                   check=True, capture_output=True, timeout=600)
    summary = json.loads((tmp_path / "sft/out/summary.json").read_text())
    assert summary["final_loss"] < summary["initial_loss"] - 1.0


def test_damaged_token_files_stop_the_launcher_before_any_rank(token_data, tmp_path):
    """The manifest holds each file's SHA-256: equal-size garbage or a file cut in half is one error naming the file
    and the rule to rerun, and no rank starts (no metrics); the intact copy passes, its hash cached beside it."""
    import shutil

    from conftest import launch_spec

    from workflow_scripts.job import launch

    data = {k: str(tmp_path / f"{k}{'.json' if k == 'manifest' else '.npy'}") for k in ("train", "val", "manifest")}
    for k in data:
        shutil.copy(token_data[k], data[k])
    spec = json.loads(launch_spec(data, tmp_path, "damaged").read_text())
    assert launch.data_problems(spec) == [] and (tmp_path / "train.npy.sha256").exists()
    size = (tmp_path / "train.npy").stat().st_size
    with open(tmp_path / "train.npy", "r+b") as f:  # random token ids over the blocks, the header kept
        f.seek(128)
        f.write(np.random.default_rng(0).integers(0, 512, (size - 128) // 2, dtype=np.uint16).tobytes())
    assert (tmp_path / "train.npy").stat().st_size == size
    (problem,) = launch.data_problems(spec)
    assert problem.startswith(f"{tmp_path / 'train.npy'}: SHA-256 differs") and "--forcerun tokenize" in problem
    assert launch.launch(spec) == 1 and not (tmp_path / "damaged/out/metrics.csv").exists()
    with open(tmp_path / "val.npy", "r+b") as f:
        f.truncate((tmp_path / "val.npy").stat().st_size // 2)
    assert "the file was cut or replaced" in launch.data_problems(spec)[1]


def test_a_chat_record_masks_its_prompt_tokens_as_worked_by_hand(tmp_path):
    """A word-level tokenizer with its own chat template, two records: every token up to and including the
    template's `<assistant>` is context (-(id + 1)); the answer, the turn's `<end>` and the EOS are trained. Worked by
    hand: 8 context tokens and 3 trained per record, 16 masked labels of 22."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from workflow_scripts.training.strategies.engine import input_ids, targets

    words = ["<unk>", "<eos>", "<user>", "<assistant>", "<end>", "what", "is", "two", "plus", "four", "three", "six"]
    vocab = {w: i for i, w in enumerate(words)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <end> {% endfor %}"
                         "{% if add_generation_prompt %}<assistant> {% endif %}")
    tok.save_pretrained(tmp_path / "tok")
    chats = [("what is two plus two", "four"), ("what is three plus three", "six")]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps({"messages": [
        {"role": "user", "content": q}, {"role": "assistant", "content": a}]}) for q, a in chats))
    m = tokenize_data.tokenize(str(tmp_path / "c.jsonl"), str(tmp_path / "tok"), 11, 0.0, 1,
                               str(tmp_path / "train.npy"), str(tmp_path / "val.npy"), str(tmp_path / "m.json"))
    blocks = np.load(tmp_path / "train.npy")
    ctx = lambda *ids: [-i - 1 for i in ids]  # noqa: E731  (context tokens as stored)
    assert blocks.tolist() == [ctx(2, 5, 6, 7, 8, 7, 4, 3) + [9, 4, 1], ctx(2, 5, 6, 10, 8, 10, 4, 3) + [11, 4, 1]]
    labels = targets(torch.from_numpy(blocks))
    assert int((labels == -100).sum()) == 16 and labels[0, 8:].tolist() == [9, 4, 1]
    assert input_ids(torch.from_numpy(blocks))[1].tolist() == [2, 5, 6, 10, 8, 10, 4, 3, 11, 4, 1]
    assert m["trained_token_fraction"] == pytest.approx(6 / 22) and m["chat_template"] == "the tokenizer's own"
