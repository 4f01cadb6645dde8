"""Calibration analytics: calibration errors, Brier score and NLL as functions and metrics.

``lightning_losses.calibration.functional`` holds the pure functions, ``.metrics`` the
torchmetrics ``Metric``s (float64 per-bin sums as state, DDP-ready), ``.smooth`` the smooth
ECE of Błasiok and Nakkiran (an O(grid) state). This package imports torch
and torchmetrics only; netcal and matplotlib are imported lazily by the modules that need them.
"""

from .functional import (
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
from .metrics import (
    Accuracy,
    AdaptiveCalibrationError,
    BrierScore,
    CalibrationError,
    CalibrationSummary,
    ClasswiseCalibrationError,
    MeanConfidence,
    NegativeLogLikelihood,
)
from .smooth import (
    SmoothCalibrationError,
    SmoothReliabilityCurve,
    smooth_calibration_error,
    smooth_calibration_error_from_grid,
    smooth_grid_statistics,
    smooth_reliability_curve,
)

__all__ = [
    "Accuracy",
    "AdaptiveCalibrationError",
    "BrierScore",
    "CalibrationError",
    "CalibrationSummary",
    "ClasswiseCalibrationError",
    "MeanConfidence",
    "NegativeLogLikelihood",
    "SmoothCalibrationError",
    "SmoothReliabilityCurve",
    "accuracy",
    "adaptive_calibration_error",
    "binned_statistics",
    "brier_score",
    "calibration_error",
    "calibration_error_from_bins",
    "classwise_binned_statistics",
    "classwise_calibration_error",
    "confidence_and_correct",
    "equal_mass_binned_statistics",
    "mean_confidence",
    "negative_log_likelihood",
    "resolve_task",
    "smooth_calibration_error",
    "smooth_calibration_error_from_grid",
    "smooth_grid_statistics",
    "smooth_reliability_curve",
]
