"""Command line for the memory sampler.

Wrap a command (samples its process tree until it exits; prints the result JSON on stderr; exits with the
command's exit code, 128+N if it died of signal N):

    python -m workflow_scripts.measure.vram --out timeline.csv [--platform cpu|cuda|rocm]
        [--backend auto|nvml|amdsmi|host|torch] [--interval 0.1] [--step-file F] \\
        -- torchrun ... -m workflow_scripts.training.loop --spec spec.json

Attach to a running tree (what ``start_sampler`` uses): ``--root-pid PID [--stop-on-eof]``; stops on SIGTERM/SIGINT
or, with --stop-on-eof, when its stdin closes.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading

from workflow_scripts import schema
from workflow_scripts.measure.vram.backends import ALL_BACKENDS
from workflow_scripts.measure.vram.sampler import SamplerConfig, run_sampler


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m workflow_scripts.measure.vram", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="timeline CSV to write")
    ap.add_argument("--platform", default="auto", choices=["auto", "cpu", "cuda", "rocm"])
    ap.add_argument("--backend", default="auto", choices=["auto", *ALL_BACKENDS])
    ap.add_argument("--interval", type=float, default=schema.default("sampler", "interval_s"),
                    help="seconds between samples (default: the config's sampler.interval_s default)")
    ap.add_argument("--step-file", default=None, help="step file written by StepPublisher")
    ap.add_argument("--root-pid", type=int, default=None, help="attach to this process tree instead of a command")
    ap.add_argument("--stop-on-eof", action="store_true", help="with --root-pid: stop when stdin closes")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- command to run and sample")
    args = ap.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if (args.root_pid is None) == (not args.command):
        ap.error("give either a command after -- or --root-pid")
    if args.interval <= 0:
        ap.error("--interval must be > 0")
    return args


def _config(args: argparse.Namespace, root_pid: int) -> SamplerConfig:
    return SamplerConfig(out_csv=args.out, root_pid=root_pid, platform=args.platform, backend=args.backend,
                         interval_s=args.interval, step_file=args.step_file)


def attach(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.stop_on_eof:
        def watch_stdin() -> None:  # raw fd reads: a daemon thread blocked in them cannot hang shutdown
            try:
                while os.read(0, 4096):
                    pass
            finally:
                stop.set()
        threading.Thread(target=watch_stdin, daemon=True).start()
    result = run_sampler(_config(args, args.root_pid), stop)
    return 1 if result["status"] == "failed" else 0


def wrap(args: argparse.Namespace) -> int:
    try:
        child = subprocess.Popen(args.command)
    except OSError as e:
        print(f"vram: cannot run {args.command[0]!r}: {e}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT):  # pass them on; we stop when the command exits
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    stop = threading.Event()
    threading.Thread(target=lambda: (child.wait(), stop.set()), daemon=True).start()
    try:
        result = run_sampler(_config(args, child.pid), stop)
    except Exception as e:  # noqa: BLE001 - the command's exit code matters more than the sampler
        result = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    rc = child.wait()
    print(json.dumps(result), file=sys.stderr)
    return rc if rc >= 0 else 128 - rc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return attach(args) if args.root_pid is not None else wrap(args)


if __name__ == "__main__":
    sys.exit(main())
