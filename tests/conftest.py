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
pytest_plugins = ["slurm_cluster"]  # its cluster and study start with the session where a test needs them
SKIP = {".git", ".snakemake", "work", "results", ".pytest_cache", "__pycache__", ".whl", ".deb", "images", "out",
        ".cache", ".build"}


def pytest_addoption(parser):
    parser.addoption("--image", action="store_true",
                     help="also run tests/test_image.py: build the CPU image with podman and run the study in it")
    parser.addoption("--image-cuda", action="store_true",
                     help="also build the CUDA image (GBs, ~1 h on 2 cores) and check it: tests/test_image.py -k cuda")


# fixtures whose tests train through torchrun or run a study: such a test is `slow` (the fast tier,
# `pytest -m "not slow"`, leaves it out); SLOW_TESTS: tests that do so without one of them, or that take several
# seconds of Snakemake runs or training in the test's own process
SLOW_FIXTURES = {"default_study", "token_data", "slurm_cluster", "slurm_study",
                 "cuda_profile_run"}  # a reduced study through the GPU profile in the stand-in image
SLOW_TESTS = {"test_every_job_runs_in_the_platform_image_with_the_profiles_flags",  # a study in the fake image
              "test_zero_gradient_norm_in_multi_tensor_launches_is_deepspeeds_on_every_rank",  # torchrun, 2 ranks
              "test_the_plan_target_of_a_gpu_study_marks_the_compiled_cells",  # snakemake plan
              "test_a_missing_image_is_one_error_before_any_job",  # snakemake runs
              "test_gpu_platform_jobs_get_their_image_and_device_flags",  # snakemake dry runs
              "test_chat_corpus_trains_on_the_answers_only",  # trains
              "test_a_dry_run_plans_the_runs_of_a_local_directory",  # snakemake -n
              "test_the_imported_study_plans_under_a_dry_run",  # snakemake -n
              "test_a_study_imported_from_one_yaml_per_variant_trains_into_one_table",  # a study
              "test_selective_checkpointing_recomputes_no_matmul_and_changes_no_gradient"}  # backward passes


def pytest_configure(config):
    config.addinivalue_line("markers", "image: builds the CPU image and runs jobs in it (needs --image)")
    config.addinivalue_line("markers", "slow: trains through torchrun or runs a study (the fast tier: "
                                       "python3 -m pytest -q -m 'not slow')")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or item.originalname in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    if config.getoption("--image"):
        return
    skip = pytest.mark.skip(reason="builds the CPU image (~3 min) and runs the default study in it (~8 min): "
                                   "python3 -m pytest -q --image tests/test_image.py")
    for item in items:
        if "image" in item.keywords:
            item.add_marker(skip)


def copy_workflow(dest: Path) -> Path:
    """The workflow as a fresh clone would have it (no results, no work data)."""
    shutil.copytree(REPO, dest, ignore=lambda d, names: [n for n in names if n in SKIP])
    (dest / "results").mkdir(exist_ok=True)
    return dest


def snakemake_command(*args, env=None, report=False) -> tuple[list[str], dict]:
    """The command and environment of a Snakemake run; the HTML report after success (about 4 s) only where a test
    reads it (`report`)."""
    no_report = {} if report else {"PIPELINE_NO_REPORT": "1"}
    return [sys.executable, "-m", "snakemake", "--cores", "all", *args], {**os.environ, **no_report, **(env or {})}


def snakemake(workdir: Path, *args, check=True, env=None, timeout=1500, report=False) -> subprocess.CompletedProcess:
    """Snakemake in workdir, to its end."""
    cmd, full_env = snakemake_command(*args, env=env, report=report)
    done = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=full_env)
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
def short_documents(token_data, tmp_path_factory) -> dict:
    """token_data's texts cut into documents of 8 lines (tens of tokens each), tokenised by its tokenizer into
    64-token blocks: most blocks hold a document boundary (an EOS), for runs that keep documents apart."""
    d = tmp_path_factory.mktemp("short_documents")
    with open(token_data["corpus"]) as f, open(d / "corpus.jsonl", "w") as out:
        for record in map(json.loads, f):
            lines = record["text"].splitlines()
            for i in range(0, len(lines), 8):
                if "".join(lines[i:i + 8]).strip():
                    out.write(json.dumps({"text": "\n".join(lines[i:i + 8])}) + "\n")
    run(["workflow_scripts.data.tokenize", "--corpus", str(d / "corpus.jsonl"), "--tokenizer", token_data["tokenizer"],
         "--block-size", "64", "--val-fraction", "0.1", "--threads", "1", "--train", str(d / "train.npy"),
         "--val", str(d / "val.npy"), "--manifest", str(d / "tokens.json")])
    return {"train": str(d / "train.npy"), "val": str(d / "val.npy"), "manifest": str(d / "tokens.json")}


def boundaries(data: dict) -> float:
    """The share of training blocks that hold a document boundary (an EOS not at the block's end)."""
    import numpy as np

    eos = json.loads(Path(data["manifest"]).read_text())["eos_id"]
    return float((np.load(data["train"])[:, :-1] == eos).any(axis=1).mean())


