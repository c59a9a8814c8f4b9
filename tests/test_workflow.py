"""The workflow as a user runs it: lint, dry run, bad input refused before any job, and the default study end to
end (every strategy has a row, losses go down, DDP / ZeRO-0 / ZeRO-1 agree, figures and report exist)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, assert_default_study_losses, copy_workflow, overlay, reuse_calibration, snakemake

STRATEGIES = yaml.safe_load((REPO / "config.yaml").read_text())["strategies"]


def test_lint_is_clean(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    done = snakemake(wd, "--lint", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Lints for" not in done.stdout + done.stderr


def test_snakemake_files_are_snakefmt_clean():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "snakefmt", "--check", "Snakefile", "rules/"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def files_of(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")
            if p.is_file() and ".snakemake" not in p.parts}


def test_dry_run_plans_every_stage_without_torch_and_changes_no_file(tmp_path):
    """The parse (every -n, lint, report and SLURM job) imports no torch: a `torch` that cannot be imported is
    first on the path. It writes nothing outside Snakemake's own .snakemake folder."""
    wd = copy_workflow(tmp_path / "wf")
    (tmp_path / "notorch/torch").mkdir(parents=True)
    (tmp_path / "notorch/torch/__init__.py").write_text("raise ImportError('torch imported by the parse')\n")
    before = files_of(wd)
    out = snakemake(wd, "-n", "--quiet", "rules", env={"PYTHONPATH": str(tmp_path / "notorch")}).stdout
    assert files_of(wd) == before
    counts = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()
              if len(line.split()) == 2 and line.split()[1].isdigit()}
    assert counts["train"] == len(STRATEGIES)
    for rule in ("corpus", "tokenizer", "tokenize", "parse", "figures", "summary_table", "all"):
        assert counts[rule] == 1, rule


