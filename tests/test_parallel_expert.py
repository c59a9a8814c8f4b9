"""Expert parallelism (training/parallel/expert.py: transformers' ep_plan over a mesh carved from the data ranks):
on CPU ranks (gloo), a Qwen2-MoE model whose experts are split over the ep ranks trains like the pure data-parallel
run of the same data-parallel size.

Tolerance: expert parallelism moves tokens to the rank of their expert and back; the expert math is the same, the
gradients of an expert are summed over the ranks' tokens in another order: 1e-5 at every step, the tensor-parallel
bound (measured below 1e-6 for one step)."""
from __future__ import annotations

import pytest
from conftest import run_layout as run


def test_expert_parallel_layout_trains_like_the_data_parallel_run(token_data, tmp_path):
    """The ddp family (composable replicate); FSDP2 with expert copies: below; the parallelism study on CPU runs
    dp2-ep2 under fsdp."""
    one_d, want = run(token_data, tmp_path, "ddp_1d", "qwen2-moe-tiny", "ddp", {"dp": 2})
    ep, got = run(token_data, tmp_path, "ddp_ep", "qwen2-moe-tiny", "ddp", {"dp": 2, "ep": 2})
    assert ep["layout"] == "dp2-ep2" and ep["world_size"] == 2 and ep["effective_batch"] == one_d["effective_batch"]
    assert got == pytest.approx(want, abs=1e-5)
    assert ep["val_loss_final"] == pytest.approx(one_d["val_loss_final"], abs=1e-5)
    assert got[-1] < got[0]
    assert ep["parallel"]["ep"]["experts_per_rank"] == 2 and one_d["parallel"] == {}  # 4 experts over 2 ranks


def test_expert_shards_have_copies_over_the_other_data_ranks(token_data, tmp_path):
    """dp4-ep2: two ep groups of two ranks, each expert shard held twice (FSDP2-sharded over its copies); the
    routing is the 1D run's (deterministic under the seed), so the losses agree."""
    _, want = run(token_data, tmp_path, "ws4", "qwen2-moe-tiny", "fsdp", {"dp": 4})
    ep, got = run(token_data, tmp_path, "dp4_ep2", "qwen2-moe-tiny", "fsdp", {"dp": 4, "ep": 2})
    assert ep["parallel"]["ep"]["expert_copies"] == 2 and ep["world_size"] == 4
    assert got == pytest.approx(want, abs=1e-5)


def test_bad_expert_layouts_name_the_key():
    from workflow_scripts.training.layout import Layout
    from workflow_scripts.training.models import MODELS
    from workflow_scripts.training.parallel import model_problems, run_problems
    from workflow_scripts.training.strategies import get

    (dense,) = model_problems(Layout(dp=2, ep=2), "qwen2-tiny", "layouts[0]")
    assert dense.startswith("layouts[0].ep: 2, but qwen2-tiny (qwen2) has no expert-parallel plan")
    assert Layout(dp=2, ep=3).problems(MODELS["qwen2-moe-tiny"], "layouts[1]")[0].startswith(
        "layouts[1].ep: 3 does not divide qwen2-moe-tiny's 4 experts")
    assert any("ep and tp do not compose" in p for p in run_problems(Layout(dp=2, tp=2, ep=2), get("fsdp"), {}, "l"))
