"""The engine interface every strategy's engine implements, and what the engines share: the loss, the optimizer,
the compile helpers. Imported where a rank trains (torch), never when the strategy registry is read (base.py).

The training loop (`workflow_scripts.training.loop`) asks the engine for one optimizer step at a time; the engine
owns the micro-batches of that step (a pipeline schedule can own them instead):

    loss, marks = engine.train_step(micro_batches, lr, clock)

The default `Engine.train_step` runs, per micro-batch, `micro_step(last)` / `forward_loss` / `backward`, then
`optimizer_step(lr)`; engines override those four (or `train_step` as a whole).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from workflow_scripts.measure.profile import phase
from workflow_scripts.training.models import transformer_blocks

if TYPE_CHECKING:
    from workflow_scripts.training.run_context import RunContext


def input_ids(tokens: torch.Tensor) -> torch.Tensor:
    """The ids the model reads: a context-only token (stored as -(id + 1), data.tokenize) is id."""
    return torch.where(tokens < 0, -tokens - 1, tokens)


def document_positions(ids: torch.Tensor, eos: int) -> torch.Tensor:
    """Position ids that start again from 0 after each EOS token: each document of a packed block is its own
    sequence. Given to the model, transformers builds a block-diagonal causal mask from them (masking_utils:
    find_packed_sequence_indices; flash-attention: its variable-length kernels), so no token attends across a
    document boundary, and absolute position embeddings count from each document's start."""
    steps = torch.arange(ids.shape[-1], device=ids.device).expand_as(ids)
    starts = torch.zeros_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, :-1] == eos
    return steps - torch.where(starts, steps, 0).cummax(dim=-1).values


def document_mask(positions: torch.Tensor, eager: bool = False, dtype=torch.float32) -> torch.Tensor:
    """The block-diagonal causal mask of document_positions' positions, [B, 1, T, T]: a token sees the earlier
    tokens of its own document only. For the layouts whose stages and shards call the blocks themselves (pipeline,
    Ulysses): True where it may attend (SDPA's boolean mask), or with `eager` 0 / dtype's lowest (the additive mask
    transformers' eager attention adds)."""
    documents = (positions == 0).cumsum(-1)
    n = positions.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=positions.device).tril()
    keep = (documents[:, :, None] == documents[:, None, :]) & causal
    if not eager:
        return keep[:, None]
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)[:, None]


def model_inputs(tokens: torch.Tensor, ctx: RunContext) -> dict:
    """What the model is called with for a micro-batch: its ids, and under train.separate_documents the
    positions that keep the block's documents apart (document_positions)."""
    ids = input_ids(tokens)
    if ctx.document_eos is None:
        return {"input_ids": ids}
    return {"input_ids": ids, "position_ids": document_positions(ids, ctx.document_eos)}


