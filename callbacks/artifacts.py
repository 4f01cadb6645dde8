"""Where the callbacks' figures go: the run folder, and the loggers that store files."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

__all__ = ["artifact_loggers", "figure_folder"]


def figure_folder(trainer: pl.Trainer) -> Path:
    """``<run folder>/calibration``: the TrackingLogger's run folder, else the log dir."""
    run_dir = getattr(trainer.logger, "local_run_dir", None)  # TrackingLogger's run folder
    return Path(run_dir or trainer.log_dir or trainer.default_root_dir) / "calibration"


def artifact_loggers(trainer: pl.Trainer) -> list[Any]:
    """One ``log(path, artifact_path=...)`` per logger that stores files (MLflow's)."""
    found = []
    for logger in trainer.loggers:
        log_file = getattr(logger, "log_file", None)  # TrackingLogger: spools on failure
        if callable(log_file):
            found.append(log_file)
            continue
        run_id = getattr(logger, "run_id", None)
        log_artifact = getattr(getattr(logger, "experiment", None), "log_artifact", None)
        if run_id is not None and callable(log_artifact):  # a plain MLFlowLogger
            found.append(functools.partial(log_artifact, run_id))
    return found