@pytest.fixture(scope="session")
def default_study(tmp_path_factory) -> Path:
    """The shipped default study (config.yaml), run once with `snakemake --cores all` in a fresh copy."""
    wd = copy_workflow(tmp_path_factory.mktemp("study") / "wf")
    snakemake(wd, report=True)
    return wd


def reuse_calibration(wd: Path, results_dir: str) -> None:
    """The default study's data manifests and calibration (this machine, this session) copied, times kept, into the
    results of another study in its folder with the default data settings: that study's training waits for no
    data_manifests and calibrate jobs of its own (a calibrate job always follows a data_manifests job it waits for).
    For studies whose tests assert nothing about either; rule calibrate is checked in the default study
    (test_provenance.py), the manifests' copy by test_outputs.py."""
    for part in ("data", "calibration"):
        shutil.copytree(wd / "results/default" / part, wd / results_dir / part)


def launch_spec(token_data, tmp_path, name, nodes=1, **top) -> Path:
    """A run spec for workflow_scripts.job.launch (gpt2-tiny, ddp, 4 CPU ranks, 8 steps unless overridden by
    `top`), written to tmp_path/<name>.json; results go to tmp_path/<name>/out."""
    # what these runs set; every other train key is the schema's default (study.from_request fills them: a spec
    # without a schema_version)
    train = {"micro_batch_size": 4, "max_steps": 8, "lr_warmup_steps": 2, "seed": 7, "timing_warmup_steps": 1,
             "log_every": 4, "eval_batches": 2}
    train.update(top.pop("train", {}))
    s = {"run_id": name, "study": "tests", "model": "gpt2-tiny", "strategy": "ddp", "world_size": 4,
         "repeat": 0, "nodes": nodes, "platform": "cpu", "precision": "fp32", "train": train, "options": {},
         "sampler": {"backend": "host", "interval_s": 0.1}, "ops": [], "data": {k: token_data[k] for k in
                                                                                ("train", "val", "manifest")},
         "torch_extensions_dir": str(tmp_path / "ext"), "out_dir": str(tmp_path / name / "out"),
         "work_dir": str(tmp_path / name / "work"), **top}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(s))
    return path


def by_hand(**fields):
    """A run spec made by hand for a test of one of its readers (study.from_request: a one-rank CPU run of gpt2-tiny
    under ddp in fp32, every key `fields` leave out the schema's default)."""
    from workflow_scripts import study

    base = {"run_id": "by-hand", "study": "tests", "model": "gpt2-tiny", "strategy": "ddp", "world_size": 1,
            "repeat": 0, "platform": "cpu", "precision": "fp32", "data": {}, "out_dir": "out", "work_dir": "work"}
    return study.from_request({**base, **fields})


_LAYOUT_RUNS: dict = {}  # (model, strategy, layout, train) -> (summary, losses): reference runs shared by tests


def run_layout(token_data, tmp_path, name, model, strategy, layout, **train) -> tuple[dict, list[float]]:
    """One run of `layout` through the launcher; its summary and per-step losses (a run already made in this
    session with the same settings is not repeated)."""
    import pandas as pd

    key = (token_data["train"], model, strategy, json.dumps(layout, sort_keys=True), json.dumps(train, sort_keys=True))
    if key in _LAYOUT_RUNS:
        return _LAYOUT_RUNS[key]
    from workflow_scripts.training.layout import Layout

    world = Layout(**layout).world_size
    path = launch_spec(token_data, tmp_path, name, model=model, strategy=strategy, layout=layout, world_size=world,
                       train={"grad_accum": 2, "max_steps": 6, **train})
    done = subprocess.run([sys.executable, "-m", "workflow_scripts.job.launch", "--spec", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / name / "out"
    _LAYOUT_RUNS[key] = json.loads((out / "summary.json").read_text()), pd.read_csv(out / "metrics.csv").loss.tolist()
    return _LAYOUT_RUNS[key]


def overlay(wd: Path, name: str, **cfg) -> list[str]:
    """--configfile arguments: config.yaml, then an overlay written from keyword arguments."""
    import yaml

    path = wd / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return ["--configfile", "config.yaml", path.name]


LOSS_BOUND = 1e-4


def assert_default_study_losses(runs, steps) -> None:
    """Every strategy's per-step and validation losses equal those recorded for the default study
    (tests/expected/default_study_losses.json); runs is indexed by strategy. Bit for bit on the machine that
    recorded them; another CPU model takes other float32 kernel paths (seen: 5e-7 on every strategy, 6e-6 with
    bf16-compressed communication, the recorded commit itself included), so the bound is 1e-4 -- far below what any
    change to the training would move (1e-3 and up)."""
    expected = json.loads((REPO / "tests/expected/default_study_losses.json").read_text())["runs"]
    assert sorted(expected) == sorted(runs.index)
    for name, want in expected.items():
        assert runs.loc[name, "status"] == want["status"], (name, runs.loc[name, "reason"])
        if want["status"] != "ok":
            continue
        got = steps[steps.strategy == name].sort_values("step").loss.tolist()
        assert got == pytest.approx(want["loss"], rel=0, abs=LOSS_BOUND), name
        assert runs.loc[name, "val_loss_initial"] == pytest.approx(want["val_loss_initial"], rel=0, abs=LOSS_BOUND)
        assert runs.loc[name, "val_loss_final"] == pytest.approx(want["val_loss_final"], rel=0, abs=LOSS_BOUND)
