"""The step-time model (plan/step_time.py): each term against a hand-computed case, on flat rates (every GEMM at
100 TFLOP/s, attention at 50, 1,000 GB/s device copies, 10 us launches, 100 GB/s bus bandwidth)."""
from __future__ import annotations

import math

import pytest

from workflow_scripts import schema
from workflow_scripts.plan import memory_model as mm
from workflow_scripts.plan import predict as pm
from workflow_scripts.plan import step_time as st

GRID = (1, 10**6)
CURVES = {"matmul_bf16": [{"m": 1, "k": 1, "n": 1, "tflops": 100.0}],  # a calibration's curves, both masks of SDPA
          "sdpa_bf16": [{"causal": c, "seq": 1, "head_dim": 1, "tflops": 50.0} for c in (True, False)]}

TRAIN = schema.filled("train", {})  # the schema's train settings, as a resolved run spec carries them


def flat_rates(**kw) -> st.Rates:
    matmul = tuple((m, k, n, 100.0) for m in GRID for k in GRID for n in GRID)
    sdpa = tuple((causal, s, e, 50.0) for causal in (True, False) for s in GRID for e in GRID)
    return st.Rates(matmul=matmul, sdpa=sdpa, hbm=1000.0, launch_us=10.0,
                    busbw={("all_reduce", 2): ((1.0, 100.0), (1e12, 100.0)),
                           ("all_gather", 2): ((1.0, 100.0), (1e12, 100.0))}, **kw)


def gpt2_run(**kw) -> st.Run:
    # one layer, d 64, f 256, vocabulary 1000; 1 sample of 32 tokens
    shape = mm.Shape("gpt2", n_params=100_000, n_layer=1, d=64, ffn=256, kv=64, head_dim=16, vocab=1000)
    base = dict(shape=shape, family="ddp", zero_stage=0, strategy="ddp", micro_batch=1, accum=1, tokens=32,
                layout={"dp": 1}, levers="eager", compile_loss=False, checkpointing=False, trainable=100_000,
                tensors=16)
    return st.Run(**{**base, **kw})


def test_interpolation_is_exact_on_the_grid_and_log_linear_between():
    points = ((1, 10.0), (100, 1000.0))
    assert st.interpolate(points, (1,)) == pytest.approx(10.0)
    assert st.interpolate(points, (10,)) == pytest.approx(100.0)  # halfway in log: the geometric mean
    assert st.interpolate(points, (10**4,)) == pytest.approx(1000.0)  # clamped at the edge
    grid = tuple((m, k, float(m * k)) for m in (1, 100) for k in (1, 100))
    assert st.interpolate(grid, (10, 10)) == pytest.approx(100.0)


def test_gemm_term_counts_forward_and_both_gradients_of_every_matmul():
    run = gpt2_run()
    per_token = 2 * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64 + 64 * 1000)  # qkv, proj, fc, proj, head
    assert st.gemm_seconds(run, flat_rates(), 32) == pytest.approx(3 * 32 * per_token / 100e12)
    frozen = gpt2_run(trainable=1000)  # LoRA-like: no weight gradients
    assert st.gemm_seconds(frozen, flat_rates(), 32) == pytest.approx(2 * 32 * per_token / 100e12)
    again = gpt2_run(checkpointing=True)  # the blocks' forward recomputed, not the head's
    blocks = 2 * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64)
    assert st.gemm_seconds(again, flat_rates(), 32) == pytest.approx((3 * per_token + blocks) * 32 / 100e12)
    # selective (training/recompute.py): every matmul output kept, none recomputed; torchtitan's policy: half
    kept = gpt2_run(checkpointing=True, selective=True, matmuls_recomputed=0.0)
    assert st.gemm_seconds(kept, flat_rates(), 32) == pytest.approx(3 * per_token * 32 / 100e12)
    half = gpt2_run(checkpointing=True, selective=True, matmuls_recomputed=0.5)
    assert st.gemm_seconds(half, flat_rates(), 32) == pytest.approx((3 * per_token + blocks / 2) * 32 / 100e12)


def test_a_matmul_with_an_odd_width_runs_at_the_calibrated_share_of_the_rate(constants):
    # the head of a vocabulary of 1,001 rows (not a multiple of 8): its three matmuls at a quarter (constants) of 100
    # TFLOP/s, or at the calibration's own rate for such matmuls where it measured one
    odd = gpt2_run(shape=mm.Shape("gpt2", n_params=100_000, n_layer=1, d=64, ffn=256, kv=64, head_dim=16, vocab=1001))
    blocks = 2 * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64)
    head = 2 * 64 * 1001
    # 3 x 32 tokens x (98,304 + 4 x 128,128) FLOPs at 100 TFLOP/s
    assert st.gemm_seconds(odd, flat_rates(), 32) == pytest.approx(5.8638336e-7)
    measured = flat_rates(matmul_unaligned=20.0)
    assert st.width_share(measured, 64, 1001) == pytest.approx(0.2)
    assert st.width_share(measured, 64, 1000) == 1.0  # the tokens (m) are no leading dimension: 33 would not count
    assert st.gemm_seconds(odd, measured, 32) == pytest.approx(3 * 32 * (blocks / 100e12 + head / 20e12))


