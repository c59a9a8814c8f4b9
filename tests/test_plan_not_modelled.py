"""A step-time term whose input the rates lack makes the prediction "not modelled: <what is missing>", never a zero
or a default rate (plan/step_time.py): collectives without a bus-bandwidth curve, an offloaded optimizer without
the host's AdamW rate or the copies, a host copy without its bandwidth. A run that needs none of them stays
modelled; with a curve, the collective costs what the ring formula gives by hand."""
from __future__ import annotations

import json
import math

import pytest
from conftest import REPO

from workflow_scripts.plan import bound
from workflow_scripts.plan import memory_model as mm
from workflow_scripts.plan import step_time as st

CURVES = {"matmul_bf16": [{"m": 1, "k": 1, "n": 1, "tflops": 100.0}],
          "sdpa_bf16": [{"causal": c, "seq": 1, "head_dim": 1, "tflops": 50.0} for c in (True, False)]}
BASE_ROWS = [{"name": "hbm_copy[0]", "value": 1000.0}, {"name": "launch_us[0]", "value": 10.0}]
PARAMS = 100_000  # the toy run's trainable parameters: fp32 gradients of 400,000 bytes, one DDP bucket


def calibration(*rows: dict) -> dict:
    return {"rows": BASE_ROWS + list(rows), "curves": CURVES}


def write(tmp_path, name: str, *rows: dict):
    path = tmp_path / name
    path.write_text(json.dumps(calibration(*rows)))
    return path


def toy_run(**kw) -> st.Run:
    shape = mm.Shape("gpt2", n_params=PARAMS, n_layer=1, d=64, ffn=256, kv=64, head_dim=16, vocab=1000)
    base = dict(shape=shape, family="ddp", zero_stage=0, strategy="ddp", micro_batch=1, accum=1, tokens=32,
                layout={"dp": 1}, levers="eager", compile_loss=False, checkpointing=False, trainable=PARAMS,
                tensors=16)
    return st.Run(**{**base, **kw})


def test_ddp_over_two_gpus_without_an_all_reduce_curve_is_not_modelled_and_one_gpu_is(tmp_path):
    path = write(tmp_path, "no_collectives.json")
    rates = st.load_rates(path)
    two = st.predict(toy_run(layout={"dp": 2}), rates)
    assert not two.modelled and two.step_s is None and two.bound is None
    assert two.why == f"{path} has no all_reduce bus-bandwidth curve"
    assert math.isnan(two.parts["comm"]) and two.tokens_per_s(64) is None  # no zero anywhere
    one = st.predict(toy_run(), rates)  # one rank: no collective to time
    assert one.modelled and one.why == "" and one.parts["comm"] == 0.0 and one.step_s > 0
    # the same from a mapping (no file): named as the calibration's; FSDP's gathers name their own curve
    mapping = st.Rates.of(calibration())
    fsdp = st.predict(toy_run(layout={"dp": 4}, family="fsdp", strategy="fsdp", zero_stage=3), mapping)
    assert fsdp.why == "the calibration has no all_gather bus-bandwidth curve"


def test_with_a_curve_the_exposed_all_reduce_is_the_ring_formula_by_hand(tmp_path):
    # 2 ranks at 100 GB/s, 4 at 50 GB/s (flat over message size); DDP's 25 MiB bucket holds all 400,000 bytes of
    # gradients, so the whole all-reduce runs after the backward: 2 (n - 1) / n x bytes / busbw
    rows = [{"name": f"all_reduce_busbw[{n}x{mb}MB]", "value": bw} for n, bw in ((2, 100.0), (4, 50.0))
            for mb in (64, 1000)]
    rates = st.load_rates(write(tmp_path, "collectives.json", *rows))
    grads = PARAMS * 4
    for n, busbw in ((2, 100e9), (4, 50e9)):
        p = st.predict(toy_run(layout={"dp": n}), rates)
        assert p.modelled and p.notes == []
        assert p.parts["comm"] == pytest.approx(2 * (n - 1) / n * grads / busbw)
        assert p.step_s > p.parts["comm"] > 0
    # 3 ranks: the nearest rank count measured (the larger of two as near), stated in the notes
    three = st.predict(toy_run(layout={"dp": 3}), rates)
    assert three.parts["comm"] == pytest.approx(2 * 2 / 3 * grads / 50e9)
    assert three.notes == ["no 3-rank all_reduce bus bandwidth calibrated: the nearest rank count's"]


