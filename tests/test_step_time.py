"""The step-time model (plan/step_time.py): each term against a hand-computed case, on flat rates (every GEMM at
100 TFLOP/s, attention at 50, 1,000 GB/s device copies, 10 us launches, 100 GB/s bus bandwidth)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from workflow_scripts.plan import memory_model as mm
from workflow_scripts.plan import predict as pm
from workflow_scripts.plan import step_time as st

GRID = (1, 10**6)


def flat_rates(**kw) -> st.Rates:
    matmul = tuple((m, k, n, 100.0) for m in GRID for k in GRID for n in GRID)
    sdpa = tuple((True, s, e, 50.0) for s in GRID for e in GRID)  # causal only: a full mask takes its rate
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


def test_a_matmul_with_an_odd_width_runs_at_the_calibrated_share_of_the_rate():
    # the head of a vocabulary of 1,001 rows (not a multiple of 8): its three matmuls at UNALIGNED_SHARE of 100
    # TFLOP/s, or at the calibration's own rate for such matmuls where it measured one
    odd = gpt2_run(shape=mm.Shape("gpt2", n_params=100_000, n_layer=1, d=64, ffn=256, kv=64, head_dim=16, vocab=1001))
    blocks = 2 * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64)
    head = 2 * 64 * 1001
    share = st.UNALIGNED_SHARE
    assert st.gemm_seconds(odd, flat_rates(), 32) == pytest.approx(3 * 32 * (blocks + head / share) / 100e12)
    measured = flat_rates(matmul_unaligned=20.0)
    assert st.width_share(measured, 64, 1001) == pytest.approx(0.2)
    assert st.width_share(measured, 64, 1000) == 1.0  # the tokens (m) are no leading dimension: 33 would not count
    assert st.gemm_seconds(odd, measured, 32) == pytest.approx(3 * 32 * (blocks / 100e12 + head / 20e12))


def test_attention_term_is_sdpa_forward_and_backward_at_its_masks_rate():
    # 4 heads of 16, sequence 32: 4 s^2 h e / 2 forward (causal), 3.5x that forward + backward
    flops = 3.5 * 4 * 1 * 4 * 32 * 32 * 16 / 2
    assert st.attention_seconds(gpt2_run(), flat_rates(), 1) == pytest.approx(flops / 50e12)
    vit = gpt2_run(shape=mm.Shape("vit", n_params=100_000, n_layer=1, d=64, ffn=256, kv=64, head_dim=16, vocab=10))
    assert st.attention_seconds(vit, flat_rates(), 1) == pytest.approx(2 * flops / 50e12)  # full: the whole matrix
    both = flat_rates()
    both = st.Rates(**{**both.__dict__, "sdpa": both.sdpa + tuple((False, s, e, 100.0) for s in GRID for e in GRID)})
    assert st.attention_seconds(vit, both, 1) == pytest.approx(2 * flops / 100e12)  # at the full mask's own rate
    assert st.attention_seconds(gpt2_run(), both, 1) == pytest.approx(flops / 50e12)


def test_memory_and_optimizer_terms_are_bytes_at_the_copy_bandwidth(monkeypatch):
    monkeypatch.setattr(st, "MEMORY_FITTED", {})  # no block measured anywhere: the copy's bandwidth
    run = gpt2_run()
    moved = 32 * (st.MEMORY_BYTES["eager"] * (64 + 256) + st.LOSS_BYTES["eager"] * 1000)
    assert st.memory_seconds(run, flat_rates(), 32) == pytest.approx(moved / 1000e9)
    assert st.optimizer_seconds(run, flat_rates()) == (pytest.approx(100_000 * 28 / 1000e9), 0.0)
    zero1 = gpt2_run(family="deepspeed", zero_stage=1, layout={"dp": 2})  # states sharded over two ranks
    assert st.optimizer_seconds(zero1, flat_rates())[0] == pytest.approx(50_000 * 28 / 1000e9)
    # clipped gradients: their norm reads them, the scaling reads and writes them
    assert st.optimizer_seconds(gpt2_run(grad_clip=True), flat_rates())[0] == pytest.approx(100_000 * 40 / 1000e9)
    # a MoE layer's MLP width: its shared expert and the top-k routed experts a token passes through
    moe = mm.Shape("qwen2_moe", n_params=100_000, n_layer=1, d=64, ffn=128, kv=64, head_dim=16, vocab=1000,
                   experts=8, top_k=2, expert_ffn=32, shared_ffn=128)
    moved = 32 * (st.MEMORY_BYTES["eager"] * (64 + 128 + 2 * 32) + st.LOSS_BYTES["eager"] * 1000)
    assert st.memory_seconds(gpt2_run(shape=moe), flat_rates(), 32) == pytest.approx(moved / 1000e9)
    # FSDP2 under a bf16 param_dtype casts and copies every parameter it gathers, each micro-batch: with ep 2 a MoE's
    # routed experts (3 x 8 x 64 x 32 = 49,152 here) are gathered by half; under fp32 parameters nothing is counted
    fsdp = {"shape": moe, "family": "fsdp", "strategy": "fsdp", "zero_stage": 3}
    assert st.fsdp_cast_bytes(gpt2_run(**fsdp, precision="bf16-pure")) == st.FSDP_CAST_BYTES * 100_000
    assert st.fsdp_cast_bytes(gpt2_run(**fsdp, precision="bf16-pure", layout={"dp": 2, "ep": 2})) == \
        st.FSDP_CAST_BYTES * (100_000 - 49_152 / 2)
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
                                    "sdpa_bf16": [{"seq": 1, "head_dim": 1, "tflops": 1.0}]}})
    assert rates.memory_block == {"rmsnorm_rotary_silu,compiled": 1250.0}


def test_host_term_is_launches_at_the_calibrated_cost():
    run = gpt2_run(accum=2)
    ops = 2 * (st.HOST_OPS["eager"] * 1 + st.FIXED_OPS) + 10  # two micro-batches, torch's fused AdamW
    assert st.host_seconds(run, flat_rates()) == pytest.approx(ops * 10e-6)
    # another layer family: its launches in proportion to the kernels its layer issues
    assert st.host_seconds(gpt2_run(accum=2, kernel_ratio=3.0), flat_rates()) == pytest.approx(
        (2 * (st.HOST_OPS["eager"] * 3.0 + st.FIXED_OPS) + 10) * 10e-6)
    # the host readies each sample at its copy bandwidth, every micro-batch: a 3 x 224 x 224 image row and its label,
    # uint8, gathered (1 byte a value), widened to int64 (1 read, 8 written: 4.5 copied) and pinned (8); a uint16 token
    assert pm.host_copy_bytes("vit-tiny", 150_529, 10) == 150_529 * 13.5
    assert pm.host_copy_bytes("gpt2-tiny", 64, 256) == 64 * 15
    images = gpt2_run(accum=2, micro_batch=4, host_copy_bytes=150_529 * 13.5)
    assert st.host_seconds(images, flat_rates(host_memcpy=5.0)) - st.host_seconds(images, flat_rates()) == \
        pytest.approx(2 * 4 * 150_529 * 13.5 / 5e9)
    zero2 = gpt2_run(family="deepspeed", zero_stage=2)  # DeepSpeed's optimizer: launches per parameter tensor
    ops = st.HOST_OPS["eager"] + st.FIXED_OPS + st.DS_OPS_PER_TENSOR * 16
    assert st.host_seconds(zero2, flat_rates()) == pytest.approx(ops * 10e-6)
    # FSDP2's hooks per block, or once where one unit holds the model (a one-rank run's default, from the
    # strategy's own rule where nothing was recorded: a plan's candidate)
    deep = mm.Shape("gpt2", n_params=100_000, n_layer=4, d=64, ffn=256, kv=64, head_dim=16, vocab=1000)
    per_block, one_unit = (gpt2_run(shape=deep, family="fsdp", zero_stage=3, hooks_per_block=b) for b in (True, False))
    assert st.host_seconds(per_block, flat_rates()) == pytest.approx(
        (4 * (st.HOST_OPS["eager"] + st.HOOK_OPS["fsdp"]) + st.FIXED_OPS + 10) * 10e-6)
    assert st.host_seconds(one_unit, flat_rates()) == pytest.approx(
        (4 * st.HOST_OPS["eager"] + st.HOOK_OPS["fsdp"] + st.FIXED_OPS + 10) * 10e-6)
    # DeepSpeed ZeRO-3's hooks per parameter tensor (its Python walks every one), eager and compiled blocks apart
    for levers, key in (("eager", "zero3"), ("blocks", "zero3_blocks")):
        z3 = gpt2_run(shape=deep, family="deepspeed", zero_stage=3, levers=levers)
        assert st.host_seconds(z3, flat_rates()) == pytest.approx(
            (4 * st.HOST_OPS[levers] + st.HOOK_OPS[key] * 16 + st.FIXED_OPS + 10) * 10e-6)
    plan = dict(model="gpt2-tiny", strategy="fsdp", precision="fp32", micro_batch=1, accum=1, seq_len=64, vocab=256,
                train={})
    assert st.run_for(layout={"dp": 1}, **plan).tensors == 2 * 12 + 4  # the model's own: wte, wpe, ln_f and blocks
    assert not st.run_for(layout={"dp": 1}, **plan).hooks_per_block
    assert st.run_for(layout={"dp": 2}, **plan).hooks_per_block
    assert st.run_for(layout={"dp": 1}, applied={}, **plan).hooks_per_block  # a run from before one-unit wrapping
    # a block recomputed from the host replays its forward's launches; selective recomputation inside a compiled
    # block is part of the compiled backward
    plain, full, inside = (gpt2_run(levers="blocks", checkpointing=c, selective=sel)
                           for c, sel in ((False, False), (True, False), (True, True)))
    assert st.host_seconds(full, flat_rates()) - st.host_seconds(plain, flat_rates()) == pytest.approx(
        0.5 * st.HOST_OPS["blocks"] * 10e-6)
    assert st.host_seconds(inside, flat_rates()) == st.host_seconds(plain, flat_rates())
    # ... and, sharded, gathers its parameters again: ZeRO-3's hooks replayed with the forward
    plain, full = (gpt2_run(shape=deep, family="deepspeed", zero_stage=3, checkpointing=c) for c in (False, True))
    assert st.host_seconds(full, flat_rates()) - st.host_seconds(plain, flat_rates()) == pytest.approx(
        0.5 * (4 * st.HOST_OPS["eager"] + 16 * st.HOOK_OPS["zero3"]) * 10e-6)
    selective = st.run_for(layout={"dp": 1}, **{**plan, "train": {"gradient_checkpointing": "selective"}})
    assert selective.selective and selective.matmuls_recomputed == 0.0
    # eager tensor parallelism: each parallel linear of a block (7 in parallel/tensor.py) through DTensor's
    # dispatch at the real block's share of the calibrated pair's cost, per micro-batch and layer of this pipeline
    # stage; compiled blocks trace it away
    tp = gpt2_run(shape=deep, accum=2, layout={"dp": 1, "tp": 2, "pp": 2})
    assert st.host_seconds(tp, flat_rates(tp_linear_us=500.0)) - st.host_seconds(tp, flat_rates()) == pytest.approx(
        2 * 7 * 2 * 500e-6 * st.TP_BLOCK_SHARE)
    # ... at the cost measured on a mesh of the run's tp ranks where the calibration has it (the nearest count)
    ranks = flat_rates(tp_linear_us=500.0, tp_linear_ranks=((2, 800.0), (8, 2000.0)))
    assert st.host_seconds(tp, ranks) - st.host_seconds(tp, flat_rates()) == pytest.approx(
        2 * 7 * 2 * 800e-6 * st.TP_BLOCK_SHARE)
    # ... and the clip over two meshes once a step, a layer of the stage at the pair's share for two ranks, compiled
    # blocks too (the clip runs outside them)
    clipped = gpt2_run(shape=deep, accum=2, layout={"dp": 1, "tp": 2, "pp": 2}, grad_clip=True)
    assert st.host_seconds(clipped, ranks) - st.host_seconds(tp, ranks) == pytest.approx(
        2 * 800e-6 * st.TP_CLIP_PAIRS[2])
    compiled = gpt2_run(shape=deep, levers="blocks", layout={"dp": 1, "tp": 2})
    assert st.host_seconds(compiled, flat_rates(tp_linear_us=500.0)) == st.host_seconds(compiled, flat_rates())
    compiled_clip = gpt2_run(shape=deep, levers="blocks", layout={"dp": 1, "tp": 2}, grad_clip=True)
    assert st.host_seconds(compiled_clip, flat_rates(tp_linear_us=500.0)) - st.host_seconds(
        compiled, flat_rates(tp_linear_us=500.0)) == pytest.approx(4 * 500e-6 * st.TP_CLIP_PAIRS[2])
    # eager ZeRO-3's hooks at the calibrated cost per parameter tensor (16 here) and micro-batch, in place of the
    # fitted launches; compiled leaf blocks keep theirs
    z3, z3_blocks = (gpt2_run(shape=deep, accum=2, family="deepspeed", zero_stage=3, levers=lv)
                     for lv in ("eager", "blocks"))
    calibrated = flat_rates(zero3_tensor_us=800.0)
    assert st.host_seconds(z3, calibrated) - st.host_seconds(z3, flat_rates()) == pytest.approx(
        2 * 16 * (800e-6 - st.HOOK_OPS["zero3"] * 10e-6))
    assert st.host_seconds(z3_blocks, calibrated) == st.host_seconds(z3_blocks, flat_rates())
    # and each module beyond the calibrated stack's share (49 / 96 a tensor) at the calibrated cost of a module:
    # 30 modules over 16 tensors, 30 - 16 x 49 / 96 more than the stack had
    with_modules = flat_rates(zero3_tensor_us=800.0, zero3_module_us=300.0)
    z3m = gpt2_run(shape=deep, accum=2, family="deepspeed", zero_stage=3, modules=30)
    assert st.host_seconds(z3m, with_modules) - st.host_seconds(z3m, calibrated) == pytest.approx(
        2 * (30 - 16 * 49 / 96) * 300e-6)
    noisy = flat_rates(zero3_tensor_us=800.0, zero3_module_us=-20.0)  # a difference measured below zero: no cost
    assert st.host_seconds(z3m, noisy) == st.host_seconds(z3m, calibrated)
    # over several data-parallel ranks, at the engine's cost over the nearest rank count calibrated (eager), the
    # compiled leaf blocks' fitted hooks scaled by its ratio to the one-rank cost; one rank keeps the one-rank cost
    ranked = flat_rates(zero3_tensor_us=800.0, zero3_tensor_ranks=((2, 1200.0), (8, 4000.0)))
    z3_dp2, z3_blocks_dp2 = (gpt2_run(shape=deep, accum=2, family="deepspeed", zero_stage=3, levers=lv,
                                      layout={"dp": 2}) for lv in ("eager", "blocks"))
    assert st.host_seconds(z3_dp2, ranked) - st.host_seconds(z3_dp2, calibrated) == pytest.approx(2 * 16 * 400e-6)
    assert st.host_seconds(z3, ranked) == st.host_seconds(z3, calibrated)
    assert st.host_seconds(z3_blocks_dp2, ranked) - st.host_seconds(z3_blocks_dp2, calibrated) == pytest.approx(
        2 * 16 * st.HOOK_OPS["zero3_blocks"] * 0.5 * 10e-6)
    # the rank counts' rows as calibrate writes them (a committed two-rank calibration)
    two = st.Rates.load(Path(__file__).parents[1] / "results/calibration/h200x2-zero3/calibration.json")
    assert [n for n, _ in two.zero3_tensor_ranks] == [2] and [n for n, _ in two.tp_linear_ranks] == [2]


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


def test_zero3_hides_a_tenth_of_its_collectives_and_fsdp2_hides_them_behind_the_backward():
    """DeepSpeed ZeRO-3's gathers and reduce-scatters overlapped 8-12 % in a trace (ZERO3_OVERLAP); FSDP2's prefetch
    hides them behind 1.5 x the backward but one layer's."""
    deep = mm.Shape("gpt2", n_params=100_000, n_layer=4, d=64, ffn=256, kv=64, head_dim=16, vocab=1000)
    zero3, fsdp = (gpt2_run(shape=deep, family=f, zero_stage=3, layout={"dp": 2}) for f in ("deepspeed", "fsdp"))
    gathers = 2 * 100_000 * 2 * (2 - 1) / 2 / 100e9  # parameters gathered forward and backward, bf16, 2 ranks
    scatter = 100_000 * 4 * (2 - 1) / 2 / 100e9  # fp32 gradients reduce-scattered
    for backward in (0.0, 1.0):
        assert st.comm_seconds(zero3, flat_rates(), backward)[0] == pytest.approx(
            (gathers + scatter) * (1 - st.ZERO3_OVERLAP))
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


