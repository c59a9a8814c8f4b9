"""Figures on the synthetic study of test_tables.make_study: files written and valid, hidden strategies left out,
failed runs marked, the peak-memory legend naming the three memories, the CPU MFU panel, empty inputs; and which
figures the registry makes for a study config (only those with data)."""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from test_tables import make_study  # noqa: E402

from workflow_scripts.report import figure_registry, figures  # noqa: E402


def load(paths: dict, **style) -> figures.Data:
    return figures.load(paths["runs"], paths["steps"], paths["vram"], figures.parse_style(style))


def texts(fig) -> list[str]:
    """Every piece of text in a figure: titles, labels, tick labels, annotations, legends."""
    return [t.get_text() for t in fig.findobj(plt.Text)]


def tick_labels(fig) -> set[str]:
    return {t.get_text() for ax in fig.axes for t in ax.get_xticklabels()}


def legend_labels(fig) -> list[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text() for leg in legends for t in leg.get_texts()]


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return make_study(tmp_path_factory.mktemp("gpu"))


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_cli_writes_every_figure_as_valid_png_and_pdf(gpu, tmp_path):
    out = tmp_path / "fig"
    figures.main(["--runs", str(gpu["runs"]), "--steps", str(gpu["steps"]), "--vram", str(gpu["vram"]),
                  "--style", json.dumps({"dpi": 50, "width": 4, "height": 3}), "--out-dir", str(out)])
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.{e}" for n in figures.FIGURES for e in ("png", "pdf"))
    for name in figures.FIGURES:
        png, pdf = out / f"{name}.png", out / f"{name}.pdf"
        width, height = png_size(png)
        assert width >= 150 and height >= 100, name
        # no image classifier, one layout per world size here: one axes saying so
        least = 1_000 if name in ("accuracy", "layouts") else 5_000
        assert png.stat().st_size > least, name
        assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > least, name
    assert 0.8 * 2 * 4 * 50 < png_size(out / "throughput.png")[0] < 1.2 * 2 * 4 * 50  # 2 panels x width x dpi


def test_hidden_strategy_left_out_unless_asked(gpu):
    data = load(gpu)
    assert "zero0" not in set(data.runs["strategy"]) and "zero0" not in set(data.steps["strategy"])
    for build in (figures.throughput_figure, figures.peak_memory_figure, figures.time_per_epoch_figure):
        labels = tick_labels(build(data))
        assert "ddp" in labels and "zero0" not in labels
    assert "zero0" not in legend_labels(figures.loss_curves_figure(data))
    assert not any("zero0" in t for t in texts(figures.memory_timeline_figure(data)))
    shown = load(gpu, include_hidden=True)
    assert "zero0" in tick_labels(figures.throughput_figure(shown))
    assert "zero0" in legend_labels(figures.loss_curves_figure(shown))


def test_failed_runs_are_marked_not_dropped(gpu):
    data = load(gpu)
    fig = figures.throughput_figure(data)
    assert {"zero3", "zero_infinity"} <= tick_labels(fig)
    words = texts(fig)
    assert "OOM" in words and "n/a" in words
    assert "OOM" in texts(figures.peak_memory_figure(data))
    assert any("zero3 (OOM)" in t for t in texts(figures.loss_curves_figure(data)))
    assert any("zero3 (OOM)" in t for t in texts(figures.memory_vs_throughput_figure(data)))
    assert "zero3: OOM" in texts(figures.scaling_figure(data))
    assert any("zero_infinity — n/a" in t for t in texts(figures.memory_timeline_figure(data)))


def test_peak_memory_legend_names_the_three_memories(gpu):
    labels = legend_labels(figures.peak_memory_figure(load(gpu)))
    assert any("max_memory_allocated" in label for label in labels)
    assert any("max_memory_reserved" in label for label in labels)
    assert any("device-wide" in label and "sampler" in label for label in labels)
    assert any("predicted model states" in label for label in labels)


