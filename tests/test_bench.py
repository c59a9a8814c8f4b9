"""The harness benchmark (rule bench_harness): the lever ladder and ours vs Hugging Face Trainer, on CPU ranks.
Speed is measured on GPUs (BENCHMARKS.md); here: every row is produced, both sides train, the levers keep the
numerics, and what each run used is recorded."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import overlay, snakemake

# A DeepSpeed stage against the Trainer (the exact-JSON check; DDP runs as the lever ladder's strategy); fsdp is left
# out on CPU: accelerate has no FSDP on CPU ranks, the Trainer would train it with DDP (recorded as
# settings.trainer_fsdp_active on GPU runs).
# The Trainer in its eager setting and with Liger (not installed here, and no Liger patch for GPT-2: the row says
# so); torch_compile=True is the GPU benchmark's (compiling on two CPU cores would double the suite's time), and so
# is the ceiling's compiled loop (here it runs eager).
BENCH = {"model": "gpt2-tiny", "world_size": 2, "strategies": ["zero2"], "rounds": 1,
         "trainer_settings": ["eager", "liger"], "harness": {}, "ceiling": {"compile": False},
         "levers": [{"name": "eager", "train": {}},
                    {"name": "compiled", "train": {"compile_loss": True}}]}  # the loss alone: compiling blocks
# on two CPU cores costs minutes of the suite, and the recording and the numerics are the same for every lever


@pytest.fixture(scope="module")
def bench(default_study):
    wd = default_study
    snakemake(wd, "bench_harness", "bench_sampler", *overlay(wd, "bench", study="bench", results_dir="results/bench",
                                            work_dir="work/bench", bench=BENCH,
                                            train={"max_steps": 8, "log_every": 4, "timing_warmup_steps": 2,
                                                   "checkpoint_every": 0, "eval_batches": 1}))
    return wd / "results/bench/bench"


def test_sampler_overhead_runs_the_same_training_with_and_without_the_sampler(bench):
    rounds = pd.read_csv(bench / "sampler_overhead_rounds.csv").set_index("arm")
    assert (rounds.status == "ok").all()
    assert rounds.loc["on", "sampler_samples"] > 0 and rounds.loc["off", "sampler_status"] == "off"
    table = pd.read_csv(bench / "sampler_overhead.csv")
    assert table.ratio.iloc[0] == pytest.approx(rounds.loc["on", "tokens_per_s"] / rounds.loc["off", "tokens_per_s"])


def test_every_strategy_has_ours_and_every_trainer_setting(bench):
    rounds = pd.read_csv(bench / "harness_vs_trainer_rounds.csv")
    ran = rounds[rounds.runner != "trainer:liger"]
    assert (ran.status == "ok").all(), ran[["strategy", "runner", "reason"]].to_dict("records")
    liger = rounds[rounds.runner == "trainer:liger"]
    assert (liger.status == "unavailable").all() and liger.reason.str.contains("liger").all()
    table = pd.read_csv(bench / "harness_vs_trainer.csv").set_index("strategy")
    assert list(table.index) == BENCH["strategies"] + ["ceiling"]
    ceiling, table = table.loc["ceiling"], table.drop(index="ceiling")
    assert table["ours / ceiling"].values == pytest.approx(  # per device: the ceiling is one device
        (table["ours tokens/s"] / (BENCH["world_size"] * ceiling["ceiling tokens/s"])).values)
    assert (table["trainer best"] == "trainer:eager").all()  # the only setting that ran
    assert table["ratio to best"].values == pytest.approx(
        (table["ours tokens/s"] / table["trainer:eager tokens/s"]).values)
    assert (table.precision == "fp32").all()  # the study's fp32 policy: the same on both sides
    assert "ratio to best" in (bench / "harness_vs_trainer.md").read_text()


def test_the_comparison_is_to_the_trainers_fastest_setting_with_cis():
    from workflow_scripts.bench.harness import compare_summary

    runs = [("ours", 110), ("ours", 112), ("ours", 111), ("trainer:eager", 60), ("trainer:eager", 61),
            ("trainer:eager", 59), ("trainer:compile", 100), ("trainer:compile", 98), ("trainer:compile", 102)]
    df = pd.DataFrame([{"strategy": "ddp", "repeat": i % 3, "precision": "bf16-mixed", "runner": r,
                        "status": "ok", "tokens_per_s": v, "mfu": v / 1000, "reason": None, "world_size": 2}
                       for i, (r, v) in enumerate(runs)]
                      + [{"strategy": "ceiling", "repeat": i, "precision": "bf16-mixed", "runner": "ceiling",
                          "status": "ok", "tokens_per_s": v, "mfu": v / 500, "world_size": 1}
                         for i, v in enumerate([90, 100, 110])])
    table = compare_summary(df).set_index("strategy")
    row = table.loc["ddp"]
    assert row["trainer best"] == "trainer:compile" and row["ratio to best"] == pytest.approx(111 / 100)
    assert row["ours / ceiling"] == pytest.approx(111 / (2 * 100))  # two devices against one device's ceiling
    assert table.loc["ceiling", "ours MFU"] == pytest.approx(0.2) and table.loc["ceiling", "rounds"] == 3
    assert row["rounds"] == 3 and row["CIs overlap"] == False  # noqa: E712 - numpy bool
    assert row["ours ±95%"] == pytest.approx(4.303 * 1.0 / 3**0.5, rel=1e-3)  # t(0.975, 2) x s / sqrt(n)


def test_both_sides_train_the_same_model_on_the_same_batch(bench):
    for strategy in BENCH["strategies"]:
        ours = json.loads((bench / f"ours/{strategy}/r0/summary.json").read_text())
        theirs = json.loads((bench / f"trainer-eager/{strategy}/r0/trainer_summary.json").read_text())
        assert theirs["n_params"] == ours["n_params"]
        assert theirs["effective_batch"] == ours["effective_batch"] == 16
        assert theirs["losses"][-1] < theirs["losses"][0]  # the Trainer really trained
        assert ours["final_loss"] < ours["initial_loss"]
    top = json.loads((bench / "ceiling/r0/ceiling_summary.json").read_text())
    assert top["world_size"] == 1 and top["micro_batch"] == ours["micro_batch"] and top["n_params"] == ours["n_params"]
    assert top["final_loss"] < top["initial_loss"]  # the ceiling's loop really trained
    assert top["settings"] == {"compile": False, "cuda_graphs": False, "fused_adamw": False, "autocast_bf16": False}
    deepspeed = json.loads((bench / "trainer-eager/zero2/r0/trainer_summary.json").read_text())
    ours_ds = json.loads((bench / "ours/zero2/r0/strategy_settings.json").read_text())
    assert deepspeed["settings"]["deepspeed_config"] == ours_ds["deepspeed_config"]  # the exact same JSON
    assert ours_ds["grad_norm"].startswith("torch._foreach_norm")  # what the engine swapped in, recorded


def test_levers_keep_the_loss_and_are_recorded(bench):
    levers = pd.read_csv(bench / "levers.csv").set_index("lever")
    assert list(levers.index) == ["eager", "compiled"]
    assert (levers.status == "ok").all()
    eager = pd.read_csv(bench / "levers/eager/r0/metrics.csv")
    compiled = pd.read_csv(bench / "levers/compiled/r0/metrics.csv")
    assert (eager.loss - compiled.loss).abs().max() < 1e-3  # the compiled loss: same training
    settings = json.loads((bench / "levers/compiled/r0/strategy_settings.json").read_text())
    assert settings["harness"]["compile_loss"] and not settings["harness"]["compile_blocks"]
    summary = json.loads((bench / "levers/compiled/r0/summary.json").read_text())
    assert summary["compile_loss"] is True and summary["compile_blocks"] is False


def test_bench_config_errors_name_the_key(default_study):
    wd = default_study
    done = snakemake(wd, "-n", "bench_harness", *overlay(wd, "badbench", bench={**BENCH, "strategies": ["zero9"]}),
                     check=False)
    assert done.returncode != 0
    assert "bench: unknown strategy 'zero9'" in done.stdout + done.stderr


def test_every_trainer_setting_the_schema_offers_has_its_arguments():
    """bench.trainer_settings lives in the schema's enum once (bench/trainer.SETTINGS reads it); each has its
    TrainingArguments (or a reason it cannot run here), and an unknown one is refused by name."""
    import pytest
    from transformers import GPT2Config, GPT2LMHeadModel

    from workflow_scripts.bench.trainer import SETTINGS, setting_arguments

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8))
    assert {"eager", "compile"} <= set(SETTINGS)
    for setting in SETTINGS:
        arguments, why_not = setting_arguments(setting, model)
        assert isinstance(arguments, dict) and (arguments or why_not or setting == "eager"), setting
    with pytest.raises(ValueError, match="unknown setting 'fast'"):
        setting_arguments("fast", model)


def test_a_rerun_of_a_cut_bench_keeps_its_own_configs_runs_only(tmp_path):
    """A benchmark job cut short (a time limit) and run again goes on where it stopped, also when it asks for more
    rounds; a changed config starts over (a table never mixes two configurations)."""
    from workflow_scripts.bench.harness import Rounds

    config = {"bench": {"rounds": 3}}
    first = Rounds(tmp_path / "x_rounds.csv", config, lambda df: df)
    first.add({"runner": "ours", "repeat": 0, "tokens_per_s": 1.0})
    again = Rounds(tmp_path / "x_rounds.csv", config, lambda df: df)
    assert again.done(runner="ours", repeat=0) and not again.done(runner="ours", repeat=1)
    assert (tmp_path / "x.md").exists()
    more = Rounds(tmp_path / "x_rounds.csv", {"bench": {"rounds": 6}}, lambda df: df)
    assert more.done(runner="ours", repeat=0)
    changed = Rounds(tmp_path / "x_rounds.csv", {"bench": {"rounds": 3, "model": "other"}}, lambda df: df)
    assert changed.rows == [] and not changed.done(runner="ours", repeat=0)


def tiny_bench_set(root, name="h100-tiny"):
    """One committed-looking set: a lever ladder with its rounds file and a comparison with its ceiling row."""
    bench = root / name / "bench"
    bench.mkdir(parents=True)
    rounds = [{"lever": lever, "repeat": r, "status": "ok", "tokens_per_s": v, "strategy": "ddp"}
              for r in range(3) for lever, v in (("eager", 40_000 + 2_000 * r), ("compiled", 100_000 + 10_000 * r))]
    pd.DataFrame(rounds).to_csv(bench / "levers_rounds.csv", index=False)
    pd.DataFrame([{"lever": "eager", "rounds": 3, "status": "ok", "tokens_per_s": 42_000.0, "mfu": 0.1034,
                   "peak_allocated_gib": 14.9, "final_loss": 6.8299, "step_time_s": 0.0975, "micro_batch": 4.0,
                   "strategy": "ddp"},
                  {"lever": "compiled", "rounds": 3, "status": "ok", "tokens_per_s": 110_000.0, "mfu": 0.2708,
                   "peak_allocated_gib": 8.81, "final_loss": 6.8301, "step_time_s": 0.0372, "micro_batch": 4.0,
                   "strategy": "ddp"}]).to_csv(bench / "levers.csv", index=False)
    pd.DataFrame([{"strategy": "ddp", "ours tokens/s": 125_512.8, "ours ±95%": 874.7, "trainer:compile tokens/s":
                   56_354.0, "trainer:compile ±95%": 32_782.8, "trainer best": "trainer:compile",
                   "ratio to best": 2.2272, "CIs overlap": False, "ours / ceiling": 1.002, "ours MFU": 0.30854,
                   "trainer best MFU": 0.13853},
                  {"strategy": "ceiling", "ours MFU": 0.30793, "ceiling tokens/s": 125_262.2,
                   "ceiling ±95%": 425.2}]).to_csv(bench / "harness_vs_trainer.csv", index=False)
    return name


def test_benchmarks_md_rewrites_only_the_marked_tables_from_the_sets_csvs(tmp_path):
    """A report's generated tables (benchmarks_md, run by hand): each marked region becomes the table of its sets, mean
    ± 95 % CI from the rounds file; the text around it stays, a second run changes nothing, a missing set is named."""
    from tools import benchmarks_md

    name = tiny_bench_set(tmp_path / "results")
    before, between, after = "# Bench\n\nProse before.\n", "\nProse between.\n", "\nProse after.\n"
    md = tmp_path / "BENCH.md"
    md.write_text(f'{before}<!-- bench-table sets="{name}" table="levers" -->\nhand table\n<!-- /bench-table -->'
                  f'{between}<!-- bench-table sets="{name}" table="compare" -->\n<!-- /bench-table -->{after}')
    argv = ["--file", str(md), "--results", str(tmp_path / "results")]
    assert benchmarks_md.main(argv) == 0
    text = md.read_text()
    assert text.startswith(before) and text.endswith(after) and between in text and "hand table" not in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    # t(0.975, 2) = 4.303: 10,000 x 4.303 / sqrt(3) and 2,000 x 4.303 / sqrt(3)
    assert rows[0] == (f"| `{name}` | eager | `ddp` | 4 | 42,000 ± 4,968 | 1.00× | 10.3 % | 97.5 | 14.9 | 6.830 |")
    assert "| compiled | `ddp` | 4 | 110,000 ± 24,841 | 2.62× | 27.1 % | 37.2 | 8.8 | 6.830 |" in text
    assert rows[1].startswith(f"| `{name}` | – | `ddp` | 125,513 ± 875 (30.9 %) | compile | 56,354 ± 32,783 (13.9 %) "
                              "| 2.23× | yes | 1.00 |")
    assert "| ceiling | 125,262 ± 425 (30.8 %) |" in text
    assert benchmarks_md.levers_label({"compile_model": True}, {"compile": {"deepcompile": True}}) == (
        "whole model, DeepCompile")  # the strategy options of ours' run spec name DeepSpeed's backend
    assert benchmarks_md.main(argv + ["--check"]) == 0 and benchmarks_md.main(argv) == 0 and md.read_text() == text
    assert benchmarks_md.inputs(md, tmp_path / "results")[:2] == [
        str(tmp_path / "results" / name / "bench" / f) for f in ("levers.csv", "levers_rounds.csv")]

    md.write_text(text.replace(f'sets="{name}" table="compare"', f'sets="{name},h100-gone" table="compare"'))
    with pytest.raises(benchmarks_md.BenchTableError, match="set 'h100-gone'.*h100-gone/bench/harness_vs_trainer.csv"):
        benchmarks_md.rewrite(md.read_text(), tmp_path / "results")
    assert benchmarks_md.main(argv) == 2  # one message, nothing written
    assert "h100-gone" in md.read_text() and md.read_text().count("125,513") == 1


def test_a_levers_options_are_resolved_with_the_run_not_swapped_in_after(tmp_path):
    """A bench lever that runs grad_accum with its own accum_steps 2 (the study's are 8): the run's micro-batch split
    is the lever's, 8 samples as 2 micro-batches of 4 (swapping the options in after resolving kept 8 of 1)."""
    from test_workflow import validated_config

    from workflow_scripts.bench.harness import spec_for

    config = validated_config()
    assert config["strategy_options"]["grad_accum"]["accum_steps"] == 8 and config["train"]["micro_batch_size"] == 8
    spec = spec_for(config, "grad_accum", {}, tmp_path, "lever", 0,
                    options={"accum_steps": 2, "keep_effective_batch": True})
    assert spec["options"]["accum_steps"] == 2
    assert (spec["batch"]["micro_batch"], spec["batch"]["accum"]) == (4, 2), spec["batch"]


def test_every_bench_key_names_the_parts_that_read_it_and_the_lever_list_reruns_only_its_own():
    """The schema's `x-bench` annotation is what rules/bench.smk passes each part: every key of config bench names
    at least one known part; the lever list and its strategy are the ladder's (and the sampler's strategy), the
    Trainer's settings the comparison's; figures and tables reach no part."""
    from workflow_scripts import schema

    keys = schema.schema()["properties"]["bench"]["properties"]
    assert all(set(v.get("x-bench", ())) and set(v["x-bench"]) <= {"levers", "compare", "sampler"}
               for v in keys.values()), {k: v.get("x-bench") for k, v in keys.items()}
    assert "levers" in schema.bench_keys("levers") and "levers" not in schema.bench_keys("compare")
    assert "trainer_settings" in schema.bench_keys("compare") and "trainer_settings" not in schema.bench_keys("levers")
    assert "lever_strategy" in schema.bench_keys("sampler") and "ceiling" not in schema.bench_keys("sampler")
    assert set(schema.presentation_keys()) == {"figures", "tables"}