def test_ddp_over_several_ranks_adds_its_reducer_per_parameter_tensor_once_a_step():
    one, two = gpt2_run(), gpt2_run(layout={"dp": 2})
    reducer = st.DDP_OPS_PER_TENSOR * 16 * 10e-6  # 16 tensors at 10 us a launch
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
                   experts=4, top_k=2, expert_ffn=64)
    ep = gpt2_run(shape=moe, family="fsdp", zero_stage=3, strategy="fsdp", layout={"dp": 2, "ep": 2})
    dense = gpt2_run(shape=moe, family="fsdp", zero_stage=3, strategy="fsdp", layout={"dp": 2})
    routed = 32 * 2 * 64 * 2  # tokens x top-k x d x 2 bytes, dispatched and combined forward and backward
    extra = st.comm_seconds(ep, flat_rates(), 0.0)[0] - st.comm_seconds(dense, flat_rates(), 0.0)[0]
    assert extra == pytest.approx(4 * routed / 2 / 100e9)


def test_the_scale_simulation_keeps_what_the_dimensions_accept_and_slows_with_the_network():
    from pathlib import Path

    from workflow_scripts.plan import scale
    from workflow_scripts.plan.fabric import Fabric
    from workflow_scripts.training.strategies import STRATEGIES

    fast = Fabric(gpus_per_node=8, intra_node_busbw_gbs=360.0, inter_node_gbs=45.0)
    keys = {layout.key for layout in scale.layouts("qwen2.5-3b", STRATEGIES["fsdp"], 8, fast, {"grad_accum": 4}, 1024)}
    assert {"ws8", "dp4-tp2", "dp4-pp2", "dp4-cp2", "dp2-pp2-tp2"} <= keys
    assert "dp2-tp4" not in keys  # the shape's 2 KV heads
    assert not any("pp" in k and "cp" in k for k in keys)  # cp and pp do not compose yet
    assert not any("ep" in k for k in keys)  # a dense model
    assert {layout.key for layout in scale.layouts("gpt2-medium", STRATEGIES["zero2"], 8, fast, {}, 1024)} == {"ws8"}
    config = {"plan": {"gpu_memory_gib": 80, "headroom_gib": 2, "models": ["gpt2-medium"], "strategies": ["ddp"],
                       "micro_batches": [4], "precision": None, "seq_len": None, "vocab": 50304, "scale": {"gpus": [8, 64]}},
              "train": {"precision": "bf16-mixed", "grad_accum": 1, "gradient_checkpointing": False,
                        "compile_blocks": True, "compile_loss": True, "vocab_multiple": 64, "embedding_rows": None},
              "platform": "cuda", "data": {"block_size": 1024}, "tokenizer": {"kind": "hub"}, "model_overrides": {},
              "strategy_options": {}}
    rates = st.Rates.load(Path(__file__).parents[1] / "results/calibration/h100/calibration.json")
    slow = Fabric(gpus_per_node=8, intra_node_busbw_gbs=360.0, inter_node_gbs=0.5)

    def speed(fabric):
        frame = scale.candidates(config, rates, fabric)
        return frame[frame["layout"].str.startswith("ws")].set_index("gpus")["predicted_tokens_per_s_per_gpu"]

    quick, crawl = speed(fast), speed(slow)
    assert quick[8] == pytest.approx(crawl[8])  # one node: the network between nodes plays no part
    assert crawl[64] < 0.5 * quick[64]  # 8 nodes on a slow link: the all-reduce is exposed


