"""Bad local corpus files (corpus.source: local): one error naming the file, the line (1-based) or byte offset and the
config key, every problem of every file together, before anything is written. The expected lines, offsets and
columns are worked out here from the bytes each test writes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workflow_scripts.data import corpus

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A data/ folder in a fresh working directory: the config's paths are relative, as in a study."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


def build(local: dict, out: Path) -> dict:
    return corpus.build_corpus({"source": "local", "local": local}, str(out / "corpus.jsonl"),
                               str(out / "corpus_manifest.json"))


def error(local: dict, tmp_path: Path) -> str:
    out = tmp_path / "out"
    with pytest.raises(ValueError) as info:
        build(local, out)
    assert isinstance(info.value, corpus.CorpusError)
    assert not out.exists(), "nothing is written when the input is bad"
    return str(info.value)


def test_text_file_not_utf8_names_the_file_and_byte_offset(data, tmp_path):
    head = "Grüße, ".encode() + b"plain ascii text"  # ü and ß are two bytes each
    (data / "b.txt").write_bytes(head + b"\xff and the rest\n")
    msg = error({"paths": ["data/b.txt"]}, tmp_path)
    assert len(head) == 25
    assert msg == "corpus.local: data/b.txt: not UTF-8 at byte offset 25 (0xff)"


def test_jsonl_not_utf8_names_the_line_and_the_offset_in_the_file(data, tmp_path):
    lines = [json.dumps({"text": "one"}).encode(), b"", json.dumps({"text": "two"}).encode(), b'{"text": "caf\xe9"}']
    (data / "a.jsonl").write_bytes(b"\r\n".join(lines) + b"\r\n")
    offset = len(b"\r\n".join(lines[:3])) + 2 + len(b'{"text": "caf')
    msg = error({"paths": ["data/a.jsonl"]}, tmp_path)
    assert msg == f"corpus.local: data/a.jsonl line 4: not UTF-8 at byte offset {offset} (0xe9)"


def test_malformed_json_line_names_the_line_and_column(data, tmp_path):
    lines = [json.dumps({"text": f"document {i}"}) for i in range(1, 42)]
    bad = '{"text": "document 42", "source" "web"}'  # no colon after "source"
    lines += [bad, json.dumps({"text": "document 43"})]
    (data / "a.jsonl").write_text("\n".join(lines) + "\n")
    column = bad.index('"source"') + len('"source"') + 2  # 1-based column of the "web" where the colon should be
    msg = error({"paths": ["data/a.jsonl"]}, tmp_path)
    assert msg == f"corpus.local: data/a.jsonl line 42: not JSON (Expecting ':' delimiter: column {column})"


def test_blank_lines_count_in_line_numbers(data, tmp_path):
    """Line numbers are the file's lines, blank ones and CRLF endings included (as the ids of good records)."""
    (data / "a.jsonl").write_bytes(b'{"text": "one"}\r\n\r\n   \r\n{"text": "two"}\r\n{"text": }\r\n')
    msg = error({"paths": ["data/a.jsonl"]}, tmp_path)
    assert "data/a.jsonl line 5: not JSON (Expecting value: column 10)" in msg
    (data / "a.jsonl").write_bytes(b'{"text": "one"}\r\n\r\n   \r\n{"text": "two"}\r\n')
    build({"paths": ["data/a.jsonl"]}, tmp_path / "good")
    ids = [json.loads(line)["id"] for line in (tmp_path / "good/corpus.jsonl").read_text().splitlines()]
    assert ids == ["./data/a.jsonl:1", "./data/a.jsonl:4"]


