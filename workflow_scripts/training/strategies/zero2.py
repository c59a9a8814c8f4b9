"""zero2: DeepSpeed ZeRO-2: optimizer states and gradients partitioned."""
from workflow_scripts.training.strategies._deepspeed import deepspeed_strategy

STRATEGY = deepspeed_strategy("zero2", 2, "DeepSpeed ZeRO-2: optimizer states and gradients partitioned")
