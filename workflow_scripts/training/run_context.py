"""The run context's record: what one rank knows about its run (built by training/context.py from the run spec).
Strategies, engines and parallel dimensions read it; it imports none of them, so the strategy registry never
imports back into the code that builds a context.

Data-parallel consumers ask the context, never the world size: `dp_rank` / `dp_size` pick batch slots and the
validation split, `effective_batch` = micro-batch x accumulation x dp_size is DeepSpeed's train_batch_size.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workflow_scripts.training.layout import Layout
from workflow_scripts.training.precision import Precision

if TYPE_CHECKING:  # the launcher builds a context without importing torch (training/context.py)
    import torch


@dataclass
class RunContext:
    rank: int
    local_rank: int
    local_world_size: int
    device: torch.device | None  # None in the launcher's view, before any rank starts (context.from_spec)
    platform: str  # cpu | cuda | rocm
    layout: Layout
    precision: Precision
    micro_batch: int
    accum: int
    lr: float
    weight_decay: float
    betas: tuple
    eps: float
    grad_clip: float
    seed: int
    work_dir: str  # per-run scratch (offload files, ...)
    options: dict = field(default_factory=dict)  # this strategy's section of `strategy_options`
    loss_fn: Callable | None = None  # (logits, tokens) -> loss; None: lm_loss (see training.levers)
    # (module, tokens, ctx) -> loss: set by a parallel dimension that changes what a rank's forward sees (cp)
    chunked_head: torch.nn.Module | None = None  # the LM head under train.chunked_loss (training/chunked_loss.py)
    forward_loss: Callable | None = None
    parallel: dict = field(default_factory=dict)  # what each model-parallel dimension did (into the summary)
    pipeline_schedule: str = "1f1b"  # train.pipeline_schedule, for layouts with pp > 1
    compiled: bool = False  # the blocks, or the whole model, compiled around the strategy's hooks (levers.apply)
    # train.separate_documents: the EOS id after which a packed block's next document starts (its positions from
    # 0, no attention to the one before: strategies/engine.model_inputs); None: the block is one sequence
    document_eos: int | None = None
    _mesh: object = field(default=None, repr=False, compare=False)
    _data_mesh: object = field(default=None, repr=False, compare=False)

    @property
    def mesh(self):
        """The run's DeviceMesh (named dimensions, training.layout.Layout.mesh), created on first use."""
        if self._mesh is None:
            self._mesh = self.layout.mesh(self.device.type)
        return self._mesh

    @property
    def data_mesh(self):
        """The mesh the data-parallel dimension (DDP's replicate, FSDP2) runs over: mesh["dp"], or dp x cp
        flattened when the sequence is split (those ranks hold different tokens of the same parameters)."""
        if self.layout.cp == 1:
            return self.mesh["dp"]
        if self._data_mesh is None:
            self._data_mesh = self.mesh["dp", "cp"]._flatten("dp_cp")
        return self._data_mesh

    @property
    def backend(self) -> str:
        return "gloo" if self.device.type == "cpu" else "nccl"

    @property
    def dp_group(self):
        """The data-parallel process group; None for a pure data-parallel run (the default group)."""
        return None if self.layout.data_only else self.mesh["dp"].get_group()

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def dp_size(self) -> int:
        return self.layout.dp

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank(self.rank)

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accum * self.dp_size