def test_deepcompile_rows_are_not_modelled_and_say_why():
    """DeepSpeed's DeepCompile puts ZeRO's reductions into the compiled graph: no term of the model counts them, so
    its committed rows (results/bench_harness/h200-deepcompile) are left out by name, their DDP twins kept."""
    sets = Path(__file__).parents[1] / "results/bench_harness/h200-deepcompile/bench/levers"
    dc = st.run_at(sets / "zero2, DeepCompile/r0")
    assert dc.deepcompile and "DeepCompile" in st.not_modelled(dc)
    assert st.not_modelled(st.run_at(sets / "ddp, CUDA graphs/r0")) is None


def test_zero3_runs_whose_compiled_blocks_traced_deepspeeds_linear_are_not_modelled():
    """Before COMPILED_ZERO3_KEYS a ViT's ZeRO-3 run had 8 blocks compiled (without gradients) and the rest eager: left
    out by name (the committed pre-mend set); the mended retake and GPT-2's Conv1D blocks are modelled."""
    vit = Path(__file__).parents[1] / "results/vit"
    old = st.run_at(vit / "h100-compiled-loss-check/runs/vit-huge-14/zero3/ws1/r0")
    assert old.traced_ds_linear and "DeepSpeed's linear" in st.not_modelled(old)
    assert st.not_modelled(st.run_at(vit / "h100-zero3-grad-check/runs/vit-huge-14/zero3/ws1/r0")) is None
    from workflow_scripts.training.strategies._deepspeed import traced_ds_linear

    recorded = {"harness": {"zero3_leaf_modules": "GPT2Block"}, "deepspeed_config": {"zero_optimization": {}}}
    assert not traced_ds_linear(recorded, "gpt2") and traced_ds_linear(recorded, "qwen2")


