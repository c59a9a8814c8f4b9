"""Measured `auto` levers decided once per machine: the lever trial's decision cache (job/lever_trial.py), the
candidates a trial leaves out, and what `auto_levers.by: auto` resolves to on each platform. No candidate trains
here (the launcher is replaced by one that returns a summary); the default study's measured trials run for real in
test_outputs."""
from __future__ import annotations

import json
import types

import pytest
import yaml
from conftest import REPO

from workflow_scripts import study
from workflow_scripts.job import lever_trial
from workflow_scripts.status import RunStatus
from workflow_scripts.training import levers
from workflow_scripts.training.layout import Layout


def config(tmp_path, platform="cpu", **changes) -> dict:
    from snakemake.utils import update_config

    from workflow_scripts import config_check

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    update_config(cfg, {"platform": platform, "results_dir": str(tmp_path / "r"), "work_dir": str(tmp_path / "w"),
                        "auto_levers": {"cache": str(tmp_path / "cache")}})
    update_config(cfg, changes)
    config_check.validate_study(cfg, str(REPO / "schemas/config.schema.yaml"), planning=True)
    return cfg


def plan_file(cfg, tmp_path, name="plan.json", model="gpt2-tiny", strategy="ddp", world=2, overrides=None) -> str:
    """The trial file rule lever_trial reads (rules/common.smk lever_trial_plan)."""
    plan = study.lever_trial_specs(cfg, model, strategy, Layout.data_parallel(world), overrides or {}, [])
    path = tmp_path / name
    path.write_text(json.dumps({**plan, "specs": {k: s.to_dict() for k, s in plan["specs"].items()}}))
    return str(path)


SPEED = {"eager": 1000.0, "loss": 1500.0, "blocks": 1200.0, "model": 1300.0}


@pytest.fixture
def launches(monkeypatch):
    """Every candidate the trial launches, each finishing at its SPEED."""
    started = []

    def launch(spec):
        name = spec.out_dir.rsplit("/", 1)[1]
        started.append(name)
        return {"status": RunStatus.OK, "tokens_per_s": SPEED[name], "mfu": None, "peak_allocated_bytes": 2**30,
                "final_loss": 5.0}

    monkeypatch.setattr(lever_trial, "run_launcher", launch)
    return started


def test_a_second_trial_of_the_same_shape_launches_nothing_and_decides_the_same(tmp_path, launches):
    cfg = config(tmp_path, auto_levers={"candidates": ["eager", "loss", "model_graphs"]})
    first = lever_trial.decide(plan_file(cfg, tmp_path))
    assert launches == ["eager", "loss"] and first["chosen"] == "loss"  # 1500 > 1000 tokens/s
    assert first["why"].startswith("measured: loss fastest") and first["cache"]["hit"] is False
    # another study (other results, other steps and seed) of the same shape on this machine
    other = config(tmp_path / "b", auto_levers={"candidates": ["eager", "loss", "model_graphs"], "steps": 3,
                                               "cache": cfg["auto_levers"]["cache"]},
                   train={"seed": 7, "max_steps": 50})
    second = lever_trial.decide(plan_file(other, tmp_path, "second.json"))
    assert launches == ["eager", "loss"]  # no candidate launched again
    assert second["chosen"] == "loss" and second["chosen_train"] == first["chosen_train"]
    assert second["why"].startswith(f"measured: loss (cached: {first['cache']['key'][:12]}, measured on cpu: ")
    assert "eager 1,000, loss 1,500" in second["why"] and second["cache"]["measured_why"] == first["why"]
    assert second["candidates"] == first["candidates"] and second["decided_s"] < 1.0
    # the run reads the cached decision as it reads a measured one
    out = tmp_path / "levers.json"
    out.write_text(json.dumps(second))
    applied = levers.apply_trial({"compile_blocks": "auto", "compile_loss": "auto", "lever_trial": str(out)})
    assert applied["compile_loss"] is True and applied["compile_blocks"] is False
    assert "cached" in applied["compile_auto"]


