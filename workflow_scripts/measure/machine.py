"""What the machine is, for provenance: the facts that explain why two machines of the same kind time the same run
tens of percent apart (driver, CUDA runtime, NCCL/RCCL, GPU topology, clocks and power limits, CPU model).

Every fact is read through the vendor library the sampler already uses (nvidia-ml-py's NVML, amdsmi) or the
torch build; a fact a machine cannot give is None, never a guess. The topology matrix comes from `nvidia-smi topo
-m` / `rocm-smi --showtopo` where those tools exist.
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo on Linux; platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_facts() -> dict | None:
    """Driver, CUDA driver API version and per GPU: name, SM clocks (current, max), power limit (W), persistence."""
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:  # no NVML (CPU machine, AMD GPU)
        return None
    try:
        cuda = nv.nvmlSystemGetCudaDriverVersion()
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            gpus.append({"index": i, "name": _text(nv.nvmlDeviceGetName(h)),
                         "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                         "sm_clock_max_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
                         "power_limit_w": nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
                         "persistence_mode": bool(nv.nvmlDeviceGetPersistenceMode(h))})
        return {"vendor": "nvidia", "driver": _text(nv.nvmlSystemGetDriverVersion()),
                "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}", "gpus": gpus}
    except Exception as exc:  # a fact NVML refuses (e.g. on a MIG slice): say which
        return {"vendor": "nvidia", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        nv.nvmlShutdown()


def amdsmi_facts() -> dict | None:
    try:
        import amdsmi

        amdsmi.amdsmi_init()
    except Exception:
        return None
    try:
        handles = amdsmi.amdsmi_get_processor_handles()
        driver = amdsmi.amdsmi_get_gpu_driver_info(handles[0]) if handles else {}
        return {"vendor": "amd", "driver": driver.get("driver_version"), "gpus": len(handles)}
    except Exception as exc:
        return {"vendor": "amd", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        amdsmi.amdsmi_shut_down()


def topology() -> str | None:
    """The GPU interconnect matrix as the vendor tool prints it."""
    for tool, args in (("nvidia-smi", ["topo", "-m"]), ("rocm-smi", ["--showtopo"])):
        if shutil.which(tool):
            try:
                done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                continue
            if done.returncode == 0:
                return re.sub(r"\x1b\[[0-9;]*m", "", done.stdout).strip()  # without the terminal's underlining
    return None


def collective_library() -> str | None:
    """NCCL's (RCCL's on ROCm builds) version as torch links it."""
    import torch

    try:
        version = torch.cuda.nccl.version()
    except Exception:  # a CPU build has no NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def facts() -> dict:
    import torch

    hip = getattr(torch.version, "hip", None)  # amdsmi only on ROCm builds (its import is noisy elsewhere)
    return {"cpu_model": cpu_model(), "gpu": nvml_facts() or (amdsmi_facts() if hip else None),
            "cuda_runtime": torch.version.cuda, "hip_runtime": hip,
            "nccl": collective_library(),
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "topology": topology()}
