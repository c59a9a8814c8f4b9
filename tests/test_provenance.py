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
    """Rule calibrate ran (once) in the default study: host rows measured, GPU and collective rows (the study's 2
    ranks per node) marked not applicable on CPU; every run's provenance carries the machine facts."""
    import json

    cal = json.loads((default_study / "results/default/calibration/calibration.json").read_text())
    rows = {r["name"]: r for r in cal["rows"]}
    assert all(rows[n]["value"] > 0 for n in ("cpu_single_thread", "host_memcpy", "cpu_adam", "disk_write"))
    assert rows["matmul_bf16"]["value"] is None and rows["matmul_bf16"]["detail"] == "not applicable (cpu)"
    assert rows["all_reduce_busbw[2]"]["detail"] == "not applicable (cpu)" and cal["machine"]["cpu_model"]
    run = next((default_study / "results/default/runs").glob("*/*/ws2/r0/provenance.json"))
    assert json.loads(run.read_text())["machine"]["cpu_model"] == cal["machine"]["cpu_model"]


def test_verify_says_whether_a_rerun_reproduced_and_why_not(default_study, tmp_path):
    """The default study's own result set against copies of it: identical rows reproduce; a doctored copy (loss
    changed, throughput halved) differs, unexplained; throughput halved on a machine whose calibration is half as
    fast differs, explained."""
    import json

    import pandas as pd

    from workflow_scripts.report import verify

    rerun = default_study / "results/default"

    def committed(name, runs_edit=None, speed_factor=1.0):
        d = tmp_path / name
        shutil.copytree(rerun / "tables", d / "tables")
        shutil.copytree(rerun / "calibration", d / "calibration")
        runs = pd.read_csv(d / "tables/runs.csv")
        if runs_edit:
            runs_edit(runs)
        runs.to_csv(d / "tables/runs.csv", index=False)
        cal = json.loads((d / "calibration/calibration.json").read_text())
        for r in cal["rows"]:
            if r["name"] == "cpu_single_thread":
                r["value"] *= speed_factor
        (d / "calibration/calibration.json").write_text(json.dumps(cal))
        return d

    ok = (pd.read_csv(rerun / "tables/runs.csv").status == "ok").tolist()
    same = verify.compare(rerun, committed("same"))
    assert len(same) == len(ok) and (same.verdict[ok] == "reproduced").all()
    assert (same.verdict[[not x for x in ok]] == "not compared").all()  # zeropp: unsupported on CPU

    def doctor(runs):
        runs.loc[0, "final_loss"] += 0.1
        runs.loc[1, "tokens_per_s"] *= 2  # the rerun then runs at half the committed pace

    doctored = verify.compare(rerun, committed("doctored", doctor)).set_index(["strategy"])
    first, second = pd.read_csv(rerun / "tables/runs.csv").strategy[:2]
    assert doctored.loc[first, "verdict"] == "differs-unexplained" and "loss" in doctored.loc[first, "why"]
    assert doctored.loc[second, "why"] == "throughput" and doctored.loc[second, "throughput_ratio"] == 0.5

    def faster(runs):
        runs["tokens_per_s"] *= 2

    explained = verify.compare(rerun, committed("faster_machine", faster, speed_factor=2.0))
    assert (explained.verdict[ok] == "differs-explained").all()
    verify.write(explained, rerun, tmp_path / "faster_machine", tmp_path / "out")
    assert "differs-explained" in (tmp_path / "out/reproduction.md").read_text()


def test_verify_refuses_to_overwrite_the_committed_set(tmp_path):
    from workflow_scripts.config_check import verify_problems

    (tmp_path / "set/tables").mkdir(parents=True)
    (tmp_path / "set/tables/runs.csv").write_text("model\n")
    assert verify_problems({"verify": {"against": str(tmp_path / "nothing")}, "results_dir": "r"})[0].startswith(
        f"verify.against: {tmp_path / 'nothing'} has no tables/runs.csv")
    (clash,) = verify_problems({"verify": {"against": str(tmp_path / "set")}, "results_dir": str(tmp_path / "set")})
    assert "is this study's results_dir" in clash


def test_published_claims_name_runs_of_the_study():
    """A claim outside the study, a headline without claims and a confound on an unclaimed strategy are named."""
    import copy

    import yaml as _yaml

    from conftest import REPO

    from workflow_scripts.config_check import published_problems

    cfg = _yaml.safe_load((REPO / "studies/gpt2_tutorial.yaml").read_text())
    cfg["train"] = {**cfg["train"], "precision": "bf16-mixed", "micro_batch_size": 4, "grad_accum": 1}
    assert published_problems(copy.deepcopy(cfg)) == []
    bad = copy.deepcopy(cfg)
    bad["published"]["claims"].append({"model": "gpt2-large", "strategy": "ddp", "seconds_per_epoch": 1})
    bad["published"]["headlines"][0]["faster"].append("zero3")
    bad["published"]["as_published"]["fsdp"] = {"precision": "fp16"}
    found = published_problems(bad)
    assert found == ["published.claims[5]: gpt2-large/ddp/ws1 is not a run of this study (the claims are compared "
                     "with the study's fair rows)",
                     "published.as_published.fsdp: not a claimed strategy (published.claims)",
                     "published.as_published.fsdp.precision: 'fp16' is not one of fp32, bf16-mixed, bf16-pure",
                     "published.headlines[0]: gpt2-medium/zero3 has no claim row (published.claims)"]
