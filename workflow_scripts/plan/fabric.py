"""The network a simulated study runs on (config `plan.scale`): nodes of `gpus_per_node` GPUs on a switch inside the
node (NVLink/NVSwitch, Infinity Fabric) and a fabric between nodes (InfiniBand, RoCE), as stated assumptions.

A collective over R ranks of one group moves the same bytes per rank whatever the network (the caller counts them:
2 (R-1)/R of the message for an all-reduce, (R-1)/R for an all-gather or reduce-scatter); the network sets its bus
bandwidth:

  inside one node   the calibrated curve for R ranks where the study's calibration measured R (measure/calibrate.py),
                    else `intra_node_busbw_gbs` (large messages);
  across nodes      min(intra, g x `inter_node_gbs`), g the group's ranks on one node: a ring leaves each node once
                    per step, through one NIC per rank of the group there (a dp group of one rank per node, tp = 8
                    inside, gets one NIC's bandwidth);

and a latency per message: `intra_node_latency_us` inside a node, `inter_node_latency_us` x 2 log2(nodes) across
nodes (a tree's depth, as NCCL switches to trees at scale), counted as a lower effective bandwidth for small
messages.

Placement follows the mesh (training/layout.py: pp, dp, cp, tp from outermost to innermost, ranks filled node by
node): a dimension's peers are spaced by the product of the dimensions inside it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from workflow_scripts.training.layout import MESH_ORDER
from workflow_scripts.units import GB


@dataclass(frozen=True)
class Fabric:
    gpus_per_node: int
    intra_node_busbw_gbs: float
    inter_node_gbs: float  # per GPU, one direction (one NIC per GPU)
    intra_node_latency_us: float = 5.0
    inter_node_latency_us: float = 10.0

    @classmethod
    def of(cls, scale: dict) -> Fabric:
        return cls(**{k: scale[k] for k in cls.__dataclass_fields__ if scale.get(k) is not None})

    def ranks_per_node(self, layout: dict, dims: tuple[str, ...], size: int | None = None) -> int:
        """How many ranks of one group over `dims` (adjacent mesh dimensions, e.g. ("dp", "cp"); `size` of them,
        default all: expert groups are carved from dp x cp, two neighbouring pipeline stages) share a node."""
        inner = math.prod(int(layout.get(d, 1) or 1) for d in MESH_ORDER[MESH_ORDER.index(dims[-1]) + 1:])
        size = size or math.prod(int(layout.get(d, 1) or 1) for d in dims)
        return max(1, min(size, self.gpus_per_node // inner))

    def busbw(self, ranks: int, per_node: int, message: float, calibrated: float | None = None) -> float:
        """Effective GB/s of one collective over `ranks`, `per_node` of them on each node, for a message of
        `message` bytes (`calibrated`: the study's own measure for this rank count inside a node, if any)."""
        if ranks <= 1:
            return math.inf
        nodes = math.ceil(ranks / per_node)
        if nodes == 1:
            if calibrated is not None:
                return calibrated
            bw, latency = self.intra_node_busbw_gbs, self.intra_node_latency_us
        else:
            bw = min(self.intra_node_busbw_gbs, per_node * self.inter_node_gbs)
            latency = self.intra_node_latency_us + self.inter_node_latency_us * 2 * math.log2(nodes)
        seconds = message / (bw * GB) + latency * 1e-6
        return message / seconds / GB

    def describe(self) -> str:
        return (f"nodes of {self.gpus_per_node} GPUs; inside a node {self.intra_node_busbw_gbs:g} GB/s bus "
                f"bandwidth (where the calibration did not measure the rank count), {self.intra_node_latency_us:g} µs "
                f"per message; between nodes {self.inter_node_gbs:g} GB/s per GPU, "
                f"{self.inter_node_latency_us:g} µs per tree level")
