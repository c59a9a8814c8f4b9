"""Does the memory sampler slow training? Runs the same short CPU training with the sampler on and off, interleaved
(on, off, on, off, ...), and prints the throughput ratio: mean tokens/s with the sampler / mean tokens/s without.

    python -m workflow_scripts.bench_sampler --pairs 3 --steps 40 [--data-dir D] [--work-dir W]

Without --data-dir, a small corpus/tokenizer/token set is prepared under <work-dir>/data (a minute or so).
Both arms publish the training step to a step file (PIPELINE_STEP_FILE), so only the sampler differs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from workflow_scripts.vram import start_sampler

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_data(d: Path) -> None:
    """corpus -> BPE tokenizer -> uint16 blocks of 128 tokens (skipped if already there)."""
    if (d / "train.npy").exists() and (d / "tok.json").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    steps = [
        ["workflow_scripts.corpus", "--params", '{"source":"stdlib","max_bytes":3000000}',
         "--jsonl", d / "corpus.jsonl", "--manifest", d / "corpus.json"],
        ["workflow_scripts.tokenizer", "--params", '{"kind":"bpe","vocab_size":4096}',
         "--corpus", d / "corpus.jsonl", "--out", d / "tok"],
        ["workflow_scripts.tokenize_data", "--corpus", d / "corpus.jsonl", "--tokenizer", d / "tok",
         "--block-size", "128", "--val-fraction", "0.05", "--threads", "2", "--train", d / "train.npy",
         "--val", d / "val.npy", "--manifest", d / "tok.json"],
    ]
    for module, *args in steps:
        subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, check=True)


def sampler_cpu_seconds(handle) -> float | None:
    """CPU seconds the sampler process has used so far (read before stop(), while it still exists)."""
    if handle is None or handle.pid is None:
        return None
    try:
        t = psutil.Process(handle.pid).cpu_times()
        return round(t.user + t.system, 3)
    except psutil.Error:
        return None


def make_spec(run_dir: Path, data: Path, steps: int, model: str, strategy: str, nproc: int) -> Path:
    """A run spec in the shape workflow_scripts.train reads."""
    spec = {
        "run_id": run_dir.name, "model": model, "strategy": strategy, "world_size": nproc, "repeat": 0,
        "platform": "cpu", "precision": "fp32",
        "data": {"train": str(data / "train.npy"), "val": str(data / "val.npy"), "manifest": str(data / "tok.json")},
        "train": {"micro_batch_size": 8, "grad_accum": 1, "epochs": 1, "max_steps": steps, "max_train_samples": None,
                  "lr": 1e-3, "min_lr": 1e-4, "lr_warmup_steps": 5, "weight_decay": 0.1, "betas": [0.9, 0.95],
                  "eps": 1e-8, "grad_clip": 1.0, "seed": 1234, "timing_warmup_steps": 3, "log_every": 10,
                  "eval_batches": 4, "checkpoint_every": 0, "gradient_checkpointing": False, "vocab_multiple": 64,
                  "attn_implementation": "sdpa", "fault_injection": None},
        "options": {}, "out_dir": str(run_dir / "out"), "work_dir": str(run_dir / "work"),
    }
    path = run_dir / "spec.json"
    path.write_text(json.dumps(spec, indent=2))
    return path


def run_once(run_dir: Path, args: argparse.Namespace, sampler: bool) -> dict:
    """One training run; returns {"tokens_per_s", "wall_s" (whole run, start-up included), "sampler": dict|None}."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    spec = make_spec(run_dir, args.data_dir, args.steps, args.model, args.strategy, args.nproc)
    step_file = run_dir / "step"
    env = dict(os.environ, DS_ACCELERATOR="cpu", PIPELINE_STEP_FILE=str(step_file))
    torchrun = [shutil.which("torchrun") or ""]
    if not torchrun[0]:
        torchrun = [sys.executable, "-m", "torch.distributed.run"]
    cmd = [*torchrun, "--nproc-per-node", str(args.nproc), "--master-port", str(free_port()),
           "-m", "workflow_scripts.train", "--spec", str(spec)]
    t0 = time.monotonic()
    with open(run_dir / "train.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        handle = start_sampler(run_dir / "vram.csv", root_pid=proc.pid, platform="cpu",
                               interval_s=args.interval, step_file=step_file) if sampler else None
        rc = proc.wait()
    wall_s = time.monotonic() - t0
    cpu_s = sampler_cpu_seconds(handle)
    result = handle.stop() if handle else None
    if result is not None:
        result["cpu_s"] = cpu_s  # the sampler's own CPU time (user + system) over the whole run
    if rc != 0:
        raise SystemExit(f"training failed (exit {rc}); see {run_dir / 'train.log'}")
    summary = json.loads((run_dir / "out" / "train_summary.json").read_text())
    return {"tokens_per_s": summary["tokens_per_s"], "wall_s": round(wall_s, 3), "sampler": result}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--interval", type=float, default=0.1, help="sampler interval, seconds")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--model", default="gpt2-tiny")
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/bench_sampler"))
    ap.add_argument("--data-dir", type=Path, default=None, help="holds train.npy, val.npy, tok.json")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    args.work_dir = args.work_dir.resolve()
    if args.data_dir is None:
        args.data_dir = args.work_dir / "data"
        prepare_data(args.data_dir)
    args.data_dir = args.data_dir.resolve()

    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(args.pairs):
        for arm in ("on", "off"):
            r = run_once(args.work_dir / f"{arm}{i}", args, sampler=arm == "on")
            runs[arm].append(r)
            s = r["sampler"]
            extra = (f"  sampler {s['status']}, {s['samples']} samples at {s['achieved_hz']} Hz, "
                     f"{s['cpu_s']} CPU s") if s else ""
            print(f"pair {i} sampler {arm:3s}: {r['tokens_per_s']:9.1f} tokens/s{extra}", flush=True)

    on = [r["tokens_per_s"] for r in runs["on"]]
    off = [r["tokens_per_s"] for r in runs["off"]]
    ratio = statistics.mean(on) / statistics.mean(off)
    pair_ratios = [a / b for a, b in zip(on, off)]
    print(f"mean tokens/s: on {statistics.mean(on):.1f}, off {statistics.mean(off):.1f}")
    spread = f", median {statistics.median(pair_ratios):.3f}, sd {statistics.stdev(pair_ratios):.3f}" \
        if len(pair_ratios) > 1 else ""
    print(f"per-pair ratios: {', '.join(f'{x:.3f}' for x in pair_ratios)}{spread}")
    cpu = [r["sampler"]["cpu_s"] / r["wall_s"] for r in runs["on"] if r["sampler"].get("cpu_s") is not None]
    if cpu:
        print(f"sampler CPU use: {100 * statistics.mean(cpu):.2f}% of one core over the run")
    print(f"throughput ratio (with sampler / without): {ratio:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"ratio": ratio, "pair_ratios": pair_ratios, "on": runs["on"],
                                         "off": runs["off"], "steps": args.steps, "interval_s": args.interval},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
