"""The GPU fast path as the default (train.compile_blocks / compile_loss: auto): what a run spec says it does on each
platform, layout and model family, and what the memory model and the planner make of a compiled run. The speed
itself is measured on GPUs (BENCHMARKS.md)."""
from __future__ import annotations

from workflow_scripts import study
from workflow_scripts.training.layout import Layout


def config(platform: str, **train) -> dict:
    return {"results_dir": "r", "work_dir": "w", "data_dir": "d", "study": "t", "nodes": 1, "platform": platform,
            "data": {"kind": "text", "block_size": 1024}, "images": {"image_size": 224},
            "train": {"precision": "bf16-mixed", "seed": 1, "micro_batch_size": 16, "grad_accum": 1,
                      "compile_blocks": "auto", "compile_loss": "auto", "vocab_multiple": 64, **train},
            "strategy_options": {}, "pretrained": {}, "model_overrides": {}, "sampler": {}, "substitutions": [],
            "plan": {}, "profile": {}, "trackers": [], "weights": "pretrained"}


def levers(platform: str, model="gpt2-medium", layout: Layout | int = 1, strategy="fsdp", **train) -> dict:
    cfg = config(platform, **train)
    cfg["strategy_options"] = {"grad_accum": {"accum_steps": 4, "keep_effective_batch": True}}
    t = study.run_spec(cfg, model, strategy, layout, 0, {}, "o", "w", [])["train"]
    return {k: t.get(k) for k in ("compile_blocks", "compile_loss", "compile_auto")}


def test_auto_compiles_on_gpus_and_not_on_cpu():
    on = levers("cuda")
    assert on["compile_blocks"] is True and on["compile_loss"] is True
    assert on["compile_auto"] == "auto: on (cuda, 4.1e+11 FLOP per block call)"
    assert levers("rocm")["compile_blocks"] is True
    off = levers("cpu")
    assert off["compile_blocks"] is False and off["compile_loss"] is False and "CPU" in off["compile_auto"]


def test_auto_stays_eager_where_compiled_runs_were_not_checked_on_a_gpu():
    assert levers("cuda", "qwen2.5-3b", Layout.from_config({"dp": 2, "tp": 2}, "x"))["compile_blocks"] is True
    pp = levers("cuda", "qwen2.5-3b", Layout.from_config({"dp": 2, "pp": 2}, "x"))
    assert pp["compile_blocks"] is False and "pp" in pp["compile_auto"]
    moe = levers("cuda", "qwen1.5-moe-a2.7b-12l")
    assert moe["compile_blocks"] is False and "MoE" in moe["compile_auto"]


def test_auto_stays_eager_where_a_block_call_is_too_small_to_pay():
    """GPT-2-medium at the tutorial's micro-batch 4 measured 0.85x eager compiled (host-bound), at 16 1.9x."""
    small = levers("cuda", micro_batch_size=4)
    assert small["compile_blocks"] is False and "1.0e+11 FLOP per block call" in small["compile_auto"]
    vit = levers("cuda", "vit-huge-14", micro_batch_size=32)  # 257 tokens x 32 images
    assert vit["compile_blocks"] is True and vit["compile_loss"] is False  # a classifier's loss: nothing to compile
    assert levers("cuda", "vit-base-16", micro_batch_size=32)["compile_blocks"] is False
    # grad_accum forwards a quarter of the micro-batch at the same effective batch: decided on what one forward does
    assert levers("cuda", strategy="grad_accum")["compile_blocks"] is False
    # context parallel splits a rank's tokens; tensor parallel does not count (eager DTensor is host-bound)
    assert study.block_flops(config("cuda"), "qwen2.5-3b", 2, {"cp": 2}) * 2 == \
        study.block_flops(config("cuda"), "qwen2.5-3b", 2, {"tp": 2})


