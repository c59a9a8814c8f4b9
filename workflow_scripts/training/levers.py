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
rule holds where its measurements were made (evidence_family, RULE_MEASURED_ON): on a GPU platform they are on, the
fast path; off on CPU (compilation costs more than it saves there), for offloading strategies (measured: their
trials chose eager or within noise of it, so `auto` decides them by the rule without a trial), where
a block call is too small for compilation to pay (MIN_BLOCK_FLOPS: the step is host-bound there), under layout
dimensions whose compiled runs were not checked on a GPU yet (parallel.Dimension.compiled_on_gpu), and for MoE
models (grouped_mm experts). The measurement: before a configuration's timed repeats, a few steps of each candidate
lever set (CANDIDATES, whole-model compile and CUDA graphs among them) on the study's own machine and shape (rule
lever_trial, job/lever_trial.py); the launcher applies the fastest (apply_trial). A compiled region that hits
dynamo's recompile limit stops its run (stop_at_recompile_limit): an `auto`-decided run goes again eager
(eager_after), a trial's candidate fails. A trial's decision is kept in the machine's cache
(machine_cache()/lever_decisions, keyed by the device, the software versions, the training code and the
configuration's shape: job/lever_trial.py), so a second study of the same shapes on the same machine and versions
decides without a trial; candidates the rule knows cannot win are left out (trial_candidates: in the family the rule
was measured on), and where one is left nothing is launched: the run falls back by itself if it fails
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
# The strategy families the committed GPU measurements behind the rule were made on (dominated, MIN_BLOCK_FLOPS,
# FALLBACK): DDP, ZeRO-1 and ZeRO-2 on one H100 / H200, every parameter whole on each rank and nothing offloaded
# (benchmarks/2026-11-24-compile-regimes-h100.md, 2026-11-21-levers-h200.md, 2026-12-02-defaults-h200.md). Elsewhere
# a trial runs every candidate it can (trial_candidates) and the rule keeps the settings every strategy runs where
# nothing was measured (auto_compile). ZeRO-3's compiled blocks were measured at 2.2x its eager blocks at 3.8e11 FLOP
# per block call (benchmarks/2026-11-26-zero3-one-gpu-h100.md): the rule's `on` above MIN_BLOCK_FLOPS holds for the
# sharded family too.
RULE_MEASURED_ON = ("replicated",)
RULE_ON_ABOVE_MIN_BLOCK_FLOPS = ("replicated", "sharded")
# The families whose `auto` levers stay eager without a trial on a GPU: offloading strategies, whose step waits on
# the host's Adam and the copies. Their trials on one H200 (gpt2-large mb 2, torch 2.11, DeepSpeed 0.19.8;
# benchmarks/2026-12-03-one-gpu-tutorial-h200.md): ZeRO-3 with CPU offload chose eager (1,717 tokens/s, compiled
# blocks tied, the whole model hit the recompile limit; 478 s of trial), ZeRO-Infinity's candidates were within 3 %
# of one another at 12.7-15.1 s a step, 11.7-14.1 s of it the optimizer (929 s of trial): deciding cost more than
# the rows. `auto_levers.by: measurement` measures them.
RULE_EAGER_MEASURED_ON = ("offload",)


# Where the whole-model compile is known not to finish: dynamo recompiled DeepSpeed's stage-3
# `_pre_backward_module_hook` (deepspeed/runtime/zero/parameter_offload.py; a guard on its output's type) past its
# recompile limit of 8, with and without CUDA graphs, under ZeRO-3, ZeRO-3 with CPU offload and ZeRO-Infinity,
# gpt2-large micro-batch 2 on one H200 (benchmarks/2026-12-03-one-gpu-tutorial-h200.md: 140-175 s a candidate to
# fail). Held for those strategies and that model family, on GPUs, with the torch and DeepSpeed versions it was
# measured with (the hook is DeepSpeed's code, the guard torch's); any other version, strategy or family runs the
# candidates (whole_model_known_to_fail).
WHOLE_MODEL_RECOMPILES = {"strategies": ("zero3", "zero3_offload", "zero_infinity"), "families": ("gpt2",),
                          "torch": "2.11.", "deepspeed": "0.19.8"}


def whole_model_known_to_fail(strategy: str, options: dict | None, family: str, platform: str,
                              facts: dict) -> str | None:
    """Why the whole-model candidates (model, model_graphs) cannot finish for this configuration on this machine
    (`facts`: job/lever_trial.machine: the torch and DeepSpeed versions), or None where that was not measured
    (WHOLE_MODEL_RECOMPILES). DeepSpeed's own compiler (strategy option compile.deepcompile) traces another way and
    is not covered."""
    rule = WHOLE_MODEL_RECOMPILES
    if (strategy not in rule["strategies"] or family not in rule["families"] or platform not in GPU_PLATFORMS
            or ((options or {}).get("compile") or {}).get("deepcompile")
            or not str(facts.get("torch", "")).startswith(rule["torch"])
            or str(facts.get("deepspeed")) != rule["deepspeed"]):
        return None
    return (f"the whole model compiled recompiled DeepSpeed's stage-3 backward hook past dynamo's limit under "
            f"{'/'.join(rule['strategies'])} ({family} on one H200, torch {facts['torch']}, DeepSpeed "
            f"{facts['deepspeed']}: levers.WHOLE_MODEL_RECOMPILES)")


def evidence_family(strategy: str, options: dict | None = None) -> str:
    """The family a lever measurement carries over within: `offload` (optimizer states or parameters on the host or
    NVMe: the step waits on the host's Adam and the copies), `sharded` (parameters gathered per module: ZeRO-3,
    ZeRO++, FSDP2), `replicated` (every parameter whole on each rank: DDP and its variants, ZeRO-0/1/2)."""
    from types import SimpleNamespace

    from workflow_scripts.training.strategies import get

    s, view = get(strategy), SimpleNamespace(options=options or {})  # the offload switches read the options only
    if s.offload_optimizer(view) or s.offload_params(view):
        return "offload"
    return "sharded" if s.zero_stage >= 3 else "replicated"


def decided_by(auto_levers: dict | None, platform: str, nodes: int = 1, evidence: str = "replicated") -> str:
    """What a configuration's `auto` levers are decided by, `rule` or `measurement` (config auto_levers.by): its
    default `auto` measures on a GPU platform, where the fastest lever set depends on the machine, and keeps the rule
    on CPU (compilation does not pay there: no trial is added to a CPU study), on several nodes (the trial runs on
    one) and for the strategy families measured eager (`evidence`: evidence_family, RULE_EAGER_MEASURED_ON)."""
    by = (auto_levers or {}).get("by", "auto")
    if by != "auto":
        return by
    measures = platform in GPU_PLATFORMS and int(nodes) == 1 and evidence not in RULE_EAGER_MEASURED_ON
    return "measurement" if measures else "rule"


def auto_compile(platform: str, layout: dict | None, family: str, block_flops: float, *,
                 evidence: str) -> tuple[bool, str]:
    """What `auto` means for one run by rule: (compile?, why). `block_flops`: forward matmul FLOPs of one block call
    (study.block_flops); `evidence`: the strategy's evidence_family (compiled levers are on only in a family where
    they were measured to win: RULE_ON_ABOVE_MIN_BLOCK_FLOPS)."""
    from workflow_scripts.training.parallel import DIMENSIONS

    if platform == "cpu":
        return False, "auto: off on CPU (compiling costs more than it saves there)"
    unchecked = [k for k, n in (layout or {}).items() if int(n) > 1 and not (k in DIMENSIONS and
                                                                            DIMENSIONS[k].compiled_on_gpu)]
    if unchecked:
        return False, f"auto: off under {'/'.join(unchecked)} (compiled runs not checked on a GPU yet)"
    if FAMILIES[family].moe:
        return False, "auto: off for the MoE family (compiled grouped_mm experts not checked on a GPU yet)"
    if evidence in RULE_EAGER_MEASURED_ON:
        return False, (f"auto: off for {evidence} strategies (the step waits on the host: compiled levers tied or "
                       "lost in their trials on one H200; auto_levers.by: measurement measures them)")
    if block_flops < MIN_BLOCK_FLOPS:
        return False, (f"auto: off, {block_flops:.1e} FLOP per block call < {MIN_BLOCK_FLOPS:.0e} (host-bound: "
                       "compiled blocks cost more per call than they save)")
    if evidence not in RULE_ON_ABOVE_MIN_BLOCK_FLOPS:
        return False, (f"auto: off for {evidence} strategies (compiled levers not measured there; "
                       "auto_levers.by: measurement measures them)")
    return True, f"auto: on ({platform}, {block_flops:.1e} FLOP per block call)"


def resolve(train: dict, platform: str, layout: dict | None, family: str, block_flops: float,
            evidence: str, trial: str | None = None) -> dict:
    """The run's train settings with `auto` levers made true/false (and the reason under `compile_auto`); with a
    `trial` (the lever trial's result file, measured `auto`), they stay `auto` and name the file (`lever_trial`):
    the launcher decides from it (apply_trial)."""
    auto = [k for k in LEVERS if train.get(k, "auto") == "auto"]
    if not auto:
        return dict(train)
    if trial and trial_decides(train):
        return {**train, "lever_trial": trial}
    on, why = auto_compile(platform, layout, family, block_flops, evidence=evidence)
    out = {**train, **{k: on for k in auto}, "compile_auto": why}
    if "compile_loss" in auto and (FAMILIES[family].vision or train.get("chunked_loss")):  # not lm_loss: none
        out["compile_loss"] = False
    return out


def trial_decides(train: dict) -> bool:
    """Whether a run's levers can be chosen by a trial: both left `auto` and the whole-model compile not forced
    (a study that sets one lever has chosen)."""
    return all(train.get(k, "auto") == "auto" for k in LEVERS) and train.get("compile_model") is not True


def trial_candidates(names: list[str], platform: str, data_only: bool, family: str,
                     train: dict, block_flops: float | None = None, *, evidence: str) -> tuple[dict, dict]:
    """The candidates a configuration can run ({name: lever settings}) and those it cannot or that cannot win
    ({name: why}): CUDA graphs need a GPU; the whole-model compile takes data-parallel layouts (config_check) and
    not the chunked loss; a ViT's loss and the chunked loss have nothing to compile (the candidate is the one
    without it). In the strategy family the rule was measured on (`evidence`: evidence_family, RULE_MEASURED_ON),
    compiled blocks do not pay below MIN_BLOCK_FLOPS per block call (`block_flops`, study.block_flops: the
    whole-model compile, a few regions per step, is the candidate there) and the candidates that lost there are left
    out (dominated); in any other family every runnable candidate runs."""
    run, skip = {}, {}
    measured = evidence in RULE_MEASURED_ON
    no_loss = FAMILIES[family].vision or bool(train.get("chunked_loss"))
    for name in names:
        keys = {**CANDIDATES[name], **({"compile_loss": False} if no_loss else {})}
        if keys["compile_mode"] == "reduce-overhead" and platform == "cpu":
            skip[name] = "CUDA graphs need a GPU"
        elif measured and keys["compile_blocks"] and block_flops is not None and block_flops < MIN_BLOCK_FLOPS:
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
    if platform in GPU_PLATFORMS and measured:
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
    whole = train["compile_model"] is True
    blocks = train["compile_blocks"] is True and not whole  # resolved by the run spec; "auto" compiles nothing
    mode = train["compile_mode"]
    limit = stop_at_recompile_limit() if blocks or whole or train["compile_loss"] is True else {}
    extra = strategy.compile_blocks(model, mode) if blocks else {}
    return {**extra, **limit, "compile_blocks": blocks, "compile_model": whole,
            "compile_loss": train["compile_loss"] is True,
            "compile_mode": mode, "attn_implementation": train["attn_implementation"],
            "host_sync": f"every {train['log_every']} steps (losses and CUDA-event timings read together)",
            "loader": "pinned host memory, non_blocking copies"}


def stop_at_recompile_limit() -> dict:
    """A compiled region that recompiles past dynamo's limit runs eager from then on, a slower run that says
    nothing; here it stops the run instead (FailOnRecompileLimitHit: loop.py writes the marker, job/launch.py runs an
    `auto`-decided run again eager, a trial's candidate fails with the reason)."""
    import torch._dynamo

    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return {"recompile_limit": f"{torch._dynamo.config.recompile_limit} per frame, a hit stops the run"}


def recompile_limit_hit(exc: BaseException) -> str | None:
    """The first line of dynamo's recompile-limit failure in an exception's chain, if it is one."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ == "FailOnRecompileLimitHit":
            return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip()
        exc = exc.__cause__ or exc.__context__
    return None


def dynamo_counters() -> dict:
    """What dynamo did in this process (its counters): distinct graphs compiled, graph breaks, frames compiled, and
    the first line of the most frequent graph break's reason (None without one)."""
    import sys

    if "torch._dynamo" not in sys.modules:  # nothing was compiled
        return {"dynamo_graphs": 0, "dynamo_graph_breaks": 0, "dynamo_frames": 0, "dynamo_graph_break_reason": None}
    from torch._dynamo.utils import counters

    breaks = counters["graph_break"]
    return {"dynamo_graphs": int(counters["stats"]["unique_graphs"]),
            "dynamo_graph_breaks": int(sum(breaks.values())), "dynamo_frames": int(counters["frames"]["ok"]),
            "dynamo_graph_break_reason": max(breaks, key=breaks.get).strip().splitlines()[0] if breaks else None}


def said_with_breaks(compile_auto: str | None, counted: dict) -> str | None:
    """The run's `compile_auto` with the graph breaks its compiled region had (dynamo's counters, rank 0): where a
    compiled region broke back to eager, the row says so beside why its levers were chosen."""
    n = counted["dynamo_graph_breaks"]
    if not n:
        return compile_auto
    said = f"{n} graph break{'s' if n > 1 else ''} in the compiled region ({counted['dynamo_graph_break_reason']})"
    return f"{compile_auto}; {said}" if compile_auto else said


def eager_after(train: dict, broke: str) -> dict:
    """An `auto`-decided run's settings once its compiled levers hit dynamo's recompile limit in the run (`broke`:
    the failure): eager, the settings every strategy runs, `compile_auto` saying what failed."""
    was = lever_set(train, None)[0]
    out = {k: v for k, v in train.items() if k != "lever_trial"}
    return {**out, **CANDIDATES["eager"],
            "compile_auto": f"{train.get('compile_auto')}; {was} hit dynamo's recompile limit in this run ({broke}), "
                            "eager"}


def apply_to_engine(engine, train: dict, strategy) -> dict:
    """train.compile_model: the whole model compiled around the strategy's wrapper, once the engine exists (the
    strategy's own compile_model: training.strategies.engine.compile_model)."""
    if train["compile_model"] is not True:
        return {}
    mode = train["compile_mode"]
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

    if train["compile_loss"] is not True:
        return lm_loss
    if _compiled_loss is None:
        import torch

        _compiled_loss = torch.compile(lm_loss, mode=train["compile_mode"])
    return _compiled_loss