def test_attention_term_is_sdpa_forward_and_backward_at_its_masks_rate():
    # 4 heads of 16, sequence 32: 4 s^2 h e / 2 forward (causal), 3.5x that forward + backward
    flops = 3.5 * 4 * 1 * 4 * 32 * 32 * 16 / 2
    assert st.attention_seconds(gpt2_run(), flat_rates(), 1) == pytest.approx(flops / 50e12)
    vit = gpt2_run(shape=mm.Shape("vit", n_params=100_000, n_layer=1, d=64, ffn=256, kv=64, head_dim=16, vocab=10,
                                  vision=True))
    assert st.attention_seconds(vit, flat_rates(), 1) == pytest.approx(2 * flops / 50e12)  # full: the whole matrix
    both = flat_rates()
    both = st.Rates(**{**both.__dict__, "sdpa": tuple(p for p in both.sdpa if p[0])
                       + tuple((False, s, e, 100.0) for s in GRID for e in GRID)})
    assert st.attention_seconds(vit, both, 1) == pytest.approx(2 * flops / 100e12)  # at the full mask's own rate
    assert st.attention_seconds(gpt2_run(), both, 1) == pytest.approx(flops / 50e12)


def test_memory_and_optimizer_terms_are_bytes_at_the_copy_bandwidth(constants):
    run = gpt2_run()  # no block measured anywhere (constants): at the copy's bandwidth
    # 32 tokens x (200 x (64 + 256) + 60 x 1000) = 3,968,000 bytes at 1,000 GB/s
    assert st.memory_seconds(run, flat_rates(), 32) == pytest.approx(3.968e-6)
    assert st.optimizer_seconds(run, flat_rates()) == (pytest.approx(100_000 * 28 / 1000e9), 0.0)
    zero1 = gpt2_run(family="deepspeed", zero_stage=1, layout={"dp": 2})  # states sharded over two ranks
    assert st.optimizer_seconds(zero1, flat_rates())[0] == pytest.approx(50_000 * 28 / 1000e9)
    # clipped gradients: their norm reads them, the scaling reads and writes them
    assert st.optimizer_seconds(gpt2_run(grad_clip=True), flat_rates())[0] == pytest.approx(100_000 * 40 / 1000e9)
    # a MoE layer's MLP width: its shared expert and the top-k routed experts a token passes through
    moe = mm.Shape("qwen2_moe", n_params=100_000, n_layer=1, d=64, ffn=128, kv=64, head_dim=16, vocab=1000,
                   experts=8, top_k=2, expert_ffn=32, shared_ffn=128, moe=True)
    # 32 x (200 x (64 + 128 + 2 x 32) + 60 x 1000) = 3,558,400 bytes
    assert st.memory_seconds(gpt2_run(shape=moe), flat_rates(), 32) == pytest.approx(3.5584e-6)
    # FSDP2 under a bf16 param_dtype casts and copies every parameter it gathers, each micro-batch: with ep 2 a MoE's
    # routed experts (3 x 8 x 64 x 32 = 49,152 here) are gathered by half; under fp32 parameters nothing is counted
    fsdp = {"shape": moe, "family": "fsdp", "strategy": "fsdp", "zero_stage": 3}
    assert st.fsdp_cast_bytes(gpt2_run(**fsdp, precision="bf16-pure")) == 1_000_000  # 10 bytes x 100,000
    assert st.fsdp_cast_bytes(gpt2_run(**fsdp, precision="bf16-pure", layout={"dp": 2, "ep": 2})) == \
        10 * (100_000 - 24_576)
    assert st.fsdp_cast_bytes(gpt2_run(**fsdp, precision="bf16-mixed")) == 0 == st.fsdp_cast_bytes(
        gpt2_run(shape=moe, precision="bf16-pure"))


def test_memory_work_runs_at_the_fitted_copy_times_the_machines_block_kernels_over_the_fitted_machines():
    """A machine whose block kernels run at 1.2x the fitted machine's moves the memory term's bytes at 1.2x the
    fitted machine's copy bandwidth, per block and lever set, whatever its own copy measured; without the block on
    either side, at its own copy's bandwidth."""
    run, compiled = gpt2_run(), gpt2_run(levers="blocks")
    qwen = gpt2_run(shape=mm.Shape("qwen2", n_params=100_000, n_layer=1, d=64, ffn=256, kv=64, head_dim=16,
                                   vocab=1000))
    assert st.memory_block(run) == "layernorm_gelu,eager" and st.memory_block(compiled) == "layernorm_gelu,compiled"
    assert st.memory_block(qwen) == "rmsnorm_rotary_silu,eager"
    blocks = {"layernorm_gelu,eager": 3000.0, "layernorm_gelu,compiled": 4000.0}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(st, "MEMORY_FITTED", {"hbm": 800.0, "layernorm_gelu,eager": 2500.0,
                                         "layernorm_gelu,compiled": 4000.0})
        plain = st.memory_seconds(run, flat_rates(), 32)  # at its own copy's 1,000 GB/s
        assert st.memory_rate(run, flat_rates(memory_block=blocks)) == pytest.approx(800.0 * 1.2)
        assert st.memory_seconds(run, flat_rates(memory_block=blocks), 32) == pytest.approx(plain * 1000 / 960)
        assert st.memory_rate(compiled, flat_rates(memory_block=blocks)) == pytest.approx(800.0)
        assert st.memory_rate(qwen, flat_rates(memory_block=blocks)) == 1000.0  # no such block: its own copy's
        assert st.memory_rate(run, flat_rates()) == 1000.0
    rates = st.Rates.of({"rows": [{"name": "hbm_copy[0]", "value": 1000.0},
                                  {"name": "memory_block[rmsnorm_rotary_silu,compiled]", "value": 1250.0}],
                         "curves": {"matmul_bf16": [{"m": 1, "k": 1, "n": 1, "tflops": 1.0}],
                                    "sdpa_bf16": CURVES["sdpa_bf16"]}})
    assert rates.memory_block == {"rmsnorm_rotary_silu,compiled": 1250.0}


