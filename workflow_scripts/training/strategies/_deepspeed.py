"""The zero* strategies' DeepSpeed config: one function builds the exact JSON config (the engine, built on a rank, is
in _deepspeed_engine.py).

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

from workflow_scripts.training import lazy
from workflow_scripts.training.precision import POLICIES
from workflow_scripts.training.strategies.base import Strategy, adamw_settings

if TYPE_CHECKING:
    from workflow_scripts.training.run_context import RunContext


def ds_config(ctx: RunContext, zero: dict, extra: dict, bf16_mode: bool) -> dict:
    """DeepSpeed's JSON. `bf16_mode`: whether DeepSpeed runs its own bf16 optimizer (the `bf16` section), as the
    strategy's engine_precision decides."""
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
    if bf16_mode:
        cfg["bf16"] = {"enabled": True}
    elif p.autocast_bf16:
        # DeepSpeed turns an outer torch.autocast off inside its engine: enable its own, with fp32 gradient
        # communication for every module (no lower-precision-safe modules), i.e. exactly what DDP does
        cfg["torch_autocast"] = {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    if zero.get("offload_optimizer", {}).get("device", "none") != "none":
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": ctx.lr, "betas": list(ctx.betas), "eps": ctx.eps,
                                                        "weight_decay": ctx.weight_decay}}
    cfg.update(extra)
    return cfg


def ds_settings(ctx: RunContext, cfg: dict) -> dict:
    optimizer = ("deepspeed DeepSpeedCPUAdam (AdamW mode)" if "optimizer" in cfg else adamw_settings(ctx)["impl"])
    detail = ctx.precision.detail
    if ctx.precision.autocast_bf16 and "bf16" in cfg:
        detail = ("differs: " + POLICIES["bf16-pure"].detail
                  + " (DeepSpeed refuses torch_autocast with quantized weights)")
    out = {"engine": "deepspeed.initialize", "deepspeed_config": cfg, "precision": ctx.precision.name,
           "precision_detail": detail, "optimizer": {**adamw_settings(ctx), "impl": optimizer}}
    if ctx.device.type == "cpu":
        out["collectives"] = CPU_COLLECTIVES
    return out


CPU_COLLECTIVES = "torch.distributed over gloo, as DDP and FSDP2 (DeepSpeed's shared-memory all-reduce op off)"


def gloo_collectives_on_cpu(platform: str) -> None:
    """On CPU, DeepSpeed's collectives stay on torch's gloo, where DDP's and FSDP2's run: its CPU accelerator would
    otherwise swap in its own shared-memory all-reduce (another collective implementation for one family only, and
    a C++ op to compile on every new machine). Call before DeepSpeed's comm starts (deepspeed.initialize,
    deepspeed.comm.init_distributed): DeepSpeed builds that op only where its compatibility table allows it."""
    if platform != "cpu":
        return
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


DeepSpeedEngine = lazy.part(f"{__package__}._deepspeed_engine", "DeepSpeedEngine")  # (model, ctx, cfg) -> the engine
deepspeed_compile_model = lazy.part(f"{__package__}._deepspeed_engine", "deepspeed_compile_model")
zero3_compile_blocks = lazy.part(f"{__package__}._deepspeed_engine", "zero3_compile_blocks")


TOP_LEVEL_KEYS = ("communication_data_type", "aio", "prescale_gradients", "gradient_predivide_factor", "compile")
# `compile` is DeepSpeed's section for DeepSpeedEngine.compile (train.compile_model): {deepcompile: true} takes its
# DeepCompile backend, which puts ZeRO's gradient reduction (stages 1-2) or parameter gathers (stage 3) into the
# compiled graph instead of per-parameter hooks; its op (dc) builds against CUDA's headers: GPU runs only.
# keys of DeepSpeed's `bf16` section, which exists where DeepSpeed runs its own bf16 optimizer (bf16-pure; ZeRO++).
# check_grad_overflow: false drops the per-tensor inf/NaN checks of its ZeRO-1/2 step (Python-level launches per
# gradient tensor, host-bound) and with them the skip of a step whose gradients are not finite.
BF16_KEYS = ("check_grad_overflow",)
# ZeRO-3 with compiled blocks (each a leaf module: zero3_compile_blocks) or its whole model compiled by
# DeepSpeedEngine.compile (train.compile_model without DeepCompile): DeepSpeed's memory-efficient linear off.
# Its zero.Init replaces torch.nn.functional.linear with an autograd Function whose backward re-gathers a released
# weight. Traced into a compiled block on a GPU it guards on each weight's ds_id, so every block recompiles, past
# torch's limit of 8 the rest run eager, and no parameter of the 8 compiled blocks gets a gradient (DeepSpeed's leaf
# hook reduces zeros for all 16 of each, ViT-Huge on an H100); the whole model compiled that way leaves all 514
# parameters without one. A leaf block's parameters are gathered for its backward by the hooks on the block, and the
# compiled model's by DeepSpeed's hooks on each submodule, so torch's own linear is all they need. GPT-2's blocks
# (Conv1D) never call it. DeepCompile, DeepSpeed's own compiler, keeps DeepSpeed's default: it runs torch's linear and
# trains ViT-Huge on plain ZeRO-3's losses, as GPT-2 on DDP's.
COMPILED_ZERO3_KEYS = {"memory_efficient_linear": False}


