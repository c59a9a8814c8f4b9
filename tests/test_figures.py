"""Figures on the synthetic study of test_tables.make_study: files written and valid, hidden strategies left out,
failed runs marked, the peak-memory legend naming the three memories, the CPU MFU panel, empty inputs."""
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
        least = 1_000 if name == "accuracy" else 5_000  # no image classifier here: one axes saying so
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


def test_scaling_single_world_size_note(gpu, tmp_path):
    import pandas as pd

    runs = pd.read_csv(gpu["runs"])
    runs[runs["world_size"] == 1].to_csv(tmp_path / "runs.csv", index=False)
    data = load({**gpu, "runs": tmp_path / "runs.csv"})
    assert any("one world size only" in t for t in texts(figures.scaling_figure(data)))


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


def test_layouts_figure_shows_each_ranks_memory_and_the_mfu_per_layout():
    """On the committed 2 x H200 parallelism tables: one bar per rank (pipeline stages differ), MFU bars as in the
    table, the 1D layout first."""
    tables = HERE.parent / "results/parallelism/h200x2/tables"
    data = load({"runs": tables / "runs.csv", "steps": tables / "steps.csv", "vram": tables / "vram.csv"})
    speed, memory = figures.layouts_figure(data).axes
    assert [t.get_text() for t in speed.get_xticklabels()] == ["ws2", "dp1-pp2", "dp1-tp2"]
    runs = data.runs.set_index("layout")
    assert [p.get_height() for p in speed.patches] == pytest.approx(list(100 * runs.loc[["ws2", "dp1-pp2", "dp1-tp2"], "mfu"]))
    heights = [p.get_height() * 2**30 for p in memory.patches]
    want = [v for key in ("ws2", "dp1-pp2", "dp1-tp2")
            for v in figures.rank_values(runs.loc[key, "peak_allocated_bytes_per_rank"])]
    assert heights == pytest.approx(want) and heights[2] > heights[3]  # the first stage holds the embedding


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
    """Adding a figure = its function, one registry entry and a caption: nothing draws outside the registry, and
    only report/style.py themes and saves."""
    import importlib

    names = [e.name for e in figure_registry.ENTRIES]
    assert len(names) == len(set(names)) and figures.FIGURES == figure_registry.names("figures")
    for e in figure_registry.ENTRIES:
        assert e.caption.read_text().strip(), e.name
        assert callable(e.load()), e.function
    registered = {e.function for e in figure_registry.ENTRIES}
    root = HERE.parent / "workflow_scripts"
    for path in root.rglob("*.py"):
        text, module = path.read_text(), ".".join(path.relative_to(root).with_suffix("").parts)
        if path.name != "style.py":
            assert "savefig(" not in text and "set_theme(" not in text, path
        if "def " in text and "_figure(" in text and path.name != "figure_registry.py":
            mod = importlib.import_module(f"workflow_scripts.{module}")
            drawn = {f"{module}:{n}" for n, f in vars(mod).items()
                     if n.endswith("_figure") and callable(f) and getattr(f, "__module__", "") == mod.__name__}
            assert drawn <= registered, drawn - registered
