"""Write the step-time model's rate files (workflow_scripts/plan/rates/<kind>.json) from a tree of calibrations:

    python3 -m experiments.step_time.rates --results results --out workflow_scripts/plan/rates
    python3 -m experiments.step_time.rates --results results --commit REV --out workflow_scripts/plan/rates

Each file is one GPU kind's calibration (<results>/calibration/<kind>/calibration.json: its GEMM and SDPA curves,
copies, collectives) with its host costs and block-kernel paces (plan.step_time.kind_row) replaced by the median
over every calibration of that kind under <results> (the kind's own and every study set's): one machine's own launch
measure does not order the machines of its kind by their steps, the kind's median does (plan.step_time.machine_row).
With --commit the calibrations are read from that revision of the repository (git ls-tree / git show), so the files
can be written again from a history the working tree no longer holds. The product reads only the written files.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

from workflow_scripts.plan import step_time as st

KINDS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}  # rate file -> the GPU it was measured on
CALIBRATION = "calibration.json"


def a_calibration(relative: str) -> bool:
    """Whether a path under the tree is a machine's calibration: a calibration set's (calibration/<name>/) or a study
    set's (<set>/calibration/), not a probe's copy beside it."""
    parts = Path(relative).parts
    return parts[-1] == CALIBRATION and (parts[-2] == "calibration" or len(parts) == 3 and parts[0] == "calibration")


def calibrations(results: Path, commit: str | None = None) -> dict[str, dict]:
    """Every machine's calibration under `results` (a_calibration: relative path -> its content), from the working
    tree or, with `commit`, from that revision."""
    if commit is None:
        paths = sorted(results.glob(f"**/{CALIBRATION}"))
        return {str(p.relative_to(results)): json.loads(p.read_text()) for p in paths
                if a_calibration(str(p.relative_to(results)))}
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, "--", str(results)], check=True,
                            capture_output=True, text=True).stdout.splitlines()
    out = {}
    for path in sorted(p for p in listed if a_calibration(str(Path(p).relative_to(results)))):
        text = subprocess.run(["git", "show", f"{commit}:{path}"], check=True, capture_output=True, text=True).stdout
        out[str(Path(path).relative_to(results))] = json.loads(text)
    return out


def kind_medians(found: dict[str, dict], gpu: str) -> dict[str, float]:
    """Per host-cost and block-kernel row (st.kind_row), the median over every calibration measured on `gpu`."""
    values: dict = {}
    for calibration in found.values():
        if st.machine_gpu(calibration) != gpu:
            continue
        for r in calibration["rows"]:
            if st.kind_row(r["name"]) and r["value"] is not None:
                values.setdefault(r["name"], []).append(float(r["value"]))
    return {name: statistics.median(v) for name, v in sorted(values.items())}


def kind_collectives(found: dict[str, dict], gpu: str) -> tuple[dict[str, float], int]:
    """Per collective (`<collective>_busbw[<ranks>x<size>]`), the median bus bandwidth over the calibration sets of
    several `gpu`s that measured it (calibration/<name>/: the kind's machines calibrated on their own, one host's GPUs
    and its interconnect), and how many sets those are. A plan naming the kind predicts its multi-GPU candidates'
    communication from them, and so does the fit for a set without a calibration of its own; a study's own
    calibration keeps its machine's (st.machine_row)."""
    values: dict = {}
    machines = 0
    for where, calibration in found.items():
        if not where.startswith("calibration/") or st.machine_gpu(calibration) != gpu:
            continue
        rows = [r for r in calibration["rows"] if "_busbw[" in r["name"] and r["value"] is not None]
        machines += bool(rows)
        for r in rows:
            values.setdefault(r["name"], []).append(float(r["value"]))
    return {name: statistics.median(v) for name, v in sorted(values.items())}, machines


def rate_file(found: dict[str, dict], kind: str) -> dict:
    """The rate file of `kind`: its calibration's rows, curves and GPU, the kind's medians folded in
    (st.with_medians), the collectives of its machines of several GPUs added (kind_collectives), and how many
    calibrations each is over."""
    gpu = KINDS[kind]
    own = found.get(f"calibration/{kind}/{CALIBRATION}")
    if own is None or st.machine_gpu(own) != gpu:
        raise SystemExit(f"calibration/{kind}/{CALIBRATION}: no calibration of {gpu} there")
    collectives, machines = kind_collectives(found, gpu)
    folded = st.with_medians(own, {**kind_medians(found, gpu), **collectives})
    return {"kind": kind, "medians_over": sum(st.machine_gpu(c) == gpu for c in found.values()),
            "collectives_over": machines,
            "machine": {"gpu": {"gpus": [{"name": gpu}]}}, "rows": folded["rows"], "curves": own["curves"]}


def dumps(record: dict) -> str:
    """Compact JSON, one row and one curve point a line (small, and a diff shows what moved)."""
    def one(x):
        return json.dumps(x, separators=(",", ":"))

    head = {k: v for k, v in record.items() if k not in ("rows", "curves")}
    lines = ["{" + one(head)[1:-1] + ',"rows":[']
    lines += [one(r) + ("," if i < len(record["rows"]) - 1 else "") for i, r in enumerate(record["rows"])]
    lines.append('],"curves":{')
    names = list(record["curves"])
    for j, name in enumerate(names):
        points = record["curves"][name]
        lines.append(f'"{name}":[')
        lines += [one(p) + ("," if i < len(points) - 1 else "") for i, p in enumerate(points)]
        lines.append("]" + ("," if j < len(names) - 1 else ""))
    return "\n".join(lines + ["}}"]) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="results", help="the tree of calibrations (calibration/<kind>/ among them)")
    ap.add_argument("--commit", help="read the tree at this revision of the repository instead of the working tree")
    ap.add_argument("--out", default=str(st.RATES), help="the folder the rate files go to")
    a = ap.parse_args(argv)
    found = calibrations(Path(a.results), a.commit)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        record = rate_file(found, kind)
        json.loads(dumps(record))  # the file parses back
        (out / f"{kind}.json").write_text(dumps(record))
        print(f"{out / kind}.json: {len(record['rows'])} rows, medians over {record['medians_over']} calibrations")


if __name__ == "__main__":
    main()
