"""The pipeline dimension's stage and engine (torch.distributed.pipelining; built on a rank: pipeline.py is the
dimension)."""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from workflow_scripts.training.grad_norm import clip_, local
from workflow_scripts.training.parallel._data_engine import data_parallel_engine
from workflow_scripts.training.parallel.pipeline import stage_layers
from workflow_scripts.training.strategies.engine import (
    Engine,
    document_mask,
    document_positions,
    input_ids,
    lm_loss,
)


class Stage(nn.Module):
    """One pipeline stage of a GPT-2 or Qwen2 (dense or MoE) causal LM:
    [embeddings] -> blocks -> [final norm -> LM head]."""

    def __init__(self, model: nn.Module, family: str, layers: range, first: bool, last: bool, tied: bool,
                 eos: int | None = None):
        super().__init__()
        self.family, self.first, self.last, self.tied, self.eos = family, first, last, tied, eos
        self.eager = model.config._attn_implementation == "eager"
        base = model.transformer if family == "gpt2" else model.model
        blocks = base.h if family == "gpt2" else base.layers
        self.blocks = nn.ModuleList(blocks[i] for i in layers)
        if first:
            self.embed = base.wte if family == "gpt2" else base.embed_tokens
            if family == "gpt2":
                self.wpe, self.drop = base.wpe, base.drop
        if last:
            self.norm = base.ln_f if family == "gpt2" else base.norm
            self.head = model.lm_head
        if family != "gpt2":  # the Qwen families: rotary position embeddings
            self.rotary = base.rotary_emb

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None):
        """Tokens (the first stage) or the previous stage's hidden states. With documents kept apart (`eos`, from
        train.separate_documents) the first stage derives their positions and every stage hands them on with its
        hidden states, so each stage masks attention at the same document boundaries."""
        h = x
        if self.first:
            x = input_ids(x)
            positions = (document_positions(x, self.eos) if self.eos is not None
                         else torch.arange(x.shape[1], device=x.device).unsqueeze(0))
            h = self.embed(x)
            if self.family == "gpt2":
                h = self.drop(h + self.wpe(positions))
        elif positions is None:
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        extra = {}
        if self.eos is not None:
            extra["attention_mask"] = document_mask(positions, self.eager)
        if self.family != "gpt2":
            extra |= {"position_embeddings": self.rotary(h, positions), "position_ids": positions}
        for block in self.blocks:
            h = block(h, **extra)
        if self.last:
            return self.head(self.norm(h))
        return (h, positions) if self.eos is not None else h


def tied_groups(layout, rank: int):
    """The group of this rank's first and last stage (same coordinates in every other dimension), for the tied
    embedding; every rank creates every group, in the same order (dist.new_group's contract)."""
    mine = None
    for r in range(layout.world_size):
        c = layout.coords(r)
        if c["pp"] != 0:
            continue
        peers = [q for q in range(layout.world_size)
                 if {k: v for k, v in layout.coords(q).items() if k != "pp"} == {k: v for k, v in c.items()
                                                                                 if k != "pp"}
                 and layout.coords(q)["pp"] in (0, layout.pp - 1)]
        group = dist.new_group(sorted(peers))
        if rank in peers:
            mine = group
    return mine


