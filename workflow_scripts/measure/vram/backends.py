"""Memory backends for the VRAM sampler. Every quantity here is in bytes.

A backend is opened once (``open_backend``), then sampled each tick with a snapshot of the training process tree:
``sample(tree) -> list[Reading]``, one reading per device. Backends:

- ``nvml``    NVIDIA, through ``pynvml`` (nvidia-ml-py). Device-wide used/total; per-process memory from
              ``nvmlDeviceGetComputeRunningProcesses`` (often empty inside containers: pid namespaces differ).
- ``amdsmi``  AMD, through ``amdsmi``. Used bytes from ``amdsmi_get_gpu_memory_usage(h, VRAM)`` where the library has
              it, else ``amdsmi_get_gpu_vram_usage`` (MB = 2**20 bytes). Per-process VRAM where it reads non-zero.
- ``torch``   ``torch.cuda.mem_get_info`` (used = total - free). Fallback only: it creates a context on each device,
              which itself shows up as used memory. No per-process figure.
- ``host``    psutil RSS summed over the training process tree; device -1, total = machine memory. RSS counts shared
              pages (libraries) once per process, so it over-states the sum of unique pages a little.

Device numbers are physical indices (nvml/amdsmi enumeration order), restricted to the visible-devices variable
when it holds integers; the ``torch`` backend maps its visible ordinals back through the same variable.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any

import psutil

from workflow_scripts.units import MIB

DEVICE_BACKENDS = ("nvml", "amdsmi", "torch")
ALL_BACKENDS = DEVICE_BACKENDS + ("host",)


class BackendUnavailable(RuntimeError):
    """The backend's library is missing or would not initialise (no driver, no device)."""


@dataclass(frozen=True)
class Reading:
    """One device at one instant. ``process_bytes`` is the training tree's share, None where unknown."""
    device: int
    used_bytes: int
    total_bytes: int
    process_bytes: int | None = None


@dataclass
class TreeSnapshot:
    """The training process tree at one instant: pid -> RSS bytes (root included). Empty once the root is gone."""
    rss: dict[int, int] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return bool(self.rss)

    @property
    def pids(self) -> set[int]:
        return set(self.rss)

    @property
    def rss_bytes(self) -> int:
        return sum(self.rss.values())


class ProcessTree:
    """The root pid and all its descendants, re-scanned on every ``snapshot()`` (processes come and go)."""

    def __init__(self, root_pid: int | None, exclude: set[int] | None = None):
        self.root_pid = root_pid
        self.exclude = exclude if exclude is not None else {os.getpid()}
        self._root: psutil.Process | None = None
        self._procs: dict[int, psutil.Process] = {}

    def _root_process(self) -> psutil.Process | None:
        if self._root is None and self.root_pid is not None:
            try:
                self._root = psutil.Process(self.root_pid)
            except psutil.Error:
                return None
        return self._root

    def snapshot(self) -> TreeSnapshot:
        root = self._root_process()
        if root is None:
            return TreeSnapshot()
        try:
            members = [root] + root.children(recursive=True)
        except psutil.Error:  # the root exited
            return TreeSnapshot()
        procs: dict[int, psutil.Process] = {}
        for p in members:  # keep the Process objects we already hold: their identity check guards pid reuse
            if p.pid not in self.exclude:
                procs[p.pid] = self._procs.get(p.pid, p)
        self._procs = procs
        rss: dict[int, int] = {}
        for pid, p in procs.items():
            try:
                value = p.memory_info().rss
            except psutil.Error:  # exited between the scan and the read
                continue
            if value > 0:  # a zombie (exited, not yet reaped) reads 0: it is gone
                rss[pid] = value
        return TreeSnapshot(rss)


def visible_indices(*env_vars: str) -> list[int] | None:
    """Integer device indices from the first set variable (e.g. ``CUDA_VISIBLE_DEVICES``); None when unset or not
    all integers (UUIDs), meaning "all devices"."""
    for var in env_vars:
        value = os.environ.get(var)
        if value is None:
            continue
        parts = [p.strip() for p in value.split(",") if p.strip()]
        try:
            return [int(p) for p in parts]
        except ValueError:
            return None
    return None


