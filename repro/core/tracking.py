"""Experiment trackers: the training's per-step scalars to TensorBoard, Weights & Biases or Trackio.

`train.report_to` picks one (default none). The trainer (rank 0) calls

    tracker = make_tracker(cfg.train.report_to, run_dir, run_name, config, start_step)
    tracker.log({"train/loss": 2.31, "train/lr": 2e-4, ...}, step)
    tracker.close()

Offline by default, so a run never needs a network or an account:
- tensorboard: event files under <run_dir>/tb/ (`tensorboard --logdir <output_dir>` shows all runs);
- wandb: WANDB_MODE=offline unless the environment sets it (`wandb sync <run_dir>/wandb/...` uploads
  later), files under <run_dir>/wandb/;
- trackio: its local database, under <run_dir>/trackio/ unless TRACKIO_DIR is set (and local
  unless TRACKIO_SPACE_ID names a Space).

The packages are optional: `missing_package` says which pip command a choice needs, and
repro/preflight.py reports it (key train.report_to) before a run starts.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Protocol

from repro.core.errors import UserValueError

PROJECT = "cluster-repro"  # the wandb / trackio project every run logs to
TB_DIR = "tb"  # <run_dir>/tb/: TensorBoard event files

# report_to -> (the module it imports, the pip command that installs it).
PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": (
        "tensorboard",
        "pip install tensorboard (or the extra: pip install 'cluster-repro[tensorboard]')",
    ),
    "wandb": ("wandb", "pip install wandb"),
    "trackio": ("trackio", "pip install trackio"),
}


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None:
        """Scalars of one optimizer step (0-based, as in train_log)."""
        ...

    def flush(self) -> None:
        """Make what was logged durable (at each checkpoint: a killed run resumes from there)."""
        ...

    def close(self) -> None: ...


class NoTracker:
    """report_to: none."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """Event files under <run_dir>/tb/. A resumed run starts a new file with purge_step: steps at
    or after the checkpoint it resumed from, logged by the killed attempt, are dropped by readers
    (TensorBoard's EventAccumulator), so every step shows once. The steps before it were
    flushed when the checkpoint was written."""

    def __init__(self, run_dir: Path, start_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            log_dir=str(Path(run_dir) / TB_DIR), purge_step=start_step or None, flush_secs=30
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path, run_name: str, config: dict[str, Any]) -> None:
        os.environ.setdefault("WANDB_MODE", "offline")
        import wandb

        self.run = wandb.init(project=PROJECT, name=run_name, dir=str(run_dir), config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def flush(self) -> None:
        pass  # wandb's offline writer persists each log call itself

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    def __init__(self, run_dir: Path, run_name: str, config: dict[str, Any]) -> None:
        os.environ.setdefault("TRACKIO_DIR", str(Path(run_dir) / "trackio"))  # read at import
        import trackio

        self.trackio = trackio
        trackio.init(project=PROJECT, name=run_name, config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.trackio.log(metrics, step=step)

    def flush(self) -> None:
        pass  # trackio commits to its local database itself

    def close(self) -> None:
        self.trackio.finish()


def missing_package(report_to: str) -> str | None:
    """None when `report_to` can be used here; otherwise what is missing and the pip command."""
    if report_to not in PACKAGES:
        return None
    module, command = PACKAGES[report_to]
    if importlib.util.find_spec(module) is not None:
        return None
    return f"{report_to} needs the {module} package, which is not installed here: {command}"


def make_tracker(
    report_to: str, run_dir: Path, run_name: str, config: dict[str, Any], start_step: int = 0
) -> Tracker:
    """The tracker `train.report_to` names; ValueError naming the key when its package is
    missing (preflight reports that before a run; this is for callers that skip preflight)."""
    if report_to == "none":
        return NoTracker()
    problem = missing_package(report_to)
    if problem:
        raise UserValueError(f"train.report_to: {problem}")
    if report_to == "tensorboard":
        return TensorBoardTracker(run_dir, start_step)
    if report_to == "wandb":
        return WandbTracker(run_dir, run_name, config)
    if report_to == "trackio":
        return TrackioTracker(run_dir, run_name, config)
    raise UserValueError(f"train.report_to: expected one of none, {', '.join(PACKAGES)}; got {report_to!r}")
