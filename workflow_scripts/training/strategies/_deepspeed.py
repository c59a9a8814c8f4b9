"""The DeepSpeed engine shared by the zero* strategies: one function builds the exact JSON config.

The batch keys are computed from the run context (micro x accumulation x world size), so DeepSpeed's
`train_batch_size` assertion cannot fire. Precision follows the study's policy:
  fp32       -> no fp16/bf16 section;
  bf16-mixed -> fp32 engine, DeepSpeed's `torch_autocast` (bf16 compute, fp32 parameters and gradients, fp32
                gradient communication), the same as the loop's torch.autocast for DDP and FSDP; ZeRO++ quantized
                weights refuse torch_autocast, so zeropp runs DeepSpeed bf16 there (recorded in its settings);
  bf16-pure  -> `bf16.enabled`: bf16 module parameters, fp32 master weights in the ZeRO optimizer.
The optimizer is the same torch AdamW as DDP's, except with optimizer offload, where DeepSpeed needs its
DeepSpeedCPUAdam (config `optimizer: AdamW`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from workflow_scripts.training.models import transformer_blocks
from workflow_scripts.training.precision import POLICIES
from workflow_scripts.training.strategies.base import Engine, Strategy, adamw, adamw_settings

if TYPE_CHECKING:
    from workflow_scripts.training.context import RunContext


def ds_config(ctx: RunContext, zero: dict, extra: dict | None = None) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": ctx.micro_batch,
        "gradient_accumulation_steps": ctx.accum,
        "train_batch_size": ctx.effective_batch,
        "gradient_clipping": ctx.grad_clip,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    p = ctx.precision
    if p.bf16_params or (p.autocast_bf16 and zero.get("zero_quantized_weights")):
        cfg["bf16"] = {"enabled": True}  # DeepSpeed refuses torch_autocast with ZeRO++ quantized weights
    elif p.autocast_bf16:
        # DeepSpeed turns an outer torch.autocast off inside its engine: enable its own, with fp32 gradient
        # communication for every module (no lower-precision-safe modules), i.e. exactly what DDP does
        cfg["torch_autocast"] = {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    if zero.get("offload_optimizer", {}).get("device", "none") != "none":
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": ctx.lr, "betas": list(ctx.betas), "eps": ctx.eps,
                                                        "weight_decay": ctx.weight_decay}}
    cfg.update(extra or {})
    return cfg


def ds_settings(ctx: RunContext, cfg: dict) -> dict:
    optimizer = ("deepspeed DeepSpeedCPUAdam (AdamW mode)" if "optimizer" in cfg else adamw_settings(ctx)["impl"])
    detail = ctx.precision.detail
    if ctx.precision.autocast_bf16 and "bf16" in cfg:
        detail = ("differs: " + POLICIES["bf16-pure"].detail
                  + " (DeepSpeed refuses torch_autocast with quantized weights)")
    return {"engine": "deepspeed.initialize", "deepspeed_config": cfg, "precision": ctx.precision.name,
            "precision_detail": detail, "optimizer": {**adamw_settings(ctx), "impl": optimizer}}


ZEROPP_CALLS = {  # what proves each ZeRO++ part ran, not only that it was configured (STUDY.md: qgZ engages across nodes)
    "qwZ quantize (CUDAQuantizer.quantize)": ("deepspeed.runtime.zero.partition_parameters", "CUDAQuantizer",
                                             "quantize"),
    "qgZ all_to_all_quant_reduce": ("deepspeed.runtime.zero.stage3", None, "all_to_all_quant_reduce"),
    "hpZ secondary partition (Init._partition_param_sec)": ("deepspeed.runtime.zero.partition_parameters", "Init",
                                                            "_partition_param_sec"),
}


def count_zeropp_calls(counts: dict) -> None:
    """Wrap DeepSpeed's ZeRO++ entry points with call counters (into `counts`, read into the run's summary)."""
    import functools
    import importlib

    for label, (module_name, owner_name, attr) in ZEROPP_CALLS.items():
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        original = getattr(owner, attr)
        if getattr(original, "_counted", False):
            continue
        counts[label] = 0

        @functools.wraps(original)
        def counted(*args, _original=original, _label=label, **kwargs):
            counts[_label] += 1
            return _original(*args, **kwargs)

        counted._counted = True
        setattr(owner, attr, counted)


class DeepSpeedEngine(Engine):
    def __init__(self, model: torch.nn.Module, ctx: RunContext, cfg: dict):
        import deepspeed

        super().__init__(ctx)
        zero = cfg.get("zero_optimization", {})
        if any(zero.get(k) for k in ("zero_quantized_weights", "zero_quantized_gradients", "zero_hpz_partition_size")):
            count_zeropp_calls(ctx.parallel.setdefault("zeropp_calls", {}))
        optimizer = None if "optimizer" in cfg else adamw(model.parameters(), ctx)
        self.module, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=cfg,
            model_parameters=model.parameters() if optimizer is None else None)
        self.settings = ds_settings(ctx, cfg)
        self._last = True

    def micro_step(self, last: bool):
        self._last = last
        return super().micro_step(last)

    def backward(self, loss: torch.Tensor) -> None:
        self.module.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps itself
        if not self._last:
            self.module.step()  # bookkeeping only: the engine steps the optimizer at the accumulation boundary

    def optimizer_step(self, lr: float) -> None:
        for group in self.module.optimizer.param_groups:
            group["lr"] = lr
        self.module.step()

    def save(self, path: str) -> None:
        self.module.save_checkpoint(path, tag="ckpt")

    def load(self, path: str) -> None:
        self.module.load_checkpoint(path, tag="ckpt")


def zero3_compile_blocks(model: torch.nn.Module, mode: str) -> dict:
    """train.compile_blocks under ZeRO-3, whose parameter hooks on every submodule would break a compiled block
    into pieces: each block becomes a ZeRO-3 leaf module (its parameters gathered together by hooks on the
    block) and only the block's forward is compiled, so the hooks run between compiled blocks, not inside."""
    from deepspeed.utils import set_z3_leaf_modules

    layers = transformer_blocks(model)
    set_z3_leaf_modules(model, [type(layers[0])])
    for block in layers:
        block.forward = torch.compile(block.forward, mode=mode)
    return {"zero3_leaf_modules": type(layers[0]).__name__}


