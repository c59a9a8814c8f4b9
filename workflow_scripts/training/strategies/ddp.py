"""ddp: the baseline, torch DistributedDataParallel with default buckets."""
from workflow_scripts.training.strategies._ddp import DDPEngine, ddp_settings
from workflow_scripts.training.strategies.base import Strategy

STRATEGY = Strategy(
    name="ddp", family="ddp", zero_stage=0,
    description="DistributedDataParallel, default gradient buckets (25 MB)",
    settings=lambda ctx: ddp_settings(ctx, {}),
    option_keys=(),
    build=lambda model, ctx: DDPEngine(model, ctx, {}),
)
