"""The one test of committed data: the result sets under results/ (curated, self-describing) and the documents that
cite them. Everything else in the suite tests code on data it makes; nothing here runs the pipeline."""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
MAX_MB, MAX_FILES = 120, 3000  # a GPU set is 70-190 files, its runs as the pipeline wrote them (verify reads them)
TEMPLATE = ("## What it shows", "## Provenance", "## Command", "## Contents")
FIELDS = ("commit", "machine", "driver", "versions", "date")


def tracked(under: Path) -> list[Path]:
    """The files git tracks under `under` (the committed data), else every file there."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", str(under)], cwd=REPO, capture_output=True, check=True)
        return [REPO / p for p in out.stdout.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in under.rglob("*") if p.is_file()]


def result_sets() -> list[Path]:
    """Every committed set: results/<study>/<set>/, or a study folder that is itself one set (no subfolders)."""
    parts = {p.relative_to(RESULTS).parts for p in tracked(RESULTS)}
    sets = {RESULTS / q[0] / q[1] for q in parts if len(q) > 2}
    sets |= {RESULTS / q[0] for q in parts if len(q) == 2 and not any(len(r) > 2 and r[0] == q[0] for r in parts)}
    return sorted(s for s in sets if s.name != "default")


def test_results_stay_within_the_size_and_file_budget():
    files = [p for p in tracked(RESULTS) if p.exists()]
    size_mb = sum(p.stat().st_size for p in files) / 1e6
    assert len(files) <= MAX_FILES, f"results/ holds {len(files)} files, more than {MAX_FILES}"
    assert size_mb <= MAX_MB, f"results/ holds {size_mb:.1f} MB, more than {MAX_MB}"
    assert not [p for p in files if p.suffix == ".pdf"], "result sets keep PNG figures, not PDF"


def test_every_set_has_a_readme_in_the_template():
    sets = result_sets()
    assert len(sets) >= 20  # the curated sets: studies, benchmarks, calibrations, reproducibility, scale
    for s in sets:
        readme = s / "README.md"
        assert readme.exists(), f"{s.relative_to(REPO)} has no README.md"
        text = readme.read_text()
        for heading in TEMPLATE:
            assert heading in text, f"{readme.relative_to(REPO)}: no '{heading}'"
        provenance = text.split("## Provenance", 1)[1].split("## Command", 1)[0]
        for field in FIELDS:
            assert re.search(rf"^\| {field} \| .+\|$", provenance, re.M), f"{readme.relative_to(REPO)}: no {field}"
        command = text.split("## Command", 1)[1].split("## Contents", 1)[0]
        assert "```" in command, f"{readme.relative_to(REPO)}: the command is not in a code block"


def test_every_overlay_a_set_names_is_there_and_writes_into_that_set():
    for s in result_sets():
        text = (s / "README.md").read_text()
        command = text.split("## Command", 1)[1].split("## Contents", 1)[0]
        for name in re.findall(r"results/[\w./-]+/(overlay\w*\.yaml)", command):
            assert (s / name).exists() or any(
                (RESULTS / m).exists() for m in re.findall(r"results/([\w./-]+/overlay\w*\.yaml)", command)
            ), f"{s.relative_to(REPO)}: {name} named but missing"
        written = None  # the overlays layer in their command's order: overlay.yaml, then overlay_off.yaml
        for name in ("overlay.yaml", "overlay_off.yaml"):
            if (s / name).exists():
                config = yaml.safe_load((s / name).read_text())
                assert isinstance(config, dict), f"{s.relative_to(REPO)}/{name} is not a YAML mapping"
                written = config.get("results_dir", written)
        if written is not None:
            assert written == str(s.relative_to(REPO)), f"{s.relative_to(REPO)}'s overlays write into {written}"


def test_readme_results_section_links_every_set_and_nothing_else():
    readme = (REPO / "README.md").read_text()
    match = re.search(r"^## Results.*?(?=^## |\Z)", readme, re.M | re.S)
    assert match, "README.md has no '## Results' section"
    linked = {m.rstrip("/").removesuffix("/README.md") for m in re.findall(r"\((results/[^)\s]+)\)", match.group(0))}
    expected = {str(s.relative_to(REPO)) for s in result_sets()}
    assert linked == expected, f"missing: {sorted(expected - linked)}; not sets: {sorted(linked - expected)}"


@pytest.mark.parametrize("doc", ["README.md", "BENCHMARKS.md"])
def test_links_into_results_point_at_kept_files(doc):
    text = (REPO / doc).read_text()
    for target in re.findall(r"\]\(((?:\.\./)*results/[^)#\s]+)", text):
        assert (REPO / target).exists(), f"{doc} links {target}, which is not in the tree"


def test_benchmark_reports_generated_tables_match_their_sets():
    """Every generated table in benchmarks/*.md equals what benchmarks_md makes from the kept set it reads."""
    from tools import benchmarks_md

    files = [a for p in benchmarks_md.report_files(REPO) for a in ("--file", str(p))]
    assert benchmarks_md.main(["--check", "--results", str(REPO), *files]) == 0


def test_layouts_figure_on_the_committed_two_gpu_layouts():
    """The 2 x H200 parallelism tables drawn by the layouts figure: the 1D layout first, one MFU bar per layout as in
    the table, one memory bar per rank, the first pipeline stage (it holds the embedding) above the second."""
    import matplotlib

    matplotlib.use("Agg")
    from workflow_scripts.report import figures

    tables = RESULTS / "parallelism/h200x2/tables"
    data = figures.load(tables / "runs.csv", tables / "steps.csv", tables / "vram.csv", figures.parse_style({}))
    speed, memory = figures.layouts_figure(data).axes
    order = ["ws2", "dp1-pp2", "dp1-tp2"]
    assert [t.get_text() for t in speed.get_xticklabels()] == order
    runs = data.runs.set_index("layout")
    assert [p.get_height() for p in speed.patches] == pytest.approx(list(100 * runs.loc[order, "mfu"]))
    heights = [p.get_height() * 2**30 for p in memory.patches]
    want = [v for key in order for v in figures.rank_values(runs.loc[key, "peak_allocated_bytes_per_rank"])]
    assert heights == pytest.approx(want) and heights[2] > heights[3]