@pytest.fixture
def constants(monkeypatch):
    """The software's constants set to round values, so every expected figure below is worked by hand from the
    test's own numbers (never from the fitted file): an eager layer moves 200 bytes per token and (d + f), a compiled
    one 40, the loss 60 bytes per token and vocabulary entry (eager) or 4 (compiled); a layer issues 100 launches
    eager, 40 in compiled blocks, a micro-batch 50 more; DeepSpeed's optimizer 3 per parameter tensor, DDP's reducer
    2; hooks: FSDP2 20 a unit, ZeRO-3 5 a tensor (eager) or 2 (compiled blocks); a TP block's dispatch 1.5 pairs a
    linear, its clip 1 pair a layer at one rank and 2 at two; ZeRO-3 hides a tenth of its collectives; an odd-width
    matmul runs at 0.25 of the rate; FSDP2 casts 10 bytes a gathered parameter."""
    for name, value in {"MEMORY_BYTES": {"eager": 200.0, "blocks": 40.0, "model": 40.0},
                        "LOSS_BYTES": {"eager": 60.0, "compiled": 4.0},
                        "HOST_OPS": {"eager": 100.0, "blocks": 40.0, "model": 20.0, "graphs": 0.0},
                        "FIXED_OPS": 50.0, "DS_OPS_PER_TENSOR": 3.0, "DDP_OPS_PER_TENSOR": 2.0,
                        "HOOK_OPS": {"fsdp": 20.0, "zero3": 5.0, "zero3_blocks": 2.0},
                        "TP_BLOCK_SHARE": 1.5, "TP_CLIP_PAIRS": {1: 1.0, 2: 2.0}, "ZERO3_OVERLAP": 0.1,
                        "UNALIGNED_SHARE": 0.25, "FSDP_CAST_BYTES": 10, "MEMORY_FITTED": {}}.items():
        monkeypatch.setattr(st, name, value)


DEEP = mm.Shape("gpt2", n_params=100_000, n_layer=4, d=64, ffn=256, kv=64, head_dim=16, vocab=1000)  # 4 layers


def test_host_term_is_launches_at_the_calibrated_cost(constants):
    # two micro-batches of one eager layer: 2 x (100 + 50) launches, and torch's fused AdamW's 10: 310 x 10 us
    assert st.host_seconds(gpt2_run(accum=2), flat_rates()) == pytest.approx(3.1e-3)
    # a layer issuing 3x a dense layer's kernels: 2 x (300 + 50) + 10 = 710 launches
    assert st.host_seconds(gpt2_run(accum=2, kernel_ratio=3.0), flat_rates()) == pytest.approx(7.1e-3)
    # DeepSpeed's ZeRO-1/2 optimizer: 3 launches per parameter tensor in place of the 10: 100 + 50 + 3 x 16 = 198
    assert st.host_seconds(gpt2_run(family="deepspeed", zero_stage=2), flat_rates()) == pytest.approx(1.98e-3)


def test_the_host_readies_each_sample_at_its_copy_bandwidth():
    # a 3 x 224 x 224 image row and its label, uint8: gathered (1 byte a value), widened to int64 (1 read, 8
    # written: 4.5 copied) and pinned (8): 13.5 bytes a value; a uint16 token: 2 + 5 + 8 = 15
    assert pm.host_copy_bytes("vit-tiny", 150_529, 10) == 2_032_141.5
    assert pm.host_copy_bytes("gpt2-tiny", 64, 256) == 960
    images = gpt2_run(accum=2, micro_batch=4, host_copy_bytes=2_032_141.5)
    # 2 micro-batches of 4 rows at 5 GB/s: 16,257,132 bytes in 3.25 ms
    assert st.host_seconds(images, flat_rates(host_memcpy=5.0)) - st.host_seconds(
        gpt2_run(accum=2, micro_batch=4), flat_rates()) == pytest.approx(3.2514264e-3)
    assert math.isnan(st.host_seconds(images, flat_rates()))  # no host_memcpy row: not modelled


