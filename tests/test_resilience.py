"""Failure paths: a training job killed with SIGKILL resumes from its checkpoint when Snakemake reruns it (same
final loss as an uninterrupted run), and an out-of-memory run becomes an `oom` row while the study completes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest

from conftest import overlay, snakemake


def kill_tree(pid: int) -> None:
    proc = psutil.Process(pid)
    for p in proc.children(recursive=True) + [proc]:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def launcher_of(run_id: str):
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "workflow_scripts.training.launch" in cmd and run_id in cmd and "bash" not in cmd.split()[0]:
            return p
    return None


@pytest.mark.parametrize("strategy", ["fsdp"])  # ddp: the workflow-kill test below; zero2: test_resume_config
def test_sigkilled_job_resumes_with_the_same_final_loss(default_study, strategy):
    """The default study's run of the strategy is the uninterrupted reference: the same training, checkpointed
    every 10 steps instead of 20 (saving a checkpoint does not touch the training), killed after its first one."""
    wd, work = default_study, f"work/resume_{strategy}"
    expected = default_losses(wd, strategy)

    args = overlay(wd, f"kill_{strategy}", results_dir=f"results/kill_{strategy}", work_dir=work,
                   strategies=[strategy], train={"checkpoint_every": 10})
    target = f"results/kill_{strategy}/tables/runs.csv"
    sm = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "all", target, *args], cwd=wd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = wd / work / f"runs/gpt2-tiny/{strategy}/ws2/r0/ckpt/latest"
    deadline = time.time() + 300
    while not latest.exists() and time.time() < deadline and sm.poll() is None:
        time.sleep(0.05)
    assert latest.exists(), "no checkpoint was written"
    launcher = launcher_of(f"gpt2-tiny__{strategy}__ws2__r0")
    assert launcher is not None
    kill_tree(launcher.pid)
    assert sm.wait(timeout=300) != 0, "the killed job must fail the first invocation"

    snakemake(wd, target, "--rerun-incomplete", *args)
    runs = pd.read_csv(wd / target)
    resumed = pd.read_csv(wd / f"results/kill_{strategy}/tables/steps.csv")
    assert runs.loc[0, "resumed_from_step"] >= 10
    assert list(resumed.step) == list(range(1, 41))
    assert resumed.loss.tolist() == pytest.approx(expected.loss.tolist(), abs=1e-6)


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
    args = overlay(wd, "oom", results_dir="results/oom", work_dir="work/oom", strategies=["ddp", "fsdp"],
                   train={"fault_injection": {"oom_at_step": 3}, "max_steps": 10})
    snakemake(wd, *args)
    runs = pd.read_csv(wd / "results/oom/tables/runs.csv")
    assert sorted(runs.strategy) == ["ddp", "fsdp"]
    assert (runs.status == "oom").all()
    assert runs.reason.str.contains("injected allocation failure at step 3").all()
    assert (wd / "results/oom/figures/peak_memory.png").exists()
    assert "oom" in (wd / "results/oom/tables/summary.md").read_text().lower()
