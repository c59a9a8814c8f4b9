"""experiments/step_time: the rate files' export (rates.py) and the fit's held-out test (fit.py): the kinds' medians
over a tree of calibrations, the rows left out, the twins and the repeats, on hand-made trees and rows."""
from __future__ import annotations

import json

import pytest
from test_step_time import gpt2_run  # noqa: E402  (tests/ is on the path: its conftest)

from workflow_scripts.plan import step_time as st

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
CURVES = {"matmul_bf16": [{"m": 1, "k": 1, "n": 1, "tflops": 100.0}],
          "sdpa_bf16": [{"causal": True, "seq": 1, "head_dim": 1, "tflops": 50.0},
                        {"causal": False, "seq": 1, "head_dim": 1, "tflops": 60.0}]}




def write(tree, where: str, gpu: str, rows: list) -> None:
    """A calibration in a tree of sets: calibration/<name>/ (a calibration set) or <set>/calibration/ (a study's)."""
    path = tree / (f"{where}/calibration.json" if where.startswith("calibration/") else
                   f"{where}/calibration/calibration.json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"machine": {"gpu": {"gpus": [{"name": gpu}]}}, "rows": rows, "curves": CURVES}))


def hand_tree(tree):
    """H100 machines that launched at 10, 6, 7 us and one that did not measure it; one H200 at 1 us; only one H100
    measured the DTensor dispatch; a probe's copy beside a set (calibration_second/) is no machine's calibration."""
    copy = {"name": "hbm_copy[0]", "value": 3000.0}
    for where, gpu, launch in [("calibration/h100", H100, 10.0), ("study/a", H100, 6.0), ("study/b", H100, 7.0),
                               ("study/c", H100, None), ("study/h200", H200, 1.0), ("calibration/h200", H200, 2.0)]:
        rows = [{"name": "launch_us[0]", "value": launch}, copy,
                {"name": "all_reduce_busbw[2x64MB]", "value": 100.0 if where == "calibration/h100" else 300.0}]
        if where == "study/b":
            rows.append({"name": "tp_linear_us", "value": 400.0})
        write(tree, where, gpu, rows)
    probe = tree / "study/a/calibration_second/calibration.json"
    probe.parent.mkdir(parents=True)
    probe.write_text(json.dumps({"machine": {"gpu": {"gpus": [{"name": H100}]}},
                                 "rows": [{"name": "launch_us[0]", "value": 100.0}]}))


def test_a_kinds_rate_file_holds_the_median_host_cost_of_its_machines(tmp_path):
    """The H100 file: its calibration set's curves, its launch cost the median of 10, 6 and 7 us (the probe's 100 and
    the H200's left out), the dispatch only one machine measured, the all-reduce the median over the kind's
    calibration sets (calibration/<name>/: the one H100 set's 100 GB/s, not the study sets' 300); the H200 file its
    own kind's."""
    from experiments.step_time import rates

    hand_tree(tmp_path)
    found = rates.calibrations(tmp_path)
    assert sorted(found) == ["calibration/h100/calibration.json", "calibration/h200/calibration.json",
                             "study/a/calibration/calibration.json", "study/b/calibration/calibration.json",
                             "study/c/calibration/calibration.json", "study/h200/calibration/calibration.json"]
    assert rates.kind_medians(found, H100) == {"launch_us[0]": 7.0, "tp_linear_us": 400.0}
    h100 = rates.rate_file(found, "h100")
    values = {r["name"]: r["value"] for r in h100["rows"]}
    assert values == {"launch_us[0]": 7.0, "hbm_copy[0]": 3000.0, "all_reduce_busbw[2x64MB]": 100.0,
                      "tp_linear_us": 400.0}
    assert h100["medians_over"] == 4 and h100["collectives_over"] == 1 and h100["curves"] == CURVES
    assert {r["name"]: r["value"] for r in rates.rate_file(found, "h200")["rows"]}["launch_us[0]"] == 1.5
    out = tmp_path / "rates"
    rates.main(["--results", str(tmp_path), "--out", str(out)])
    assert json.loads((out / "h100.json").read_text()) == h100  # the file as written parses back to the record
    assert st.load_rates(out / "h100.json", out).launch_us == 7.0


def test_a_row_takes_its_kinds_medians_and_its_sets_own_collectives(tmp_path):
    """experiments.step_time.fit: a row of a set with its own calibration gets the kind's median launch cost (7 us,
    not the set's 6) and the set's own bus bandwidth (300, not the calibration set's 100); a set without one gets
    the kind's file with the kind's median bus bandwidth over its calibration sets."""
    from experiments.step_time import fit

    hand_tree(tmp_path)
    cache: dict = {}
    own = fit.rates_for({"device_name": H100, "set": "study/a"}, tmp_path, cache)
    assert own.launch_us == 7.0 and own.busbw[("all_reduce", 2)] == ((64e6, 300.0),)
    none = fit.rates_for({"device_name": H100, "set": "study/none"}, tmp_path, cache)
    assert none.launch_us == 7.0 and none.tp_linear_us == 400.0 and none.busbw[("all_reduce", 2)] == ((64e6, 100.0),)


def test_a_median_over_fewer_than_five_timed_steps_is_neither_fitted_nor_tested():
    """experiments.step_time.fit: the memory-peak sets (4 timed steps, the allocator's history recorded) ran slower
    than the same rows elsewhere and had pulled the eager constants up: such rows are left out by name; a row that
    does not record its timed steps is kept."""
    from experiments.step_time import fit as bench_st

    assert "fewer than 5 timed steps" in bench_st.too_few_steps({"timed_steps": 4})
    assert bench_st.too_few_steps({"timed_steps": 5}) is None
    assert bench_st.too_few_steps({"timed_steps": float("nan")}) is None and bench_st.too_few_steps({}) is None


def test_twins_set_one_machines_step_against_the_same_runs_on_the_others():
    """experiments.step_time.fit.twins: rows with identical inputs on one GPU kind in several sets are each set
    against the median of the others (spread), and the others moved by the model's own ratio between the calibrations
    (transfer); a run in one set only, a row timed after a trace, or the same run on another kind has no twin."""
    import pandas as pd

    from experiments.step_time import fit as bench_st

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


def test_repeats_set_each_round_against_its_sets_median_and_keep_the_models_error_beside():
    """experiments.step_time.fit.repeats: a run measured three times in one set gives each round against their median
    (spread), with the model's error on it and the row's bound; the same run twice in another set, a round timed
    after a trace, or another run in the set is no repeat."""
    import pandas as pd

    from experiments.step_time import fit as bench_st

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
