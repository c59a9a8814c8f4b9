"""experiments/tensor_parallel: a real block's and its clip's tensor-parallel cost in units of the lone pair's."""
from __future__ import annotations

import pandas as pd
import pytest


def test_the_block_and_the_clip_are_priced_in_pairs_of_the_slowest_rank():
    """tp_block.shares on hand-made rounds of 4 layers of a Qwen2 block (7 split linears each: q, k, v, o, gate, up,
    down): rank 1 is the slower one in every phase, so its times are the step's."""
    from experiments.tensor_parallel.tp_block import shares

    def phases(layout, rank):
        slow = 0.001 * rank  # rank 1 a millisecond slower in each phase
        if layout == "dp2":
            return {"forward": 0.010 + slow, "backward": 0.020 + slow, "clip": 0.002 + slow}
        return {"forward": 0.024 + slow, "backward": 0.034 + slow, "clip": 0.006 + slow}

    step = pd.DataFrame([{"ranks": 2, "outer": 0, "round": r, "layout": layout, "rank": rank, **phases(layout, rank)}
                         for r in (0, 1) for layout in ("dp2", "tp2") for rank in (0, 1)])
    # pair_s: the calibration's pair of linears (two linears), the slower rank's
    host = pd.DataFrame([{"ranks": 2, "outer": 0, "round": r, "variant": v, "rank": rank,
                          "pair_s": s + 0.0002 * rank}
                         for r in (0, 1) for v, s in (("plain", 0.0010), ("tp", 0.0020)) for rank in (0, 1)])
    row = shares(host, step).set_index("ranks").loc[2]
    # forward + backward: tp2 - dp2 = 0.028 s over 4 x 7 linears = 1,000 us; clip: 0.004 s over 4 layers = 1,000 us;
    # the pair: (0.0022 - 0.0012) s over its two linears = 500 us
    assert row["block_us"] == pytest.approx(1000.0) and row["clip_us_layer"] == pytest.approx(1000.0)
    assert row["pair_us"] == pytest.approx(500.0)
    assert row["block_over_pair"] == pytest.approx(2.0) and row["clip_over_pair"] == pytest.approx(2.0)
