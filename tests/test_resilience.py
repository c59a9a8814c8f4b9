"""Failure paths: a training job stopped by SIGTERM or killed with SIGKILL resumes from its checkpoint when
Snakemake reruns it (the losses of an uninterrupted run); an out-of-memory run becomes an `oom` row while the study
completes; a workflow whose starting shell exits keeps its jobs."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest
from conftest import REPO, overlay, reuse_calibration, snakemake


def test_sigterm_to_the_workflow_stops_at_a_step_boundary_and_the_rerun_resumes(default_study):
    """`kill PID` of Snakemake (SIGTERM to it alone), sent from rank 0 before step 12 by fault injection rather
    than by racing a poll: Snakemake starts nothing new and passes the signal to the running launcher, the ranks
    agree on a step boundary, save a checkpoint there and leave; the invocation fails with the step named, nothing
    of the run is left, and `--rerun-incomplete` resumes from that checkpoint with the losses of the default
    study's uninterrupted FSDP run (the same training: the hook is not a training setting)."""
    wd = default_study
    args = overlay(wd, "sigterm", results_dir="results/sigterm", work_dir="work/sigterm", strategies=["fsdp"],
                   train={"fault_injection": {"sigterm_workflow_at_step": 12}})
    reuse_calibration(wd, "results/sigterm")
    target = "results/sigterm/tables/runs.csv"
    first = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "all", target, *args], cwd=wd,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode != 0, (first.stdout + first.stderr)[-3000:]
    assert "Will exit after finishing currently running jobs" in first.stdout + first.stderr
    job_log = (wd / "results/sigterm/logs/train/gpt2-tiny/fsdp/ws2/r0.log").read_text()
    stopped_at = int(re.search(r"stopped by SIGTERM after step (\d+), checkpoint saved", job_log).group(1))
    assert 12 <= stopped_at < 40
    assert not processes_of("results/sigterm"), "a process of the run outlived the job"

    snakemake(wd, target, "--rerun-incomplete", *args)
    runs = pd.read_csv(wd / target)
    resumed = pd.read_csv(wd / "results/sigterm/tables/steps.csv")
    assert runs.loc[0, "status"] == "ok" and runs.loc[0, "resumed_from_step"] == stopped_at
    assert list(resumed.step) == list(range(1, 41))
    assert resumed.loss.tolist() == pytest.approx(default_losses(wd, "fsdp").loss.tolist(), abs=1e-6)


def default_losses(wd, strategy: str) -> pd.DataFrame:
    """The strategy's per-step losses in the default study (config.yaml: 40 steps, a checkpoint at step 20)."""
    steps = pd.read_csv(wd / "results/default/tables/steps.csv")
    expected = steps[steps.strategy == strategy]
    assert list(expected.step) == list(range(1, 41))
    return expected


def ranks_of(marker: str) -> list:
    return [p for p in psutil.process_iter(["cmdline"])
            if "workflow_scripts.training.loop" in " ".join(p.info["cmdline"] or []) and marker in
            " ".join(p.info["cmdline"] or [])]


def processes_of(marker: str) -> list:
    """Every process of a run: the job's shell, launcher, torchrun, ranks and sampler name its results_dir."""
    return [p for p in psutil.process_iter(["cmdline"]) if p.pid != os.getpid()
            and marker in " ".join(p.info["cmdline"] or []) and "snakemake" not in (p.info["cmdline"] or [""])[-1]]


