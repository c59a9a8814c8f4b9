"""The importers (workflow_scripts/importers/): a peer tool's files written here (LLaMA-Factory train YAMLs, DeepSpeed
JSONs with "auto" values, an accelerate FSDP2 config, a torchtitan TOML) become one study whose resolved run specs
carry the files' batch, accumulation, learning rate, precision and ZeRO settings, and whose DeepSpeed config, as our
strategy builds it, holds the JSON's values with "auto" filled as the Hugging Face Trainer fills it; what the study
does otherwise is in its substitutions; an unknown key is one error naming the file and the key; the written study
plans under `snakemake -n`."""

from __future__ import annotations

import copy
import json
import math

import pytest
import yaml
from conftest import REPO, snakemake

from workflow_scripts.importers import ImportRefused, import_files
from workflow_scripts.importers.__main__ import main
from workflow_scripts.training import models as M

HIDDEN, WORLD = 64, 4
HF_BETAS = [0.9, 0.999]  # the Trainer's adam_beta1/2 defaults: a YAML that sets none trains with them


@pytest.fixture(autouse=True)
def no_own_models(monkeypatch):
    """Each test starts with no own model registered ($PIPELINE_MODELS: the study check registers the model)."""
    monkeypatch.delenv(M.MODELS_ENV, raising=False)


def write(path, content) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=1) if path.suffix == ".json" else content)
    return str(path)


@pytest.fixture(scope="module")
def peer(tmp_path_factory) -> dict:
    """The peer files, written for these tests: a tiny Llama directory, LLaMA-Factory YAMLs, their dataset_info,
    ZeRO-0/2/2-offload/3/3-offload JSONs with every batch key "auto", an accelerate FSDP2 config, a torchtitan TOML."""
    d = tmp_path_factory.mktemp("peer")
    llama = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "intermediate_size": 176,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 256,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    write(d / "tiny-llama" / "config.json", llama)
    write(
        d / "data" / "dataset_info.json",
        {"mathqa": {"hf_hub_url": "meta-math/MetaMathQA", "columns": {"prompt": "query", "response": "response"}}},
    )
    auto = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "hysteresis": 2},
        "bf16": {"enabled": "auto"},
    }
    stage2 = {
        "allgather_partitions": True,
        "allgather_bucket_size": 5e8,
        "overlap_comm": False,
        "reduce_scatter": True,
        "reduce_bucket_size": 5e8,
        "contiguous_gradients": True,
    }
    stage3 = {
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    }
    cpu = {"device": "cpu", "pin_memory": True}
    zero = {
        "z0": {"stage": 0, **stage2},
        "z2": {"stage": 2, **stage2},
        "z2_offload": {"stage": 2, **stage2, "offload_optimizer": cpu},
        "z3": {"stage": 3, **stage3},
        "z3_offload": {"stage": 3, **stage3, "offload_optimizer": cpu, "offload_param": cpu},
    }
    files = {f"ds_{k}": write(d / f"ds_{k}.json", {**auto, "zero_optimization": z}) for k, z in zero.items()}
    full = """model_name_or_path: tiny-llama
stage: sft
do_train: true
finetuning_type: full
dataset: mathqa
template: qwen
cutoff_len: 512
output_dir: saves/tiny/full
logging_steps: 10
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
learning_rate: 1.0e-5
num_train_epochs: 1.0
max_steps: 60
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
"""
    files["full"] = write(d / "full_sft.yaml", full)  # no deepspeed: pairs with the JSONs given beside it
    files["full_z3"] = write(d / "full_sft_z3.yaml", full + "deepspeed: ds_z3.json\n")
    for k in ("z0", "z2"):
        files[f"full_{k}"] = write(d / f"full_sft_{k}.yaml", full + f"deepspeed: ds_{k}.json\n")
    files["accum"] = write(
        d / "full_sft_accum.yaml",
        full.replace("batch_size: 2", "batch_size: 1").replace("accumulation_steps: 4", "accumulation_steps: 8"),
    )
    files["lora"] = write(
        d / "lora_sft.yaml",
        """model_name_or_path: Qwen/Qwen2.5-Coder-1.5B
stage: sft
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset: mathqa
template: qwen
cutoff_len: 1024
max_samples: 1000
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
""",
    )
    files["fsdp2"] = write(
        d / "fsdp2.yaml",
        """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: Qwen2DecoderLayer
  fsdp_reshard_after_forward: false
  fsdp_offload_params: false
  fsdp_state_dict_type: SHARDED_STATE_DICT
machine_rank: 0
mixed_precision: bf16
num_machines: 1
num_processes: 2
use_cpu: false
""",
    )
    files["titan"] = write(
        d / "titan.toml",
        """[job]
dump_folder = "./outputs"

[model]
name = "llama3"
flavor = "debugmodel"
hf_assets_path = "./tiny-llama"

[optimizer]
name = "AdamW"
lr = 3e-4

[lr_scheduler]
warmup_steps = 3
decay_type = "cosine"
min_lr_factor = 0.1

[training]
local_batch_size = 4
global_batch_size = 16
seq_len = 256
steps = 20
mixed_precision_reduce = "bfloat16"

[parallelism]
data_parallel_shard_degree = -1
tensor_parallel_degree = 2

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
""",
    )
    files["dir"] = d
    return files


