"""The parallel layout of a run (training/layout.py): keys, rank coordinates, the data-parallel view every consumer
asks for, and the checks that refuse a bad layout before any job starts."""
from __future__ import annotations

import pytest

from workflow_scripts import study
from workflow_scripts.training.layout import Layout
from workflow_scripts.training.models import MODELS
from workflow_scripts.training.parallel import DIMENSIONS, unimplemented


def test_pure_data_parallel_keeps_its_short_key():
    assert Layout.data_parallel(4).key == "ws4" and Layout.from_key("ws4") == Layout(dp=4)
    full = Layout(dp=2, pp=2, tp=2)
    assert full.key == "dp2-pp2-tp2" and full.world_size == 8 and Layout.from_key(full.key) == full
    with pytest.raises(ValueError):
        Layout.from_key("pp2-dp2x")


def test_ranks_are_laid_out_pp_dp_cp_tp_with_tp_innermost():
    layout = Layout(dp=2, pp=2, tp=2)
    coords = [layout.coords(r) for r in range(8)]
    assert [c["tp"] for c in coords] == [0, 1] * 4
    assert [c["dp"] for c in coords] == [0, 0, 1, 1] * 2
    assert [c["pp"] for c in coords] == [0] * 4 + [1] * 4
    assert [Layout(dp=4).dp_rank(r) for r in range(4)] == [0, 1, 2, 3]


def test_context_asks_the_layout_for_the_data_parallel_size():
    import torch

    from workflow_scripts.training.precision import policy
    from workflow_scripts.training.run_context import RunContext

    ctx = RunContext(rank=3, local_rank=3, local_world_size=8, device=torch.device("cpu"), platform="cpu",
                     layout=Layout(dp=2, tp=2, pp=2), precision=policy("fp32"), micro_batch=4, accum=2, lr=1e-3,
                     weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8, grad_clip=1.0, seed=0, work_dir="/tmp")
    assert ctx.world_size == 8 and ctx.dp_size == 2 and ctx.dp_rank == 1
    assert ctx.effective_batch == 4 * 2 * 2, "tensor and pipeline ranks do not multiply the batch"


def test_layout_checks_name_the_key():
    qwen = MODELS["qwen2.5-coder-1.5b"]  # 12 heads, 2 KV heads, 28 layers
    assert Layout(dp=1, tp=2).problems(qwen) == []
    assert Layout(dp=1, tp=4).problems(qwen) == ["layouts.tp: 4 does not divide qwen2.5-coder-1.5b's 2 KV heads"]
    assert Layout(pp=29).problems(qwen)[0].startswith("layouts.pp: 29 pipeline stages")
    assert "no experts" in Layout(dp=2, ep=2).problems(qwen)[0]
    assert set(DIMENSIONS) >= {"dp"} and unimplemented(Layout(dp=4)) == []


def test_world_sizes_and_layouts_make_one_run_grid():
    config = {"models": ["gpt2-tiny"], "strategies": ["ddp", "fsdp"], "world_sizes": [1, 2],
              "layouts": [2, {"dp": 2, "tp": 2}]}
    assert sorted(study.runs(config)) == sorted(
        (m, s, k) for m in ["gpt2-tiny"] for s in ["ddp", "fsdp"] for k in ["ws1", "ws2", "dp2-tp2"])
    with pytest.raises(ValueError, match=r"layouts\[0\]\.zz"):
        study.runs({**config, "layouts": [{"zz": 2}]})
