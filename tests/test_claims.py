"""The published-claims table on hand-made run tables: speed and memory against the publication with their ratios,
the final loss compared only for runs from pretrained weights without substitutions (elsewhere "not comparable",
with numbered notes saying why), the CSV keeping the value without a ratio, the figure leaving such bars out."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workflow_scripts.report import claims  # noqa: E402
from workflow_scripts.report.style import parse_style  # noqa: E402

RANDOM = "random initialisation (the publication fine-tuned pretrained weights)"
CORPUS = "corpus: Python standard-library sources (offline) instead of the study's hub dataset"
TOKENIZER = "tokenizer: byte-level BPE trained in the pipeline instead of the hub tokenizer"
PUBLISHED = {
    "source": "a paper", "layout": "ws1", "memory": "allocated", "memory_unit": "GB",
    "claims": [{"model": "gpt2-medium", "strategy": "ddp", "seconds_per_epoch": 50.0, "peak_memory": 10.0,
                "final_loss": 0.5},
               {"model": "gpt2-medium", "strategy": "zero1", "seconds_per_epoch": 40.0, "peak_memory": 8.0,
                "final_loss": 0.4}],
    "headlines": [{"text": "ZeRO-1 1.25x faster than DP", "model": "gpt2-medium", "slower": "ddp",
                   "faster": ["zero1"], "factor": 1.25}],
}


def run(strategy, seconds, gb, loss, initialisation="random", substitutions="", status="ok", precision="fp32",
        repeat=0) -> dict:
    return {"run_id": f"{strategy}-r{repeat}", "model": "gpt2-medium", "strategy": strategy, "layout": "ws1",
            "world_size": 1, "repeat": repeat, "status": status, "precision": precision,
            "time_per_epoch_s": seconds, "peak_allocated_bytes": gb * 1e9, "final_loss": loss,
            "initialisation": initialisation, "substitutions": substitutions}


def runs(*rows, drop=()) -> pd.DataFrame:
    return pd.DataFrame(list(rows)).drop(columns=list(drop))


# fair: both random-init, ddp on a substituted corpus and tokenizer; as published: ddp from pretrained weights with
# nothing substituted (comparable), zero1 pretrained on a substituted corpus
FAIR = runs(run("ddp", 100.0, 15.0, 5.0, substitutions=f"{CORPUS}; {TOKENIZER}", precision="bf16-mixed"),
            run("zero1", 60.0, 12.0, 4.8, precision="bf16-mixed"))
AS_PUBLISHED = runs(run("ddp", 75.0, 20.0, 1.0, initialisation="pretrained: openai-community/gpt2-medium"),
                    run("zero1", 20.0, 6.0, 0.8, initialisation="pretrained: /models/gpt2-medium",
                        substitutions=CORPUS, precision="bf16-pure"))


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def table_of(fair=FAIR, as_published=AS_PUBLISHED) -> pd.DataFrame:
    return claims.claims_table(fair, as_published, PUBLISHED).set_index(["strategy", "measure"])


def markdown(tmp_path, fair=FAIR, as_published=AS_PUBLISHED) -> list[str]:
    table = claims.claims_table(fair, as_published, PUBLISHED)
    path = tmp_path / "claims.md"
    claims.write_markdown(table, claims.headlines_table(table, PUBLISHED), PUBLISHED, path)
    return path.read_text().splitlines()


def row_cells(lines: list[str], strategy: str, label: str) -> list[str]:
    """The cells (model, strategy, measure, published, as published, fair) of one claims row."""
    found = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| gpt2-medium |")]
    return next(c for c in found if c[1] == strategy and c[2] == label)


def test_time_and_memory_show_values_with_ratios(tmp_path):
    """100 s against 50 s is x2.00, 15 GB against 10 GB x1.50; 20 s against 40 s x0.50, 6 GB against 8 GB x0.75:
    whatever the initialisation and substitutions."""
    t = table_of()
    assert t.loc[("ddp", "seconds_per_epoch"), "fair_ratio"] == pytest.approx(100 / 50)
    assert t.loc[("ddp", "peak_memory"), "fair_ratio"] == pytest.approx(15 / 10)
    assert t.loc[("zero1", "seconds_per_epoch"), "as_published_ratio"] == pytest.approx(20 / 40)
    speed_memory = t[t.index.get_level_values("measure") != "final_loss"]
    assert set(speed_memory.fair_loss_comparable) | set(speed_memory.as_published_loss_comparable) == {""}
    lines = markdown(tmp_path)
    assert row_cells(lines, "ddp", "time per epoch (s)")[3:] == ["50", "75 (x1.50) [fp32]", "100 (x2.00) [bf16-mixed]"]
    assert row_cells(lines, "ddp", "peak memory (GB)")[3:] == ["10", "20 (x2.00) [fp32]", "15 (x1.50) [bf16-mixed]"]
    assert row_cells(lines, "zero1", "time per epoch (s)")[3:] == ["40", "20 (x0.50) [bf16-pure]",
                                                                   "60 (x1.50) [bf16-mixed]"]
    assert row_cells(lines, "zero1", "peak memory (GB)")[3:] == ["8", "6 (x0.75) [bf16-pure]",
                                                                 "12 (x1.50) [bf16-mixed]"]
    assert any(line.startswith("| ZeRO-1 1.25x faster than DP | gpt2-medium | ddp / zero1 | 1.25x | 3.75x | 1.667x")
               for line in lines)  # 75/20 as published, 100/60 fair


def test_loss_of_random_init_or_substituted_runs_is_not_comparable():
    """The value stays (it is data), the ratio is NaN, and the column says why, each reason once."""
    t = table_of()
    fair_ddp, fair_zero1 = t.loc[("ddp", "final_loss")], t.loc[("zero1", "final_loss")]
    assert fair_ddp.fair == 5.0 and math.isnan(fair_ddp.fair_ratio)
    assert fair_ddp.fair_loss_comparable == f"no: {RANDOM}; {CORPUS}; {TOKENIZER}"
    assert fair_zero1.fair == 4.8 and math.isnan(fair_zero1.fair_ratio) and fair_zero1.fair_loss_comparable == (
        f"no: {RANDOM}")
    assert fair_zero1.as_published == 0.8 and math.isnan(fair_zero1.as_published_ratio)
    assert fair_zero1.as_published_loss_comparable == f"no: {CORPUS}"


def test_pretrained_run_without_substitutions_shows_its_loss_with_a_ratio(tmp_path):
    """1.0 against the published 0.5: x2.00."""
    row = table_of().loc[("ddp", "final_loss")]
    assert row.as_published_ratio == pytest.approx(1.0 / 0.5) and row.as_published_loss_comparable == "yes"
    assert row_cells(markdown(tmp_path), "ddp", "final training loss")[4] == "1 (x2.00) [fp32]"


def test_markdown_marks_the_loss_not_comparable_and_numbers_each_reason_once(tmp_path):
    lines = markdown(tmp_path)
    assert row_cells(lines, "ddp", "final training loss")[5] == "not comparable (notes 1, 2, 3)"
    assert row_cells(lines, "zero1", "final training loss")[4:] == ["not comparable (note 2)",
                                                                    "not comparable (note 1)"]
    notes = [line for line in lines if line[:3] in ("1. ", "2. ", "3. ", "4. ")]
    assert notes == [f"1. {RANDOM}", f"2. {CORPUS}", f"3. {TOKENIZER}"]
    # under the claims table, before the headlines
    first_note, last_row = lines.index(notes[0]), max(i for i, line in enumerate(lines) if "| gpt2-medium |" in line
                                                      and "final training loss" in line)
    assert last_row < first_note < lines.index(next(line for line in lines if line.startswith("| headline")))


def test_no_notes_where_every_loss_is_comparable(tmp_path):
    pretrained = FAIR.assign(initialisation="pretrained: openai-community/gpt2-medium", substitutions="")
    lines = markdown(tmp_path, fair=pretrained, as_published=pretrained)
    assert row_cells(lines, "zero1", "final training loss")[4:] == ["4.8 (x12.00) [bf16-mixed]",
                                                                    "4.8 (x12.00) [bf16-mixed]"]
    assert not any("not comparable" in line for line in lines)


def test_a_run_table_without_the_columns_is_not_known_so_not_comparable(tmp_path):
    """An older runs.csv (committed sets) records neither: both named; a run with its initialisation but no
    substitutions column misses that one only."""
    t = table_of(fair=FAIR.drop(columns=["initialisation", "substitutions"]),
                 as_published=AS_PUBLISHED.drop(columns=["substitutions"]))
    row = t.loc[("ddp", "final_loss")]
    assert row.fair_loss_comparable == "no: initialisation not recorded; substitutions not recorded"
    assert row.as_published_loss_comparable == "no: substitutions not recorded"
    assert math.isnan(row.fair_ratio) and math.isnan(row.as_published_ratio)
    assert t.loc[("ddp", "seconds_per_epoch"), "fair_ratio"] == pytest.approx(2.0)
    lines = markdown(tmp_path, fair=FAIR.drop(columns=["initialisation", "substitutions"]))
    assert "1. initialisation not recorded" in lines and "2. substitutions not recorded" in lines


def test_a_variant_without_an_ok_run_keeps_its_status():
    fair = runs(run("ddp", math.nan, math.nan, math.nan, status="oom"), FAIR.iloc[1].to_dict())
    table = claims.claims_table(fair, AS_PUBLISHED, PUBLISHED)
    notes = claims.notes_of(table)
    loss = next(r for r in table.itertuples() if r.strategy == "ddp" and r.measure == "final_loss")
    assert loss.fair_loss_comparable == "" and claims.variant_cell(loss, "fair", notes) == "oom"
    assert list(notes) == [CORPUS, RANDOM]  # zero1 as published, then zero1 fair


def test_cli_reads_the_run_tables_and_writes_the_comparability_column(tmp_path):
    """Through runs.csv: an empty `substitutions` reads back as none (comparable), the CSV keeps every value."""
    paths = {}
    for name, frame in (("fair", FAIR), ("as_published", AS_PUBLISHED)):
        paths[name] = tmp_path / name / "runs.csv"
        paths[name].parent.mkdir()
        frame.to_csv(paths[name], index=False)
    out = tmp_path / "out"
    claims.main(["--fair", str(paths["fair"]), "--as-published", str(paths["as_published"]),
                 "--published", json.dumps(PUBLISHED), "--style", json.dumps({"dpi": 40, "width": 3, "height": 2}),
                 "--out-csv", str(out / "claims.csv"), "--out-headlines", str(out / "claims_headlines.csv"),
                 "--out-md", str(out / "claims.md"), "--figure", str(out / "claims.png")])
    csv = pd.read_csv(out / "claims.csv").set_index(["strategy", "measure"])
    assert csv.loc[("ddp", "final_loss"), "as_published_loss_comparable"] == "yes"
    assert csv.loc[("ddp", "final_loss"), "as_published_ratio"] == pytest.approx(2.0)
    assert csv.loc[("ddp", "final_loss"), "fair"] == 5.0 and math.isnan(csv.loc[("ddp", "final_loss"), "fair_ratio"])
    assert csv.loc[("zero1", "final_loss"), "fair_loss_comparable"] == f"no: {RANDOM}"
    assert csv.loc[("zero1", "seconds_per_epoch"), "fair_ratio"] == pytest.approx(1.5)
    assert (out / "claims.png").stat().st_size > 1000 and (out / "claims.pdf").exists()


def loss_axes(fig):
    return next(ax for ax in fig.axes if ax.get_title() == "final training loss")


def drawn_bars(ax) -> list[int]:
    """Per series (published, as published, fair) how many bars have a height."""
    return [sum(not math.isnan(b.get_height()) for b in c) for c in ax.containers]


def notes_in(ax) -> str:
    return "\n".join(t.get_text() for t in ax.texts)


def figure_of(fair=FAIR, as_published=AS_PUBLISHED):
    table = claims.claims_table(fair, as_published, PUBLISHED)
    style = parse_style({"dpi": 40, "width": 3, "height": 2})
    return claims.claims_figure(table, claims.headlines_table(table, PUBLISHED), PUBLISHED, style)


def test_figure_draws_only_comparable_losses_and_says_why_where_none_is():
    fair_only_random = FAIR.assign(substitutions="")
    as_published = AS_PUBLISHED.assign(initialisation="random", substitutions="")
    fig = figure_of(fair_only_random, as_published)
    ax = loss_axes(fig)
    assert drawn_bars(ax) == [2, 0, 0]
    note = notes_in(ax).replace("\n  ", " ")
    assert note.startswith("ours: loss not comparable") and RANDOM in note
    time = next(a for a in fig.axes if a.get_title() == "time per epoch (s)")
    assert drawn_bars(time) == [2, 2, 2] and notes_in(time) == ""


def test_figure_marks_the_left_out_losses_where_some_are_drawn():
    ax = loss_axes(figure_of())
    assert drawn_bars(ax) == [2, 1, 0]  # as published ddp only
    note = notes_in(ax).replace("\n  ", " ")
    assert "n/c: loss not comparable" in note and all(r in note for r in (RANDOM, CORPUS, TOKENIZER))
    assert [t.get_text() for t in ax.texts].count("n/c") == 3
