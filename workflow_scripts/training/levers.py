"""Compile levers: speed-ups applied to the model and the loss before a strategy wraps the model, the same way for
every strategy that is compatible with them (config `train.compile_blocks`, `train.compile_loss`).

- compile_blocks: `torch.compile` of each transformer block in place (`nn.Module.compile`) before the strategy
  wraps the model, the unit FSDP shards and DDP buckets around, so gradient communication still overlaps block by
  block (ZeRO-3 makes each block a leaf module and compiles its forward: the strategy's `compile_blocks`).
  Embeddings, the final norm and the LM head stay eager. Whole-block recomputation wraps the compiled block (HF's
  non-reentrant checkpoint recomputes the compiled forward); selective recomputation lies inside it
  (training/recompute.py).
- compile_model (false unless set): the whole model compiled around the strategy's wrapper after the engine is built
  (`torch.compile(DDP(model))`, FSDP2's root module, DeepSpeed's `engine.compile`): a few compiled regions per step
  instead of one per block; with `compile_mode: reduce-overhead` they replay as CUDA graphs. Replaces
  compile_blocks; data-parallel layouts only (config_check).
- compile_loss: the next-token cross-entropy compiled: the bf16 logits are upcast inside one fused kernel instead
  of materialising an fp32 copy of the (batch x sequence x vocabulary) logits and their gradient.

Both default to `auto` (resolve, called when the study resolves a run spec), decided by a rule or by a measurement
(config `auto_levers.by`, decided_by: its default `auto` measures on a one-node GPU study, keeps the rule on CPU). The
rule: on a GPU platform they are on, the fast path; off on CPU (compilation costs
more than it saves there), where a block call is too small for compilation to pay (MIN_BLOCK_FLOPS: the step is
host-bound there), under layout dimensions whose compiled runs were not checked on a GPU yet
(parallel.Dimension.compiled_on_gpu), and for MoE models (grouped_mm experts). The measurement: before a
configuration's timed repeats, a few steps of each candidate lever set (CANDIDATES, whole-model compile and CUDA
graphs among them) on the study's own machine and shape (rule lever_trial, job/lever_trial.py); the launcher
applies the fastest (apply_trial). A trial's decision is kept in the machine's cache (machine_cache()/lever_decisions,
keyed by the device, the software versions and the configuration's shape: job/lever_trial.py), so a second study of
the same shapes on the same machine and versions decides without a trial; candidates the rule knows cannot win are
left out (trial_candidates), and where one is left nothing is launched: the run falls back by itself if it fails
(apply_fallback). The trial and the timed runs compile into the same on-disk inductor and Triton caches
(build_ops.compile_caches, set by the launcher for every rank), so a timed run loads what its trial compiled. Either
way the run spec records what the run does and why (`compile_auto`).
`true` / `false` force them. `train.compile_mode` is torch.compile's mode for all of them (e.g.
max-autotune-no-cudagraphs: Triton matmul autotuning, minutes of compilation). What a run used is recorded in its
`strategy_settings.json` under `harness`. A family's capabilities (vision, MoE) are its models' fields
(training/models.FAMILIES).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from workflow_scripts.training.models import FAMILIES

if TYPE_CHECKING:  # annotations only: the module is read by every Snakefile parse
    import torch

_compiled_loss = None
LEVERS = ("compile_blocks", "compile_loss")
# the lever sets a measured `auto` chooses among (config auto_levers.candidates), each complete over TRIAL_KEYS
CANDIDATES = {
    "eager": {"compile_blocks": False, "compile_loss": False, "compile_model": False, "compile_mode": "default"},
    "loss": {"compile_blocks": False, "compile_loss": True, "compile_model": False, "compile_mode": "default"},
    "blocks": {"compile_blocks": True, "compile_loss": True, "compile_model": False, "compile_mode": "default"},
    "model": {"compile_blocks": False, "compile_loss": True, "compile_model": True, "compile_mode": "default"},
    "model_graphs": {"compile_blocks": False, "compile_loss": True, "compile_model": True,
                     "compile_mode": "reduce-overhead"},  # CUDA graphs of the compiled model and loss
}
TRIAL_KEYS = ("compile_blocks", "compile_loss", "compile_model", "compile_mode")
# a candidate run only where the one it stands behind failed, in the trial or, where no trial launched, in the run
# (apply_fallback); CUDA graphs of the same compiled model were as fast or faster in every committed GPU
# measurement (benchmarks/2026-11-24-compile-regimes-h100.md)
FALLBACK = {"model_graphs": "model"}
# Below this much forward matmul work per block call, a compiled block's per-call host cost (guards, the
# autograd wrapper) outweighs what fusion saves: GPT-2-medium on one H100, interleaved, micro-batch 4 (1.0e11 FLOP)
# compiled 0.85x eager, micro-batch 16 (4.1e11) 1.9x (benchmarks/2026-11-24-compile-regimes-h100.md).
MIN_BLOCK_FLOPS = 2.0e11


GPU_PLATFORMS = ("cuda", "rocm")


def decided_by(auto_levers: dict | None, platform: str, nodes: int = 1) -> str:
    """What a study's `auto` levers are decided by, `rule` or `measurement` (config auto_levers.by): its default
    `auto` measures on a GPU platform, where the fastest lever set depends on the machine, and keeps the rule on CPU
    (compilation does not pay there: no trial is added to a CPU study) and on several nodes (the trial runs on one)."""
    by = (auto_levers or {}).get("by", "auto")
    if by != "auto":
        return by
    return "measurement" if platform in GPU_PLATFORMS and int(nodes) == 1 else "rule"


def auto_compile(platform: str, layout: dict | None, family: str, block_flops: float) -> tuple[bool, str]:
    """What `auto` means for one run: (compile?, why). `block_flops`: forward matmul FLOPs of one block call
    (study.block_flops)."""
    from workflow_scripts.training.parallel import DIMENSIONS

    if platform == "cpu":
        return False, "auto: off on CPU (compiling costs more than it saves there)"
    unchecked = [k for k, n in (layout or {}).items() if int(n) > 1 and not (k in DIMENSIONS and
                                                                            DIMENSIONS[k].compiled_on_gpu)]
    if unchecked:
        return False, f"auto: off under {'/'.join(unchecked)} (compiled runs not checked on a GPU yet)"
    if FAMILIES[family].moe:
        return False, "auto: off for the MoE family (compiled grouped_mm experts not checked on a GPU yet)"
    if block_flops < MIN_BLOCK_FLOPS:
        return False, (f"auto: off, {block_flops:.1e} FLOP per block call < {MIN_BLOCK_FLOPS:.0e} (host-bound: "
                       "compiled blocks cost more per call than they save)")
    return True, f"auto: on ({platform}, {block_flops:.1e} FLOP per block call)"


def resolve(train: dict, platform: str, layout: dict | None, family: str, block_flops: float,
            trial: str | None = None) -> dict:
    """The run's train settings with `auto` levers made true/false (and the reason under `compile_auto`); with a
    `trial` (the lever trial's result file, measured `auto`), they stay `auto` and name the file (`lever_trial`):
    the launcher decides from it (apply_trial)."""
    auto = [k for k in LEVERS if train.get(k, "auto") == "auto"]
    if not auto:
        return dict(train)
    if trial and trial_decides(train):
        return {**train, "lever_trial": trial}
    on, why = auto_compile(platform, layout, family, block_flops)
    out = {**train, **{k: on for k in auto}, "compile_auto": why}
    if "compile_loss" in auto and (FAMILIES[family].vision or train.get("chunked_loss")):  # not lm_loss: none
        out["compile_loss"] = False
    return out


def trial_decides(train: dict) -> bool:
    """Whether a run's levers can be chosen by a trial: both left `auto` and the whole-model compile not forced
    (a study that sets one lever has chosen)."""
    return all(train.get(k, "auto") == "auto" for k in LEVERS) and train.get("compile_model") is not True


def trial_candidates(names: list[str], platform: str, data_only: bool, family: str,
                     train: dict, block_flops: float | None = None) -> tuple[dict, dict]:
    """The candidates a configuration can run ({name: lever settings}) and those it cannot or that cannot win
    ({name: why}): CUDA graphs need a GPU; compiled blocks do not pay below MIN_BLOCK_FLOPS per block call
    (`block_flops`, study.block_flops: the whole-model compile, a few regions per step, is the candidate there); the
    whole-model compile takes data-parallel layouts (config_check) and not the chunked loss; a ViT's loss and the
    chunked loss have nothing to compile (the candidate is the one without it)."""
    run, skip = {}, {}
    no_loss = FAMILIES[family].vision or bool(train.get("chunked_loss"))
    for name in names:
        keys = {**CANDIDATES[name], **({"compile_loss": False} if no_loss else {})}
        if keys["compile_mode"] == "reduce-overhead" and platform == "cpu":
            skip[name] = "CUDA graphs need a GPU"
        elif keys["compile_blocks"] and block_flops is not None and block_flops < MIN_BLOCK_FLOPS:
            skip[name] = (f"{block_flops:.1e} FLOP per block call < {MIN_BLOCK_FLOPS:.0e}: compiled blocks cost more "
                          "per call than they save")
        elif keys["compile_model"] and not data_only:
            skip[name] = "the whole-model compile takes data-parallel layouts only"
        elif keys["compile_model"] and train.get("chunked_loss"):
            skip[name] = "the chunked loss is not checked compiled"
        elif keys in run.values():  # e.g. `loss` is `eager` for a ViT
            skip[name] = "the same settings as an earlier candidate here"
        else:
            run[name] = keys
    if platform in GPU_PLATFORMS:
        pruned = dominated(run, block_flops)
        skip.update(pruned)
        run = {k: v for k, v in run.items() if k not in pruned}
    return run, skip


def dominated(run: dict, block_flops: float | None = None) -> dict:
    """On a GPU, the runnable candidates that cannot win beside the others ({name: why}), from the committed GPU
    measurements (benchmarks/2026-11-24-compile-regimes-h100.md, 2026-11-21-levers-h200.md,
    2026-12-02-defaults-h200.md): eager and the compiled loss alone lost to compiled blocks wherever those run
    (GEMM-bound shapes: 1.9x); beside the whole model with CUDA graphs they lost at every host-bound shape measured
    (eager at 0.44-0.47x under DDP, ZeRO-1 and ZeRO-2 on an H200, the loss alone below it); the whole model without
    graphs stays, run by the trial only if the graphs fail (FALLBACK). Where one block call does at least
    MIN_BLOCK_FLOPS (`block_flops` known), the whole model with and without graphs lost to compiled blocks (DDP,
    4.1e11 FLOP per block call on an H100: 0.92x and 0.89x), so compiled blocks are left alone. Where nothing
    finishes the run is eager anyway (lever_trial.choose)."""
    out = {}
    if "blocks" in run:
        out.update({k: "compiled blocks beat it at this FLOP per block call" for k in ("eager", "loss") if k in run})
        if block_flops is not None and block_flops >= MIN_BLOCK_FLOPS:
            out.update({k: f"compiled blocks beat it at {block_flops:.1e} FLOP per block call (>= "
                           f"{MIN_BLOCK_FLOPS:.0e})" for k in ("model", "model_graphs") if k in run})
    if "model_graphs" in run:
        for k in ("eager", "loss"):
            if k in run:
                out.setdefault(k, "the whole model with CUDA graphs beats it at this shape")
    return out


def apply_trial(train: dict) -> dict:
    """The settings of a run whose `auto` levers a trial measured (train.lever_trial): the fastest candidate's,
    with what was measured under `compile_auto`; other runs as they are."""
    trial, out = verdict(train)
    if trial is None:
        return train
    return {**out, **trial["chosen_train"], "compile_auto": trial["why"]}


def apply_fallback(train: dict) -> dict | None:
    """The settings of a run whose trial chose by rule, launching nothing (job/lever_trial.by_rule), once its
    choice failed in the run: the fallback the trial named, `compile_auto` saying what failed; None where the trial
    named none (a measured choice finished in the trial already)."""
    trial, out = verdict(train)
    if trial is None or not trial.get("fallback"):
        return None
    return {**out, **trial["fallback_train"],
            "compile_auto": f"{trial['why']}; {trial['chosen']} failed in this run, {trial['fallback']}"}


def verdict(train: dict) -> tuple[dict | None, dict]:
    """The lever trial's verdict a run's settings name (train.lever_trial), if any, and the settings without it."""
    path = train.get("lever_trial")
    if not path:
        return None, train
    import json

    return json.loads(open(path).read()), {k: v for k, v in train.items() if k != "lever_trial"}


def lever_set(train: dict, applied: dict | None) -> tuple[str, bool]:
    """The lever set a run used, (eager | blocks | model | graphs, compiled loss), from what it applied
    (strategy_settings.json's `harness`) or, before it runs, its resolved train settings (the step-time model's
    constants are per lever set: plan/step_time.py)."""
    t = applied or train
    if t.get("compile_model") not in (None, False):  # what ran records a description of the compiled module
        return ("graphs" if t.get("compile_mode") == "reduce-overhead" else "model"), t.get("compile_loss") is True
    return ("blocks" if t.get("compile_blocks") is True else "eager"), t.get("compile_loss") is True


def compiles(train: dict, family: str, layout: dict | None) -> bool:
    """Whether a run's resolved settings compile anything: its blocks, or its loss where the loss is ours (not a
    ViT's classifier loss, not under cp, whose sequence-sharded loss stays eager: parallel/sequence.py)."""
    loss = train.get("compile_loss") is True and not FAMILIES[family].vision and int((layout or {}).get("cp", 1)) == 1
    return train.get("compile_blocks") is True or train.get("compile_model") is True or loss


def apply(model: torch.nn.Module, train: dict, strategy) -> dict:
    """Compile what the config asks for (in place, with the strategy's own block compiler: see
    training.strategies.engine.compile_blocks) and return the settings to record. Under compile_model the blocks
    are left to the whole-model compile (apply_to_engine)."""
    whole = train.get("compile_model") is True
    blocks = train.get("compile_blocks") is True and not whole  # resolved by the run spec; "auto" compiles nothing
    mode = train.get("compile_mode", "default")
    extra = strategy.compile_blocks(model, mode) if blocks else {}
    return {**extra, "compile_blocks": blocks, "compile_model": whole,
            "compile_loss": train.get("compile_loss") is True,
            "compile_mode": mode, "attn_implementation": train.get("attn_implementation", "sdpa"),
            "host_sync": f"every {train.get('log_every')} steps (losses and CUDA-event timings read together)",
            "loader": "pinned host memory, non_blocking copies"}


def apply_to_engine(engine, train: dict, strategy) -> dict:
    """train.compile_model: the whole model compiled around the strategy's wrapper, once the engine exists (the
    strategy's own compile_model: training.strategies.engine.compile_model)."""
    if train.get("compile_model") is not True:
        return {}
    mode = train.get("compile_mode", "default")
    done = strategy.compile_model(engine, mode)
    # every strategy's compiled model replays CUDA graphs in this mode: the engine marks each step (Engine.cuda_graphs)
    engine.cuda_graphs = mode == "reduce-overhead" and engine.ctx.device.type == "cuda"
    engine.eager_eval = True  # validation runs uncompiled: no inference graph compiled beside the training one
    return {**done, "validation": "eager (the uncompiled module: Engine.eager_eval)"}


def loss_function(train: dict):
    """The loss the engines call: lm_loss, or its compiled form (torch is imported here, on a rank: the rest of this
    module is read by every Snakefile parse)."""
    global _compiled_loss
    from workflow_scripts.training.strategies.engine import lm_loss

    if train.get("compile_loss") is not True:
        return lm_loss
    if _compiled_loss is None:
        import torch

        _compiled_loss = torch.compile(lm_loss, mode=train.get("compile_mode", "default"))
    return _compiled_loss
