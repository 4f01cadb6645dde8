"""Where the callbacks' figures go, and what their titles and axes name.

The run folder and the loggers that store files; a diagram's title names the run, its loss and
the epoch, and its axes the kind of task its bins hold.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from torch import Tensor

__all__ = ["artifact_loggers", "diagram_task", "diagram_title", "figure_folder", "loss_label"]

#: Words joining the parts of a title line.
SEPARATOR = " · "
#: The reduction every loss of the package defaults to: not repeated in a title.
_DEFAULT_REDUCTION = re.compile(r"(, )?reduction='mean'(, )?")
#: A bracketed list of values (no nested brackets).
_LIST = re.compile(r"\[([^\[\]]*)\]")


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


def loss_label(criterion: Any) -> str:
    """``FocalLoss(gamma=2.0)``: the loss's class and its current hyper-parameters, one line.

    The module's ``extra_repr`` (its hyper-parameters, as ``repr`` shows them) without the
    default ``reduction='mean'``, a list of more than three values as its length; an object
    that is no module is shown by its class name.

    Example:
        >>> from lightning_losses import AdaFocalLoss, FocalLoss
        >>> loss_label(FocalLoss(gamma=2.0)), loss_label(FocalLoss(reduction="sum"))
        ('FocalLoss(gamma=2.0)', "FocalLoss(gamma=2.0, reduction='sum')")
        >>> loss_label(AdaFocalLoss(num_bins=15))
        'AdaFocalLoss(num_bins=15, gammas=[15 values])'
    """
    extra = getattr(criterion, "extra_repr", None)
    args = _DEFAULT_REDUCTION.sub(_joined, extra()) if callable(extra) else ""
    return f"{type(criterion).__name__}({_LIST.sub(_counted, args)})"


def _counted(match: re.Match[str]) -> str:
    """A list of more than three values as its length (AdaFocal's per-bin gammas)."""
    values = match.group(1).split(",")
    return f"[{len(values)} values]" if len(values) > 3 else match.group(0)


def _joined(match: re.Match[str]) -> str:
    """What stays of ``, reduction='mean', ``: one separator when it sat between two others."""
    return ", " if match.group(1) and match.group(2) else ""


def _run_line(trainer: pl.Trainer) -> str | None:
    """``digits_focal · run 3f2a9c1e``: the run's name and id from the first logger with them.

    MLflow's loggers (and so :class:`~lightning_losses.tracking.TrackingLogger`) keep the run's
    name (a shipped config's ``run_name`` is the config's name) and, once the run is created,
    its id.
    """
    for logger in trainer.loggers:
        name = getattr(logger, "_run_name", None)
        run_id = getattr(logger, "_run_id", None)
        if name or run_id:
            parts = [str(name)] if name else []
            return SEPARATOR.join([*parts, f"run {run_id[:8]}"] if run_id else parts)
    return None


def diagram_title(
    trainer: pl.Trainer, what: str, pl_module: Any = None, attribute: str = "criterion"
) -> str:
    """A diagram's title: the run (name, id), then the loss and ``what`` (``val, epoch 19``).

    ``digits_focal · run 3f2a9c1e`` on the first line, where a logger names the run, and
    ``FocalLoss(gamma=2.0) · val, epoch 19`` on the second, where ``pl_module`` (default: the
    trainer's module) has a loss at ``attribute``.

    Example:
        >>> import lightning.pytorch as pl
        >>> diagram_title(pl.Trainer(logger=False), "val, epoch 3")
        'val, epoch 3'
    """
    module = pl_module if pl_module is not None else getattr(trainer, "lightning_module", None)
    criterion = getattr(module, attribute, None) if module is not None else None
    second = SEPARATOR.join([loss_label(criterion), what]) if criterion is not None else what
    first = _run_line(trainer)
    return f"{first}\n{second}" if first else second


def diagram_task(preds: Tensor, target: Tensor) -> str:
    """What the calibration bins of these outputs hold: ``multiclass``, ``binary``, ``multilabel``.

    As the calibration metrics read them
    (:func:`~lightning_losses.calibration.functional.resolve_task`): ``[N]`` preds are binary,
    ``[N, C]`` with ``[N]`` targets (or dense ``[N, C, *]``) multiclass, ``[N, K]`` with
    ``[N, K]`` targets multi-label. A diagram labels its axes by it.

    Example:
        >>> import torch
        >>> diagram_task(torch.zeros(4), torch.ones(4))
        'binary'
        >>> diagram_task(torch.zeros(4, 3), torch.ones(4, 3))
        'multilabel'
    """
    from lightning_losses.calibration.functional import resolve_task

    return resolve_task(preds, target, None)
