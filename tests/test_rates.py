"""The step-time model's rates (plan/step_time.load_rates): a calibration's own curves, copies and collectives, its
host costs and block-kernel paces its GPU kind's rate file's (plan/rates/<kind>.json); nothing else is read, so a
result set added anywhere changes no prediction."""
from __future__ import annotations

import builtins
import dataclasses
import io
import json
from pathlib import Path

import pytest

from workflow_scripts.plan import memory_model as mm
from workflow_scripts.plan import step_time as st

H100 = "NVIDIA H100 80GB HBM3"
CURVES = {"matmul_bf16": [{"m": 1, "k": 1, "n": 1, "tflops": 100.0}],
          "sdpa_bf16": [{"causal": True, "seq": 1, "head_dim": 1, "tflops": 50.0},
                        {"causal": False, "seq": 1, "head_dim": 1, "tflops": 60.0}]}


def calibration(gpu: str | None, rows: dict) -> dict:
    machine = {"gpu": {"gpus": [{"name": gpu}]}} if gpu else {}
    return {"machine": machine, "curves": CURVES, "rows": [{"name": k, "value": v} for k, v in rows.items()]}


def kind_dir(tmp_path: Path, launch: float = 7.0) -> Path:
    """A rate folder with one H100 file: launches at 7 us, copies at 3,000 GB/s, 100 GB/s all-reduces."""
    rates = tmp_path / "rates"
    rates.mkdir()
    record = {"kind": "h100", **calibration(H100, {"hbm_copy[0]": 3000.0, "launch_us[0]": launch, "tp_linear_us": 400.0,
                                                   "all_reduce_busbw[2x64MB]": 100.0})}
    (rates / "h100.json").write_text(json.dumps(record))
    return rates


def run() -> st.Run:
    shape = mm.Shape("gpt2", n_params=100_000, n_layer=2, d=64, ffn=256, kv=64, head_dim=16, vocab=1000)
    return st.Run(shape=shape, family="ddp", zero_stage=0, strategy="ddp", micro_batch=1, accum=2, tokens=32,
                  layout={"dp": 2}, levers="eager", compile_loss=False, checkpointing=False, trainable=100_000,
                  tensors=16)


def test_a_calibration_takes_its_kinds_host_costs_and_keeps_its_own_machine_rows(tmp_path):
    rates = kind_dir(tmp_path)
    own = tmp_path / "own.json"  # one machine of the kind: launches at 12 us, its own copies and all-reduce
    own.write_text(json.dumps(calibration(H100, {"hbm_copy[0]": 2500.0, "launch_us[0]": 12.0,
                                                 "all_reduce_busbw[2x64MB]": 250.0, "host_beside[2]": 1.3})))
    loaded = st.load_rates(own, rates)
    assert loaded.launch_us == 7.0 and loaded.tp_linear_us == 400.0  # the kind's, the dispatch added
    assert loaded.hbm == 2500.0 and loaded.busbw[("all_reduce", 2)] == ((64e6, 250.0),)  # its own
    assert loaded.host_beside == ((2, 1.3),)
    assert st.Rates.load(own).launch_us == 12.0  # as measured (verify: what tells two machines apart)
    other = tmp_path / "other.json"  # a GPU with no rate file, and a CPU calibration: every row their own
    other.write_text(json.dumps(calibration("NVIDIA A100-SXM4-80GB", {"hbm_copy[0]": 1800.0,
                                                                      "launch_us[0]": 9.0})))
    assert st.load_rates(other, rates).launch_us == 9.0 and st.load_rates(other, rates).tp_linear_us is None
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps(calibration(None, {"hbm_copy[0]": 20.0, "launch_us[0]": 3.0})))
    assert st.load_rates(cpu, rates).launch_us == 3.0


def test_a_plan_names_a_kind_by_its_rate_file_or_a_calibration_by_its_path(tmp_path):
    rates = kind_dir(tmp_path)
    assert st.rates_file("h100", rates) == rates / "h100.json"
    assert st.rates_file("a100", rates) == Path("a100")  # no such kind: taken as a path (load_rates names it)
    assert st.rates_file(str(tmp_path / "own.json"), rates) == tmp_path / "own.json"
    with pytest.raises(ValueError, match="a100"):
        st.load_rates(st.rates_file("a100", rates), rates)


def test_a_result_set_added_anywhere_changes_no_prediction(tmp_path, monkeypatch):
    """The same prediction with and without calibrations of the kind under a results/ folder (the repository's
    layout, in the working directory), and no file read but the rate files and the calibration given."""
    own = tmp_path / "own.json"
    own.write_text(json.dumps(calibration(H100, {"hbm_copy[0]": 2500.0, "launch_us[0]": 12.0})))
    before = st.load_rates(own)
    step = st.predict(run(), before).step_s
    read: list = []
    real_open = builtins.open
    real_io_open = io.open

    def recording(opener):
        def wrapped(file, *args, **kw):
            read.append(Path(file).resolve())
            return opener(file, *args, **kw)
        return wrapped

    monkeypatch.setattr(builtins, "open", recording(real_open))
    monkeypatch.setattr(io, "open", recording(real_io_open))
    again = st.load_rates(own)
    monkeypatch.undo()
    assert {p for p in read} <= {own.resolve(), *(p.resolve() for p in st.RATES.glob("*.json"))}, read
    for where in ("results/calibration/h100", "results/study/h100/calibration"):  # machines far off the kind's
        (tmp_path / where).mkdir(parents=True)
        (tmp_path / where / "calibration.json").write_text(json.dumps(calibration(
            H100, {"hbm_copy[0]": 10.0, "launch_us[0]": 1000.0, "tp_linear_us": 1e6, "host_memcpy": 0.01})))
    monkeypatch.chdir(tmp_path)
    after = st.load_rates(own)
    assert dataclasses.asdict(after) == dataclasses.asdict(before) == dataclasses.asdict(again)
    assert st.predict(run(), after).step_s == step


def test_every_rate_file_is_a_small_calibration_of_its_kind():
    files = sorted(st.RATES.glob("*.json"))
    assert [f.stem for f in files] == ["h100", "h200"]
    for path in files:
        record = json.loads(path.read_text())
        assert record["kind"] == path.stem and path.stat().st_size < 20_000
        assert path.stem in st.machine_gpu(record).lower()
        rates = st.Rates.load(path)
        assert rates.matmul and rates.sdpa and rates.launch_us > 0 and rates.memory_block
        assert dataclasses.asdict(st.load_rates(path)) == dataclasses.asdict(rates)  # the medians already in it
