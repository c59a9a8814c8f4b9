"""Whole-peak memory prediction (workflow_scripts/plan): the hand count of saved activations against torch's own
count on the real transformers layers, the planner's answers (README's example among them) and the opt-in refusal of
a run predicted not to fit."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from conftest import REPO, by_hand, copy_workflow, snakemake

from workflow_scripts.plan import memory_model as mm
from workflow_scripts.plan.predict import count_params, shape
from workflow_scripts.plan.traced import layer_saved_bytes
from workflow_scripts.training.layout import Layout

SMALL = {"rms and layer-norm statistics, logsumexp": 0.005}  # what the hand count leaves out, relative


@pytest.mark.parametrize("model", ["gpt2-medium", "qwen2.5-coder-1.5b", "qwen2.5-3b"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
def test_hand_count_equals_torchs_count_of_saved_tensors(model, precision):
    """Without autocast the CPU trace is the CUDA one: the op-by-op count in memory_model matches torch's."""
    traced = layer_saved_bytes(model, precision, 2, 256, device="cpu")["per_token"]
    s = shape(model, None, count_params(model, "{}", 1024, 256)[0], 1024)
    hand = mm.activation_bytes_per_token_layer(s, precision)
    assert hand <= traced <= hand * (1 + SMALL["rms and layer-norm statistics, logsumexp"]), (traced, hand)


@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
def test_vit_hand_count_equals_torchs_count(precision):
    """A ViT layer's saved tensors per token (tokens = patches + 1), counted by hand and by torch."""
    row = 1 + 3 * 32 * 32
    traced = layer_saved_bytes("vit-base-16", precision, 2, 5, device="cpu")["per_token"]
    s = shape("vit-base-16", None, count_params("vit-base-16", "{}", 128, row)[0], 128)
    hand = mm.activation_bytes_per_token_layer(s, precision)
    assert hand <= traced <= hand * 1.01, (traced, hand)


def test_moe_hand_count_equals_torchs_count():
    """Qwen1.5-MoE's layer (60 experts, top-4, transformers' grouped_mm experts, which take bf16 only): the router,
    the routed pairs and the shared expert counted by hand against torch's count of a real layer."""
    model = "qwen1.5-moe-a2.7b-12l"
    traced = layer_saved_bytes(model, "bf16-pure", 2, 256, device="cpu")["per_token"]
    s = shape(model, None, count_params(model, "{}", 1024, 256)[0], 1024)
    hand = mm.activation_bytes_per_token_layer(s, "bf16-pure")
    assert abs(traced - hand) <= 0.01 * hand, (traced, hand)


def test_expert_parallel_shards_the_experts_of_ddp_not_of_fsdp():
    """ep carves its groups out of the data ranks: FSDP2 already shards the experts over them (same bytes per
    rank), a DDP-family run holds 1/ep of them instead of all."""
    model = "qwen1.5-moe-a2.7b-12l"
    s = shape(model, None, count_params(model, "{}", 1024, 256)[0], 1024)
    common = dict(shape=s, zero_stage=0, precision="bf16-pure", dp=2, micro_batch=1, seq_len=256, grad_accum=1,
                  checkpointing=False)
    for family, ratio in (("fsdp", 1.0), ("ddp", None)):
        one = mm.predict(family=family, **common).parts["parameters"]
        ep = mm.predict(family=family, layout={"ep": 2}, **common).parts["parameters"]
        expected = one if ratio else one - 2 * s.expert_params / 2
        assert ep == pytest.approx(expected), family


