"""Trace analysis (report/traces.py) on a real GPU trace: tests/fixtures/traces/h200x2_gpt2_ddp, the two ranks of one
ddp run of studies/traces.yaml on 2 x H200 (GPT-2 124M, bf16, 3 recorded steps; 1.6 MB). The CPU side (a study
with `profile` on, traces per rank, profiled steps out of the timing) is in tests/test_studies_cpu.py."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import REPO

from workflow_scripts.report import traces

FIXTURE = REPO / "tests/fixtures/traces/h200x2_gpt2_ddp"


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    out = tmp_path_factory.mktemp("analysis")
    return traces.analyse(FIXTURE, out), out


def test_the_phases_of_a_gpu_step_add_up_to_the_step(analysis):
    result, out = analysis
    phases = pd.read_csv(out / "phases.csv")
    assert result["ranks"] == [0, 1] and result["phases_read_on"] == {0: "gpu", 1: "gpu"}
    assert len(phases) == 6 and (phases.groupby("rank").size() == 3).all()  # 3 recorded steps per rank
    named = phases[["forward_ms", "backward_ms", "optimizer_ms"]].sum(axis=1)
    assert ((named + phases.other_ms - phases.step_ms).abs() < 1e-6).all()
    assert named.sum() >= 0.8 * phases.step_ms.sum()
    # what the named phases leave is the GPU waiting: HTA's idle share of the same trace, within 10 points
    idle = {t["rank"]: t["idle_time_pctg"] for t in result["hta"]["temporal"]}
    for rank, rows in phases.groupby("rank"):
        assert abs(100 * rows.other_ms.sum() / rows.step_ms.sum() - idle[rank]) < 10, (rank, idle)
    assert ((phases.forward_ms > 0) & (phases.backward_ms > phases.forward_ms)).all()  # backward ~2x forward
    # DDP's all-reduce runs in NCCL kernels, mostly while backward computes
    assert (phases.comm_ms > 0).all() and phases.comm_overlap_pct.between(0, 100).all()
    assert phases.comm_overlap_pct.mean() > 50
    # host-bound reading: every phase launched device work, and its host range covers at least what it launched
    for p in ("forward", "backward", "optimizer"):
        assert (phases[f"{p}_launches"] > 0).all() and (phases[f"{p}_host_ms"] > 0).all(), p
    assert (phases.backward_launches > phases.forward_launches).all()
    # kernel time by class: the device was busy within the step, GEMMs and DDP's NCCL kernels among it
    kernels = phases[[f"{c}_kernel_ms" for c in traces.KERNEL_CLASS_NAMES]]
    assert (phases.device_busy_ms <= phases.step_ms + 1e-6).all() and (phases.gemm_kernel_ms > 0).all()
    assert (kernels.sum(axis=1) >= phases.device_busy_ms - 1e-6).all()  # classes overlap on streams, never fall short
    assert ((phases.communication_kernel_ms - phases.comm_ms).abs() < 1e-6 + 0.05 * phases.comm_ms).all()


@pytest.mark.parametrize("name, cat, expected", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "kernel", "attention"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "kernel", "gemm"),
    ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64", "kernel", "gemm"),  # hipBLASLt on ROCm
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel", "communication"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "kernel", "multi_tensor"),
    ("triton_per_fused__to_copy_add_native_layer_norm_view_5", "kernel", "memory_bound"),
    ("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", "copies")])
def test_a_kernel_is_classed_by_what_it_computes(name, cat, expected):
    assert traces.kernel_class({"name": name, "cat": cat}) == expected


def test_hta_reads_the_gpu_trace(analysis):
    result, _ = analysis
    assert result["hta_why_not"] is None, result["hta_why_not"]
    hta = result["hta"]
    temporal = pd.DataFrame(hta["temporal"]).set_index("rank")
    pct = temporal[["idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"]].sum(axis=1)
    assert sorted(temporal.index) == [0, 1] and ((pct - 100).abs() < 0.5).all()
    assert sorted(o["rank"] for o in hta["overlap"]) == [0, 1]
    assert all(0 < o["comp_comm_overlap_pctg"] <= 100 for o in hta["overlap"])
    kernels = pd.DataFrame(hta["top_kernels"])
    assert kernels["name"].str.contains("nccl", case=False).any() and set(kernels["rank"]) == {0, 1}
    assert {i["idle_category"] for i in hta["idle"]} >= {"host_wait", "kernel_wait"}


def test_the_study_table_and_figure(analysis, tmp_path):
    _, out = analysis
    run = tmp_path / "results/runs/gpt2/ddp/ws2/r0/traces"
    run.mkdir(parents=True)
    (run / "analysis.json").write_text((out / "analysis.json").read_text())
    table_path = tmp_path / "results/tables/traces.csv"
    traces.main(["report", "--analyses", str(run / "analysis.json"), "--table", str(table_path),
                 "--figure", str(tmp_path / "results/figures/traces.png")])
    table = pd.read_csv(table_path)
    assert list(table[["strategy", "rank"]].itertuples(index=False, name=None)) == [("ddp", 0), ("ddp", 1)]
    assert table.hta_compute_pct.between(1, 100).all() and table.hta_comm_overlap_pct.notna().all()
    assert len(pd.read_csv(tmp_path / "results/tables/traces_kernels.csv")) >= 2
    assert (tmp_path / "results/figures/traces.png").stat().st_size > 5000


def test_a_cpu_trace_gets_phases_and_says_why_not_hta(tmp_path):
    """A CPU trace has no GPU kernels: the host ranges give the phases, and the analysis names the reason."""
    import gzip

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 100, "tid": 1},
              {"ph": "X", "cat": "user_annotation", "name": "forward", "ts": 1, "dur": 30, "tid": 1},
              {"ph": "X", "cat": "user_annotation", "name": "backward", "ts": 31, "dur": 60, "tid": 1},
              {"ph": "X", "cat": "user_annotation", "name": "optimizer", "ts": 91, "dur": 8, "tid": 1},
              {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 60, "dur": 40, "tid": 2}]
    with gzip.open(tmp_path / "rank0.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    result = traces.analyse(tmp_path, tmp_path / "out")
    row = result["phases"][0]
    assert result["phases_read_on"] == {0: "host"} and "no GPU kernels" in result["hta_why_not"]
    assert (row["step_ms"], row["forward_ms"], row["backward_ms"], row["optimizer_ms"]) == (0.1, 0.03, 0.06, 0.008)
    assert row["comm_ms"] == 0.04 and row["comm_overlap_pct"] == pytest.approx(77.5)  # 31 of 40 us in backward


def test_the_hosts_synchronisations_are_counted_per_phase_and_step():
    """A hand-made GPU trace of one step: forward launches a kernel and waits on its stream (2 ms), the optimizer
    waits on an event (1 ms), between them an asynchronous copy (no wait) and after them a device-wide wait
    (0.5 ms) outside every phase: forward 1, backward 0, optimizer 1, the step 3 waits of 3.5 ms."""
    def call(name, ts, dur, corr=None):
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur,
                "args": {"correlation": corr} if corr else {}}

    def host(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}

    events = [host("ProfilerStep#7", 0, 10_000), host("forward", 100, 3_000), host("backward", 3_200, 3_000),
              host("optimizer", 6_300, 2_000),
              call("cudaLaunchKernel", 200, 5, corr=1), call("cudaStreamSynchronize", 300, 2_000),
              call("cudaLaunchKernel", 3_300, 5, corr=2), call("cudaMemcpyAsync", 4_000, 10),
              call("cudaLaunchKernel", 6_400, 5, corr=3), call("cudaEventSynchronize", 6_500, 1_000),
              call("cudaDeviceSynchronize", 9_000, 500),
              {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 210, "dur": 80, "args": {"correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 3_310, "dur": 160, "args": {"correlation": 2}},
              {"ph": "X", "cat": "kernel", "name": "adam", "ts": 6_410, "dur": 40, "args": {"correlation": 3}}]
    (row,), where = traces.step_phases({"traceEvents": events})
    assert where == "gpu"
    assert (row["forward_syncs"], row["backward_syncs"], row["optimizer_syncs"]) == (1, 0, 1)
    assert row["step_syncs"] == 3 and row["step_sync_ms"] == 3.5


def test_the_recorded_gpu_steps_syncs_are_the_traces_own_waits(analysis):
    """On the H200 trace: every step's count is the trace's blocking runtime calls within that step's range."""
    import gzip

    result, out = analysis
    phases = pd.read_csv(out / "phases.csv")
    for rank in (0, 1):
        events = json.load(gzip.open(FIXTURE / f"rank{rank}.json.gz", "rt"))["traceEvents"]
        waits = [e for e in events if e.get("name") in ("cudaStreamSynchronize", "cudaEventSynchronize",
                                                           "cudaDeviceSynchronize", "cudaMemcpy")]
        for _, r in phases[phases["rank"] == rank].iterrows():
            step = next(e for e in events if e.get("name") == f"ProfilerStep#{int(r['step'])}")
            mine = [e for e in waits if step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
            assert r["step_syncs"] == len(mine)
            assert r[["forward_syncs", "backward_syncs", "optimizer_syncs"]].sum() <= r["step_syncs"]