def test_a_median_over_fewer_than_five_timed_steps_is_neither_fitted_nor_tested():
    """bench.step_time: the memory-peak sets (4 timed steps, the allocator's history recorded) ran slower than the
    same rows elsewhere and had pulled the eager constants up: such rows are left out by name; a row that does not
    record its timed steps (older tables) is kept."""
    from workflow_scripts.bench import step_time as bench_st

    assert "fewer than 5 timed steps" in bench_st.too_few_steps({"timed_steps": 4})
    assert bench_st.too_few_steps({"timed_steps": 5}) is None
    assert bench_st.too_few_steps({"timed_steps": float("nan")}) is None and bench_st.too_few_steps({}) is None


def test_twins_set_one_machines_step_against_the_same_runs_on_the_others():
    """bench.step_time.twins: rows with identical inputs on one GPU kind in several sets are each set against the
    median of the others (spread), and the others moved by the model's own ratio between the calibrations
    (transfer); a run in one set only, a row timed after a trace, or the same run on another kind has no twin."""
    import pandas as pd

    from workflow_scripts.bench import step_time as bench_st

    rows = [("a/h200x2", 0.10, 0.09), ("b/h200x2", 0.12, 0.09), ("c/h200x2", 0.08, 0.12), ("d/h200x2", 0.3, 0.1),
            ("e/h200x2", 0.5, 0.1), ("f/h200x2", 0.2, 0.1)]
    frame = pd.DataFrame([{"set": s, "model": "gpt2", "strategy": "ddp", "layout": "{}", "gpus": 2, "micro_batch": 1,
                           "levers": "eager", "measured_step_s": m, "predicted_step_s": p, "error": p / m - 1,
                           "bound": "host", "after_trace": s == "d/h200x2"} for s, m, p in rows])
    same, other = gpt2_run(layout={"dp": 2}), gpt2_run(layout={"dp": 2}, micro_batch=2)
    runs = [same, same, same, same, other, same]
    devices = ["NVIDIA H200"] * 5 + ["NVIDIA H100 80GB HBM3"]
    out = bench_st.twins(bench_st.keyed(frame, runs, devices)).set_index("set")
    assert sorted(out.index) == ["a/h200x2", "b/h200x2", "c/h200x2"]
    assert out.loc["a/h200x2", "twins"] == 2
    assert out.loc["a/h200x2", "spread"] == pytest.approx(0.10 / 0.10 - 1)  # the median of 0.12 and 0.08
    assert out.loc["c/h200x2", "spread"] == pytest.approx(0.08 / 0.11 - 1)
    # b moved to c by the model's ratio 0.12 / 0.09, a to c likewise: c's measured against their median
    assert out.loc["c/h200x2", "transfer"] == pytest.approx((0.11 * 0.12 / 0.09) / 0.08 - 1)
    # the one step that misses 0.10 / 0.12 / 0.08 least is 0.10 (0 + 1/6 + 1/4 against 0.7 at 0.12, 0.53 at 0.08)
    assert out.loc["c/h200x2", "floor"] == pytest.approx(0.25) and out.loc["b/h200x2", "floor"] == pytest.approx(-1 / 6)
    # of a class of 5 host-bound rows and one device-bound: the twins' floor over all 6, and each host-bound row
    # without twins at the twins' mean floor (the device-bound one at 0: no device-bound twin)
    text = bench_st.twins_markdown(out.reset_index(), {"held out": pd.Series(["host"] * 5 + ["device"])})
    assert "| held out | all | 3 |" in text and "| 13.9% | 6.9% of 6 | 11.6% |" in text  # (1/6 + 1/4) / 3; / 6; x 5/6
    # a layout's dimensions of one rank do not make another run (older specs wrote only dp, later ones all five)
    kw = dict(model="gpt2-tiny", strategy="ddp", precision="bf16-mixed", micro_batch=1, accum=1, seq_len=64,
              vocab=512, train={}, n_params=10**6, trainable=10**6)
    assert st.run_for(layout={"dp": 2, "tp": 1, "pp": 1}, **kw) == st.run_for(layout={"dp": 2}, **kw)