def traced_ds_linear(applied: dict | None, family: str) -> bool:
    """Whether a recorded run (its strategy_settings.json) compiled ZeRO-3 leaf blocks with DeepSpeed's linear traced
    into them: leaf blocks without COMPILED_ZERO3_KEYS' setting, in a model family whose blocks call F.linear (all but
    GPT-2's Conv1D). Such a run has 8 blocks compiled and without gradients, the rest eager: neither lever set, nor
    the strategy's arithmetic."""
    harness = (applied or {}).get("harness") or {}
    zero = ((applied or {}).get("deepspeed_config") or {}).get("zero_optimization") or {}
    return bool(harness.get("zero3_leaf_modules")) and zero.get("memory_efficient_linear", True) and family != "gpt2"
# ZeRO-1/2/3's options of ours, not DeepSpeed's (with their defaults): foreach_grad_norm, the gradient norm before the
# clip in multi-tensor launches instead of 2-3 per parameter tensor (_deepspeed_grad_norm.py; false: DeepSpeed's)
OWN_KEYS = {"foreach_grad_norm": True}


def asks_deepcompile(options: dict) -> bool:
    """Whether a strategy's options take DeepSpeed's DeepCompile backend (its `compile` section)."""
    return bool((options.get("compile") or {}).get("deepcompile"))


def option_ops(options: dict) -> tuple:
    """DeepSpeed op builders a strategy's options add to its own (Strategy.ops): DeepCompile's dc op."""
    return ("DeepCompileBuilder",) if asks_deepcompile(options) else ()


def deepcompile_refused(strategy: str, options: dict, platform: str) -> str | None:
    """Why a run cannot take DeepSpeed's DeepCompile backend on this platform; None where it can or is not asked."""
    if platform == "cpu" and asks_deepcompile(options):
        return (f"strategy_options.{strategy}.compile.deepcompile: DeepSpeed's DeepCompile op includes CUDA's "
                "headers; it runs on GPUs only")
    return None


def no_bf16_section(strategy: str, key: str, where: str, precision: str) -> str:
    """The one error for a bf16-section option where the run has no bf16 section (config_check, the engine)."""
    return (f"strategy_options.{strategy}.{key}: DeepSpeed has a bf16 section only under bf16-pure, but {where} is "
            f"{precision}")


def split_options(options: dict, consumes: tuple = ()) -> tuple[dict, dict, dict]:
    """The user's `strategy_options.<name>` by where DeepSpeed reads them: (its top level, its bf16 section,
    zero_optimization). The keys in `consumes` are the strategy's own (e.g. nvme_path) and go to none."""
    rest = {k: v for k, v in options.items() if k not in consumes}
    top = {k: rest.pop(k) for k in TOP_LEVEL_KEYS if k in rest}
    bf16 = {k: rest.pop(k) for k in BF16_KEYS if k in rest}
    return top, bf16, rest


def check_context(options: dict) -> RunContext:
    """A stand-in run context for checking options before any job: what a strategy's fixed zero keys are computed
    from (CPU, one rank, a placeholder work_dir), with `options` as its section of strategy_options."""
    import torch

    from workflow_scripts.training.layout import Layout
    from workflow_scripts.training.precision import policy
    from workflow_scripts.training.run_context import RunContext

    return RunContext(rank=0, local_rank=0, local_world_size=1, device=torch.device("cpu"), platform="cpu",
                      layout=Layout(dp=1), precision=policy("fp32"), micro_batch=1, accum=1, lr=1e-3,
                      weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, grad_clip=1.0, seed=0, work_dir="work",
                      options=dict(options))


def _keys(model) -> dict:
    """Every key a pydantic model accepts, its fields' names and aliases, -> the field."""
    out = {}
    for name, f in model.model_fields.items():
        out[name] = f
        if f.alias:
            out[f.alias] = f
    return out


def _submodel(field):
    """The pydantic model a field holds (X or Optional[X]), or None."""
    import typing

    import pydantic

    for t in (field.annotation, *typing.get_args(field.annotation)):
        if isinstance(t, type) and issubclass(t, pydantic.BaseModel):
            return t
    return None


def model_problems(where: str, model, data: dict) -> list[str]:
    """`data` validated by DeepSpeed's pydantic `model` (extra keys forbidden): one line per error, naming
    `where.<dotted key>` as the user wrote it, with the closest key for an unknown one."""
    import pydantic

    from workflow_scripts.schema import unknown_key

    try:
        model(**data)
        return []
    except pydantic.ValidationError as exc:
        errors = exc.errors()
    out = []
    for e in errors:
        owner, parts = model, []
        for part in e["loc"][:-1]:
            parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
            field = _keys(owner).get(part) if owner is not None and isinstance(part, str) else None
            owner = _submodel(field) if field is not None else None
        at = where + "".join(parts)
        if e["type"] == "extra_forbidden" and owner is not None:
            out.append(unknown_key(at, e["loc"][-1], _keys(owner)))
            continue
        if e["loc"]:
            last = e["loc"][-1]
            at += f"[{last}]" if isinstance(last, int) else f".{last}"
        message = e["msg"][:1].lower() + e["msg"][1:]
        if e["loc"] and not isinstance(e.get("input"), dict):
            got = repr(e.get("input"))
            message += f", got {got if len(got) <= 60 else got[:57] + '...'}"
        out.append(f"{at}: {message}")
    return out


