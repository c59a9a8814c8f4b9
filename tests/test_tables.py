"""Summary table, comparisons and repeat statistics on a synthetic study shaped like the parse stage's CSVs.

`make_study` (also used by test_figures.py) writes runs.csv, steps.csv and vram.csv for one small model at world
sizes 1 and 2: ddp, zero0 (hidden from figures, same numbers as ddp), zero2 (clearly faster), zero3 (OOM at one GPU,
one repeat at two), zero_infinity (unsupported) and fsdp (two successful repeats and one failed, no sampler value).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workflow_scripts.report import stats, tables  # noqa: E402

RUNS_COLUMNS = (
    "run_id study model strategy family zero_stage layout world_size repeat platform device_name precision "
    "precision_detail "
    "status reason in_figures n_params n_layer d_model seq_len vocab_size micro_batch grad_accum effective_batch "
    "tokens_per_step steps steps_per_epoch epochs train_samples time_per_epoch_s train_time_s step_time_median_s "
    "step_time_p90_s forward_median_s backward_median_s optimizer_median_s tokens_per_s samples_per_s "
    "flops_per_token peak_tflops mfu peak_allocated_bytes peak_reserved_bytes peak_host_rss_bytes initial_loss "
    "final_loss val_loss_initial val_loss_final val_ppl_final predicted_model_state_bytes predicted_host_state_bytes "
    "sampler_status sampler_peak_device_bytes sampler_peak_host_bytes predicted_tokens_per_s provenance settings"
).split()
STEPS_COLUMNS = ("run_id model strategy layout world_size repeat step epoch loss lr step_time_s forward_s backward_s "
                 "optimizer_s tokens samples warmup wall_s profiled").split()
VRAM_COLUMNS = ("run_id model strategy layout world_size repeat time_unix t_s backend device used_bytes total_bytes "
                "process_bytes step").split()

GiB = 2 ** 30
MODEL = "gpt2-tiny"
DDP_TPS = [1000.0, 1100.0, 1200.0]  # mean 1100, sd 100
ZERO2_TPS = [2000.0, 2010.0, 1990.0]
# (strategy, zero_stage, in_figures, world_size, statuses per repeat, tokens/s per repeat)
PLAN = [
    ("ddp", 0, True, 1, ["ok"] * 3, DDP_TPS),
    ("zero0", 0, False, 1, ["ok"] * 3, DDP_TPS),
    ("zero2", 2, True, 1, ["ok"] * 3, ZERO2_TPS),
    ("zero3", 3, True, 1, ["oom"], [None]),
    ("zero_infinity", 3, True, 1, ["unsupported"], [None]),
    ("fsdp", 3, True, 1, ["ok", "ok", "failed"], [900.0, 950.0, None]),
    ("ddp", 0, True, 2, ["ok"] * 3, [2 * x for x in DDP_TPS]),
    ("zero0", 0, False, 2, ["ok"] * 3, [2 * x for x in DDP_TPS]),
    ("zero2", 2, True, 2, ["ok"] * 3, [2 * x for x in ZERO2_TPS]),
    ("zero3", 3, True, 2, ["ok"], [3000.0]),
    ("zero_infinity", 3, True, 2, ["unsupported"], [None]),
    ("fsdp", 3, True, 2, ["ok"] * 2, [1700.0, 1750.0]),
]
REASONS = {"oom": "CUDA out of memory at step 3", "unsupported": "needs libaio (async_io op)",
           "failed": "rank 1 exited with code 1"}


def run_row(strategy, stage, in_figures, ws, repeat, status, tps, cpu):
    ok = status == "ok"
    value = (lambda x: x if ok else math.nan)
    n_params = 10_000_000
    predicted = {0: 16, 2: 2 + 14 / ws, 3: 16 / ws}[stage] * n_params
    return {
        "run_id": f"{MODEL}-{strategy}-w{ws}-r{repeat}", "study": "synthetic", "model": MODEL, "strategy": strategy,
        "family": "ddp" if strategy == "ddp" else "fsdp" if strategy == "fsdp" else "deepspeed",
        "zero_stage": stage, "layout": f"ws{ws}", "world_size": ws, "repeat": repeat,
        "platform": "cpu" if cpu else "cuda",
        "device_name": "cpu" if cpu else "NVIDIA H100 80GB HBM3", "precision": "bf16-pure", "precision_detail": "",
        "status": status, "reason": "" if ok else REASONS[status], "in_figures": in_figures, "n_params": n_params,
        "n_layer": 2, "d_model": 128, "seq_len": 128, "vocab_size": 8192, "micro_batch": 4, "grad_accum": 1,
        "effective_batch": 4 * ws, "tokens_per_step": 512 * ws, "steps": 20, "steps_per_epoch": 10, "epochs": 2,
        "train_samples": 40 * ws, "time_per_epoch_s": value(5120 * ws / tps if ok else 0),
        "train_time_s": value(10240 * ws / tps if ok else 0), "step_time_median_s": value(0.5),
        "step_time_p90_s": value(0.6), "forward_median_s": value(0.1), "backward_median_s": value(0.2),
        "optimizer_median_s": value(0.1), "tokens_per_s": value(tps), "samples_per_s": value((tps or 0) / 128),
        "flops_per_token": 6.5e7, "peak_tflops": math.nan if cpu else 989.0,
        "mfu": math.nan if cpu or not ok else 6.5e7 * tps / (ws * 989e12),
        "peak_allocated_bytes": value(0.5 * GiB * (4 - stage) / 4 + 0.1 * GiB),
        "peak_reserved_bytes": math.nan if cpu else value(0.6 * GiB * (4 - stage) / 4 + 0.2 * GiB),
        "peak_host_rss_bytes": value((2.0 + repeat * 0.01) * GiB * ws),
        "initial_loss": value(9.0), "final_loss": value(5.0 + 0.01 * repeat), "val_loss_initial": value(9.0),
        "val_loss_final": value(5.1), "val_ppl_final": value(math.exp(5.1)),
        "predicted_model_state_bytes": predicted, "predicted_host_state_bytes": 0.0,
        "predicted_tokens_per_s": 1000.0 * ws if strategy == "ddp" else math.nan,  # ddp measures 1100 per rank
        "sampler_status": "ok", "sampler_peak_device_bytes": (
            math.nan if cpu or strategy == "fsdp" else value((1.5 - 0.1 * stage + 0.01 * repeat) * GiB)),
        "sampler_peak_host_bytes": value((2.1 + repeat * 0.01) * GiB * ws),
        "provenance": f"runs/{MODEL}-{strategy}-w{ws}-r{repeat}/provenance.json",
        "settings": f"runs/{MODEL}-{strategy}-w{ws}-r{repeat}/strategy_settings.json",
    }


def step_rows(run: dict) -> list[dict]:
    last = 20 if run["status"] == "ok" else 3 if run["status"] == "oom" else 0
    return [{"run_id": run["run_id"], "model": run["model"], "strategy": run["strategy"], "layout": run["layout"],
             "world_size": run["world_size"], "repeat": run["repeat"], "step": s, "epoch": (s - 1) // 10,
             "loss": 9.0 - 0.2 * s + 0.02 * run["repeat"], "lr": 3e-4, "step_time_s": 0.5, "forward_s": 0.1,
             "backward_s": 0.2, "optimizer_s": 0.1, "tokens": run["tokens_per_step"],
             "samples": run["effective_batch"], "warmup": s <= 2, "wall_s": 0.5 * s} for s in range(1, last + 1)]


def vram_rows(run: dict, cpu: bool) -> list[dict]:
    if run["status"] not in ("ok", "oom"):
        return []
    devices = [-1] if cpu else list(range(run["world_size"]))
    n = 40 if run["status"] == "ok" else 6
    return [{"run_id": run["run_id"], "model": run["model"], "strategy": run["strategy"], "layout": run["layout"],
             "world_size": run["world_size"], "repeat": run["repeat"], "time_unix": 1.7e9 + 0.25 * i,
             "t_s": 0.25 * i, "backend": "host" if cpu else "nvml", "device": d,
             "used_bytes": (0.5 + min(i, 10) * 0.1) * GiB + d * 1e6, "total_bytes": 80 * GiB,
             "process_bytes": math.nan, "step": i // 2} for i in range(n) for d in devices]


def make_study(directory: Path, cpu: bool = False, empty: bool = False) -> dict:
    """Write runs.csv, steps.csv, vram.csv (header only when empty) and return their paths."""
    runs = [] if empty else [run_row(s, z, f, ws, r, st, tps, cpu)
                             for s, z, f, ws, statuses, tps_list in PLAN
                             for r, (st, tps) in enumerate(zip(statuses, tps_list))]
    steps = [row for run in runs for row in step_rows(run)]
    vram = [row for run in runs for row in vram_rows(run, cpu)]
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows, columns in (("runs", runs, RUNS_COLUMNS), ("steps", steps, STEPS_COLUMNS),
                                ("vram", vram, VRAM_COLUMNS)):
        paths[name] = directory / f"{name}.csv"
        pd.DataFrame(rows, columns=columns).to_csv(paths[name], index=False)
    return paths


# ---------------------------------------------------------------- statistics
@pytest.mark.parametrize("dof,expected", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423)])
def test_t_quantile_matches_printed_table(dof, expected):
    assert stats.t_quantile(0.975, dof) == pytest.approx(expected, abs=1e-4)


def test_mean_ci_by_hand():
    """1000, 1100, 1200: mean 1100, sd 100; t(0.975, 2) = 4.3027 (printed table) -> half-width
    4.3027 x 100 / sqrt(3) = 248.41."""
    ci = stats.mean_ci(DDP_TPS + [float("nan")])  # NaN dropped
    assert ci.n == 3 and ci.mean == pytest.approx(1100.0) and ci.sd == pytest.approx(100.0)
    assert ci.half_width == pytest.approx(248.41, abs=0.01)
    assert (ci.low, ci.high) == pytest.approx((851.59, 1348.41), abs=0.01)
    one = stats.mean_ci([7.0])
    assert one.mean == 7.0 and math.isnan(one.half_width)
    assert math.isnan(stats.mean_ci([]).mean)


def t_two_sided_p(t: float, dof: float, steps: int = 200_000) -> float:
    """2 P(T > |t|) by Simpson's rule over Student's t density on [0, |t|] (independent of stats' beta function)."""
    c = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)
    f = (lambda x: c * (1 + x * x / dof) ** (-(dof + 1) / 2))
    h = abs(t) / steps
    area = f(0) + f(abs(t)) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, steps))
    return 1 - 2 * area * h / 3


