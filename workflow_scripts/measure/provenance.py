"""Where a number came from: code version (the commit and a hash of every module the run executed), config, packages,
devices, the machine (measure/machine.py: driver, CUDA runtime, NCCL, topology, clocks, power limits, CPU model),
host, container (measure/container.py: the image's digest and recipe commit), scheduler, times.

The git commit is the project's own: that of the repository whose top level holds this code. A copy of the
project without its own .git inside another repository records no commit (and says why), never the other one's.

Only an allow-list of facts is recorded; the environment is never dumped, so tokens such as HF_TOKEN or
WANDB_API_KEY cannot leak into results.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

from workflow_scripts.measure import container, machine

PACKAGES = ("torch", "deepspeed", "transformers", "datasets", "tokenizers", "snakemake", "nvidia-ml-py", "amdsmi")
ENV_FACTS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_PARTITION", "APPTAINER_CONTAINER",
             "SINGULARITY_CONTAINER", "APPTAINER_NAME", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
             "HIP_VISIBLE_DEVICES", "DS_ACCELERATOR", "NCCL_NVLS_ENABLE")


PROJECT = Path(__file__).resolve().parents[2]  # the checkout this code runs from


def git_state(project: Path = PROJECT) -> dict:
    def git(*args):
        return subprocess.run(["git", *args], cwd=project, capture_output=True, text=True, timeout=30).stdout.strip()

    try:
        top = git("rev-parse", "--show-toplevel")
        if not top:
            given = os.environ.get("PIPELINE_COMMIT")  # a copy of a checkout without its .git (tools/gpu_session.sh)
            if given:
                return {"commit": given, "dirty": None, "why": "PIPELINE_COMMIT: a copy of the checkout, no .git"}
            return {"commit": None, "dirty": None, "why": "not a git checkout"}
        if Path(top).resolve() != project.resolve():
            return {"commit": None, "dirty": None, "why": f"the project has no .git of its own (inside {top})"}
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "why": "git not runnable"}
    return {"commit": commit or None, "dirty": dirty if commit else None}


# the code a training run executes: the job and the ranks' package (the loop, strategies, engines, parallel
# dimensions); a change to any of these files can change a run's numbers
EXECUTED = ("workflow_scripts/job", "workflow_scripts/training")


def code_state(project: Path = PROJECT) -> dict:
    """The code a run executed: each module's SHA-256 (12 hex digits, path relative to the project) and one hash
    over them all, so that two runs name the modules that differ between them whatever git says."""
    modules = {}
    for folder in EXECUTED:
        for path in sorted((project / folder).rglob("*.py")):
            modules[path.relative_to(project).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    whole = hashlib.sha256(json.dumps(modules, sort_keys=True).encode()).hexdigest()[:16]
    return {"hash": whole, "modules": modules}


def changed_modules(old: dict | None, new: dict | None) -> list[str] | None:
    """The modules whose code differs between two runs' code_state (added or removed ones too); None where either
    run recorded none."""
    if not (old and new and "modules" in old and "modules" in new):
        return None
    a, b = old["modules"], new["modules"]
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def changed_between(old: str, new: str, project: Path = PROJECT) -> list[str] | None:
    """The executed modules (EXECUTED) that git says differ between two commits; None where this checkout lacks
    either commit or git does not run."""
    try:
        out = subprocess.run(["git", "diff", "--name-only", old, new, "--", *EXECUTED], cwd=project,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sorted(line for line in out.stdout.splitlines() if line.endswith(".py"))


def config_hash(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


def package_versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_facts() -> dict:
    import torch

    facts = {"torch_cuda": torch.version.cuda, "torch_hip": getattr(torch.version, "hip", None),
             "device_count": 0, "device_names": []}
    if torch.cuda.is_available():
        facts["device_count"] = torch.cuda.device_count()
        facts["device_names"] = [torch.cuda.get_device_name(i) for i in range(facts["device_count"])]
    facts["cpu"] = platform.processor() or platform.machine()
    facts["cpu_count"] = os.cpu_count()
    return facts


def torch_facts() -> dict:
    """The facts read through torch (devices; CUDA, NCCL and cuDNN versions; the machine's GPUs and topology). Rank 0
    records them in its train summary (`TORCH_FACTS`), so the launcher of a run that trained never imports torch
    (training/context.py says what that costs); it reads them itself for a run that did not."""
    return {"devices": device_facts(), "machine": machine.facts()}


TORCH_FACTS = "torch_facts"  # the train summary's key for them


def collect(run_cfg: dict, start: float, end: float, study_cfg_hash: str | None = None,
            measured: dict | None = None) -> dict:
    """The run's provenance; `measured`: torch_facts() as rank 0 read them (read here without)."""
    return {
        "git": git_state(),
        "code": code_state(),
        "config_hash": study_cfg_hash or config_hash(run_cfg),
        "run_config_hash": config_hash(run_cfg),
        "packages": package_versions(),
        "python": platform.python_version(),
        **(measured or torch_facts()),
        "host": socket.gethostname(),
        "os": platform.platform(),
        # the machine's facts, and every PIPELINE_* variable (the pipeline's own switches: a diagnostic among them)
        "env": {k: v for k, v in sorted(os.environ.items()) if k in ENV_FACTS or k.startswith("PIPELINE_")},
        "container": os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER"),
        "image": container.facts(),  # the image's digest and recipe commit, read inside it; None on the host
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "substitutions": run_cfg.get("substitutions", []),
        "start_unix": start,
        "end_unix": end,
    }