def test_another_micro_batch_or_other_versions_or_device_is_another_decision(tmp_path, launches):
    cfg = config(tmp_path, auto_levers={"candidates": ["eager", "loss"]})
    lever_trial.decide(plan_file(cfg, tmp_path))
    assert launches == ["eager", "loss"]
    lever_trial.decide(plan_file(cfg, tmp_path, "mb4.json", overrides={"micro_batch_size": 4}))
    assert launches == ["eager", "loss"] * 2  # measured again
    shape = json.loads((tmp_path / "plan.json").read_text())["shape"]
    facts = lever_trial.machine("cpu")
    code = lever_trial.training_code()
    key = lever_trial.decision_key(shape, facts, code)
    for change in ({"torch": "0.0.1"}, {"deepspeed": "0.0.1"}, {"transformers": "0.0.1"},
                   {"accelerator": "cuda 99.0"}, {"device": "another CPU"}):
        assert lever_trial.decision_key(shape, {**facts, **change}, code) != key, change
    assert lever_trial.decision_key(shape, facts, "another training code") != key
    assert lever_trial.cached(lever_trial.cache_dir(cfg["auto_levers"]["cache"]), key) is not None
    gpu = lever_trial.machine("cuda")  # read in a child process: here no GPU, torch's CUDA build none
    assert gpu["accelerator"].startswith("cuda ") and gpu["device"] != facts["device"]
    # precision, checkpointing, sequence, layout: each its own shape
    for name, changes in (("bf16", {"train": {"precision": "bf16-mixed"}}),
                          ("ckpt", {"train": {"gradient_checkpointing": True}}),
                          ("seq", {"data": {"block_size": 64}})):
        other = json.loads((tmp_path / "plan.json").read_text())["shape"]
        again = json.loads(open(plan_file(config(tmp_path / name, **changes), tmp_path, f"{name}.json")).read())
        assert again["shape"] != other, name
    assert lever_trial.cache_dir("off") is None


def test_a_trial_records_the_candidates_it_leaves_out_and_why(tmp_path, launches):
    """On CPU CUDA graphs cannot run; gpt2-tiny's block call (2 x 12 x 128^2 weights x 8 x 128 tokens = 4.0e8
    FLOP) is far below MIN_BLOCK_FLOPS: compiled blocks cannot win; on a GPU at GPT-2-medium micro-batch 4 (2 x 12
    x 1024^2 x 4 x 1024 = 1.0e11) neither, at 16 (4.1e11) they run."""
    cfg = config(tmp_path)
    result = lever_trial.decide(plan_file(cfg, tmp_path))
    assert launches == ["eager", "loss", "model"]
    assert result["skipped"]["model_graphs"] == "CUDA graphs need a GPU"
    assert result["skipped"]["blocks"].startswith("4.0e+08 FLOP per block call < 2e+11")
    assert "blocks not run (4.0e+08 FLOP" in result["why"]
    gpu = config(tmp_path, platform="cuda", world_sizes=[1], models=["gpt2-medium"], data={"block_size": 1024})
    mb4 = study.lever_trial_specs(gpu, "gpt2-medium", "zero2", Layout.data_parallel(1), {"micro_batch_size": 4}, [])
    # on a GPU what the committed measurements say cannot win is left out too: host-bound, the whole model with
    # CUDA graphs alone (eager and the loss alone lost to it), the model without graphs behind it; GEMM-bound,
    # compiled blocks alone (the whole model lost to them there)
    assert list(mb4["specs"]) == ["model", "model_graphs"] and "1.0e+11" in mb4["skipped"]["blocks"]
    assert "CUDA graphs" in mb4["skipped"]["loss"] and "CUDA graphs" in mb4["skipped"]["eager"]
    mb16 = study.lever_trial_specs(gpu, "gpt2-medium", "zero2", Layout.data_parallel(1), {"micro_batch_size": 16},
                                   [])
    assert list(mb16["specs"]) == ["blocks"] and set(mb16["skipped"]) == {"eager", "loss", "model", "model_graphs"}
    assert "4.1e+11 FLOP per block call" in mb16["skipped"]["model"]
    # sharded and offloading strategies: the rule's measurements were not made there, so every candidate runs (the
    # whole model without graphs only if the graphs fail: job/lever_trial.trial)
    for strategy in ("zero3", "zero3_offload", "zero2_offload", "fsdp"):
        other = study.lever_trial_specs(gpu, "gpt2-medium", strategy, Layout.data_parallel(1),
                                        {"micro_batch_size": 4}, [])
        assert list(other["specs"]) == ["eager", "loss", "blocks", "model", "model_graphs"], strategy
        assert other["skipped"] == {}, strategy