def test_welch_by_hand():
    """a = 1..4: mean 2.5, variance 5/3; b = 2, 4, 6: mean 4, variance 4. Variances of the means 0.41667 and
    1.33333: t = -1.5 / sqrt(1.75) = -1.13389; Welch-Satterthwaite dof = 1.75^2 / (0.41667^2/3 + 1.33333^2/2)
    = 3.2347; the p-value from the t density integrated numerically."""
    w = stats.welch([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0])
    assert w.t == pytest.approx(-1.13389, abs=1e-5) and w.dof == pytest.approx(3.2347, abs=1e-4)
    assert w.p == pytest.approx(t_two_sided_p(-1.13389, 3.2347), abs=1e-4)
    assert 0.2 < w.p < 0.4  # the printed table: |t| between t(0.8, 3) = 0.978 and t(0.9, 3) = 1.638
    assert math.isnan(stats.welch([1.0], [2.0, 4.0, 6.0]).p)


def test_welch_matches_scipy():
    """Our Welch test and t quantile (report/stats.py: the pipeline leaves scipy out) against scipy 1.17.1's
    ttest_ind(a, b, equal_var=False).pvalue and t.ppf(0.975, 3.7), computed once and written here, so the check
    runs where scipy is not installed (the suite's environment, envs/setup.sh)."""
    a, b = [3.1, 2.9, 3.4, 3.0, 3.3], [3.6, 3.9, 3.5]
    assert stats.welch(a, b).p == pytest.approx(0.02258222702683361, rel=1e-9)
    assert stats.t_quantile(0.975, 3.7) == pytest.approx(2.8675207071911895, rel=1e-9)


