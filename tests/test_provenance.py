"""Provenance says what explains a timing: the machine's facts (driver, CUDA, clocks, power limits, CPU model) and
the project's own commit, never that of a repository the project was copied into."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
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


def test_a_copy_without_git_records_the_commit_it_was_given(tmp_path, monkeypatch):
    """A copy of the checkout with no .git (as a GPU machine receives it) records PIPELINE_COMMIT and says so."""
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "workflow_scripts", copy / "workflow_scripts")
    assert provenance.git_state(copy)["commit"] is None
    monkeypatch.setenv("PIPELINE_COMMIT", "c3d4e5f" + "0" * 33)
    state = provenance.git_state(copy)
    assert state["commit"] == "c3d4e5f" + "0" * 33 and state["dirty"] is None and "PIPELINE_COMMIT" in state["why"]


def test_the_launcher_starts_the_ranks_without_importing_torch(token_data, tmp_path):
    """Every check before the ranks start (data, platform, predicted memory) runs without torch, whose import cost
    each run 1.1-1.4 s on 2 cores; rank 0 reads the facts that need it (provenance.torch_facts)."""
    from conftest import launch_spec

    spec = launch_spec(token_data, tmp_path, "no-torch")
    code = ("import json, sys\n"
            "from workflow_scripts.job import launch\n"
            "from workflow_scripts.training import graceful_stop\n"
            "def start(self, cmd, env):\n"
            "    print('torch' in sys.modules, cmd[-1]); sys.exit(0)\n"
            "graceful_stop.LauncherStop.start = start\n"
            f"launch.launch(json.load(open({str(spec)!r})))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1].split() == ["False", str(tmp_path / "no-torch/out/run_spec.json")]


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


def test_the_calibration_waits_for_the_data_preparation_and_every_op_build():
    """Nothing CPU-heavy runs beside the calibration: in the default study's DAG it follows the prepared data and
    each op build (beside a tokenizer, a GPU's launch cost had measured 1.29x its neighbour's)."""
    import re

    dag = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "all", "--dag"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    label = {n: name for n, name in re.findall(r'^\s*(\d+)\[label = "(\w+)', dag, re.MULTILINE)}
    before = {}
    for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dag, re.MULTILINE):
        before.setdefault(b, set()).add(a)

    def ancestors(node):
        seen, todo = set(), [node]
        while todo:
            for a in before.get(todo.pop(), ()):
                if a not in seen:
                    seen.add(a)
                    todo.append(a)
        return {label[a] for a in seen}, sum(label[a] == "build_op" for a in seen)

    (calibrate,) = [n for n, name in label.items() if name == "calibrate"]
    names, builds = ancestors(calibrate)
    assert {"corpus", "tokenizer", "tokenize"} <= names
    assert builds == sum(name == "build_op" for name in label.values()) == 3


def committed_copy(rerun, dest, runs_edit=None, speed_factor=1.0):
    """A copy of a result set as if committed from another run: tables, calibration, data manifest, run files;
    runs.csv edited by `runs_edit`, the calibration's CPU speed scaled by `speed_factor`."""
    import json

    import pandas as pd

    for part in ("tables", "calibration", "data", "runs"):
        shutil.copytree(rerun / part, dest / part)
    runs = pd.read_csv(dest / "tables/runs.csv")
    if runs_edit:
        runs_edit(runs)
    runs.to_csv(dest / "tables/runs.csv", index=False)
    cal = json.loads((dest / "calibration/calibration.json").read_text())
    for r in cal["rows"]:
        if r["name"] == "cpu_single_thread":
            r["value"] *= speed_factor
    (dest / "calibration/calibration.json").write_text(json.dumps(cal))
    return dest


