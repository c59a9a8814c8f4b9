"""The SLURM profile, for real: a reduced study (ddp and fsdp, a few steps) submitted through
`--profile profiles/slurm` to a single-node SLURM cluster, both started with the session by tests/slurm_cluster.py
(the study mostly waits, so it runs beside the first tests), its tables compared with those of the default study
run locally. Every job must have gone through sbatch: its SLURM job id is in the
run's provenance and slurmctld knows the job (scontrol, its log) with the resources the profile asked for.

    python3 -m pytest tests/test_slurm.py         (as root; skipped with the reason when slurm-wlm/munge are missing)
"""
from __future__ import annotations

import json
import re
import types

import pandas as pd
import pytest
import yaml
from conftest import copy_workflow, snakemake
from slurm_cluster import PROFILE, REDUCED, STRATEGIES, reduced_study


def run_dirs(wd):
    return sorted((wd / REDUCED["results_dir"] / "runs").glob("*/*/ws*/r*"))


def test_slurm_profile_options_are_known_to_snakemake_and_the_plugin(tmp_path):
    """A dry run parses every profile key (an unknown option name is an error) and shows the train resources."""
    wd = copy_workflow(tmp_path / "wf")
    out = snakemake(wd, "--profile", "profiles/slurm", "-n", *reduced_study(wd)).stdout
    train = yaml.safe_load(PROFILE.read_text())["set-resources"]["train"]
    block = out[out.index("rule train:"):]
    resources = block[block.index("resources:"):].splitlines()[0]
    for key, value in train.items():
        assert f"{key}={value}" in resources, (key, resources)
    assert "gpu=0" in resources and "nodes=1" in resources  # from the rule (platform cpu, config nodes)


class _Resources(dict):
    __getattr__ = dict.__getitem__


def test_profile_gives_gpu_runs_one_launcher_per_node():
    """The plugin's own sbatch builder: with the profile's train resources a 4-GPU run gets --gpus=4,
    --cpus-per-gpu and --exclusive, and no --ntasks-per-gpu (which `tasks` alone would become on a GPU job)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    train = yaml.safe_load(PROFILE.read_text())["set-resources"]["train"]
    job = types.SimpleNamespace(threads=16, resources=_Resources(train, gpu=4, nodes=1))
    params = {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "", "partition": "",
              "workdir": "."}
    call = get_submit_command(job, params) + set_gres_string(job)
    assert "--gpus=4" in call and f"--cpus-per-gpu={train['cpus_per_gpu']}" in call
    assert "--exclusive" in call and "--nodes=1" in call and f"--mem {train['mem_mb']}" in call
    assert "--ntasks-per-gpu" not in call and "--cpus-per-task" not in call
    cpu_job = types.SimpleNamespace(threads=2, resources=_Resources(train, gpu=0, nodes=1))
    cpu_call = get_submit_command(cpu_job, params)
    assert "--ntasks=1" in cpu_call and "--cpus-per-task=2" in cpu_call and "--gpus" not in cpu_call


# ------------------------------------------------------------------ the reduced study through SLURM


@pytest.fixture(scope="module")
def slurm_run(slurm_study):
    """The reduced study through SLURM, started with the session (slurm_cluster.slurm_study): its workflow copy and
    log once it has ended."""
    return slurm_study.result()


def test_every_job_went_through_sbatch(slurm_run, slurm_cluster):
    wd, log = slurm_run
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", log)
    # the profile's group prep (corpus, tokenizer, tokenize, random_init), calibrate, calibration_figure, one train
    # per strategy, the group report (parse, summary_table, findings, figures); rule all runs nothing
    assert len(submitted) == 4 + len(STRATEGIES), log[-3000:]
    assert sorted(re.findall(r"slurm_logs/group_(prep|report)_", log)) == ["prep", "report"], log[-3000:]
    assert set(submitted) <= set(slurm_cluster.job_ids())
    ctld_log = slurm_cluster.log("slurmctld")
    for job_id in submitted:
        assert slurm_cluster.show_job(job_id)["JobState"] == "COMPLETED", job_id
        # the controller started it: "sched: Allocate JobId=N" (main scheduler) or "... Started JobId=N in <partition>"
        # (backfill scheduler, which sometimes picks the job up first)
        started = rf"(sched: Allocate JobId={job_id} |Started JobId={job_id} in )"
        assert re.search(started, ctld_log), job_id


def test_training_runs_record_their_slurm_job(slurm_run, slurm_cluster):
    wd, _ = slurm_run
    runs = run_dirs(wd)
    assert len(runs) == len(STRATEGIES)
    ids = set()
    for run in runs:
        prov = json.loads((run / "provenance.json").read_text())
        job_id = prov["slurm_job_id"]
        assert job_id, f"{run}: no SLURM job id in provenance.json"
        ids.add(job_id)
        assert prov["env"]["SLURM_JOB_PARTITION"] == slurm_cluster.partition
        job = slurm_cluster.show_job(job_id)
        model, strategy, layout, repeat = run.parts[-4], run.parts[-3], run.parts[-2], run.parts[-1][1:]
        assert job["Comment"] == f"rule_train_wildcards_{model}_{strategy}_{layout}_{repeat}"
        assert job["JobState"] == "COMPLETED" and job["Partition"] == slurm_cluster.partition
        assert job["CPUs/Task"] == layout.removeprefix("ws")  # the rule's threads (= ranks on CPU): --cpus-per-task
        assert job["NumTasks"] == "1"  # one torchrun launcher
        assert job["OverSubscribe"] == "NO"  # the profile's --exclusive: a timed run never shares its node
        assert (wd / f".snakemake/slurm_logs/rule_train/{model}_{strategy}_{layout}_{repeat}/{job_id}.log").exists()
    assert len(ids) == len(runs), "every run is its own SLURM job"


def test_tables_have_the_shape_of_a_local_run(slurm_run, default_study):
    """The tables of a study run through SLURM are a local run's: the columns of the default study's (run locally by
    the suite, the same parse), a row per run, per step of each run and per configuration."""
    wd, _ = slurm_run
    rows = {"runs": len(STRATEGIES), "steps": REDUCED["train"]["max_steps"] * len(STRATEGIES),
            "summary": len(STRATEGIES), "vram": None}  # the VRAM timeline's length varies
    for table, expected in rows.items():
        remote = pd.read_csv(wd / REDUCED["results_dir"] / f"tables/{table}.csv")
        local = pd.read_csv(default_study / f"results/default/tables/{table}.csv")
        assert list(remote.columns) == list(local.columns), table
        assert expected is None or len(remote) == expected, table
    runs = pd.read_csv(wd / REDUCED["results_dir"] / "tables/runs.csv")
    assert sorted(runs.strategy) == sorted(STRATEGIES) and (runs.status == "ok").all()
    assert (wd / REDUCED["results_dir"] / "report.html").exists()
