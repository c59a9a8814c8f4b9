"""zero2_compress: ZeRO-2 with reduced-precision gradient communication.

What it compresses: DeepSpeed's `communication_data_type` (default bf16 here) casts the gradients for the
reduce-scatter/all-reduce of ZeRO-2 to that type, halving the bytes on the wire when the study trains with fp32
gradients (fp32 or bf16-mixed precision). Parameters, optimizer states and the update stay in their precision.
Nothing else is compressed: 1-bit Adam, 0/1 Adam and 1-bit LAMB refuse every ZeRO stage, and ZeRO++ quantized
gradients exist only at stage 3 (see `zeropp`). Under bf16-pure the gradients are bf16 already, so this variant
only differs from zero2 if `communication_data_type` is set lower (fp16).
"""
from workflow_scripts.training.strategies._deepspeed import deepspeed_strategy

STRATEGY = deepspeed_strategy("zero2_compress", 2, "ZeRO-2, gradients communicated in bf16 (communication_data_type)",
                              extra=lambda ctx: {"communication_data_type": "bf16"})
