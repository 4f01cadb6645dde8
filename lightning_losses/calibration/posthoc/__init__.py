"""Post-hoc calibrators of logits behind one interface, and the choice among them.

Every calibrator is fitted with ``fit(logits, target)`` (it returns the calibrator) and maps
logits ``[N, C]`` to calibrated log-probabilities with ``forward``; ``state_dict`` saves it
(:mod:`~lightning_losses.calibration.posthoc.base`). :func:`get_calibrator` builds one by its
method name, :func:`~lightning_losses.calibration.posthoc.select.select_calibrator` chooses
among several by cross-validated NLL.

Example:
    >>> sorted(CALIBRATION_METHODS)[:3]
    ['beta', 'dirichlet', 'ensemble_temperature']
    >>> get_calibrator("temperature").method
    'temperature'
"""

from __future__ import annotations

from typing import Any

from lightning_losses._lazy import lazy_exports
from lightning_losses.calibration.posthoc.base import PostHocCalibrator

#: Each method's name and the class implementing it (module, class).
CALIBRATION_METHODS: dict[str, tuple[str, str]] = {
    "temperature": ("temperature", "TemperatureScaler"),
    "vector": ("linear", "VectorScaling"),
    "matrix": ("linear", "MatrixScaling"),
    "dirichlet": ("linear", "DirichletCalibration"),
    "ensemble_temperature": ("ensemble", "EnsembleTemperatureScaling"),
    "histogram": ("binning", "HistogramBinning"),
    "isotonic": ("isotonic", "IsotonicCalibration"),
    "beta": ("beta", "BetaCalibration"),
}

_EXPORTS: dict[str, str] = {
    **{cls: module for module, cls in CALIBRATION_METHODS.values()},
    "fit_temperature": "temperature",
    "IdentityCalibrator": "base",
    "Selection": "select",
    "select_calibrator": "select",
    "cross_validated_nll": "select",
}

__all__ = [
    "CALIBRATION_METHODS",
    "PostHocCalibrator",
    "get_calibrator",
    *sorted(_EXPORTS),
]


def get_calibrator(method: str, **hparams: Any) -> PostHocCalibrator:
    """An unfitted calibrator of ``method`` (a key of :data:`CALIBRATION_METHODS`).

    Args:
        method: the method's name.
        **hparams: its keyword-only hyper-parameters.

    Raises:
        ValueError: an unknown method (the message lists the known ones).
        TypeError: a hyper-parameter the method does not take.
    """
    if method not in CALIBRATION_METHODS:
        known = ", ".join(repr(m) for m in CALIBRATION_METHODS)
        raise ValueError(f"unknown calibration method {method!r}; choose one of {known}")
    cls: type[PostHocCalibrator] = __getattr__(CALIBRATION_METHODS[method][1])
    return cls(**hparams)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
