"""Model registry shapes, from_pretrained on local files, MFU and the predicted model-state memory."""
from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest
import torch

from workflow_scripts.measure import metrics
from workflow_scripts.training import models
from workflow_scripts.training.precision import policy

BF16_PURE = policy("bf16-pure").state_bytes


@pytest.mark.parametrize("name, millions", [("gpt2", 124), ("gpt2-medium", 355), ("gpt2-large", 774),
                                            ("gpt2-xl", 1558), ("qwen2.5-coder-1.5b", 1544), ("qwen2.5-3b", 3086)])
def test_registry_shapes_match_the_published_sizes(name, millions):
    vocab = 50257 if name.startswith("gpt2") else 151936
    with torch.device("meta"):
        model = models.build_model(name, vocab, 1024)
    assert abs(models.count_params(model) / 1e6 - millions) / millions < 0.01


def test_from_pretrained_loads_local_weights(tmp_path):
    model = models.build_model("gpt2-tiny", 320, 64)
    model.save_pretrained(tmp_path / "ckpt")
    loaded = models.build_model("gpt2-tiny", 320, 64, pretrained=str(tmp_path / "ckpt"))
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n


def test_cudnn_attention_is_registered_and_falls_back_to_sdpa_on_cpu():
    """train.attn_implementation: sdpa_cudnn builds through transformers' AttentionInterface; on a CPU rank (no cuDNN
    attention) it is plain sdpa: the same loss and gradients as sdpa from the same seed."""
    from transformers import AttentionInterface

    x = torch.randint(0, 320, (2, 64))
    grads = []
    for name in ("sdpa", "sdpa_cudnn"):
        torch.manual_seed(0)
        model = models.build_model("gpt2-tiny", 320, 64, attn_implementation=name)
        model(x, labels=x).loss.backward()
        grads.append(model.transformer.h[0].attn.c_attn.weight.grad)
    assert "sdpa_cudnn" in AttentionInterface._global_mapping and model.config._attn_implementation == "sdpa_cudnn"
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_the_profile_window_ends_the_run_and_a_step_timed_after_a_trace_is_named():
    """No timed step follows a trace by default (the profiler's after-effect: measure/profile.py); a run profiled
    before it did is recognised from its metrics.csv rows."""
    from workflow_scripts import schema
    from workflow_scripts.measure.profile import window

    cfg = schema.filled("profile", {"enabled": True})  # 1 warm-up + 3 recorded
    assert window(cfg, timed_from=3, total_steps=30) == range(26, 30)
    assert window(cfg, timed_from=3, total_steps=5) == range(3, 5)  # a short run: the warm-up and one recorded
    assert window(cfg, timed_from=3, total_steps=4) == range(3, 3)  # no step left to record: no trace
    assert window({**cfg, "at": "start", "wait": 2}, timed_from=3, total_steps=30) == range(5, 9)

    def rows(profiled):
        return [{"step": s, "warmup": s <= 2, "profiled": s in profiled} for s in range(1, 11)]

    assert metrics.timed_after_trace(rows({3, 4, 5, 6}))
    assert not metrics.timed_after_trace(rows({7, 8, 9, 10})) and not metrics.timed_after_trace(rows(set()))


def test_vocab_padding_and_flops():
    assert models.padded_vocab(50257, 64) == 50304 and models.padded_vocab(4096, 64) == 4096
    assert models.flops_per_token(100, 2, 8, 16) == 600 + 12 * 2 * 8 * 16
    # a study's model_overrides reach the FLOPs: the MoE cut to 4 layers idles 4 layers' experts, not 12 (a
    # negative MFU before: results/parallelism/h100-moe-profile)
    cut = models.model_spec("qwen1.5-moe-a2.7b-12l", {"num_hidden_layers": 4})
    n = 2_904_573_952  # the 4-layer model's parameters
    assert models.model_flops_per_token("qwen1.5-moe-a2.7b-12l", n, 1024, overrides={"num_hidden_layers": 4}) == \
        models.flops_per_token(n - cut.idle_expert_params, 4, 2048, 1024) > 0


