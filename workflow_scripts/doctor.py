"""Setup check before spending GPU hours: platform, devices, collectives, DeepSpeed ops, libaio, offload disk,
and which of the study's strategies will run here or end as `unsupported`.

    python3 -m workflow_scripts.doctor [--config config.yaml [studies/x.yaml ...]] [--out doctor.md]
    snakemake --cores 1 doctor          (writes <results_dir>/doctor.md)

It checks compatibility (DeepSpeed's `is_compatible`, which compiles nothing); `--build` also builds the ops.
"""
from __future__ import annotations

import argparse
import ctypes.util
import json
import os
import shutil
from pathlib import Path

import yaml

from workflow_scripts import columns as C
from workflow_scripts.units import GIB


def detect_platform() -> str:
    import torch

    if torch.cuda.is_available():
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return "cpu"


def collectives() -> dict:
    import torch.distributed as dist

    return {"gloo": dist.is_gloo_available(), "nccl/rccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}


def devices() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"count": 0, "names": [], "cpu_cores": os.cpu_count()}
    n = torch.cuda.device_count()
    return {"count": n, "names": [torch.cuda.get_device_name(i) for i in range(n)], "cpu_cores": os.cpu_count()}


def op_status(op: str, platform: str, build: bool) -> str | None:
    """None if the op is usable here, else why not."""
    if platform == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder(op)
        if builder is None or type(builder).__name__ == "NotImplementedBuilder":
            return f"no {op} for the {get_accelerator().device_name()} accelerator"
        if not builder.is_compatible(verbose=False):
            return f"{op} is not compatible here"
        if build:
            builder.load(verbose=False)
    except Exception as exc:  # noqa: BLE001
        return f"{op}: {type(exc).__name__}: {exc}"
    return None


def strategy_table(strategies: list[str], platform: str, build: bool) -> list[dict]:
    from workflow_scripts.training.build_ops import needed_ops

    rows, cache = [], {}
    for name in strategies:
        reasons = []
        for op in needed_ops(name):
            if op not in cache:
                cache[op] = op_status(op, platform, build)
            if cache[op]:
                reasons.append(cache[op])
        rows.append({"strategy": name, "will": C.UNSUPPORTED if reasons else "run", "why": "; ".join(reasons)})
    return rows


def load_config(paths: list[str]) -> dict:
    cfg: dict = {}
    for p in paths:
        _merge(cfg, yaml.safe_load(Path(p).read_text()) or {})
    return cfg


def _merge(into: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def report(cfg: dict, build: bool = False) -> dict:
    from workflow_scripts import study
    from workflow_scripts.training.strategies import STRATEGIES

    platform = cfg.get("platform") or detect_platform()
    nvme = (cfg.get("strategy_options", {}).get("zero_infinity") or {}).get("nvme_path") or cfg.get("work_dir", ".")
    probe = Path(nvme)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    strategies = study.all_names(cfg, "strategies") if "strategies" in cfg else sorted(STRATEGIES)
    return {
        "configured_platform": platform, "detected_platform": detect_platform(), "devices": devices(),
        "collectives": collectives(), "libaio": ctypes.util.find_library("aio"),
        "nvme_offload_dir": str(nvme), "free_disk_gib": round(shutil.disk_usage(probe).free / GIB, 1),
        "strategies": strategy_table(strategies, platform, build),
    }


def markdown(r: dict) -> str:
    lines = ["# Doctor", "", f"- platform: configured `{r['configured_platform']}`, detected "
             f"`{r['detected_platform']}`",
             f"- devices: {r['devices']['count']} {r['devices']['names']} ({r['devices']['cpu_cores']} CPU cores)",
             "- collectives: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in r["collectives"].items()),
             f"- libaio: {r['libaio'] or 'missing (apt-get install libaio-dev): zero_infinity cannot run'}",
             f"- free disk for NVMe offload at `{r['nvme_offload_dir']}`: {r['free_disk_gib']} GiB", "",
             "| strategy | here | why |", "|---|---|---|"]
    lines += [f"| `{s['strategy']}` | {s['will']} | {s['why']} |" for s in r["strategies"]]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="*", default=["config.yaml"], help="config files, later ones override")
    ap.add_argument("--config-json", help="the effective config as JSON (what the doctor rule passes)")
    ap.add_argument("--build", action="store_true", help="also build the DeepSpeed ops")
    ap.add_argument("--out", help="write the Markdown report here")
    a = ap.parse_args(argv)
    cfg = json.loads(a.config_json) if a.config_json else load_config(a.config)
    r = report(cfg, a.build)
    text = markdown(r)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
        Path(a.out).with_suffix(".json").write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
