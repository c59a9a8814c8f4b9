"""FAKE pynvml (nvidia-ml-py) for tests: only the names workflow_scripts.measure.vram calls, same return shapes and
units (bytes), serving devices from the module-level ``DEVICES`` list. Inject with
``monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)``. Written for these tests; not NVIDIA's code.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class NVMLError(Exception):
    pass


@dataclass
class FakeDevice:
    total: int                       # bytes
    used: int                        # bytes, device-wide
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory bytes or None)
    name: str = "NVIDIA H200"
    sm_clock_mhz: int = 1980
    sm_clock_max_mhz: int = 1980
    power_limit_mw: int = 700_000


@dataclass
class _Memory:  # the fields of c_nvmlMemory_t
    total: int
    free: int
    used: int


@dataclass
class _ProcessInfo:  # what nvmlDeviceGetComputeRunningProcesses returns per process
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(frozen=True)
class _Handle:
    index: int


DEVICES: list[FakeDevice] = []
STATE = {"initialized": False, "init_calls": 0, "shutdown_calls": 0}


def configure(devices: list[FakeDevice]) -> None:
    DEVICES[:] = devices
    STATE.update(initialized=False, init_calls=0, shutdown_calls=0)


def _check() -> None:
    if not STATE["initialized"]:
        raise NVMLError("Uninitialized")


def nvmlInit() -> None:
    STATE["initialized"] = True
    STATE["init_calls"] += 1


def nvmlShutdown() -> None:
    _check()
    STATE["initialized"] = False
    STATE["shutdown_calls"] += 1


def nvmlDeviceGetCount() -> int:
    _check()
    return len(DEVICES)


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _check()
    if not 0 <= index < len(DEVICES):
        raise NVMLError("Invalid Argument")
    return _Handle(index)


def nvmlDeviceGetMemoryInfo(handle: _Handle, version=None) -> _Memory:
    _check()
    d = DEVICES[handle.index]
    return _Memory(total=d.total, free=d.total - d.used, used=d.used)


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[_ProcessInfo]:
    _check()
    return [_ProcessInfo(pid, mem) for pid, mem in DEVICES[handle.index].processes]


NVML_CLOCK_SM = 1
# nvmlSystemGetCudaDriverVersion's encoding: 1000 * major + 10 * minor
DRIVER = {"version": "580.159.04", "cuda": 13000}


def nvmlSystemGetDriverVersion() -> str:
    _check()
    return DRIVER["version"]


def nvmlSystemGetCudaDriverVersion() -> int:
    _check()
    return DRIVER["cuda"]


def nvmlDeviceGetName(handle: _Handle) -> str:
    _check()
    return DEVICES[handle.index].name


def nvmlDeviceGetClockInfo(handle: _Handle, clock: int) -> int:
    _check()
    return DEVICES[handle.index].sm_clock_mhz


def nvmlDeviceGetMaxClockInfo(handle: _Handle, clock: int) -> int:
    _check()
    return DEVICES[handle.index].sm_clock_max_mhz


def nvmlDeviceGetPowerManagementLimit(handle: _Handle) -> int:
    _check()
    return DEVICES[handle.index].power_limit_mw


def nvmlDeviceGetPersistenceMode(handle: _Handle) -> int:
    _check()
    return 1