def test_repeats_set_each_round_against_its_sets_median_and_keep_the_models_error_beside():
    """bench.step_time.repeats: a run measured three times in one set gives each round against their median
    (spread), with the model's error on it and the row's bound; the same run twice in another set, a round timed
    after a trace, or another run in the set is no repeat."""
    import pandas as pd

    from workflow_scripts.bench import step_time as bench_st

    rows = [("a/h200x2", 0.10, False), ("a/h200x2", 0.11, False), ("a/h200x2", 0.12, False), ("a/h200x2", 0.5, True),
            ("b/h200x2", 0.10, False), ("b/h200x2", 0.20, False)]
    frame = pd.DataFrame([{"set": s, "model": "gpt2", "strategy": "ddp", "layout": "{}", "gpus": 2, "micro_batch": 1,
                           "levers": "eager", "measured_step_s": m, "predicted_step_s": 0.1, "error": 0.1 / m - 1,
                           "bound": "host", "after_trace": t} for s, m, t in rows])
    run = gpt2_run(layout={"dp": 2})
    out = bench_st.repeats(bench_st.keyed(frame, [run] * 6, ["NVIDIA H200"] * 6))
    assert list(out["set"]) == ["a/h200x2"] * 3
    assert list(out["spread"]) == pytest.approx([0.10 / 0.11 - 1, 0.0, 0.12 / 0.11 - 1])
    assert list(out["error"]) == pytest.approx([0.0, 0.1 / 0.11 - 1, 0.1 / 0.12 - 1])
    assert "| held out | host | 3 |" in bench_st.repeats_markdown(out)


