"""train.separate_documents: the documents packed into one block stay apart (positions from 0 after each EOS, no
attention across a boundary), worked by hand and checked on the models: a document's logits inside a packed block
are its logits alone."""
from __future__ import annotations

import pytest
import torch

from workflow_scripts.training.models import build_model
from workflow_scripts.training.strategies._deepspeed import check_context
from workflow_scripts.training.strategies.engine import document_positions, model_inputs

EOS = 9


def test_positions_start_again_after_each_eos():
    ids = torch.tensor([[5, 9, 7, 8, 9, 3], [1, 2, 3, 4, 5, 9]])
    assert document_positions(ids, EOS).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]


def test_the_model_is_given_positions_only_when_documents_are_kept_apart():
    ctx = check_context({})
    tokens = torch.tensor([[5, 9, -8, 8]])  # a context-only token is stored as -(id + 1)
    assert set(model_inputs(tokens, ctx)) == {"input_ids"}
    ctx.document_eos = EOS
    given = model_inputs(tokens, ctx)
    assert given["input_ids"].tolist() == [[5, 9, 7, 8]] and given["position_ids"].tolist() == [[0, 1, 0, 1]]


@pytest.mark.parametrize("model", ["gpt2-tiny", "qwen2-tiny"])
def test_a_document_in_a_packed_block_sees_only_itself(model):
    """Absolute (GPT-2) and rotary (Qwen2) positions alike: the second document's logits in the block equal its
    logits alone; without the positions they do not (it attends to the first document)."""
    torch.manual_seed(0)
    m = build_model(model, 64, 32, attn_implementation="sdpa").eval()
    m.config.use_cache = False  # as batches.make_model: a cache would turn the packed mask off
    first, second = [3, 4, 5, 6, EOS], [7, 8, 10, 11, 12, 13]
    block = torch.tensor([first + second])
    ctx = check_context({})
    ctx.document_eos = EOS
    with torch.no_grad():
        packed = m(**model_inputs(block, ctx)).logits[0, len(first):]
        alone = m(input_ids=torch.tensor([second])).logits[0]
        joined = m(input_ids=block).logits[0, len(first):]
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    assert (joined - alone).abs().max() > 1e-3
