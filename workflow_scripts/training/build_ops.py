"""Build the DeepSpeed ops a study needs, once, before any rank starts (and outside every timing).

DeepSpeed JIT-compiles C++ ops (cpu_adam, async_io, the quantizer) in every rank on first use; concurrent builds
race and can crash a rank. This stage builds each once, one build of an op at a time on the machine, into the
machine's op cache (`extensions_dir`; config `torch_extensions_dir`) and records, per op, whether it built, how
long it took, and the error if not: the launcher turns a failed op into an `unsupported` row for the strategies
that need it. A success is recorded in the op cache as well (`<op>.built.json`): every later study or workflow
copy on the machine answers from it.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import time
import traceback
from pathlib import Path

from workflow_scripts.training import precompiled_header
from workflow_scripts.training.strategies import STRATEGIES
from workflow_scripts.training.strategies import get as get_strategy


def machine_cache() -> str:
    """The machine's cache of the pipeline, shared by every clone and study (compiled ops, lever decisions, inductor's
    and Triton's caches): `$PIPELINE_CACHE`, else `$XDG_CACHE_HOME` or `~/.cache`, + `/dist-train-studies`."""
    return os.environ.get("PIPELINE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dist-train-studies")


def compile_caches(env=None) -> dict:
    """Point inductor's and Triton's on-disk caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) into the machine's
    cache where the environment (`env`, os.environ by default) names none: a lever trial's candidates and the timed
    runs after them (another job, maybe another container) load the same compiled graphs and kernels instead of
    compiling again. The launcher sets them in the ranks' environment before torch starts there: inductor fixes its
    cache directory in os.environ the first time it reads it. Both caches key their entries by the graph, the torch
    version and the device themselves."""
    env = os.environ if env is None else env
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        env.setdefault(var, os.path.join(machine_cache(), sub))
    return {var: env[var] for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}


def extensions_dir(setting: str | None, platform: str) -> str:
    """Where compiled ops live. `auto` (the default): one cache per machine and toolchain, shared by every clone and
    study, machine_cache() + `/torch_extensions/<key>`; the key
    names torch, DeepSpeed, Python, the platform and a hash of the C++ compiler's version and the environment's
    prefix, so an op built by another toolchain is never loaded (torch's own loader also rebuilds an op whose
    sources or flags changed)."""
    if setting and setting != "auto":
        return setting
    import hashlib
    import platform as py
    import subprocess
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "none"

    try:
        compiler = subprocess.run(["c++", "--version"], check=False, capture_output=True, text=True,
                                  timeout=10).stdout
    except OSError:
        compiler = "none"
    import sys

    # the environment's prefix too: two virtual environments of one Python compile with other include paths,
    # which torch's loader would answer by rebuilding the op in place, back and forth
    key = (f"torch{version('torch')}-ds{version('deepspeed')}-py{py.python_version()}-{platform}-"
           + hashlib.sha256((compiler + sys.prefix).encode()).hexdigest()[:8]).replace("+", "_")
    return os.path.join(machine_cache(), "torch_extensions", key)


def export_extensions_dir(setting: str | None, platform: str) -> str:
    """Set TORCH_EXTENSIONS_DIR for every job of the workflow: the config's directory, or with `auto` one already
    in the environment, else the machine's cache (extensions_dir)."""
    if setting in (None, "auto") and os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.abspath(extensions_dir(setting, platform))
    return os.environ["TORCH_EXTENSIONS_DIR"]


def needed_ops(strategy: str, options: dict | None = None) -> list[str]:
    """The strategy's own ops and those its options add (`strategy_options.<strategy>`, a bench lever's over them:
    DeepCompile's dc op). DeepSpeed's CPU collectives op is never loaded (_deepspeed.gloo_collectives_on_cpu)."""
    from workflow_scripts.training.strategies._deepspeed import option_ops

    own = list(get_strategy(strategy).ops)
    return own + [op for op in option_ops(options or {}) if op not in own]