def deepspeed_strategy(name: str, stage: int, description: str, zero: dict | None = None,
                       extra=lambda ctx: {}, consumes: tuple = (), quantized_weights: bool = False,
                       **strategy_kwargs) -> Strategy:
    """A ZeRO strategy. `zero`: its fixed zero_optimization keys (or a function of the context); `extra`: its
    fixed top-level keys; `quantized_weights`: ZeRO++'s qwZ on by default (zero_quantized_weights), under which
    DeepSpeed refuses torch_autocast and runs its own bf16 mode for bf16-mixed too (engine_precision). The user's
    `strategy_options.<name>` override both: TOP_LEVEL_KEYS go to the top level,
    BF16_KEYS to the bf16 section, the keys in `consumes` are the strategy's own (e.g. nvme_path), everything else
    into zero_optimization (split_options). Before any job, `option_problems` checks them against DeepSpeed's
    own config models."""

    quantized = {"zero_quantized_weights": True} if quantized_weights else {}
    own_unsupported = strategy_kwargs.pop("unsupported", lambda ctx: None)
    own = tuple(OWN_KEYS) if stage in (1, 2, 3) else ()
    consumes = tuple(consumes) + own

    def zero_section(ctx: RunContext) -> dict:
        fixed = zero(ctx) if callable(zero) else (zero or {})
        leaf = COMPILED_ZERO3_KEYS if stage == 3 and ctx.compiled and not asks_deepcompile(ctx.options) else {}
        return {"stage": stage, **quantized, **leaf, **fixed, **split_options(ctx.options, consumes)[2]}

    def engine_precision(precision: str, options: dict) -> str:
        weights = split_options(options, consumes)[2].get("zero_quantized_weights", quantized_weights)
        return "bf16-pure" if precision == "bf16-mixed" and weights else precision

    def config(ctx: RunContext) -> dict:
        top, bf16, _ = split_options(ctx.options, consumes)
        cfg = ds_config(ctx, zero_section(ctx), {**extra(ctx), **top},
                        bf16_mode=engine_precision(ctx.precision.name, ctx.options) == "bf16-pure")
        if bf16 and "bf16" not in cfg:
            raise ValueError(no_bf16_section(name, next(iter(bf16)), "this run's train.precision", ctx.precision.name))
        cfg.get("bf16", {}).update(bf16)
        return cfg

    def option_problems(options: dict) -> list[str]:
        """The zero_optimization section this strategy would build from `options` (its fixed keys, stage
        included, and the user's) through DeepSpeed's DeepSpeedZeroConfig, and the bf16 keys through its
        DeepSpeedBF16Config. deepspeed is imported only when there is a user key for either to check."""
        top, bf16, rest = split_options(options, consumes)
        where = f"strategy_options.{name}"
        mine = [f"{where}.{k}: expected true or false, got {options[k]!r}" for k in own
                if k in options and not isinstance(options[k], bool)]
        if isinstance(top.get("compile"), dict):
            from deepspeed.compile.config import CompileConfig

            mine += model_problems(f"{where}.compile", CompileConfig, top["compile"])
        elif "compile" in top:
            mine.append(f"{where}.compile: expected a mapping of DeepSpeed's compile keys, got {top['compile']!r}")
        if not bf16 and not rest:
            return mine
        from deepspeed.runtime.precision_config import DeepSpeedBF16Config
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        out = mine + (model_problems(where, DeepSpeedBF16Config, {"enabled": True, **bf16}) if bf16 else [])
        if not rest:
            return out
        try:
            section = zero_section(check_context(options))
        except (TypeError, ValueError) as exc:  # a fixed key computed from a bad option (zeropp's int()): the
            # model on the user's keys alone names the option; failing that, the error as it is
            return (model_problems(where, DeepSpeedZeroConfig, {"stage": stage, **rest}) or [f"{where}: {exc}"]) + out
        return model_problems(where, DeepSpeedZeroConfig, section) + out

    if stage == 3:
        strategy_kwargs.setdefault("compile_blocks", zero3_compile_blocks)
    strategy_kwargs.setdefault("compile_model", deepspeed_compile_model)
    def unsupported(ctx: RunContext) -> str | None:
        return deepcompile_refused(name, ctx.options, ctx.platform) or own_unsupported(ctx)

    return Strategy(name=name, family="deepspeed", zero_stage=stage, description=description,
                    settings=lambda ctx: ds_settings(ctx, config(ctx)), option_problems=option_problems,
                    engine_precision=engine_precision, unsupported=unsupported,
                    build=lambda model, ctx: DeepSpeedEngine(model, ctx, config(ctx)), **strategy_kwargs)
