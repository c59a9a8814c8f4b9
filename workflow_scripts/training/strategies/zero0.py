"""zero0: DeepSpeed ZeRO stage 0 (no partitioning): a consistency check that must match ddp."""
from workflow_scripts.training.strategies._deepspeed import deepspeed_strategy

STRATEGY = deepspeed_strategy("zero0", 0,
                              "DeepSpeed ZeRO stage 0 (no partitioning): a consistency check that must match ddp",
                              in_figures=False, must_match="ddp")
