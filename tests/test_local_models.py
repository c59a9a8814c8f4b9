"""A study's own causal LM (training/models.py: a local directory holding a Hugging Face config.json, or a hub id):
its shape read by AutoConfig, built as transformers builds it, accepted by the study's check under its directory's
name (every place the study names it then holds that name), planned like a registry model; a model that cannot be
read or trained here is one error naming it, before any job."""
from __future__ import annotations

import json

import pytest
from conftest import REPO, copy_workflow, overlay, snakemake

from workflow_scripts.training import models as M

VOCAB, BLOCK = 512, 64


@pytest.fixture(autouse=True)
def no_own_models(monkeypatch):
    """Each test starts with no own model registered; what it registers ($PIPELINE_MODELS) is undone after it."""
    monkeypatch.delenv(M.MODELS_ENV, raising=False)


def write(path, config) -> str:
    config.save_pretrained(path)
    return str(path)


def tiny_gpt2(path) -> str:
    from transformers import GPT2Config

    return write(path, GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=256,
                                  bos_token_id=0, eos_token_id=0))


def tiny_llama(path) -> str:
    from transformers import LlamaConfig

    return write(path, LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=176, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256,
                                   bos_token_id=0, eos_token_id=0))


def tiny_qwen2(path) -> str:
    from transformers import Qwen2Config

    return write(path, Qwen2Config(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=1, vocab_size=1000, tie_word_embeddings=True,
                                   bos_token_id=0, eos_token_id=0))


def study_config(**override) -> dict:
    """config.yaml with the overrides merged in, as a second --configfile would."""
    import yaml
    from snakemake.utils import update_config

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    update_config(config, override)
    return config


def check(config) -> str:
    """What the study's check (as rules/common.smk runs it) says; "" if nothing. It renames in place."""
    from workflow_scripts import config_check

    try:
        config_check.validate_study(config, str(REPO / "schemas/config.schema.yaml"))
    except config_check.ConfigError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("make, numbers", [
    (tiny_gpt2, dict(family="gpt2", n_layer=2, d_model=64, n_heads=4, n_kv_heads=4, ffn=256, tied=True)),
    (tiny_llama, dict(family="qwen2", n_layer=2, d_model=64, n_heads=4, n_kv_heads=2, ffn=176, tied=False)),
    (tiny_qwen2, dict(family="qwen2", n_layer=2, d_model=64, n_heads=4, n_kv_heads=1, ffn=128, tied=True)),
])
def test_model_spec_gives_the_shape_its_config_json_says(tmp_path, make, numbers):
    path = make(tmp_path / f"own-{make.__name__}")
    spec = M.model_spec(path)
    ffn = spec.shape.get("n_inner") or spec.shape.get("intermediate_size") or 4 * spec.d_model
    got = dict(family=spec.family, n_layer=spec.n_layer, d_model=spec.d_model, n_heads=spec.n_heads,
               n_kv_heads=spec.n_kv_heads, ffn=ffn, tied=spec.tied_embeddings)
    assert got == numbers
    assert spec.shape["vocab_size"] == 1000 and spec.name == f"own-{make.__name__}" and spec.source == path
    assert not spec.vision and not spec.moe and spec.hub_id is None
    # the study's overrides change the shape as they change a registry model's
    assert M.model_spec(path, {"num_hidden_layers": 3, "n_layer": 3}).n_layer == 3