def test_an_offloaded_optimizer_without_the_hosts_adamw_rate_is_not_modelled():
    offload = toy_run(family="deepspeed", zero_stage=2, strategy="zero2_offload", offload_optimizer=True)
    bare = st.predict(offload, st.Rates.of(calibration(), source="cal.json"))
    assert not bare.modelled and bare.step_s is None and math.isnan(bare.parts["offload"])
    assert bare.missing == ["cal.json has no cpu_adam row", "cal.json has no d2h row", "cal.json has no h2d row"]
    copies = [{"name": "d2h[0]", "value": 50.0}, {"name": "h2d[0]", "value": 25.0}]
    no_adam = st.predict(offload, st.Rates.of(calibration(*copies), source="cal.json"))
    assert no_adam.why == "cal.json has no cpu_adam row"
    full = st.predict(offload, st.Rates.of(calibration(*copies, {"name": "cpu_adam", "value": 20.0})))
    # 20 ms per 10 M parameters; fp32 gradients down at 50 GB/s, bf16 parameters up at 25 GB/s
    assert full.modelled and full.parts["offload"] == pytest.approx(
        0.020 * PARAMS / 1e7 + PARAMS * 4 / 50e9 + PARAMS * 2 / 25e9)
    # the device's AdamW needs none of those rows
    assert st.predict(toy_run(), st.Rates.of(calibration())).modelled


def test_a_host_copy_without_its_bandwidth_and_other_calibrated_host_costs_are_not_modelled():
    rates = st.Rates.of(calibration(), source="cal.json")
    images = toy_run(micro_batch=4, host_copy_bytes=2_032_141.5)
    assert st.predict(images, rates).why == "cal.json has no host_memcpy row"
    with_copy = st.Rates.of(calibration({"name": "host_memcpy", "value": 5.0}))
    assert st.input_seconds(images, with_copy) == pytest.approx(4 * 2_032_141.5 / 5e9)
    assert st.predict(images, with_copy).modelled
    # eager tensor parallelism's DTensor dispatch without the calibrated pair (one rank: tp over 2 on one GPU's
    # collectives is a separate lack); ZeRO-3's modules beyond the calibrated stack without their row
    tp = st.predict(toy_run(layout={"tp": 2}), rates)
    assert "cal.json has no tp_linear_us row" in tp.missing
    zero3 = toy_run(family="deepspeed", zero_stage=3, strategy="zero3", modules=30)
    tensors_only = st.Rates.of(calibration({"name": "zero3_tensor_us", "value": 800.0}), source="cal.json")
    assert st.predict(zero3, tensors_only).why == "cal.json has no zero3_module_us row"
    assert st.predict(toy_run(family="deepspeed", zero_stage=3, strategy="zero3"), tensors_only).modelled


def test_the_plan_lists_what_fits_but_is_not_modelled_with_its_footnote():
    """README's plan with `calibration: h100` (the kind's rate file has no collectives): one GPU ranked, two GPUs a
    `–` row whose footnote names the rate file and the curve."""
    from test_memory_plan import plan_config

    from workflow_scripts.plan.planner import ranking, rows

    config = plan_config(strategies=["ddp"], micro_batches=[2], calibration="h100")
    frame = rows(config).set_index("gpus")
    why = "workflow_scripts/plan/rates/h100.json has no all_reduce bus-bandwidth curve"
    assert frame.loc[1, "predicted_step_s"] > 0 and frame.loc[1, "comm_share"] == 0.0
    assert math.isnan(frame.loc[2, "predicted_step_s"]) and frame.loc[2, "step_note"] == why
    lines = ranking(frame.reset_index())
    assert "| 1 | `ddp` | 1 | 2 | eager |" in "\n".join(lines)
    assert "| – | `ddp` | 2 | 2 | eager | – | – | – |" in lines
    assert f"– not modelled: {why}" in lines
    assert not any("not modelled" in line for line in ranking(frame.loc[[1]].reset_index()))  # all ranked


@pytest.mark.parametrize("calibration", ["h200", str(REPO / "results/calibration/h200x4/calibration.json")])
def test_with_the_h200_rates_or_a_calibration_of_four_gpus_the_plan_gives_two_and_four_their_communication(
        calibration):
    """README's plan over 1, 2 and 4 GPUs with the H200 kind's rate file (the collectives of its machines of several
    GPUs) or the committed four-H200 calibration (its own curves): every DDP candidate ranked, the one-GPU one with
    no communication, two and four GPUs with some."""
    from test_memory_plan import plan_config

    from workflow_scripts.plan.planner import rows

    frame = rows(plan_config(strategies=["ddp"], gpus=[1, 2, 4], micro_batches=[2], calibration=calibration,
                             gpu_memory_gib=140)).set_index("gpus")
    assert frame["predicted_step_s"].notna().all(), frame["step_note"].tolist()
    assert frame.loc[1, "comm_share"] == 0.0
    assert frame.loc[2, "comm_share"] > 0.0 and frame.loc[4, "comm_share"] > 0.0


def test_a_throughput_ratio_over_several_ranks_needs_the_curve_in_both_calibrations():
    row = {"platform": "cuda", "world_size": 2, "dp_size": 2, "tokens_per_step": 4096, "tokens_per_s": 150_000,
           "flops_per_token": 5e9, "trainable_params": 1e8}
    cal = {"matmul_bf16[0]": 750.0, "launch_us[0]": 8.0}
    with_curve = {**cal, "all_reduce_busbw[2x1000MB]": 100.0}
    assert bound.predicted_ratio(row, cal, with_curve) == (None, "no 2-rank all-reduce bus bandwidth in both "
                                                                 "calibrations")
    assert bound.predicted_ratio(row, with_curve, with_curve)[0] == pytest.approx(1.0)