def test_compare_verdicts():
    assert stats.compare(DDP_TPS, DDP_TPS).distinguishable is False
    assert stats.compare(DDP_TPS, ZERO2_TPS).distinguishable is True
    assert stats.compare(DDP_TPS, ZERO2_TPS).ci_overlap is False
    assert stats.compare(DDP_TPS, [3000.0]).distinguishable is None


# ---------------------------------------------------------------- summary table
@pytest.fixture()
def gpu(tmp_path):
    paths = make_study(tmp_path / "in")
    out = tmp_path / "out"
    tables.main(["--runs", str(paths["runs"]), "--out-dir", str(out)])
    return paths, out


def test_writes_all_outputs(gpu):
    _, out = gpu
    for name in ("summary.md", "summary.tex", "summary.csv", "comparisons.md"):
        assert (out / name).stat().st_size > 100, name
    tex = (out / "summary.tex").read_text()
    assert r"\toprule" in tex and r"\bottomrule" in tex and r"zero\_infinity" in tex


def test_one_row_per_group_including_failures(gpu):
    _, out = gpu
    summary = pd.read_csv(out / "summary.csv")
    expected = {(MODEL, s, ws) for s, _, _, ws, _, _ in PLAN}
    assert set(zip(summary["model"], summary["strategy"], summary["world_size"])) == expected
    assert len(summary) == len(expected)
    row = summary.set_index(["strategy", "world_size"])
    assert row.loc[("zero3", 1), "status"] == "oom" and math.isnan(row.loc[("zero3", 1), "tokens_per_s"])
    assert row.loc[("zero_infinity", 2), "status"] == "unsupported"
    assert row.loc[("fsdp", 1), "status"] == "ok" and row.loc[("fsdp", 1), "n_ok"] == 2
    assert "1 failed" in row.loc[("fsdp", 1), "status_detail"]
    md = (out / "summary.md").read_text()
    oom_line = next(line for line in md.splitlines() if line.startswith("| `zero3`") and "| 1 |" in line)
    assert "OOM" in oom_line and "out of memory" in md
    assert any(line.startswith("| `zero_infinity`") and "unsupported" in line for line in md.splitlines())


