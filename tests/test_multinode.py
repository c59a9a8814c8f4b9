"""The multi-node launch path on one host: two launchers ("nodes") with a c10d rendezvous give world size 4 and
the same losses as a single-node run of 4 ranks."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pandas as pd
import pytest
from conftest import REPO, launch_spec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec(token_data, tmp_path, name, nodes):
    return launch_spec(token_data, tmp_path, name, nodes, study="multinode")


def launch(path, *extra):
    return subprocess.Popen([sys.executable, "-m", "workflow_scripts.job.launch", "--spec", str(path), *extra],
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
