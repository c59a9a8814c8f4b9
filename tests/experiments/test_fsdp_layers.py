"""experiments/fsdp_layers: a layer's host and step cost from the slowest rank's times at two layer counts."""
from __future__ import annotations

import pandas as pd
import pytest


def test_a_layers_cost_is_the_slope_between_layer_counts_of_the_slowest_rank():
    """Per round and variant, the slowest rank's time at each layer count; a layer's cost is the slope between the
    fewest and the most layers (the embedding, head and root unit cancel)."""
    from experiments.fsdp_layers.fsdp_layers import per_layer, summary

    variant = {"ranks": 2, "family": "qwen2", "wrap": "fsdp", "levers": "eager"}
    rows = pd.DataFrame([{"round": r, **variant, "layers": n, "rank": rank, "issue_s": issue + r * 0.004,
                          "step_s": issue + 0.001 + r * 0.004}
                         for r in (0, 1) for n, by_rank in ((2, (0.010, 0.012)), (6, (0.030, 0.028)))
                         for rank, issue in enumerate(by_rank)])
    each = per_layer(rows).set_index("round")
    assert each.loc[0, "issue_s_per_layer_s"] == pytest.approx((0.030 - 0.012) / 4)  # the slower rank each time
    assert each.loc[1, "step_s_per_layer_s"] == pytest.approx((0.035 - 0.017) / 4)
    table = summary(rows).set_index("per layer")
    assert table.loc["issue", "ms"] == pytest.approx(4.5) and table.loc["issue", "rounds"] == 2