def imported(*paths, world=None, **kw) -> dict:
    """The study of the files; every key they hold was read by the reader of its format (the sweep that records an
    overlooked key as a substitution found none)."""
    config, _ = import_files(list(paths), "imported", world=world, **kw)
    assert not [s for s in config.get("substitutions", []) if "not read by the importer" in s]
    return config


def specs(config: dict) -> dict:
    """(strategy, layout key) -> the run spec of repeat 0, as the Snakefile resolves the study over config.yaml."""
    from snakemake.utils import update_config

    from workflow_scripts import config_check, study
    from workflow_scripts.training.layout import Layout

    merged = yaml.safe_load((REPO / "config.yaml").read_text())
    update_config(merged, copy.deepcopy(config))
    config_check.validate_study(merged, str(REPO / "schemas/config.schema.yaml"), planning=True)
    return {
        (s, lay): study.resolve(merged, m, s, Layout.from_key(lay), 0, o, "o", "w", [])
        for (m, s, lay), o in study.runs(merged).items()
    }


def deepspeed_config(spec) -> dict:
    """The DeepSpeed JSON our strategy builds for the run (training/strategies/_deepspeed.py)."""
    from workflow_scripts.training import context
    from workflow_scripts.training.strategies import STRATEGIES

    return STRATEGIES[spec.strategy].settings(context.with_device(context.from_spec(spec)))["deepspeed_config"]


def test_a_full_sft_yaml_and_its_zero3_json_resolve_as_the_trainer_fills_auto(peer):
    config = imported(peer["full_z3"], world=WORLD)
    spec = specs(config)[("zero3", f"ws{WORLD}")]
    assert spec.model == "tiny-llama" and spec.pretrained == str(peer["dir"] / "tiny-llama")
    assert (spec.micro_batch, spec.accum, spec.precision) == (2, 4, "bf16-pure")  # DeepSpeed's bf16 mode
    t = spec.train
    assert (t["lr"], t["min_lr"], t["max_steps"], t["lr_warmup_steps"]) == (1e-5, 0.0, 60, math.ceil(0.1 * 60))
    assert (t["betas"], t["weight_decay"], t["grad_clip"], t["seed"], t["log_every"]) == (HF_BETAS, 0.0, 1.0, 42, 10)
    assert t["gradient_checkpointing"] is True  # LLaMA-Factory recomputes unless disable_gradient_checkpointing
    ds = deepspeed_config(spec)
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (
        2,
        4,
        2 * 4 * WORLD,
    )
    assert ds["gradient_clipping"] == 1.0 and ds["bf16"] == {"enabled": True}
    assert ds["zero_optimization"] == {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 10**9,
        "reduce_bucket_size": HIDDEN * HIDDEN,
        "stage3_prefetch_bucket_size": int(0.9 * HIDDEN * HIDDEN),
        "stage3_param_persistence_threshold": 10 * HIDDEN,
        "stage3_max_live_parameters": 10**9,
        "stage3_gather_16bit_weights_on_model_save": True,
    }
    corpus = config["corpus"]
    assert corpus["hub"]["path"] == "meta-math/MetaMathQA" and corpus["hub"]["kind"] == "chat"
    assert corpus["hub"]["prompt_field"] == "query" and config["data"]["block_size"] == 512
    # what the study does otherwise is in every run's provenance
    assert any("template: 'qwen'" in s for s in spec.substitutions)
    assert any("not applied: output_dir" in s for s in spec.substitutions)


