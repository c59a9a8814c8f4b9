"""How steady is one host CPU's single-thread pace, and which CPUs slow each other? The calibration's host-speed
measure (`cpu_single_thread`: measure/calibrate.python_loop, the fastest round) on every CPU the process may use:
alone, then beside a busy process pinned to each other CPU in turn (a shared physical core would show as a pair that
slows each other), then on the first CPU every moment for `--series` seconds, then on `--together` pairs of CPUs
at once (two processes, one a CPU, each measuring its own series over the same seconds: does the pace move on every
CPU at once, as a host-wide clock would, or on each apart?).

    python -m workflow_scripts.bench.host_pace [--series 30] [--together 3] [--out DIR]

Writes host_pace.json (every measure) and host_pace.md: the pace alone per CPU (min / median / max), the series'
10th / 50th / 90th percentiles, the pairs where a busy neighbour took more than 20 % of the pace (with how many of
them slowed each other both ways), and each pair measured together: the correlation of its two series in BIN_S bins.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

from workflow_scripts.measure.calibrate import PYTHON_LOOP, python_loop

SLOWED = 0.8  # a pace below this share of the CPU's own, alone, counts as slowed by the neighbour
BIN_S = 0.5  # seconds: the together pairs' series are averaged in bins of this width before they are correlated


def pace(cpu: int, tries: int = 3) -> float:
    """M iterations/s of python_loop on `cpu` (this process pinned there), the fastest of `tries`."""
    os.sched_setaffinity(0, {cpu})
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        python_loop()
        best = min(best, time.perf_counter() - start)
    return PYTHON_LOOP / 1e6 / best


def _busy(cpu: int, stop) -> None:
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        python_loop()


def _series(cpu: int, start: float, seconds: float, out) -> None:
    while time.time() < start:
        time.sleep(0.001)
    points = []
    while time.time() < start + seconds:
        points.append((time.time() - start, pace(cpu, 1)))
    out.put((cpu, points))


def together(a: int, b: int, seconds: float) -> dict:
    """Both CPUs' series over the same `seconds`, each in its own process pinned there."""
    out = mp.Queue()
    start = time.time() + 0.5
    procs = [mp.Process(target=_series, args=(c, start, seconds, out)) for c in (a, b)]
    for p in procs:
        p.start()
    got = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    return {"cpus": [a, b], "series": [got[a], got[b]]}


def binned_correlation(pair: dict) -> float:
    """Pearson's r of the two series' means in BIN_S bins (bins where both measured)."""
    bins = []
    for points in pair["series"]:
        acc: dict = {}
        for t, v in points:
            acc.setdefault(int(t / BIN_S), []).append(v)
        bins.append({k: statistics.mean(v) for k, v in acc.items()})
    keys = sorted(set(bins[0]) & set(bins[1]))
    return statistics.correlation([bins[0][k] for k in keys], [bins[1][k] for k in keys])


def measure(series_s: float, pairs: int = 3) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    alone = {c: pace(c, 5) for c in cpus}
    beside = {}
    for j in cpus:
        stop = mp.Event()
        neighbour = mp.Process(target=_busy, args=(j, stop))
        neighbour.start()
        time.sleep(0.2)
        beside[j] = {i: pace(i) for i in cpus if i != j}
        stop.set()
        neighbour.join()
    series, start = [], time.time()
    while time.time() - start < series_s:
        series.append((time.time() - start, pace(cpus[0], 1)))
    os.sched_setaffinity(0, set(cpus))
    step = max(1, len(cpus) // 2)
    pairs_at_once = [together(cpus[i], cpus[(i + step) % len(cpus)], series_s / 2)
                     for i in range(min(pairs, len(cpus) - 1))] if len(cpus) > 1 else []
    return {"cpus": cpus, "alone": alone, "beside": beside, "series": series, "together": pairs_at_once}


def markdown(m: dict) -> str:
    alone = list(m["alone"].values())
    slowed = {(j, i) for j, row in m["beside"].items() for i, v in row.items() if v < SLOWED * m["alone"][i]}
    both = sum(1 for j, i in slowed if (i, j) in slowed) // 2
    pairs = sum(len(row) for row in m["beside"].values())
    s = sorted(v for _, v in m["series"])
    q = lambda f: s[min(len(s) - 1, int(f * len(s)))]  # noqa: E731
    return "\n".join([
        "| measure | value |", "|---|---|",
        f"| CPUs | {len(m['cpus'])} |",
        f"| pace alone, M iterations/s: min / median / max over CPUs | {min(alone):.1f} / "
        f"{statistics.median(alone):.1f} / {max(alone):.1f} |",
        f"| pace on CPU {m['cpus'][0]} over {m['series'][-1][0]:.0f} s ({len(s)} measures): 10th / 50th / 90th "
        f"percentile, min | {q(0.1):.1f} / {q(0.5):.1f} / {q(0.9):.1f}, {s[0]:.1f} |",
        f"| (busy CPU, measured CPU) pairs slowed below {SLOWED:.0%} of alone | {len(slowed)} of {pairs} |",
        f"| of them, CPU pairs slowed both ways | {both} |",
        *[f"| CPUs {p['cpus'][0]} and {p['cpus'][1]} measured at once, {len(p['series'][0])} and "
          f"{len(p['series'][1])} measures: correlation of their {BIN_S} s means | {binned_correlation(p):+.2f} |"
          for p in m.get("together", [])], ""])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=float, default=30.0, help="seconds of the first CPU's series")
    ap.add_argument("--together", type=int, default=3, help="pairs of CPUs measured at once")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    m = measure(a.series, a.together)
    text = markdown(m)
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "host_pace.json").write_text(json.dumps(m, indent=1) + "\n")
        (a.out / "host_pace.md").write_text(text)


if __name__ == "__main__":
    main()
