"""ddp_overlap: DDP tuned for communication/computation overlap (bucket size, bucket views, static graph)."""
from workflow_scripts.training.strategies._ddp import DDP_KEYS, DDPEngine, ddp_settings
from workflow_scripts.training.strategies.base import Strategy

DEFAULTS = {"bucket_cap_mb": 100, "gradient_as_bucket_view": True, "static_graph": True}


def _kwargs(ctx):
    return {k: v for k, v in {**DEFAULTS, **ctx.options}.items() if k in DDP_KEYS}


STRATEGY = Strategy(
    name="ddp_overlap", family="ddp", zero_stage=0,
    description="DDP with bucket_cap_mb, gradient_as_bucket_view and static_graph from config",
    settings=lambda ctx: ddp_settings(ctx, _kwargs(ctx)),
    option_keys=DDP_KEYS,
    build=lambda model, ctx: DDPEngine(model, ctx, _kwargs(ctx)),
)