def targets(tokens: torch.Tensor) -> torch.Tensor:
    """The ids a loss predicts, -100 (cross_entropy's ignore_index) where the token is context only."""
    return torch.where(tokens < 0, -100, tokens)


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in fp32 over positions 0..T-2 predicting 1..T-1, the mean over trained targets."""
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)),
                           targets(tokens)[:, 1:].reshape(-1).long())


def adamw(params, ctx: RunContext) -> torch.optim.Optimizer:
    """The one optimizer of every non-offload strategy: torch AdamW, fused kernels on GPU, foreach on CPU."""
    kind = {"fused": True} if ctx.device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(params, lr=ctx.lr, betas=tuple(ctx.betas), eps=ctx.eps,
                             weight_decay=ctx.weight_decay, **kind)


class Engine:
    """Interface the training loop drives. `settings` is what gets saved next to the run's results, over the
    strategy's settings from the config (what the engine chose once built, e.g. ZeRO's gradient norm)."""

    module: torch.nn.Module
    settings: dict
    cuda_graphs: bool = False  # the model replays CUDA graphs (compile_model with compile_mode reduce-overhead)
    eager_eval: bool = False  # validation runs the module uncompiled (compile_model: levers.apply_to_engine)

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def train_step(self, micro_batches: Iterable[torch.Tensor], lr: float, clock) -> tuple[torch.Tensor, dict]:
        """One optimizer step over this rank's micro-batches. Returns the mean loss (a device tensor, not read)
        and the clock's marks: start, per micro-batch (before forward, after forward, after backward), before the
        optimizer, end. The marks are read later (training.loop.StepLog), never inside the step."""
        marks = {"start": clock.mark(), "micro": []}
        loss_sum = torch.zeros((), device=self.ctx.device)
        for m, tokens in enumerate(micro_batches):
            with self.micro_step(last=m == self.ctx.accum - 1):
                a = clock.mark()
                with phase(self, "forward"):
                    loss = self.forward_loss(tokens)
                b = clock.mark()
                with phase(self, "backward"):
                    self.backward(loss)
                marks["micro"].append((a, b, clock.mark()))
            loss_sum += loss.detach().float()
        marks["opt"] = clock.mark()
        with phase(self, "optimizer"):
            self.optimizer_step(lr)
        marks["end"] = clock.mark()
        return loss_sum / self.ctx.accum, marks

    @property
    def eval_chunk(self) -> int:
        """Validation samples per forward_loss call (a pipeline evaluates whole schedules)."""
        return self.ctx.micro_batch

    def forward_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.ctx.forward_loss is not None:  # a parallel dimension's view of the micro-batch (cp: a shard)
            return self.ctx.forward_loss(self.module, tokens, self.ctx)
        if self.cuda_graphs:  # the previous call's graph outputs may be overwritten from here on
            torch.compiler.cudagraph_mark_step_begin()
        with self.ctx.precision.autocast(self.ctx.device.type):
            logits = self.module(**model_inputs(tokens, self.ctx)).logits
        loss = (self.ctx.loss_fn or lm_loss)(logits, tokens)
        return loss.clone() if self.cuda_graphs and not torch.is_grad_enabled() else loss  # kept by evaluate

    def micro_step(self, last: bool):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def optimizer_step(self, lr: float) -> None:
        raise NotImplementedError

    def eval_mode(self):
        return _EvalMode(self)

    def uncompiled(self):
        """The calls inside run the module's own forward, not the whole-model compile's (compile_model: a
        torch.compile wrapper, its original module at `_orig_mod`)."""
        return _swapped(self, getattr(self.module, "_orig_mod", self.module))

    def save(self, path: str) -> None:
        raise NotImplementedError

    def load(self, path: str) -> None:
        raise NotImplementedError


class _EvalMode:
    """Validation: the module in eval mode without gradients; under a whole-model compile (Engine.eager_eval) its
    uncompiled forward, the same for every lever set, so validation compiles no second (inference) graph and
    records no CUDA graphs of its own."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        self.engine.module.eval()
        self._stack.enter_context(torch.no_grad())
        if self.engine.eager_eval:
            self._stack.enter_context(self.engine.uncompiled())

    def __exit__(self, *exc):
        self._stack.close()
        self.engine.module.train()


@contextlib.contextmanager
def _swapped(engine: Engine, module: torch.nn.Module):
    compiled, engine.module = engine.module, module
    try:
        yield
    finally:
        engine.module = compiled


def compile_blocks(model: torch.nn.Module, mode: str) -> dict:
    """`torch.compile` of each transformer block in place (train.compile_blocks), before the strategy wraps the
    model; returns what to record beyond the harness settings. Strategies whose hooks break compiled blocks bring
    their own (DeepSpeed ZeRO-3: training.strategies._deepspeed_engine.zero3_compile_blocks)."""
    for block in transformer_blocks(model):
        block.compile(mode=mode)
    return {}


def compile_model(engine: Engine, mode: str) -> dict:
    """`torch.compile` of the whole model around the strategy's wrapper (train.compile_model), after the engine is
    built: one compiled region per forward instead of one per block, so the host issues a few graphs per step; DDP's
    compiler splits the graph at its bucket boundaries, so communication still overlaps. With compile_mode
    reduce-overhead the compiled forward and backward replay as CUDA graphs. DeepSpeed engines compile through
    their own `engine.compile` (training.strategies._deepspeed_engine.deepspeed_compile_model)."""
    engine.module = torch.compile(engine.module, mode=mode)
    return {"compile_model": f"torch.compile({type(engine.module._orig_mod).__name__}, mode={mode})"}