def test_fsdp_keeps_the_gathered_parameters_where_it_does_not_reshard():
    """FSDP2 not resharding after forward, or one unit over the whole model (both its default in a one-rank run,
    strategies.fsdp), has the whole model's gathered parameters at the start of backward: p x the compute dtype's
    bytes (measured +0.66 GiB for GPT-2-medium, bf16-pure, one H100); a run's recorded setting wins over today's
    default (committed runs resharded each block)."""
    from workflow_scripts.plan.predict import predict

    common = dict(model="gpt2-medium", strategy="fsdp", micro_batch=4, seq_len=1024, grad_accum=1, vocab=50257)
    n = count_params("gpt2-medium", "{}", 50257, 1024)[0]
    for precision, bytes_per_param in (("bf16-pure", 2), ("fp32", 4)):
        one = predict(precision=precision, world_size=1, **common).parts["engine buffers"]
        assert one == pytest.approx(bytes_per_param * n), precision
        assert predict(precision=precision, world_size=2, **common).parts["engine buffers"] == 0.0
        resharded = {"reshard_after_forward": True}  # one unit over the model still gathers it all for backward
        assert predict(precision=precision, world_size=1, options=resharded, **common).parts["engine buffers"] == one
        assert predict(precision=precision, world_size=1, options={**resharded, "wrap_blocks": True},
                       **common).parts["engine buffers"] == 0.0
        assert predict(precision=precision, world_size=1, gathered_kept=False,
                       **common).parts["engine buffers"] == 0.0
    assert one * 2 / 4 / 2**30 == pytest.approx(0.66, abs=0.01)  # the bf16 copy of GPT-2-medium's 355M


def test_device_wide_peak_adds_slack_context_and_one_buffer_per_communicator():
    gib = 2**30
    alone = mm.device_peak(10 * gib, "ddp", 1)
    assert alone == pytest.approx(10 * gib * (1 + mm.ALLOCATOR_SLACK) + mm.CONTEXT_BYTES)
    assert mm.device_peak(10 * gib, "ddp", 2) - alone == pytest.approx(mm.COMMUNICATOR_BYTES)
    assert mm.device_peak(10 * gib, "deepspeed", 4, {"pp": 2, "tp": 2}) - alone == \
        pytest.approx(4 * mm.COMMUNICATOR_BYTES)


def test_cpu_autocast_differs_from_cuda_where_the_readme_says():
    """Qwen2 under bf16-mixed traces the same on CPU; GPT-2's gelu_new does not: CUDA autocast runs `pow` in fp32
    (the fp32 copy, tanh, 1 + tanh: 4f each), CPU autocast in bf16 (2f each). Weight casts are in the trace."""
    for model, cpu_minus_cuda in (("qwen2.5-coder-1.5b", 0.0), ("gpt2-medium", -6.0)):
        s = shape(model, None, count_params(model, "{}", 1024, 256)[0], 1024)
        n = 2 * 256
        traced = layer_saved_bytes(model, "bf16-mixed", 2, 256, device="cpu")["per_token"]
        layer_casts = 2.0 * (s.n_params - s.vocab * s.d) / s.n_layer / n
        hand = mm.activation_bytes_per_token_layer(s, "bf16-mixed")
        assert abs(traced - layer_casts - (hand + cpu_minus_cuda * s.ffn)) <= 0.005 * hand, model


def plan_config(**plan):
    """A study's plan config as rule plan passes it: the schema's defaults filled in, its `x-plan` sections only."""
    return planned({"plan": {"gpu_memory_gib": 80, "headroom_gib": 2, "models": ["gpt2-large"],
                             "strategies": ["ddp", "zero3", "zero3_offload"], "gpus": [1, 2],
                             "micro_batches": [2, 8, 16], "vocab": 50257, **plan},
                    "train": {"precision": "bf16-mixed", "compile_blocks": False, "compile_loss": False},
                    "platform": "cuda", "data": {"block_size": 1024}, "tokenizer": {"kind": "hub"}})


def planned(config: dict) -> dict:
    """`config` with the schema's defaults filled in (Snakemake's validation), then only the sections rule plan
    passes to the planner (the schema's `x-plan` keys)."""
    from workflow_scripts import config_check, schema

    config = {"study": "planned", "models": config["plan"]["models"], "strategies": config["plan"]["strategies"],
              "world_sizes": [1],
              **json.loads(json.dumps(config))}  # the study's own runs: the plan's models and strategies
    config_check.fill_defaults(config, str(schema.PATH))
    return {k: config[k] for k in schema.plan_keys() if k in config}


