"""The step-time model (plan/step_time.py) against the committed GPU sets: its constants fitted on the one-GPU sets
only, its error on the others (held out), every row listed.

    python -m experiments.step_time.fit --results DIR            # the held-out test with the committed constants
    python -m experiments.step_time.fit --results DIR --fit      # refit the constants on the one-GPU sets, then test
    python -m experiments.step_time.fit --results DIR --fit --same-sets   # refit on the sets the last fit named only
                                                                         # (the later one-GPU sets: a prospective test)

DIR: a tree of result sets (calibration/<kind>/ among them). Each row's rates: its GPU kind's rate file as
experiments.step_time.rates writes it from DIR (the kind's GEMM and attention curves and device copy bandwidth, its
host costs and block-kernel paces the median over every calibration of the kind in DIR, the set's own among them:
machines of one kind launch at 6-10 us, and one machine's own launch measure did not order the machines by their
steps); the bus bandwidths and host_beside of the set's own calibration where it has one (its machine), else the
median over the kind's calibration sets (in its rate file: rates.kind_collectives): as a study's own rows take
them (report.parse,
plan.step_time.load_rates). Compared: the predicted step time
against the row's median step time (`step_time_median_s`). A row whose timed steps followed a profiler window in
their process (`after_trace`, measure.metrics.timed_after_trace) carries the profiler's after-effect: no fit uses
it, and each error is given with and without such rows. Prints a markdown table, then the twins (the same run
measured on other machines of its kind: `twins`) and the repeats (the same run in the rounds of one machine:
`repeats`); --out writes it and the rows as CSV.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import pandas as pd

from experiments.step_time import rates as kind_rates
from workflow_scripts import columns as C
from workflow_scripts.plan import step_time as st

KINDS = {gpu: kind for kind, gpu in kind_rates.KINDS.items()}  # device name -> its rate file and calibration/<kind>
# what each constant may be (its physics): a block, compiled or not, moves at least what the committed trace of
# compiled GPT-2-medium blocks shows its kernels outside the matmuls move (bench_harness/h100-ddp-profile-mb16:
# 36 bytes per token, layer and d + f; a fit left free went to 8-12, trading the device's bytes for the host's
# overlap), the loss at least its bf16 logits and their fp32 copy, a micro-batch issues at least its data copy,
# loss and timing marks
BOUNDS = {"MEMORY_BYTES": (30, 1000), "LOSS_BYTES": (4, 64), "HOST_OPS": (1, 1000), "FIXED_OPS": (10, 500),
          "DS_OPS_PER_TENSOR": (1, 100), "HOOK_OPS": (1, 2000), "OVERLAP": (1, 16)}
CONSTANTS = ("MEMORY_BYTES", "LOSS_BYTES", "HOST_OPS", "FIXED_OPS", "DS_OPS_PER_TENSOR", "HOOK_OPS", "OVERLAP")


def committed_rows(results: Path) -> pd.DataFrame:
    """The ok GPU rows of every committed study set (tables/runs.csv) and benchmark run (bench/**/summary.json)."""
    frames = []
    for path in sorted(results.glob(f"**/{C.RUNS_TABLE}")):
        frame = pd.read_csv(path)
        frame["set"] = str(path.parent.parent.relative_to(results))
        frame["tables"] = str(path.parent)
        frames.append(frame)
    bench = []
    for path in sorted(results.glob("**/bench/**/summary.json")):
        summary = json.loads(path.read_text())
        top = str(path.relative_to(results)).split("/bench/")[0]
        bench.append({**{k: v for k, v in summary.items() if not isinstance(v, (list, dict))}, "set": top,
                      "tables": str(path.parent), "run_dir": "."})
    rows = pd.concat(frames + [pd.DataFrame(bench)], ignore_index=True)
    return rows[(rows["status"] == C.OK) & (rows["platform"] != "cpu") & rows["device_name"].isin(KINDS)]


def merged_calibration(kind: dict, own: dict | None) -> dict:
    """The kind's calibration with the set's own rows for what depends on the machine (st.machine_row: its
    collectives, its host's slowdown beside the node's other ranks)."""
    if not own:
        return kind
    mine = {r["name"]: r for r in own["rows"] if r["value"] is not None and st.machine_row(r["name"])}
    rows = [mine.pop(r["name"], r) for r in kind["rows"]] + list(mine.values())
    return {**kind, "rows": rows}


def rates_for(row, results: Path, cache: dict) -> st.Rates:
    own_path = results / row["set"] / C.CALIBRATION
    key = (row["device_name"], str(own_path))
    if key not in cache:
        if "calibrations" not in cache:
            cache["calibrations"] = kind_rates.calibrations(results)
        kind = kind_rates.rate_file(cache["calibrations"], KINDS[row["device_name"]])
        own = json.loads(own_path.read_text()) if own_path.exists() else None
        # the kind's file holds its calibration sets' median collectives (rates.kind_collectives); a set's own
        # calibration overrides them with its machine's
        cache[key] = st.Rates.of(merged_calibration(kind, own))
    return cache[key]


# a median over fewer timed steps is no step time to fit or test on: the memory-peak sets (4 steps, the allocator's
# history recorded: measure/memory_peak.py) and profiled 4-step sets run slower than the same rows elsewhere
MIN_TIMED_STEPS = 5


def too_few_steps(row) -> str | None:
    steps = row.get("timed_steps")
    if steps is not None and not pd.isna(steps) and int(steps) < MIN_TIMED_STEPS:
        return f"fewer than {MIN_TIMED_STEPS} timed steps (memory-history or profiled runs): not a step time"
    return None


def runs_of(rows: pd.DataFrame) -> tuple[pd.DataFrame, list, pd.DataFrame]:
    """(the rows the model covers, with `after_trace`; their runs; the others with the reason)."""
    out, keep, skipped = [], [], []
    for _, row in rows.iterrows():
        run = st.run_at(Path(row["tables"]) / row["run_dir"])
        why = too_few_steps(row) or st.not_modelled(run)
        keep.append(why is None)
        if why:
            skipped.append({"set": row["set"], "model": row["model"], "strategy": row["strategy"], "why": why})
        else:
            out.append(run)
    kept = rows[keep]
    return kept.assign(after_trace=[after_trace(row) for _, row in kept.iterrows()]), out, pd.DataFrame(skipped)


def after_trace(row) -> bool:
    """Whether the row's timed steps followed a profiler window in their process (measure.metrics.timed_after_trace):
    such a measurement carries the profiler's after-effect, so no fit uses it and the errors are given without it."""
    import csv

    from workflow_scripts.measure.metrics import timed_after_trace

    path = Path(row["tables"]) / row["run_dir"] / C.METRICS
    if not path.exists():
        return False
    with open(path, newline="") as f:
        return timed_after_trace(list(csv.DictReader(f)))


