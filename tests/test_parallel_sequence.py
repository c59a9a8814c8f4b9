"""Context (sequence) parallelism (training/parallel/sequence.py: DeepSpeed-Ulysses), alone and composed: on CPU
ranks (gloo), Qwen2 with each cp rank holding half of every sequence trains like the pure data-parallel run of the
same data-parallel size.

Tolerance: the sequence split changes no arithmetic but the order of the loss's and the gradients' sums (the dp x
cp ranks average shard sums instead of one rank summing the whole sequence): 1e-5 at every step, the tensor-parallel
bound."""
from __future__ import annotations

import pytest
from conftest import boundaries
from conftest import run_layout as run

from workflow_scripts import schema


def test_sequence_parallel_layout_trains_like_the_data_parallel_run(token_data, tmp_path):
    """FSDP2 shards over the flattened dp x cp mesh (here: the two cp ranks)."""
    one_d, want = run(token_data, tmp_path, "fsdp_1d", "qwen2-tiny", "fsdp", {"dp": 1})
    cp, got = run(token_data, tmp_path, "fsdp_cp", "qwen2-tiny", "fsdp", {"dp": 1, "cp": 2})
    assert cp["layout"] == "dp1-cp2" and cp["effective_batch"] == one_d["effective_batch"]
    assert cp["parallel"]["cp"]["heads_per_rank"] == 2
    assert got == pytest.approx(want, abs=1e-5)
    assert cp["val_loss_final"] == pytest.approx(one_d["val_loss_final"], abs=1e-5)


def test_sequence_and_tensor_parallelism_compose(token_data, tmp_path):
    """The ddp family's replicate over dp x cp, around tensor-parallel blocks."""
    _, want = run(token_data, tmp_path, "1d", "qwen2-tiny", "ddp", {"dp": 1})
    both, got = run(token_data, tmp_path, "tp_cp", "qwen2-tiny", "ddp", {"dp": 1, "tp": 2, "cp": 2})
    assert both["layout"] == "dp1-tp2-cp2" and both["world_size"] == 4
    assert got == pytest.approx(want, abs=1e-5)


def test_bad_sequence_layouts_name_the_key():
    from workflow_scripts.training.layout import Layout
    from workflow_scripts.training.models import MODELS
    from workflow_scripts.training.parallel import model_problems, run_problems
    from workflow_scripts.training.strategies import get

    (odd,) = Layout(dp=1, cp=3).problems(MODELS["qwen2-tiny"], "layouts[1]", block_size=64)
    assert odd.startswith("layouts[1].cp: 3 does not divide data.block_size 64")
    (heads,) = model_problems(Layout(dp=1, tp=2, cp=4), "qwen2-tiny", "layouts[0]")
    assert heads.startswith("layouts[0].cp: 4 does not divide the 2 attention heads per tensor-parallel rank")
    (gpt2,) = model_problems(Layout(dp=1, cp=2), "gpt2-tiny", "layouts[0]")
    assert "gpt2-tiny (gpt2) has no Ulysses attention" in gpt2
    both = run_problems(Layout(dp=1, pp=2, cp=2), get("fsdp"), schema.filled("train", {}), "l")
    assert any("cp and pp do not compose" in p for p in both)


def test_ulysses_keeps_documents_apart_as_the_data_parallel_run_does(short_documents, tmp_path):
    """train.separate_documents under cp 2: each shard's positions are its part of the documents' whole-sequence
    positions and the whole-sequence attention is masked by them, as transformers masks the 1D run."""
    _, want = run(short_documents, tmp_path, "fsdp_1d_apart", "qwen2-tiny", "fsdp", {"dp": 1},
                  separate_documents=True, max_steps=4)
    _, got = run(short_documents, tmp_path, "fsdp_cp_apart", "qwen2-tiny", "fsdp", {"dp": 1, "cp": 2},
                 separate_documents=True, max_steps=4)
    assert boundaries(short_documents) > 0.3  # (packed positions change the logits: tests/test_documents.py)
    assert got == pytest.approx(want, abs=1e-5)