def test_the_planner_says_what_fits_on_known_cases():
    from workflow_scripts.plan.planner import largest_fitting, rows

    frame = rows(plan_config(gpu_memory_gib=94))
    best = largest_fitting(frame).set_index(["strategy", "gpus"])["largest_micro_batch"]
    # gpt2-large on a 94 GiB GPU: DDP at mb 8 is 48 GiB allocated (58 device-wide), mb 16 needs 99 GiB device-wide;
    # offloading ZeRO-3 fits mb 16 (88 GiB)
    assert best[("ddp", 1)] == 8 and best[("zero3_offload", 1)] == 16
    at_80 = largest_fitting(rows(plan_config())).set_index(["strategy", "gpus"])["largest_micro_batch"]
    assert at_80[("zero3_offload", 1)] == 8
    at = frame.set_index(["strategy", "gpus", "micro_batch"])["predicted_gib"]
    assert at[("zero3", 2, 8)] < at[("zero3", 1, 8)]  # ZeRO-3 shards the states over the GPUs
    # DDP replicates them; on two GPUs it adds its gradient buckets (fp32: 4 bytes x 774 M parameters), which one
    # rank, not wrapped, does not have
    assert at[("ddp", 2, 8)] - at[("ddp", 1, 8)] == pytest.approx(4 * 774.0e6 / 2**30, rel=0.01)
    assert at[("zero3_offload", 1, 8)] < at[("zero3", 1, 8)]
    small = rows(plan_config(gpu_memory_gib=16))
    assert not small.set_index(["strategy", "gpus", "micro_batch"]).loc[("ddp", 1, 16), "fits"]


def test_the_planner_ranks_what_fits_by_predicted_throughput():
    """With plan.calibration (the H100 kind's rate file), every candidate gets a predicted step; the ranking lists
    the ones that fit, fastest first, each with its bound; grad_accum is planned at the micro-batch it runs."""
    from workflow_scripts import study
    from workflow_scripts.plan.planner import ranking, rows

    config = plan_config(gpu_memory_gib=94, calibration="h100")
    frame = rows(config)
    one = frame[frame["gpus"] == 1]
    assert one["predicted_step_s"].gt(0).all() and one["time_bound"].notna().all()
    # h100.json holds no bus-bandwidth curve: two GPUs are not modelled, by name
    two = frame[frame["gpus"] == 2]
    assert two["predicted_step_s"].isna().all()
    assert two["step_note"].str.fullmatch(r"workflow_scripts/plan/rates/h100\.json has no all_(reduce|gather) "
                                          r"bus-bandwidth curve").all()
    lines = ranking(frame)
    table = [line.split("|") for line in lines if line.startswith("| ") and line[2].isdigit()]
    speeds = [float(cells[6].replace(",", "")) for cells in table]
    # the host-bound caveat follows the table where, and only where, a listed candidate is host-bound
    assert any(line.startswith("Bound `host`") for line in lines) == any(c[8].strip() == "host" for c in table)
    assert not any(line.startswith("Bound `host`") for line in ranking(frame[frame["time_bound"] != "host"]))
    ranked = (frame["fits"].eq(True) & frame["predicted_step_s"].notna()).sum()
    assert speeds == sorted(speeds, reverse=True) and len(table) == min(10, ranked)  # top 10
    fast = frame.set_index(["strategy", "gpus", "micro_batch"])["predicted_tokens_per_s_per_gpu"]
    assert fast[("zero3_offload", 1, 8)] < fast[("zero3", 1, 8)] < fast[("ddp", 1, 8)]
    config["train"]["grad_accum"] = 2
    config["strategy_options"] = {"grad_accum": {"accum_steps": 8}}
    split = {s: study.candidate(config, "gpt2-large", s, 1, 16).batch for s in ("grad_accum", "ddp")}
    assert split == {"grad_accum": {"micro_batch": 4, "accum": 8}, "ddp": {"micro_batch": 16, "accum": 2}}
    assert "set plan.calibration" in ranking(rows(plan_config()))[0]


