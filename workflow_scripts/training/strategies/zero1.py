"""zero1: DeepSpeed ZeRO-1: optimizer states partitioned."""
from workflow_scripts.training.strategies._deepspeed import deepspeed_strategy

STRATEGY = deepspeed_strategy("zero1", 1, "DeepSpeed ZeRO-1: optimizer states partitioned")
