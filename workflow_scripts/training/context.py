"""The run context built from the run spec in one place, for the training loop, the launcher (settings and
platform checks before any rank starts) and the Trainer baseline; the record itself is training/run_context.py
(which the strategies read, so the registry imported here never imports back).

The launcher's view (no rank) is built without importing torch: its device is None until a strategy's settings
need one (`with_device`); rank 0 reads the provenance facts that need torch (measure/provenance.torch_facts). A
run's launcher then never imports torch: 1.1-1.4 s before its ranks start and as much after they end, a run on a
2-core machine (every test that trains, and the default study's 12 runs).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from workflow_scripts.run_spec import RunSpec
from workflow_scripts.training.layout import Layout
from workflow_scripts.training.precision import policy
from workflow_scripts.training.run_context import RunContext
from workflow_scripts.training.strategies import get as get_strategy

if TYPE_CHECKING:
    import torch


def process_env(platform: str) -> tuple[int, int, int, int, torch.device]:
    """(rank, local rank, world size, local world size, device) of this torchrun process; selects its GPU."""
    import torch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if platform == "cpu":
        return rank, local_rank, world, local_world, torch.device("cpu")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return rank, local_rank, world, local_world, device


def init_distributed(spec: Mapping) -> RunContext:
    """Join the process group (gloo on CPU, NCCL/RCCL on GPU) and return this rank's context."""
    import torch.distributed as dist

    spec = RunSpec.of(spec)
    rank, local_rank, world, local_world, device = process_env(spec.platform)
    ctx = from_spec(spec, rank, local_rank, local_world, device)
    dist.init_process_group(backend=ctx.backend, device_id=device if device.type == "cuda" else None)
    if ctx.world_size != world:
        raise ValueError(f"layout {ctx.layout.key} needs {ctx.world_size} ranks, torchrun started {world}")
    return ctx


def from_spec(spec: Mapping, rank: int = 0, local_rank: int = 0, local_world: int | None = None,
              device: torch.device | None = None) -> RunContext:
    """The context of one rank, read from the run spec's fields (workflow_scripts/run_spec.py); without a rank (the
    launcher, before any rank starts) that of rank 0, without a device (`with_device` gives it rank 0's)."""
    spec = RunSpec.of(spec)
    t = spec.train
    layout = Layout(**spec.layout)
    if local_world is None:
        local_world = layout.world_size // spec.nodes
    strategy = get_strategy(spec.strategy)
    consumed = strategy.option_keys if strategy.accumulation is not None else ()  # the split read them
    options = {k: v for k, v in spec.options.items() if k not in consumed}
    return RunContext(rank=rank, local_rank=local_rank, local_world_size=local_world, device=device,
                      platform=spec.platform, layout=layout, precision=policy(spec.precision),
                      micro_batch=spec.micro_batch, accum=spec.accum, lr=t["lr"], weight_decay=t["weight_decay"],
                      betas=tuple(t["betas"]), eps=t["eps"], grad_clip=t["grad_clip"], seed=t["seed"],
                      work_dir=spec.work_dir, options=options, pipeline_schedule=t["pipeline_schedule"])


def with_device(ctx: RunContext) -> RunContext:
    """The launcher's view with rank 0's device, for what reads it (a strategy's settings: its optimizer's kind)."""
    if ctx.device is not None:
        return ctx
    import torch

    return dataclasses.replace(ctx, device=torch.device("cpu") if ctx.platform == "cpu" else torch.device("cuda", 0))
