"""One precompiled `torch/extension.h` for an op of many sources: its build parses torch's headers once, not per file.

Every source of a DeepSpeed op includes `torch/extension.h`; parsing it is ~20 s of a ~27 s compile on our 2-core
machines, and async_io has 12 sources (its build is most of a fresh setup's time). `build_ops` puts a `c++` first on
PATH while CPU ops build (ccache's "masquerade" setup): torch's ninja file and every command in it stay exactly what
they are without us, so a later load of the op (a rank, a test) finds nothing changed and rebuilds nothing. That
`c++` is this module run as a script: for an op of MIN_SOURCES or more it builds the header once per set of flags
(the flags of the object files minus input, output, dependency file and `-g`) under a lock, then compiles each
source that includes torch's headers (itself or through its own headers: `includes_torch`) with `-include` of it;
an op of fewer sources, and a source without torch, compile as given (on async_io, a source of its own C
code compiles in 0.8-1.3 s alone and 10 s with the header, most of it the instantiation of torch's inline templates
that every translation unit with torch pays, header or not). Debug info (`-g`) is left out of every op
built so: a 0.8 GB precompiled header becomes 1 GB with it and each file's compile doubles. If the header does not
build, each source compiles as it would have (without `-g`).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REAL_CXX = "PRECOMPILED_HEADER_REAL_CXX"  # the compiler behind the masquerade
HEADER_DIR = "PRECOMPILED_HEADER_DIR"  # where the headers of one build live (removed after the build)
MIN_SOURCES = 4  # a precompiled header costs about as much as two sources' compiles


def header_flags(argv: list[str]) -> list[str]:
    """The compile's flags that the header must be built with: argv less its source, output, depfile and -g."""
    flags, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("-c", "-o", "-MF"):
            skip = True
        elif arg not in ("-MMD", "-g"):
            flags.append(arg)
    return flags


def ensure_header(real: str, flags: list[str], root: Path) -> Path | None:
    """The header (whose `.gch` sits beside it) for these flags, built once by whichever compile comes first."""
    where = root / hashlib.sha256("\0".join([real, *flags]).encode()).hexdigest()[:16]
    where.mkdir(parents=True, exist_ok=True)
    header, gch, failed = where / "torch_extension.h", where / "torch_extension.h.gch", where / "failed"
    with open(where / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not gch.exists() and not failed.exists():
            header.write_text("#include <torch/extension.h>\n")
            built = subprocess.run([real, *flags, "-x", "c++-header", str(header), "-o", f"{gch}.tmp"], check=False)
            if built.returncode == 0:
                os.replace(f"{gch}.tmp", gch)
            else:
                failed.touch()
    return header if gch.exists() else None


TORCH_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](torch|ATen)/', re.M)
LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def includes_torch(source: Path, include_dirs: list[Path], seen: set | None = None) -> bool:
    """Whether a source includes torch's (or ATen's) headers, itself or through a header found beside it or in the
    compile's -I directories (system headers are never followed)."""
    seen = set() if seen is None else seen
    try:
        text = source.read_text(errors="replace")
    except OSError:
        return False
    if TORCH_INCLUDE.search(text):
        return True
    for name in LOCAL_INCLUDE.findall(text):
        for where in (source.parent, *include_dirs):
            header = (where / name).resolve()
            if header.is_file():
                if header not in seen:
                    seen.add(header)
                    if includes_torch(header, include_dirs, seen):
                        return True
                break
    return False


def source_and_includes(argv: list[str]) -> tuple[Path | None, list[Path]]:
    """The source a compile command compiles (after -c) and its -I directories."""
    source = Path(argv[argv.index("-c") + 1]) if "-c" in argv[:-1] else None
    dirs = [Path(a[2:]) for a in argv if a.startswith("-I") and len(a) > 2]
    dirs += [Path(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a == "-I"]
    return source, dirs


def sources_in_build(build_file: Path = Path("build.ninja")) -> int:
    """How many sources the op being built compiles (torch runs ninja in the op's directory: one `compile` each)."""
    try:
        return sum(" compile " in line for line in build_file.read_text().splitlines() if line.startswith("build "))
    except OSError:
        return 0


def compile_command(argv: list[str], real: str, root: Path) -> list[str]:
    """The command this `c++` runs: a source's compile without -g, with the header where the op has enough sources
    to gain and the source includes torch; anything else (link, -v, -dumpversion) as given."""
    if "-c" not in argv or "-x" in argv:
        return [real, *argv]
    source, include_dirs = source_and_includes(argv)
    gains = sources_in_build() >= MIN_SOURCES and source is not None and includes_torch(source, include_dirs)
    header = ensure_header(real, header_flags(argv), root) if gains else None
    args = [a for a in argv if a != "-g"]
    return [real, *(["-include", str(header)] if header else []), *args]


@contextlib.contextmanager
def masquerade(parent: str | None):
    """While ops build (an op's load may build another, as async_io's builds pin_memory): `c++` on PATH is this
    module, unless CXX names another compiler; its files live in a new directory under `parent` (the op cache),
    removed afterwards (a header is most of a gigabyte; no object file depends on it)."""
    real = shutil.which("c++")
    if os.environ.get("CXX") or real is None:
        yield
        return
    try:
        if parent:
            os.makedirs(parent, exist_ok=True)
        work_dir = Path(tempfile.mkdtemp(prefix=".precompiled-", dir=parent))
    except OSError:  # nowhere to write: the build goes on as torch runs it
        yield
        return
    bin_dir, root = work_dir / "bin", work_dir / "headers"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "c++"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    shim.chmod(0o755)
    saved = {k: os.environ.get(k) for k in ("PATH", REAL_CXX, HEADER_DIR)}
    os.environ.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **{REAL_CXX: real,
                                                                                    HEADER_DIR: str(root)})
    try:
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    command = compile_command(sys.argv[1:], os.environ[REAL_CXX], Path(os.environ[HEADER_DIR]))
    os.execv(command[0], command)