def test_one_candidate_left_is_chosen_by_rule_without_a_launch(tmp_path, launches):
    """On a GPU at GPT-2-medium micro-batch 4 (host-bound) only the whole model with CUDA graphs can win, the model
    without graphs behind it: nothing to compare, so no candidate launches and the verdict names the fallback; a
    run's settings then come from it, and after a failure from the fallback (levers.apply_fallback). At micro-batch
    16 compiled blocks are left alone, by rule too; where the candidates leave a choice (eager against the whole
    model without graphs) the trial measures."""
    gpu = config(tmp_path, platform="cuda", world_sizes=[1], models=["gpt2-medium"], data={"block_size": 1024})
    plan = plan_file(gpu, tmp_path, model="gpt2-medium", strategy="zero2", world=1,
                     overrides={"micro_batch_size": 4})
    result = lever_trial.decide(plan)
    assert launches == [] and result["by"] == "rule" and result["candidates"] == []
    assert result["chosen"] == "model_graphs" and result["fallback"] == "model"
    assert result["why"].startswith("rule: model_graphs, the one candidate that can win here, no trial launched; "
                                    "model if it fails in the run; ")
    assert result["decided_s"] < 1.0
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps(result))
    train = {"seed": 1, "lever_trial": str(verdict)}
    assert levers.apply_trial(train)["compile_mode"] == "reduce-overhead"
    behind = levers.apply_fallback(train)
    assert behind["compile_model"] is True and behind["compile_mode"] == "default" and "lever_trial" not in behind
    assert behind["compile_auto"].endswith("; model_graphs failed in this run, model")
    mb16 = plan_file(gpu, tmp_path, "mb16.json", model="gpt2-medium", strategy="zero2", world=1,
                     overrides={"micro_batch_size": 16})
    assert lever_trial.by_rule(*lever_trial.read_trial(mb16))["chosen"] == "blocks"
    choice = config(tmp_path, platform="cuda", world_sizes=[1], models=["gpt2-medium"], data={"block_size": 1024},
                    auto_levers={"candidates": ["eager", "model"]})
    measured = plan_file(choice, tmp_path, "choice.json", model="gpt2-medium", strategy="zero2", world=1,
                         overrides={"micro_batch_size": 4})
    assert lever_trial.by_rule(*lever_trial.read_trial(measured)) is None


def test_a_candidate_is_ranked_by_its_median_step_not_one_slow_step(monkeypatch):
    """Two candidates of 8 timed steps of 4096 tokens: `model` runs 7 steps at 40 ms and one at 1.2 s (mean 4096 x 8
    / 1.48 s = 22,141 tokens/s, median 40 ms: 102,400), `blocks` every step at 50 ms (81,920): `model` is chosen,
    at its median pace, its mean and MFU kept beside it (MFU 0.05 at the mean is 0.05 x 102,400 / 22,141 = 0.231
    at the pace)."""
    runs = {"model": (8 * 4096 / 1.48, 0.040), "blocks": (81920.0, 0.050)}

    def launch(spec):
        mean, median = runs[spec.out_dir.rsplit("/", 1)[1]]
        return {"status": RunStatus.OK, "tokens_per_s": mean, "step_time_median_s": median, "tokens_per_step": 4096,
                "mfu": 0.05}

    monkeypatch.setattr(lever_trial, "run_launcher", launch)
    specs = {name: types.SimpleNamespace(out_dir=f"/nonexistent/{name}") for name in ("model", "blocks")}
    result = lever_trial.trial(specs, {})
    a, b = result["candidates"]
    assert result["chosen"] == "model" and a["tokens_per_s"] == pytest.approx(102400)
    assert a["mean_tokens_per_s"] == pytest.approx(22141, abs=1) and a["mfu"] == pytest.approx(0.231, abs=5e-4)
    assert b["tokens_per_s"] == pytest.approx(81920)