def test_cpu_study(tmp_path):
    data = load(make_study(tmp_path, cpu=True))
    assert "MFU not defined on CPU" in texts(figures.mfu_figure(data))
    labels = legend_labels(figures.peak_memory_figure(data))
    assert any("host RSS" in label for label in labels) and any("sampler host peak" in label for label in labels)
    assert not any("device-wide" in label for label in labels)
    ylabels = [ax.get_ylabel() for ax in figures.memory_timeline_figure(data).axes if ax.get_ylabel()]
    assert ylabels and all("host RSS" in y for y in ylabels)


def test_axis_labels_say_which_memory_and_unit(gpu):
    data = load(gpu)
    xlabel = figures.memory_vs_throughput_figure(data).axes[0].get_xlabel()
    assert "GiB" in xlabel and "device-wide peak" in xlabel
    ylabels = {ax.get_ylabel() for ax in figures.memory_timeline_figure(data).axes if ax.get_ylabel()}
    assert ylabels == {"device-wide used (NVML) (GiB)"}


def test_scaling_draws_only_models_run_at_several_world_sizes(gpu, tmp_path):
    import pandas as pd

    assert [ax.get_title() for ax in figures.scaling_figure(load(gpu)).axes] == ["gpt2-tiny"]
    runs = pd.read_csv(gpu["runs"])
    runs[runs["world_size"] == 1].to_csv(tmp_path / "runs.csv", index=False)
    data = load({**gpu, "runs": tmp_path / "runs.csv"})
    assert "no model ran at more than one world size" in texts(figures.scaling_figure(data))


@pytest.mark.parametrize("case", ["header_only", "all_unsupported"])
def test_empty_inputs_still_write_every_file(tmp_path, case):
    paths = make_study(tmp_path / "in", empty=case == "header_only")
    if case == "all_unsupported":
        import pandas as pd

        runs = pd.read_csv(paths["runs"])
        runs["status"] = "unsupported"
        runs.to_csv(paths["runs"], index=False)
        make_study(tmp_path / "blank", empty=True)
        paths = {**paths, "steps": tmp_path / "blank" / "steps.csv", "vram": tmp_path / "blank" / "vram.csv"}
    data = load(paths, dpi=40)
    written = figures.write_all(data, tmp_path / "out")
    assert len(written) == 2 * len(figures.FIGURES) and all(p.stat().st_size > 500 for p in written)


def test_style_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown style keys"):
        figures.parse_style('{"dpii": 300}')
    assert figures.parse_style("")["dpi"] == 150


def test_layouts_figure_draws_each_ranks_memory_and_the_mfu_per_layout(gpu, tmp_path):
    """ddp at 2 GPUs as two layouts: ws2 with MFU 20, 22, 24 % (mean 22) and 1 GiB on each rank, dp1-pp2 with
    MFU 10, 12, 14 % (mean 12) and its stages' 1.5 and 0.5 GiB: one MFU bar per layout, one memory bar per rank."""
    import pandas as pd

    runs = pd.read_csv(gpu["runs"])
    ws2 = runs[(runs["strategy"] == "ddp") & (runs["world_size"] == 2)].assign(
        mfu=[0.20, 0.22, 0.24], peak_allocated_bytes_per_rank=json.dumps([2**30, 2**30]))
    pp = ws2.assign(layout="dp1-pp2", run_id=ws2["run_id"] + "-pp", mfu=[0.10, 0.12, 0.14],
                    peak_allocated_bytes_per_rank=json.dumps([1.5 * 2**30, 0.5 * 2**30]))
    pd.concat([ws2, pp]).to_csv(tmp_path / "runs.csv", index=False)
    speed, memory = figures.layouts_figure(load({**gpu, "runs": tmp_path / "runs.csv"})).axes
    assert [t.get_text() for t in speed.get_xticklabels()] == ["ws2", "dp1-pp2"]
    assert [p.get_height() for p in speed.patches] == pytest.approx([22.0, 12.0])
    assert [p.get_height() for p in memory.patches] == pytest.approx([1.0, 1.0, 1.5, 0.5])
    assert "GiB" in memory.get_ylabel()


