"""Pipeline parallelism (training/parallel/pipeline.py): a dp2-pp2 layout trains like the pure data-parallel run of
the same data-parallel size, on 4 CPU ranks (gloo): GPT-2 (tied embedding across the two end stages) with the ddp
family (stages replicated over dp), Qwen2 with fsdp (stages sharded over dp).

Tolerance: the first two steps agree to 1e-5 (one update of the same gradients, summed in another order); after that
Adam amplifies the ~1e-7 relative differences of reduction order in near-zero gradient elements (its update is
lr x sign-like for them), so later losses agree to 5e-3, validation losses to 5e-3 (measured: at most 2e-3)."""
from __future__ import annotations

import json

import pytest
from conftest import boundaries
from conftest import run_layout as run

from workflow_scripts import schema


@pytest.mark.parametrize("model, strategy", [("gpt2-tiny", "ddp"), ("qwen2-tiny", "fsdp")])
def test_pipeline_layout_trains_like_the_data_parallel_run(token_data, tmp_path, model, strategy):
    one_d, want = run(token_data, tmp_path, f"{model}_1d", model, strategy, {"dp": 2})
    two_d, got = run(token_data, tmp_path, f"{model}_2d", model, strategy, {"dp": 2, "pp": 2})
    assert two_d["layout"] == "dp2-pp2" and two_d["world_size"] == 4 and two_d["dp_size"] == 2
    assert two_d["parallel"]["pp"]["bubble_fraction_ideal"] == pytest.approx(1 / 3)  # pp 2 over 2 micro-batches
    assert two_d["effective_batch"] == one_d["effective_batch"], "pipeline ranks do not multiply the batch"
    assert got[:2] == pytest.approx(want[:2], abs=1e-5)
    assert got == pytest.approx(want, abs=5e-3)
    assert got[-1] < got[0] - 0.2, "the loss went down"
    assert two_d["val_loss_final"] == pytest.approx(one_d["val_loss_final"], abs=5e-3)
    settings = json.loads((tmp_path / f"{model}_2d/out/strategy_settings.json").read_text())
    assert settings["layout"] == {"dp": 2, "pp": 2, "tp": 1, "cp": 1, "ep": 1}


def test_pipeline_layouts_refuse_what_they_cannot_run():
    from workflow_scripts.training.layout import Layout
    from workflow_scripts.training.parallel import run_problems
    from workflow_scripts.training.strategies import STRATEGIES

    layout = Layout(dp=2, pp=2)
    assert run_problems(layout, STRATEGIES["ddp"], schema.filled("train", {"grad_accum": 2}), "layouts[0]") == []
    (zero,) = run_problems(layout, STRATEGIES["zero2"], schema.filled("train", {"grad_accum": 2}), "layouts[0]")
    assert zero.startswith("layouts[0]: dp2-pp2 with strategy zero2: model-parallel layouts compose")
    (accum,) = run_problems(layout, STRATEGIES["ddp"], schema.filled("train", {"grad_accum": 1}), "layouts[0]")
    assert "train.grad_accum (the pipeline's micro-batches) >= 2" in accum


def test_pipeline_stages_keep_documents_apart_as_the_data_parallel_run_does(short_documents, tmp_path):
    """train.separate_documents under dp2-pp2: the first stage derives the documents' positions and every stage
    masks by them, so the run trains as the pure data-parallel run with its documents apart (transformers' mask from
    the position ids), not as one whose documents see each other."""
    _, want = run(short_documents, tmp_path, "gpt2_1d_apart", "gpt2-tiny", "ddp", {"dp": 2},
                  separate_documents=True, max_steps=4)
    _, got = run(short_documents, tmp_path, "gpt2_2d_apart", "gpt2-tiny", "ddp", {"dp": 2, "pp": 2},
                 separate_documents=True, max_steps=4)
    assert boundaries(short_documents) > 0.3  # (packed positions change the logits: tests/test_documents.py)
    assert got[:2] == pytest.approx(want[:2], abs=1e-5)
    assert got == pytest.approx(want, abs=5e-3)
