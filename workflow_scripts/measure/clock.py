"""Phase boundaries of a training step without host synchronisation: CUDA events on GPU (read later, once per
`log_every` steps), perf_counter on CPU."""
from __future__ import annotations

import time


class PhaseClock:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        if self.cuda:
            return a.elapsed_time(b) / 1000.0
        return b - a

    def sync(self):
        if self.cuda:
            import torch

            torch.cuda.synchronize()
