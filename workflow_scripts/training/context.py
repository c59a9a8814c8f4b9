"""The run context: what one rank knows about its run, built from the run spec in one place for the training
loop, the launcher (settings and platform checks before any rank starts) and the Trainer baseline.

Data-parallel consumers ask the context, never the world size: `dp_rank` / `dp_size` pick batch slots and the
validation split, `effective_batch` = micro-batch x accumulation x dp_size is DeepSpeed's train_batch_size.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import torch

from workflow_scripts.training.layout import Layout
from workflow_scripts.training.precision import Precision, policy
from workflow_scripts.training.strategies import get as get_strategy
from workflow_scripts.training.strategies import micro_and_accum


@dataclass
class RunContext:
    rank: int
    local_rank: int
    local_world_size: int
    device: torch.device
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


def process_env(platform: str) -> tuple[int, int, int, int, torch.device]:
    """(rank, local rank, world size, local world size, device) of this torchrun process; selects its GPU."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if platform == "cpu":
        return rank, local_rank, world, local_world, torch.device("cpu")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return rank, local_rank, world, local_world, device


def init_distributed(spec: dict) -> RunContext:
    """Join the process group (gloo on CPU, NCCL/RCCL on GPU) and return this rank's context."""
    import torch.distributed as dist

    rank, local_rank, world, local_world, device = process_env(spec["platform"])
    ctx = from_spec(spec, rank, local_rank, local_world, device)
    dist.init_process_group(backend=ctx.backend, device_id=device if device.type == "cuda" else None)
    if ctx.world_size != world:
        raise ValueError(f"layout {ctx.layout.key} needs {ctx.world_size} ranks, torchrun started {world}")
    return ctx


def from_spec(spec: dict, rank: int = 0, local_rank: int = 0, local_world: int | None = None,
              device: torch.device | None = None) -> RunContext:
    """The context of one rank; without a rank (the launcher, before any rank starts) that of rank 0."""
    t = spec["train"]
    layout = Layout.from_dict(spec.get("layout"), spec["world_size"])
    if device is None:
        device = torch.device("cpu") if spec["platform"] == "cpu" else torch.device("cuda", 0)
    if local_world is None:
        local_world = layout.world_size // spec.get("nodes", 1)
    micro, accum = micro_and_accum(spec)
    strategy = get_strategy(spec["strategy"])
    consumed = strategy.option_keys if strategy.accumulation is not None else ()  # micro_and_accum read them
    options = {k: v for k, v in spec["options"].items() if k not in consumed}
    return RunContext(rank=rank, local_rank=local_rank, local_world_size=local_world, device=device,
                      platform=spec["platform"], layout=layout, precision=policy(spec["precision"]),
                      micro_batch=micro, accum=accum, lr=t["lr"], weight_decay=t["weight_decay"],
                      betas=tuple(t["betas"]), eps=t["eps"], grad_clip=t["grad_clip"], seed=t["seed"],
                      work_dir=spec["work_dir"], options=options,
                      pipeline_schedule=t.get("pipeline_schedule", "1f1b"))
