"""A rerun resumes only a checkpoint of its own configuration: same settings -> it resumes and ends where an
uninterrupted run ends; a changed setting (the learning rate) -> the old checkpoint is set aside, not loaded, and
the run trains from step 0 under the new settings alone. The launcher is run directly (no Snakemake) on 2 CPU
ranks; a fault injected after the first checkpoint stands in for a kill."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO, launch_spec


def run_spec(token_data, tmp_path, name, work, **train):
    path = launch_spec(token_data, tmp_path, name)
    s = json.loads(path.read_text())
    s.update(world_size=2, work_dir=str(tmp_path / work))
    s["train"].update(max_steps=12, checkpoint_every=4, log_every=2, **train)
    path.write_text(json.dumps(s))
    return path


def launch(path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "workflow_scripts.training.launch", "--spec", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def summary_and_losses(tmp_path, name):
    out = tmp_path / name / "out"
    return json.loads((out / "summary.json").read_text()), pd.read_csv(out / "metrics.csv").loss.tolist()


def test_a_rerun_resumes_only_its_own_configuration(token_data, tmp_path):
    rc, log = launch(run_spec(token_data, tmp_path, "clean", "w_clean"))
    assert rc == 0, log
    clean, clean_losses = summary_and_losses(tmp_path, "clean")

    killed = run_spec(token_data, tmp_path, "same", "w_same", fault_injection={"oom_at_step": 6})
    rc, log = launch(killed)  # an `oom` row after the step-4 checkpoint
    assert (tmp_path / "w_same/ckpt/latest").exists(), log
    rc, log = launch(run_spec(token_data, tmp_path, "same", "w_same"))
    assert rc == 0 and "resume: resuming from step_00000004" in log, log
    same, same_losses = summary_and_losses(tmp_path, "same")
    assert same["resumed_from_step"] == 4
    assert same_losses == pytest.approx(clean_losses, abs=1e-6)

    rc, log = launch(run_spec(token_data, tmp_path, "changed", "w_changed", fault_injection={"oom_at_step": 6}))
    assert (tmp_path / "w_changed/ckpt/latest").exists(), log
    rc, log = launch(run_spec(token_data, tmp_path, "changed", "w_changed", lr=5e-4))
    assert rc == 0 and "not resuming step_00000004" in log, log
    changed, changed_losses = summary_and_losses(tmp_path, "changed")
    assert changed["resumed_from_step"] is None
    assert list(pd.read_csv(tmp_path / "changed/out/metrics.csv").step) == list(range(1, 13))
    assert pd.read_csv(tmp_path / "changed/out/metrics.csv").lr.max() == pytest.approx(5e-4)
    assert changed_losses[0] == pytest.approx(clean_losses[0], abs=1e-6)  # step 1's loss comes before any update
    assert changed_losses[-1] != pytest.approx(clean_losses[-1], abs=1e-6)
    assert any(p.name.startswith("ckpt.superseded-") for p in (tmp_path / "w_changed").iterdir())