def test_compiled_zero3_takes_torch_linear_and_auto_compiles_its_blocks_again():
    """DeepSpeed's memory-efficient linear, traced into ZeRO-3's compiled blocks (leaf modules) or its compiled
    model, left parameters without gradients on an H100 (_deepspeed.COMPILED_ZERO3_KEYS, results/vit/
    h100-zero3-grad-check): every stage-3 strategy compiled (blocks or model) turns it off; eager ones, DeepCompile's
    and ZeRO-1/2 keep DeepSpeed's default; a user's key wins here (config_check refuses it before any job:
    test_workflow's BAD_CONFIGS); `auto` compiles ZeRO-3's blocks on a GPU again."""
    from workflow_scripts.training import strategies
    from workflow_scripts.training.strategies._deepspeed import check_context

    def zero_keys(name, compiled, **options):
        ctx = check_context(options)
        ctx.compiled = compiled
        return strategies.get(name).settings(ctx)["deepspeed_config"]["zero_optimization"]

    for name in ("zero3", "zeropp", "zero3_offload"):
        assert zero_keys(name, True)["memory_efficient_linear"] is False, name
        assert "memory_efficient_linear" not in zero_keys(name, False), name
    for name in ("zero3", "zeropp"):
        assert levers("cuda", strategy=name)["compile_blocks"] is True, name
    # offload: compiled levers were never measured there, so the rule keeps the settings every strategy runs
    offload = levers("cuda", strategy="zero3_offload")
    assert offload["compile_blocks"] is False and "offload" in offload["compile_auto"]
    assert "memory_efficient_linear" not in zero_keys("zero2", True)
    assert zero_keys("zero3", True, memory_efficient_linear=True)["memory_efficient_linear"] is True
    assert "memory_efficient_linear" not in zero_keys("zero3", True, compile={"deepcompile": True})
    from workflow_scripts.training.levers import trial_candidates

    assert "blocks" in trial_candidates(["eager", "blocks", "model"], "cuda", True, "gpt2", {},
                                        evidence="replicated")[0]


def test_an_explicit_setting_wins_and_a_partial_one_resolves_the_rest():
    assert levers("cuda", compile_blocks=False, compile_loss=False) == \
        {"compile_blocks": False, "compile_loss": False, "compile_auto": None}
    mixed = levers("cuda", compile_blocks=False)
    assert mixed["compile_blocks"] is False and mixed["compile_loss"] is True
    assert levers("cpu", compile_loss=True)["compile_loss"] is True


def test_a_measured_auto_runs_the_candidates_each_configuration_can_run():
    """auto_levers.by: measurement: a study run names its trial (and a forced lever is no trial's to choose); the
    candidates are the schema's, each complete over the levers, and the trial leaves out what cannot run."""
    import yaml
    from conftest import REPO

    from workflow_scripts.training.levers import CANDIDATES, TRIAL_KEYS, trial_candidates

    cfg = {**config("cuda"), "auto_levers": {"by": "measurement"}}
    spec = study.run_spec(cfg, "gpt2-medium", "ddp", 1, 0, {}, "o", "w", [], measured=True)["train"]
    assert spec["lever_trial"] == "r/levers/gpt2-medium/ddp/ws1.json" and spec["compile_blocks"] == "auto"
    assert "lever_trial" not in study.run_spec(cfg, "gpt2-medium", "ddp", 1, 0, {"compile_loss": False}, "o", "w", [],
                                               measured=True)["train"]
    schema = yaml.safe_load((REPO / "schemas/config.schema.yaml").read_text())["properties"]["auto_levers"]
    assert schema["properties"]["candidates"]["items"]["enum"] == list(CANDIDATES)
    assert all(sorted(c) == sorted(TRIAL_KEYS) for c in CANDIDATES.values())
    every = list(CANDIDATES)
    # no FLOP count given: blocks may win
    run, skip = trial_candidates(every, "cuda", True, "gpt2", {}, evidence="replicated")
    assert list(run) == ["blocks", "model", "model_graphs"] and set(skip) == {"eager", "loss"}
    run, skip = trial_candidates(every, "cpu", False, "gpt2", {}, evidence="replicated")
    assert list(run) == ["eager", "loss", "blocks"] and set(skip) == {"model", "model_graphs"}
    # a ViT's loss is not ours: `loss` is `eager`
    run, skip = trial_candidates(every, "cuda", True, "vit", {}, evidence="replicated")
    assert "loss" in skip and not any(c["compile_loss"] for c in run.values())
    run, skip = trial_candidates(every, "cuda", True, "gpt2", {"chunked_loss": 4096}, evidence="replicated")
    assert list(run) == ["blocks"] and "chunked" in skip["model"]
    # GPT-2-medium, one block's matmuls 12 x 1024^2 weights: micro-batch 16 x 1024 tokens is 2 x 12.6M x 16,384 =
    # 4.1e11 FLOP per block call (not host-bound: blocks alone, no trial), micro-batch 4 1.0e11 (the whole model)
    run, skip = trial_candidates(every, "cuda", True, "gpt2", {}, 2 * 12 * 1024**2 * 16 * 1024, evidence="replicated")
    assert list(run) == ["blocks"] and "4.1e+11 FLOP per block call" in skip["model_graphs"] and "model" in skip
    run, skip = trial_candidates(every, "cuda", True, "gpt2", {}, 2 * 12 * 1024**2 * 4 * 1024, evidence="replicated")
    assert list(run) == ["model", "model_graphs"] and "blocks" in skip