@pytest.mark.parametrize("make", [tiny_gpt2, tiny_llama, tiny_qwen2])
def test_build_model_is_the_transformers_model_of_that_config(tmp_path, make):
    """Random init from the config at the study's vocabulary: the parameters of transformers' own model of the
    same config, and (Llama: untied, gated MLP, grouped KV heads) the count by hand; MFU's FLOPs per token from
    them."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = make(tmp_path / f"built-{make.__name__}")
    model = M.build_model(path, VOCAB, BLOCK)
    config = AutoConfig.from_pretrained(path)
    config.vocab_size = VOCAB
    direct = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    n = M.count_params(model)
    assert type(model) is type(direct) and n == M.count_params(direct)
    assert model.get_input_embeddings().num_embeddings == VOCAB
    if make is tiny_llama:
        d, kv, ffn, layers = 64, 2 * 16, 176, 2
        block = 2 * d * d + 2 * d * kv + 3 * d * ffn + 2 * d  # q, o; k, v; gate, up, down; two RMS norms
        assert n == VOCAB * d + layers * block + d + VOCAB * d  # embedding, blocks, final norm, untied head
    spec = M.MODELS[path]
    assert M.model_flops_per_token(path, n, BLOCK) == 6.0 * n + 12.0 * spec.n_layer * spec.d_model * BLOCK
    # the study's overrides reach the built model
    assert len(M.transformer_blocks(M.build_model(path, VOCAB, BLOCK, overrides={"num_hidden_layers": 3,
                                                                                   "n_layer": 3}))) == 3


def test_the_study_check_accepts_a_local_directory_and_names_its_runs_by_it(tmp_path):
    from workflow_scripts import study

    path = tiny_llama(tmp_path / "models" / "tiny-llama")
    spelled = str(tmp_path / "models" / "." / "tiny-llama")  # the same directory written another way
    config = study_config(models=["gpt2-tiny", path, spelled], strategies=["ddp", "zero2"],
                          model_overrides={path: {"num_hidden_layers": 3}}, plan={"models": [path]},
                          pretrained={spelled: path})
    assert check(config) == ""
    assert config["models"] == ["gpt2-tiny", "tiny-llama"] and config["plan"]["models"] == ["tiny-llama"]
    assert config["model_overrides"] == {"tiny-llama": {"num_hidden_layers": 3}}
    assert config["pretrained"] == {"tiny-llama": path}  # its weights, where a study asks for them
    assert set(study.runs(config)) >= {("tiny-llama", "ddp", "ws2"), ("tiny-llama", "zero2", "ws2")}
    spec = study.resolve(config, "tiny-llama", "ddp", 2, 0, {}, out_dir="o", work_dir="w", ops=[])
    assert spec.run_id == "tiny-llama__ddp__ws2__r0" and spec.model_overrides == {"num_hidden_layers": 3}
    assert spec.pretrained == path
    # every job the workflow starts inherits the name's source, and finds the model by its name alone
    assert M.own_models() == {"tiny-llama": path}
    assert "tiny-llama" in M.MODELS and M.MODELS.get("tiny-llama").source == path
    assert M.model_spec("tiny-llama", spec.model_overrides).n_layer == 3
    assert "tiny-llama" not in list(M.MODELS)  # the registry's own names stay what they were


def test_a_model_that_cannot_be_read_or_trained_is_one_error_naming_it(tmp_path, monkeypatch):
    import huggingface_hub.constants
    from transformers import OPTConfig, T5Config

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network here: fail at once
    (tmp_path / "empty").mkdir()
    t5 = write(tmp_path / "t5", T5Config(d_model=64, num_layers=2, num_heads=4))
    opt = write(tmp_path / "opt", OPTConfig(num_hidden_layers=2, hidden_size=64, ffn_dim=128,
                                             num_attention_heads=4, word_embed_proj_dim=64))
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown/config.json").write_text(json.dumps({"model_type": "no-such-type", "hidden_size": 64}))
    one, two = tiny_gpt2(tmp_path / "a" / "same"), tiny_llama(tmp_path / "b" / "same")
    registry = tiny_gpt2(tmp_path / "c" / "gpt2-tiny")
    config = study_config(models=[str(tmp_path / "empty"), t5, opt, str(tmp_path / "unknown"), one, two, registry,
                                  str(tmp_path / "missing"), "nobody/no-such-model"], strategies=["ddp"])
    found = check(config)
    assert found.count("invalid study config") == 1
    lines = found.splitlines()[1:]
    expect = [f"models: {str(tmp_path / 'empty')!r}: no config.json in {tmp_path / 'empty'}",
              f"models: {t5!r}: model_type 't5' (T5Config) is not a causal language model",
              f"models: {opt!r}: model_type 'opt' is a causal LM whose block the pipeline does not model",
              f"models: {str(tmp_path / 'unknown')!r}: transformers cannot read its config.json",
              f"models: {two!r} and {one!r} are different models both named 'same'",
              f"models: {registry!r}: its name 'gpt2-tiny' is a registry model's: rename the directory",
              f"models: {str(tmp_path / 'missing')!r}: {tmp_path / 'missing'} is not a directory",
              "models: 'nobody/no-such-model': its config cannot be read (a hub id: not in the Hugging Face cache"]
    for want in expect:  # one line each, none of them an "unknown model" besides
        assert sum(line.strip().startswith(want) for line in lines) == 1, (want, found)
    assert len(lines) == len(expect), found
    # the loader itself says the same, naming what it was given
    with pytest.raises(M.ModelSourceError, match="no config.json"):
        M.MODELS[str(tmp_path / "empty")]
    with pytest.raises(KeyError, match="unknown model 'tiny-thing'"):
        M.MODELS["tiny-thing"]


def test_the_plan_predicts_an_own_models_memory(tmp_path):
    """The planner's rows (tests/test_memory_plan.py's config) for a local directory and for the name a study's check
    gives it: a predicted peak per GPU, as for a registry model."""
    from test_memory_plan import plan_config

    from workflow_scripts.plan.planner import rows

    path = tiny_llama(tmp_path / "planned-llama")
    by_path = rows(plan_config(models=[path]))
    assert by_path["predicted_gib"].gt(0).all() and by_path["fits"].all() and not by_path["note"].any()
    assert check(study_config(models=[path], strategies=["ddp"])) == ""
    by_name = rows(plan_config(models=["planned-llama"]))
    assert list(by_name["predicted_gib"]) == list(by_path["predicted_gib"])
    zero3 = by_name.set_index(["strategy", "gpus", "micro_batch"])["predicted_gib"]
    assert zero3[("zero3", 2, 8)] < zero3[("zero3", 1, 8)]  # ZeRO-3 shards the states, as for gpt2-large


def test_a_dry_run_plans_the_runs_of_a_local_directory(tmp_path):
    """`snakemake -n` of a study whose models hold a local directory: its runs under results/.../runs/<name>/."""
    wd = copy_workflow(tmp_path / "wf")
    path = tiny_gpt2(tmp_path / "models" / "my-gpt2")
    planned = snakemake(wd, "-n", "-p", *overlay(wd, "own", models=[path], strategies=["ddp", "zero1"])).stdout
    assert "runs/my-gpt2/ddp/ws2/r0/summary.json" in planned and "runs/my-gpt2/zero1/ws2/r0/summary.json" in planned
    assert "runs/gpt2-tiny" not in planned


def test_the_run_spec_carries_the_models_source_and_its_config_hash(tmp_path, monkeypatch):
    """An own model's run spec names its directory and the SHA-256 of its config.json: an edited config.json is
    another spec (Snakemake reruns, a checkpoint of the old one never resumes); a launcher started by hand from the
    spec alone finds the model; a registry model's spec has no such key."""
    import hashlib
    import json as js

    from workflow_scripts import study
    from workflow_scripts.run_spec import RunSpec
    from workflow_scripts.training.checkpoint import resume_hash

    path = tiny_gpt2(tmp_path / "models" / "my-gpt2")
    config = study_config(models=[path], strategies=["ddp"])
    assert check(config) == ""
    kw = dict(out_dir="o", work_dir="w", ops=[])
    spec = study.resolve(config, "my-gpt2", "ddp", 2, 0, {}, **kw)
    written = (tmp_path / "models/my-gpt2/config.json").read_bytes()
    assert spec.model_source == {"source": path, "config_sha256": hashlib.sha256(written).hexdigest()}
    assert RunSpec.from_dict(js.loads(spec.to_json()), "spec") == spec
    before = resume_hash(spec.to_dict())
    edited = {**js.loads(written), "n_layer": 3}
    (tmp_path / "models/my-gpt2/config.json").write_text(js.dumps(edited))
    again = study.resolve(config, "my-gpt2", "ddp", 2, 0, {}, **kw)
    assert again.model_source["config_sha256"] != spec.model_source["config_sha256"]
    assert resume_hash(again.to_dict()) != before
    monkeypatch.delenv(M.MODELS_ENV)  # a shell without the workflow's environment
    M.register_from(again)
    assert M.own_models() == {"my-gpt2": path}
    assert "model_source" not in study.resolve(config, "gpt2-tiny", "ddp", 2, 0, {}, **kw).to_dict()


