"""The parts of :class:`~lightning_losses.callbacks.PostHocCalibration` that are not hooks.

The methods it tries and their arguments, the scores it logs before and after calibration, the
MLflow tags, and how it reports what the calibrators' own fits would warn about: a method that
cannot be scored (:func:`unscored_reason`) and fits run quietly inside it (:func:`quiet_fits`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import lightning.pytorch as pl
from torch import Tensor

from lightning_losses.warning import LightningLossesWarning

if TYPE_CHECKING:
    from lightning_losses.calibration.functional import Task
    from lightning_losses.calibration.posthoc.base import PostHocCalibrator

__all__ = [
    "CALIBRATED",
    "DEFAULT_METHODS",
    "KINDS",
    "PREFIX",
    "QUANTITIES",
    "Bins",
    "calibrator_template",
    "method_kwargs",
    "method_names",
    "quiet_fits",
    "set_tags",
    "split_scores",
    "unscored_reason",
]

#: The methods tried when none are named: one to four parameters per class, and isotonic.
DEFAULT_METHODS = ("temperature", "vector", "ensemble_temperature", "isotonic")
#: The quantities logged before and after calibration, per stage.
QUANTITIES = ("nll", "ece", "smooth_ece")
#: Calibrated metrics are ``<stage>/posthoc_<quantity>``: ``val/posthoc_nll``, ``test/posthoc_ece``.
CALIBRATED = "posthoc_"
#: Metrics and tags that are not per split: ``posthoc/cv_nll_<method>``,
#: ``posthoc/fallback_<method>``, the tags ``posthoc/method`` and ``posthoc/fallbacks``.
PREFIX = "posthoc/"
#: What a stage's first batch holds: class labels, 0/1 binary targets, multi-label targets, or
#: soft labels (``TemperatureScalingCallback(soft_labels=True)``).
KINDS = ("multiclass", "binary", "multilabel", "soft")
#: The bin sums (count, conf_sum, correct_sum) of a reliability diagram.
Bins = tuple[Tensor, Tensor, Tensor]


def method_names(methods: Sequence[str] | str, owner: str) -> tuple[str, ...]:
    """The registry names ``methods`` stands for (``"all"``: every one).

    Raises:
        ValueError: no method, an unknown one or one named twice; the message lists the known.
    """
    from lightning_losses.calibration.posthoc import CALIBRATION_METHODS

    known = ", ".join(repr(m) for m in CALIBRATION_METHODS)
    if methods == "all":
        return tuple(CALIBRATION_METHODS)
    names = [methods] if isinstance(methods, str) else list(methods)
    unknown = [m for m in names if not isinstance(m, str) or m not in CALIBRATION_METHODS]
    if not names or unknown or len(set(names)) != len(names):
        problem = "no method" if not names else f"unknown {unknown}" if unknown else "repeats"
        raise ValueError(
            f"{owner}(methods={methods!r}): {problem}; give distinct methods among {known}, or "
            "'all' (every method that applies to the task)"
        )
    return tuple(names)


def method_kwargs(
    method_args: Mapping[str, Mapping[str, Any]] | None, methods: tuple[str, ...], owner: str
) -> dict[str, dict[str, Any]]:
    """``method_args`` as plain dicts, each for a method of ``methods``.

    Raises:
        TypeError: not a mapping of mappings.
        ValueError: hyper-parameters of a method that is not tried.
    """
    if method_args is None:
        return {}
    where = f"{owner}(method_args={method_args!r})"
    if not isinstance(method_args, Mapping) or not all(
        isinstance(v, Mapping) for v in method_args.values()
    ):
        raise TypeError(
            f"{where}: give a mapping from method name to its keyword arguments, e.g. "
            "{'vector': {'max_iter': 50}}"
        )
    extra = sorted(set(method_args) - set(methods))
    if extra:
        raise ValueError(f"{where}: {extra} are not among methods={list(methods)}")
    return {method: dict(kwargs) for method, kwargs in method_args.items()}


def calibrator_template(method: str, kwargs: Mapping[str, Any], owner: str) -> PostHocCalibrator:
    """An unfitted calibrator of ``method`` built with ``kwargs``; errors name the argument."""
    from lightning_losses.calibration.posthoc import get_calibrator

    try:
        return get_calibrator(method, **kwargs)
    except (TypeError, ValueError) as error:
        raise type(error)(
            f"{owner}(method_args={{{method!r}: {dict(kwargs)!r}}}): {error}"
        ) from error


def split_scores(
    log_probs: Tensor, target: Tensor, *, binary: bool, n_bins: int
) -> tuple[dict, Bins]:
    """NLL, ECE (equal-width bins) and smooth ECE of float64 log-probabilities ``[N, C]``.

    Binary tasks (``binary``) score the positive class's probability, as
    :class:`~lightning_losses.callbacks.CalibrationMonitor` does for ``[N]`` logits.
    """
    from lightning_losses.calibration import functional as CF
    from lightning_losses.calibration.smooth import smooth_calibration_error

    nll = CF.negative_log_likelihood(
        log_probs, target, input_format="logits", task="multiclass", validate_args=False
    )
    probs = log_probs.exp()
    preds = probs[:, 1].contiguous() if binary else probs
    task: Task = "binary" if binary else "multiclass"
    confidence, correct = CF.confidence_and_correct(
        preds, target, input_format="probs", task=task, validate_args=False
    )
    bins = CF.binned_statistics(confidence, correct, n_bins)
    smooth = cast(
        Tensor,
        smooth_calibration_error(
            preds, target, input_format="probs", task=task, validate_args=False
        ),
    )
    values = {
        "nll": float(nll),
        "ece": float(CF.calibration_error_from_bins(*bins, "l1")),
        "smooth_ece": float(smooth),
    }
    return values, bins


@contextlib.contextmanager
def quiet_fits() -> Iterator[None]:
    """Silence the package's warnings of the calibrators' own fits inside a callback.

    The callback reports them itself, once per fit and on rank 0: a method that falls back
    (from ``cannot_help``) and a chosen map that ran to a bound (from its ``bound``).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=LightningLossesWarning)
        yield


def unscored_reason(score: float) -> str:
    """Why a cross-validated NLL is not a score ("" for a finite one).

    Example:
        >>> unscored_reason(math.inf)[:67]
        'its cross-validated NLL is inf: on a held-out fold it gave a sample'
        >>> unscored_reason(0.5)
        ''
    """
    if math.isnan(score):
        return "its cross-validated NLL is NaN: on a held-out fold its log-probabilities were NaN"
    if math.isinf(score):
        return (
            "its cross-validated NLL is inf: on a held-out fold it gave a sample's true label "
            "probability 0 (a map fitted on the other folds, where every sample at that "
            "confidence was right, or every one wrong, as a bin of isotonic or histogram "
            "binning can be)"
        )
    return ""


def set_tags(trainer: pl.Trainer, tags: Mapping[str, str]) -> None:
    """Set run tags on every logger that keeps them (the MLflow loggers); rank 0 only."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        set_tags = getattr(logger, "set_tags", None)  # TrackingLogger (spools on failure)
        if callable(set_tags):
            set_tags(dict(tags))
            continue
        run_id = getattr(logger, "run_id", None)
        if run_id is None:  # not MLflow's: no tags
            continue
        set_tag = getattr(getattr(logger, "experiment", None), "set_tag", None)  # MLFlowLogger
        if callable(set_tag):
            for key, value in tags.items():
                set_tag(run_id, key, value)