def test_a_compiled_run_is_bounded_by_the_eager_count():
    """Compiled: the eager prediction as an upper bound, never a refusal; the committed compiled rows lie below it
    (bench/memory.py: 0.91-0.93 of the bound)."""
    from workflow_scripts.plan.predict import predict

    run = dict(model="gpt2-large", strategy="ddp", precision="bf16-mixed", world_size=1, micro_batch=16,
               seq_len=1024, grad_accum=1, vocab=50304)
    eager, compiled = predict(**run), predict(**run, compiled=True)
    assert compiled.bound == "upper" and not eager.bound and compiled.total == eager.total
    assert "upper bound" in compiled.why


def test_what_counts_as_compiled_for_the_memory_model():
    from workflow_scripts.training.levers import compiles

    assert compiles({"compile_blocks": True}, "gpt2", {}) and compiles({"compile_loss": True}, "qwen2", {})
    assert not compiles({"compile_loss": True}, "vit", {})  # a ViT's loss is not ours to compile
    assert not compiles({"compile_loss": True}, "qwen2", {"cp": 2})  # the sequence-sharded loss stays eager
    assert not compiles({"compile_blocks": "auto", "compile_loss": "auto"}, "gpt2", {})  # unresolved: nothing


def test_the_whole_model_compiled_trains_as_eager_on_one_unwrapped_rank(token_data, tmp_path):
    """train.compile_model on one CPU rank: the same losses as the eager run (the reference run the sequence-parallel
    test shares, conftest.run_layout) within float tolerance, no DDP wrapper there (one rank's all-reduce is the
    identity), the lever recorded; validation runs the uncompiled module, so the loss before training (the same
    seeded weights) is the eager run's to the bit; refused before any job on a tensor-parallel layout. Its speed is
    measured on a GPU (BENCHMARKS.md Part 1c)."""
    import json

    import pytest
    from conftest import run_layout

    from workflow_scripts import config_check

    first, eager = run_layout(token_data, tmp_path, "1d", "qwen2-tiny", "ddp", {"dp": 1})
    compiled, whole = run_layout(token_data, tmp_path, "whole", "qwen2-tiny", "ddp", {"dp": 1}, compile_model=True)
    settings = json.loads((tmp_path / "whole/out/strategy_settings.json").read_text())
    assert settings["engine"].startswith("the model itself: one rank")
    assert settings["harness"]["compile_model"] == "torch.compile(Qwen2ForCausalLM, mode=default)"
    assert settings["harness"]["validation"].startswith("eager")
    assert compiled["val_loss_initial"] == first["val_loss_initial"]
    assert whole == pytest.approx(eager, abs=1e-4) and whole[-1] < whole[0]
    refused = config_check.layout_problems({"train": {"compile_model": True}, "data": {}, "models": ["gpt2-tiny"],
                                            "strategies": ["ddp"], "world_sizes": [], "layouts": [{"dp": 1, "tp": 2}]})
    assert refused[-1] == ("layouts[0]: train.compile_model compiles data-parallel layouts only (dp1-tp2); use "
                           "train.compile_blocks")


def test_the_chunked_loss_gives_the_heads_loss_and_gradients():
    """train.chunked_loss on a tied GPT-2 (uneven chunks of 7 rows, context-only tokens ignored): the loss and every
    gradient of the unfused head + lm_loss, in fp32 to float precision and under bf16 autocast to bf16's rounding;
    the head stays tied; without gradients it only evaluates."""
    import types

    import pytest
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from workflow_scripts.training import chunked_loss
    from workflow_scripts.training.strategies.engine import input_ids, lm_loss

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=101, n_positions=16, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    plain, chunked = GPT2LMHeadModel(cfg), GPT2LMHeadModel(cfg)
    chunked.load_state_dict(plain.state_dict())
    chunked_loss.install(chunked, 7)
    assert chunked.lm_head.weight is chunked.transformer.wte.weight
    tokens = torch.randint(0, 101, (3, 16))
    tokens[0, :5] = -tokens[0, :5] - 1  # context only: not trained

    for dtype, grad_tol in ((torch.float32, 1e-6), (torch.bfloat16, 2e-3)):
        autocast = lambda device: torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32)  # noqa: E731
        ctx = types.SimpleNamespace(chunked_head=chunked.lm_head, device=torch.device("cpu"), document_eos=None,
                                    precision=types.SimpleNamespace(autocast=autocast))
        plain.zero_grad(), chunked.zero_grad()
        with autocast("cpu"):
            want = lm_loss(plain(input_ids=input_ids(tokens)).logits, tokens)
        want.backward()
        got = chunked_loss.forward_loss(chunked, tokens, ctx)
        got.backward()
        assert got.item() == pytest.approx(want.item(), abs=1e-6)
        for (name, p), q in zip(plain.named_parameters(), chunked.parameters()):
            assert (p.grad - q.grad).abs().max() <= grad_tol, name
        with torch.no_grad():
            assert chunked_loss.forward_loss(chunked, tokens, ctx).item() == pytest.approx(want.item(), abs=1e-6)