def test_ci_numbers_in_summary(gpu):
    _, out = gpu
    row = pd.read_csv(out / "summary.csv").set_index(["strategy", "world_size"]).loc[("ddp", 1)]
    assert row["tokens_per_s"] == pytest.approx(1100.0)
    assert row["tokens_per_s_ci95"] == pytest.approx(248.4138, abs=1e-3)
    assert row["tokens_per_s_n"] == 3
    single = pd.read_csv(out / "summary.csv").set_index(["strategy", "world_size"]).loc[("zero3", 2)]
    assert single["tokens_per_s"] == 3000.0 and math.isnan(single["tokens_per_s_ci95"])
    md = (out / "summary.md").read_text()
    ddp = next(line for line in md.splitlines() if line.startswith("| `ddp`"))
    assert "1,100 ± 248" in ddp


def test_hidden_strategy_stays_in_tables(gpu):
    _, out = gpu
    summary = pd.read_csv(out / "summary.csv")
    assert (summary["strategy"] == "zero0").sum() == 2
    assert not summary.loc[summary["strategy"] == "zero0", "in_figures"].any()
    assert "Left out of the figures (in the table only): zero0" in (out / "summary.md").read_text()


def test_peak_memory_source_and_footnote(gpu, tmp_path):
    _, out = gpu
    summary = pd.read_csv(out / "summary.csv").set_index(["strategy", "world_size"])
    assert summary.loc[("ddp", 1), "peak_memory_source"] == "sampler"
    assert summary.loc[("ddp", 1), "peak_memory_bytes"] == pytest.approx(1.51 * GiB)
    assert summary.loc[("fsdp", 1), "peak_memory_source"] == "reserved"  # no sampler value
    md = (out / "summary.md").read_text()
    assert "Peak memory (GiB)" in md and "(d) device-wide peak" in md and "(r) torch max_memory_reserved" in md
    cpu_paths = make_study(tmp_path / "cpu", cpu=True)
    tables.main(["--runs", str(cpu_paths["runs"]), "--out-dir", str(tmp_path / "cpu_out")])
    cpu = pd.read_csv(tmp_path / "cpu_out" / "summary.csv")
    assert set(cpu.loc[cpu["status"] == "ok", "peak_memory_source"]) == {"host_rss"}
    assert "(h) peak host RSS" in (tmp_path / "cpu_out" / "summary.md").read_text()


