"""A rerun resumes only an intact checkpoint of its own configuration: same settings, the newest checkpoint damaged
-> it resumes the one before and ends where an uninterrupted run ends, bit for bit; a changed setting (the learning
rate) -> the old checkpoint is set aside, not loaded, and the run trains from step 0 under the new settings alone.
The launcher is run directly (no Snakemake) on 2 CPU ranks; a fault injected after a checkpoint stands in for a kill.
The choice among checkpoints on disk (checksums, the last two kept, what is set aside) is tested without ranks."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
from conftest import REPO, launch_spec

from workflow_scripts.training import checkpoint as ck

MODEL_FILE = "ckpt/mp_rank_00_model_states.pt"  # DeepSpeed's save_checkpoint(path, tag="ckpt")


def run_spec(token_data, tmp_path, name, work, **train):
    path = launch_spec(token_data, tmp_path, name)
    s = json.loads(path.read_text())
    s.update(world_size=2, work_dir=str(tmp_path / work), strategy="zero2")  # DeepSpeed's checkpoint format
    s["train"].update(max_steps=12, checkpoint_every=4, log_every=2, **train)
    path.write_text(json.dumps(s))
    return path


def launch(path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "workflow_scripts.job.launch", "--spec", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def summary_and_losses(tmp_path, name):
    out = tmp_path / name / "out"
    return json.loads((out / "summary.json").read_text()), pd.read_csv(out / "metrics.csv").loss.tolist()


def test_a_rerun_resumes_only_its_own_configuration(token_data, tmp_path):
    rc, log = launch(run_spec(token_data, tmp_path, "clean", "w_clean"))
    assert rc == 0, log
    clean, clean_losses = summary_and_losses(tmp_path, "clean")

    killed = run_spec(token_data, tmp_path, "same", "w_same", fault_injection={"oom_at_step": 10})
    rc, log = launch(killed)  # an `oom` row after the step-4 and step-8 checkpoints
    assert (tmp_path / "w_same/ckpt/latest").read_text() == "step_00000008", log
    # the changed run's leftover, as a run of these settings (lr 1e-3) killed after step 4 would leave it: this run's
    # step-4 checkpoint (its work folder is no setting of the resume hash: checkpoint.resume_hash)
    shutil.copytree(tmp_path / "w_same/ckpt/step_00000004", tmp_path / "w_changed/ckpt/step_00000004")
    (tmp_path / "w_changed/ckpt/latest").write_text("step_00000004")
    flip_bytes(tmp_path / "w_same/ckpt/step_00000008" / MODEL_FILE)  # damaged in place: same size, other bytes
    rc, log = launch(run_spec(token_data, tmp_path, "same", "w_same"))
    assert rc == 0 and "resume: resuming from step_00000004" in log and "step_00000008 damaged" in log, log
    same, same_losses = summary_and_losses(tmp_path, "same")
    assert same["resumed_from_step"] == 4
    assert same["checkpoint_fallback"] == (f"step_00000008 damaged (checksum mismatch in {MODEL_FILE}), resumed from "
                                           "step_00000004")
    assert same_losses == clean_losses and clean["checkpoint_fallback"] is None
    assert [p.name for p in (tmp_path / "w_same").glob("ckpt.damaged-*/*")] == ["step_00000008"]

    # an intact copy of the step-4 checkpoint the rerun above resumed under these settings
    assert ck.complete_checkpoints(tmp_path / "w_changed/ckpt") == [tmp_path / "w_changed/ckpt/step_00000004"]
    assert ck.damage(tmp_path / "w_changed/ckpt/step_00000004") is None
    rc, log = launch(run_spec(token_data, tmp_path, "changed", "w_changed", lr=5e-4))
    assert rc == 0 and "not resuming step_00000004" in log, log
    changed, changed_losses = summary_and_losses(tmp_path, "changed")
    assert changed["resumed_from_step"] is None
    assert list(pd.read_csv(tmp_path / "changed/out/metrics.csv").step) == list(range(1, 13))
    assert pd.read_csv(tmp_path / "changed/out/metrics.csv").lr.max() == pytest.approx(5e-4)
    assert changed_losses[0] == pytest.approx(clean_losses[0], abs=1e-6)  # step 1's loss comes before any update
    assert changed_losses[-1] != pytest.approx(clean_losses[-1], abs=1e-6)
    assert any(p.name.startswith("ckpt.superseded-") for p in (tmp_path / "w_changed").iterdir())


def flip_bytes(path, at=0.5, n=64):
    """Damage a file in place, as a bad disk or a torn copy might: n bytes inverted, the size unchanged."""
    with open(path, "r+b") as f:
        f.seek(int(path.stat().st_size * at))
        chunk = f.read(n)
        f.seek(-len(chunk), 1)
        f.write(bytes(b ^ 0xFF for b in chunk))


def fake_checkpoint(ckpt_dir, step, config_hash="h"):
    """What save_checkpoint leaves, without ranks: an engine file and state.json, published by rank 0's code."""
    tmp = ckpt_dir / f"{ck.step_name(step)}.tmp"
    (tmp / "shard").mkdir(parents=True)
    (tmp / "shard/model.pt").write_bytes(bytes(range(256)) * 8)
    (tmp / ck.STATE).write_text(json.dumps({"step": step, "rows": [], "config_hash": config_hash}))
    ck.publish(tmp, ckpt_dir / ck.step_name(step))