def predictions(rows: pd.DataFrame, runs: list, results: Path) -> pd.DataFrame:
    cache: dict = {}
    out = []
    for (_, row), run in zip(rows.iterrows(), runs):
        p = st.predict(run, rates_for(row, results, cache))
        measured = float(row["step_time_median_s"])
        out.append({"set": row["set"], "model": row["model"], "strategy": row["strategy"],
                    "layout": json.dumps(run.layout),
                    "gpus": int(row["world_size"]), "micro_batch": int(row["micro_batch"]), "levers": run.levers,
                    "measured_step_s": measured, "predicted_step_s": p.step_s,
                    "error": p.step_s / measured - 1, "bound": p.bound, "after_trace": bool(row["after_trace"]),
                    **{f"{k}_s": v for k, v in p.parts.items()}})
    return pd.DataFrame(out)


# the model's device parts and the kernel classes of a trace that time the same work (report/traces.py)
TRACED_PARTS = {"gemm": "gemm_kernel_ms", "attention": "attention_kernel_ms", "memory": "memory_bound_kernel_ms",
                "optimizer": "multi_tensor_kernel_ms"}


def traced_parts(results: Path) -> pd.DataFrame:
    """Each part of the model beside the kernel time of the same class in the committed traces (every set whose
    tables/traces.csv has kernel classes), per run, ms per step, the trace's mean over ranks and profiled steps."""
    cache: dict = {}
    out = []
    for table in sorted(results.glob("**/tables/traces.csv")):
        traces = pd.read_csv(table)
        if "gemm_kernel_ms" not in traces:
            continue
        runs = pd.read_csv(table.parent.parent / C.RUNS_TABLE)
        for (model, strategy, layout, repeat), ranks in traces.groupby(["model", "strategy", "layout", "repeat"]):
            row = runs[(runs.model == model) & (runs.strategy == strategy) & (runs.layout == layout)
                       & (runs.repeat == repeat)].iloc[0]
            set_name = str(table.parent.parent.relative_to(results))
            run = st.run_at(table.parent.parent / "runs" / model / strategy / layout / f"r{repeat}")
            parts = st.predict(run, rates_for({"set": set_name, "device_name": row["device_name"]}, results,
                                              cache)).parts
            out.append({"set": set_name, "model": model, "strategy": strategy, "gpus": int(row["world_size"]),
                        "levers": run.levers, "busy_ms": ranks["device_busy_ms"].mean(),
                        **{f"{part}_ms": parts[part] * 1e3 for part in TRACED_PARTS},
                        **{f"{part}_trace_ms": ranks[col].mean() for part, col in TRACED_PARTS.items()}})
    return pd.DataFrame(out)


