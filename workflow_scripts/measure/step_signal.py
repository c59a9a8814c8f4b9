"""The training step in progress, published by rank 0 and read by the VRAM sampler at no cost to training.

The file holds one little-endian int64 (-1 before the first step) written through a shared memory map: a store,
no system call per step. The reader maps the same file and reads it whenever it samples.
"""
from __future__ import annotations

import mmap
import os
import struct

_FMT = "<q"


class StepPublisher:
    def __init__(self, path: str | None):
        self._map = None
        if not path:
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, 8)
            self._map = mmap.mmap(fd, 8)
        finally:
            os.close(fd)
        self.publish(-1)

    def publish(self, step: int) -> None:
        if self._map is not None:
            struct.pack_into(_FMT, self._map, 0, step)


class StepReader:
    def __init__(self, path: str | None):
        self.path, self._map = path, None

    def read(self) -> int | None:
        if self._map is None:
            if not self.path or not os.path.exists(self.path) or os.path.getsize(self.path) < 8:
                return None
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 8, access=mmap.ACCESS_READ)
        step = struct.unpack_from(_FMT, self._map, 0)[0]
        return None if step < 0 else step
