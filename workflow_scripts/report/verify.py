"""Did a rerun reproduce a committed result set? (target verify)

    snakemake --cores all verify --configfile studies/<study>.yaml ... \\
        --config results_dir=results/<study>/<device>-rerun verify='{against: results/<study>/<device>}'

The study runs as usual into its own results_dir (never the committed one), replaying the committed runs'
resolved decisions (workflow_scripts/replay.py). Every run of either set gets two judgements and one verdict:

  numerics             final training and validation loss (absolute difference), peak memory (relative): within
                       `verify.tolerances` (bitwise where train.deterministic was on and the tolerance is 0), or
                       the committed set's recorded run-to-run spread where larger
  performance          throughput (rerun / committed tokens/s) on the same device kind: within the tolerance (or
                       the repeats' own spread), or explained by the two machines' calibrations (the step-time
                       model's ratio on each machine's rates, plan/step_time.py, else plan/bound.py's shares); on
                       another device kind the ratio is reported beside the prediction for both machines and judged
                       only with `verify.across_kinds: judge`
  changed              every resolved setting that differs (`key: committed -> rerun`: train settings, precision,
                       micro-batch split, package and CUDA versions, data hash) and the pipeline's code
                       (`pipeline: <commit> -> <commit>, changed: <modules>`, provenance.code_state)

  reproduced           numerics reproduce and the judged performance too (`changed` may still list changes)
  differs-explained    numerics reproduce; throughput off on the same kind, accounted for by the calibrations
  settings-changed     numerics or judged performance differ, and settings or code changed: `why` says which
  differs-unexplained  numerics or judged performance differ with nothing changed: `why` names the measures
  missing              in one set only (`why` says which)
  status-changed       ok in one, oom / unsupported / failed in the other

Memory is torch-allocated on GPU, the ranks' peak host RSS and the sampler's process peak on CPU. Every tolerance
is inclusive. A committed set may record its run-to-run spread (`verify/run_to_run.json`: the
largest loss, memory and throughput differences of two runs of the same rows on one machine, `--record-spread`);
each replaces its `verify.tolerances` value where it is larger. Where a set holds several repeats of a run, their
own spread in tokens/s (largest / smallest - 1; column `repeat_spread`: the larger of the two sets' spreads)
replaces the throughput tolerance of that run's rows where it is larger: a rerun within what either machine measured
of itself reproduces it (three repeats of a host-bound row spread up to 40 % within one command on one H100).

`compare` writes reproduction.csv / .md; `--check` prints the table and exits 1 when any row is neither
reproduced nor explained: the exit status follows numerics and same-kind performance (the table stays).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from workflow_scripts import columns as C
from workflow_scripts import replay, schema, status
from workflow_scripts.measure import provenance
from workflow_scripts.plan import bound
from workflow_scripts.report.stats import within
from workflow_scripts.report.tables import with_layout
from workflow_scripts.status import Verdict as V

KEYS = ["model", "strategy", "layout", "repeat"]
PASSING = status.PASSING
MEMORY = {"gpu": ["peak_allocated_bytes"], "cpu": ["peak_host_rss_bytes", "sampler_peak_process_bytes"]}


def rows(results_dir: Path) -> pd.DataFrame:
    runs = with_layout(pd.read_csv(results_dir / C.RUNS_TABLE))
    runs["repeat"] = runs["repeat"].astype(int)
    return runs.set_index(KEYS)


def recorded_tolerances(committed: Path, tol: dict) -> tuple[dict, str]:
    """The tolerances with the committed set's recorded run-to-run spread (C.RUN_TO_RUN: loss_abs, memory_rel,
    throughput_rel) where it is larger; and where they came from."""
    path = committed / C.RUN_TO_RUN
    if not path.exists():
        return tol, "verify.tolerances"
    spread = json.loads(path.read_text())
    wider = {k: float(spread[k]) for k in tol if spread.get(k) is not None and float(spread[k]) > tol[k]}
    return {**tol, **wider}, (f"verify.tolerances; run-to-run spread of {path} for {', '.join(sorted(wider))}"
                              if wider else "verify.tolerances")


def repeat_spread(runs: pd.DataFrame) -> dict:
    """Per (model, strategy, layout) with at least two `ok` repeats in tokens/s: largest / smallest - 1."""
    ok = runs[runs["status"] == C.OK].reset_index()
    out = {}
    for key, group in ok.groupby(KEYS[:-1]):
        speed = pd.to_numeric(group["tokens_per_s"], errors="coerce").dropna()
        if len(speed) >= 2 and speed.min() > 0:
            out[key] = float(speed.max() / speed.min() - 1.0)
    return out


def spread(table: pd.DataFrame, how: str) -> dict:
    """C.RUN_TO_RUN from a comparison of two runs of the same rows on one machine: the largest difference of each
    measure (rows whose settings or status differ are not a spread)."""
    same = table[table["verdict"].isin([V.REPRODUCED, V.DIFFERS_EXPLAINED, V.DIFFERS_UNEXPLAINED])]
    if "changed" in same:  # a row whose settings or code changed is no run-to-run spread
        same = same[same["changed"].fillna("") == ""]
    if same.empty:
        raise SystemExit("verify: no row of the comparison has the same settings and status in both sets")

    def largest(values) -> float:
        return float(pd.concat(values).abs().max())

    return {"loss_abs": largest([same["final_loss_diff"], same["val_loss_diff"]]),
            "memory_rel": largest([same["peak_memory_rel_diff"]]),
            "throughput_rel": largest([same["throughput_ratio"] - 1.0]), "rows": len(same), "how": how}


def number(value) -> float | None:
    """A table cell as a number: the largest value of a per-device JSON mapping (the sampler's process peak)."""
    if isinstance(value, str) and value.startswith("{"):
        found = [v for v in json.loads(value).values() if v is not None]
        return float(max(found)) if found else None
    return None if value is None or pd.isna(value) else float(value)


def relative(new, old) -> float | None:
    new, old = number(new), number(old)
    return None if new is None or old is None or not old else new / old - 1.0


def absolute(new, old) -> float | None:
    return None if pd.isna(new) or pd.isna(old) else float(new) - float(old)


def worst(values) -> float | None:
    present = [v for v in values if v is not None]
    return max(present, key=abs) if present else None


def measures(n: pd.Series, o: pd.Series) -> dict:
    gpu = str(n.get("platform", "cpu")).lower() != "cpu"
    ratio = (None if pd.isna(n.get("tokens_per_s")) or pd.isna(o.get("tokens_per_s")) or not o["tokens_per_s"]
             else float(n["tokens_per_s"] / o["tokens_per_s"]))
    return {"final_loss_diff": absolute(n.get("final_loss"), o.get("final_loss")),
            "val_loss_diff": absolute(n.get("val_loss_final"), o.get("val_loss_final")),
            "peak_memory_rel_diff": worst(relative(n.get(c), o.get(c)) for c in MEMORY["gpu" if gpu else "cpu"]),
            "throughput_ratio": ratio}


def model_ratio(o, committed: Path, rerun: Path) -> tuple[float, str] | None:
    """Rerun / committed tokens/s that the step-time model predicts for the committed GPU run on the two sets'
    calibrations (each machine's GEMM and attention curves, copies, launch cost, bus bandwidths, as measured: not
    its kind's median host costs, which would leave two machines' hosts alike), and what bounds it; None where a
    calibration lacks the curves or the model does not cover the run (bound.py's shares then)."""
    from workflow_scripts.plan import step_time as st
    from workflow_scripts.report.parse import step_rates

    if bound.on_cpu(o):
        return None
    rates = [step_rates(str(path / C.CALIBRATION), machine_own=True) if (path / C.CALIBRATION).exists() else None
             for path in (committed, rerun)]
    if not all(isinstance(r, st.Rates) for r in rates):
        return None
    run = st.run_at(committed / "tables" / o["run_dir"])
    if st.not_modelled(run):
        return None
    old, new = (st.predict(run, r) for r in rates)
    if not (old.modelled and new.modelled):  # a calibration lacks a term's input: bound.py's shares then
        return None
    return old.step_s / new.step_s, (f"step-time model: {old.bound}-bound, {old.step_s * 1e3:.1f} -> "
                                     f"{new.step_s * 1e3:.1f} ms a step")


def explained(ratio: float, predicted: float | None, tol: float) -> bool:
    """The calibration explains a throughput ratio when what is left once it is divided out is within the
    tolerance and at most half the deviation there was (a prediction of x1.02 does not explain x1.11 merely because
    x1.11 / 1.02 falls inside the tolerance)."""
    if not predicted:
        return False
    left = ratio / predicted - 1.0
    return within(left, tol) and abs(left) <= abs(ratio - 1.0) / 2


def numerics_off(m: dict, tol: dict) -> list[str]:
    """The numeric measures outside their tolerance: loss, validation loss, memory (a missing loss counts)."""
    off = [name for name, value, limit in (("loss", m["final_loss_diff"], tol["loss_abs"]),
                                           ("validation loss", m["val_loss_diff"], tol["loss_abs"]),
                                           ("memory", m["peak_memory_rel_diff"], tol["memory_rel"]))
           if value is not None and not within(value, limit)]
    return off + (["loss (missing)"] if m["final_loss_diff"] is None else [])


def performance(m: dict, predicted: float | None, what_bounds: str, tol: dict) -> tuple[str, str]:
    """Throughput against the same machine kind: reproduced (within the tolerance or spread), explained (the two
    calibrations predict the ratio: `explained`) or differs."""
    ratio = m["throughput_ratio"]
    if ratio is not None and within(ratio - 1.0, tol["throughput_rel"]):
        return "reproduced", ""
    if ratio is not None and explained(ratio, predicted, tol["throughput_rel"]):
        return "explained", f"throughput x{ratio:.2f}, calibration predicts x{predicted:.2f} ({what_bounds})"
    return "differs", "throughput"


def across_kinds(n: pd.Series, o: pd.Series) -> tuple[str, str] | None:
    """(committed, rerun) device names where the two runs ran on different kinds of device, else None."""
    a, b = (str(r.get("device_name")) for r in (o, n))
    known = all(x not in ("", "nan", "None") for x in (a, b))
    return (a, b) if known and a != b else None


def judge(m: dict, predicted: float | None, what_bounds: str, tol: dict, kinds: tuple | None = None,
          changed: list | None = None, judge_kinds: bool = False) -> dict:
    """A row's two judgements and its verdict. numerics: loss, validation loss, memory within their tolerances.
    performance: throughput on the same machine kind (judged), across kinds a ratio beside the step-time model's
    prediction for both machines (reported, judged only with `judge_kinds`). The verdict follows numerics and the
    judged performance; a difference that comes with changed settings or code is `settings-changed` (what changed in
    `changed`), never unexplained."""
    off = numerics_off(m, tol)
    ratio = m["throughput_ratio"]
    if kinds and not judge_kinds:
        said = f"x{ratio:.2f}" if ratio is not None else "no throughput"
        perf, perf_why = "across kinds", (f"{said} {kinds[0]} -> {kinds[1]}"
                                          + (f", predicted x{predicted:.2f}" if predicted else "") + ": reported")
    else:
        perf, perf_why = performance(m, predicted, what_bounds, tol)
    out = {"numerics": "differs" if off else "reproduced", "performance": perf, "changed": "; ".join(changed or [])}
    bad = off + (["throughput"] if perf == "differs" else [])
    if bad:
        verdict = V.SETTINGS_CHANGED if changed else V.DIFFERS_UNEXPLAINED
        why = ", ".join(bad) + (f" ({'; '.join(changed)})" if changed else "")
    elif perf == "explained":
        verdict, why = V.DIFFERS_EXPLAINED, perf_why
    else:
        verdict, why = V.REPRODUCED, perf_why if perf == "across kinds" else ""
    return {**out, "verdict": verdict, "why": why}


def pipeline_change(committed: Path, rerun: Path, key) -> str | None:
    """What changed in the code between the committed run and the rerun: `pipeline: <commit> -> <commit>, changed:
    <modules>` from the modules' hashes both runs recorded (provenance.code_state), else from git between the two
    recorded commits where this checkout has both, else the commits alone; None where the executed code is the
    same."""
    found = [replay.run_dir(path, *key) / C.PROVENANCE for path in (committed, rerun)]
    old, new = (json.loads(f.read_text()) if f.exists() else {} for f in found)
    commits = [((p.get("git") or {}).get("commit") or "unknown")[:7] for p in (old, new)]
    head = f"pipeline: {commits[0]} -> {commits[1]}"
    changed = provenance.changed_modules(old.get("code"), new.get("code"))
    if changed is None and "unknown" not in commits and commits[0] != commits[1]:
        changed = provenance.changed_between(old["git"]["commit"], new["git"]["commit"])
    if changed is None:
        return None if commits[0] == commits[1] else f"{head} (the modules that changed are not recorded)"
    if not changed:
        return None
    shown = sorted((m.removeprefix("workflow_scripts/") for m in changed), key=lambda m: nearness(m, key[1]))
    more = f" and {len(shown) - 6} more" if len(shown) > 6 else ""
    return f"{head}, changed: {', '.join(shown[:6])}{more}"


def nearness(module: str, strategy: str) -> int:
    """How close a changed module is to a strategy's runs, for the order `changed` names them in: the strategy's
    own module, its family's modules (training/strategies/_<family>*.py: the engine), the engine interface and the
    other strategy modules, the training loop's package, then the rest."""
    from workflow_scripts.training.strategies import STRATEGIES

    family = STRATEGIES[strategy].family if strategy in STRATEGIES else strategy
    name = module.rsplit("/", 1)[-1]
    if module.startswith("training/strategies/"):
        if name == f"{strategy}.py":
            return 0
        return 1 if name.startswith(f"_{family}") else 2
    return 3 if module.startswith("training/") else 4


def row_verdict(key, new: pd.DataFrame, old: pd.DataFrame, rerun: Path, committed: Path, cals, tol,
                spreads: dict, judge_kinds: bool = False) -> dict:
    out = dict(zip(KEYS, key))
    if key not in old.index or key not in new.index:
        return {**out, "verdict": V.MISSING, "why": f"only in the {'rerun' if key in new.index else 'committed set'}"}
    n, o = new.loc[key], old.loc[key]
    changed = replay.settings_diff(replay.run_settings(committed, *key), replay.run_settings(rerun, *key))
    code = pipeline_change(committed, rerun, key)
    changed += [code] if code else []
    if n["status"] != o["status"]:
        return {**out, "verdict": V.STATUS_CHANGED, "why": f"{o['status']} -> {n['status']}",
                "changed": "; ".join(changed)}
    if n["status"] != C.OK:
        return {**out, "verdict": V.REPRODUCED, "why": f"{n['status']} in both", "changed": "; ".join(changed)}
    m = measures(n, o)
    if all(cals):
        m["calibration_ratio"], m["bound"] = model_ratio(o, committed, rerun) or bound.predicted_ratio(o, *cals)
    if key[:-1] in spreads:
        m["repeat_spread"] = spreads[key[:-1]]
        tol = {**tol, "throughput_rel": max(tol["throughput_rel"], m["repeat_spread"])}
    return {**out, **m, **judge(m, m.get("calibration_ratio"), m.get("bound", "no calibration"), tol,
                                across_kinds(n, o), changed, judge_kinds)}


def compare(rerun: Path, committed: Path, tolerances: dict | None = None, judge_kinds: bool = False) -> pd.DataFrame:
    tol = {**schema.default("verify", "tolerances"), **(tolerances or {})}
    tol, source = recorded_tolerances(committed, tol)
    new, old = rows(rerun), rows(committed)
    cals = (bound.calibration(committed), bound.calibration(rerun))
    keys = list(old.index) + [k for k in new.index if k not in old.index]  # the committed set's order first
    own = repeat_spread(old), repeat_spread(new)
    spreads = {key: max(each.get(key, 0.0) for each in own) for key in {*own[0], *own[1]}}
    table = pd.DataFrame([row_verdict(k, new, old, rerun, committed, cals, tol, spreads, judge_kinds)
                          for k in keys])
    # empty where no row was compared or a set has no calibration
    for column in ("numerics", "performance", "changed", "calibration_ratio", "bound", "repeat_spread"):
        table[column] = table[column] if column in table else None
    table.attrs["tolerances"] = {**tol, "source": source}
    return table


def failing(table: pd.DataFrame) -> pd.DataFrame:
    return table[~table["verdict"].isin(PASSING)]


def write(table: pd.DataFrame, rerun: Path, committed: Path, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(out_dir / "reproduction.csv", index=False)
    counts = table["verdict"].value_counts().to_dict() if len(table) else {}
    tol = table.attrs.get("tolerances") or {}
    head = (f"Reproduction of `{committed}` by `{rerun}`: "
            + (", ".join(f"{v} {k}" for k, v in counts.items()) or "no run in either set") + "\n\n"
            + (f"Tolerances (inclusive; {tol['source']}): loss {tol['loss_abs']:g}, memory "
               f"{tol['memory_rel']:.1%}, throughput {tol['throughput_rel']:.1%}.\n\n" if tol else ""))
    (out_dir / "reproduction.md").write_text(head + (table.to_markdown(index=False, floatfmt=".4g") + "\n"
                                                     if len(table) else ""))


def check(csv: Path) -> int:
    """The target's verdict: 0 when every row is reproduced or explained, else 1 with the rows that are not."""
    table = pd.read_csv(csv)
    bad = failing(table)
    print((csv.with_suffix(".md")).read_text())
    if len(bad):
        print(f"verify: {len(bad)} of {len(table)} runs neither reproduced nor explained:\n"
              + bad[KEYS + ["verdict", "why"]].to_string(index=False), file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rerun", help="the regenerated results_dir")
    ap.add_argument("--against", help="the committed results_dir")
    ap.add_argument("--tolerances", default="{}", help="JSON: loss_abs, memory_rel, throughput_rel")
    ap.add_argument("--across-kinds", choices=["report", "judge"], default="report",
                    help="throughput of runs on another device kind: reported beside the prediction, or judged")
    ap.add_argument("--out-dir")
    ap.add_argument("--check", help="a reproduction.csv: print it, exit 1 unless every row passes")
    ap.add_argument("--record-spread", metavar="CSV", help="a reproduction.csv of two runs of the same rows on one "
                    "machine: write its largest differences as --against's verify/run_to_run.json")
    ap.add_argument("--how", default="", help="with --record-spread: how the two runs were made")
    a = ap.parse_args(argv)
    if a.check:
        sys.exit(check(Path(a.check)))
    if a.record_spread:
        (Path(a.against) / C.RUN_TO_RUN).parent.mkdir(parents=True, exist_ok=True)
        (Path(a.against) / C.RUN_TO_RUN).write_text(json.dumps(spread(pd.read_csv(a.record_spread), a.how), indent=2))
        return
    rerun, committed = Path(a.rerun), Path(a.against)
    if not (committed / C.RUNS_TABLE).exists():
        raise SystemExit(f"verify.against: {committed} has no {C.RUNS_TABLE} (not a result set)")
    table = compare(rerun, committed, json.loads(a.tolerances), judge_kinds=a.across_kinds == "judge")
    write(table, rerun, committed, Path(a.out_dir))
    print((Path(a.out_dir) / "reproduction.md").read_text())


if __name__ == "__main__":
    main()