BAD_CONFIGS = [
    ({"strategies": ["ddp", "zero9"]}, "strategies: unknown strategy 'zero9'"),
    ({"models": ["gpt5"]}, "models: unknown model 'gpt5'"),
    ({"world_sizes": [64]}, "world_sizes: 64 ranks per node"),
    ({"corpus": {"source": "local", "local": {"paths": ["missing/*.txt"]}}}, "corpus.local.paths: no file matches"),
    ({"layouts": [{"dp": 1, "tp": 3}]}, "layouts[0].tp: 3 does not divide gpt2-tiny's 4 attention heads"),
    ({"layouts": [{"dp": 1, "cp": 2}]}, "layouts[0].cp: 2, but gpt2-tiny (gpt2) has no Ulysses attention"),
    ({"layouts": [{"dp": 1, "cp": 3}], "strategies": ["fsdp"]}, "layouts[0].cp: 3 does not divide data.block_size"),
    ({"verify": {"against": "results/nowhere"}}, "verify.against: results/nowhere has no tables/runs.csv"),
    ({"layouts": [{"dp": 1, "tp": 2}]}, "layouts[0].tp: 2, but gpt2-tiny (gpt2) has no tensor-parallel plan"),
    ({"layouts": [{"dp": 1, "pp": 2}]}, "layouts[0].pp: 2 stages need train.grad_accum (the pipeline's micro-batches)"),
    ({"layouts": [{"dp": 1, "pp": 2}], "train": {"grad_accum": 2}}, "layouts[0]: dp1-pp2 with strategy zero0"),
    ({"layouts": [{"dp": 2, "ep": 2}]}, "layouts[0].ep: 2, but gpt2-tiny has no experts"),
    ({"groups": [{"models": ["gpt2-tiny"], "strategies": ["ddp"]},
                 {"models": ["gpt2-tiny"], "strategies": ["zero2"], "train": {"precision": "bf16-pure"}}]},
     "groups[1].train.precision: gpt2-tiny trains under bf16-pure here and fp32 in groups[0]"),
    ({"strategy_options": {"ddp_overlap": {"bucket_cap": 100}}},
     "strategy_options.ddp_overlap.bucket_cap: unknown key, did you mean bucket_cap_mb?"),
    ({"strategy_options": {"zero2": {"check_grad_overflow": False}}},
     "strategy_options.zero2.check_grad_overflow: DeepSpeed has a bf16 section only under bf16-pure, but "
     "train.precision is fp32"),
    ({"strategy_options": {"zero1": {"foreach_grad_norm": "yes"}}},
     "strategy_options.zero1.foreach_grad_norm: expected true or false, got 'yes'"),
    ({"strategy_options": {"zero3": {"memory_efficient_linear": True}}, "train": {"compile_blocks": True}},
     "strategy_options.zero3.memory_efficient_linear: True traces DeepSpeed's own linear into the code that "
     "train.compile_blocks compiles"),
    ({"strategy_options": {"grad_accum": {"accum_steps": 3}}},  # grad_accum's accumulation rule, in the strategy
     "strategy_options.grad_accum.accum_steps: 3 must divide train.micro_batch_size x grad_accum = 8"),
    ({"profile": {"enabled": True, "wait": 2}}, "profile.wait: 2 places a window after the timing warm-up"),
]
# a strategy's options (DeepSpeed's against its own config models, DeepSpeedZeroConfig and its offload models) and
# strategy names: a short error, the closest valid name for a typo (DeepSpeed's own error is 159 lines at run time)
STRATEGY_TYPOS = [
    ({"strategy_options": {"zero2": {"reduce_bucket_sise": 5}}},
     "strategy_options.zero2.reduce_bucket_sise: unknown key, did you mean reduce_bucket_size?"),
    ({"strategy_options": {"zero2_offload": {"offload_optimizer": {"device": "cpu", "devise": "cpu"}}}},
     "strategy_options.zero2_offload.offload_optimizer.devise: unknown key, did you mean device?"),
    ({"strategy_options": {"zero3": {"reduce_bucket_size": "big"}}},
     "strategy_options.zero3.reduce_bucket_size: input should be a valid integer, unable to parse string as an "
     "integer, got 'big'"),
    ({"strategy_options": {"ddp_overlap": {"static_graf": True}}},
     "strategy_options.ddp_overlap.static_graf: unknown key, did you mean static_graph?"),
    ({"strategies": ["ddp", "zero_2"]}, "strategies: unknown strategy 'zero_2', did you mean zero2?"),
    ({"strategy_options": {"zero1": {"compile": {"deepcompil": True}}}},
     "strategy_options.zero1.compile.deepcompil: unknown key, did you mean deepcompile?"),
    ({"strategy_options": {"zreo2": {"overlap_comm": True}}},
     "strategy_options.zreo2: no such strategy, did you mean zero2?"),
]
BAD_CONFIGS += STRATEGY_TYPOS


def config_error(override: dict) -> str:
    """What the workflow's config check (config_check.validate_study, as rules/common.smk runs it) says of
    config.yaml with `override` merged in as a second --configfile is, in this process; "" if nothing."""
    from snakemake.utils import update_config

    from workflow_scripts import config_check

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    update_config(config, override)
    try:
        config_check.validate_study(config, str(REPO / "schemas/config.schema.yaml"))
    except config_check.ConfigError as exc:
        return str(exc)
    return ""


# lowest first: a package imports only those before it (the house's arrows all point down)
LAYERS = ["units", "status", "schema", "columns", "run_spec", "data", "measure", "training", "replay", "study",
          "config_check", "importers", "plan", "job", "report", "doctor", "container_image", "bench"]


def test_no_package_imports_upward_and_the_strategies_never_import_the_context_builder():
    import ast

    root = REPO / "workflow_scripts"
    upward = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        here = parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                target = name.split(".")[1] if name.startswith("workflow_scripts.") else None
                if target in LAYERS and here in LAYERS and LAYERS.index(target) > LAYERS.index(here):
                    upward.append(f"{'/'.join(parts)} -> {name}")
                if parts[:2] == ("training", "strategies") and name == "workflow_scripts.training.context":
                    upward.append(f"{'/'.join(parts)} -> {name} (a circle through the registry)")
    assert not upward, upward
    assert set(LAYERS) >= {p.stem if p.is_file() else p.name for p in root.iterdir()
                           if not p.name.startswith("_") and (p.is_dir() or p.suffix == ".py")}