def test_sharded_engines_add_their_hooks_per_unit_or_per_tensor(constants):
    # FSDP2 over 4 layers: a unit per block, 4 x (100 + 20) + 50 + 10 = 540 launches; one unit: 400 + 20 + 60 = 480
    per_block, one_unit = (gpt2_run(shape=DEEP, family="fsdp", zero_stage=3, hooks_per_block=b) for b in (True, False))
    assert st.host_seconds(per_block, flat_rates()) == pytest.approx(5.4e-3)
    assert st.host_seconds(one_unit, flat_rates()) == pytest.approx(4.8e-3)
    # ZeRO-3 per parameter tensor (16): eager 400 + 5 x 16 + 60 = 540; compiled blocks 4 x 40 + 2 x 16 + 60 = 252
    z3, z3_blocks = (gpt2_run(shape=DEEP, family="deepspeed", zero_stage=3, levers=lv) for lv in ("eager", "blocks"))
    assert st.host_seconds(z3, flat_rates()) == pytest.approx(5.4e-3)
    assert st.host_seconds(z3_blocks, flat_rates()) == pytest.approx(2.52e-3)
    plan = dict(model="gpt2-tiny", strategy="fsdp", precision="fp32", micro_batch=1, accum=1, seq_len=64, vocab=256,
                train=TRAIN)
    assert st.run_for(layout={"dp": 1}, **plan).tensors == 28  # wte, wpe, ln_f's 2 and 12 a block
    assert not st.run_for(layout={"dp": 1}, **plan).hooks_per_block  # one rank: one unit (the strategy's own rule)
    assert st.run_for(layout={"dp": 2}, **plan).hooks_per_block
    assert st.run_for(layout={"dp": 1}, applied={"wrap_blocks": True}, **plan).hooks_per_block  # as it recorded


def test_a_recomputed_block_replays_its_forwards_launches_from_the_host(constants):
    plain, full, inside = (gpt2_run(levers="blocks", checkpointing=c, selective=sel)
                           for c, sel in ((False, False), (True, False), (True, True)))
    # half a compiled layer's 40 launches again: 20 x 10 us
    assert st.host_seconds(full, flat_rates()) - st.host_seconds(plain, flat_rates()) == pytest.approx(0.2e-3)
    assert st.host_seconds(inside, flat_rates()) == st.host_seconds(plain, flat_rates())  # inside the compiled graph
    # ZeRO-3 gathers again with the replayed forward: 0.5 x (4 x 100 + 16 x 5) = 240 launches
    plain, full = (gpt2_run(shape=DEEP, family="deepspeed", zero_stage=3, checkpointing=c) for c in (False, True))
    assert st.host_seconds(full, flat_rates()) - st.host_seconds(plain, flat_rates()) == pytest.approx(2.4e-3)
    plan = dict(model="gpt2-tiny", strategy="fsdp", precision="fp32", micro_batch=1, accum=1, seq_len=64, vocab=256)
    selective = st.run_for(layout={"dp": 1}, train={**TRAIN, "gradient_checkpointing": "selective"}, **plan)
    assert selective.selective and selective.matmuls_recomputed == 0.0


def test_eager_tensor_parallelism_pays_dtensors_dispatch_per_linear_and_its_clip(constants):
    # tp 2 x pp 2 over 4 layers: 2 layers a stage, 7 parallel linears a block (parallel/tensor.py), 2 micro-batches,
    # 1.5 pairs of 500 us a linear: 2 x 7 x 2 x 750 us = 21 ms
    tp = gpt2_run(shape=DEEP, accum=2, layout={"dp": 1, "tp": 2, "pp": 2})
    assert st.host_seconds(tp, flat_rates(tp_linear_us=500.0)) - st.host_seconds(tp, flat_rates(tp_linear_us=0.0)) \
        == pytest.approx(21e-3)
    assert math.isnan(st.host_seconds(tp, flat_rates()))  # no tp_linear_us row: not modelled
    # at the pair measured on a mesh of the run's 2 tp ranks (800 us; the nearest count measured): 33.6 ms
    ranks = flat_rates(tp_linear_us=500.0, tp_linear_ranks=((2, 800.0), (8, 2000.0)))
    assert st.host_seconds(tp, ranks) - st.host_seconds(tp, flat_rates(tp_linear_us=0.0)) == pytest.approx(33.6e-3)
    # the clip over two meshes once a step: 2 layers x 800 us x 2 pairs (two ranks) = 3.2 ms
    clipped = gpt2_run(shape=DEEP, accum=2, layout={"dp": 1, "tp": 2, "pp": 2}, grad_clip=True)
    assert st.host_seconds(clipped, ranks) - st.host_seconds(tp, ranks) == pytest.approx(3.2e-3)
    # compiled blocks trace the dispatch away; the clip runs outside them: 4 layers x 500 us x 2 = 4 ms
    compiled = gpt2_run(shape=DEEP, levers="blocks", layout={"dp": 1, "tp": 2})
    assert st.host_seconds(compiled, flat_rates(tp_linear_us=500.0)) == st.host_seconds(compiled, flat_rates())
    compiled_clip = gpt2_run(shape=DEEP, levers="blocks", layout={"dp": 1, "tp": 2}, grad_clip=True)
    assert st.host_seconds(compiled_clip, flat_rates(tp_linear_us=500.0)) - st.host_seconds(
        compiled, flat_rates(tp_linear_us=500.0)) == pytest.approx(4e-3)