def test_provenance_links(gpu):
    paths, out = gpu
    md = (out / "summary.md").read_text()
    link = "[r0](../in/runs/gpt2-tiny-ddp-w1-r0/provenance.json)"
    assert link in md
    summary = pd.read_csv(out / "summary.csv")
    assert summary["provenance"].str.contains("provenance.json").all()


def test_comparisons(gpu):
    _, out = gpu
    text = (out / "comparisons.md").read_text()
    section = text.split("## gpt2-tiny, 1 GPU")[1].split("\n## ")[0]
    throughput = section.split("### Throughput")[1].split("### Peak memory")[0]
    assert "| `ddp` | `zero0` |" in throughput  # identical numbers: not distinguishable
    assert "ddp–zero2" in throughput.split("Distinguishable (p < 0.05):")[1]
    assert "zero3 (oom)" in section or "`zero3` 0/1 (oom)" in section
    assert "Cannot be tested" not in throughput  # at 1 GPU every successful strategy has >= 2 repeats
    two = text.split("## gpt2-tiny, 2 GPUs")[1]
    assert "zero3" in two.split("Cannot be tested")[1]


@pytest.mark.parametrize("header_only", [True, False])
def test_empty_inputs_still_write_everything(tmp_path, header_only):
    runs = tmp_path / "runs.csv"
    if header_only:
        make_study(tmp_path, empty=True)
    else:
        runs.write_text("")
    tables.main(["--runs", str(runs), "--out-dir", str(tmp_path / "out")])
    for name in ("summary.md", "summary.tex", "summary.csv", "comparisons.md"):
        assert (tmp_path / "out" / name).exists(), name
    assert "No runs." in (tmp_path / "out" / "comparisons.md").read_text()


def test_all_unsupported_study(tmp_path):
    paths = make_study(tmp_path)
    runs = pd.read_csv(paths["runs"])
    runs["status"], runs["reason"] = "unsupported", "no GPU"
    runs.to_csv(paths["runs"], index=False)
    summary = tables.write_all(paths["runs"], tmp_path / "out")
    assert (summary["status"] == "unsupported").all() and len(summary) == len({(p[0], p[3]) for p in PLAN})
    assert "no successful run reported one" in (tmp_path / "out" / "summary.md").read_text()


def test_a_table_without_layout_keys_is_one_clear_error(tmp_path):
    paths = make_study(tmp_path)
    runs = pd.read_csv(paths["runs"])
    runs.loc[3, "layout"] = None
    runs.to_csv(paths["runs"], index=False)
    with pytest.raises(ValueError, match=r"1 of 27 rows have no layout key or world size "
                                         r"\(the first: run gpt2-tiny-zero0-w1-r0\)"):
        tables.read_runs(paths["runs"])
    with pytest.raises(ValueError, match="no `layout` column"):
        tables.with_layout(runs.drop(columns="layout"))


# ---------------------------------------------------------------- findings (the report's first page)
def findings_of(tmp_path, reproduction: pd.DataFrame | None = None) -> tuple[str, str]:
    from workflow_scripts.report import findings

    paths = make_study(tmp_path / "in")
    args = ["--runs", str(paths["runs"]), "--study", "synthetic", "--md", str(tmp_path / "f.md"),
            "--rst", str(tmp_path / "f.rst")]
    if reproduction is not None:
        reproduction.to_csv(tmp_path / "reproduction.csv", index=False)
        args += ["--verify", str(tmp_path / "reproduction.csv")]
    findings.main(args)
    return (tmp_path / "f.md").read_text(), (tmp_path / "f.rst").read_text()


def md_rows(md: str, section: str) -> list[list[str]]:
    """The body rows of a section's table (its header row left out)."""
    block = md.split(f"## {section}\n")[1].split("\n## ")[0]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in block.splitlines()
            if line.startswith("| ")][1:]


