"""Provenance says what explains a timing: the machine's facts (driver, CUDA, clocks, power limits, CPU model) and
the project's own commit, never that of a repository the project was copied into."""
from __future__ import annotations

import shutil
import subprocess
import sys

from test_vram import ROOT, load_fake
from workflow_scripts.measure import machine, provenance


def test_gpu_facts_come_from_nvml(monkeypatch):
    nv = load_fake("fake_pynvml")
    nv.configure([nv.FakeDevice(total=141 << 30, used=0), nv.FakeDevice(total=141 << 30, used=0, sm_clock_mhz=1500,
                                                                         power_limit_mw=600_000)])
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    facts = machine.nvml_facts()
    assert facts["driver"] == "580.159.04" and facts["cuda_driver"] == "13.0"
    assert [g["power_limit_w"] for g in facts["gpus"]] == [700.0, 600.0]
    assert [g["sm_clock_mhz"] for g in facts["gpus"]] == [1980, 1500] and nv.STATE["shutdown_calls"] == 1


def test_a_cpu_machine_says_so():
    facts = machine.facts()
    assert facts["cpu_model"] and facts["gpu"] is None and facts["nccl"] is None


def test_commit_is_the_projects_own(tmp_path):
    assert provenance.git_state(ROOT)["commit"] == subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    outer = tmp_path / "outer"
    copy = outer / "vendored/project"
    shutil.copytree(ROOT / "workflow_scripts", copy / "workflow_scripts")
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(["git", "-C", str(outer), "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                    "--allow-empty", "-m", "outer"], check=True)
    state = provenance.git_state(copy)
    assert state["commit"] is None and "no .git of its own" in state["why"]


def test_the_study_calibrates_its_machine_before_the_timed_runs(default_study):
    """Rule calibrate ran (once) in the default study: host rows measured, GPU rows marked not applicable on CPU,
    the collectives at the study's 2 ranks per node; every run's provenance carries the machine facts."""
    import json

    cal = json.loads((default_study / "results/default/calibration/calibration.json").read_text())
    rows = {r["name"]: r for r in cal["rows"]}
    assert all(rows[n]["value"] > 0 for n in ("cpu_single_thread", "host_memcpy", "cpu_adam", "disk_write"))
    assert rows["matmul_bf16"]["value"] is None and rows["matmul_bf16"]["detail"] == "not applicable (cpu)"
    assert rows["all_reduce_busbw[2x64MB]"]["value"] > 0 and cal["machine"]["cpu_model"]
    run = next((default_study / "results/default/runs").glob("*/*/ws2/r0/provenance.json"))
    assert json.loads(run.read_text())["machine"]["cpu_model"] == cal["machine"]["cpu_model"]