def test_a_set_without_its_own_host_costs_takes_the_median_of_its_kinds_machines(tmp_path):
    """bench.step_time: a row gets the launch cost every committed calibration of its GPU kind measured, their
    median (H100 machines measured 6-10 us), not the one machine of the kind's file nor its set's own (one of the
    median's); another kind's calibration does not count; a host cost only some calibrations measured (the DTensor
    dispatch) comes from those. load_rates takes the same medians on any calibration of the kind (a plan on the
    kind's file, a study's own rows), and keeps a machine's own host cost where its kind measured none."""
    import json

    from workflow_scripts.bench import step_time as bench_st

    def calibration(where: str, gpu: str, launch: float | None) -> None:
        path = tmp_path / (f"{where}/calibration.json" if where.startswith("calibration/") else
                           f"{where}/calibration/calibration.json")
        path.parent.mkdir(parents=True)
        rows = [{"name": "launch_us[0]", "value": launch}, {"name": "hbm_gbs", "value": 3000.0}]
        if where == "study/b":  # the one calibration of the kind with the DTensor dispatch measured
            rows.append({"name": "tp_linear_us", "value": 400.0})
        if where == "study/h200":  # a block's kernels against the copy: the kind's own only
            rows.append({"name": "memory_block[layernorm_gelu,eager]", "value": 3000.0})
        path.write_text(json.dumps({"machine": {"gpu": {"gpus": [{"name": gpu}]}}, "rows": rows}))

    h100 = "NVIDIA H100 80GB HBM3"
    for where, gpu, launch in [("calibration/h100", h100, 10.0), ("study/a", h100, 6.0), ("study/b", h100, 7.0),
                               ("study/c", h100, None), ("study/h200", "NVIDIA H200", 1.0)]:
        calibration(where, gpu, launch)
    assert st.kind_medians(tmp_path, h100) == {"launch_us[0]": 7.0, "tp_linear_us": 400.0}  # of 6, 7 and 10
    # a host cost the kind never measured comes from every kind's calibrations; a per-GPU launch cost never does
    assert st.kind_medians(tmp_path, "NVIDIA H200") == {"launch_us[0]": 1.0, "tp_linear_us": 400.0,
                                                         "memory_block[layernorm_gelu,eager]": 3000.0}
    seen = {}

    def rates_of(calibration: dict) -> dict:
        seen.update({r["name"]: r["value"] for r in calibration["rows"]})
        return seen

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench_st.st.Rates, "of", staticmethod(rates_of))
        bench_st.rates_for({"device_name": h100, "set": "study/none"}, tmp_path, {})
        assert seen["launch_us[0]"] == 7.0 and seen["hbm_gbs"] == 3000.0
        bench_st.rates_for({"device_name": h100, "set": "study/a"}, tmp_path, {})
        assert seen["launch_us[0]"] == 7.0 and seen["tp_linear_us"] == 400.0  # the median, not the set's own 6
        st.load_rates(tmp_path / "calibration/h100/calibration.json", tmp_path)
        assert seen["launch_us[0]"] == 7.0 and seen["hbm_gbs"] == 3000.0  # the kind's median, not its file's 10
        st.load_rates(tmp_path / "study/a/calibration/calibration.json", tmp_path)
        assert seen["launch_us[0]"] == 7.0  # a study's own calibration: its kind's median too
        other = tmp_path / "other/x/calibration/calibration.json"  # where only another kind measured the dispatch
        other.parent.mkdir(parents=True)
        other.write_text(json.dumps({"machine": {"gpu": {"gpus": [{"name": "NVIDIA H200"}]}},
                                     "rows": [{"name": "tp_linear_us", "value": 999.0}]}))
        st.load_rates(tmp_path / "study/b/calibration/calibration.json", tmp_path / "other")
        assert seen["tp_linear_us"] == 400.0 and seen["launch_us[0]"] == 7.0  # the machine's own, not H200's