def test_cli_draws_the_named_figures_only(gpu, tmp_path):
    figures.main(["--runs", str(gpu["runs"]), "--steps", str(gpu["steps"]), "--vram", str(gpu["vram"]),
                  "--style", json.dumps({"dpi": 40}), "--names", "throughput,phases", "--out-dir", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["phases.pdf", "phases.png", "throughput.pdf",
                                                          "throughput.png"]
    with pytest.raises(SystemExit, match="--names accuracyy: not a study figure"):
        figures.write_all(load(gpu), tmp_path, ["accuracyy"])


def test_predicted_speed_ticks_the_prediction_and_names_the_rows_without_one(gpu):
    fig = figures.predicted_speed_figure(load(gpu))
    assert figures.PREDICTED_SPEED_LABEL in legend_labels(fig)
    words = texts(fig)
    assert sum("ddp -9 %" in t for t in words) == 2  # 1000 predicted / 1100 measured - 1, both world sizes
    assert any("no prediction: zero2" in t and "fsdp" in t for t in words)
    heights = {round(seg[0][1]) for ax in fig.axes for c in ax.collections
               for seg in getattr(c, "get_segments", lambda: [])()}
    assert {1000, 2000} <= heights  # the predicted ticks, one per world size
    # a prediction three times its bar stays in view (the bars set the axis; the ticks widen it)
    data = load(gpu)
    data.summary["predicted_tokens_per_s"] *= 3
    fig = figures.predicted_speed_figure(data)
    ticks = [(ax, seg[0][1]) for ax in fig.axes for c in ax.collections
             for seg in getattr(c, "get_segments", lambda: [])()]
    assert {3000, 6000} <= {round(y) for _, y in ticks} and all(y < ax.get_ylim()[1] for ax, y in ticks)


def test_every_figure_joins_the_registry_once_with_a_caption():
    """Adding a figure = its function, one registry entry and a caption: no product figure draws outside the
    registry, and only report/style.py themes and saves (the lab's figures too)."""
    import importlib

    names = [e.name for e in figure_registry.ENTRIES]
    assert len(names) == len(set(names)) and figures.FIGURES == figure_registry.names("figures")
    for e in figure_registry.ENTRIES:
        assert e.caption.read_text().strip(), e.name
        assert callable(e.load()), e.function
    registered = {e.function for e in figure_registry.ENTRIES}
    for root in (HERE.parent / "workflow_scripts", HERE.parent / "experiments"):
        for path in root.rglob("*.py"):
            text = path.read_text()
            module = ".".join(path.relative_to(HERE.parent).with_suffix("").parts)
            if path.name != "style.py":
                assert "savefig(" not in text and "set_theme(" not in text, path
            # the product's figures join the registry; the lab's (experiments/) draw through style.py alone
            if root.name == "workflow_scripts" and "def " in text and "_figure(" in text \
                    and path.name != "figure_registry.py":
                mod = importlib.import_module(module)
                drawn = {f"{module}:{n}" for n, f in vars(mod).items()
                         if n.endswith("_figure") and callable(f) and getattr(f, "__module__", "") == mod.__name__}
                assert drawn <= registered, drawn - registered


# ---------------------------------------------------------------- which figures a study makes
def study_config(**changes) -> dict:
    """config.yaml with `changes` on top, its defaults filled by the schema as the workflow fills them."""
    import copy

    import yaml
    from snakemake.utils import validate

    config = yaml.safe_load((HERE.parent / "config.yaml").read_text())
    config = {**copy.deepcopy(config), **changes}
    validate(config, schema=str(HERE.parent / "schemas/config.schema.yaml"), set_default=True)
    return config


STUDY_STAGES = ("figures", "calibration_figure", "trace_report", "claims")
EVERY_STUDY = {"loss_curves", "peak_memory", "throughput", "time_per_epoch", "memory_vs_throughput", "phases",
               "calibration"}


def made(config: dict) -> set[str]:
    return {n for stage in STUDY_STAGES for n in figure_registry.names(stage, config)}


def test_the_default_cpu_study_makes_only_figures_with_data():
    """A text study on CPU, one world size, one layout, the host sampler, no profile, no publication: no MFU,
    prediction, scaling, layouts, accuracy, traces or claims."""
    config = study_config()
    assert made(config) == EVERY_STUDY | {"memory_timeline"}
    files = figure_registry.study_files(config, "results/default")
    assert "results/default/figures/memory_timeline.pdf" in files and len(files) == 2 * 8


def test_a_gpu_vision_study_with_layouts_makes_every_study_figure():
    """cuda, image classifiers at world sizes 1 and 2 and a pipeline layout at 2, profiled, with a publication."""
    config = study_config(platform="cuda", data={"kind": "images"}, models=["vit-base-16"], strategies=["ddp"],
                          world_sizes=[1, 2], layouts=[{"dp": 1, "pp": 2}], profile={"enabled": True},
                          published={"source": "a paper", "claims": [{"model": "vit-base-16", "strategy": "ddp",
                                                                      "seconds_per_epoch": 10.0}]})
    assert made(config) == EVERY_STUDY | {"memory_timeline", "mfu", "predicted_speed", "scaling", "layouts",
                                          "accuracy", "traces", "claims"}


def test_scaling_and_layouts_need_more_than_one_of_them_for_one_model():
    """Two models at one world size each: no model scales; no sampler: no memory timeline. World sizes 1, 2, 4 in
    pure data parallel scale, but compare no layouts (one layout per world size); a tensor-parallel layout at 4
    beside ws4 does, and a 4-rank layout alone (dp1-tp4 at world size 4, ws2 beside it) does not."""
    config = study_config(groups=[{"models": ["gpt2-tiny"], "strategies": ["ddp"], "world_sizes": [1]},
                                  {"models": ["gpt2"], "strategies": ["ddp"], "world_sizes": [2]}],
                          sampler={"backend": "none"})
    assert made(config) == EVERY_STUDY
    assert made(study_config(world_sizes=[1, 2, 4])) == EVERY_STUDY | {"memory_timeline", "scaling"}
    assert made(study_config(world_sizes=[1, 2, 4], layouts=[{"dp": 2, "tp": 2}])) == EVERY_STUDY | {
        "memory_timeline", "scaling", "layouts"}
    assert made(study_config(world_sizes=[2], layouts=[{"dp": 1, "tp": 4}])) == EVERY_STUDY | {"memory_timeline"}


# ---------------------------------------------------------------- the report's first page
def test_report_hook_refreshes_the_findings_after_verify_only(tmp_path):
    import os
    from types import SimpleNamespace as NS

    from workflow_scripts.report import report_hook

    findings, verified = tmp_path / "findings.rst", tmp_path / "reproduction.csv"
    workflow = NS(rules=NS(findings=NS(output=NS(rst=str(findings))),
                           compare_with_committed=NS(output=NS(csv=str(verified)))))
    assert report_hook.findings_stale(workflow) is None  # no verify table
    verified.write_text("model\n")
    assert report_hook.findings_stale(workflow) == findings  # no findings beside it
    findings.write_text("")
    os.utime(verified, (1000, 1000))
    assert report_hook.findings_stale(workflow) is None  # the findings are newer
    os.utime(verified, (findings.stat().st_mtime + 10,) * 2)
    assert report_hook.findings_stale(workflow) == findings
    assert report_hook.findings_stale(NS(rules=NS())) is None  # a workflow without the rules
    meta = report_hook.metadata({"repeats": 3, "train": {"micro_batch_size": 8, "max_steps": None, "seed": 1}})
    assert meta == {"Repeats per configuration": 3, "Micro-batch size": 8, "Seed": 1}


def test_the_first_page_includes_the_findings_once_they_exist(tmp_path):
    """report/workflow.rst as Snakemake renders it (Jinja over the report's files, then docutils)."""
    from types import SimpleNamespace as NS

    from docutils.core import publish_parts
    from jinja2 import Environment
    from test_tables import findings_of

    findings_of(tmp_path)
    (tmp_path / "findings.md").write_text("")
    (tmp_path / "f.rst").rename(tmp_path / "findings.rst")
    page = (HERE.parent / "report/workflow.rst").read_text()
    env = Environment(trim_blocks=True, lstrip_blocks=True)
    with_findings = [NS(target="findings.md", path=tmp_path / "findings.md")]
    for files, expected in ((with_findings, "What the synthetic study found"), ([], "No findings yet")):
        text = env.from_string(page).render(files=files, snakemake=NS(config={}), categories={})
        html = publish_parts(text, writer="html", settings_overrides={"halt_level": 2})["html_body"]
        assert expected in html
