"""Did a rerun reproduce a committed result set? (rule verify)

    snakemake --cores all verify --configfile studies/<study>.yaml ... \\
        --config results_dir=results/<study>/<device>-rerun verify='{against: results/<study>/<device>}'

The study runs as usual into its own results_dir (never the committed one), then every regenerated row that the
committed set also has (same model, strategy, layout, repeat) is compared:
- final loss difference (absolute), peak memory difference (relative; torch allocated on GPU, none on CPU),
  throughput ratio (rerun / committed tokens/s);
- the ratio the machines' calibrations predict: bf16 matmul TFLOP/s on GPU, single-thread CPU speed on CPU
  (rule calibrate, in both sets; a committed set without calibration predicts nothing).
Verdict per row: `reproduced` (loss, memory and throughput within `verify.tolerances`), `differs-explained`
(loss and memory within, throughput off but within the tolerance of the calibration's prediction), else
`differs-unexplained`, saying which measure differs. Writes reproduction.csv and reproduction.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

KEYS = ["model", "strategy", "layout", "repeat"]
DEFAULT_TOLERANCES = {"loss_abs": 1e-3, "memory_rel": 0.05, "throughput_rel": 0.10}


def rows(results_dir: Path) -> pd.DataFrame:
    runs = pd.read_csv(results_dir / "tables/runs.csv")
    if "layout" not in runs:  # tables older than layouts: pure data parallel
        runs["layout"] = "ws" + runs["world_size"].astype(str)
    return runs.set_index(KEYS)


def calibration_speed(results_dir: Path) -> tuple[float | None, str]:
    """The machine's speed measure for the predicted throughput ratio (GPU matmul, else CPU single thread)."""
    path = results_dir / "calibration/calibration.json"
    if not path.exists():
        return None, "no calibration"
    cal = {r["name"]: r["value"] for r in json.loads(path.read_text())["rows"]}
    matmuls = [v for k, v in cal.items() if k.startswith("matmul_bf16[") and v]
    if matmuls:
        return sum(matmuls) / len(matmuls), "bf16 matmul TFLOP/s"
    return cal.get("cpu_single_thread"), "single-thread CPU speed"


def relative(new, old) -> float | None:
    return None if pd.isna(new) or pd.isna(old) or not old else float(new) / float(old) - 1.0


def verdict(loss_diff, memory_diff, ratio, predicted, tol: dict) -> tuple[str, str]:
    off = []
    if loss_diff is None or abs(loss_diff) > tol["loss_abs"]:
        off.append("loss")
    if memory_diff is not None and abs(memory_diff) > tol["memory_rel"]:
        off.append("memory")
    speed_ok = ratio is not None and abs(ratio - 1.0) <= tol["throughput_rel"]
    if not off and speed_ok:
        return "reproduced", ""
    if not off and ratio is not None and predicted and abs(ratio / predicted - 1.0) <= tol["throughput_rel"]:
        return "differs-explained", f"throughput x{ratio:.2f}, calibration predicts x{predicted:.2f}"
    return "differs-unexplained", ", ".join(off + ([] if speed_ok else ["throughput"]))


def compare(rerun: Path, committed: Path, tolerances: dict | None = None) -> pd.DataFrame:
    tol = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    new, old = rows(rerun), rows(committed)
    (speed_new, measure), (speed_old, _) = calibration_speed(rerun), calibration_speed(committed)
    predicted = speed_new / speed_old if speed_new and speed_old else None
    out = []
    for key in [k for k in new.index if k in old.index]:  # the rerun's order
        n, o = new.loc[key], old.loc[key]
        if n["status"] != "ok" or o["status"] != "ok":
            out.append({**dict(zip(KEYS, key)), "verdict": "not compared", "why": f"status {n['status']} / {o['status']}"})
            continue
        loss = None if pd.isna(n["final_loss"]) or pd.isna(o["final_loss"]) else float(n["final_loss"] - o["final_loss"])
        gpu = str(n.get("platform", "cpu")).lower() != "cpu"
        memory = relative(n["peak_allocated_bytes"], o["peak_allocated_bytes"]) if gpu else None
        ratio = None if pd.isna(n["tokens_per_s"]) or pd.isna(o["tokens_per_s"]) else n["tokens_per_s"] / o["tokens_per_s"]
        word, why = verdict(loss, memory, ratio, predicted, tol)
        out.append({**dict(zip(KEYS, key)), "final_loss_diff": loss, "peak_memory_rel_diff": memory,
                    "throughput_ratio": ratio, "calibration_ratio": predicted, "calibration_measure": measure,
                    "verdict": word, "why": why})
    return pd.DataFrame(out)


def write(table: pd.DataFrame, rerun: Path, committed: Path, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(out_dir / "reproduction.csv", index=False)
    counts = table["verdict"].value_counts().to_dict() if len(table) else {}
    head = (f"Reproduction of `{committed}` by `{rerun}`: " + (", ".join(f"{v} {k}" for k, v in counts.items())
                                                                 or "no row in common") + "\n\n")
    (out_dir / "reproduction.md").write_text(head + (table.to_markdown(index=False, floatfmt=".4g") + "\n"
                                                     if len(table) else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rerun", required=True, help="the regenerated results_dir")
    ap.add_argument("--against", required=True, help="the committed results_dir")
    ap.add_argument("--tolerances", default="{}", help="JSON: loss_abs, memory_rel, throughput_rel")
    ap.add_argument("--out-dir", required=True)
    a = ap.parse_args(argv)
    if not a.against:
        raise SystemExit("verify.against: not set: name the committed results_dir to compare with")
    rerun, committed = Path(a.rerun), Path(a.against)
    if not (committed / "tables/runs.csv").exists():
        raise SystemExit(f"verify.against: {committed} has no tables/runs.csv (not a result set)")
    table = compare(rerun, committed, json.loads(a.tolerances))
    write(table, rerun, committed, Path(a.out_dir))
    print((Path(a.out_dir) / "reproduction.md").read_text())


if __name__ == "__main__":
    main()
