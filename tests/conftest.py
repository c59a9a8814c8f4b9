"""Shared fixtures: a small token dataset, a copy of the workflow in a temporary directory, the default study run
once end to end (module tests assert on its tables)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP = {".git", ".snakemake", "work", "results", ".pytest_cache", "__pycache__", ".whl", ".deb", "images", "out"}


def copy_workflow(dest: Path) -> Path:
    """The workflow as a fresh clone would have it (no results, no work data)."""
    shutil.copytree(REPO, dest, ignore=lambda d, names: [n for n in names if n in SKIP])
    (dest / "results").mkdir(exist_ok=True)
    return dest


def snakemake(workdir: Path, *args, check=True, env=None, timeout=1500) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "all", *args]
    done = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n"
                             f"{done.stderr[-6000:]}")
    return done


def run(cmd, cwd=REPO, **kw):
    return subprocess.run([sys.executable, "-m", *cmd], cwd=cwd, check=True, capture_output=True, text=True, **kw)


@pytest.fixture(scope="session")
def token_data(tmp_path_factory) -> dict:
    """A small stdlib corpus, a 512-token BPE and 64-token blocks, built with the stage modules."""
    d = tmp_path_factory.mktemp("tokens")
    run(["workflow_scripts.data.corpus", "--params", json.dumps({"source": "stdlib", "max_bytes": 400_000}),
         "--jsonl", str(d / "corpus.jsonl"), "--manifest", str(d / "corpus.json")])
    run(["workflow_scripts.data.tokenizer", "--params", json.dumps({"kind": "bpe", "vocab_size": 512}),
         "--corpus", str(d / "corpus.jsonl"), "--out", str(d / "tok")])
    run(["workflow_scripts.data.tokenize", "--corpus", str(d / "corpus.jsonl"), "--tokenizer", str(d / "tok"),
         "--block-size", "64", "--val-fraction", "0.1", "--threads", "1", "--train", str(d / "train.npy"),
         "--val", str(d / "val.npy"), "--manifest", str(d / "tokens.json")])
    return {"dir": d, "train": str(d / "train.npy"), "val": str(d / "val.npy"), "manifest": str(d / "tokens.json"),
            "tokenizer": str(d / "tok"), "corpus": str(d / "corpus.jsonl")}


@pytest.fixture(scope="session")
def default_study(tmp_path_factory) -> Path:
    """The shipped default study (config.yaml), run once with `snakemake --cores all` in a fresh copy."""
    wd = copy_workflow(tmp_path_factory.mktemp("study") / "wf")
    snakemake(wd)
    return wd


def overlay(wd: Path, name: str, **cfg) -> list[str]:
    """--configfile arguments: config.yaml, then an overlay written from keyword arguments."""
    import yaml

    path = wd / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return ["--configfile", "config.yaml", path.name]