TOP_LEVEL_KEYS = ("communication_data_type", "aio", "prescale_gradients", "gradient_predivide_factor")
# keys of DeepSpeed's `bf16` section, which exists where DeepSpeed runs its own bf16 optimizer (bf16-pure; ZeRO++).
# check_grad_overflow: false drops the per-tensor inf/NaN checks of its ZeRO-1/2 step (a host-bound part of it:
# results/bench_harness/h100-zero2-profile) and with them the skip of a step whose gradients are not finite.
BF16_KEYS = ("check_grad_overflow",)


def deepspeed_strategy(name: str, stage: int, description: str, zero: dict | None = None,
                       extra=lambda ctx: {}, consumes: tuple = (), **strategy_kwargs) -> Strategy:
    """A ZeRO strategy. `zero`: its fixed zero_optimization keys (or a function of the context); `extra`: its
    fixed top-level keys. The user's `strategy_options.<name>` override both: TOP_LEVEL_KEYS go to the top level,
    the keys in `consumes` are the strategy's own (e.g. nvme_path), everything else into zero_optimization."""

    def config(ctx: RunContext) -> dict:
        options = {k: v for k, v in ctx.options.items() if k not in consumes}
        top = {**extra(ctx), **{k: options.pop(k) for k in TOP_LEVEL_KEYS if k in options}}
        bf16 = {k: options.pop(k) for k in BF16_KEYS if k in options}
        fixed = zero(ctx) if callable(zero) else (zero or {})
        cfg = ds_config(ctx, {"stage": stage, **fixed, **options}, top)
        if bf16 and "bf16" not in cfg:
            raise ValueError(f"strategy_options.{name}.{next(iter(bf16))}: DeepSpeed has a bf16 section only under "
                             f"train.precision bf16-pure (this run: {ctx.precision.name})")
        cfg.get("bf16", {}).update(bf16)
        return cfg

    if stage == 3:
        strategy_kwargs.setdefault("compile_blocks", zero3_compile_blocks)
    return Strategy(name=name, family="deepspeed", zero_stage=stage, description=description,
                    settings=lambda ctx: ds_settings(ctx, config(ctx)),
                    build=lambda model, ctx: DeepSpeedEngine(model, ctx, config(ctx)), **strategy_kwargs)