def test_findings_fastest_and_lowest_memory_by_hand(tmp_path):
    """1 GPU: zero2 2000, 2010, 1990 tokens/s (sd 10: ± 4.3027 x 10 / sqrt(3) = 24.8) against ddp 1100 (+82 %);
    Welch t = 900 / sqrt(100^2/3 + 10^2/3) = 15.5 on 2.04 dof: p = 0.004. Peak memory (sampler): zero2 1.30, 1.31,
    1.32 GiB against ddp's 1.51 (-13 %); fsdp's is torch reserved (no sampler value), so it is not ranked. zero0 is
    hidden (identical to ddp): 5 strategies, 3 ran to ok. 2 GPUs: zero2 4000 ± 50 against zero3's one repeat 3000
    (+33 %, not testable); lowest memory zero3 1.20 GiB against zero2 1.31 (-8 %)."""
    md, _ = findings_of(tmp_path)
    one, two = md_rows(md, "Findings")
    assert one == ["gpt2-tiny", "1 GPU", "zero2", "2,000 ± 25 tokens/s [1]", "+82 % over ddp (Welch p = 0.004)",
                   "zero2", "1.31 ± 0.02 GiB [2]", "−13 % under ddp", "3 of 5"]
    assert two[:6] == ["gpt2-tiny", "2 GPUs", "zero2", "4,000 ± 50 tokens/s [1]",
                       "+33 % over zero3 (not tested: under 2 repeats)", "zero3"]
    assert two[6:] == ["1.20 GiB [2]", "−8 % under zero2", "4 of 5"]
    assert "[2] device-wide peak from the NVML/amdsmi sampler" in md
    assert "Left out of the rankings (identical to another strategy, in the tables only): zero0." in md


def test_findings_summary_ranks_and_what_was_not_measured(tmp_path):
    md, _ = findings_of(tmp_path)
    rows = {r[0]: r for r in md_rows(md, "Summary: gpt2-tiny, 1 GPU")}
    # by tokens/s: zero2 2000, ddp 1100, fsdp 925; by sampler peak: zero2 1.31, ddp 1.51 GiB (fsdp's: reserved)
    assert [rows[s][2:4] for s in ("zero2", "ddp", "fsdp")] == [["2,000 ± 25", "1"], ["1,100 ± 248", "2"],
                                                                ["925 ± 318", "3"]]
    assert [rows[s][4:6] for s in ("zero2", "ddp")] == [["1.31 ± 0.02 [1]", "1"], ["1.51 ± 0.02 [1]", "2"]]
    assert rows["fsdp"][4].startswith("0.350 ± 0.000 [") and rows["fsdp"][5].startswith("– [")
    assert rows["zero0"][3].startswith("– [") and rows["zero3"][1:4] == ["OOM", "–", "–"]
    assert rows["fsdp"][1] == "ok (2/3 ok; 1 failed)" and rows["fsdp"][7] == "2/3"
    assert md_rows(md, "Not measured") == [
        ["gpt2-tiny", "1 GPU", "zero3", "OOM", "CUDA out of memory at step 3"],
        ["gpt2-tiny", "1 GPU", "zero_infinity", "unsupported", "needs libaio (async_io op)"],
        ["gpt2-tiny", "1 GPU", "fsdp", "2/3 ok; 1 failed", "rank 1 exited with code 1"],
        ["gpt2-tiny", "2 GPUs", "zero_infinity", "unsupported", "needs libaio (async_io op)"]]
    assert "Reproduction" not in md  # no verify output given


def test_findings_give_verifys_verdict(tmp_path):
    keys = [("gpt2-tiny", s, "ws1", 0) for s in ("ddp", "zero2", "zero3", "fsdp", "zero_infinity")]
    verdicts = ["reproduced", "reproduced", "differs-explained", "differs-unexplained", "reproduced"]
    reproduction = pd.DataFrame([{"model": m, "strategy": s, "layout": k, "repeat": r, "verdict": v,
                                  "why": "throughput 0.71x" if v == "differs-unexplained" else ""}
                                 for (m, s, k, r), v in zip(keys, verdicts)])
    md, _ = findings_of(tmp_path, reproduction)
    block = md.split("## Reproduction (target verify)\n")[1].split("\n## ")[0]
    assert "| reproduced | 3 |" in block and "| differs-explained | 1 |" in block
    assert "| target verify | fails: 4 of 5 rows reproduced or explained |" in block
    assert md_rows(md, "Rows neither reproduced nor explained") == [
        ["gpt2-tiny", "fsdp", "ws1", "0", "differs-unexplained", "throughput 0.71x"]]