@contextlib.contextmanager
def exclusive_build(name: str):
    """One build of an op at a time on this machine, and no stale lock: torch's JIT build waits forever on the
    `lock` file a killed build leaves in the op's directory (a killed test run leaves one in the shared op cache).
    Our flock is released by the kernel when its holder dies, so under it a torch lock can only be stale."""
    ext = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not ext:
        yield
        return
    (Path(ext) / name).mkdir(parents=True, exist_ok=True)
    with open(Path(ext) / f".{name}.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (Path(ext) / name / "lock").unlink(missing_ok=True)
        yield


def build_record(op: str) -> Path | None:
    """Where the op cache records a successful build of `op` (none without an op cache)."""
    ext = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(ext) / f"{op}.built.json" if ext else None


def built_before(op: str) -> dict | None:
    """The build of this op the op cache recorded, if its library is still there: a study's build_op job then
    answers without importing DeepSpeed (successes only: a failure, e.g. libaio missing, may since be mended)."""
    record = build_record(op)
    if record is None or not record.exists():
        return None
    built = json.loads(record.read_text())
    return {**built, "cached": True} if Path(built["library"]).exists() else None


def build(op: str, platform: str = "cpu") -> dict:
    """Build (or load) one op; its result. On the CPU platform through the precompiled header (precompiled_header:
    measured there; the GPU platforms' CUDA/HIP builds compile as torch runs them)."""
    started = time.perf_counter()
    try:
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder(op)
        if builder is None:
            raise RuntimeError(f"DeepSpeed has no {op} for the {get_accelerator().device_name()} accelerator")
        if not builder.is_compatible(verbose=False):
            raise RuntimeError(f"DeepSpeed {op} is not compatible with this machine "
                               f"({get_accelerator().device_name()} accelerator; e.g. libaio missing for async_io)")
        header = (precompiled_header.masquerade(os.environ.get("TORCH_EXTENSIONS_DIR")) if platform == "cpu"
                  else contextlib.nullcontext())
        with exclusive_build(builder.name), header:
            builder.load(verbose=False)
        result = {"ok": True, "seconds": time.perf_counter() - started, "error": None}
        record = build_record(op)
        if record:  # what built_before reads (a cache that cannot be written only loses the shortcut)
            library = record.parent / builder.name / f"{builder.name}.so"
            with contextlib.suppress(OSError):
                record.write_text(json.dumps({**result, "library": str(library)}))
        return result
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, the study goes on
        traceback.print_exc()
        return {"ok": False, "seconds": time.perf_counter() - started,
                "error": f"{op}: {type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"}


def build_all(platform: str, out_dir: Path) -> list[dict]:
    """Every op any strategy needs, each built by its own process at once (a machine's setup: envs/setup.sh)."""
    import subprocess
    import sys

    ops = sorted({op for name in STRATEGIES for op in needed_ops(name)})
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as logs:
        jobs = [subprocess.Popen([sys.executable, "-m", __spec__.name, "--op", op, "--platform", platform,
                                  "--out", str(out_dir / f"{op}.json")], stderr=subprocess.STDOUT,
                                 stdout=logs.enter_context(open(out_dir / f"{op}.log", "w"))) for op in ops]
        for job in jobs:
            job.wait()
    return [json.loads(out.read_text()) if out.exists() else {"op": op, "ok": False, "error": f"no result: {log}"}
            for op in ops for out, log in [(out_dir / f"{op}.json", out_dir / f"{op}.log")]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    one = ap.add_mutually_exclusive_group(required=True)
    one.add_argument("--op", help="op builder class name, e.g. CPUAdamBuilder")
    one.add_argument("--all", action="store_true", help="every op a strategy needs, at once (--out: a directory)")
    ap.add_argument("--platform", required=True)
    ap.add_argument("--out", required=True, help="the op's result (.json), or with --all a directory of them")
    a = ap.parse_args(argv)
    if a.platform == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    export_extensions_dir("auto", a.platform)  # the workflow's directory, else (in a container) the image's own
    if a.all:
        for r in build_all(a.platform, Path(a.out)):
            print(f"op {r['op']}: " + (f"built in {r['seconds']:.0f} s" + (" (before)" if r.get("cached") else "")
                                       if r["ok"] else f"not built ({r['error']})"))
        return
    result = {"op": a.op, "platform": a.platform, "torch_extensions_dir": os.environ.get("TORCH_EXTENSIONS_DIR"),
              **(built_before(a.op) or build(a.op, a.platform))}
    print(json.dumps(result, indent=2), flush=True)
    Path(a.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