def test_verify_fails_on_every_kind_of_difference(default_study, tmp_path):
    """The default study against doctored copies of itself: identical rows reproduce (a loss change equal to the
    tolerance too: inclusive); a deleted row is `missing`, ok -> oom `status-changed`, loss +2e-3 and host memory
    +20% on CPU differ, a loss difference with another precision is `settings-changed` naming the key; each makes
    the check exit 1.
    Throughput halved on a machine whose calibration is half as fast differs, explained (exit 0)."""
    import json

    import pandas as pd

    from workflow_scripts.report import verify

    rerun = default_study / "results/default"
    runs = pd.read_csv(rerun / "tables/runs.csv")
    ok = runs[runs.status == "ok"].strategy.tolist()
    first, second, third, fourth = ok[:4]

    def row(strategy):
        return runs.index[runs.strategy == strategy][0]

    def doctor(r):
        r.loc[row(first), "final_loss"] -= 2e-3  # the rerun's loss is then 2e-3 higher
        r.loc[row(second), "peak_host_rss_bytes"] /= 1.2
        r.loc[row(third), ["status", "reason"]] = ["oom", "injected"]
        r.loc[row(ok[4]), "final_loss"] -= 1e-3  # exactly the tolerance
        r.loc[row(fourth), "final_loss"] -= 5e-3  # with another precision (below): explained by the change
        r.drop(index=row(ok[5]), inplace=True)

    committed = committed_copy(rerun, tmp_path / "doctored", doctor)
    spec = committed / f"runs/{runs.model[0]}/{fourth}/ws2/r0/run_spec.json"
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "precision": "bf16-mixed"}))
    table = verify.compare(rerun, committed).set_index("strategy")
    assert table.loc[first, "verdict"] == "differs-unexplained" and table.loc[first, "why"] == "loss"
    assert table.loc[second, "verdict"] == "differs-unexplained" and table.loc[second, "why"] == "memory"
    assert table.loc[third, ["verdict", "why"]].tolist() == ["status-changed", "oom -> ok"]
    precision = "precision: bf16-mixed -> fp32"
    assert table.loc[fourth, ["verdict", "why"]].tolist() == ["settings-changed", f"loss ({precision})"]
    assert table.loc[fourth, ["numerics", "changed"]].tolist() == ["differs", precision]
    assert table.loc[ok[4], "verdict"] == "reproduced"
    assert table.loc[ok[5], ["verdict", "why"]].tolist() == ["missing", "only in the rerun"]
    assert (table.drop(index=[first, second, third, fourth, ok[5]]).verdict == "reproduced").all()
    verify.write(table.reset_index(), rerun, committed, tmp_path / "out")
    assert verify.check(tmp_path / "out/reproduction.csv") == 1

    def faster(r):
        r["tokens_per_s"] *= 2

    explained = verify.compare(rerun, committed_copy(rerun, tmp_path / "faster", faster, speed_factor=2.0))
    assert (explained.verdict[explained.strategy.isin(ok)] == "differs-explained").all()
    verify.write(explained, rerun, tmp_path / "faster", tmp_path / "out2")
    assert verify.check(tmp_path / "out2/reproduction.csv") == 0


def test_code_state_names_exactly_the_modules_that_differ(tmp_path):
    """Two copies of a project's executed code, one module edited and one added: the whole hash differs and
    changed_modules lists those two paths, nothing else; identical copies hash alike and list nothing."""
    from workflow_scripts.measure import provenance

    for tree in ("a", "b"):
        for rel, text in (("workflow_scripts/training/loop.py", "x = 1\n"),
                          ("workflow_scripts/training/strategies/_ddp_engine.py", "wrapped = True\n"),
                          ("workflow_scripts/job/launch.py", "y = 2\n")):
            (tmp_path / tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / tree / rel).write_text(text)
    same = provenance.code_state(tmp_path / "a"), provenance.code_state(tmp_path / "b")
    assert same[0] == same[1] and provenance.changed_modules(*same) == []
    (tmp_path / "b/workflow_scripts/training/strategies/_ddp_engine.py").write_text("wrapped = world_size > 1\n")
    (tmp_path / "b/workflow_scripts/training/new.py").write_text("")
    old, new = provenance.code_state(tmp_path / "a"), provenance.code_state(tmp_path / "b")
    assert old["hash"] != new["hash"]
    assert provenance.changed_modules(old, new) == ["workflow_scripts/training/new.py",
                                                    "workflow_scripts/training/strategies/_ddp_engine.py"]
    assert provenance.changed_modules(None, new) is None  # a run that recorded no code: unknown, not "same"


