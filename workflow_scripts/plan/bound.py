"""What bounds a measured run's step, from its row and its machine's calibration (calibration/calibration.json),
and the throughput ratio two machines' calibrations predict for that run.

The step splits into three parts, each scaling with one calibrated measure:
  compute        the model's FLOPs at the calibrated bf16 matmul rate: achieved FLOP/s per device / matmul TFLOP/s
  communication  several data-parallel GPU ranks: the gradients' all-reduce (trainable parameters x 4 bytes) at
                 the calibrated bus bandwidth of the largest message measured for that many ranks, not overlapped
                 (no predicted ratio where either calibration lacks that curve)
  host           the rest of the step: Python, kernel launches, the data path; on GPU at the calibrated launch
                 rate (1 / launch_us) where both sets measured it, else at single-thread CPU speed
A CPU run is all host, at single-thread CPU speed. Shares are capped so that they sum to 1 (compute first, then
communication).
Predicted rerun / committed tokens/s = 1 / sum(share_k / (speed_k rerun / speed_k committed)).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from workflow_scripts import columns as C
from workflow_scripts.units import GB

MEASURES = {"compute": "bf16 matmul TFLOP/s", "communication": "all-reduce bus bandwidth",
            "host": "kernel launches/s", "python": "single-thread CPU speed"}
GRAD_BYTES = 4  # fp32 gradients, as the bf16-mixed data-parallel engines reduce them
# a collective's calibration row: all_reduce_busbw[<ranks>x<size>MB] (measure/calibrate.py); also read by step_time.py
BUSBW = re.compile(r"(all_reduce|all_gather)_busbw\[(\d+)x(\d+)MB\]")


def calibration(results_dir: Path) -> dict | None:
    """name -> value of a set's calibration, None when the set has none."""
    path = Path(results_dir) / C.CALIBRATION
    if not path.exists():
        return None
    return {r["name"]: r["value"] for r in json.loads(path.read_text())["rows"] if r["value"] is not None}


def speeds(cal: dict, ranks: int) -> dict:
    """Each part's speed on this machine (None where not measured)."""
    matmul = [v for k, v in cal.items() if k.startswith("matmul_bf16[")]
    launch = [v for k, v in cal.items() if k.startswith("launch_us[")]
    busbw = sorted((int(m[3]), v) for k, v in cal.items()
                   if (m := BUSBW.fullmatch(k)) and m[1] == "all_reduce" and int(m[2]) == ranks)
    return {"compute": sum(matmul) / len(matmul) if matmul else None,
            "communication": busbw[-1][1] if busbw else None,
            "host": 1e6 * len(launch) / sum(launch) if launch else None, "python": cal.get("cpu_single_thread")}


def ranks_of(row) -> int:
    return int(row.get("dp_size") or row.get("world_size") or 1)


def on_cpu(row) -> bool:
    return str(row.get("platform", "cpu")).lower() == "cpu"


def shares(row, cal: dict) -> dict:
    """The committed row's step split into compute, communication and host (fractions summing to 1)."""
    return split(row, speeds(cal, ranks_of(row)))


def split(row, speed: dict) -> dict:
    if on_cpu(row):
        return {"compute": 0.0, "communication": 0.0, "host": 1.0}
    ranks, step_s = ranks_of(row), float(row["tokens_per_step"]) / float(row["tokens_per_s"])
    compute = 0.0
    if speed["compute"]:
        achieved = float(row["tokens_per_s"]) * float(row["flops_per_token"]) / int(row.get("world_size") or 1)
        compute = min(1.0, achieved / (speed["compute"] * 1e12))
    communication = 0.0
    if ranks > 1 and speed["communication"]:
        seconds = float(row["trainable_params"]) * GRAD_BYTES * 2 * (ranks - 1) / ranks / (speed["communication"] * GB)
        communication = min(1.0 - compute, seconds / step_s)
    return {"compute": compute, "communication": communication, "host": 1.0 - compute - communication}


def predicted_ratio(row, committed: dict, rerun: dict) -> tuple[float | None, str]:
    """Rerun / committed tokens/s that the two calibrations predict for the committed row, and what bounds it
    (`host-bound (83% host, kernel launches/s x0.95)`); None where a part's measure is missing on either machine."""
    old, new = speeds(committed, ranks_of(row)), speeds(rerun, ranks_of(row))
    if ranks_of(row) > 1 and not on_cpu(row) and not (old["communication"] and new["communication"]):
        # without the curve, split() would count the all-reduce as host time: no ratio rather than a wrong one
        return None, f"no {ranks_of(row)}-rank {MEASURES['communication']} in both calibrations"
    part = split(row, old)
    # the host part follows the launch cost where both sets measured it (GPU), else single-thread CPU speed
    measure = {"compute": "compute", "communication": "communication",
               "host": "host" if old["host"] and new["host"] and not on_cpu(row) else "python"}
    time_ratio = 0.0
    for name, share in part.items():
        key = measure[name]
        if share <= 0:
            continue
        if not old[key] or not new[key]:
            return None, f"no {MEASURES[key]} in both calibrations"
        time_ratio += share / (new[key] / old[key])
    bound = max(part, key=part.get)
    key = measure[bound]
    return 1.0 / time_ratio, f"{bound}-bound ({part[bound]:.0%} {bound}, {MEASURES[key]} x{new[key] / old[key]:.2f})"