@pytest.mark.parametrize("override, named", BAD_CONFIGS)
def test_bad_config_is_one_error_naming_the_key(override, named):
    found = config_error(override)
    assert named in found and found.count("invalid study config") == 1
    if (override, named) in STRATEGY_TYPOS:
        assert len(found.splitlines()) <= 10, found


@pytest.mark.parametrize("override, named", [BAD_CONFIGS[i] for i in (0, 4, 13)])
def test_bad_config_stops_snakemake_before_any_job(tmp_path, override, named):
    """The same check, as a user meets it: one error from `snakemake -n`, no job started."""
    wd = copy_workflow(tmp_path / "wf")
    (wd / "bad.yaml").write_text(yaml.safe_dump(override))
    done = snakemake(wd, "-n", "--configfile", "config.yaml", "bad.yaml", check=False)
    assert done.returncode != 0
    assert named in done.stderr + done.stdout
    assert (done.stderr + done.stdout).count("invalid study config") == 1, "one error"
    assert not (wd / "work").exists(), "no job may start"


def test_deepspeed_bf16_options_reach_its_bf16_section_and_need_bf16_pure():
    """check_grad_overflow (the ZeRO-1/2 lever of BENCHMARKS.md) goes into DeepSpeed's bf16 section; a run without
    one (fp32, bf16-mixed) is refused before any job, naming the option and the precision key."""
    import torch

    from workflow_scripts.training.layout import Layout
    from workflow_scripts.training.precision import policy
    from workflow_scripts.training.run_context import RunContext
    from workflow_scripts.training.strategies import STRATEGIES as ALL

    def ds_json(precision, strategy="zero2", **options):
        ctx = RunContext(rank=0, local_rank=0, local_world_size=1, device=torch.device("cpu"), platform="cpu",
                         layout=Layout(dp=1), precision=policy(precision), micro_batch=4, accum=1, lr=1e-3,
                         weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8, grad_clip=1.0, seed=0, work_dir="/tmp",
                         options={"check_grad_overflow": False, "reduce_bucket_size": 1000, **options})
        return ALL[strategy].settings(ctx)["deepspeed_config"]

    cfg = ds_json("bf16-pure")
    assert cfg["bf16"] == {"enabled": True, "check_grad_overflow": False}
    assert "check_grad_overflow" not in cfg["zero_optimization"] and cfg["zero_optimization"]["reduce_bucket_size"]
    with pytest.raises(ValueError,
                       match=r"strategy_options.zero2.check_grad_overflow: .* this run's train.precision is fp32"):
        ds_json("fp32")
    assert config_error({"strategy_options": {"zero2": {"check_grad_overflow": False}},
                         "train": {"precision": "bf16-pure"}}) == ""
    # quantized weights (ZeRO++'s default, or set on zero3): DeepSpeed's bf16 mode under bf16-mixed too, one rule
    # (Strategy.engine_precision) for the engine's JSON, the check and the memory model
    quantized = {"zero_quantized_weights": True}
    for strategy, options in (("zeropp", {}), ("zero3", quantized)):
        assert ALL[strategy].engine_precision("bf16-mixed", options) == "bf16-pure"
        cfg = ds_json("bf16-mixed", strategy, **options)
        assert cfg["bf16"]["check_grad_overflow"] is False and "torch_autocast" not in cfg
        assert config_error({"strategy_options": {strategy: {**options, "check_grad_overflow": False}},
                             "train": {"precision": "bf16-mixed"}}) == ""
    assert ALL["zero3"].engine_precision("bf16-mixed", {}) == "bf16-mixed"