def test_verify_names_a_changed_module_and_judges_numerics_and_performance(default_study, tmp_path):
    """Committed copies of the default study, doctored: a run that recorded another hash for the DDP engine reads
    `reproduced` with the module listed under `changed` while its numbers reproduce, and `settings-changed` naming
    the pipeline's commits and the module once its loss differs too. Throughput x1.5 on another device kind is
    reported beside the kinds, not judged (exit 0), unless asked (`judge_kinds`); on the same kind it fails."""
    import json

    import pandas as pd

    from workflow_scripts.report import verify

    rerun = default_study / "results/default"
    runs = pd.read_csv(rerun / "tables/runs.csv")
    ok = runs[runs.status == "ok"].strategy.tolist()
    model, strategy, other = runs.model[0], ok[0], ok[1]

    def older_code(dest, runs_edit=None):
        committed = committed_copy(rerun, dest, runs_edit)
        path = committed / f"runs/{model}/{strategy}/ws2/r0/provenance.json"
        recorded = json.loads(path.read_text())
        engine = "workflow_scripts/training/strategies/_ddp_engine.py"
        assert engine in recorded["code"]["modules"]  # every run records the code it executed
        recorded["code"]["modules"][engine] = "0" * 12
        recorded["git"]["commit"] = "a1b2c3d" + "0" * 33
        path.write_text(json.dumps(recorded))
        return committed

    commit = (json.loads((rerun / f"runs/{model}/{strategy}/ws2/r0/provenance.json").read_text())["git"]["commit"]
              or "unknown")[:7]
    change = f"pipeline: a1b2c3d -> {commit}, changed: training/strategies/_ddp_engine.py"
    same = verify.compare(rerun, older_code(tmp_path / "same")).set_index("strategy")
    assert same.loc[strategy, ["verdict", "numerics", "changed"]].tolist() == ["reproduced", "reproduced", change]
    assert (same.loc[ok[1:], "verdict"] == "reproduced").all() and (same.loc[ok[1:], "changed"] == "").all()

    def loss_and_kind(r):
        r.loc[r.strategy == strategy, "final_loss"] -= 0.01
        r.loc[r.strategy == other, "tokens_per_s"] /= 1.5  # the rerun is then 1.5x faster
        r.loc[r.strategy == other, "device_name"] = "NVIDIA H100 80GB HBM3"

    table = verify.compare(rerun, older_code(tmp_path / "differs", loss_and_kind)).set_index("strategy")
    assert table.loc[strategy, ["verdict", "why"]].tolist() == ["settings-changed", f"loss ({change})"]
    kinds = table.loc[other]
    assert kinds["verdict"] == "reproduced" and kinds["performance"] == "across kinds"
    assert kinds["why"].startswith("x1.50 NVIDIA H100 80GB HBM3 -> ") and kinds["why"].endswith(": reported")
    verify.write(table.drop(index=[strategy]).reset_index(), rerun, tmp_path / "differs", tmp_path / "out")
    assert verify.check(tmp_path / "out/reproduction.csv") == 0
    judged = verify.compare(rerun, tmp_path / "differs", judge_kinds=True).set_index("strategy")
    assert judged.loc[other, ["verdict", "performance"]].tolist() == ["differs-unexplained", "differs"]

    def faster(r):
        r.loc[r.strategy == other, "tokens_per_s"] /= 1.5

    same_kind = verify.compare(rerun, committed_copy(rerun, tmp_path / "faster", faster)).set_index("strategy")
    assert same_kind.loc[other, ["verdict", "why"]].tolist() == ["differs-unexplained", "throughput"]


