"""What ddp, ddp_overlap and grad_accum share: their settings and their engine (torch DistributedDataParallel +
torch AdamW, _ddp_engine.py, imported on a rank)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from workflow_scripts.training import lazy
from workflow_scripts.training.strategies.base import adamw_settings, batch_settings

if TYPE_CHECKING:
    from workflow_scripts.training.run_context import RunContext

DDP_KEYS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "find_unused_parameters")


def ddp_settings(ctx: RunContext, ddp_kwargs: dict) -> dict:
    engine = ("torch.nn.parallel.DistributedDataParallel" if ctx.world_size > 1 else
              "the model itself: one rank, no DistributedDataParallel wrapper (its all-reduce would be the identity)")
    return {"engine": engine, "ddp": ddp_kwargs, **batch_settings(ctx),
            "no_sync_on_accumulation": ctx.accum > 1, "optimizer": adamw_settings(ctx)}


DDPEngine = lazy.part(f"{__package__}._ddp_engine", "DDPEngine")  # (model, ctx, ddp_kwargs) -> the engine