def test_a_run_fine_tunes_from_a_local_directory_of_weights(token_data, tmp_path):
    """A tiny GPT-2 saved by the test (save_pretrained, trained weights: not an initialisation) as `pretrained`:
    the run starts from those weights (its first step's loss and its initial validation loss are that model's on
    the same rows, worked out here with transformers), not from a random initialisation, and says so."""
    import subprocess
    import sys

    import numpy as np
    import torch
    from conftest import launch_spec
    from transformers import GPT2Config, GPT2LMHeadModel

    manifest = json.loads(open(token_data["manifest"]).read())
    torch.manual_seed(3)
    saved = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=manifest["vocab_size"],
                                       n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    train, val = np.load(token_data["train"]), np.load(token_data["val"])
    opt = torch.optim.AdamW(saved.parameters(), lr=3e-3)
    for i in range(20):  # a few steps: weights no initialisation gives
        x = torch.from_numpy(train[i * 8:(i + 1) * 8].astype(np.int64))
        saved(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    saved.save_pretrained(tmp_path / "weights")
    saved.eval()
    seed, micro = 7, 4
    first = np.sort(np.random.default_rng(seed).permutation(len(train))[:micro])  # step 0's rows (Batches)
    with torch.no_grad():
        x = torch.from_numpy(train[first].astype(np.int64))
        first_loss = saved(input_ids=x, labels=x).loss.item()
        v = torch.from_numpy(val[:2 * micro].astype(np.int64))  # eval_batches 2 of the micro-batch, in order
        val_loss = saved(input_ids=v, labels=v).loss.item()

    spec = launch_spec(token_data, tmp_path, "ft", world_size=1, pretrained=str(tmp_path / "weights"),
                       train={"seed": seed, "micro_batch_size": micro, "max_steps": 4})
    done = subprocess.run([sys.executable, "-m", "workflow_scripts.job.launch", "--spec", str(spec)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "ft/out/summary.json").read_text())
    assert summary["initial_loss"] == pytest.approx(first_loss, abs=1e-4)
    assert summary["val_loss_initial"] == pytest.approx(val_loss, abs=1e-4)
    assert first_loss < np.log(manifest["vocab_size"]) - 0.5  # a random initialisation starts near ln(vocab)


def test_pretrained_weights_this_machine_cannot_load_are_one_error_and_weights_random_records_them(tmp_path,
                                                                                                   monkeypatch):
    """`pretrained` names weights the machine has not got (a hub id offline and not cached; a directory that is
    not there): one error each, naming the model, the source and the way out, before any job. With `weights:
    random` the same study is accepted and each run of a model that names weights starts at random, its spec's
    substitutions saying which weights it did not load; a model without `pretrained` records nothing new."""
    import huggingface_hub.constants

    from workflow_scripts import study

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # nothing cached
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    missing = str(tmp_path / "no-weights-here")
    named = {"pretrained": {"gpt2-tiny": "nobody/tiny-weights", "gpt2-mini": missing}}
    found = check(study_config(models=["gpt2-tiny", "gpt2-mini", "qwen2-tiny"], strategies=["ddp"], **named))
    lines = found.splitlines()[1:]
    assert len(lines) == 2, found
    assert lines[0].strip().startswith(f"pretrained.gpt2-mini: {missing!r} does not exist; ")
    assert lines[1].strip().startswith("'pretrained.gpt2-tiny: nobody/tiny-weights': its config cannot be read (a "
                                       "hub id: not in the Hugging Face cache, nor downloadable)")
    assert all("weights: random (studies/offline_gpu.yaml)" in line for line in lines)

    config = study_config(models=["gpt2-tiny", "gpt2-mini", "qwen2-tiny"], strategies=["ddp"], weights="random",
                          substitutions=["corpus: offline"], **named)
    assert check(config) == ""
    specs = {m: study.resolve(config, m, "ddp", 1, 0, {}, "o", "w", []) for m in ("gpt2-tiny", "qwen2-tiny")}
    assert specs["gpt2-tiny"].pretrained is None and specs["gpt2-tiny"].substitutions == [
        "corpus: offline", "weights: random initialisation instead of the pretrained nobody/tiny-weights "
                           "(weights: random)"]
    assert specs["qwen2-tiny"].pretrained is None and specs["qwen2-tiny"].substitutions == ["corpus: offline"]