def traced_markdown(frame: pd.DataFrame) -> str:
    lines = ["### the model's device parts against the kernels of the committed traces (ms per step; model / trace)",
             "", "| set | model | strategy | GPUs | levers | " + " | ".join(TRACED_PARTS) + " | device busy |",
             "|---|---|---|---|---|" + "---|" * (len(TRACED_PARTS) + 1)]
    for _, r in frame.iterrows():
        parts = " | ".join(f"{r[f'{p}_ms']:.1f} / {r[f'{p}_trace_ms']:.1f}" for p in TRACED_PARTS)
        lines.append(f"| {r['set']} | {r['model']} | {r['strategy']} | {r['gpus']} | {r['levers']} | {parts} | "
                     f"{r['busy_ms']:.1f} |")
    return "\n".join(lines + [""])


def twins(clean: pd.DataFrame) -> pd.DataFrame:
    """Rows the model cannot tell apart but by their calibrations: the same run (every input of plan.step_time.Run)
    on the same GPU kind, measured in more than one set (machine). Per such row of `clean` (keyed): its
    measured step against the median of its twins' in the other sets (`spread`: how far the machines of one kind
    differ on the same work), the twins' measured steps moved by the model's own ratio between this row's
    calibration and theirs (`transfer`: what the calibrations explain of that difference), the model's error, and
    the `floor`: this row's error under the one step that misses the whole group least (best_single_step), the
    least any model that gives one configuration on one GPU kind one step can err on it."""
    out = []
    for _, group in clean.groupby(["key", "device"]):
        if group["set"].nunique() < 2:
            continue
        best = best_single_step(group["measured_step_s"])
        for _, r in group.iterrows():
            others = group[group["set"] != r["set"]]
            moved = others["measured_step_s"] * r["predicted_step_s"] / others["predicted_step_s"]
            out.append({**{k: r[k] for k in ("set", "model", "strategy", "layout", "gpus", "micro_batch", "levers",
                                             "measured_step_s", "error", "bound")},
                        "twins": len(others), "spread": r["measured_step_s"] / others["measured_step_s"].median() - 1,
                        "transfer": moved.median() / r["measured_step_s"] - 1,
                        "floor": best / r["measured_step_s"] - 1})
    return pd.DataFrame(out)


def best_single_step(measured: pd.Series) -> float:
    """The one step that minimises the mean |step / measured - 1| over `measured` (the error is piecewise linear in
    the step, so its least lies at one of the measured values)."""
    return min(measured, key=lambda step: (step / measured - 1).abs().sum())


def keyed(frame: pd.DataFrame, runs: list, devices) -> pd.DataFrame:
    """The rows not timed after a trace, each with its run's every input to the model (`key`) and its GPU kind."""
    keys = [json.dumps(dataclasses.asdict(run), sort_keys=True, default=str) for run in runs]
    return frame.assign(key=keys, device=list(devices))[~frame["after_trace"].astype(bool)]


def repeats(clean: pd.DataFrame, least: int = 3) -> pd.DataFrame:
    """Rows of `clean` (keyed) measured at least `least` times in one set (the rounds of one machine, one command):
    per such row, its measured step against its group's median (`spread`: how far one machine repeats the same work),
    beside the model's error on it; what no model of the run's inputs can predict closer on average."""
    out = []
    for _, group in clean.groupby(["key", "device", "set"]):
        if len(group) >= least:
            median = group["measured_step_s"].median()
            out += [{"set": r["set"], "bound": r["bound"], "spread": r["measured_step_s"] / median - 1,
                     "error": r["error"], "gpus": r["gpus"]} for _, r in group.iterrows()]
    return pd.DataFrame(out)