def test_zero_gradient_norm_in_multi_tensor_launches_is_deepspeeds_on_every_rank():
    """ZeRO-1/2/3's gradient norm through torch._foreach_norm (strategy option foreach_grad_norm, on by default) is
    bit for bit DeepSpeed's per-tensor one, on two ranks each holding its partition (bf16-pure: DeepSpeed's bf16
    optimizer; the default study's runs check the fp32 engine's through their losses), and the run records which
    one it used; the option is ours: it never reaches DeepSpeed."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(REPO / "tests/fixtures/ranks/grad_norm.py"), "bf16-pure"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert {(r["rank"], r["strategy"]) for r in rows} == {(k, z) for k in (0, 1) for z in ("zero1", "zero2", "zero3")}
    for r in rows:
        assert r["foreach"] == r["deepspeed"] > 0, r
        assert r["grad_norm"].startswith("torch._foreach_norm"), r
    from workflow_scripts.training.strategies import STRATEGIES as ALL
    from workflow_scripts.training.strategies._deepspeed import check_context

    cfg = ALL["zero2"].settings(check_context({"foreach_grad_norm": False}))["deepspeed_config"]
    assert "foreach_grad_norm" not in json.dumps(cfg)


def test_zero3_keeps_every_parameter_persistent_at_one_data_parallel_rank_on_a_gpu():
    """One rank's ZeRO-3 partition is the whole model: on a GPU its gathers and releases are skipped (every
    parameter above the persistence threshold is kept whole); on several data-parallel ranks, or on CPU, DeepSpeed's
    default stays, and the study's own option wins everywhere."""
    import dataclasses

    from workflow_scripts.training.layout import Layout
    from workflow_scripts.training.strategies import STRATEGIES as ALL
    from workflow_scripts.training.strategies._deepspeed import check_context

    def threshold(options=None, platform="cuda", dp=1):
        ctx = dataclasses.replace(check_context(options or {}), platform=platform, layout=Layout(dp=dp))
        return ALL["zero3"].settings(ctx)["deepspeed_config"]["zero_optimization"].get(
            "stage3_param_persistence_threshold")

    biggest = 1280 * 50304  # gpt2-large's embedding, its largest parameter
    assert threshold() > biggest and threshold(platform="rocm") > biggest
    assert threshold(platform="cpu") is None and threshold(dp=2) is None
    assert threshold({"stage3_param_persistence_threshold": 1000}) == 1000


def test_deepspeeds_compile_section_reaches_its_config_and_deepcompile_needs_a_gpu():
    """strategy_options.<zero*>.compile is DeepSpeed's own section (its DeepCompile backend for train.compile_model):
    it reaches the top level of the JSON, its keys are checked against DeepSpeed's CompileConfig (BAD_CONFIGS), and
    a CPU run asking for DeepCompile is unsupported, saying why, beside a strategy's own reason."""
    from workflow_scripts.training.strategies import STRATEGIES as ALL
    from workflow_scripts.training.strategies._deepspeed import check_context

    deepcompile = check_context({"compile": {"deepcompile": True}})
    assert ALL["zero1"].settings(deepcompile)["deepspeed_config"]["compile"] == {"deepcompile": True}
    assert ALL["zero1"].unsupported(deepcompile).startswith("strategy_options.zero1.compile.deepcompile: ")
    assert ALL["zero1"].unsupported(check_context({})) is None
    assert "nvme" in ALL["zero2_offload"].unsupported(check_context({"offload_optimizer": {"device": "nvme"}}))
    assert config_error({"strategy_options": {"zero1": {"foreach_grad_norm": False}}}) == ""
    from workflow_scripts.training.build_ops import needed_ops  # its op is built by the build_op job, once

    assert needed_ops("zero1", {"compile": {"deepcompile": True}}) == ["DeepCompileBuilder"]
    assert needed_ops("zeropp", {"compile": {"deepcompile": True}}) == ["QuantizerBuilder", "DeepCompileBuilder"]
    assert needed_ops("zero1", {"compile": {"deepcompile": False}}) == needed_ops("zero1") == []


def test_every_study_passes_the_strategy_option_check():
    """The default config passes the whole check, and the strategy_options of it and of every study (overlays
    included) pass their strategies' option check (DeepSpeed's: its own config models)."""
    from workflow_scripts import config_check
    from workflow_scripts.training.strategies import STRATEGIES as ALL

    assert config_error({}) == ""
    for path in [REPO / "config.yaml", *sorted((REPO / "studies").rglob("*.yaml"))]:
        for s, options in (yaml.safe_load(path.read_text()).get("strategy_options") or {}).items():
            assert s in ALL and config_check.option_problems(ALL[s], options) == [], (path.name, s)