def test_eager_zero3s_hooks_cost_the_calibrated_time_per_tensor_and_module(constants):
    z3, z3_blocks = (gpt2_run(shape=DEEP, accum=2, family="deepspeed", zero_stage=3, levers=lv)
                     for lv in ("eager", "blocks"))
    calibrated = flat_rates(zero3_tensor_us=800.0)
    # 16 tensors at 800 us in place of 5 launches of 10 us, 2 micro-batches: 2 x 16 x 750 us = 24 ms
    assert st.host_seconds(z3, calibrated) - st.host_seconds(z3, flat_rates()) == pytest.approx(24e-3)
    assert st.host_seconds(z3_blocks, calibrated) == st.host_seconds(z3_blocks, flat_rates())  # fitted hooks kept
    # each module beyond the calibrated stack's 49 a 96 tensors at 300 us: 30 - 16 x 49 / 96 = 21.83 modules, 2
    # micro-batches: 13.1 ms
    with_modules = flat_rates(zero3_tensor_us=800.0, zero3_module_us=300.0)
    z3m = gpt2_run(shape=DEEP, accum=2, family="deepspeed", zero_stage=3, modules=30)
    free = flat_rates(zero3_tensor_us=800.0, zero3_module_us=0.0)
    assert st.host_seconds(z3m, with_modules) - st.host_seconds(z3m, free) == pytest.approx(13.1e-3)
    assert math.isnan(st.host_seconds(z3m, calibrated))  # no zero3_module_us row: not modelled
    noisy = flat_rates(zero3_tensor_us=800.0, zero3_module_us=-20.0)  # a difference measured below zero: no cost
    assert st.host_seconds(z3m, noisy) == st.host_seconds(z3m, free)
    # over 2 data-parallel ranks at the engine's 1,200 us (400 more a tensor: 2 x 16 x 400 us = 12.8 ms); one rank
    # keeps 800; the compiled blocks' fitted 2 launches a tensor scaled by 1,200 / 800: 2 x 16 x 1 x 10 us = 0.32 ms
    ranked = flat_rates(zero3_tensor_us=800.0, zero3_tensor_ranks=((2, 1200.0), (8, 4000.0)))
    z3_dp2, z3_blocks_dp2 = (gpt2_run(shape=DEEP, accum=2, family="deepspeed", zero_stage=3, levers=lv,
                                      layout={"dp": 2}) for lv in ("eager", "blocks"))
    assert st.host_seconds(z3_dp2, ranked) - st.host_seconds(z3_dp2, calibrated) == pytest.approx(12.8e-3)
    assert st.host_seconds(z3, ranked) == st.host_seconds(z3, calibrated)
    assert st.host_seconds(z3_blocks_dp2, ranked) - st.host_seconds(z3_blocks_dp2, calibrated) == \
        pytest.approx(0.32e-3)


def test_the_rank_count_rows_of_a_calibration_are_read_by_rank_count():
    curves = CURVES
    rows = [{"name": "hbm_copy[0]", "value": 1000.0}, {"name": "launch_us[0]", "value": 7.0},
            {"name": "zero3_tensor_us", "value": 600.0}, {"name": "zero3_tensor_us_ranks[2]", "value": 750.0},
            {"name": "tp_linear_us", "value": 700.0}, {"name": "tp_linear_us_ranks[4]", "value": 1200.0},
            {"name": "tp_linear_us_ranks[2]", "value": 1100.0}]
    rates = st.Rates.of({"rows": rows, "curves": curves})
    assert rates.zero3_tensor_ranks == ((2, 750.0),) and rates.tp_linear_ranks == ((2, 1100.0), (4, 1200.0))
    assert (rates.zero3_tensor_us, rates.tp_linear_us, rates.launch_us, rates.hbm) == (600.0, 700.0, 7.0, 1000.0)


def test_ddp_all_reduce_is_hidden_behind_the_backward_but_its_last_bucket_and_the_compute_it_slows():
    run = gpt2_run(layout={"dp": 2}, bucket=100_000.0)
    grads = 100_000 * 4
    ring = grads * 2 * (2 - 1) / 2 / 100e9
    exposed, _ = st.comm_seconds(run, flat_rates(), backward_s=1.0)
    assert exposed == pytest.approx(ring * 100_000 / grads)  # a long backward hides all but the last bucket
    exposed, _ = st.comm_seconds(run, flat_rates(), backward_s=0.0)
    assert exposed == pytest.approx(ring)
    assert st.comm_seconds(gpt2_run(), flat_rates(), 0.0)[0] == 0.0  # one rank: nothing to reduce
    # what it hides costs the backward its compute-bound share: a device of 3 s matmuls, 1 s attention, 4 s memory
    share = st.compute_share({"gemm": 3.0, "attention": 1.0, "memory": 4.0})
    assert share == 0.5
    hidden, _ = st.comm_seconds(run, flat_rates(), backward_s=1.0, compute=share)
    assert hidden == pytest.approx(ring * 100_000 / grads + (ring - ring * 100_000 / grads) * 0.5)
    assert st.comm_seconds(run, flat_rates(), backward_s=0.0, compute=share)[0] == pytest.approx(ring)  # none hidden


