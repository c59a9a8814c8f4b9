"""The multi-node launch path on one host: two launchers ("nodes") with a c10d rendezvous give world size 4 and
the same losses as a single-node run of 4 ranks."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec(token_data, tmp_path, name, nodes):
    train = {"micro_batch_size": 4, "grad_accum": 1, "epochs": 1, "max_steps": 8, "max_train_samples": None,
             "lr": 1e-3, "min_lr": 1e-4, "lr_warmup_steps": 2, "weight_decay": 0.1, "betas": [0.9, 0.95],
             "eps": 1e-8, "grad_clip": 1.0, "seed": 7, "timing_warmup_steps": 1, "log_every": 4, "eval_batches": 2,
             "checkpoint_every": 0, "gradient_checkpointing": False, "vocab_multiple": 64,
             "attn_implementation": "sdpa", "threads_per_rank": 1, "fault_injection": {}}
    s = {"run_id": name, "study": "multinode", "model": "gpt2-tiny", "strategy": "ddp", "world_size": 4,
         "repeat": 0, "nodes": nodes, "platform": "cpu", "precision": "fp32", "train": train, "options": {},
         "sampler": {"backend": "host", "interval_s": 0.1}, "ops": [], "data": {k: token_data[k] for k in
                                                                                ("train", "val", "manifest")},
         "torch_extensions_dir": str(tmp_path / "ext"), "out_dir": str(tmp_path / name / "out"),
         "work_dir": str(tmp_path / name / "work")}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(s))
    return path


def launch(path, *extra):
    return subprocess.Popen([sys.executable, "-m", "workflow_scripts.training.launch", "--spec", str(path), *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_nodes_on_one_host_match_one_node(token_data, tmp_path):
    single = launch(spec(token_data, tmp_path, "single", 1))
    assert single.wait(timeout=600) == 0, single.stdout.read()

    endpoint = f"127.0.0.1:{free_port()}"
    two = spec(token_data, tmp_path, "two", 2)
    agents = [launch(two, "--nnodes", "2", "--node-rank", str(k), "--rdzv-endpoint", endpoint) for k in (0, 1)]
    for agent in agents:
        assert agent.wait(timeout=600) == 0, agent.stdout.read()

    one = json.loads((tmp_path / "single/out/summary.json").read_text())
    both = json.loads((tmp_path / "two/out/summary.json").read_text())
    assert both["status"] == "ok" and both["world_size"] == 4 == one["world_size"]
    a = pd.read_csv(tmp_path / "single/out/metrics.csv").loss
    b = pd.read_csv(tmp_path / "two/out/metrics.csv").loss
    assert b.tolist() == pytest.approx(a.tolist(), abs=1e-5)
    assert (tmp_path / "two/out/vram_node1.csv").exists(), "the second node samples its own processes"
