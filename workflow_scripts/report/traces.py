"""Stage 5b (config `profile.enabled`): a run's profiler traces -> where each recorded step's time went.

    python3 -m workflow_scripts.report.traces analyse --traces <dir of rank<r>.json.gz> --out-dir <run>/traces
    python3 -m workflow_scripts.report.traces report --analyses <run>/traces/analysis.json ... \
        --table <csv> --figure <png>

Two analyses of every traced rank (measure/profile.py writes one trace per rank):
  * phases, every trace (CPU or GPU): per recorded step (ProfilerStep#N), the engine's ranges forward / backward /
    optimizer — on GPU the device work launched inside each range (kernels joined to their launches), on CPU the
    host ranges — the rest of the step, the time in collectives (NCCL kernels; on CPU the gloo: ranges) and how much
    of it ran while forward or backward compute did (overlap); on GPU also the step's device-busy time and its
    kernel time by class (GEMM, attention, multi-tensor optimizer / norm kernels, communication, copies, the
    memory-bound rest; KERNEL_CLASSES), which says whether a device-bound step is short of its GEMMs' rate or spends
    its time elsewhere.
  * Holistic Trace Analysis (HTA, `holistictraceanalysis`), GPU traces: temporal breakdown (compute / non-compute /
    idle), communication-computation overlap, the top kernels and the idle-time breakdown per rank. HTA reads GPU
    kernels only: on a CPU trace it has nothing to read (HTA 0.5 fails on one), so CPU runs get the phases alone and
    analysis.json says why.
Outputs: analysis.json (everything, with the method of each table) and phases.csv per run; the study's
tables/traces.csv (one row per run and rank: phases, communication, overlap, kernel classes, HTA's breakdown),
traces_kernels.csv (HTA's top kernels per rank), traces_idle.csv (HTA's idle-time breakdown per rank and stream) and
figures/traces.png/pdf.
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

import pandas as pd

from workflow_scripts import schema

PHASES = ("forward", "backward", "optimizer")
COLLECTIVE = re.compile(r"^(gloo|nccl|rccl):")  # the process group's own ranges around each collective
NCCL_KERNEL = re.compile(r"nccl|rccl", re.I)
RUNTIME = ("cuda_runtime", "cuda_driver")  # the host's calls into the device runtime (HIP's under the same names)
# the runtime calls that block the host until the device has caught up: a stream's, an event's or the device's
# synchronisation, and a synchronous copy (CUDA and HIP)
HOST_SYNC = re.compile(r"^(cuda|hip)((Stream|Event|Device)Synchronize|Memcpy)$")


def load_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def intersect(xs, ys) -> float:
    """Total length of the intersection of two sorted, disjoint interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def clip(events, a: float, b: float) -> list[tuple[float, float]]:
    return [(max(e["ts"], a), min(e["ts"] + e["dur"], b)) for e in events if e["ts"] < b and e["ts"] + e["dur"] > a]


# Device time by what a kernel computes, read off its name (CUDA and ROCm libraries' names, inductor's triton_*):
# the first class that matches (attention before GEMMs: cuDNN's attention kernels are wgmma kernels too);
# "memory_bound" is the rest (elementwise, norms, reductions, the loss, casts).
KERNEL_CLASSES = (
    ("communication", NCCL_KERNEL),
    ("attention", re.compile(r"sdpa|flash|fmha|attention|attn|cudnn::fusion::(compute_dot_do_o|convert_dq)",
                             re.IGNORECASE)),
    ("gemm", re.compile(r"nvjet|gemm|cutlass|cublas|xmma|Cijk_", re.IGNORECASE)),
    ("multi_tensor", re.compile(r"multi_tensor_apply|adam", re.IGNORECASE)),
)


def kernel_class(op: dict) -> str:
    if op.get("cat") in ("gpu_memcpy", "gpu_memset"):
        return "copies"
    return next((name for name, pattern in KERNEL_CLASSES if pattern.search(op["name"])), "memory_bound")


KERNEL_CLASS_NAMES = (*(name for name, _ in KERNEL_CLASSES), "copies", "memory_bound")
KERNEL_COLUMNS = ("device_busy_ms", *(f"{c}_kernel_ms" for c in KERNEL_CLASS_NAMES))
# the host's share of a step: each phase's host time, launches and synchronisations, and the step's synchronisations
STEP_COUNTS = (*(f"{p}_{x}" for x in ("host_ms", "launches", "syncs") for p in PHASES), "step_syncs", "step_sync_ms")