def test_mfu_uses_the_peak_table():
    assert metrics.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert metrics.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert metrics.peak_tflops("AMD Instinct MI300X") == 1307.0
    assert metrics.peak_tflops("cpu") is None
    # 1e9 FLOP/token at 494,500 tokens/s on 1 H200 = 50% of 989 TFLOP/s
    assert metrics.mfu(1e9, 494_500, 1, "NVIDIA H200") == pytest.approx(0.5)
    assert metrics.mfu(1e9, 494_500, 2, "NVIDIA H200") == pytest.approx(0.25)


@pytest.mark.parametrize("stage, expected", [(0, 16), (1, 4 + 12 / 8), (2, 2 + 14 / 8), (3, 16 / 8)])
def test_model_state_memory_matches_the_zero_paper(stage, expected):
    got = metrics.model_state_bytes(1000, 8, stage, BF16_PURE)["predicted_model_state_bytes"]
    assert got == pytest.approx(expected * 1000)


def _estimator_gpu_bytes(fn, *args, **kwargs) -> float:
    with redirect_stdout(io.StringIO()):
        out = fn(*args, **kwargs)
    return out[1]  # (cpu_mem, gpu_mem)


def test_prediction_agrees_with_deepspeeds_own_estimators():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    psi, gpus = 1_000_000_000, 4
    # DeepSpeed counts 18 bytes/param for the partitioned part where the paper counts 14 (stage 2), 16 (stage 3)
    ds2 = _estimator_gpu_bytes(estimate_zero2_model_states_mem_needs, psi, num_gpus_per_node=gpus, num_nodes=1,
                               cpu_offload=False, additional_buffer_factor=1.0)
    ours2 = metrics.model_state_bytes(psi, gpus, 2, BF16_PURE)["predicted_model_state_bytes"]
    assert ours2 + 4 * psi / gpus == pytest.approx(ds2, rel=0.01)
    ds2_off = _estimator_gpu_bytes(estimate_zero2_model_states_mem_needs, psi, num_gpus_per_node=gpus,
                                   num_nodes=1, cpu_offload=True, additional_buffer_factor=1.0)
    ours2_off = metrics.model_state_bytes(psi, gpus, 2, BF16_PURE, offload_optimizer=True)
    assert ours2_off["predicted_model_state_bytes"] == pytest.approx(ds2_off, rel=0.01)
    ds3 = _estimator_gpu_bytes(estimate_zero3_model_states_mem_needs, psi, largest_layer_params=0,
                               num_gpus_per_node=gpus, num_nodes=1, cpu_offload=False, cpu_offload_params=False,
                               zero_init=True, additional_buffer_factor=1.0)
    ours3 = metrics.model_state_bytes(psi, gpus, 3, BF16_PURE)["predicted_model_state_bytes"]
    assert ours3 + 2 * psi / gpus == pytest.approx(ds3, rel=0.01)


def test_the_loss_skips_context_tokens_and_the_model_reads_them():
    import torch
    import torch.nn.functional as F

    from workflow_scripts.training.strategies.engine import input_ids, lm_loss

    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 8))
    tokens = torch.where(torch.arange(8) < 4, -ids - 1, ids)  # the first half of each row is context only
    logits = torch.randn(2, 8, 50)
    assert torch.equal(input_ids(tokens), ids)
    want = F.cross_entropy(logits[:, 3:7].reshape(-1, 50), ids[:, 4:].reshape(-1))  # targets 4..7 only
    assert lm_loss(logits, tokens).item() == pytest.approx(want.item(), abs=1e-6)
    assert lm_loss(logits, ids).item() == pytest.approx(F.cross_entropy(logits[:, :-1].reshape(-1, 50),
                                                                        ids[:, 1:].reshape(-1)).item(), abs=1e-6)