def head(title: str, note: str, columns: tuple) -> list[str]:
    """A section of step_time.md: its title, what its columns mean, its table's header."""
    return [f"### {title}", "", note, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def roles(frame: pd.DataFrame) -> tuple:
    """(name, rows) of the held-out rows and of the fitted class (fit_class)."""
    held = ~fit_class(frame)
    return ("held out", frame[held]), ("fitted class", frame[~held])


def bounds_markdown(frame: pd.DataFrame) -> str:
    """The held-out rows by what bounds their predicted step: the device's kernels, the host's launches and hooks
    (whose pace a machine's CPUs do not hold from one moment to the next), or
    the rest (collectives, offload, a pipeline's bubble)."""
    test = held_out(frame) & ~fit_class(frame)
    kind = bound_kind(frame["bound"])
    lines = head("held out by what bounds the predicted step", "Error: the model's on those rows; bias: its mean "
                 "signed error.", ("bound", "n", "mean abs. error", "median", "bias"))
    for bound, rows in frame[test].groupby(kind[test]):
        lines.append(f"| {bound} | {len(rows)} | {rows['error'].abs().mean():.1%} | "
                     f"{rows['error'].abs().median():.1%} | {rows['error'].mean():+.1%} |")
    return "\n".join(lines + [""])


def bound_kind(bound: pd.Series) -> pd.Series:
    """What bounds each predicted step, in three: the device's kernels (plan.step_time.DEVICE_PARTS), the host's
    launches and hooks, or the rest (collectives, offload, a pipeline's bubble)."""
    return bound.map(lambda b: "host" if b == "host" else "device" if b in st.DEVICE_PARTS else "other")


def repeats_markdown(frame: pd.DataFrame) -> str:
    """The repeats' spread against the model's error, held out and fitted apart, by bound."""
    if frame.empty:
        return ""
    lines = head("the same run repeated on one machine (rounds of one set)",
                 "Spread: a row's measured step against the median of its rounds in its set (at least 3). Model: its "
                 "error on the same rows.", ("rows", "bound", "n", "spread", "model"))
    for name, part in roles(frame):
        for bound, rows in part.groupby("bound"):
            lines.append(f"| {name} | {bound} | {len(rows)} | {rows['spread'].abs().mean():.1%} | "
                         f"{rows['error'].abs().mean():.1%} |")
    return "\n".join(lines + [""])


def twins_markdown(frame: pd.DataFrame, rows: dict) -> str:
    """The twins' summary, held out and fitted apart and by bound, what their floor leaves of the whole class's error
    (`rows`: each class's rows, their bounds), and every held-out twin listed."""
    if frame.empty:
        return ""
    held = ~fit_class(frame)
    lines = head("the same run on other machines of its kind (twins: identical inputs to the model)",
                 "Spread: a row's measured step against its twins' median on the other machines. Moved: the twins' "
                 "steps times the model's ratio between the two calibrations. Model: its error. Floor: the error of "
                 "the one step that misses the row's group of twins least, the least any model that gives one run "
                 "on one GPU kind one step can err. Over all rows: that floor spread over every row of the class "
                 "(rows without twins at 0), a bound under the class's mean absolute error; estimated: each row "
                 "without twins at the mean floor of the twins of its bound, what such a model would err on the "
                 "class if the machines differ on the other rows as on these.",
                 ("rows", "bound", "n", "spread", "moved by the calibrations", "model", "floor",
                  "floor over all rows", "estimated over all rows"))
    for name, part in roles(frame):
        if not len(part):
            continue
        kinds = bound_kind(part["bound"])
        mean = part["floor"].abs().groupby(kinds).mean()
        counts = rows[name].value_counts()
        estimate = sum(mean.get(kind, 0.0) * n for kind, n in counts.items()) / len(rows[name])
        for kind, sub in [("all", part), *part.groupby(kinds)]:
            n = len(rows[name]) if kind == "all" else counts.get(kind, 0)
            guess = estimate if kind == "all" else mean[kind]  # the bound's rows without twins at its twins' mean
            whole = f"{sub['floor'].abs().sum() / n:.1%} of {n} | {guess:.1%}" if n else " | "
            lines.append(f"| {name} | {kind} | {len(sub)} | {sub['spread'].abs().mean():.1%} | "
                         f"{sub['transfer'].abs().mean():.1%} | {sub['error'].abs().mean():.1%} | "
                         f"{sub['floor'].abs().mean():.1%} | {whole} |")
    lines += ["", ("| set | model | strategy | layout | GPUs | mb | levers | measured s | twins | spread | moved | "
                   "model | floor |"), "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in frame[held].sort_values(["model", "strategy", "gpus", "set"]).iterrows():
        lines.append(f"| {r['set']} | {r['model']} | {r['strategy']} | {r['layout']} | {r['gpus']} | "
                     f"{r['micro_batch']} | {r['levers']} | {r['measured_step_s']:.4f} | {r['twins']} | "
                     f"{r['spread']:+.1%} | {r['transfer']:+.1%} | {r['error']:+.1%} | {r['floor']:+.1%} |")
    return "\n".join(lines + [""])


def fit_class(frame: pd.DataFrame) -> pd.Series:
    """The rows a fit may use: one-GPU rows of H100 sets (multi-GPU and H200 rows are the test)."""
    return (frame["gpus"] == 1) & ~frame["set"].str.contains("h200")


def held_out(frame: pd.DataFrame) -> pd.Series:
    """The rows the committed constants were not fitted on: every row outside the sets step_time_fit.json names
    (a set committed after the fit is held out even where a refit would use it)."""
    return ~frame["set"].isin(json.loads(st.FIT_FILE.read_text()).get("fitted_on") or [])


# where the search starts, in each constant's log range (0: its lower bound, 1: its upper): fixed points, so a refit
# gives the same constants whatever the committed file held (a search from the file's own drifted from run to run)
STARTS = (0.25, 0.5, 0.75)


def fit(rows: pd.DataFrame, runs: list, results: Path, same_sets: bool = False) -> dict:
    """The constants minimising the mean |log(predicted / measured)| over the one-GPU H100 rows (`same_sets`: of the
    sets the committed fit names): a bounded Powell search from each of STARTS, the best kept."""
    try:
        from scipy.optimize import minimize
    except ImportError:  # not in envs/requirements.txt: transformers imports it into every rank where it is installed
        raise SystemExit("experiments.step_time.fit --fit needs scipy (pip install scipy); the pipeline leaves it "
                         "out, as every training rank would import it through transformers (0.3-1 s a launch)"
                         ) from None

    train = fit_class(pd.DataFrame({"gpus": rows["world_size"].astype(int).values, "set": rows["set"].values}))
    train &= ~rows["after_trace"].values.astype(bool)
    if same_sets:
        train &= ~held_out(rows).values
    rows, runs = rows[train.values], [r for r, t in zip(runs, train.values) if t]
    levers = {r.levers for r in runs}
    cache: dict = {}
    cases = [(run, rates_for(row, results, cache), float(row["step_time_median_s"]))
             for (_, row), run in zip(rows.iterrows(), runs)]
    # the memory term's pace is the fitted machine's: its copy bandwidth and block kernels (plan.step_time.memory_rate)
    paces = {tuple(sorted({"hbm": rates.hbm, **rates.memory_block}.items())) for _, rates, _ in cases}
    if len(paces) > 1:
        raise ValueError("the fitted rows' calibrations differ in copy bandwidth or block kernels: fit one kind's")
    st.MEMORY_FITTED = dict(paces.pop()) if paces else {}
    # eager ZeRO-3's hooks are priced at a calibration's zero3_tensor_us where it has one: the fitted launches only
    # stand in where none has
    hooks = {st.sharding(r) for r, rates, _ in cases
             if not (st.sharding(r) == "zero3" and rates.zero3_tensor_us is not None)}
    losses = {"compiled" if r.compile_loss else "eager" for r in runs}
    # only what the one-GPU rows exercise is fitted; the rest keeps its stated value
    keys = [("MEMORY_BYTES", k) for k in st.MEMORY_BYTES if k in levers or k == "model" and "graphs" in levers] + \
        [("LOSS_BYTES", k) for k in st.LOSS_BYTES if k in losses] + \
        [("HOST_OPS", k) for k in st.HOST_OPS if k in levers and k != "graphs"] + \
        [("FIXED_OPS", None), ("DS_OPS_PER_TENSOR", None), ("OVERLAP", None)] + \
        [("HOOK_OPS", k) for k in st.HOOK_OPS if k in hooks]

    def assign(x):
        for (name, key), value in zip(keys, x):
            if key is None:
                setattr(st, name, math.exp(value))
            else:
                getattr(st, name)[key] = math.exp(value)

    def loss(x):
        assign(x)
        errors = [abs(math.log(st.predict(run, rates).step_s / measured)) for run, rates, measured in cases]
        return sum(errors) / len(errors)

    bounds = [tuple(math.log(v) for v in BOUNDS[n]) for n, _ in keys]
    searches = {at: minimize(loss, [lo + at * (hi - lo) for lo, hi in bounds], method="Powell", bounds=bounds,
                             options={"maxiter": 20000, "xtol": 1e-3, "ftol": 1e-6}) for at in STARTS}
    at, best = min(searches.items(), key=lambda item: item[1].fun)
    assign(best.x)
    return {"constants": {name: getattr(st, name) for name in CONSTANTS},
            "memory_pace": st.MEMORY_FITTED,
            "fitted_on": sorted(set(rows["set"])), "rows": len(cases), "mean_abs_log_error": best.fun,
            "fitted": [f"{n}[{k}]" if k else n for n, k in keys],
            "starts": {str(a): s.fun for a, s in searches.items()}, "kept_start": at}


def write_fit(fit_result: dict) -> None:
    """step_time_fit.json, the one place of the constants, with what they were fitted on and the commit."""
    from workflow_scripts.measure.provenance import git_state

    record = {**fit_result, "git": git_state(), "how": "python -m experiments.step_time.fit --fit"}
    st.FIT_FILE.write_text(json.dumps(record, indent=1) + "\n")


def markdown(frame: pd.DataFrame) -> str:
    lines = []
    test = held_out(frame)
    fitted = "fitted on (the one-GPU H100 rows of step_time_fit.json's sets)"
    for name, part in ((fitted, frame[~test & fit_class(frame)]),
                       ("held out (multi-GPU and H200 rows)", frame[test & ~fit_class(frame)]),
                       ("held out, committed after the fit (one-GPU H100 rows)", frame[test & fit_class(frame)])):
        if part.empty:
            continue
        mae = part["error"].abs().mean()
        median = part["error"].abs().median()
        clean = part[~part["after_trace"]]
        lines += [(f"### {name}: {len(part)} rows, mean absolute error {mae:.1%}, median {median:.1%}; "
                   f"without the {len(part) - len(clean)} timed after a trace (†): {len(clean)} rows, "
                   f"{clean['error'].abs().mean():.1%}"), "",
                  "| set | model | strategy | layout | GPUs | mb | levers | measured s | predicted s | error | bound |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for _, r in part.sort_values(["set", "model", "strategy"]).iterrows():
            dagger = " †" if r["after_trace"] else ""
            lines.append(f"| {r['set']} | {r['model']} | {r['strategy']} | {r['layout']} | {r['gpus']} | "
                         f"{r['micro_batch']} | {r['levers']} | {r['measured_step_s']:.4f}{dagger} | "
                         f"{r['predicted_step_s']:.4f} | {r['error']:+.1%} | {r['bound']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results", help="the tree of result sets")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--same-sets", action="store_true", help="with --fit: only the sets step_time_fit.json names")
    ap.add_argument("--out", help="a folder for step_time.md / .csv and traced_parts.md / .csv")
    a = ap.parse_args(argv)
    results = Path(a.results)
    rows, runs, skipped = runs_of(committed_rows(results))
    if a.fit:
        result = fit(rows, runs, results, a.same_sets)
        write_fit(result)
        print(json.dumps(result["constants"], indent=1))
    frame = predictions(rows, runs, results)
    text = markdown(frame) + "\n" + bounds_markdown(frame)
    clean = keyed(frame, runs, rows["device_name"])
    text += "\n" + twins_markdown(twins(clean), {name: bound_kind(part["bound"]) for name, part in roles(clean)})
    text += "\n" + repeats_markdown(repeats(clean))
    if len(skipped):
        text += (f"\nNot modelled: {len(skipped)} rows (" + "; ".join(
            f"{why}: {n}" for why, n in skipped.groupby("why").size().items()) + ")\n")
    print(text)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "step_time.md").write_text(text)
        frame.to_csv(Path(a.out) / "step_time.csv", index=False)
        traced = traced_parts(results)
        (Path(a.out) / "traced_parts.md").write_text(traced_markdown(traced))
        traced.to_csv(Path(a.out) / "traced_parts.csv", index=False)


if __name__ == "__main__":
    main()
