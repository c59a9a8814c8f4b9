"""ep, expert parallelism: transformers' own expert parallelism (`transformers.distributed.expert_parallel`, the
model's `ep_plan`) for the Qwen MoE family.

Each MoE layer's fused expert weights (gate_up_proj [E, 2I, H], down_proj [E, H, I]) become DTensors `Shard(0)`
over mesh "ep": rank r of an ep group holds experts [r E/ep, (r+1) E/ep). Routing stays on every rank (the router
is a dense weight); each (token, expert) pair goes to the rank owning the expert and back through autograd-aware
all-to-alls (`ep_implementation="all_to_all"`, torch's functional collectives).

Expert parallelism adds no ranks: its groups are carved out of the ranks that hold different tokens (dp x cp,
`RunContext.data_mesh`), unflattened to (efsdp, ep): efsdp = dp x cp / ep copies of each expert shard. The
data-parallel dimension wraps each layer's experts first over mesh "efsdp" (FSDP2 for fsdp, composable `replicate`
for the ddp family), then the dense rest over the data mesh as in every layout, which leaves the experts out. An
expert's gradient already holds the tokens of all dp x cp ranks (the all-to-all's backward brings them home), so
it is averaged over dp x cp (the gradient divide factor), not over its efsdp copies.

Not here yet: the router's load-balancing loss (the loop's loss is the LM cross-entropy only, in every layout, so
the 1D run has none either), tensor parallelism of MoE blocks, capacity limits (no token is dropped).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from workflow_scripts.training.models import MODELS
from workflow_scripts.training.parallel import Dimension

if TYPE_CHECKING:  # annotations only: the module is read by every Snakefile parse
    from torch import nn

FAMILIES = ("qwen2_moe",)


def expert_mesh(ctx):
    """(efsdp, ep, ep_tp): the data ranks as ep groups; ep_tp is the size-1 group of ranks sharing a batch
    (transformers' dispatch splits a batch over tensor-parallel peers; MoE blocks have none here)."""
    data = ctx.data_mesh
    return data._unflatten(0, (data.size() // ctx.layout.ep, ctx.layout.ep, 1), ("efsdp", "ep", "ep_tp"))


def experts_modules(model: nn.Module) -> list[nn.Module]:
    return [m for name, m in model.named_modules() if name.endswith("mlp.experts")]


def apply(model: nn.Module, ctx, family: str) -> None:
    """Shard the experts over mesh "ep" and wrap them for the data-parallel dimension (module docstring)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import fully_shard
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    mesh = expert_mesh(ctx)
    model.to(ctx.device)
    apply_expert_parallelism(model, mesh["ep"], mesh["ep_tp"], model._expand_parallel_plan(model.ep_plan),
                             ep_implementation="all_to_all")
    mp = ctx.precision.fsdp_policy()
    wrap = fully_shard if family == "fsdp" else replicate
    layers = experts_modules(model)
    ctx.parallel["ep"] = {"implementation": "transformers.distributed.expert_parallel (all_to_all)",
                          "experts_per_rank": layers[0].gate_up_proj.to_local().shape[0],
                          "expert_copies": mesh["efsdp"].size(), "data_parallel": wrap.__name__}
    for experts in layers:
        wrap(experts, mesh=mesh["efsdp"], mp_policy=mp)
        experts.set_gradient_divide_factor(float(ctx.data_mesh.size()))
        if ctx.backend == "gloo":  # gloo has no pre-multiplied sum: sum, then divide
            experts.set_force_sum_reduction_for_comms(True)


def problems(layout, strategy, train: dict, where: str) -> list[str]:
    if layout.tp > 1:
        return [f"{where}: {layout.key}: ep and tp do not compose yet (MoE blocks have no tensor-parallel plan)"]
    return []


def model_problems(layout, model_name: str, where: str) -> list[str]:
    spec = MODELS.get(model_name)
    if spec is not None and spec.family in FAMILIES:
        return []
    return [f"{where}.ep: {layout.ep}, but {model_name} ({spec.family if spec else None}) has no expert-parallel "
            f"plan here (families: {', '.join(FAMILIES)})"]


DIMENSION = Dimension(key="ep", description="expert parallel: transformers' ep_plan, experts Shard(0) over mesh "
                                            "'ep' carved from dp x cp, all-to-all token dispatch",
                      apply=apply, problems=problems, model_problems=model_problems)