def test_verify_target_reruns_when_the_committed_set_changes_and_fails(default_study, tmp_path):
    """`snakemake verify` against an unedited copy passes without retraining anything (the replayed decisions
    equal the study's); after the committed runs.csv is edited it compares again and exits non-zero, the
    table kept and printed."""
    import pandas as pd
    from conftest import snakemake

    committed = committed_copy(default_study / "results/default", tmp_path / "committed")
    target = ["verify", "--config", f"verify={{against: {committed}}}"]
    done = snakemake(default_study, *target)
    assert "rule train" not in done.stdout + done.stderr and "reproduced" in done.stdout
    runs = pd.read_csv(committed / "tables/runs.csv")
    runs.loc[0, "final_loss"] += 0.1
    runs.to_csv(committed / "tables/runs.csv", index=False)
    done = snakemake(default_study, *target, check=False)
    assert done.returncode != 0 and "compare_with_committed" in done.stdout + done.stderr
    md = (default_study / "results/default/verify/reproduction.md").read_text()
    assert "differs-unexplained" in md and "neither reproduced nor explained" in done.stdout + done.stderr


def test_a_sets_own_repeats_widen_its_throughput_tolerance(tmp_path):
    """The committed GPU set with three repeats per run (results/gpt2_tutorial/h100-fast, its recorded run-to-run
    spread left out) against a copy of itself whose tokens/s are scaled: within what the set's own repeats spread
    (ddp: largest / smallest - 1 = 0.1035) reproduces, beyond it differs; the same machine predicts x1.0. A rerun
    whose own repeats spread wider widens the tolerance of that run alone."""
    import pandas as pd

    from workflow_scripts.report import verify

    committed_set = ROOT / "results/gpt2_tutorial/h100-fast"
    speed = pd.read_csv(committed_set / "tables/runs.csv").groupby("strategy").tokens_per_s
    spread = (speed.max() / speed.min() - 1.0).to_dict()
    assert 0.1 < spread["ddp"] < 0.105 and 0.1 < spread["zero2"] < 0.115

    def scale(factors, repeats=(0, 1, 2)):
        def edit(runs):
            for strategy, factor in factors.items():
                runs.loc[(runs.strategy == strategy) & runs.repeat.isin(repeats), "tokens_per_s"] *= factor
        return edit

    committed = committed_copy(committed_set, tmp_path / "committed")
    rerun = committed_copy(committed_set, tmp_path / "rerun", scale({"ddp": 1 + spread["ddp"] - 1e-4,
                                                                     "zero2": 1 + spread["zero2"] + 1e-3}))
    table = verify.compare(rerun, committed).set_index(["strategy", "repeat"])
    assert table.loc[("ddp", 0), "repeat_spread"] == pytest.approx(spread["ddp"])
    assert (table.loc["ddp", "verdict"] == "reproduced").all()  # x1.1034 > verify.tolerances' 10 %, within 10.35 %
    assert (table.loc["zero2", "verdict"] == "differs-unexplained").all()
    assert (table.drop(index="zero2", level="strategy").verdict == "reproduced").all()

    def noisier(runs):  # zero2's repeats x1.3 and x0.8: the rerun's own spread (x1.46) now covers its x1.3
        scale({"zero2": 1.3}, repeats=(0,))(runs)
        scale({"zero2": 0.8}, repeats=(1,))(runs)

    noisy = committed_copy(committed_set, tmp_path / "noisy", noisier)
    table = verify.compare(noisy, committed).set_index(["strategy", "repeat"])
    assert table.loc[("zero2", 0), "repeat_spread"] == pytest.approx(0.4629, abs=1e-3)
    assert (table.loc["zero2", "verdict"] == "reproduced").all()
    assert list(table.loc["ddp", "repeat_spread"]) == pytest.approx([spread["ddp"]] * 3)


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