class PipelineEngine(Engine):
    """Runs the schedule; the inner engine (the stage replicated or sharded over the dp ranks) owns the stage
    module and the optimizer."""

    def __init__(self, inner: Engine, stage: Stage, ctx, schedule: str):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        super().__init__(ctx)
        self.inner, self.stage_module = inner, stage
        self.module = inner.module
        coords = ctx.layout.coords(ctx.rank)
        self.pp_group = ctx.mesh["pp"].get_group()
        pipe_stage = PipelineStage(inner.module, coords["pp"], ctx.layout.pp, ctx.device, group=self.pp_group)
        kind = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[schedule]
        self.schedule = kind(pipe_stage, n_microbatches=ctx.accum, loss_fn=self._loss, scale_grads=True)
        self.tied = tied_groups(ctx.layout, ctx.rank) if stage.tied else None
        ctx.parallel["pp"] = {"schedule": kind.__name__, "microbatches": ctx.accum, "stage": coords["pp"],
                              # the schedule's idle share of a step with equal stages (1F1B and GPipe alike):
                              # (pp - 1) / (microbatches + pp - 1); not a measurement
                              "bubble_fraction_ideal": (ctx.layout.pp - 1) / (ctx.accum + ctx.layout.pp - 1)}
        self.settings = {**inner.settings, "pipeline": {
            "engine": "torch.distributed.pipelining.PipelineStage", "schedule": kind.__name__,
            "stages": ctx.layout.pp, "microbatches": ctx.accum, "stage": coords["pp"],
            "tied_embedding_sync": self.tied is not None}}

    def _loss(self, logits, tokens):
        return (self.ctx.loss_fn or lm_loss)(logits, tokens)

    def _io(self, tokens: torch.Tensor) -> tuple[tuple, dict]:
        s = self.stage_module
        return ((tokens,) if s.first else ()), ({"target": tokens} if s.last else {})

    def _stage_loss(self, losses: list) -> torch.Tensor:
        """The mean micro-batch loss of the last stage, on every stage (summed over the pp group)."""
        loss = torch.stack([x.detach().float() for x in losses]).mean() if losses else torch.zeros(
            (), device=self.ctx.device)
        dist.all_reduce(loss, group=self.pp_group)
        return loss

    def train_step(self, micro_batches, lr: float, clock) -> tuple[torch.Tensor, dict]:
        marks = {"start": clock.mark()}
        tokens = torch.cat(list(micro_batches))
        a = clock.mark()
        losses: list = []
        args, kwargs = self._io(tokens)
        with self.ctx.precision.autocast(self.ctx.device.type):
            self.schedule.step(*args, losses=losses, return_outputs=False, **kwargs)
        b = clock.mark()
        marks["micro"] = [(a, b, b)]
        marks["opt"] = clock.mark()
        self.optimizer_step(lr)
        marks["end"] = clock.mark()
        return self._stage_loss(losses), marks

    def forward_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        losses: list = []
        args, kwargs = self._io(tokens)
        with self.ctx.precision.autocast(self.ctx.device.type):
            self.schedule.eval(*args, losses=losses, return_outputs=False, **kwargs)
        return self._stage_loss(losses)

    @property
    def eval_chunk(self) -> int:
        return self.ctx.micro_batch * self.ctx.accum  # the schedule splits it into its micro-batches

    def optimizer_step(self, lr: float) -> None:
        params = [p for p in self.stage_module.parameters() if p.grad is not None]
        if self.tied is not None:
            weight = (self.stage_module.embed if self.stage_module.first else self.stage_module.head).weight
            if weight.grad is not None:  # the same rows on both stages (replicated, or sharded alike over dp)
                dist.all_reduce(local(weight.grad), group=self.tied)
        if self.ctx.grad_clip:  # the norm over every stage, as the 1D run clips
            clip_(params, self.ctx.grad_clip, groups=(self.pp_group,), device=self.ctx.device)
        self.inner.optimizer_step(lr)

    def eval_mode(self):
        return self.inner.eval_mode()

    def save(self, path: str) -> None:
        raise NotImplementedError("pipeline layouts do not checkpoint yet")

    def load(self, path: str) -> None:
        raise NotImplementedError("pipeline layouts do not checkpoint yet")


def build(strategy, model: nn.Module, ctx, family: str) -> PipelineEngine:
    """This rank's stage, replicated or sharded over the dp ranks (gradient clipping moved to the pipeline, where
    the norm covers every stage), driven by the schedule."""
    coords = ctx.layout.coords(ctx.rank)
    layers = stage_layers(len(model.transformer.h if family == "gpt2" else model.model.layers), ctx.layout.pp,
                          coords["pp"])
    tied = bool(getattr(model.config, "tie_word_embeddings", False))  # and so must the two end stages be
    stage = Stage(model, family, layers, first=coords["pp"] == 0, last=coords["pp"] == ctx.layout.pp - 1, tied=tied,
                  eos=ctx.document_eos)
    _ = ctx.mesh  # created once, shared with the inner engine's copy of the context
    inner = data_parallel_engine(strategy, stage, dataclasses.replace(ctx, grad_clip=0.0))
    return PipelineEngine(inner, stage, ctx, ctx.pipeline_schedule)
