"""The parallel layout of a run: how its ranks split over data (dp), pipeline (pp), tensor (tp), context/sequence
(cp) and expert (ep) parallelism. One place checks it; every consumer (batch slots, validation split, meshes,
DeepSpeed's batch keys, the memory prediction, run paths and table rows) asks it for what it needs.

Ranks are laid out on a device mesh in the order pp, dp, cp, tp (tp innermost, so tensor-parallel peers are
neighbouring ranks on one node). Expert parallelism does not add ranks: the experts of a MoE layer are sharded
over ep ranks carved out of the dp x cp ranks, so world size = dp x pp x cp x tp and ep divides dp x cp.

Keys: a pure data-parallel run keeps its short key `ws<N>`; any other layout lists its degrees above one after dp,
e.g. `dp2-pp2-tp2`. The key is part of the run path, the run id and every table row.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

MESH_ORDER = ("pp", "dp", "cp", "tp")  # outermost to innermost
KEY_ORDER = ("dp", "pp", "tp", "cp", "ep")
MODEL_PARALLEL = tuple(k for k in KEY_ORDER if k != "dp")  # the dimensions that split the model or its tokens
NAMES = {"dp": "data", "pp": "pipeline", "tp": "tensor", "cp": "context/sequence", "ep": "expert"}


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    ep: int = 1

    # ---------------------------------------------------------------- construction
    @classmethod
    def data_parallel(cls, world_size: int) -> Layout:
        return cls(dp=int(world_size))

    @classmethod
    def from_config(cls, entry, where: str = "layouts") -> Layout:
        """An int (a pure data-parallel world size) or a mapping of degrees, e.g. {dp: 2, pp: 2}."""
        if isinstance(entry, int) and not isinstance(entry, bool):
            return cls.data_parallel(entry)
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a world size or a mapping of degrees, got {entry!r}")
        unknown = sorted(set(entry) - set(KEY_ORDER))
        if unknown:
            raise ValueError(f"{where}.{unknown[0]}: unknown parallel dimension (known: {', '.join(KEY_ORDER)})")
        for name, value in entry.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{where}.{name}: must be a positive integer, got {value!r}")
        return cls(**entry)

    @classmethod
    def from_key(cls, key: str) -> Layout:
        m = re.fullmatch(r"ws(\d+)", key)
        if m:
            return cls.data_parallel(int(m.group(1)))
        parts = dict((name, int(n)) for name, n in re.findall(r"([a-z]+)(\d+)", key))
        if "-".join(f"{k}{v}" for k, v in parts.items()) != key or set(parts) - set(KEY_ORDER):
            raise ValueError(f"not a layout key: {key!r}")
        return cls(**parts)

    @classmethod
    def from_dict(cls, d: dict | None, world_size: int) -> Layout:
        """From a `layout` mapping of degrees; none (a plan's candidate, a run recorded without one): pure data
        parallel over world_size."""
        return cls(**d) if d else cls.data_parallel(world_size)

    # ---------------------------------------------------------------- what consumers ask
    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    @property
    def shard_ranks(self) -> int:
        """The ranks a data-parallel strategy (ZeRO, FSDP2) shards its states over: dp x cp, ranks that hold the same
        parameters and different tokens (experts are sharded over ep of them)."""
        return self.dp * self.cp

    @property
    def data_only(self) -> bool:
        return self.world_size == self.dp and self.ep == 1

    @property
    def key(self) -> str:
        if self.data_only:
            return f"ws{self.dp}"
        return "-".join(f"{n}{getattr(self, n)}" for n in KEY_ORDER if n == "dp" or getattr(self, n) > 1)

    def degrees(self) -> dict[str, int]:
        return asdict(self)

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along every mesh dimension (pp, dp, cp, tp; tp innermost)."""
        out = {}
        for name in reversed(MESH_ORDER):
            size = getattr(self, name)
            out[name] = rank % size
            rank //= size
        return out

    def dp_rank(self, rank: int) -> int:
        return self.coords(rank)["dp"]

    def mesh(self, device_type: str):
        """The run's DeviceMesh with named dimensions (`mesh["dp"]` is the data-parallel group)."""
        from torch.distributed.device_mesh import init_device_mesh

        names = tuple(n for n in MESH_ORDER if n == "dp" or getattr(self, n) > 1)
        return init_device_mesh(device_type, tuple(getattr(self, n) for n in names), mesh_dim_names=names)

    # ---------------------------------------------------------------- validation
    def problems(self, model, where: str = "layouts", block_size: int | None = None) -> list[str]:
        """Everything wrong with this layout for `model` (a training.models.ModelSpec) and the sequence length,
        each naming the key."""
        out = []
        if block_size and block_size % self.cp:
            out.append(f"{where}.cp: {self.cp} does not divide data.block_size {block_size} (the sequence is split "
                       "evenly over the cp ranks)")
        heads = {"attention heads": model.n_heads, "KV heads": model.n_kv_heads} if self.tp > 1 else {}
        for what, n in heads.items():
            if n % self.tp and not (what == "KV heads" and n == model.n_heads):  # GPT-2: KV heads = heads
                out.append(f"{where}.tp: {self.tp} does not divide {model.name}'s {n} {what}")
        if self.pp > model.n_layer:
            out.append(f"{where}.pp: {self.pp} pipeline stages but {model.name} has {model.n_layer} layers")
        if self.ep > 1:
            if not model.n_experts:
                out.append(f"{where}.ep: {self.ep}, but {model.name} has no experts (a dense model)")
            elif model.n_experts % self.ep:
                out.append(f"{where}.ep: {self.ep} does not divide {model.name}'s {model.n_experts} experts")
            if self.shard_ranks % self.ep:
                out.append(f"{where}.ep: {self.ep} must divide dp x cp = {self.shard_ranks} (experts are "
                           "sharded over ranks that hold different data)")
        return out
