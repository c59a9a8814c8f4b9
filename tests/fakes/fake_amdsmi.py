"""FAKE amdsmi for tests, matching the installed amdsmi 7.0.2 (amdsmi_interface.py) in the names and return shapes
workflow_scripts.measure.vram uses:

- ``amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS)``, ``amdsmi_shut_down()``
- ``amdsmi_get_processor_handles()`` -> list of opaque handles
- ``amdsmi_get_gpu_vram_usage(h)`` -> ``{"vram_total": MB, "vram_used": MB}`` (MB = 2**20 bytes, whole numbers)
- ``amdsmi_get_gpu_memory_usage(h, AmdSmiMemoryType.VRAM)`` / ``amdsmi_get_gpu_memory_total(...)`` -> bytes; a
  mem_type that is not an AmdSmiMemoryType raises AmdSmiParameterException
- ``amdsmi_get_gpu_process_list(h)`` -> list of dicts ``{"name", "pid", "mem", "engine_usage": {"gfx", "enc"},
  "memory_usage": {"gtt_mem", "cpu_mem", "vram_mem"} (bytes), "cu_occupancy"}``

``configure(..., byte_calls=False)`` removes the byte-exact calls (as in older amdsmi); ``legacy_process_info=True``
makes the process list return handles resolved by ``amdsmi_get_gpu_process_info(h, p)`` (amdsmi <= 6.2).
Inject with ``monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi)``. Written for these tests; not AMD's code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

MB = 1024 * 1024


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int):
        super().__init__(err_code)
        self.err_code = abs(err_code)


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received, expected):
        super().__init__(f"expected {expected}, got {type(received).__name__}")


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2
    INIT_NON_AMD_CPUS = 4
    INIT_NON_AMD_GPUS = 8
    INIT_AMD_APUS = 3


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class amdsmi_processor_handle:  # opaque, like the real ctypes pointer type
    def __init__(self, index: int):
        self._index = index


@dataclass
class FakeGpu:
    total: int                                                  # bytes
    used: int                                                   # bytes
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, vram bytes)


@dataclass(frozen=True)
class _ProcessHandle:  # amdsmi <= 6.2 process handle
    gpu: int
    slot: int


DEVICES: list[FakeGpu] = []
STATE = {"initialized": False, "legacy": False}
_BYTE_CALLS: dict = {}


def configure(devices: list[FakeGpu], byte_calls: bool = True, legacy_process_info: bool = False) -> None:
    DEVICES[:] = devices
    STATE.update(initialized=False, legacy=legacy_process_info)
    namespace = globals()  # this module's attributes
    for name, fn in _BYTE_CALLS.items():
        if byte_calls:
            namespace[name] = fn
        else:
            namespace.pop(name, None)
    if legacy_process_info:
        namespace["amdsmi_get_gpu_process_info"] = _get_gpu_process_info
    else:
        namespace.pop("amdsmi_get_gpu_process_info", None)


def _gpu(handle) -> FakeGpu:
    if not STATE["initialized"]:
        raise AmdSmiLibraryException(32)  # AMDSMI_STATUS_NOT_INIT
    if not isinstance(handle, amdsmi_processor_handle):
        raise AmdSmiParameterException(handle, amdsmi_processor_handle)
    return DEVICES[handle._index]


def amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
    if not isinstance(flag, AmdSmiInitFlags):
        raise AmdSmiParameterException(flag, AmdSmiInitFlags)
    STATE["initialized"] = True


def amdsmi_shut_down() -> None:
    STATE["initialized"] = False


def amdsmi_get_processor_handles() -> list[amdsmi_processor_handle]:
    if not STATE["initialized"]:
        raise AmdSmiLibraryException(32)
    return [amdsmi_processor_handle(i) for i in range(len(DEVICES))]


def amdsmi_get_gpu_vram_usage(processor_handle) -> dict:
    g = _gpu(processor_handle)
    return {"vram_total": g.total // MB, "vram_used": g.used // MB}


def _check_mem_type(mem_type) -> None:
    if not isinstance(mem_type, AmdSmiMemoryType):
        raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)


def amdsmi_get_gpu_memory_usage(processor_handle, mem_type) -> int:
    g = _gpu(processor_handle)
    _check_mem_type(mem_type)
    return g.used if mem_type == AmdSmiMemoryType.VRAM else 0


def amdsmi_get_gpu_memory_total(processor_handle, mem_type) -> int:
    g = _gpu(processor_handle)
    _check_mem_type(mem_type)
    return g.total if mem_type == AmdSmiMemoryType.VRAM else 0


_BYTE_CALLS.update(amdsmi_get_gpu_memory_usage=amdsmi_get_gpu_memory_usage,
                   amdsmi_get_gpu_memory_total=amdsmi_get_gpu_memory_total)


def _info(pid: int, vram: int) -> dict:
    return {"name": "python", "pid": pid, "mem": vram, "engine_usage": {"gfx": 0, "enc": 0},
            "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": vram}, "cu_occupancy": 0}


def amdsmi_get_gpu_process_list(processor_handle) -> list:
    g = _gpu(processor_handle)
    if STATE["legacy"]:
        return [_ProcessHandle(processor_handle._index, i) for i in range(len(g.processes))]
    return [_info(pid, vram) for pid, vram in g.processes]


def _get_gpu_process_info(processor_handle, process: _ProcessHandle) -> dict:
    g = _gpu(processor_handle)
    return _info(*g.processes[process.slot])