def test_typos_at_every_level_are_listed_at_once_with_the_closest_key(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    typos = {"figures": {"dip": 100}, "train": {"fault_injection": {"oom_at": 3}, "micro_batch_size": 0},
             "corpus": {"hub": {"pathh": "x"}}, "bench": {"train": {"max_step": 3}},
             "groups": [{"models": ["gpt2-tiny"], "strategies": ["ddp"], "train": {"lrr": 1e-3}}]}
    (wd / "typo.yaml").write_text(yaml.safe_dump(typos))
    done = snakemake(wd, "-n", "--configfile", "config.yaml", "typo.yaml", check=False)
    out = done.stderr + done.stdout
    assert done.returncode != 0 and out.count("invalid study config") == 1
    for line in ("figures.dip: unknown key, did you mean dpi?", "train.fault_injection.oom_at: unknown key, did you "
                 "mean oom_at_step?", "corpus.hub.pathh: unknown key, did you mean path?",
                 "bench.train.max_step: unknown key, did you mean max_steps?",
                 "groups[0].train.lrr: unknown key, did you mean lr?",
                 "train.micro_batch_size: 0 is less than the minimum of 1"):
        assert line in out, line
    assert "description" not in out, "no dump of the schema"
    assert not (wd / "work").exists(), "no job may start"


def test_non_positive_batch_is_refused_by_the_schema(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    cfg = yaml.safe_load((wd / "config.yaml").read_text())
    cfg["train"]["micro_batch_size"] = 0
    (wd / "bad.yaml").write_text(yaml.safe_dump(cfg))
    done = snakemake(wd, "-n", "--configfile", "bad.yaml", check=False)
    assert done.returncode != 0
    assert "micro_batch_size" in done.stderr + done.stdout


# ------------------------------------------------------------------ the default study, run once
@pytest.fixture(scope="module")
def runs(default_study) -> pd.DataFrame:
    return pd.read_csv(default_study / "results/default/tables/runs.csv").set_index("strategy")


@pytest.fixture(scope="module")
def steps(default_study) -> pd.DataFrame:
    return pd.read_csv(default_study / "results/default/tables/steps.csv")


def test_every_strategy_has_a_row(runs):
    assert sorted(runs.index) == sorted(STRATEGIES)
    assert set(runs.status) <= {"ok", "unsupported"}
    assert (runs.world_size == 2).all() and (runs.layout == "ws2").all()
    for name, row in runs[runs.status == "unsupported"].iterrows():
        assert isinstance(row.reason, str) and row.reason, name
    # on a CPU only ZeRO++ (CUDA quantizer kernels) may be unsupported; ZeRO-Infinity runs where libaio is
    assert set(runs.index[runs.status == "unsupported"]) <= {"zeropp", "zero_infinity"}
    assert {"ddp", "zero1", "zero2", "zero3", "fsdp", "grad_accum", "zero2_offload", "zero3_offload"} <= set(
        runs.index[runs.status == "ok"])


def test_training_lowers_validation_loss(runs):
    ok = runs[runs.status == "ok"]
    assert (ok.val_loss_final < ok.val_loss_initial - 0.5).all(), ok[["val_loss_initial", "val_loss_final"]]
    assert (ok.final_loss < ok.initial_loss).all()


def test_losses_are_those_of_the_code_before_the_package_move(default_study, runs, steps):
    """The house move (packages by stage, layouts, the engine owning the step) changed no number: every strategy's
    per-step losses and validation losses equal those recorded on main before the move (bit for bit on the machine
    that recorded them; within 1e-4 on another CPU model: conftest.LOSS_BOUND)."""
    assert_default_study_losses(runs, steps)


def test_ddp_zero0_and_zero1_agree_at_the_first_steps(steps):
    first = steps[steps.step <= 10].pivot(index="step", columns="strategy", values="loss")
    for other in ("zero0", "zero1", "zero2", "zero3", "fsdp"):
        assert (first[other] - first["ddp"]).abs().max() < 1e-4, other


def test_grad_accum_keeps_the_effective_batch(runs):
    assert runs.loc["grad_accum", "effective_batch"] == runs.loc["ddp", "effective_batch"]
    assert runs.loc["grad_accum", "grad_accum"] == 8
    assert runs.loc["grad_accum", "micro_batch"] * 8 == runs.loc["ddp", "micro_batch"]
    assert abs(runs.loc["grad_accum", "final_loss"] - runs.loc["ddp", "final_loss"]) < 1e-3


def test_every_run_saved_its_exact_settings(default_study, runs):
    for name, row in runs.iterrows():
        settings = json.loads((default_study / "results/default/tables" / row.settings).read_text())
        if name.startswith("zero"):
            ds = settings["deepspeed_config"]
            assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds[
                "gradient_accumulation_steps"] * 2
        assert settings["precision"] == "fp32"


def test_throughput_and_memory_are_measured(runs):
    ok = runs[runs.status == "ok"]
    assert (ok.tokens_per_s > 0).all() and (ok.time_per_epoch_s > 0).all()
    assert (ok.peak_host_rss_bytes > 50e6).all()
    assert ok.mfu.isna().all(), "no MFU on CPU"


def test_figures_tables_and_report(default_study):
    res = default_study / "results/default"
    for name in ("loss_curves", "peak_memory", "throughput", "memory_timeline"):
        assert (res / f"figures/{name}.png").stat().st_size > 5000
        assert (res / f"figures/{name}.pdf").stat().st_size > 1000
    summary = (res / "tables/summary.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in summary.splitlines() if line.startswith("| `")}
    assert set(STRATEGIES) - {"zero0"} <= rows, rows  # whole cells: `zero2` is not found inside `zero2_offload`
    html = (res / "report.html").read_text(errors="replace")
    assert len(html) > 10000 and "loss_curves" in html


# ------------------------------------------------------------------ the run spec and a failed job's message
def validated_config(override: dict | None = None) -> dict:
    from snakemake.utils import update_config

    from workflow_scripts import config_check

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    update_config(config, override or {})
    config_check.validate_study(config, str(REPO / "schemas/config.schema.yaml"))
    return config


def test_the_run_spec_is_resolved_once_and_reads_back_as_written(tmp_path):
    """study.resolve gives every field a reader needs: config.yaml's micro-batch 8 at grad_accum 1 is grad_accum's
    8 accumulation steps of 1 sample (the same effective batch of 8) and DDP's 1 step of 8; the seed is the study's
    + the repeat; the train settings carry every schema key (the precision beside
    them). The JSON reads back equal; a spec of another schema
    version, or with a key the spec does not have, is one error naming the file and the key."""
    from workflow_scripts import schema, study
    from workflow_scripts.run_spec import SCHEMA_VERSION, RunSpec, RunSpecError

    config = validated_config()
    kw = dict(out_dir="o", work_dir="w", ops=[])
    ga = study.resolve(config, "gpt2-tiny", "grad_accum", 2, 1, {}, **kw)
    ddp = study.resolve(config, "gpt2-tiny", "ddp", 2, 0, {}, **kw)
    assert (ga.micro_batch, ga.accum, ddp.micro_batch, ddp.accum) == (1, 8, 8, 1)
    assert ga.train["seed"] == config["train"]["seed"] + 1 and ga.layout == {"dp": 2, "pp": 1, "tp": 1, "cp": 1,
                                                                            "ep": 1}
    seeded = study.resolve(config, "gpt2-tiny", "ddp", 2, 2, {"seed": 99}, **kw)  # a group's own seed
    assert seeded.train["seed"] == 101
    assert set(schema.default("train")) - {"precision"} <= set(ga.train) and ga.precision == "fp32"
    assert ga.train["compile_blocks"] is False and ga.train["compile_auto"].startswith("auto: off on CPU")
    assert ga.data["manifest"] == "results/default/data/tokens_manifest.json" and ga.trace_dir is None
    assert "trace_dir" not in ga and ga["train"] is ga.train  # the mapping view reads the JSON's keys
    path = tmp_path / "run_spec.json"
    path.write_text(ga.to_json())
    assert RunSpec.load(path) == ga and json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION
    for edit, named in (({"schema_version": 0}, "schema_version 0"), ({"epoch": 1}, "unknown key 'epoch'")):
        path.write_text(json.dumps({**ga.to_dict(), **edit}))
        with pytest.raises(RunSpecError, match=named) as err:
            RunSpec.load(path)
        assert str(err.value).startswith(str(path))


def test_a_committed_spec_of_an_earlier_version_reads_as_this_one_through_its_migrations(tmp_path):
    """RunSpec.committed, worked by hand: a version-0 spec (written before schema_version) gets a data-parallel
    layout over its world size, the split its summary.json records, and the train keys added since as its run had
    them (off); version 1's train.tensorboard becomes the spec's trackers. A train key no migration gives is one
    error naming the file and the key; so is a version 0 spec without the summary its split is read from."""
    from workflow_scripts import study
    from workflow_scripts.run_spec import SCHEMA_VERSION, RunSpec, RunSpecError

    now = study.resolve(validated_config(), "gpt2-tiny", "grad_accum", 2, 0, {}, out_dir="o", work_dir="w", ops=[])
    added = ("chunked_loss", "compile_model", "compile_blocks", "compile_loss", "compile_mode", "deterministic",
             "pipeline_schedule", "separate_documents")
    old = {k: v for k, v in now.to_dict().items() if k not in ("schema_version", "layout", "batch", "trackers")}
    old["train"] = {**{k: v for k, v in now.train.items() if k not in added}, "tensorboard": True}
    run = tmp_path / "run"
    run.mkdir()
    (run / "run_spec.json").write_text(json.dumps(old))
    with pytest.raises(RunSpecError, match=r"run_spec.json: version 0 records no micro-batch split and .*summary"):
        RunSpec.committed(run / "run_spec.json")
    (run / "summary.json").write_text(json.dumps({"micro_batch": 2, "grad_accum": 4}))  # as that run split it
    got = RunSpec.committed(run / "run_spec.json")
    assert got.schema_version == SCHEMA_VERSION and got.layout == {"dp": 2, "pp": 1, "tp": 1, "cp": 1, "ep": 1}
    assert got.batch == {"micro_batch": 2, "accum": 4} and got.trackers == ["tensorboard"]
    assert {k: got.train[k] for k in added} == {"chunked_loss": False, "compile_model": False,
                                                 "compile_blocks": False, "compile_loss": False,
                                                 "compile_mode": "default", "deterministic": False,
                                                 "pipeline_schedule": "1f1b", "separate_documents": False}
    assert "tensorboard" not in got.train
    del old["train"]["lr"]  # a key older than every migration: nothing says what its run did
    (run / "run_spec.json").write_text(json.dumps(old))
    with pytest.raises(RunSpecError, match=r"run/run_spec.json: train.lr missing"):
        RunSpec.committed(run / "run_spec.json")


def test_every_committed_runs_spec_reads_through_the_one_loader():
    """Every run of every committed set (results/**/runs/) reads as this version's spec, train keys complete."""
    from workflow_scripts.run_spec import RunSpec

    paths = sorted((REPO / "results").glob("**/runs/*/*/*/r*/run_spec.json"))
    assert len(paths) > 100
    for path in paths:
        assert set(RunSpec.committed(path).train) >= {"separate_documents", "deterministic", "lr"}, path


def test_a_spec_of_another_version_stops_the_launcher_and_the_trial_in_two_lines(tmp_path):
    """What the person reads is the job's error and where its log is; the traceback is in the log."""
    from workflow_scripts import study

    spec = {**study.resolve(validated_config(), "gpt2-tiny", "ddp", 2, 0, {}, out_dir=str(tmp_path / "o"),
                            work_dir=str(tmp_path / "w"), ops=[]).to_dict(), "schema_version": 0}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "trial.json").write_text(json.dumps({"specs": {"eager": spec}, "skipped": {}}))
    for module, args in (("launch", ["--spec", "spec.json"]), ("lever_trial", ["--trial", "trial.json", "--out", "v"])):
        done = subprocess.run([sys.executable, "-m", f"workflow_scripts.job.{module}", *args, "--log", f"{module}.log"],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                              text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 2, done.stderr
        assert "schema_version 0" in lines[0] and ("spec.json" in lines[0] or "specs.eager" in lines[0])
        assert lines[1] == f"  full log: {module}.log" and done.stdout == ""
        assert "Traceback" in (tmp_path / f"{module}.log").read_text()


def test_a_failed_training_job_is_its_own_error_in_a_few_lines(default_study):
    """The rules name spec files, never a spec (a measured study's lever trial and runs alike: the dry run's
    commands); a model shape transformers refuses fails the job that builds it (rule random_init) with its own
    error and its log in Snakemake's output, no spec JSON, Snakemake's own failure block around it."""
    wd = default_study
    measured = overlay(wd, "measured", results_dir="results/measured", auto_levers={"by": "measurement"})
    commands = [line for line in snakemake(wd, *measured, "-n", "-p").stdout.splitlines()
                if "workflow_scripts.job." in line]
    assert any("job.lever_trial --trial .snakemake/run_specs/" in c for c in commands), commands
    assert commands and all(len(c) < 300 and '{"' not in c for c in commands), max(commands, key=len)
    reuse_calibration(wd, "results/failing")  # the study's calibration: no new one needed
    args = overlay(wd, "failing", results_dir="results/failing", work_dir="work/failing", strategies=["ddp"],
                   model_overrides={"gpt2-tiny": {"n_embd": 130}})  # 130 is not a multiple of its 4 heads
    done = snakemake(wd, "results/failing/runs/gpt2-tiny/ddp/ws2/r0/summary.json", *args, check=False)
    out = (done.stdout + done.stderr).splitlines()
    assert done.returncode != 0
    first = next(i for i, line in enumerate(out) if line.startswith("random_init failed (exit code 1): "))
    own = out[first:next(i for i in range(first, len(out)) if out[i].startswith("RuleException"))]
    assert len(own) == 2 and "divisible by num_heads" in own[0], own
    log = own[1].removeprefix("  full log: ")
    assert "/logs/random_init/gpt2-tiny-" in log and (wd / log).exists(), own
    assert len(out) - first <= 25 and not any('"run_id"' in line for line in out), "\n".join(out[first:])


def test_paths_with_spaces_and_accents_run_every_stage(default_study):
    """results_dir, work_dir and data_dir with a space and a non-ASCII letter (a ZeRO-2 run: DeepSpeed's checkpoint
    and op paths too): every stage's shell command quotes
    its paths (Snakemake's :q), so the study runs to its tables and findings and no stray file appears beside
    the folders (`work/t/my` was what an unquoted `cp` wrote)."""
    wd = default_study
    names = {"results_dir": "results/my results é", "work_dir": "work/my work é", "data_dir": "work/my data é"}
    # a sixth of the corpus and 21 steps: every stage still runs, the checkpoint at step 20 among them
    args = overlay(wd, "spaced", **names, strategies=["zero2"], corpus={"max_bytes": 500_000},
                   train={"max_steps": 21})
    snakemake(wd, *args)
    results = wd / names["results_dir"]
    runs = pd.read_csv(results / "tables/runs.csv")
    assert list(runs.strategy) == ["zero2"] and (runs.status == "ok").all()
    assert (results / "tables/findings.md").exists() and (results / "figures/throughput.png").exists()
    assert (results / "data/tokens_manifest.json").exists() and (results / "data/corpus_manifest.json").exists()
    assert not any(p.name in ("my", "my results") for p in (wd / "results").iterdir() if p.is_file())
    assert not any(p.is_file() and p.name == "my" for p in (wd / "work").iterdir())
