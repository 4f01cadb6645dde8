"""What a fit prints at its start and end: the fit's description and its final values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

from lightning_losses.tracking.uri import redact_uri, view_command


def describe_fit(pl_module: Any, callbacks: Iterable[Any]) -> str:
    """One line naming a fit's criterion and what changes it during training.

    The criterion's repr (its hyper-parameters) on one line, then the ``describe()`` text of
    every callback that has such a method returning a string (schedules, loss switches,
    AdaFocal's updates), in the trainer's order.

    Example:
        >>> from lightning_losses import FocalLoss
        >>> class Module:
        ...     criterion = FocalLoss(gamma=2.0)
        >>> class Halve:
        ...     def describe(self) -> str:
        ...         return "gamma halved every epoch"
        >>> describe_fit(Module(), [Halve(), object()])
        "criterion FocalLoss(gamma=2.0, reduction='mean'); gamma halved every epoch"
        >>> describe_fit(Module(), [])
        "criterion FocalLoss(gamma=2.0, reduction='mean'); fixed during training"
    """
    criterion = getattr(pl_module, "criterion", None)
    # A function by its name; a loss module (no __name__) by its repr, on one line.
    shown = getattr(criterion, "__name__", None) or " ".join(repr(criterion).split())
    described = []
    for callback in callbacks:
        describe = getattr(callback, "describe", None)
        text = describe() if callable(describe) else None
        if isinstance(text, str) and text.strip():
            described.append(" ".join(text.split()))
    return f"criterion {shown}; " + ("; ".join(described) or "fixed during training")


#: The validation metrics a fit's closing summary reports, in this order (those logged).
SUMMARY_METRICS = ("val/acc", "val/nll", "val/ece")


def final_values(metrics: Mapping[str, Any], keys: Sequence[str] = SUMMARY_METRICS) -> str:
    """``"val/acc 0.9123, val/nll 0.3012"``: the ``keys`` found in ``metrics``, 4 decimals.

    Example:
        >>> final_values({"val/nll": 0.30121, "val/acc": 0.9, "train/loss": 1.0})
        'val/acc 0.9000, val/nll 0.3012'
        >>> final_values({})
        ''
    """
    return ", ".join(f"{key} {float(metrics[key]):.4f}" for key in keys if key in metrics)


def describe_run(
    logger: Any,
    checkpoint_dirs: Iterable[str | Path | None],
    metrics: Mapping[str, Any] | None = None,
    diagram: str | Path | None = None,
    values: str | None = None,
) -> str:
    """A few lines on a finished fit: its run, final validation values, diagram, files, viewer.

    Args:
        logger: an ``MLFlowLogger`` (such as :class:`TrackingLogger`) whose run has started.
        checkpoint_dirs: the folders the fit's checkpoints were written to (``None``, a
            checkpoint callback without a folder, is left out).
        metrics: the values logged last (``trainer.callback_metrics``): ``val/acc``,
            ``val/nll`` and ``val/ece`` are shown, 4 decimals, those present.
        diagram: the last reliability diagram written (``CalibrationMonitor.last_diagram``).
        values: the final validation values as text, instead of :func:`final_values` of
            ``metrics`` (the language model's perplexity and token ECE).

    Returns:
        The run line (run id, experiment, tracking URI redacted by :func:`redact_uri`), then
        one line each, indented, for the final validation values, the reliability diagram
        (when there are such), the checkpoint folder and the command to see the run (a
        server's address without its credentials, :func:`view_command`).
    """
    uri = str(logger._tracking_uri)  # printed redacted: never a password or a token
    name = getattr(logger, "_experiment_name", None)
    if not getattr(logger, "spooled", 0):  # ask the store (a run continued by id may differ)
        try:
            name = logger.experiment.get_experiment(logger.experiment_id).name
        except Exception:
            pass
    folders = ", ".join(dict.fromkeys(str(d) for d in checkpoint_dirs if d)) or "none"
    lines = [f"MLflow run {logger.run_id} (experiment {name!r}) in {redact_uri(uri)}"]
    values = final_values(metrics or {}) if values is None else values
    if values:
        lines.append(f"  final validation: {values}")
    if diagram:
        lines.append(f"  reliability diagram: {diagram}")
    lines.append(f"  checkpoints: {folders}")
    lines.append(f"  to see it: {view_command(uri)}")
    return "\n".join(lines)


def last_diagram(callbacks: Iterable[Any]) -> Path | None:
    """The last reliability diagram a callback wrote (its ``last_diagram``), if any."""
    found = None
    for callback in callbacks:
        path = getattr(callback, "last_diagram", None)
        if path:
            found = Path(path)
    return found