def test_one_yaml_and_five_zero_jsons_are_one_study_of_five_strategies(peer):
    names = ("z0", "z2", "z2_offload", "z3", "z3_offload")
    config = imported(peer["full"], *(peer[f"ds_{n}"] for n in names), world=WORLD)
    runs = specs(config)
    assert config["strategies"] == ["zero0", "zero2", "zero2_offload", "zero3", "zero3_offload"]
    stage2 = {
        "allgather_partitions": True,
        "allgather_bucket_size": 5 * 10**8,
        "overlap_comm": False,
        "reduce_scatter": True,
        "reduce_bucket_size": 5 * 10**8,
        "contiguous_gradients": True,
    }
    pinned = {"device": "cpu", "pin_memory": True}  # the JSON's, and what the strategy sets on a GPU
    want = {
        "zero0": {"stage": 0, **stage2},
        "zero2": {"stage": 2, **stage2},
        "zero2_offload": {"stage": 2, "offload_optimizer": pinned, **stage2},
    }
    for name in ("zero0", "zero2", "zero2_offload", "zero3", "zero3_offload"):
        spec = runs[(name, f"ws{WORLD}")]
        assert (spec.micro_batch, spec.accum, spec.train["lr"], spec.precision) == (2, 4, 1e-5, "bf16-pure"), name
        ds = deepspeed_config(spec)
        assert ds["train_batch_size"] == 2 * 4 * WORLD
        zero = ds["zero_optimization"]
        if name in want:
            assert zero == want[name], name
        else:
            assert zero["stage"] == 3 and zero["reduce_bucket_size"] == HIDDEN**2
            assert zero["stage3_param_persistence_threshold"] == 10 * HIDDEN
            assert (zero.get("offload_param"), zero.get("offload_optimizer")) == (
                (pinned, pinned) if name == "zero3_offload" else (None, None)
            )
    assert "optimizer" in deepspeed_config(runs[("zero3_offload", f"ws{WORLD}")])  # DeepSpeedCPUAdam, as offloaded


def test_several_yamls_that_differ_in_their_json_are_one_study(peer):
    """ML815's shape: one YAML per variant; two DDP YAMLs at one effective batch become ddp and grad_accum."""
    config = imported(peer["full_z0"], peer["full_z2"], peer["full_z3"], peer["full"], peer["accum"], world=WORLD)
    assert sorted(config["strategies"]) == ["ddp", "grad_accum", "zero0", "zero2", "zero3"]
    assert "groups" not in config  # one train section: the variants differ in their strategy only
    runs = specs(config)
    batch = {s: (spec.micro_batch, spec.accum) for (s, _), spec in runs.items()}
    assert batch == {"zero0": (2, 4), "zero2": (2, 4), "zero3": (2, 4), "ddp": (2, 4), "grad_accum": (1, 8)}
    assert {spec.precision for spec in runs.values()} == {"bf16-pure"}  # the first file's policy, for all
    assert any(s.startswith("ddp (full_sft.yaml)") and "bf16-mixed" in s for s in config["substitutions"])