def test_zero3_hides_a_tenth_of_its_collectives_and_fsdp2_hides_them_behind_the_backward(constants):
    """DeepSpeed ZeRO-3's gathers and reduce-scatters overlapped 8-12 % in a trace (ZERO3_OVERLAP); FSDP2's prefetch
    hides them behind 1.5 x the backward but one layer's."""
    deep = mm.Shape("gpt2", n_params=100_000, n_layer=4, d=64, ffn=256, kv=64, head_dim=16, vocab=1000)
    zero3, fsdp = (gpt2_run(shape=deep, family=f, zero_stage=3, layout={"dp": 2}) for f in ("deepspeed", "fsdp"))
    gathers = 2 * 100_000 * 2 * (2 - 1) / 2 / 100e9  # parameters gathered forward and backward, bf16, 2 ranks
    scatter = 100_000 * 4 * (2 - 1) / 2 / 100e9  # fp32 gradients reduce-scattered
    for backward in (0.0, 1.0):  # 2 + 2 us, a tenth hidden (constants)
        assert st.comm_seconds(zero3, flat_rates(), backward)[0] == pytest.approx(3.6e-6)
    assert st.comm_seconds(fsdp, flat_rates(), 0.0)[0] == pytest.approx(gathers + scatter)
    assert st.comm_seconds(fsdp, flat_rates(), 1.0)[0] == pytest.approx((gathers + scatter) / 4)  # one of 4 layers


def test_the_step_is_the_slower_of_device_and_host_plus_exposed_communication():
    run = gpt2_run(layout={"dp": 2})
    p = st.predict(run, flat_rates())
    device = p.parts["gemm"] + p.parts["attention"] + p.parts["memory"] + p.parts["optimizer"]
    assert p.step_s == pytest.approx(max(device, p.parts["host"]) + p.parts["comm"])
    assert p.bound == "host"  # a 64-wide model: launches, not arithmetic, set the pace
    assert p.tokens_per_s(64) == pytest.approx(64 / p.step_s)
    pipeline = st.predict(gpt2_run(layout={"pp": 1, "dp": 1}, accum=4), flat_rates())
    assert "bubble" not in pipeline.parts


def test_host_work_slows_by_the_calibrated_share_where_ranks_share_the_node():
    rates = flat_rates(host_beside=((2, 1.2), (4, 1.5)))
    assert [st.beside(rates, n) for n in (1, 2, 3, 4, 8)] == [1.0, 1.2, 1.5, 1.5, 1.5]  # nearest; a tie: the larger
    assert st.beside(flat_rates(), 2) == 1.0  # a calibration without the row
    assert st.beside(flat_rates(host_beside=((2, 0.9),)), 2) == 1.0  # never faster than alone
    two = gpt2_run(layout={"dp": 2})
    assert st.predict(two, rates).parts["host"] == pytest.approx(1.2 * st.host_seconds(two, rates))
    assert st.predict(gpt2_run(), rates).parts["host"] == pytest.approx(st.host_seconds(gpt2_run(), rates))
    from workflow_scripts.measure.calibrate import host_beside_rows
    rows = [{"name": "launch_us[0]", "value": 5.0}, {"name": "launch_us_ranks[2]", "value": 6.0}]
    assert [(r["name"], r["value"]) for r in host_beside_rows(rows)] == [("host_beside[2]", pytest.approx(1.2))]


def test_ddp_over_several_ranks_adds_its_reducer_per_parameter_tensor_once_a_step(constants):
    one, two = gpt2_run(), gpt2_run(layout={"dp": 2})
    reducer = 0.32e-3  # 2 launches (constants) x 16 tensors at 10 us a launch
    assert st.host_seconds(two, flat_rates()) - st.host_seconds(one, flat_rates()) == pytest.approx(reducer)
    accum = gpt2_run(layout={"dp": 2}, accum=4)  # no_sync: the reducer runs with the last micro-batch only
    assert st.host_seconds(accum, flat_rates()) - st.host_seconds(gpt2_run(accum=4), flat_rates()) == pytest.approx(
        reducer)
    fsdp = gpt2_run(layout={"dp": 2}, family="fsdp", strategy="fsdp", zero_stage=3)
    assert st.host_seconds(fsdp, flat_rates()) == st.host_seconds(gpt2_run(family="fsdp", strategy="fsdp",
                                                                            zero_stage=3), flat_rates())


def test_a_calibration_without_the_curves_is_refused_by_name():
    old = {"rows": [{"name": "matmul_bf16[0]", "value": 700.0}, {"name": "launch_us[0]", "value": 10.0}]}
    with pytest.raises(ValueError, match="matmul_bf16, sdpa_bf16"):
        st.Rates.of(old)
    causal_only = {"rows": [{"name": "hbm_copy[0]", "value": 1000.0}],
                   "curves": {**CURVES, "sdpa_bf16": CURVES["sdpa_bf16"][:1]}}
    with pytest.raises(ValueError, match="both masks"):
        st.Rates.of(causal_only)
    assert math.isinf(st.comm_seconds(gpt2_run(layout={"dp": 4}), st.Rates((), (), 1.0, 1.0), 0.0)[0]) is False