def test_findings_say_what_deciding_the_levers_cost(tmp_path):
    """Two lever trials: ddp measured in 30.0 s (eager 1,000, model_graphs 2,500 tokens/s), zero2 read from the cache
    in 0.02 s. Every timed run's launch takes 10 s: deciding is 30.02 s of 10 s x the rows."""
    import json

    from workflow_scripts.report import findings

    paths = make_study(tmp_path / "in")
    runs = pd.read_csv(paths["runs"]).assign(launch_wall_s=10.0)  # every repeat 10 s from start to exit
    runs.to_csv(paths["runs"], index=False)
    launch = 10.0 * len(runs)
    ddp = {"chosen": "model_graphs", "decided_s": 30.0, "cache": {"hit": False},
           "candidates": [{"candidate": "eager", "status": "ok", "tokens_per_s": 1000.0},
                          {"candidate": "model_graphs", "status": "ok", "tokens_per_s": 2500.0}]}
    zero2 = {**ddp, "decided_s": 0.02, "cache": {"hit": True}}
    files = []
    for strategy, verdict in (("ddp", ddp), ("zero2", zero2)):
        f = tmp_path / f"levers/gpt2-tiny/{strategy}/ws1.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps(verdict))
        files.append(str(f))
    findings.main(["--runs", str(paths["runs"]), "--levers", *files, "--md", str(tmp_path / "f.md"),
                   "--rst", str(tmp_path / "f.rst")])
    rows = md_rows((tmp_path / "f.md").read_text(), "Lever decisions")
    assert rows[0] == ["gpt2-tiny", "ddp", "ws1", "model_graphs", "measurement", "eager 1,000; model_graphs 2,500",
                       "30.0"]
    assert rows[1][4] == "cache" and rows[1][6] == "0.0"
    assert rows[2][4] == "1 measured, 1 cached" and rows[2][6] == "30.0"
    assert rows[2][5].startswith(f"{100 * 30.02 / launch:.0f} % of the timed runs' {launch:,.0f} s [")


def test_findings_rst_renders_without_docutils_warnings(tmp_path):
    """The report's first page: every table and footnote parses (a docutils warning would show in the page)."""
    from docutils.core import publish_parts

    _, text = findings_of(tmp_path)
    html = publish_parts(text, writer="html", settings_overrides={"report_level": 2, "halt_level": 2})["body"]
    assert html.count('class="findings') == 4 and '<sup>1</sup>' in html  # findings, 2 summaries, not measured
    assert "2,000 ± 25 tokens/s" in html and "zero_infinity" in html


def test_the_lever_table_counts_decisions_by_rule_apart():
    """A verdict that launched nothing (one candidate left: lever_trial.by_rule) reads `rule` with no candidate
    speeds, and the totals row counts it apart from the measured and cached ones: 2.0 s of deciding against the
    timed runs' 3 x 40 s is 2 %."""
    from workflow_scripts.report import findings

    measured = {"chosen": "blocks", "decided_s": 2.0, "cache": {"hit": False},
                "candidates": [{"candidate": "blocks", "status": "ok", "tokens_per_s": 900.0}]}
    ruled = {"chosen": "model_graphs", "decided_s": 0.0, "by": "rule", "candidates": []}
    cached = {**measured, "decided_s": 0.0, "cache": {"hit": True}}
    trials = {("m", "ddp", "ws1"): ruled, ("m", "zero1", "ws1"): measured, ("m", "zero2", "ws1"): cached}
    table = findings.lever_table(trials, pd.DataFrame({"launch_wall_s": [40.0, 40.0, 40.0]}))
    assert table.rows[0][3:6] == ["model_graphs", "rule", "–"]
    assert table.rows[3][4] == "1 measured, 1 cached, 1 by rule"
    assert table.rows[3][5].startswith("2 % of the timed runs' 120 s")
