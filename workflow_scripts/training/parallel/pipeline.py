"""pp, pipeline parallelism: `torch.distributed.pipelining` (PipelineStage + a schedule: 1F1B or GPipe).

The model is cut into `pp` stages of consecutive transformer blocks (the first also holds the embeddings, the last
the final norm and the LM head); each rank builds the whole model from the same seed and keeps its stage, so every
stage starts from exactly the weights of the 1D run. The data-parallel dimension wraps each stage over the ranks of
`mesh["dp"]` (training/parallel/data.py: FSDP2 for fsdp, composable `replicate` for the ddp family).

One optimizer step runs the schedule once over this data-parallel rank's `grad_accum` micro-batches (the pipeline's
micro-batches: set `train.grad_accum` >= pp to fill the pipeline), with the loss scaled by 1/micro-batches as the 1D
run's accumulation does. What keeps the numbers of the 1D run:
- tied embeddings (GPT-2, Qwen2.5): the first stage's embedding and the last stage's LM head are the same weight;
  their gradients are summed over the two stages before the update (an all-reduce over the ranks of the first and
  last stage), so both copies stay identical;
- gradient clipping uses the norm over all stages (squared norms summed over `mesh["pp"]`).
Timing: forward and backward interleave inside the schedule, so `forward_s` holds the whole schedule and `backward_s`
is zero; `optimizer_s` is the update. The stage and the engine are in _pipeline_engine.py (torch, built on a rank).
"""
from __future__ import annotations

from workflow_scripts.training import lazy
from workflow_scripts.training.parallel import Dimension


def stage_layers(n_layer: int, pp: int, stage: int) -> range:
    """Consecutive blocks of one stage; the first `n_layer % pp` stages take one more."""
    base, extra = divmod(n_layer, pp)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def problems(layout, strategy, train: dict, where: str) -> list[str]:
    """What a pipeline layout needs from the rest of the run."""
    out = []
    if train["grad_accum"] < layout.pp:
        out.append(f"{where}.pp: {layout.pp} stages need train.grad_accum (the pipeline's micro-batches) >= "
                   f"{layout.pp}, got {train['grad_accum']}")
    if train["checkpoint_every"]:
        out.append(f"{where}.pp: pipeline layouts do not checkpoint yet: set train.checkpoint_every: 0")
    return out


DIMENSION = Dimension(key="pp", description="pipeline parallel: torch.distributed.pipelining stages, 1F1B or "
                                            "GPipe schedule over grad_accum micro-batches",
                      build=lazy.part(f"{__package__}._pipeline_engine", "build"), problems=problems)