def test_a_lora_yaml_with_an_accelerate_fsdp2_config(peer):
    """LoRA on a language model is recorded as full fine-tuning; accelerate's FSDP2 config is fsdp with its options,
    num_processes the world size, bf16 FSDP2's mixed precision (bf16-pure); the Trainer's warmup_ratio over the
    original's steps, counted from max_samples."""
    config = imported(peer["lora"], peer["fsdp2"])
    spec = specs(config)[("fsdp", "ws2")]
    assert spec.model == "qwen2.5-coder-1.5b" and spec.pretrained == "Qwen/Qwen2.5-Coder-1.5B"
    assert (spec.micro_batch, spec.accum, spec.train["lr"], spec.precision) == (1, 8, 1e-4, "bf16-pure")
    assert spec.options == {"wrap_blocks": True, "reshard_after_forward": False, "cpu_offload": False}
    steps_per_epoch = math.ceil(1000 / 2 / 1 / 8)  # samples / ranks / micro-batch / accumulation
    assert spec.train["lr_warmup_steps"] == math.ceil(0.1 * 3 * steps_per_epoch)
    assert spec.train.get("lora") is None
    assert any("finetuning_type: lora" in s and "full fine-tuning" in s for s in spec.substitutions)


def test_a_lora_yaml_alone_is_ddp_under_autocast(peer):
    spec = specs(imported(peer["lora"], world=2))[("ddp", "ws2")]
    assert (spec.micro_batch, spec.accum, spec.precision, spec.options) == (1, 8, "bf16-mixed", {})