def test_record_without_the_text_field_names_the_field_and_the_key(data, tmp_path):
    rows = [{"text": f"doc {i}"} for i in range(1, 7)] + [{"prompt": "Why?", "response": "Because."}]
    (data / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    msg = error({"paths": ["data/a.jsonl"]}, tmp_path)
    assert msg == ("corpus.local: data/a.jsonl line 7: no field 'text' (the record has: prompt, response; "
                   "corpus.local.text_field)")


def test_a_wrong_text_field_on_every_line_is_one_line(data, tmp_path):
    (data / "a.jsonl").write_text("".join(json.dumps({"body": f"doc {i}"}) + "\n" for i in range(9)))
    msg = error({"paths": ["data/a.jsonl"], "text_field": "content"}, tmp_path)
    assert msg == ("corpus.local: data/a.jsonl line 1: no field 'content' (the record has: body; "
                   "corpus.local.text_field) (also lines 2, 3, 4, 5, 6 and 3 more)")


@pytest.mark.parametrize("kind", ["prompt_response", "chat"])
def test_prompt_and_response_fields_are_checked(kind, data, tmp_path):
    rows = [{"question": "1 + 1?", "answer": "2"},
            {"question": "2 + 2?"},                     # line 2: no answer
            {"q": "3 + 3?", "answer": "6"},             # line 3: no question
            {"question": "4 + 4?", "answer": None},     # line 4: null answer
            ["4", "4"]]                                 # line 5: not an object
    (data / "qa.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    msg = error({"paths": ["data/qa.jsonl"], "kind": kind, "prompt_field": "question", "response_field": "answer"},
                tmp_path)
    want = "a string" if kind == "chat" else "a string or a number"
    assert msg.splitlines()[1:] == [
        "  corpus.local: data/qa.jsonl line 2: no field 'answer' (the record has: question; "
        "corpus.local.response_field)",
        "  corpus.local: data/qa.jsonl line 3: no field 'question' (the record has: q, answer; "
        "corpus.local.prompt_field)",
        f"  corpus.local: data/qa.jsonl line 4: field 'answer' is null, not {want} (corpus.local.response_field)",
        "  corpus.local: data/qa.jsonl line 5: an array, not a JSON object"]


def test_default_fields_of_the_pair_kinds(data, tmp_path):
    (data / "qa.txt").write_text(json.dumps({"prompt": "p", "completion": "c"}) + "\n")  # read as JSONL by kind
    msg = error({"paths": ["data/qa.txt"], "kind": "chat"}, tmp_path)
    assert msg == ("corpus.local: data/qa.txt line 1: no fields 'query', 'response' (the record has: prompt, "
                   "completion; corpus.local.prompt_field, corpus.local.response_field)")


def test_empty_file_beside_a_good_one_is_an_error(data, tmp_path):
    (data / "good.txt").write_text("a good document\n")
    (data / "empty.txt").write_bytes(b"")
    (data / "blank.txt").write_text(" \n\t\n")
    (data / "empty.jsonl").write_bytes(b"")
    msg = error({"paths": ["data/*.txt", "data/*.jsonl"]}, tmp_path)
    assert msg.splitlines()[1:] == ["  corpus.local: data/blank.txt is empty (whitespace only)",
                                    "  corpus.local: data/empty.txt is empty",
                                    "  corpus.local: data/empty.jsonl is empty"]


def test_glob_that_matches_nothing(data, tmp_path):
    (data / "a.txt").write_text("text\n")
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError) as info:
        build({"paths": ["data/*.txt", "data/*.md"]}, out)
    assert isinstance(info.value, corpus.CorpusError)
    assert str(info.value) == "corpus.local.paths: no file matches 'data/*.md'"
    assert not out.exists()


def test_every_problem_of_every_file_in_one_error_from_the_stage(data, tmp_path):
    """The stage as its rule runs it (rules/corpus.smk): exit 1, the log has every problem and no traceback, and no
    output exists."""
    (data / "good.txt").write_text("fine\n")
    (data / "empty.txt").write_bytes(b"")
    (data / "b.txt").write_bytes(b"0123456789" + b"\xc3\x28")  # \xc3 starts a 2-byte sequence, ( does not continue
    trailing_comma = '{"text": "ok", }'
    (data / "a.jsonl").write_text('{"text": "ok"}\n' + trailing_comma + '\n{"body": "x"}\n')
    params = json.dumps({"source": "local", "local": {"paths": ["data/*.txt", "data/a.jsonl", "data/*.md"]},
                         "max_bytes": 3000000, "max_documents": None}, sort_keys=True)
    out, log = tmp_path / "d", tmp_path / "d/logs/corpus.log"
    log.parent.mkdir(parents=True)
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "workflow_scripts.data.corpus", "--params", params,
                             "--jsonl", str(out / "corpus.jsonl"), "--manifest", str(out / "corpus_manifest.json")],
                            stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).returncode
    text = log.read_text()
    assert rc == 1 and "Traceback" not in text, text
    assert text.splitlines() == [
        "corpus failed (exit code 1): corpus: 5 problems in the local corpus files, nothing written:",
        "  corpus.local.paths: no file matches 'data/*.md'",
        "  corpus.local: data/b.txt: not UTF-8 at byte offset 10 (0xc3)",
        "  corpus.local: data/empty.txt is empty",
        "  corpus.local: data/a.jsonl line 2: not JSON (Expecting property name enclosed in double quotes: "
        f"column {trailing_comma.index('}') + 1})",
        "  corpus.local: data/a.jsonl line 3: no field 'text' (the record has: body; corpus.local.text_field)"]
    assert not (out / "corpus.jsonl").exists() and not (out / "corpus_manifest.json").exists()


def test_hub_records_without_the_configured_field(tmp_path):
    ds = tmp_path / "qa"
    ds.mkdir()
    (ds / "train.jsonl").write_text(json.dumps({"question": "q", "response": "r"}) + "\n")
    with pytest.raises(corpus.CorpusError) as info:
        corpus.build_corpus({"source": "hub", "hub": {"path": str(ds), "split": "train", "kind": "chat"}},
                            str(tmp_path / "c.jsonl"), str(tmp_path / "c.json"))
    assert str(info.value) == (f"corpus.hub: {ds}: no field 'query' (its records have: question, response; "
                               "corpus.hub.prompt_field)")
