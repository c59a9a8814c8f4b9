"""The DeepSpeed engine shared by the zero* strategies (built on a rank; its config is made in _deepspeed.py), the
ZeRO++ call counters and DeepSpeed's own compile paths."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from workflow_scripts.training.models import transformer_blocks
from workflow_scripts.training.strategies._deepspeed import OWN_KEYS, ds_settings, gloo_collectives_on_cpu
from workflow_scripts.training.strategies._deepspeed_grad_norm import PER_TENSOR, foreach_grad_norm
from workflow_scripts.training.strategies.engine import Engine, adamw

if TYPE_CHECKING:
    from workflow_scripts.training.run_context import RunContext


# what proves each ZeRO++ part ran, not only that it was configured (qgZ's quantized all-to-all runs only across nodes)
ZEROPP_CALLS = {
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
        gloo_collectives_on_cpu(ctx.platform)
        self.module, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=cfg,
            model_parameters=model.parameters() if optimizer is None else None)
        self.settings = ds_settings(ctx, cfg)
        if zero.get("stage") in (1, 2, 3):
            foreach = ctx.options.get("foreach_grad_norm", OWN_KEYS["foreach_grad_norm"])
            self.settings["grad_norm"] = foreach_grad_norm(self.module.optimizer) if foreach else PER_TENSOR
        self._last = True

    def uncompiled(self):
        return eager_call(self.module.module)

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


@contextlib.contextmanager
def eager_call(module: torch.nn.Module):
    """The module's own forward for the calls inside, not the compiled one `nn.Module.compile` installed
    (`DeepSpeedEngine.compile`): validation under a whole-model compile (Engine.eager_eval). Under DeepCompile it is
    also the only way: its inference graph of GPT-2 fails on an H100 (torch 2.11, DeepSpeed 0.19.8: "expected
    Tensor() for op: torch.ops.aten._scaled_dot_product_cudnn_attention.default"). Training steps stay compiled."""
    compiled, module._compiled_call_impl = module._compiled_call_impl, None
    try:
        yield
    finally:
        module._compiled_call_impl = compiled


def deepspeed_compile_model(engine: Engine, mode: str) -> dict:
    """train.compile_model for DeepSpeed engines: DeepSpeed's own `DeepSpeedEngine.compile` (torch.compile of the
    wrapped module inside the engine, its hooks kept)."""
    engine.module.compile(compile_kwargs={"mode": mode})
    out = {"compile_model": f"DeepSpeedEngine.compile(mode={mode})"}
    if engine.module.is_deepcompile_active():
        out["deepcompile"] = "DeepSpeed's DeepCompile backend for training steps"
    return out


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
