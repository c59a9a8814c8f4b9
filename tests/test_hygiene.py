"""The codebase's own rules, checked on its files: ruff clean, no import circle in the product, no path into the
committed results in product code, and the product never importing the lab (experiments/)."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT = REPO / "workflow_scripts"


def modules() -> dict[str, Path]:
    return {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
            for p in PRODUCT.rglob("*.py")}


def imports(path: Path, name: str) -> set[str]:
    """The workflow_scripts modules `path` (module `name`) imports, at any depth of the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("workflow_scripts") or m.startswith("experiments")}


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or (Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (envs/requirements.txt pins it)")
    out = subprocess.run([str(ruff), "check", "--quiet", str(REPO)], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_the_product_has_no_import_circle():
    mods = modules()
    graph = {m: {i for i in imports(p, m) if i in mods and i != m} for m, p in mods.items()}
    # a package's __init__ importing its own modules is no circle through them
    for m in graph:
        graph[m] = {i for i in graph[m] if not i.startswith(m + ".")}
    seen, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for n in sorted(graph[m]):
            visit(n)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


def test_the_product_never_imports_the_lab():
    offenders = [f"{m}: {i}" for m, p in modules().items() for i in imports(p, m) if i.startswith("experiments")]
    rules = [p.name for p in [REPO / "Snakefile", *(REPO / "rules").glob("*.smk")] if "experiments" in p.read_text()]
    assert not offenders and not rules, offenders + rules


def test_no_product_code_names_a_committed_result_set():
    """Product code and rules read no committed result at run time and cite none: a path into results/ is only a
    placeholder (results/<study>/...), a user's results_dir, or the default study's own folder."""
    allowed = re.compile(r"results/(<|\{|\.\.\.|default\b|\*)")
    hits = []
    for path in [*PRODUCT.rglob("*.py"), REPO / "Snakefile", *(REPO / "rules").glob("*.smk")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"results/[\w<{.*-]", line):
                if not allowed.match(line, m.start()):
                    hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits[:30])