def gpu_ops(events: list[dict]) -> list[tuple[float, dict]]:
    """(host launch time, device op) of every kernel, memcpy and memset, joined through their correlation ids."""
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in RUNTIME and "correlation" in e.get("args", {})}
    device = ("kernel", "gpu_memcpy", "gpu_memset")
    return [(launch[e["args"]["correlation"]], e) for e in events
            if e.get("cat") in device and e.get("args", {}).get("correlation") in launch]


def launched_in(ops, a: float, b: float) -> list[dict]:
    """Of (host time, event) pairs, the events whose host call started within [a, b]."""
    return [op for t, op in ops if a <= t <= b]


def intervals(events) -> list[tuple[float, float]]:
    return union([(e["ts"], e["ts"] + e["dur"]) for e in events])


def step_phases(trace: dict) -> tuple[list[dict], str]:
    """Per recorded step (ProfilerStep#N): forward / backward / optimizer, the rest of the step, communication and
    its overlap with forward and backward, in ms; and where they were read (gpu or host).

    GPU trace: a phase is the device work launched while its host range was open (any thread: autograd launches
    backward kernels from its own), the step spans the device work launched during the step, communication is NCCL
    kernels. CPU trace: the host ranges themselves, communication the process group's collective ranges.
    Per phase also the host time its ranges took (`<phase>_host_ms`) and, on GPU traces, how many device ops it
    launched (`<phase>_launches`): a phase whose host time far exceeds its device time with thousands of launches is
    host-bound (per-tensor Python loops), which no faster kernel fixes. On GPU traces, the host's synchronisations
    with the device (HOST_SYNC calls) per phase (`<phase>_syncs`) and over the whole step (`step_syncs`, and
    `step_sync_ms` the host time they blocked): each one drains the launch queue, so the device idles while the host
    catches up."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e["name"] in PHASES]
    ops = gpu_ops(events)
    where = "gpu" if ops else "host"
    syncs = [(e["ts"], e) for e in events if e.get("cat") in RUNTIME and HOST_SYNC.match(e["name"])]
    rows = []
    for s in steps:
        a, b = s["ts"], s["ts"] + s["dur"]
        if where == "gpu":
            mine = launched_in(ops, a, b)
            if not mine:
                continue
            a, b = min(e["ts"] for e in mine), max(e["ts"] + e["dur"] for e in mine)
            phase = {p: intervals(op for r in ranges if r["name"] == p and s["ts"] <= r["ts"] <= s["ts"] + s["dur"]
                                  for op in launched_in(ops, r["ts"], r["ts"] + r["dur"])) for p in PHASES}
            comm_u = intervals(e for e in mine if NCCL_KERNEL.search(e["name"]))
            compute = intervals(e for e in mine if not NCCL_KERNEL.search(e["name"])
                                and any(x <= e["ts"] < y for x, y in phase["forward"] + phase["backward"]))
        else:
            phase = {p: union(clip([e for e in ranges if e["name"] == p], a, b)) for p in PHASES}
            comm_u = union(clip([e for e in events if e.get("cat") == "user_annotation"
                                 and COLLECTIVE.match(e["name"])], a, b))
            compute = union(phase["forward"] + phase["backward"])
        own = {p: [r for r in ranges if r["name"] == p and s["ts"] <= r["ts"] <= s["ts"] + s["dur"]] for p in PHASES}
        busy = length(union(sum(phase.values(), [])))
        step_ms = (b - a) / 1000
        row = {"step": int(s["name"].split("#")[1]), "step_ms": step_ms,
               **{f"{p}_ms": length(phase[p]) / 1000 for p in PHASES},
               "other_ms": max(step_ms - busy / 1000, 0.0), "comm_ms": length(comm_u) / 1000,
               "comm_overlapped_ms": intersect(comm_u, compute) / 1000,
               **{f"{p}_host_ms": sum(r["dur"] for r in own[p]) / 1000 for p in PHASES},
               **{f"{p}_launches": sum(len(launched_in(ops, r["ts"], r["ts"] + r["dur"])) for r in own[p])
                  if where == "gpu" else None for p in PHASES},
               **{f"{p}_syncs": sum(len(launched_in(syncs, r["ts"], r["ts"] + r["dur"])) for r in own[p])
                  if where == "gpu" else None for p in PHASES}}
        in_step = launched_in(syncs, s["ts"], s["ts"] + s["dur"])
        row["step_syncs"] = len(in_step) if where == "gpu" else None
        row["step_sync_ms"] = sum(e["dur"] for e in in_step) / 1000 if where == "gpu" else None
        row["comm_overlap_pct"] = 100 * row["comm_overlapped_ms"] / row["comm_ms"] if row["comm_ms"] else None
        if where == "gpu":
            row["device_busy_ms"] = length(intervals(mine)) / 1000
            row.update({f"{c}_kernel_ms": sum(e["dur"] for e in mine if kernel_class(e) == c) / 1000
                        for c in KERNEL_CLASS_NAMES})
        rows.append(row)
    return rows, where


def hta_tables(files: dict[int, Path], top: int) -> tuple[dict, str | None]:
    """HTA's breakdowns of GPU traces as records; (tables, why not) — HTA reads GPU kernels only."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        return {}, f"HTA not installed ({exc})"
    try:
        analysis = TraceAnalysis(trace_files={r: str(p) for r, p in files.items()},
                                 trace_dir=str(next(iter(files.values())).parent))
        temporal = analysis.get_temporal_breakdown(visualize=False)
        overlap = analysis.get_comm_comp_overlap(visualize=False)
        kernel_types, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, num_kernels=top)
        idle, _ = analysis.get_idle_time_breakdown(ranks=sorted(files), visualize=False)
    except Exception as exc:  # noqa: BLE001 - recorded: the phase analysis still stands
        return {}, f"HTA failed: {type(exc).__name__}: {str(exc).strip()[:300]}"

    def records(df: pd.DataFrame) -> list[dict]:
        return json.loads(df.reset_index(drop=df.index.name is None).to_json(orient="records"))

    return {"temporal": records(temporal), "overlap": records(overlap), "kernel_types": records(kernel_types),
            "top_kernels": records(kernels), "idle": records(idle)}, None