def test_the_model_without_graphs_runs_only_where_the_graphs_fail(tmp_path, monkeypatch):
    """levers.FALLBACK: the whole model compiled without CUDA graphs is launched after model_graphs, and only if
    that did not finish; the verdict says why it was not run."""
    gpu = config(tmp_path, platform="cuda", world_sizes=[1], models=["gpt2-medium"], data={"block_size": 1024})
    specs = study.lever_trial_specs(gpu, "gpt2-medium", "ddp", Layout.data_parallel(1), {"micro_batch_size": 4},
                                    [])["specs"]
    for graphs_ok, launched, chosen in ((True, ["model_graphs"], "model_graphs"),
                                        (False, ["model_graphs", "model"], "model")):
        started = []

        def launch(spec, graphs_ok=graphs_ok, started=started):
            name = spec.out_dir.rsplit("/", 1)[1]
            started.append(name)
            ok = graphs_ok or name != "model_graphs"
            return {"status": RunStatus.OK if ok else RunStatus.FAILED, "tokens_per_s": 3000.0 if ok else None,
                    "reason": None if ok else "graphs overwritten"} if name != "eager" else \
                {"status": RunStatus.OK, "tokens_per_s": 1000.0}

        monkeypatch.setattr(lever_trial, "run_launcher", launch)
        result = lever_trial.trial(specs, {})
        assert started == launched and result["chosen"] == chosen, graphs_ok
    assert "model_graphs failed" in result["why"]
    # graphs that hit dynamo's recompile limit: the model without them recompiles the same frames, so it is not run
    started = []

    def recompiles(spec):
        name = spec.out_dir.rsplit("/", 1)[1]
        started.append(name)
        if name == "model_graphs":
            return {"status": RunStatus.FAILED, "reason": "hit dynamo's recompile limit (...)", "recompile_limit": True}
        return {"status": RunStatus.OK, "tokens_per_s": 1000.0}

    monkeypatch.setattr(lever_trial, "run_launcher", recompiles)
    result = lever_trial.trial(specs, {})
    assert started == ["model_graphs"] and result["chosen"] == "eager"
    assert "recompile limit" in result["skipped"]["model"] and result["candidates"][0]["recompile_limit"] is True


def test_auto_measures_on_one_gpu_node_and_keeps_the_rule_on_cpu(tmp_path):
    schema = yaml.safe_load((REPO / "schemas/config.schema.yaml").read_text())["properties"]["auto_levers"]
    assert schema["properties"]["by"]["default"] == "auto"
    assert levers.decided_by({}, "cpu") == "rule"
    assert levers.decided_by({}, "cuda") == levers.decided_by({"by": "auto"}, "rocm") == "measurement"
    assert levers.decided_by({"by": "auto"}, "cuda", nodes=2) == "rule"  # the trial runs on one node
    assert levers.decided_by({"by": "rule"}, "cuda") == "rule"
    assert levers.decided_by({"by": "measurement"}, "cpu") == "measurement"
    # offloading strategies: eager by the rule (their trials chose eager), measured only where the study asks
    assert levers.decided_by({}, "cuda", evidence="offload") == "rule"
    assert levers.decided_by({"by": "measurement"}, "cuda", evidence="offload") == "measurement"
    # a study's run specs: on CPU the rule's decision, no trial; on cuda the trial's file
    cpu = study.resolve(config(tmp_path), "gpt2-tiny", "ddp", 2, 0, {}, "o", "w", [], measured=True)
    assert cpu.train["compile_blocks"] is False and "lever_trial" not in cpu.train
    gpu = study.resolve(config(tmp_path, platform="cuda", world_sizes=[1]), "gpt2-tiny", "ddp", 1, 0, {}, "o", "w",
                        [], measured=True)
    assert gpu.train["lever_trial"].endswith("levers/gpt2-tiny/ddp/ws1.json")
    offload = study.resolve(config(tmp_path, platform="cuda", world_sizes=[1]), "gpt2-tiny", "zero3_offload", 1, 0,
                            {}, "o", "w", [], measured=True)
    assert "lever_trial" not in offload.train and offload.train["compile_blocks"] is False
    assert "offload strategies" in offload.train["compile_auto"]
    ruled = config(tmp_path, platform="cuda", world_sizes=[1], auto_levers={"by": "rule"})
    assert "lever_trial" not in study.resolve(ruled, "gpt2-tiny", "ddp", 1, 0, {}, "o", "w", [], measured=True).train


