"""Prepared data a run reads (training/batches.py load_data): a manifest that is not JSON or lacks a key, a blocks file
that is missing, truncated, of floats or of another shape than its manifest says: one error naming the file (and the
line and column of the JSON), worked out here from what each test writes."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import by_hand

from workflow_scripts.training.batches import DataFileError, load_data


def prepared(tmp_path, train=None, val=None, manifest=None) -> dict:
    """train.npy (6 blocks of 8 ids), val.npy (2 blocks) and their manifest, each replaceable by the test's own."""
    np.save(tmp_path / "train.npy", np.arange(48, dtype=np.uint16).reshape(6, 8) if train is None else train)
    np.save(tmp_path / "val.npy", np.arange(16, dtype=np.uint16).reshape(2, 8) if val is None else val)
    text = json.dumps({"block_size": 8, "vocab_size": 64, "train_blocks": 6, "val_blocks": 2}) \
        if manifest is None else manifest
    (tmp_path / "tokens_manifest.json").write_text(text)
    return {k: str(tmp_path / f) for k, f in (("train", "train.npy"), ("val", "val.npy"),
                                                ("manifest", "tokens_manifest.json"))}


def problem(data: dict) -> str:
    with pytest.raises(DataFileError) as info:
        load_data(by_hand(data=data))
    return str(info.value)


def test_good_files_read_as_written(tmp_path):
    manifest, train, val, rows = load_data(by_hand(data=prepared(tmp_path)))
    assert train.shape == (6, 8) and val.shape == (2, 8) and manifest["vocab_size"] == 64
    assert rows == 64  # 64 ids padded to the schema's vocab_multiple of 64


def test_a_manifest_that_is_not_json_names_its_line_and_column(tmp_path):
    data = prepared(tmp_path, manifest='{"block_size": 8,\n  "vocab_size": }')
    said = problem(data)
    assert said.startswith(f"{data['manifest']}: not JSON (line 2, column 17")


def test_a_manifest_without_a_key_names_it(tmp_path):
    data = prepared(tmp_path, manifest=json.dumps({"block_size": 8, "vocab_size": 64}))
    assert problem(data).startswith(f"{data['manifest']}: no train_blocks, val_blocks")


def test_a_missing_or_truncated_blocks_file_is_named(tmp_path):
    data = prepared(tmp_path)
    (tmp_path / "val.npy").unlink()
    assert problem(data).startswith(f"{data['val']}: missing")
    data = prepared(tmp_path)
    whole = (tmp_path / "train.npy").read_bytes()
    (tmp_path / "train.npy").write_bytes(whole[:100])  # the header (128 bytes) cut short
    assert problem(data).startswith(f"{data['train']}: not a NumPy array file")


@pytest.mark.parametrize("train, said", [
    (np.arange(40, dtype=np.uint16).reshape(5, 8), "uint16 array of shape (5, 8)"),  # a block short
    (np.arange(48, dtype=np.uint16).reshape(4, 12), "uint16 array of shape (4, 12)"),  # another block size
    (np.zeros((6, 8), dtype=np.float32), "float32 array of shape (6, 8)"),  # not token ids
])
def test_blocks_unlike_their_manifest_name_both_files(tmp_path, train, said):
    data = prepared(tmp_path, train=train)
    assert problem(data) == (f"{data['train']}: {said}, {data['manifest']} says 6 rows of 8 integers (a file of "
                             "another data preparation: prepare the data again)")


def test_a_committed_set_whose_run_spec_cannot_be_read_is_named_before_any_job(tmp_path):
    """verify.against: an ok run whose run_spec.json is not JSON, and one whose spec lacks a train key no migration
    gives: one line each, naming the file (replay.problems, called by the config check)."""
    from workflow_scripts import replay

    (tmp_path / "tables").mkdir()
    (tmp_path / "tables/runs.csv").write_text("model,strategy,layout,world_size,repeat,status\n"
                                              "gpt2-tiny,ddp,ws1,1,0,ok\ngpt2-tiny,zero1,ws1,1,0,ok\n")
    for strategy in ("ddp", "zero1"):
        (tmp_path / f"runs/gpt2-tiny/{strategy}/ws1/r0").mkdir(parents=True)
    ddp = tmp_path / "runs/gpt2-tiny/ddp/ws1/r0/run_spec.json"
    ddp.write_text('{"schema_version": 2,')
    spec = by_hand(strategy="zero1").to_dict()
    del spec["train"]["lr"]
    zero1 = tmp_path / "runs/gpt2-tiny/zero1/ws1/r0/run_spec.json"
    zero1.write_text(json.dumps(spec))
    found = replay.problems(str(tmp_path))
    assert len(found) == 2
    assert found[0].startswith(f"verify.against: {ddp}: not JSON (line 1, column 22"), found
    assert found[1] == f"verify.against: {zero1}: train.lr missing (a key added without a migration in " \
                       "run_spec.MIGRATIONS)"
