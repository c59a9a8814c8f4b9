"""zero3: DeepSpeed ZeRO-3: parameters, gradients and optimizer states partitioned."""
from workflow_scripts.training.strategies._deepspeed import deepspeed_strategy

STRATEGY = deepspeed_strategy("zero3", 3, "DeepSpeed ZeRO-3: parameters, gradients and optimizer states partitioned")