def test_verify_predicts_a_gpu_rows_ratio_with_the_step_time_model_on_both_machines(tmp_path):
    """A GPU set whose calibration has the step-time model's curves (a fixture: a scaling study's one-rank gpt2-medium
    rows on one H200, eager FSDP2 and, its applied levers edited, DDP as a whole model compiled with CUDA graphs)
    against a rerun's calibration: the same machine predicts x1; twice the GEMM and attention rates speed up the
    GEMM-bound DDP row and leave the host-bound FSDP2 row; launches twice as slow halve the FSDP2 row and barely move
    DDP's. The verdict's text names the model and the committed run's bound."""
    import copy
    import json
    import shutil

    import pandas as pd

    from workflow_scripts.report import verify

    committed = tmp_path / "committed"
    shutil.copytree(ROOT / "tests/fixtures/verify_h200", committed)
    applied = committed / "runs/gpt2-medium/ddp/ws1/r0/strategy_settings.json"
    settings = json.loads(applied.read_text())
    settings["harness"].update(compile_blocks=False, compile_model="torch.compile(GPT2LMHeadModel, "
                               "mode=reduce-overhead)", compile_mode="reduce-overhead")
    applied.write_text(json.dumps(settings))
    runs = pd.read_csv(committed / "tables/runs.csv")
    cal = json.loads((committed / "calibration/calibration.json").read_text())
    (tmp_path / "calibration").mkdir()

    def ratio(strategy, edit=lambda c: None):
        c = copy.deepcopy(cal)
        edit(c)
        (tmp_path / "calibration/calibration.json").write_text(json.dumps(c))
        return verify.model_ratio(runs[runs.strategy == strategy].iloc[0], committed, tmp_path)

    def faster_gemms(c):
        for point in c["curves"]["matmul_bf16"] + c["curves"]["sdpa_bf16"]:
            point["tflops"] *= 2

    def slower_launches(c):
        for row in c["rows"]:
            row["value"] = row["value"] * 2 if row["name"].startswith("launch_us[") else row["value"]

    assert ratio("ddp")[0] == ratio("fsdp")[0] == 1.0
    assert ratio("ddp")[1].startswith("step-time model: gemm-bound") and "host-bound" in ratio("fsdp")[1]
    assert ratio("ddp", faster_gemms)[0] > 1.3 and ratio("fsdp", faster_gemms)[0] < 1.1
    assert ratio("fsdp", slower_launches)[0] == pytest.approx(0.5, abs=0.03)
    assert ratio("ddp", slower_launches)[0] > 0.95
    del cal["curves"]  # a calibration from before the curves: bound.py's shares decide instead
    assert ratio("ddp") is None


def test_a_throughput_ratio_follows_the_measure_that_bounds_the_step():
    """plan/bound.py by hand: a one-GPU row at 375 of a calibrated 750 TFLOP/s is half compute, half host; on a
    machine with the same matmul rate and launches twice as fast the prediction is 1 / (0.5/1 + 0.5/2) = x1.33,
    and host-bound rows follow the launch cost, not the matmul rate; two data-parallel ranks add the gradients'
    all-reduce at the calibrated bus bandwidth."""
    from workflow_scripts.plan import bound

    row = {"platform": "cuda", "world_size": 1, "dp_size": 1, "tokens_per_step": 4096, "tokens_per_s": 75_000,
           "flops_per_token": 5e9, "trainable_params": 1e8}
    old = {"matmul_bf16[0]": 750.0, "launch_us[0]": 8.0, "cpu_single_thread": 20.0}
    new = {"matmul_bf16[0]": 750.0, "launch_us[0]": 4.0, "cpu_single_thread": 10.0}
    assert bound.shares(row, old) == pytest.approx({"compute": 0.5, "communication": 0.0, "host": 0.5})
    ratio, why = bound.predicted_ratio(row, old, new)
    assert ratio == pytest.approx(4 / 3) and why.startswith("compute-bound (50% compute")
    slow_row = {**row, "tokens_per_s": 15_000}  # 10% compute: host-bound
    ratio, why = bound.predicted_ratio(slow_row, old, {**new, "matmul_bf16[0]": 1500.0})
    assert ratio == pytest.approx(1 / (0.1 / 2 + 0.9 / 2)) and why.startswith("host-bound (90% host, kernel")
    no_launch = {k: v for k, v in new.items() if not k.startswith("launch")}  # an older set: the CPU measure
    assert bound.predicted_ratio(slow_row, old, no_launch)[0] == pytest.approx(1 / (0.1 + 0.9 * 2))
    two = {**row, "world_size": 2, "dp_size": 2, "tokens_per_s": 150_000}  # 0.0546 s per step
    old2 = {**old, "all_reduce_busbw[2x64MB]": 10.0, "all_reduce_busbw[2x1000MB]": 100.0}
    # 1e8 x 4 bytes x 2 x 1/2 at 100 GB/s = 4 ms of a 54.6 ms step
    assert bound.shares(two, old2)["communication"] == pytest.approx(0.004 / (4096 / 150_000))
    assert bound.shares({**row, "platform": "cpu"}, old) == {"compute": 0.0, "communication": 0.0, "host": 1.0}