def analyse(trace_dir: Path, out_dir: Path, top: int = 10) -> dict:
    files = {int(m.group(1)): p for p in sorted(trace_dir.glob("rank*.json*"))
             if (m := re.match(r"rank(\d+)\.json", p.name))}
    out_dir.mkdir(parents=True, exist_ok=True)
    phases, where = [], {}
    for rank, path in files.items():
        rows, where[rank] = step_phases(load_trace(path))
        phases += [{"rank": rank, **r} for r in rows]
    on_gpu = any(w == "gpu" for w in where.values())
    hta, why = hta_tables(files, top) if on_gpu else ({}, "a CPU trace has no GPU kernels, which is all HTA reads")
    result = {"trace_dir": str(trace_dir), "ranks": sorted(files), "phases_read_on": where,
              "phases": phases, "hta": hta, "hta_why_not": why,
              "note": None if files else "no trace: the run ended before the profiler window (or failed)"}
    columns = ["rank", "step", "step_ms", *[f"{p}_ms" for p in PHASES], "other_ms", "comm_ms", "comm_overlapped_ms",
               "comm_overlap_pct", *STEP_COUNTS, *KERNEL_COLUMNS]
    pd.DataFrame(phases, columns=columns).to_csv(out_dir / "phases.csv", index=False)
    (out_dir / "analysis.json").write_text(json.dumps(result, indent=1, default=str))
    return result


# ---------------------------------------------------------------- the study's table and figure
def run_ids(path: Path) -> dict:
    """model / strategy / layout / repeat of <results>/runs/<model>/<strategy>/<layout>/r<K>/traces/analysis.json."""
    model, strategy, layout, repeat = path.parts[-6:-2]
    return {"model": model, "strategy": strategy, "layout": layout, "repeat": int(repeat[1:])}


def study_table(paths: list[Path]) -> pd.DataFrame:
    rows = []
    for path in paths:
        a = json.loads(path.read_text())
        ids = run_ids(path)
        phases = pd.DataFrame(a["phases"])
        temporal = {t["rank"]: t for t in a["hta"].get("temporal", [])}
        overlap = {o["rank"]: o for o in a["hta"].get("overlap", [])}
        for rank in a["ranks"]:
            mine = phases[phases["rank"] == rank] if len(phases) else phases
            row = {**ids, "rank": rank, "steps": len(mine), "phases_read_on": a["phases_read_on"].get(str(rank))}
            for col in ("step_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms", "comm_ms",
                        "comm_overlap_pct", *STEP_COUNTS, *KERNEL_COLUMNS):
                row[col] = mine[col].astype(float).mean() if len(mine) and col in mine else None
            t = temporal.get(rank, {})
            row.update({"hta_compute_pct": t.get("compute_time_pctg"), "hta_non_compute_pct":
                        t.get("non_compute_time_pctg"), "hta_idle_pct": t.get("idle_time_pctg"),
                        "hta_comm_overlap_pct": overlap.get(rank, {}).get("comp_comm_overlap_pctg"),
                        "hta_why_not": a["hta_why_not"]})
            rows.append(row)
    return pd.DataFrame(rows)


