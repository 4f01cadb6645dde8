"""The ranges of the losses' and callbacks' hyper-parameters: their one home, standard library.

The losses' own checks (:func:`~lightning_losses.functional.target_probability.check_focal`
and the others) pass these bounds to
:func:`~lightning_losses.functional.checks.check_range`, the callbacks theirs to ``check_range``
and ``check_int``; the console script checks the values of a command line and its configs
against the same bounds before torch is imported
(:func:`lightning_losses.cli.checks.check_command_line`), so that ``--model.criterion.init_args.
gamma=-1`` is refused at once with the message the loss itself would give.
"""

from __future__ import annotations

import math
from typing import TypedDict

__all__ = [
    "CALLBACK_COUNTS",
    "CALLBACK_RANGES",
    "LOSS_RANGES",
    "NON_NEGATIVE",
    "N_BINS",
    "UNIT",
    "Bounds",
    "Counts",
    "count_bound",
    "count_message",
    "interval",
    "outside",
    "range_message",
]


class Bounds(TypedDict, total=False):
    """Keyword arguments of :func:`~lightning_losses.functional.checks.check_range`."""

    low: float
    high: float
    low_open: bool
    high_open: bool


#: ``[0, inf)``.
NON_NEGATIVE: Bounds = {"low": 0.0}
#: ``[0, 1]``.
UNIT: Bounds = {"low": 0.0, "high": 1.0}
#: ``label_smoothing`` of cross-entropy and gamma cross-entropy: ``[0, 1)``.
LABEL_SMOOTHING: Bounds = {"low": 0.0, "high": 1.0, "high_open": True}

# The hyper-parameters that several losses check with one function share one entry.
_FOCAL: dict[str, Bounds] = {"gamma": NON_NEGATIVE}
_HARD_TRUNCATED: dict[str, Bounds] = {"margin": UNIT}
_SOFT_TRUNCATED: dict[str, Bounds] = {"k": NON_NEGATIVE}

#: The bounds of each built-in loss's real-valued hyper-parameters, by registry name (a
#: sequence, such as ``gammas``, holds values each within them). Arguments with other rules
#: (counts, choices, per-class tensors, relations between arguments) are checked by the loss.
LOSS_RANGES: dict[str, dict[str, Bounds]] = {
    "ce": {"label_smoothing": LABEL_SMOOTHING},
    "gamma_ce": {"gamma": UNIT, "threshold": UNIT, "label_smoothing": LABEL_SMOOTHING},
    "focal": _FOCAL,
    "adaptive_focal": {"thresholds": UNIT, "gammas": NON_NEGATIVE},
    "hard_truncated": _HARD_TRUNCATED,
    "soft_truncated": _SOFT_TRUNCATED,
    "binary_focal": {**_FOCAL, "alpha": UNIT},
    "binary_soft_truncated": _SOFT_TRUNCATED,
    "binary_hard_truncated": _HARD_TRUNCATED,
    "exact": {"sigma": {"low": 0.0, "low_open": True}},
    "poly1": {"epsilon": {"low": -1.0}},
    "mbls": {"margin": NON_NEGATIVE, "alpha": NON_NEGATIVE},
    "dual_focal": {"gamma": NON_NEGATIVE},
    "mdca": {"beta": NON_NEGATIVE, "gamma": NON_NEGATIVE},
    "dca": {"beta": NON_NEGATIVE},
    "mmce": {"lambda_": NON_NEGATIVE},
}


class Counts(TypedDict, total=False):
    """Keyword arguments of :func:`~lightning_losses.functional.checks.check_int`."""

    low: int
    high: int


#: A histogram's number of bins (every binned calibration metric, the monitors' diagrams).
N_BINS: Counts = {"low": 1}
#: Every how many epochs something is done: at least 1.
EVERY_N_EPOCHS: Counts = {"low": 1}

#: The bounds of the package's callbacks' real-valued arguments, by class name.
CALLBACK_RANGES: dict[str, dict[str, Bounds]] = {
    "AdaFocalUpdate": {"lambda_": {"low": 0.0, "low_open": True}, "switch_point": NON_NEGATIVE},
}
#: The bounds of the package's callbacks' integer arguments, by class name.
CALLBACK_COUNTS: dict[str, dict[str, Counts]] = {
    "CalibrationMonitor": {"n_bins": N_BINS},
    "SplitCurves": {"n_bins": N_BINS, "every_n_epochs": EVERY_N_EPOCHS},
    "AdaFocalUpdate": {"diagram_every_n_epochs": {"low": 0}},
    "PostHocCalibration": {"folds": {"low": 2}, "every_n_epochs": EVERY_N_EPOCHS},
    "GammaAnnealing": {"total": {"low": 1}},
}


def count_bound(low: int | None = None, high: int | None = None) -> str:
    """An integer's bounds in words: ``>= 1``, ``<= 9``, ``in [0, 9]`` (``""``: none).

    Example:
        >>> count_bound(**N_BINS), count_bound(0, 9)
        ('>= 1', 'in [0, 9]')
    """
    if low is not None and high is not None:
        return f"in [{low}, {high}]"
    if low is not None:
        return f">= {low}"
    return f"<= {high}" if high is not None else ""


def count_message(
    name: str, value: int, *, low: int | None = None, high: int | None = None
) -> str | None:
    """The error of an integer ``value`` of ``name`` outside its bounds; ``None`` inside them.

    Example:
        >>> count_message("n_bins", 0, **N_BINS)
        'n_bins must be >= 1; got 0'
    """
    if (low is not None and value < low) or (high is not None and value > high):
        return f"{name} must be {count_bound(low, high)}; got {value!r}"
    return None


def interval(
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> str:
    """``[low, high]`` in words for the messages, ``(`` / ``)`` on open or unbounded sides.

    Example:
        >>> interval(**LABEL_SMOOTHING), interval(**NON_NEGATIVE)
        ('[0, 1)', '[0, inf)')
    """
    left = "(" if low_open or low is None else "["
    right = ")" if high_open or high is None else "]"
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    return f"{left}{lo}, {hi}{right}"


def outside(
    value: float,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> bool:
    """Whether ``value`` is NaN, infinite or outside the range.

    Example:
        >>> outside(1.0, **LABEL_SMOOTHING), outside(0.5, **LABEL_SMOOTHING)
        (True, False)
    """
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and (value >= high if high_open else value > high)
    return bad_low or bad_high or not math.isfinite(value)


def range_message(
    name: str,
    value: float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> str | None:
    """The error of a real number ``value`` of ``name`` outside the range; ``None`` inside it.

    Example:
        >>> range_message("gamma", -1.0, **LOSS_RANGES["focal"]["gamma"])
        'gamma must lie in [0, inf); got -1.0'
        >>> range_message("gamma", 2.0, **LOSS_RANGES["focal"]["gamma"]) is None
        True
    """
    if not outside(value, low, high, low_open, high_open):
        return None
    return f"{name} must lie in {interval(low, high, low_open, high_open)}; got {value!r}"
