"""The resolved config as artifact and params, and the tracking keys of every checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jsonargparse import Namespace
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

if TYPE_CHECKING:
    pass

from lightning_losses.tracking.constants import CHECKPOINT_KEY
from lightning_losses.tracking.params import flatten
from lightning_losses.tracking.summary import (
    describe_fit,
    describe_run,
    final_values,
    last_diagram,
)
from lightning_losses.tracking.uri import redact_uri


class TrackingConfigCallback(SaveConfigCallback):
    """The CLI's config callback: config, params and tags to MLflow; run in checkpoints; summary.

    With a :class:`TrackingLogger` it writes the resolved config to the run's own folder
    (``<save_dir>/<experiment id>/<run id>/config.yaml``; nothing is written to a file shared
    by all runs, so fits started at once in one directory keep their own) and logs it as the
    artifact ``config.yaml``, logs the flattened config as params (``None`` values left out;
    the module's hyper-parameters then add only the values linked from the data, such as
    ``model.input_dim``), and tags ``loss`` (the criterion class), ``dataset`` (the DataModule
    class) and ``config`` (the config file's name). With other loggers only, the config file
    goes to the log directory, as LightningCLI's own callback does. Every checkpoint records
    the MLflow run id, experiment id and tracking URI under ``checkpoint["tracking"]``.

    No secret is written: every string of the config that holds ``://`` (the tracking URI
    above all) is redacted (:func:`~lightning_losses.tracking.uri.redact_uri`: ``user:***@``,
    ``token=***``) in ``config.yaml``, its artifact and the params, and so is the checkpoint's
    tracking URI; a resume takes the credentials again from the user's URI or environment.

    On rank 0 it prints one line when a fit starts (:func:`describe_fit`: the criterion and
    the ``describe()`` of each callback that changes it) and a few when it ends
    (:func:`describe_run`: the run id, experiment and tracking URI; the final ``val/acc``,
    ``val/nll`` and ``val/ece``; the last reliability diagram; the checkpoint folder; how to
    see the run). Its lines begin with :attr:`command`; :meth:`final_values` words the final
    values.
    """

    #: The command named at the start of the printed lines.
    command = "lightning-losses fit"

    def final_values(self, metrics: Any) -> str:
        """The final values printed when a fit ends: ``val/acc``, ``val/nll``, ``val/ece``."""
        return final_values(metrics)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Save the config as Lightning does, into the run folder when a logger has one."""
        if not any(hasattr(logger, "local_run_dir") for logger in trainer.loggers):
            super().setup(trainer, pl_module, stage)
            return
        kept = self.save_to_log_dir
        self.save_to_log_dir = False  # the run folder gets it (save_config), not the shared root
        try:
            super().setup(trainer, pl_module, stage)
        finally:
            self.save_to_log_dir = kept

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Log the redacted config to each tracking logger: file, flat params and tags."""
        loggers = [logger for logger in trainer.loggers if hasattr(logger, "log_file")]
        if not loggers:
            return
        redacted = _redacted(self.config.clone())  # no password or token in any copy
        config = self.parser.dump(redacted, skip_none=False, format="yaml")
        as_dict = self.parser.dump(redacted, skip_none=False, format="json")
        flat = flatten(json.loads(as_dict), drop_none=True)
        flat.pop("config", None)
        model_prefix = "model.init_args." if "model.class_path" in flat else "model."
        criterion = type(getattr(pl_module, "criterion", None)).__name__
        datamodule = getattr(trainer, "datamodule", None)
        config_files = [str(p) for p in (self.config.get("config") or []) if p]
        tags = {"loss": criterion, "dataset": type(datamodule).__name__}
        if config_files:
            tags["config"] = Path(config_files[-1]).stem
        for logger in loggers:
            path = logger.local_run_dir / "config.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(config)
            logger.log_file(path)
            logger.log_params(flat)
            logger.set_tags(tags)
            if hasattr(logger, "model_param_prefix"):
                logger.model_param_prefix = model_prefix

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Print the criterion and the callbacks that change it (rank 0)."""
        if trainer.is_global_zero:
            print(f"{self.command}: {describe_fit(pl_module, trainer.callbacks)}", flush=True)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Print the run, its final values, diagram, checkpoint folder and viewer (rank 0)."""
        if not trainer.is_global_zero:
            return
        folders = [getattr(cb, "dirpath", None) for cb in trainer.checkpoint_callbacks]
        metrics = trainer.callback_metrics
        diagram = last_diagram(trainer.callbacks)
        values = self.final_values(metrics)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger._run_id is not None:
                summary = describe_run(logger, folders, metrics, diagram, values)
                print(f"{self.command}: {summary}", flush=True)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        """Store the MLflow run (id, experiment, redacted URI) in the checkpoint."""
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger._run_id is not None:
                checkpoint[CHECKPOINT_KEY] = {
                    "run_id": str(logger._run_id),
                    "experiment_id": str(logger._experiment_id),
                    "tracking_uri": redact_uri(str(logger._tracking_uri)),
                }


def _redacted(value: Any) -> Any:
    """``value`` with every string in it that holds ``://`` redacted (:func:`redact_uri`).

    Namespaces (changed in place), dicts, lists and tuples are walked; other values are kept.

    Example:
        >>> _redacted({"uri": ["http://u:pw@h:5000", 1], "name": "a:b@c"})
        {'uri': ['http://u:***@h:5000', 1], 'name': 'a:b@c'}
    """
    if isinstance(value, str):
        return redact_uri(value) if "://" in value else value
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redacted(item) for item in value)
    if isinstance(value, Namespace):
        for key, item in vars(value).items():
            setattr(value, key, _redacted(item))
    return value


def checkpoint_tracking(path: str | Path) -> dict[str, Any]:
    """What a checkpoint records of its MLflow run, and its global step.

    Returns:
        ``{"run_id", "experiment_id", "tracking_uri", "global_step"}`` for a checkpoint saved
        with :class:`TrackingConfigCallback` (the URI redacted, ``user:***@host``, unless the
        checkpoint predates redaction); ``{}`` for one saved without a run.
    """
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    info = dict(checkpoint.get(CHECKPOINT_KEY) or {})
    if info:
        info["global_step"] = int(checkpoint.get("global_step", 0))
    return info


def run_id_from_checkpoint(path: str | Path) -> str | None:
    """The MLflow run id a checkpoint was saved under (``None`` if it has none)."""
    return checkpoint_tracking(path).get("run_id")


def run_folder_root(checkpoint_path: str | Path, run_id: str, experiment_id: str) -> Path | None:
    """The ``save_dir`` a checkpoint was written under: the folder above its run folder.

    ``None`` unless the checkpoint lies inside ``<root>/<experiment id>/<run id>/``.

    Example:
        >>> run_folder_root("/x/mlflow_runs/1/abc/checkpoints/last.ckpt", "abc", "1").as_posix()
        '/x/mlflow_runs'
        >>> run_folder_root("/x/copied/last.ckpt", "abc", "1") is None
        True
    """
    for folder in Path(os.path.abspath(checkpoint_path)).parents:
        if folder.name == run_id and folder.parent.name == experiment_id:
            return folder.parent.parent
    return None