def test_verify_names_the_changed_modules_nearest_the_strategy_first():
    """`changed` names at most six modules: a DDP row its own strategy module first, then its family's engine, the
    other strategy modules, the training package and the rest (each group in the order found); a ZeRO-2 row its
    DeepSpeed engine first."""
    from workflow_scripts.report.verify import nearness

    changed = ["report/figures.py", "training/loop.py", "training/strategies/_deepspeed_engine.py",
               "training/strategies/engine.py", "training/strategies/_ddp_engine.py", "training/strategies/ddp.py",
               "job/launch.py"]
    assert sorted(changed, key=lambda m: nearness(m, "ddp")) == [
        "training/strategies/ddp.py", "training/strategies/_ddp_engine.py", "training/strategies/_deepspeed_engine.py",
        "training/strategies/engine.py", "training/loop.py", "report/figures.py", "job/launch.py"]
    assert sorted(changed, key=lambda m: nearness(m, "zero2"))[:4] == [
        "training/strategies/_deepspeed_engine.py", "training/strategies/engine.py",
        "training/strategies/_ddp_engine.py", "training/strategies/ddp.py"]


def test_a_gpu_rank_gets_its_share_of_the_nodes_cores_and_provenance_says_how_many(monkeypatch, tmp_path):
    """Snakemake exports OMP_NUM_THREADS as the rule's threads (4 a rank); a GPU run's ranks get the cores the job
    may run on shared among the node's ranks instead (16 cores, 4 ranks: 4 each; 3 ranks: 5; 32 ranks: 1); a CPU
    run keeps train.threads_per_rank. A rank that trained records its threads, and the provenance table shows them."""
    from test_lever_cache import config

    from workflow_scripts import study
    from workflow_scripts.job.launch import environment, gpu_rank_threads
    from workflow_scripts.report import parse

    assert [gpu_rank_threads(n, cores=16) for n in (1, 3, 4, 32)] == [16, 5, 4, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    cores = len(os.sched_getaffinity(0))
    gpu = study.resolve(config(tmp_path, platform="cuda", world_sizes=[1]), "gpt2-tiny", "ddp", 1, 0, {}, "o", "w", [])
    assert environment(gpu)["OMP_NUM_THREADS"] == str(cores)
    cpu = study.resolve(config(tmp_path), "gpt2-tiny", "ddp", 2, 0, {}, "o", "w", [])
    assert environment(cpu)["OMP_NUM_THREADS"] == str(cpu.train["threads_per_rank"])

    run = tmp_path / "run"
    run.mkdir()
    (run / "provenance.json").write_text(json.dumps({"git": {"commit": "abc"}, "rank_cpu_threads": 16}))
    row = parse.provenance_row(run, {"run_id": "r", "substitutions": "[]", "settings": "s"})
    assert row["rank_cpu_threads"] == 16
