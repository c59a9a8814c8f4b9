"""Tensor parallelism (training/parallel/tensor.py), alone and composed: on CPU ranks (gloo), Qwen2 with DTensor
column/row-parallel blocks trains like the pure data-parallel run of the same data-parallel size.

Tolerance: tensor parallelism only splits matmuls and sums their partial outputs, so dp2-tp2 agrees with ws2 to 1e-5
at every step (measured: to 1e-6). The 3D layout also cuts the model into pipeline stages, whose reduction order
Adam amplifies after the first update (see test_parallel_pipeline): 5e-3 from step 3 on."""
from __future__ import annotations

import pytest
from conftest import run_layout as run


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_tensor_parallel_layout_trains_like_the_data_parallel_run(token_data, tmp_path, strategy):
    one_d, want = run(token_data, tmp_path, f"{strategy}_1d", "qwen2-tiny", strategy, {"dp": 2})
    two_d, got = run(token_data, tmp_path, f"{strategy}_tp", "qwen2-tiny", strategy, {"dp": 2, "tp": 2})
    assert two_d["layout"] == "dp2-tp2" and two_d["effective_batch"] == one_d["effective_batch"]
    assert got == pytest.approx(want, abs=1e-5)
    assert two_d["val_loss_final"] == pytest.approx(one_d["val_loss_final"], abs=1e-5)


def test_three_dimensions_compose(token_data, tmp_path):
    _, want = run(token_data, tmp_path, "1d", "qwen2-tiny", "fsdp", {"dp": 2})
    three_d, got = run(token_data, tmp_path, "3d", "qwen2-tiny", "fsdp", {"dp": 2, "pp": 2, "tp": 2})
    assert three_d["layout"] == "dp2-pp2-tp2" and three_d["world_size"] == 8
    assert got[:2] == pytest.approx(want[:2], abs=1e-5)
    assert got == pytest.approx(want, abs=5e-3)


def test_tensor_parallelism_needs_a_model_with_a_plan():
    from workflow_scripts.training.layout import Layout
    from workflow_scripts.training.parallel import model_problems

    assert model_problems(Layout(dp=1, tp=2), "qwen2-tiny", "layouts[0]") == []
    (gpt2,) = model_problems(Layout(dp=1, tp=2), "gpt2-tiny", "layouts[0]")
    assert gpt2.startswith("layouts[0].tp: 2, but gpt2-tiny (gpt2) has no tensor-parallel plan")