def test_checkpoints_on_disk_checksums_two_kept_and_fallback(tmp_path):
    ckpt = tmp_path / "ckpt"
    fake_checkpoint(ckpt, 4)
    (ckpt / "step_00000012.tmp").mkdir()  # a save killed half-way, before the rename
    fake_checkpoint(ckpt, 8)
    fake_checkpoint(ckpt, 12)
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_00000008", "step_00000012"]
    assert (ckpt / "latest").read_text() == "step_00000012" and ck.damage(ckpt / "step_00000012") is None

    flip_bytes(ckpt / "step_00000012/shard/model.pt")
    chosen = ck.choose_checkpoint(ckpt, "h")
    assert chosen["path"] == str(ckpt / "step_00000008") and chosen["state"]["step"] == 8
    assert chosen["fallback"] == ("step_00000012 damaged (checksum mismatch in shard/model.pt), resumed from "
                                  "step_00000008")
    assert (ckpt / "latest").read_text() == "step_00000008"
    assert [p.name for p in tmp_path.glob("ckpt.damaged-*/*")] == ["step_00000012"]

    (ckpt / "step_00000008/state.json").write_text("{}")  # all damaged: ckpt/ set aside whole, step 0
    chosen = ck.choose_checkpoint(ckpt, "h")
    assert chosen["path"] is None and "step_00000008 damaged (size mismatch in state.json)" in chosen["fallback"]
    assert list(ckpt.iterdir()) == [] and len(list(tmp_path.glob("ckpt.damaged-*/step_00000008"))) == 1

    fake_checkpoint(ckpt, 4, config_hash="other")  # another configuration: superseded, not damaged
    chosen = ck.choose_checkpoint(ckpt, "h")
    assert chosen["path"] is None and chosen["fallback"] is None and "not resuming step_00000004" in chosen["log"]
    assert (tmp_path / "ckpt.superseded-other/step_00000004").is_dir()


def test_a_full_disk_at_a_checkpoint_is_named_and_the_rerun_resumes(token_data, tmp_path):
    """The checkpoint after step 8 fails as a full disk's write on rank 0 (errno 28): the job's one line is rank 0's
    error naming the space, the path and the checkpoint kept, not rank 1's broken connection; the partial checkpoint
    is gone, and the rerun resumes from the step-4 checkpoint."""
    path = run_spec(token_data, tmp_path, "full", "w_full", fault_injection={"no_space_at_checkpoint_step": 8})
    log = tmp_path / "full.log"
    done = subprocess.run([sys.executable, "-m", "workflow_scripts.job.launch", "--spec", str(path), "--log", str(log)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    shown = done.stdout + done.stderr  # what Snakemake shows: the job's own lines
    assert done.returncode != 0, shown
    assert "rank 0 (the first to fail): NoSpaceError: [Errno 28] no space left for the checkpoint at step 8" in shown
    assert "step_00000008.tmp" in shown and "MiB free on its filesystem" in shown, shown
    assert "step_00000004 is intact" in shown and "Connection closed" not in shown, shown
    ckpt = tmp_path / "w_full/ckpt"
    assert not (ckpt / "step_00000008.tmp").exists() and (ckpt / "latest").read_text() == "step_00000004"
    rc, out = launch(run_spec(token_data, tmp_path, "full", "w_full"))
    assert rc == 0 and "resume: resuming from step_00000004" in out, out
    assert summary_and_losses(tmp_path, "full")[0]["resumed_from_step"] == 4


@pytest.fixture
def small_filesystem(tmp_path):
    """A 14 MiB tmpfs (root may mount one here; elsewhere the test is skipped): room for one checkpoint of the
    two-rank ZeRO-2 run below (about 9 MiB), not for two."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=14m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_really_full_filesystem_at_a_checkpoint_is_named(token_data, tmp_path, small_filesystem):
    """work_dir on a filesystem with room for the step-4 checkpoint only: the step-8 write fails in the library
    (torch.save's own error, or errno 28), and the job's one line says no space, the path and what is free."""
    path = run_spec(token_data, tmp_path, "small", "unused")
    s = json.loads(path.read_text())
    s["work_dir"] = str(small_filesystem / "work")
    path.write_text(json.dumps(s))
    done = subprocess.run([sys.executable, "-m", "workflow_scripts.job.launch", "--spec", str(path), "--log",
                           str(tmp_path / "small.log")], cwd=REPO, capture_output=True, text=True, timeout=600)
    shown = done.stdout + done.stderr
    assert done.returncode != 0, shown
    assert "NoSpaceError: [Errno 28] no space left for the checkpoint at step 8" in shown, shown
    assert "step_00000004 is intact" in shown, shown
    assert not (small_filesystem / "work/ckpt/step_00000008.tmp").exists()