def test_the_models_parts_are_set_beside_the_kernels_of_the_committed_traces():
    """bench.step_time.traced_parts: each committed set whose traces carry kernel classes gives one row per run, the
    model's parts beside the trace's kernels of the same class; on the device-bound DDP profile the GEMMs agree
    within 20 % (the kind's file from another H100 than the trace's: 11 and 15 % slower on the two files so far)
    and the attention within 10 % (the SDPA curve replayed from a CUDA graph), the memory part of compiled blocks
    within 20 % (its constant's floor is the trace's: bench/step_time.BOUNDS; BENCHMARKS.md Part 6c)."""
    from workflow_scripts.bench import step_time as bench_st

    frame = bench_st.traced_parts(Path(__file__).parents[1] / "results").set_index(["set", "strategy"])
    ddp = frame.loc[("bench_harness/h100-ddp-profile-mb16", "ddp")]
    assert abs(ddp["gemm_ms"] / ddp["gemm_trace_ms"] - 1) < 0.2
    assert abs(ddp["attention_ms"] / ddp["attention_trace_ms"] - 1) < 0.1
    assert abs(ddp["memory_ms"] / ddp["memory_trace_ms"] - 1) < 0.2
    assert ("vit/h200x2-zero3-traces", "zero3") in frame.index
    assert (frame[[f"{p}_trace_ms" for p in bench_st.TRACED_PARTS]] > 0).all().all()


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