def test_the_chunked_loss_trains_like_the_head_under_fsdp(token_data, tmp_path):
    """Two FSDP2 ranks (the head's weight sharded, gathered for its forward, reduce-scattered after): the per-step
    losses of the unfused run (the tensor-parallel test's reference, conftest.run_layout), with the blocks
    checkpointed selectively (recomputing changes no value); refused by name before any job where it cannot run."""
    import json

    import pytest
    from conftest import run_layout

    from workflow_scripts import config_check

    _, want = run_layout(token_data, tmp_path, "1d", "qwen2-tiny", "fsdp", {"dp": 2})
    summary, got = run_layout(token_data, tmp_path, "chunked", "qwen2-tiny", "fsdp", {"dp": 2}, chunked_loss=64,
                              gradient_checkpointing="selective")
    assert got == pytest.approx(want, abs=1e-4) and got[-1] < got[0]
    settings = json.loads((tmp_path / "chunked/out/strategy_settings.json").read_text())["harness"]
    assert settings["chunked_loss"].startswith("LM head + cross-entropy in chunks of 64")
    assert settings["gradient_checkpointing"] == "selective"
    cfg = {"train": {"chunked_loss": 64, "compile_model": True}, "models": ["vit-base-16", "gpt2-tiny"],
           "strategies": ["ddp"], "world_sizes": [1], "layouts": [{"dp": 1, "tp": 2}]}
    assert config_check.chunked_loss_problems(cfg) == [
        "train.chunked_loss: vit-base-16 is an image classifier (no LM head)",
        "train.chunked_loss: not with train.compile_model: true (not checked compiled yet)",
        "train.chunked_loss: data-parallel layouts only (dp1-tp2)"]


def test_selective_checkpointing_recomputes_no_matmul_and_changes_no_gradient():
    """train.gradient_checkpointing (training/recompute.py) on a small Qwen2, eager and with compiled blocks: the
    gradients of no checkpointing; the backward runs each forward matmul again under "full" and none under
    "selective" (counted as the matmuls dispatched during backward: two per forward matmul, its input and weight
    gradients, plus the recomputed ones); the memory model keeps more per token and layer than "full", less than
    none."""
    import pytest
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from workflow_scripts.plan import memory_model as mm
    from workflow_scripts.training import recompute

    class Matmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
            return func(*args, **(kwargs or {}))

    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, use_cache=False)
    tokens = torch.randint(0, 96, (2, 12))

    def gradients(how, compiled=False):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg).train()
        assert recompute.enable(model, {"gradient_checkpointing": how}) == {"gradient_checkpointing": how or False}
        if compiled:
            for block in model.model.layers:
                block.compile()
        loss = model(input_ids=tokens, labels=tokens).loss
        counted = Matmuls()
        with counted:
            loss.backward()
        return {n: p.grad for n, p in model.named_parameters()}, counted.n

    plain, backward = gradients(False)
    # full: q, k, v, o, gate and up again per layer (down's output feeds only the residual add: torch's checkpoint
    # stops recomputing once what the backward needs is back)
    for how, recomputed in (("full", 6 * cfg.num_hidden_layers), ("selective", 0)):
        got, n = gradients(how)
        assert n == backward + recomputed, how
        for name, grad in got.items():
            assert torch.allclose(grad, plain[name], atol=1e-6), (how, name)
    compiled, _ = gradients("selective", compiled=True)
    for name, grad in compiled.items():
        assert torch.allclose(grad, plain[name], atol=1e-5), name
    shape = mm.Shape("qwen2", 0, 2, 32, 64, 16, 8, 96)
    kept = [mm.checkpoint_input_bytes(shape, "bf16-mixed"), mm.selective_bytes(shape, "bf16-mixed"),
            mm.activation_bytes_per_token_layer(shape, "bf16-mixed")]
    assert kept == sorted(kept) and recompute.mode({"gradient_checkpointing": True}) == "full"
    with pytest.raises(ValueError, match="train.gradient_checkpointing"):
        recompute.mode({"gradient_checkpointing": "some"})
