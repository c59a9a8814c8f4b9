"""README.md and docs/*.md say what is true now: README is short; no commit hash or date outside the results index
(docs/results.md; benchmarks/ holds the dated reports); every path, link and module they name exists; every
`snakemake` command in their fenced blocks parses its targets (a dry run, `snakemake -n`: seconds each, run side by
side).

A dry run on this CPU host stands in for two things a command's real machine has: the GPUs of a GPU study
(`devices_per_node` given, as on a cluster submit host; never for `plan` and `scale`, which run on a laptop as
written) and, under --use-apptainer, the image and the `apptainer` executable (an empty image file and the recording
stand-in tests/fakes/apptainer, which answers `--version`).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
DATED = {ROOT / "docs" / "results.md"}  # the results index: the one doc that names dates and commits
README_MAX_LINES = 250
# where a path in the docs may start (the folder map), besides whatever the checkout's root holds
TOP = {"Snakefile", "config.yaml", "README.md", "BENCHMARKS.md", "pyproject.toml", ".ci", "rules",
       "workflow_scripts", "studies", "schemas", "envs", "containers", "profiles", "tests", "results", "benchmarks",
       "experiments", "docs", "report", "tools"} | {p.name for p in ROOT.iterdir()}
LAPTOP_TARGETS = {"plan", "scale"}  # must parse as written on a host without GPUs
GPU_STANDIN = "devices_per_node=8"

HASH = re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{7,40}(?![0-9A-Za-z_])")
DATE = re.compile(r"(?<!\d)\d{4}-\d{2}-\d{2}(?!\d)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
MODULE = re.compile(r"^(?:workflow_scripts|experiments)(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
ECHO = re.compile(r"""^echo\s+(['"])(.*)\1\s*>\s*(\S+)$""")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- (a) short, and no history in prose -------------------------------------------------------------------------

def test_hash_and_date_patterns():
    found = HASH.findall("at 0895c72 and 41efe4a2b, not bf16, 1024, 2e11, facade, dp2-pp2, GPU-c90c7a53")
    assert found == ["0895c72", "41efe4a2b", "c90c7a53"]
    assert DATE.findall("on 2026-11-29 (not 1.2026-11, 12026-11-290)") == ["2026-11-29"]


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}"


@pytest.mark.parametrize("doc", [d for d in DOCS if d not in DATED], ids=rel)
def test_no_commit_hashes_or_dates(doc):
    problems = []
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        problems += [f"{rel(doc)}:{n}: commit-like {m!r}" for m in HASH.findall(line)]
        problems += [f"{rel(doc)}:{n}: date {m!r}" for m in DATE.findall(line)]
    assert not problems, "history belongs in git and benchmarks/, not in docs:\n" + "\n".join(problems)


# --- (b) every path, link and module named exists ---------------------------------------------------------------

def code_tokens(text: str) -> list[str]:
    spans = INLINE.findall(FENCE.sub("", text)) + FENCE.findall(text)
    return [t.strip("'\"()[],;:.") if not t.endswith("/") else t.strip("'\"()[],;:")
            for span in spans for t in span.split()]


def named_paths(text: str, where: Path) -> tuple[list[str], list[str]]:
    """(paths from the repository root, dotted module names) a doc in folder `where` names in links and code."""
    paths, modules = [], []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        target = target.split("#")[0]
        path = os.path.relpath(os.path.normpath(where / target), ROOT)
        paths.append(path + "/" if target.endswith("/") else path)
    for token in code_tokens(text):
        if any(c in token for c in "<>{}…$~=") or "..." in token:
            continue  # placeholders, settings, shell variables
        if MODULE.match(token):
            modules.append(token)
        elif "/" in token and token.split("/")[0] in TOP and not token.startswith("/"):
            paths.append(token)
    return paths, modules


def test_named_paths_reads_links_code_and_modules():
    text = ("See [the rules](../rules/) and [x](#anchor), [site](https://example.org/a/b), `tokens/s`,\n"
            "`results/<study>/<set>/README.md`, `python3 -m workflow_scripts.report.verify --help`,\n"
            "```\nbash envs/setup.sh --tests\nsnakemake --configfile studies/ml815.yaml 'verify={against: x}'\n```\n")
    paths, modules = named_paths(text, ROOT / "docs")
    assert paths == ["rules/", "envs/setup.sh", "studies/ml815.yaml"]
    assert modules == ["workflow_scripts.report.verify"]


def ignored(paths: list[str]) -> set[str]:
    """The paths git ignores: what a run or a build creates (results/default/, work/, containers/images/)."""
    if not paths:
        return set()
    out = subprocess.run(["git", "check-ignore", "--stdin"], cwd=ROOT, input="\n".join(paths), text=True,
                         capture_output=True)
    return set(out.stdout.split())


def module_exists(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists() or (base / "__main__.py").exists()


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_named_paths_exist(doc):
    paths, modules = named_paths(doc.read_text(), doc.parent)
    missing = [p for p in dict.fromkeys(paths) if not (list(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())]
    missing = [p for p in missing if p not in ignored(missing)]
    missing += [m for m in dict.fromkeys(modules) if not module_exists(m)]
    assert not missing, f"{rel(doc)} names what the repository does not have: {missing}"


# --- (c) every snakemake command of a fenced block parses its targets -------------------------------------------

def fenced_commands() -> list[tuple[str, str, dict]]:
    """(doc, command line, files its block writes with `echo '...' > file`) for every `snakemake` line."""
    found = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text()):
            lines = block.replace("\\\n", " ").splitlines()
            writes = {m.group(3): m.group(2) for m in map(ECHO.match, (ln.strip() for ln in lines)) if m}
            found += [(rel(doc), ln.strip(), writes) for ln in lines if ln.strip().startswith("snakemake ")]
    unique = {}
    for doc, line, writes in found:
        unique.setdefault(line, (doc, line, writes))
    return list(unique.values())


COMMANDS = fenced_commands()


def platform_of(args: list[str]) -> str:
    """The platform the command's configs end at: config.yaml, then each --configfile in order, then --config."""
    files, config, i = ["config.yaml"], [], 0
    while i < len(args):
        into = files if args[i] == "--configfile" else config if args[i] == "--config" else None
        i += 1
        while into is not None and i < len(args) and not args[i].startswith("-"):
            into.append(args[i])
            i += 1
    platform = "cpu"
    for f in files:
        data = yaml.safe_load((ROOT / f).read_text()) if (ROOT / f).is_file() else None
        platform = (data or {}).get("platform", platform)
    for item in config:
        if item.startswith("platform="):
            platform = item.split("=", 1)[1]
    return platform


def targets(args: list[str]) -> set[str]:
    """Positional words before the first option: the command's targets."""
    out = set()
    for a in args:
        if a.startswith("-"):
            break
        out.add(a)
    return out


def with_config(args: list[str], items: list[str]) -> list[str]:
    if "--config" in args:
        i = args.index("--config") + 1
        return args[:i] + items + args[i:]
    return args + ["--config", *items]


def dry_run_argv(line: str, writes: dict, tmp: Path) -> tuple[list[str], dict]:
    """The command's arguments for `snakemake -n`, with this host's stand-ins, and its environment."""
    args = shlex.split(line, comments=True)[1:]
    for name, content in writes.items():
        (tmp / name).write_text(content + "\n")
    args = [str(tmp / a) if a in writes else a for a in args]
    env = dict(os.environ)
    if "--use-apptainer" in args:
        image = tmp / "standin.sif"
        image.touch()
        args = with_config(args, [f"containers={{cpu: {image}, cuda: {image}, rocm: {image}}}"])
        env["PATH"] = f"{ROOT / 'tests' / 'fakes'}{os.pathsep}{env.get('PATH', '')}"
    if platform_of(args) != "cpu" and not targets(args) & LAPTOP_TARGETS:
        args = with_config(args, [GPU_STANDIN])
    if not {"--cores", "-c", "--jobs", "-j", "--profile"} & set(args):
        args += ["--cores", "1"]
    return ["-n", "--nolock", *args], env


# One process imports Snakemake once (about 2 s of CPU) and dry-runs every command in turn (under a second each).
WORKER = """
import json, os, sys
from snakemake.cli import args_to_api, parse_args
results = []
for argv, path in json.load(sys.stdin):
    os.environ["PATH"] = path
    try:
        sys.argv = ["snakemake", *argv]  # as the command line sets it (config_check.planning_only reads it)
        parser, args = parse_args(argv)
        results.append(bool(args_to_api(args, parser)))
    except BaseException:
        results.append(False)
print("\\n" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """command line -> (ok, what Snakemake said when it was not)."""
    jobs = [dry_run_argv(line, writes, tmp_path_factory.mktemp("command")) for _, line, writes in COMMANDS]
    out = subprocess.run([sys.executable, "-c", WORKER], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         input=json.dumps([[argv, env["PATH"]] for argv, env in jobs]))
    oks = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else [False] * len(jobs)
    said = {}
    for (_, line, _), (argv, env), ok in zip(COMMANDS, jobs, oks):
        if not ok:  # again alone, for its message
            alone = subprocess.run(["snakemake", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=120)
            ok, said[line] = alone.returncode == 0, alone.stdout + alone.stderr
        said.setdefault(line, "")
        said[line] = (ok, said[line])
    return said


def test_docs_have_snakemake_commands():
    assert any(doc == "README.md" for doc, _, _ in COMMANDS), "README.md's fenced blocks hold no snakemake command"


@pytest.mark.parametrize("command", COMMANDS, ids=[line for _, line, _ in COMMANDS])
def test_fenced_snakemake_command_parses(command, dry_runs):
    doc, line, _ = command
    ok, said = dry_runs[line]
    tail = "\n".join(said.strip().splitlines()[-15:])
    assert ok, f"{doc}: `{line}` does not parse (snakemake -n):\n{tail}"