def test_killing_the_workflow_leaves_no_rank_and_the_readme_rerun_resumes(default_study):
    """As a batch system, the OOM killer or a closed terminal stops a run: SIGKILL to the Snakemake process
    alone. Within 10 s no process of the run is left (the launcher watches its ancestry and takes torchrun, the
    ranks and the sampler with it); README's rerun (`--unlock`, then `--rerun-incomplete`) resumes from the
    checkpoint with the losses of the default study's uninterrupted DDP run (the same training)."""
    wd, work = default_study, "work/orphans"
    args = overlay(wd, "orphans", results_dir="results/orphans", work_dir=work, strategies=["ddp"])
    reuse_calibration(wd, "results/orphans")
    sm = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "all", *args], cwd=wd,
                          start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = wd / work / "runs/gpt2-tiny/ddp/ws2/r0/ckpt/latest"
    deadline = time.time() + 300
    while not latest.exists() and time.time() < deadline and sm.poll() is None:
        time.sleep(0.05)
    assert latest.exists() and ranks_of("results/orphans"), "training did not start"
    os.kill(sm.pid, signal.SIGKILL)
    sm.wait(timeout=30)
    deadline = time.time() + 10
    while processes_of("results/orphans") and time.time() < deadline:
        time.sleep(0.2)
    left = [" ".join(p.info["cmdline"])[:120] for p in processes_of("results/orphans")]
    assert not left, f"outlived the workflow: {left}"
    checkpoint = latest.read_text()
    time.sleep(2)
    assert latest.read_text() == checkpoint, "something still writes checkpoints"

    snakemake(wd, "--unlock", *args)
    snakemake(wd, "--rerun-incomplete", *args)
    runs = pd.read_csv(wd / "results/orphans/tables/runs.csv")
    steps = pd.read_csv(wd / "results/orphans/tables/steps.csv")
    assert runs.loc[0, "status"] == "ok" and runs.loc[0, "resumed_from_step"] >= 20
    assert list(steps.step) == list(range(1, 41))
    assert steps.loss.tolist() == pytest.approx(default_losses(wd, "ddp").loss.tolist(), abs=1e-6)


def test_out_of_memory_becomes_a_row_and_the_study_completes(default_study):
    wd = default_study
    args = overlay(wd, "oom", results_dir="results/oom", work_dir="work/oom", strategies=["fsdp"],
                   train={"fault_injection": {"oom_at_step": 3}, "max_steps": 10})
    reuse_calibration(wd, "results/oom")
    snakemake(wd, *args)
    runs = pd.read_csv(wd / "results/oom/tables/runs.csv")
    assert list(runs.strategy) == ["fsdp"]
    assert (runs.status == "oom").all()
    assert runs.reason.str.contains("injected allocation failure at step 3").all()
    assert (wd / "results/oom/figures/peak_memory.png").exists()
    assert "oom" in (wd / "results/oom/tables/summary.md").read_text().lower()


PROBE = """import sys, time
from pathlib import Path
from workflow_scripts.training import workflow_watch
out = Path(sys.argv[1])
fired = []
workflow_watch.watch(fired.append, poll_s=0.1)
(out.parent / "started").touch()
while not (out.parent / "shell_gone").exists():
    time.sleep(0.1)
time.sleep(1.0)  # ten polls after Snakemake was adopted
out.write_text(fired[0] if fired else "still watching")
"""


def test_a_workflow_whose_shell_exits_keeps_its_jobs(tmp_path):
    """`nohup snakemake ... &` from a shell that then exits: Snakemake is adopted by init while a job runs, and the
    job's watch (workflow_watch: the ancestry up to Snakemake) does not stop it; a killed Snakemake still does
    (test_killing_the_workflow_leaves_no_rank_and_the_readme_rerun_resumes)."""
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "Snakefile").write_text(
        f'rule probe:\n    output: "done.txt"\n    shell: "PYTHONPATH={REPO} {sys.executable} {tmp_path}/probe.py '
        f'{tmp_path}/done.txt"\n')
    shell = subprocess.Popen(["bash", "-c", f"nohup {sys.executable} -m snakemake --cores 1 > sm.log 2>&1 & "
                              "while [ ! -e started ] && kill -0 $! 2>/dev/null; do sleep 0.1; done"], cwd=tmp_path)
    assert shell.wait(timeout=120) == 0 and (tmp_path / "started").exists(), (tmp_path / "sm.log").read_text()[-2000:]
    (tmp_path / "shell_gone").touch()
    deadline = time.time() + 60
    while not (tmp_path / "done.txt").exists() and time.time() < deadline:
        time.sleep(0.2)
    assert (tmp_path / "done.txt").read_text() == "still watching", (tmp_path / "sm.log").read_text()[-2000:]