def test_a_simulated_network_places_each_group_by_the_mesh_and_times_it_on_its_slower_link():
    from workflow_scripts.plan.fabric import Fabric

    f = Fabric(gpus_per_node=8, intra_node_busbw_gbs=400.0, inter_node_gbs=50.0, intra_node_latency_us=0.0,
               inter_node_latency_us=0.0)
    assert f.ranks_per_node({"dp": 16}, ("dp", "cp")) == 8
    assert f.ranks_per_node({"dp": 2, "tp": 8}, ("dp", "cp")) == 1  # tp fills the node: one dp peer per node
    assert f.ranks_per_node({"dp": 4, "tp": 2}, ("dp", "cp")) == 4 and f.ranks_per_node({"tp": 8}, ("tp",)) == 8
    assert f.busbw(16, 8, 1e9) == pytest.approx(400.0)  # eight NICs of a node: min(400, 8 x 50)
    assert f.busbw(2, 1, 1e9) == pytest.approx(50.0)  # one NIC
    assert f.busbw(4, 4, 1e9, calibrated=300.0) == 300.0 and f.busbw(4, 4, 1e9) == pytest.approx(400.0)
    slow = Fabric(gpus_per_node=1, intra_node_busbw_gbs=400.0, inter_node_gbs=50.0, intra_node_latency_us=0.0,
                  inter_node_latency_us=10.0)
    # 16 nodes: 2 log2(16) = 8 tree levels of 10 us beside 1 MB at 50 GB/s (20 us): 1 MB per 100 us
    assert slow.busbw(16, 1, 1e6) == pytest.approx(10.0)
    run = gpt2_run(family="deepspeed", zero_stage=0, strategy="zero0", layout={"dp": 16})
    grads = 100_000 * 4
    assert st.comm_seconds(run, flat_rates(), 0.0, f)[0] == pytest.approx(grads * 2 * 15 / 16 / 400e9)
    four = Fabric(gpus_per_node=4, intra_node_busbw_gbs=400.0, inter_node_gbs=50.0, intra_node_latency_us=0.0,
                  inter_node_latency_us=0.0)
    assert st.comm_seconds(run, flat_rates(), 0.0, four)[0] == pytest.approx(grads * 2 * 15 / 16 / 200e9)


def test_sequence_and_expert_layouts_pay_their_all_to_alls():
    # Ulysses over 2 ranks: q, k, v and the output (2d + 2kv per token, bf16) all-to-all'd forward and backward,
    # half of each rank's buffer leaving it; plus the gradients' all-reduce over dp x cp
    run = gpt2_run(layout={"dp": 1, "cp": 2})
    qkvo = 16 * (2 * 64 + 2 * 64) * 2
    ring = 100_000 * 4 * 2 * (2 - 1) / 2 / 100e9
    assert st.comm_seconds(run, flat_rates(), 0.0)[0] == pytest.approx(ring + 2 * qkvo / 2 / 100e9)
    moe = mm.Shape("qwen2_moe", n_params=100_000, n_layer=1, d=64, ffn=256, kv=32, head_dim=16, vocab=1000,
                   experts=4, top_k=2, expert_ffn=64, moe=True)
    ep = gpt2_run(shape=moe, family="fsdp", zero_stage=3, strategy="fsdp", layout={"dp": 2, "ep": 2})
    dense = gpt2_run(shape=moe, family="fsdp", zero_stage=3, strategy="fsdp", layout={"dp": 2})
    routed = 32 * 2 * 64 * 2  # tokens x top-k x d x 2 bytes, dispatched and combined forward and backward
    extra = st.comm_seconds(ep, flat_rates(), 0.0)[0] - st.comm_seconds(dense, flat_rates(), 0.0)[0]
    assert extra == pytest.approx(4 * routed / 2 / 100e9)