def test_the_planner_bounds_a_compiled_run_by_the_eager_count():
    """The GPU default (compile auto, on from micro-batch 8 for gpt2-large, not for an offloading strategy, whose
    compiled runs the rule has no measurement of): a bound that fits is a fit; one that does not is unknown, not a
    refusal."""
    from workflow_scripts.plan.planner import markdown, rows

    config = plan_config(gpu_memory_gib=94)
    config["train"].update(compile_blocks="auto", compile_loss="auto")
    frame = rows(config).set_index(["strategy", "gpus", "micro_batch"])
    bound = frame["bound"].xs(1, level="gpus")
    at8 = bound.xs(8, level="micro_batch")
    assert (at8.drop("zero3_offload") == "upper").all() and at8["zero3_offload"] == ""
    assert (bound.xs(2, level="micro_batch") == "").all()  # auto stays eager at mb 2: an exact prediction
    assert frame.loc[("ddp", 1, 8), "fits"] == True  # noqa: E712 - 58 GiB bound < 92 usable
    assert frame.loc[("ddp", 1, 16), "fits"] is None  # the eager 99 GiB says nothing about the compiled run
    assert "≤ 99" in markdown(frame.reset_index(), config["plan"])


def test_the_plan_target_of_a_gpu_study_marks_the_compiled_cells(tmp_path):
    """`snakemake plan` on a GPU study (no GPU needed): the platform reaches the planner, so `auto` compiles from
    the block size where it pays (gpt2-medium: micro-batch 8) and those cells are eager upper bounds."""
    wd = copy_workflow(tmp_path / "wf")
    snakemake(wd, "plan", "--configfile", "studies/scaling.yaml", "studies/offline_gpu.yaml", "--config",
              "devices_per_node=4", "results_dir=results/plan_gpu")
    rows = [line for line in (wd / "results/plan_gpu/plan/plan.md").read_text().splitlines()
            if line.startswith("| `ddp` | 1 |")]
    cells = rows[0].split("|")[3:9]  # micro-batches 1, 2, 4, 8, 16, 32
    assert not any("≤" in c for c in cells[:3]) and all("≤" in c for c in cells[3:]), rows


def test_a_plan_names_the_missing_vocabulary():
    from workflow_scripts.plan.planner import PlanError, rows

    with pytest.raises(PlanError, match="plan.vocab"):
        rows(plan_config(vocab=None))  # a hub tokenizer of unknown name
    with pytest.raises(PlanError, match="plan.vocab"):  # a hub tokenizer that is not the model's own
        rows({**plan_config(vocab=None), "tokenizer": {"kind": "hub", "name": "Qwen/Qwen2.5-Coder-1.5B"}})


def test_a_plan_takes_the_vocabulary_of_the_models_own_tokenizer():
    """A hub tokenizer named by the model's hub id: the published model's embedding rows (GPT-2's 50,257, padded to
    train.vocab_multiple 64: 50,304), as if plan.vocab said so."""
    from workflow_scripts.plan.planner import plan_vocab

    config = {**plan_config(vocab=None), "tokenizer": {"kind": "hub", "name": "openai-community/gpt2-large"}}
    assert plan_vocab(config, ["gpt2-large"]) == 50304
    qwen = {**config, "tokenizer": {"kind": "hub", "name": "Qwen/Qwen2.5-Coder-1.5B"}}
    assert plan_vocab(qwen, ["qwen2.5-coder-1.5b"]) == 151936  # already a multiple of 64


README_PLAN = {"plan": {"gpu_memory_gib": 80, "gpus": [1, 2, 4]}}  # README's my_plan.yaml
CELL = re.compile(r"(≤ )?\d+\.\d [✓✗?]|–\d*")  # a peak in GiB with its mark, or not predicted
LARGEST = re.compile(r"(≥ )?\d+|[✗–]")


def study_config(*overlays: dict) -> dict:
    """A study's config as Snakemake resolves it: config.yaml, the study file, the overlays, the schema's defaults."""
    import yaml
    from snakemake.utils import update_config, validate

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    for overlay in (yaml.safe_load((REPO / "studies/ml815.yaml").read_text()), *overlays):
        update_config(config, overlay)
    validate(config, schema=str(REPO / "schemas/config.schema.yaml"), set_default=True)
    return config