def hta_table(paths: list[Path], key: str) -> pd.DataFrame:
    """One of HTA's per-rank tables (top_kernels, idle) of every run, with the run's ids in front."""
    frames = []
    for path in paths:
        records = json.loads(path.read_text())["hta"].get(key) or []
        if records:
            frames.append(pd.DataFrame(records).assign(**run_ids(path)))
    if not frames:
        return pd.DataFrame(columns=["model", "strategy", "layout", "repeat", "rank"])
    table = pd.concat(frames, ignore_index=True)
    ids = ["model", "strategy", "layout", "repeat", "rank"]
    return table[ids + [c for c in table.columns if c not in ids]]


def traces_figure(table: pd.DataFrame, style: dict):
    """Per (model, layout) panel, one stacked bar per strategy (mean over ranks and repeats): HTA's compute /
    non-compute / idle shares of GPU time where there is one, else the step's phases; the communication overlap
    above each bar."""
    import seaborn as sns

    from workflow_scripts.report.style import empty_note, grid, titled
    from workflow_scripts.report.tables import order_strategies

    keys = list(dict.fromkeys(zip(table["model"], table["layout"]))) if len(table) else []
    fig, axes = grid(len(keys), style, legend_width=2.5)
    colours = sns.color_palette("muted", 5)
    handles = {}
    for ax, (model, layout) in zip(axes, keys):
        rows = table[(table["model"] == model) & (table["layout"] == layout)]
        gpu = rows["hta_compute_pct"].notna().any()
        parts = ([("hta_compute_pct", "compute (GPU)"), ("hta_non_compute_pct", "communication + memory (GPU)"),
                  ("hta_idle_pct", "idle (GPU)")] if gpu else
                 [("forward_ms", "forward"), ("backward_ms", "backward"), ("optimizer_ms", "optimizer"),
                  ("other_ms", "other")])
        names = order_strategies(rows["strategy"].unique())
        for x, name in enumerate(names):
            means = rows[rows["strategy"] == name].mean(numeric_only=True)
            bottom = 0.0
            for (col, label), colour in zip(parts, colours):
                value = float(means.get(col, 0) or 0)
                handles[label] = ax.bar(x, value, 0.8, bottom=bottom, color=colour)
                bottom += value
            overlap = means.get("hta_comm_overlap_pct") if gpu else means.get("comm_overlap_pct")
            if overlap == overlap and overlap is not None:
                ax.annotate(f"overlap {overlap:.0f}%", (x, bottom), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
        ax.set_ylabel("% of GPU time (HTA)" if gpu else "recorded step (ms, host ranges)")
        titled(ax, f"{model}, {layout}")
    if not keys:
        empty_note(axes[0], "no traces")
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside right center", frameon=False)
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    one = sub.add_parser("analyse", help="one run's traces")
    one.add_argument("--traces", required=True)
    one.add_argument("--out-dir", required=True)
    one.add_argument("--top", type=int, default=schema.default("profile", "top_kernels"))
    study = sub.add_parser("report", help="the study's table and figure")
    study.add_argument("--analyses", nargs="*", default=[])
    study.add_argument("--table", required=True)
    study.add_argument("--figure", required=True)
    study.add_argument("--style", default="{}", help="config `figures` as JSON")
    args = ap.parse_args(argv)
    if args.command == "analyse":
        result = analyse(Path(args.traces), Path(args.out_dir), args.top)
        print(f"traces: ranks {result['ranks']}, {len(result['phases'])} step rows, phases on "
              f"{sorted(set(result['phases_read_on'].values()))}, HTA: {result['hta_why_not'] or 'ok'}")
    else:
        paths = [Path(p) for p in args.analyses]
        table = study_table(paths)
        out = Path(args.table)
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, index=False)
        for key, name in (("top_kernels", "traces_kernels.csv"), ("idle", "traces_idle.csv")):
            hta_table(paths, key).to_csv(out.parent / name, index=False)
        from workflow_scripts.report.style import apply_style, parse_style, save

        style, figure = parse_style(args.style), Path(args.figure)
        apply_style(style)
        save(traces_figure(table, style), figure.parent, figure.stem, int(style["dpi"]))
        print(f"trace table: {len(table)} rows -> {args.table}")


if __name__ == "__main__":
    main()