def test_the_scale_simulation_keeps_what_the_dimensions_accept_and_slows_with_the_network():

    from workflow_scripts.plan import scale
    from workflow_scripts.plan.fabric import Fabric
    from workflow_scripts.training.strategies import STRATEGIES

    fast = Fabric(gpus_per_node=8, intra_node_busbw_gbs=360.0, inter_node_gbs=45.0)
    layouts = scale.layouts("qwen2.5-3b", STRATEGIES["fsdp"], 8, fast, {**TRAIN, "grad_accum": 4}, 1024)
    keys = {layout.key for layout in layouts}
    assert {"ws8", "dp4-tp2", "dp4-pp2", "dp4-cp2", "dp2-pp2-tp2"} <= keys
    assert "dp2-tp4" not in keys  # the shape's 2 KV heads
    assert not any("pp" in k and "cp" in k for k in keys)  # cp and pp do not compose yet
    assert not any("ep" in k for k in keys)  # a dense model
    assert {layout.key for layout in scale.layouts("gpt2-medium", STRATEGIES["zero2"], 8, fast, TRAIN, 1024)} == {"ws8"}
    from test_memory_plan import planned

    config = planned({"plan": {"gpu_memory_gib": 80, "headroom_gib": 2, "models": ["gpt2-medium"],
                               "strategies": ["ddp"], "micro_batches": [4], "vocab": 50304,
                               "scale": {"gpus": [8, 64], "gpus_per_node": 8, "intra_node_busbw_gbs": 360.0,
                                         "inter_node_gbs": 45.0}},
                      "train": {"precision": "bf16-mixed", "compile_blocks": True, "compile_loss": True},
                      "platform": "cuda", "data": {"block_size": 1024}, "tokenizer": {"kind": "hub"}})
    rates = st.load_rates(st.RATES / "h100.json")
    slow = Fabric(gpus_per_node=8, intra_node_busbw_gbs=360.0, inter_node_gbs=0.5)

    def speed(fabric):
        frame = scale.candidates(config, rates, fabric)
        return frame[frame["layout"].str.startswith("ws")].set_index("gpus")["predicted_tokens_per_s_per_gpu"]

    quick, crawl = speed(fast), speed(slow)
    assert quick[8] == pytest.approx(crawl[8])  # one node: the network between nodes plays no part
    assert crawl[64] < 0.5 * quick[64]  # 8 nodes on a slow link: the all-reduce is exposed


PLANNED = dict(precision="bf16-mixed", micro_batch=1, accum=1, seq_len=64, vocab=256, train=TRAIN, layout={"dp": 1})


def test_deepcompile_rows_are_not_modelled_and_say_why():
    """DeepSpeed's DeepCompile puts ZeRO's reductions into the compiled graph: no term of the model counts them, so
    such a run is left out by name; the same strategy without it is modelled."""
    dc = st.run_for(model="gpt2-tiny", strategy="zero2", options={"compile": {"deepcompile": True}}, **PLANNED)
    assert dc.deepcompile and "DeepCompile" in st.not_modelled(dc)
    assert st.not_modelled(st.run_for(model="gpt2-tiny", strategy="zero2", **PLANNED)) is None


def test_zero3_runs_whose_compiled_blocks_traced_deepspeeds_linear_are_not_modelled():
    """A ZeRO-3 run that recorded compiled leaf blocks with DeepSpeed's linear traced into them (blocks calling
    F.linear: not GPT-2's Conv1D) had some blocks compiled and the rest eager: left out by name; with
    memory_efficient_linear off (COMPILED_ZERO3_KEYS), or GPT-2's blocks, it is modelled."""
    leaf = {"harness": {"zero3_leaf_modules": "Qwen2DecoderLayer"}, "deepspeed_config": {"zero_optimization": {}}}
    mended = {**leaf, "deepspeed_config": {"zero_optimization": {"memory_efficient_linear": False}}}
    old = st.run_for(model="qwen2-tiny", strategy="zero3", applied=leaf, **PLANNED)
    assert old.traced_ds_linear and "DeepSpeed's linear" in st.not_modelled(old)
    assert st.not_modelled(st.run_for(model="qwen2-tiny", strategy="zero3", applied=mended, **PLANNED)) is None
    gpt2 = {**leaf, "harness": {"zero3_leaf_modules": "GPT2Block"}}
    assert st.not_modelled(st.run_for(model="gpt2-tiny", strategy="zero3", applied=gpt2, **PLANNED)) is None


def test_a_layers_kernels_are_counted_on_the_real_layer():
    """Kernels of one layer forward and backward (views and allocations left out), counted on fake tensors: the
    families apart, the size of the layer and the run's shape overrides no matter (a count, not a size); the host
    term scales a MoE layer by its kernels against a dense layer of its family."""
    from workflow_scripts.plan.predict import kernel_ratio
    from workflow_scripts.plan.traced import REFERENCE_MODEL, layer_kernels

    gpt2, qwen, moe = layer_kernels("gpt2-tiny"), layer_kernels("qwen2-tiny"), layer_kernels("qwen2-moe-tiny")
    assert gpt2 == layer_kernels(REFERENCE_MODEL["gpt2"])  # a block's kernels do not grow with its width
    assert 40 < gpt2 < qwen < moe < 200  # rotary, RMS norms, a gated MLP; then a router, sort, gather, scatter
    # a MoE layer against a dense layer of its family; every dense family against itself
    assert kernel_ratio("qwen2-moe-tiny", '{"num_hidden_layers": 1}') == pytest.approx(moe / qwen)
    assert kernel_ratio("gpt2-tiny", "{}") == kernel_ratio("qwen2-tiny", "{}") == 1.0


def test_a_layouts_dimensions_of_one_rank_make_no_other_run():
    # a spec that writes every dimension (dp 2, tp 1, pp 1) and one that writes only dp 2 describe the same run
    kw = dict(model="gpt2-tiny", strategy="ddp", precision="bf16-mixed", micro_batch=1, accum=1, seq_len=64,
              vocab=512, train=TRAIN, n_params=10**6, trainable=10**6)
    assert st.run_for(layout={"dp": 2, "tp": 1, "pp": 1}, **kw) == st.run_for(layout={"dp": 2}, **kw)