def test_every_run_compiles_into_the_machines_inductor_and_triton_caches(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")  # one the environment names stays
    from workflow_scripts.job.launch import environment

    spec = study.resolve(config(tmp_path), "gpt2-tiny", "ddp", 2, 0, {}, "o", "w", [])
    env = environment(spec)  # the ranks' environment, set before torch starts in them
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor") and env["TRITON_CACHE_DIR"] == "/elsewhere"


def test_a_run_falls_back_once_when_levers_chosen_by_rule_fail(token_data, tmp_path):
    """A verdict by rule (no trial launched) names a fallback; the run's chosen levers fail (here a compile mode
    torch refuses, where on a GPU CUDA graphs can fail) and the launcher trains it once more with the fallback:
    the job succeeds, the row says what failed and what ran."""
    import subprocess
    import sys

    from conftest import launch_spec

    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({
        "chosen": "model_graphs", "why": "rule: model_graphs, the one candidate that can win here",
        "chosen_train": {**levers.CANDIDATES["model_graphs"], "compile_mode": "no-such-mode"},
        "by": "rule", "candidates": [], "skipped": {}, "fallback": "eager",
        "fallback_train": levers.CANDIDATES["eager"]}))
    spec = launch_spec(token_data, tmp_path, "fb", world_size=1, train={"max_steps": 2, "lever_trial": str(verdict)})
    done = subprocess.run([sys.executable, "-m", "workflow_scripts.job.launch", "--spec", str(spec)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "launch: the levers failed (exit code 1); again with eager" in done.stdout
    summary = json.loads((tmp_path / "fb/out/summary.json").read_text())
    assert summary["status"] == "ok" and summary["compile_model"] is False
    assert summary["compile_auto"] == ("rule: model_graphs, the one candidate that can win here; model_graphs "
                                       "failed in this run, eager")


def test_a_compiled_region_past_the_recompile_limit_stops_the_run_and_auto_goes_again_eager(tmp_path, monkeypatch):
    """Past dynamo's recompile limit a compiled region would run eager from then on, slower and silent: with the
    levers' setting a real dynamo raises instead (here a function recompiled for a third dtype under a limit of 2),
    the error is recognised through its chain, and the launcher trains an `auto`-decided run once more eager with
    `compile_auto` saying what failed; a study's own forced levers get no second attempt."""
    import torch

    from workflow_scripts import columns as C
    from workflow_scripts.job import launch as launcher

    levers.stop_at_recompile_limit()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    f = torch.compile(lambda x: x * 2 + 1, backend="eager")
    with pytest.raises(Exception) as caught:
        for dtype in (torch.float32, torch.float64, torch.int32):
            try:
                f(torch.ones(3, dtype=dtype))
            except Exception as exc:
                raise RuntimeError("a rank's step failed") from exc
    torch._dynamo.reset()
    hit = levers.recompile_limit_hit(caught.value)
    assert hit and hit.startswith("FailOnRecompileLimitHit")
    assert levers.recompile_limit_hit(RuntimeError("another failure")) is None

    tried = []

    def once(spec, *args):
        tried.append(dict(spec.train))
        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
        if len(tried) == 1:  # the first attempt's rank recorded the hit
            (out / C.RECOMPILE_MARKER.format(rank=0)).write_text(json.dumps({"rank": 0, "error": hit}))
            return 1
        for marker in out.glob("recompile_limit_rank*.json"):  # launch_once clears them before the ranks start
            marker.unlink()
        return 0

    monkeypatch.setattr(launcher, "launch_once", once)
    spec = study.resolve(config(tmp_path), "gpt2-tiny", "ddp", 1, 0, {}, str(tmp_path / "out"), "w", [])
    auto = spec.replace(train={**spec.train, **levers.CANDIDATES["model_graphs"],
                               "compile_auto": "rule: model_graphs"})
    assert launcher.launch(auto) == 0 and len(tried) == 2
    again = tried[1]
    assert {k: again[k] for k in levers.TRIAL_KEYS} == levers.CANDIDATES["eager"]
    assert again["compile_auto"] == (f"rule: model_graphs; graphs hit dynamo's recompile limit in this run ({hit}), "
                                     "eager")
    tried.clear()
    own = {k: v for k, v in spec.train.items() if k != "compile_auto"}  # no compile_auto: the study chose
    forced = spec.replace(train={**own, **levers.CANDIDATES["model"]})
    assert launcher.launch(forced) == 1 and len(tried) == 1


def test_a_step_the_optimizer_fills_leaves_the_compiled_candidates_out(tmp_path, monkeypatch):
    """ZeRO-Infinity's eager step on one H200: 0.35 s forward, 0.74 s backward, 15.1 s in all (Adam through NVMe):
    compiled levers act on 7 % of it, under the default 10 %: once eager has run, nothing else is launched. At
    ZeRO-3 offload's 0.22 + 0.37 of 1.19 s (49 %) every candidate runs."""
    gpu = config(tmp_path, platform="cuda", world_sizes=[1], models=["gpt2-medium"], data={"block_size": 1024})
    plan = study.lever_trial_specs(gpu, "gpt2-medium", "zero_infinity", Layout.data_parallel(1),
                                   {"micro_batch_size": 4}, [])
    assert plan["min_compiled_share"] == 0.1  # the schema's default
    for (fwd, bwd, step), launched in (((0.354, 0.737, 15.117), ["eager"]),
                                       ((0.224, 0.365, 1.192), ["eager", "loss", "blocks", "model_graphs"])):
        started = []

        def launch(spec, fwd=fwd, bwd=bwd, step=step, started=started):
            started.append(spec.out_dir.rsplit("/", 1)[1])
            return {"status": RunStatus.OK, "tokens_per_s": 2048 / step, "forward_median_s": fwd,
                    "backward_median_s": bwd, "step_time_median_s": step}

        monkeypatch.setattr(lever_trial, "run_launcher", launch)
        result = lever_trial.trial(plan["specs"], plan["skipped"], plan["min_compiled_share"])
        assert started == launched, started
        if launched == ["eager"]:
            assert result["chosen"] == "eager" and "7% of its step" in result["skipped"]["blocks"]


def test_the_whole_model_is_left_out_where_it_was_measured_to_hit_the_recompile_limit(tmp_path, monkeypatch):
    """ZeRO-3 and its offloads on gpt2 with torch 2.11 and DeepSpeed 0.19.8 recompiled DeepSpeed's stage-3 hook past
    dynamo's limit under the whole-model compile (one H200): with those versions the trial launches neither whole-model
    candidate and says why; with another DeepSpeed they run; a DDP trial never reads the machine for it."""
    gpu = config(tmp_path, platform="cuda", world_sizes=[1], models=["gpt2-medium"], data={"block_size": 1024},
                 auto_levers={"cache": "off"})
    asked, versions = [], {}

    def machine(platform, world_size=1):
        asked.append(platform)
        return {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "transformers": "5.0.0", "python": "3.12.3",
                "accelerator": "cuda 13.0", **versions}

    monkeypatch.setattr(lever_trial, "machine", machine)
    for strategy, deepspeed, expected in (
            ("zero3_offload", "0.19.8", ["eager", "loss", "blocks"]),
            ("zero3", "0.19.8", ["eager", "loss", "blocks"]),
            ("zero3_offload", "0.20.0", ["eager", "loss", "blocks", "model_graphs"]),
            ("ddp", "0.19.8", None)):
        versions["deepspeed"] = deepspeed
        started = []

        def launch(spec, started=started):
            started.append(spec.out_dir.rsplit("/", 1)[1])
            return {"status": RunStatus.OK, "tokens_per_s": 1000.0}

        monkeypatch.setattr(lever_trial, "run_launcher", launch)
        path = plan_file(gpu, tmp_path, f"{strategy}-{deepspeed}.json", model="gpt2-medium", strategy=strategy,
                         world=1, overrides={"micro_batch_size": 4})
        result = lever_trial.decide(path)
        if expected is None:  # DDP: the rule's own pruning, nothing about the recompile limit
            assert not any("recompiled" in why for why in result["skipped"].values())
            continue
        assert started == expected, (strategy, deepspeed, started)
        if "model_graphs" not in expected:
            for name in ("model", "model_graphs"):
                assert "DeepSpeed's stage-3 backward hook past dynamo's limit" in result["skipped"][name]
                assert "DeepSpeed 0.19.8" in result["skipped"][name]
    assert asked == ["cuda", "cuda", "cuda"]  # the versions read for the DeepSpeed stage-3 trials only


def test_eager_runs_first_whatever_the_trial_files_key_order(tmp_path, monkeypatch):
    """The rule writes the trial file with sorted keys (blocks before eager); ZeRO-Infinity's trial on one H200 then
    ran compiled blocks for 187 s before eager showed its forward and backward at 7 % of the step. Read through the
    file, eager runs first and the share bound leaves every other candidate out."""
    gpu = config(tmp_path, platform="cuda", world_sizes=[1], models=["gpt2-medium"], data={"block_size": 1024},
                 auto_levers={"cache": "off"})
    monkeypatch.setattr(lever_trial, "machine", lambda platform, world_size=1: {"torch": "2.13.0", "deepspeed": "0"})
    plan = study.lever_trial_specs(gpu, "gpt2-medium", "zero_infinity", Layout.data_parallel(1),
                                   {"micro_batch_size": 4}, [])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**plan, "specs": {k: s.to_dict() for k, s in plan["specs"].items()}}, sort_keys=True))
    assert next(iter(json.loads(path.read_text())["specs"])) == "blocks"  # as the rule writes it
    started = []

    def launch(spec):
        started.append(spec.out_dir.rsplit("/", 1)[1])
        return {"status": RunStatus.OK, "tokens_per_s": 135.0, "forward_median_s": 0.354,
                "backward_median_s": 0.737, "step_time_median_s": 15.117}

    monkeypatch.setattr(lever_trial, "run_launcher", launch)
    result = lever_trial.decide(str(path))
    assert started == ["eager"] and result["chosen"] == "eager"


