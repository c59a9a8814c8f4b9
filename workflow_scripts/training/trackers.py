"""The experiment trackers a study logs to (config `trackers`), on rank 0: TensorBoard event files, a Weights &
Biases run, an MLflow run, each in the run's folder and none needing a network or an account.

- tensorboard: `runs/.../tensorboard/` (torch's SummaryWriter);
- wandb: offline unless WANDB_MODE says otherwise, `runs/.../wandb/offline-run-*`; `wandb sync <that folder>`
  uploads it later from a machine with network and an account;
- mlflow: a local file store, `runs/.../mlruns/` (`mlflow ui --backend-store-uri <that folder>` shows it; MLflow
  keeps the file store in maintenance mode, so MLFLOW_ALLOW_FILE_STORE is set for it).

Every tracker gets the same scalars under the names a Trainer or torchtitan user reads (SCALARS): per logged step
the loss, learning rate, step time and its phases, tokens/s, MFU (on a GPU with a known peak), the allocator's memory
(on a GPU) and the VRAM sampler's highest device-wide and host memory since the previous logged step (SamplerTail,
from the rows the sampler has written to the run's vram.csv); at the end the validation loss. Each tracker's run id
and folder (relative to the run's folder) go into the run's provenance (`facts`).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from workflow_scripts.units import GIB

# tracker -> the module it needs, the requirement that installs it, and how envs/setup.sh installs it
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
REQUIREMENTS = "envs/requirements-trackers.txt"
SETUP = "bash envs/setup.sh --trackers"

# the metrics.csv column (or the value computed from it) -> the scalar's name in every tracker
SCALARS = {"loss": "train/loss", "lr": "train/learning_rate", "step_time_s": "train/step_time_s",
           "forward_s": "train/forward_s", "backward_s": "train/backward_s", "optimizer_s": "train/optimizer_s",
           "tokens_per_s": "train/tokens_per_s", "mfu": "train/mfu", "allocated_gib": "memory/allocated_gib",
           "reserved_gib": "memory/reserved_gib", "device_used_gib": "memory/device_used_gib",
           "host_used_gib": "memory/host_used_gib", "val_loss": "val/loss"}


def missing(names: list[str]) -> list[str]:
    """The configured trackers whose package this Python cannot import, one line each (config_check)."""
    from importlib.util import find_spec

    return [f"trackers: {name} needs the Python package {PACKAGES[name]!r}, not installed here: {SETUP} "
            f"({REQUIREMENTS})" for name in names if find_spec(PACKAGES[name]) is None]


class Trackers:
    """The run's open trackers (none where the study names none: nothing is imported then)."""

    def __init__(self, names: list[str], out_dir: Path, run_id: str, study: str, settings: dict):
        self.names, self.out_dir = list(names), Path(out_dir)
        self.board = self.wandb_run = self.mlflow = None
        self._facts: dict = {}
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(str(self.out_dir / "tensorboard"))
            self._facts["tensorboard"] = {"dir": "tensorboard"}
        if "wandb" in names:
            import wandb

            os.environ.setdefault("WANDB_MODE", "offline")
            os.environ.setdefault("WANDB_SILENT", "true")
            self.wandb_run = wandb.init(project=study, name=run_id, dir=str(self.out_dir), config=settings,
                                        reinit="create_new")
            self._facts["wandb"] = {"run_id": self.wandb_run.id, "mode": os.environ["WANDB_MODE"],
                                    "dir": str(Path(self.wandb_run.dir).parent.resolve()
                                               .relative_to(self.out_dir.resolve()))}
        if "mlflow" in names:
            import mlflow

            # the file store needs no server and no database (mlflow-skinny has no SQL store); MLflow keeps it
            # in maintenance and refuses it unless told
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            store = self.out_dir / "mlruns"
            self.mlflow = mlflow.tracking.MlflowClient(tracking_uri=store.resolve().as_uri())
            experiment = self.mlflow.get_experiment_by_name(study)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self.mlflow.create_experiment(study))
            self.mlflow_run = self.mlflow.create_run(experiment_id, run_name=run_id)
            params = [mlflow.entities.Param(k, v) for k, v in _flat(settings).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
                self.mlflow.log_batch(self.mlflow_run.info.run_id, params=params[i:i + 100])
            self._facts["mlflow"] = {"run_id": self.mlflow_run.info.run_id, "dir": "mlruns"}

    def log(self, step: int, values: dict) -> None:
        """One step's scalars (keys of SCALARS; a value that is None is not logged)."""
        scalars = {SCALARS[k]: float(v) for k, v in values.items() if v is not None}
        if self.board is not None:
            for name, v in scalars.items():
                self.board.add_scalar(name, v, step)
        if self.wandb_run is not None:
            self.wandb_run.log(scalars, step=step)
        if self.mlflow is not None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self.mlflow.log_batch(self.mlflow_run.info.run_id,
                                  metrics=[Metric(name, v, now, step) for name, v in scalars.items()])

    def flush(self) -> None:
        if self.board is not None:
            self.board.flush()

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if self.mlflow is not None:
            self.mlflow.set_terminated(self.mlflow_run.info.run_id)

    def facts(self) -> dict:
        """Each tracker's run id and folder, for the run's provenance."""
        return dict(self._facts)


class SamplerTail:
    """The VRAM sampler's rows as it writes them (whole lines, about once a second, to the run's vram.csv): at each
    call the highest `used_bytes` of the rows written since the previous call, over the devices (device >= 0, the
    device-wide figure) and for the host (device -1), in GiB; none where no row came (or no sampler runs)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.columns = Path(path), 0, None

    def peaks(self) -> dict:
        if not self.path.exists():
            return {}
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        whole = chunk[:chunk.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self.offset += len(whole)
        device, host = [], []
        for line in whole.decode().splitlines():
            cells = line.split(",")
            if self.columns is None:
                self.columns = {name: i for i, name in enumerate(cells)}
                continue
            used = cells[self.columns["used_bytes"]]
            if used:
                (host if int(cells[self.columns["device"]]) < 0 else device).append(int(used))
        return ({"device_used_gib": max(device) / GIB} if device else {}) | (
            {"host_used_gib": max(host) / GIB} if host else {})


def _flat(settings: dict, prefix: str = "") -> dict:
    """Nested settings as MLflow parameters: dotted keys, values as text (MLflow caps a value at 6,000 characters)."""
    out = {}
    for k, v in settings.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)[:6000]
    return out
