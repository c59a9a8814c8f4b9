"""grad_accum: DDP with high gradient accumulation, no_sync() on all but the last micro-step.

`accum_steps` (default 8) micro-steps per optimizer step; with `keep_effective_batch` (default true) the
micro-batch shrinks so micro x accum x world equals the other strategies' effective batch.
"""
from workflow_scripts.training.strategies._ddp import DDPEngine, ddp_settings
from workflow_scripts.training.strategies.base import Strategy


def accumulation(options: dict) -> tuple[int, bool]:
    """(accumulation steps, keep the effective batch): the one place of their defaults."""
    return int(options.get("accum_steps", 8)), bool(options.get("keep_effective_batch", True))


STRATEGY = Strategy(
    name="grad_accum", family="ddp", zero_stage=0,
    description="DDP, high gradient accumulation with no_sync() on all but the last micro-step",
    settings=lambda ctx: ddp_settings(ctx, {}),
    option_keys=("accum_steps", "keep_effective_batch"),
    build=lambda model, ctx: DDPEngine(model, ctx, {}),
    accumulation=accumulation,
)