def test_a_graph_break_in_the_compiled_region_is_counted_with_its_reason_and_said_in_compile_auto():
    """A compiled function that breaks at a print (in a process of its own: dynamo's counters and config are the
    process's): one break and its reason's first line, and the row's compile_auto says so after why the levers were
    chosen; no break, nothing added."""
    import subprocess
    import sys

    script = ("import json, torch\n"
              "from workflow_scripts.training import levers\n"
              "def step(x):\n"
              "    y = x * 2\n"
              "    print('a host call dynamo cannot trace')\n"
              "    return y + 1\n"
              "torch.compile(step, backend='eager')(torch.ones(3))\n"
              "print(json.dumps(levers.dynamo_counters()))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    counted = json.loads(done.stdout.strip().splitlines()[-1])
    assert counted["dynamo_graph_breaks"] == 1
    assert counted["dynamo_graph_break_reason"] == "Failed to trace builtin operator"
    assert levers.said_with_breaks("rule: blocks", counted) == (
        "rule: blocks; 1 graph break in the compiled region (Failed to trace builtin operator)")
    assert levers.said_with_breaks(None, counted).startswith("1 graph break in")
    clean = {**counted, "dynamo_graph_breaks": 0, "dynamo_graph_break_reason": None}
    assert levers.said_with_breaks("rule: blocks", clean) == "rule: blocks"