def _import(name: str) -> Any:
    """Import a vendor library; any failure (ImportError, or e.g. amdsmi's KeyError when libamd_smi.so is absent)
    becomes BackendUnavailable."""
    try:
        return importlib.import_module(name)
    except BaseException as e:  # noqa: BLE001 - vendor modules raise anything at import time
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise BackendUnavailable(f"import {name} failed: {type(e).__name__}: {e}") from None


class Backend:
    name = "base"

    def sample(self, tree: TreeSnapshot) -> list[Reading]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class HostBackend(Backend):
    """Host RAM of the training tree: used = process = RSS sum over the tree; total = machine memory."""
    name = "host"

    def __init__(self) -> None:
        self.total = psutil.virtual_memory().total

    def sample(self, tree: TreeSnapshot) -> list[Reading]:
        if not tree.alive:
            return []
        rss = tree.rss_bytes
        return [Reading(-1, rss, self.total, rss)]


class NvmlBackend(Backend):
    name = "nvml"

    def __init__(self) -> None:
        self.nv = _import("pynvml")
        try:
            self.nv.nvmlInit()
        except Exception as e:
            raise BackendUnavailable(f"nvmlInit failed: {e}") from None
        try:
            count = self.nv.nvmlDeviceGetCount()
            wanted = visible_indices("CUDA_VISIBLE_DEVICES")
            indices = [i for i in wanted if 0 <= i < count] if wanted is not None else list(range(count))
            self.handles = [(i, self.nv.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        except Exception as e:
            self.close()
            raise BackendUnavailable(f"nvml device enumeration failed: {e}") from None
        if not self.handles:
            self.close()
            raise BackendUnavailable("nvml found no visible device")

    def _process_bytes(self, handle: Any, pids: set[int]) -> int | None:
        try:
            procs = self.nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            return None
        known = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory is not None]
        return sum(known) if known else None

    def sample(self, tree: TreeSnapshot) -> list[Reading]:
        out = []
        for index, handle in self.handles:
            mem = self.nv.nvmlDeviceGetMemoryInfo(handle)
            proc = self._process_bytes(handle, tree.pids) if tree.alive else None
            out.append(Reading(index, int(mem.used), int(mem.total), proc))
        return out

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass


class AmdSmiBackend(Backend):
    name = "amdsmi"

    def __init__(self) -> None:
        self.smi = _import("amdsmi")
        try:
            self.smi.amdsmi_init()
        except Exception as e:
            raise BackendUnavailable(f"amdsmi_init failed: {e}") from None
        try:
            handles = list(self.smi.amdsmi_get_processor_handles())
            wanted = visible_indices("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
            indices = [i for i in wanted if 0 <= i < len(handles)] if wanted is not None else range(len(handles))
            self.handles = [(i, handles[i]) for i in indices]
        except Exception as e:
            self.close()
            raise BackendUnavailable(f"amdsmi device enumeration failed: {e}") from None
        if not self.handles:
            self.close()
            raise BackendUnavailable("amdsmi found no visible device")
        self.vram = self.smi.AmdSmiMemoryType.VRAM if hasattr(self.smi, "AmdSmiMemoryType") else None

    def _call(self, fn_name: str, *args: Any) -> int | None:
        fn = getattr(self.smi, fn_name, None)
        if fn is None or self.vram is None:
            return None
        try:
            return int(fn(*args, self.vram))
        except Exception:
            return None

    def _used_total(self, handle: Any) -> tuple[int, int]:
        """(used, total) bytes: the byte-exact calls where available, else vram_usage's MB figures."""
        used = self._call("amdsmi_get_gpu_memory_usage", handle)
        total = self._call("amdsmi_get_gpu_memory_total", handle)
        if used is None or total is None:
            usage = self.smi.amdsmi_get_gpu_vram_usage(handle)
            used = int(usage["vram_used"]) * MIB if used is None else used
            total = int(usage["vram_total"]) * MIB if total is None else total
        return used, total

    def _process_bytes(self, handle: Any, pids: set[int]) -> int | None:
        """VRAM bytes of the tree's processes on this device; None unless some reading is non-zero.

        amdsmi >= 6.x returns dicts from the process list; older versions return process handles to pass to
        ``amdsmi_get_gpu_process_info``. Both give ``{'pid': ..., 'memory_usage': {'vram_mem': bytes, ...}}``."""
        try:
            total = 0
            for entry in self.smi.amdsmi_get_gpu_process_list(handle):
                info = entry if isinstance(entry, dict) else self.smi.amdsmi_get_gpu_process_info(handle, entry)
                if info.get("pid") in pids:
                    total += int((info.get("memory_usage") or {}).get("vram_mem") or 0)
            return total or None
        except Exception:
            return None

    def sample(self, tree: TreeSnapshot) -> list[Reading]:
        out = []
        for index, handle in self.handles:
            used, total = self._used_total(handle)
            proc = self._process_bytes(handle, tree.pids) if tree.alive else None
            out.append(Reading(index, used, total, proc))
        return out

    def close(self) -> None:
        try:
            self.smi.amdsmi_shut_down()
        except Exception:
            pass


class TorchBackend(Backend):
    name = "torch"

    def __init__(self) -> None:
        torch = _import("torch")
        try:
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception as e:
            raise BackendUnavailable(f"torch.cuda failed: {e}") from None
        if count == 0:
            raise BackendUnavailable("torch.cuda sees no device")
        self.torch = torch
        physical = visible_indices("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
        self.devices = [(physical[i] if physical and i < len(physical) else i, i) for i in range(count)]

    def sample(self, tree: TreeSnapshot) -> list[Reading]:
        out = []
        for index, ordinal in self.devices:
            free, total = self.torch.cuda.mem_get_info(ordinal)
            out.append(Reading(index, int(total - free), int(total), None))
        return out


_CLASSES: dict[str, type[Backend]] = {"nvml": NvmlBackend, "amdsmi": AmdSmiBackend, "torch": TorchBackend,
                                      "host": HostBackend}


def open_backend(name: str) -> Backend:
    """Open one backend by name; raises BackendUnavailable with the reason."""
    if name not in _CLASSES:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(ALL_BACKENDS)}")
    return _CLASSES[name]()


def detect_platform() -> str:
    """'cuda' / 'rocm' / 'cpu' from the device nodes present (no library import)."""
    if os.path.exists("/dev/nvidiactl"):
        return "cuda"
    if os.path.exists("/dev/kfd"):
        return "rocm"
    return "cpu"


def plan(platform: str, backend: str) -> list[list[str]]:
    """What to open: a list of slots, each a list of alternatives tried in order (first that opens wins).

    auto: cuda -> [nvml|torch] + host; rocm -> [amdsmi|torch] + host; cpu -> host. A named device backend is
    opened without fallback, still with host beside it; 'host' alone is just host."""
    if platform == "auto":
        platform = detect_platform()
    if platform not in ("cuda", "rocm", "cpu"):
        raise ValueError(f"unknown platform {platform!r}; choose from auto, cpu, cuda, rocm")
    if backend == "auto":
        device = {"cuda": ["nvml", "torch"], "rocm": ["amdsmi", "torch"]}.get(platform)
        return [device, ["host"]] if device else [["host"]]
    if backend not in ALL_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from auto, {', '.join(ALL_BACKENDS)}")
    return [[backend], ["host"]] if backend in DEVICE_BACKENDS else [["host"]]


def open_plan(slots: list[list[str]]) -> tuple[list[Backend], list[str], bool]:
    """Open each slot's first working alternative. Returns (backends, notes, every_slot_opened)."""
    opened: list[Backend] = []
    notes: list[str] = []
    complete = True
    for alternatives in slots:
        for name in alternatives:
            try:
                opened.append(open_backend(name))
                break
            except BackendUnavailable as e:
                notes.append(f"{name}: {e}")
            except Exception as e:  # noqa: BLE001 - a vendor library failing in an unexpected way
                notes.append(f"{name}: {type(e).__name__}: {e}")
        else:
            complete = False
    return opened, notes, complete
