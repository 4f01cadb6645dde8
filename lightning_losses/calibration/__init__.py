"""Calibration analytics: calibration errors, Brier score and NLL as functions and metrics.

``lightning_losses.calibration.functional`` holds the pure functions, ``.metrics`` the
torchmetrics ``Metric``s (float64 per-bin sums as state, DDP-ready), ``.smooth`` the smooth
ECE of Błasiok and Nakkiran (an O(grid) state). This package imports torch
and torchmetrics only; netcal and matplotlib are imported lazily by the modules that need them.
``.posthoc`` holds the post-hoc calibrators (temperature, vector, matrix and ensemble
temperature scaling, Dirichlet calibration, histogram binning, isotonic regression, beta
calibration) behind one interface, and the choice among them by cross-validated NLL; their
names are importable from here too.
"""

from lightning_losses._lazy import lazy_exports
from lightning_losses.calibration.aurc import AURC, aurc
from lightning_losses.calibration.brier import (
    BrierComponents,
    BrierDecomposition,
    brier_decomposition,
)
from lightning_losses.calibration.debiased import debiased_calibration_error
from lightning_losses.calibration.functional import (
    accuracy,
    adaptive_calibration_error,
    binned_statistics,
    brier_score,
    calibration_error,
    calibration_error_from_bins,
    classwise_binned_statistics,
    classwise_calibration_error,
    confidence_and_correct,
    equal_mass_binned_statistics,
    mean_confidence,
    negative_log_likelihood,
    resolve_task,
)
from lightning_losses.calibration.intervals import (
    CalibrationErrorInterval,
    calibration_error_interval,
)
from lightning_losses.calibration.metrics import (
    Accuracy,
    AdaptiveCalibrationError,
    BrierScore,
    CalibrationError,
    CalibrationSummary,
    ClasswiseCalibrationError,
    DebiasedCalibrationError,
    MeanConfidence,
    NegativeLogLikelihood,
    SmoothCalibrationError,
)
from lightning_losses.calibration.smooth import (
    SmoothReliabilityCurve,
    smooth_calibration_error,
    smooth_calibration_error_from_grid,
    smooth_grid_statistics,
    smooth_reliability_curve,
)

#: The post-hoc names, served from ``.posthoc`` on first access.
_POSTHOC = (
    "BetaCalibration",
    "DirichletCalibration",
    "EnsembleTemperatureScaling",
    "HistogramBinning",
    "IsotonicCalibration",
    "MatrixScaling",
    "PostHocCalibrator",
    "TemperatureScaler",
    "VectorScaling",
    "fit_temperature",
    "get_calibrator",
    "select_calibrator",
)

__all__ = [
    "AURC",
    "Accuracy",
    "AdaptiveCalibrationError",
    "BrierComponents",
    "BrierDecomposition",
    "BrierScore",
    "CalibrationError",
    "CalibrationErrorInterval",
    "CalibrationSummary",
    "ClasswiseCalibrationError",
    "DebiasedCalibrationError",
    "MeanConfidence",
    "NegativeLogLikelihood",
    "SmoothCalibrationError",
    "SmoothReliabilityCurve",
    "accuracy",
    "adaptive_calibration_error",
    "aurc",
    "binned_statistics",
    "brier_decomposition",
    "brier_score",
    "calibration_error",
    "calibration_error_from_bins",
    "calibration_error_interval",
    "classwise_binned_statistics",
    "classwise_calibration_error",
    "confidence_and_correct",
    "debiased_calibration_error",
    "equal_mass_binned_statistics",
    "mean_confidence",
    "negative_log_likelihood",
    "resolve_task",
    "smooth_calibration_error",
    "smooth_calibration_error_from_grid",
    "smooth_grid_statistics",
    "smooth_reliability_curve",
]

__all__ += _POSTHOC
__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(_POSTHOC, "posthoc"), __all__)