def test_a_torchtitan_toml_is_its_layout(peer):
    config = imported(peer["titan"], world=WORLD)
    assert config["layouts"] == [{"dp": 2, "tp": 2}] and config["strategies"] == ["fsdp"]
    spec = specs(config)[("fsdp", "dp2-tp2")]
    assert spec.layout == {"dp": 2, "pp": 1, "tp": 2, "cp": 1, "ep": 1}
    assert (spec.micro_batch, spec.accum) == (4, 16 // (4 * 2))  # global / (local x dp)
    t = spec.train
    assert (t["lr"], t["lr_warmup_steps"], t["max_steps"]) == (3e-4, 3, 20)
    assert t["min_lr"] == pytest.approx(3e-4 * 0.1, rel=1e-9)
    assert (t["betas"], t["weight_decay"], t["gradient_checkpointing"]) == ([0.9, 0.95], 0.1, "selective")
    assert spec.precision == "bf16-pure" and spec.pretrained is None  # torchtitan trains from a random init
    assert config["data"]["block_size"] == 256


def test_an_unknown_key_is_one_error_naming_the_file_and_the_key(peer, tmp_path, capsys):
    bad = write(
        tmp_path / "typo.yaml",
        (peer["dir"] / "full_sft.yaml")
        .read_text()
        .replace("per_device_train_batch_size", "per_device_train_batchsize")
        .replace("model_name_or_path: tiny-llama", f"model_name_or_path: {peer['dir'] / 'tiny-llama'}"),
    )
    with pytest.raises(ImportRefused) as err:
        imported(bad, world=WORLD)
    assert f"{bad}: unknown key per_device_train_batchsize (did you mean per_device_train_batch_size?)" in str(
        err.value)
    cfg = json.loads((peer["dir"] / "ds_z2.json").read_text())
    cfg["zero_optimization"]["reduce_bucket_sise"] = 1
    typo = write(tmp_path / "typo.json", cfg)
    assert main([bad, typo, "--world-size", "2", "--out", str(tmp_path / "out.yaml")]) == 2
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and f"{bad}: unknown key per_device_train_batchsize" in said
    assert main([peer["full"], typo, "--world-size", "2", "--out", str(tmp_path / "out.yaml")]) == 2
    said = capsys.readouterr().err.strip()
    assert typo in said and "reduce_bucket_sise: unknown key, did you mean reduce_bucket_size?" in said
    assert not (tmp_path / "out.yaml").exists()


def test_a_json_alone_keeps_its_numbers(peer, tmp_path):
    """Without training settings beside it a JSON's numbers are the study's (an overlay of strategy and batch)."""
    cfg = json.loads((peer["dir"] / "ds_z2.json").read_text())
    cfg.update(
        train_batch_size=32,
        train_micro_batch_size_per_gpu=4,
        gradient_accumulation_steps=2,
        gradient_clipping=0.5,
        bf16={"enabled": True},
        fp16={"enabled": False},
        optimizer={"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
    )
    config = imported(write(tmp_path / "alone.json", cfg))
    assert config["strategies"] == ["zero2"] and config["world_sizes"] == [32 // (4 * 2)]
    assert config["train"] == {
        "precision": "bf16-pure",
        "micro_batch_size": 4,
        "grad_accum": 2,
        "grad_clip": 0.5,
        "lr": 3e-4,
        "eps": 1e-8,
        "weight_decay": 0.01,
        "betas": [0.9, 0.95],
    }


def test_a_json_auto_without_training_settings_is_refused(peer):
    with pytest.raises(ImportRefused, match="train_micro_batch_size_per_gpu.*'auto' with no training settings"):
        imported(peer["ds_z2"])


def test_the_imported_study_plans_under_a_dry_run(peer, tmp_path):
    out = tmp_path / "imported.yaml"
    names = ("z0", "z2", "z2_offload", "z3", "z3_offload")
    assert main([peer["full"], *(peer[f"ds_{n}"] for n in names), "--world-size", "2", "--out", str(out)]) == 0
    planned = snakemake(REPO, "-n", "--nolock", "--configfile", str(out), "studies/cpu_override.yaml").stdout
    for name in ("zero0", "zero2", "zero2_offload", "zero3", "zero3_offload"):
        assert f"runs/tiny-llama/{name}/ws2/r0" in planned, name


# ---------------------------------------------------------------- a study's strategy from a DeepSpeed JSON
@pytest.fixture
def no_study_strategies(monkeypatch):
    """Each test starts with no strategy from a file registered ($PIPELINE_STRATEGIES)."""
    from workflow_scripts.training import strategies

    monkeypatch.delenv(strategies.STRATEGIES_ENV, raising=False)


def study_with(tmp_path, strategies, **train) -> dict:
    """A study config with its defaults filled, as rules/common.smk has it before naming the file strategies."""
    from workflow_scripts import config_check

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg.update({"strategies": strategies, "models": ["gpt2-tiny"], "results_dir": str(tmp_path / "r")})
    cfg["train"].update({"micro_batch_size": 4, "grad_accum": 2, "grad_clip": 0.5, "lr": 2e-4, **train})
    config_check.fill_defaults(cfg, str(REPO / "schemas/config.schema.yaml"))
    return cfg


def test_a_strategy_from_a_deepspeed_json_runs_as_its_stage_with_the_studys_batch(tmp_path, no_study_strategies):
    """{name, deepspeed}: "auto" is the study's (micro-batch 4, accumulation 2, clipping 0.5, lr 2e-4), the file's
    zero keys are its options, the hidden-size auto is gpt2-tiny's 128^2; a number unlike the study's is the
    study's, one substitution line; the run spec names the file and its stage; the registry finds the name."""
    from workflow_scripts import study
    from workflow_scripts.importers import study_strategies
    from workflow_scripts.training.strategies import STRATEGIES

    path = write(tmp_path / "ds_z3.json", {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
        "gradient_clipping": 1.0, "bf16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "zero_optimization": {"stage": 3, "overlap_comm": True, "reduce_bucket_size": "auto",
                              "stage3_max_live_parameters": 1e9, "stage3_gather_16bit_weights_on_model_save": True}})
    cfg = study_with(tmp_path, ["ddp", {"name": "my_z3", "deepspeed": path}])
    assert study_strategies.expand(cfg) == []
    assert cfg["strategies"] == ["ddp", "my_z3"]
    assert STRATEGIES["my_z3"].zero_stage == 3 and "my_z3" in STRATEGIES and "my_z3" not in list(STRATEGIES)
    options = cfg["strategy_options"]["my_z3"]
    assert options["overlap_comm"] is True and options["stage3_max_live_parameters"] == 10**9
    assert options["reduce_bucket_size"] == 128 * 128  # the Trainer's hidden^2, gpt2-tiny's n_embd 128
    spec = study.resolve(cfg, "gpt2-tiny", "my_z3", 2, 0, {}, "o", "w", [])
    assert spec.strategy_source["base"] == "zero3" and spec.strategy_source["deepspeed"] == path
    from workflow_scripts.report.parse import strategy_source

    assert strategy_source(spec) == "ds_z3.json as zero3"  # its runs' strategy_source cell
    assert spec.options == options and spec.micro_batch == 4 and spec.batch["accum"] == 2
    clip = [s for s in spec.substitutions if "gradient_clipping" in s]
    assert clip == ["my_z3 (ds_z3.json): gradient_clipping: 1: the study's 0.5 (train.grad_clip: one batch "
                    "contract, optimizer and precision policy for every strategy of a study)"]
    assert not any("gradient_clipping" in s for s in study.resolve(cfg, "gpt2-tiny", "ddp", 2, 0, {}, "o", "w",
                                                                     []).substitutions)
    ds = STRATEGIES["zero3"].settings  # the engine's JSON is built from the options as for any ZeRO-3 run
    assert ds is STRATEGIES["my_z3"].settings


@pytest.mark.parametrize("entry,content,expected", [
    ({"name": "zero3"}, {"zero_optimization": {"stage": 3}}, "'zero3' is a registry strategy's name"),
    ({"name": "mine"}, {"zero_optimization": {"stage": 3, "stage3_prefetch_buket_size": 10}},
     "stage3_prefetch_buket_size: unknown key, did you mean stage3_prefetch_bucket_size?"),
    ({"name": "mine"}, {"trian_batch_size": 8, "zero_optimization": {"stage": 2}},
     "unknown key trian_batch_size (did you mean train_batch_size?)"),
    ({"name": "mine"}, {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}},
     "offload at stage 1"),
    ({"name": "mine"}, None, "no such file"),
])
def test_a_strategy_file_that_cannot_run_is_one_problem_naming_it(tmp_path, no_study_strategies, entry, content,
                                                                   expected):
    from workflow_scripts.importers import study_strategies

    path = write(tmp_path / "ds.json", content) if content is not None else str(tmp_path / "missing.json")
    found = study_strategies.expand(study_with(tmp_path, ["ddp", {**entry, "deepspeed": path}]))
    assert len(found) == 1 and found[0].startswith("strategies[1]: ") and expected in found[0], found
    assert entry["name"] == "zero3" or path in found[0]


def test_a_study_with_a_bad_strategy_file_stops_before_any_job(tmp_path, no_study_strategies):
    """(A good one trains: test_a_study_imported_from_one_yaml_per_variant_trains_into_one_table.)"""
    bad = write(tmp_path / "ds_z2.json", {"zero_optimization": {"stage": 2, "contigous_gradients": True}})
    study = write(tmp_path / "study.yaml", yaml.safe_dump({"strategies": ["ddp", {"name": "my_z2", "deepspeed": bad}],
                                                         "results_dir": str(tmp_path / "r")}))
    done = snakemake(REPO, "-n", "--nolock", "--configfile", study, check=False)
    said = done.stderr + done.stdout
    assert done.returncode != 0
    assert "ds_z2.json: contigous_gradients: unknown key, did you mean contiguous_gradients?" in said


def test_a_study_imported_from_one_yaml_per_variant_trains_into_one_table(tmp_path):
    """ML815's shape, written here: a local model directory (weights, tokenizer and config, as a cluster downloads
    it once), a local MetaMathQA-like dataset named in dataset_info.json, and one LLaMA-Factory YAML per variant
    that differ only in their DeepSpeed JSON. Imported, then run on the default CPU setup (two gloo ranks) with
    only the sizes a CPU can train: one table, one row per variant, each fine-tuned from the saved weights."""
    import pandas as pd
    import torch
    from conftest import run
    from transformers import LlamaConfig, LlamaForCausalLM

    rows = [{"query": f"What is {i} plus {i + 1}?", "response": f"The answer is {2 * i + 1}."} for i in range(300)]
    write(tmp_path / "data" / "metamath.jsonl", "\n".join(json.dumps(r) for r in rows))
    write(tmp_path / "data" / "dataset_info.json",
          {"mathqa": {"file_name": "metamath.jsonl", "columns": {"prompt": "query", "response": "response"}}})
    model = tmp_path / "tiny-llama"
    run(["workflow_scripts.data.tokenizer", "--params", json.dumps({"kind": "bpe", "vocab_size": 300}),
         "--corpus", write(tmp_path / "text.jsonl", "\n".join(json.dumps({"text": r["query"] + " " + r["response"]})
                                                            for r in rows)), "--out", str(model)])
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=300, max_position_embeddings=128, bos_token_id=0,
                                 eos_token_id=0)).save_pretrained(model)
    auto = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"}}
    yamls = []
    for name, stage in (("z1", 1), ("z2", 2)):
        write(tmp_path / f"ds_{name}.json", {**auto, "zero_optimization": {"stage": stage, "overlap_comm": False}})
        yamls.append(write(tmp_path / f"sft_{name}.yaml", f"""model_name_or_path: tiny-llama
stage: sft
finetuning_type: full
dataset: mathqa
dataset_dir: data
template: qwen
cutoff_len: 64
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
learning_rate: 3.0e-3
max_steps: 6
lr_scheduler_type: cosine
warmup_ratio: 0.2
deepspeed: ds_{name}.json
"""))
    study = tmp_path / "imported.yaml"
    assert main([*yamls, "--world-size", "2", "--out", str(study)]) == 0
    sizes = write(tmp_path / "cpu.yaml", yaml.safe_dump({
        "platform": "cpu", "results_dir": str(tmp_path / "results"), "work_dir": str(tmp_path / "work"),
        "substitutions": ["cpu: a tiny model, a few steps"],
        "train": {"precision": "fp32", "log_every": 2, "eval_batches": 1, "gradient_checkpointing": False}}))
    tables = tmp_path / "results/tables"
    snakemake(REPO, f"{tables}/runs.csv", f"{tables}/summary.md", "--configfile", str(study), sizes)
    runs = pd.read_csv(tables / "runs.csv", keep_default_na=False)
    assert sorted(runs.strategy) == ["zero1", "zero2"] and set(runs.status) == {"ok"}
    assert set(runs.model) == {"tiny-llama"} and set(runs.micro_batch) == {4} and set(runs.grad_accum) == {2}
    assert (runs.final_loss < runs.initial_loss).all()
    assert (runs.initial_loss < math.log(300) + 0.5).all()  # the saved weights' loss, on the answers only
    imported_lines = yaml.safe_load(study.read_text())["substitutions"]  # kept under the overlay's own line
    assert all(r.split("; ") == [*imported_lines, "cpu: a tiny model, a few steps"] for r in runs.substitutions)
    assert dict(zip(runs.strategy, runs.strategy_source)) == {"zero1": "", "zero2": ""}  # imported as the registry's
    settings = json.loads((tmp_path / "results/runs/tiny-llama/zero2/ws2/r0/strategy_settings.json").read_text())
    ds = settings["deepspeed_config"]
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (
        4, 2, 4 * 2 * 2)
    assert ds["zero_optimization"]["stage"] == 2 and ds["gradient_clipping"] == 1.0  # the Trainer's max_grad_norm