def test_readmes_plan_example_is_a_table_of_numbers_with_one_footnote_per_symbol():
    """README's `snakemake plan --configfile studies/ml815.yaml my_plan.yaml` on a CPU machine: no devices_per_node
    or plan.vocab asked (the plan's own GPU counts; Qwen2.5-Coder's tokenizer is the model's); every cell a number
    with its mark, a bound marked ≤, a cell not predicted –, each symbol footnoted once below the table."""
    from workflow_scripts.plan.planner import markdown, rows

    config = study_config(README_PLAN)
    text = markdown(rows(config), config["plan"])
    lines = text.splitlines()
    table = [line.split("|")[1:-1] for line in lines if line.startswith("| `")]
    assert len(table) == 8 * 3  # the study's 8 strategies at 1, 2 and 4 GPUs
    cells = [c.strip() for row in table for c in row[2:-1]]
    assert len(cells) == 24 * 6 and all(CELL.fullmatch(c) for c in cells), cells
    assert all(LARGEST.fullmatch(row[-1].strip()) for row in table)
    footnotes = [line for line in lines if line[:2] in ("≤ ", "≥ ", "– ")]
    assert [f[0] for f in footnotes] == ["≤", "≥", "–"]  # one each, below the table
    assert "DeepSpeed" in footnotes[-1] and "results/" not in text
    assert {c for c in cells if c.startswith("–")} == {"–"}  # one reason: one mark


def test_refuse_oom_keeps_a_run_that_would_not_fit_from_starting(tmp_path):
    """Opt-in (plan.refuse_oom): the run is not started and its reason is the prediction; a fitting one starts."""
    from workflow_scripts.job.launch import predicted_oom

    manifest = tmp_path / "tokens_manifest.json"
    manifest.write_text(json.dumps({"block_size": 1024, "vocab_size": 50257}))
    spec = by_hand(model="gpt2-large", precision="bf16-mixed", platform="cuda", data={"manifest": str(manifest)},
                   train={"compile_blocks": False, "compile_loss": False})
    ctx = SimpleNamespace(micro_batch=16, accum=1)
    guard = {"gpu_memory_gib": 80, "headroom_gib": 2, "usable_bytes": 78 * 2**30}
    assert predicted_oom(spec, ctx) is None  # no guard: never refused
    spec = spec.replace(memory_guard=guard)
    reason = predicted_oom(spec, ctx)
    assert reason.startswith("not started: predicted device-wide peak 95.3 GiB per GPU (torch-allocated 79.9) "
                             "> 78.0 GiB usable") and "plan.refuse_oom" in reason
    assert predicted_oom(spec, SimpleNamespace(micro_batch=8, accum=1)) is None
    compiled = spec.replace(train={**spec.train, "compile_blocks": True})
    assert predicted_oom(compiled, ctx) is None  # the eager count only bounds it: no refusal on a bound


@pytest.mark.parametrize("study_file", ["config.yaml", "studies/ml815.yaml"])
def test_a_plans_candidate_is_the_studys_own_run_resolved_from_the_plans_sections_only(study_file):
    """The planner resolves each candidate with study.resolve from the sections rule plan passes (the schema's
    `x-plan` keys): at the study's own micro-batch it is the study's run, key for key, but for its paths."""
    import yaml

    from workflow_scripts import config_check, schema, study

    config = yaml.safe_load((REPO / study_file).read_text())
    config_check.fill_defaults(config, str(schema.PATH))
    sections = {k: config[k] for k in schema.plan_keys() if k in config}
    paths = ("run_id", "out_dir", "work_dir")
    runs = study.runs(config)
    assert runs
    for (model, strategy, key), overrides in runs.items():
        layout = Layout.from_key(key)
        run = study.resolve(config, model, strategy, layout, 0, overrides, out_dir="o", work_dir="w", ops=[])
        planned = study.candidate(sections, model, strategy, layout, run.train["micro_batch_size"])
        assert {k: v for k, v in planned.to_dict().items() if k not in paths} == \
            {k: v for k, v in run.to_dict().items() if k not in paths}, (model, strategy, key)
