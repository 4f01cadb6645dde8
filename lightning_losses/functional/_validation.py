"""Argument checks shared by every loss (and by the calibration functions).

Checks of Python scalars (``reduction``, ``gamma``, ...), of dtypes, shapes and devices always
run: they cost nothing. Checks that read tensor *values* (targets in range, finite logits,
probabilities in [0, 1], non-negative class weights, ...) run only when ``validate_args=True``
(the default), because on an accelerator they synchronise with the host.

Every error is a ``ValueError`` (bad value or shape) or ``TypeError`` (bad type) whose message
starts with the argument's name and says what was expected.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

REDUCTIONS = ("none", "mean", "sum")

#: Options of the loss modules that hold one weight per class.
CLASS_VECTOR_OPTIONS = ("weight", "alpha", "class_weight")


# --- Python scalars --------------------------------------------------------------------------


def check_reduction(reduction: str) -> None:
    """Raise ``ValueError`` unless ``reduction`` is one of ``none|mean|sum``."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of 'none', 'mean' or 'sum'; got {reduction!r}")


def check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of the strings ``choices``."""
    if not isinstance(value, str) or value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {options}; got {value!r}")


def check_flag(name: str, value: object) -> None:
    """Raise ``TypeError`` unless ``value`` is a ``bool``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {value!r}")


def check_ignore_index(ignore_index: object) -> None:
    """Raise ``TypeError`` unless ``ignore_index`` is an integer (not a bool)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int; got {ignore_index!r}")


def check_range(
    name: str,
    value: float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Raise unless ``value`` is a finite real number with ``low <= value <= high``.

    ``<`` replaces ``<=`` on an open side. NaN and infinities are out of every range:
    ``TypeError`` for a value that is not a real number, ``ValueError`` otherwise.
    """
    if isinstance(value, Tensor):
        if value.numel() != 1:
            return  # per-element hyper-parameters are checked by the loss that accepts them
        value = value.item()
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and (value >= high if high_open else value > high)
    if bad_low or bad_high or not math.isfinite(value):
        left = "(" if low_open or low is None else "["
        right = ")" if high_open or high is None else "]"
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise ValueError(f"{name} must lie in {left}{lo}, {hi}{right}; got {value!r}")


# --- tensors: type, shape and device (always checked) ----------------------------------------


def check_same_device(name: str, tensor: Tensor, other_name: str, other: Tensor) -> None:
    """Raise ``ValueError`` naming both tensors and devices unless they share one device."""
    if tensor.device != other.device:
        raise ValueError(
            f"{name} is on {tensor.device} but {other_name} is on {other.device}; move them to "
            "one device"
        )


def check_logits(logits: Tensor, *, name: str = "logits", min_dim: int = 2) -> None:
    """Raise unless ``logits`` is a floating tensor with at least ``min_dim`` dimensions."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor; got dtype {logits.dtype}")
    if logits.dim() < min_dim:
        form = "[N, C, *]" if min_dim == 2 else f"a tensor with at least {min_dim} dimensions"
        raise ValueError(f"{name} must have shape {form}; got shape {tuple(logits.shape)}")


def check_index_target(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int,
    validate_args: bool,
) -> None:
    """Check logits ``[N, C, *]`` and class-index targets ``[N, *]``.

    Dtypes, shapes and devices are always checked; with ``validate_args`` also the values:
    ``0 <= t < C`` or ``t == ignore_index``, and finite logits.
    """
    check_logits(logits)
    check_ignore_index(ignore_index)
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor; got {type(target).__name__}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(
            "target must hold class indices (an integer tensor of shape [N, *]); got dtype "
            f"{target.dtype}. Soft or binary targets belong to the binary_* or multi-label losses."
        )
    expected = (logits.shape[0], *logits.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(
            f"target must have shape {list(expected)} to match logits of shape "
            f"{list(logits.shape)} (class dimension 1); got {list(target.shape)}"
        )
    check_same_device("target", target, "logits", logits)
    if validate_args:
        check_class_indices("target", target, logits.shape[1], ignore_index=ignore_index)
        check_finite("logits", logits)


def check_soft_target(
    logits: Tensor,
    target: Tensor,
    *,
    validate_args: bool,
    ignore_index: int | None = None,
) -> None:
    """Check float targets in [0, 1] of the shape of the logits (and finite logits)."""
    check_logits(logits, min_dim=1)
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor; got {type(target).__name__}")
    if not target.is_floating_point():
        raise TypeError(
            "target must be a floating-point tensor of probabilities in [0, 1] with the shape "
            f"of the logits; got dtype {target.dtype} (class indices belong to the softmax losses)"
        )
    if tuple(target.shape) != tuple(logits.shape):
        raise ValueError(
            f"target must have the shape of the logits {list(logits.shape)}; "
            f"got {list(target.shape)}"
        )
    check_same_device("target", target, "logits", logits)
    if validate_args and target.numel() > 0:
        bad = (target < 0) | (target > 1) | torch.isnan(target)
        if ignore_index is not None:
            bad &= target != ignore_index
        if bool(bad.any()):
            example = float(target[bad].flatten()[0])
            allowed = "" if ignore_index is None else f" (or ignore_index={ignore_index})"
            raise ValueError(f"target values must lie in [0, 1]{allowed}; found {example}")
    if validate_args:
        check_finite("logits", logits)


def check_class_vector(
    name: str,
    vector: Tensor | Sequence[float] | None,
    logits: Tensor,
    *,
    validate_args: bool = True,
) -> Tensor | None:
    """Return a per-class vector ``[C]`` as a tensor on the logits' device, or ``None``.

    A Python sequence is moved to the logits' device; a tensor must already be there. With
    ``validate_args`` its values must be finite and ``>= 0`` (:func:`check_class_weights`).
    """
    if vector is None:
        return None
    if isinstance(vector, Tensor):
        check_same_device(name, vector, "logits", logits)
    vector = check_class_weights(name, vector, validate_args=validate_args)
    vector = torch.as_tensor(vector, device=logits.device)
    num_classes = logits.shape[1]
    if vector.shape[0] != num_classes:
        raise ValueError(
            f"{name} must be a vector of one value per class (shape [{num_classes}]); "
            f"got shape {list(vector.shape)}"
        )
    return vector


def check_class_weights(
    name: str, vector: Tensor | Sequence[float], *, validate_args: bool = True
) -> Tensor:
    """Return per-class weights as a 1-D real tensor; with ``validate_args``, finite and ``>= 0``.

    A negative weight would make a loss negative (and its gradient point the wrong way), so it
    is an error, as is NaN or inf. ``"mean"`` divides by the sum of the weights of the counted
    elements; when that sum is 0 (all weights of the present classes are 0), the mean is 0, as
    for a batch whose targets are all ignored.
    """
    try:
        tensor = vector if isinstance(vector, Tensor) else torch.as_tensor(vector)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(
            f"{name} must be a tensor or sequence of one real weight per class; "
            f"got {type(vector).__name__}"
        ) from None
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise TypeError(f"{name} must hold real weights; got dtype {tensor.dtype}")
    if tensor.dim() != 1:
        raise ValueError(
            f"{name} must be a vector of one weight per class (shape [C]); "
            f"got shape {list(tensor.shape)}"
        )
    if validate_args and tensor.numel() > 0:
        bad = ~((tensor >= 0) & torch.isfinite(tensor))
        if bool(bad.any()):
            index = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"{name} must hold finite weights >= 0 (one per class); found "
                f"{tensor[index].item()!r} for class {index}"
            )
    return tensor


# --- tensors: values (only with validate_args) --------------------------------------------------


def check_class_indices(
    name: str, target: Tensor, num_classes: int, *, ignore_index: int | None = None
) -> None:
    """Raise unless every entry of ``target`` is in ``[0, num_classes)`` (or ``ignore_index``)."""
    if target.numel() == 0:
        return
    bad = (target < 0) | (target >= num_classes)
    if ignore_index is not None:
        bad &= target != ignore_index
    if bool(bad.any()):
        example = int(target[bad].flatten()[0])
        allowed = "" if ignore_index is None else f" or equal ignore_index={ignore_index}"
        raise ValueError(
            f"{name} values must lie in [0, {num_classes - 1}] (C={num_classes} classes)"
            f"{allowed}; found {example}"
        )


def first_non_finite(tensor: Tensor) -> tuple[float, list[int]]:
    """The first NaN or infinite entry of ``tensor`` and its index (for error messages)."""
    index = (~torch.isfinite(tensor)).nonzero()[0].tolist()
    return tensor[tuple(index)].item(), index


def check_finite(name: str, tensor: Tensor) -> None:
    """Raise ``ValueError`` if ``tensor`` holds NaN or an infinity.

    One reduction (``aminmax``, which propagates NaN), no tensor of the input's size; the
    offending entry is located only when there is one.
    """
    if tensor.numel() == 0:
        return
    low, high = torch.aminmax(tensor.detach())
    if bool(torch.isfinite(low) & torch.isfinite(high)):
        return
    value, index = first_non_finite(tensor.detach())
    raise ValueError(
        f"{name} must be finite (no NaN or inf; checked because validate_args=True); found "
        f"{value} at {name}{index}"
    )


#: Half-precision dtypes whose probabilities are often cast up before they are checked, loosest
#: tolerance first: a float32 or float64 row whose values are all exactly numbers of one of
#: them is held to that dtype's tolerance (see :func:`sum_tolerances`).
HALF_DTYPES = (torch.bfloat16, torch.float16)

#: Elements of the rows looked at again per chunk by :func:`sum_tolerances` (bounds the copies).
_RECHECK_CHUNK_ELEMENTS = 1 << 20


def sum_tolerance(dtype: torch.dtype) -> float:
    """How far from 1 a sum of probabilities stored in ``dtype`` may be: ``max(1e-3, 4 eps)``.

    That is 1e-3 for float32 and float64, 3.9e-3 for float16 and 0.031 for bfloat16. Rounding
    each probability to the dtype moves their sum by at most ``eps / 2`` whatever the number of
    classes (the errors are relative, weighted by probabilities that sum to 1), and the sums are
    accumulated in float32 or wider, so any softmax output passes while a row that is not a
    distribution (a missing normalisation, logits passed as probabilities) does not.

    Example:
        >>> sum_tolerance(torch.float32), sum_tolerance(torch.bfloat16)
        (0.001, 0.03125)
    """
    return max(1e-3, 4 * torch.finfo(dtype).eps)


def _half_exact(rows: Tensor, half: torch.dtype) -> Tensor:
    """Which of the rows ``[M, C]`` hold only values that ``half`` represents exactly."""
    return (rows.to(half).to(rows.dtype) == rows).all(dim=-1)


def sum_tolerances(sums: Tensor, dtype: torch.dtype, values: Tensor | None = None) -> Tensor | None:
    """The tolerance of each sum, or ``None`` when every sum is within ``sum_tolerance(dtype)``.

    For float32 and float64 ``dtype``, a sum outside ``sum_tolerance(dtype)`` whose summed
    ``values`` (``values.sum(-1)`` is ``sums``) are all exactly bfloat16 numbers gets
    bfloat16's tolerance (0.031), else, all exactly float16 numbers, float16's (3.9e-3). So
    probabilities computed in half precision and cast up, such as ``torch.softmax(x.bfloat16(),
    1).float()`` (rounding each probability moves a row's sum by less than bfloat16's ``eps / 2
    = 2**-8``, whatever the number of classes), are judged as in their own dtype. Sums of other
    values, all sums when ``values`` is ``None``, and half dtypes keep ``sum_tolerance(dtype)``.
    Only the rows outside it are looked at again (in chunks), so a passing input costs one
    reduction and no copy.

    Args:
        sums: the sums, any shape (one per distribution).
        dtype: the dtype of the summed values.
        values: the summed values, ``sums.shape + (C,)``, or ``None``.

    Returns:
        ``None``, or float64 tolerances of the shape of ``sums``.

    Example:
        >>> probs = torch.softmax(torch.tensor([[2.0, 0.0]]).bfloat16(), 1).float()
        >>> sum_tolerances(probs.sum(1), probs.dtype) is None  # sums to 0.998: not within 1e-3
        False
        >>> sum_tolerances(probs.sum(1), probs.dtype, probs)  # bfloat16 values: bfloat16's
        tensor([0.0312], dtype=torch.float64)
    """
    if sums.numel() == 0:
        return None
    tolerance = sum_tolerance(dtype)
    low, high = torch.aminmax(sums.detach())  # one reduction; NaN propagates and fails
    if bool((low >= 1 - tolerance) & (high <= 1 + tolerance)):
        return None
    tolerances = torch.full(sums.shape, tolerance, dtype=torch.float64, device=sums.device)
    if values is None or dtype not in (torch.float32, torch.float64):
        return tolerances  # a half dtype keeps its own tolerance
    outside = ((sums.detach().to(torch.float64) - 1).abs() > tolerance).nonzero()
    step = max(1, _RECHECK_CHUNK_ELEMENTS // max(values.shape[-1], 1))
    for start in range(0, outside.shape[0], step):
        index = outside[start : start + step].unbind(1)
        rows = values.detach()[index]
        found = torch.full_like(tolerances[index], tolerance)
        for half in reversed(HALF_DTYPES):  # the loosest last, so that it wins
            found = torch.where(_half_exact(rows, half), sum_tolerance(half), found)
        tolerances[index] = found
    return tolerances


def check_sums_to_one(
    name: str,
    sums: Tensor,
    dtype: torch.dtype,
    *,
    over: str,
    hint: str = "",
    values: Tensor | None = None,
) -> None:
    """Raise unless every entry of ``sums`` is within its tolerance of 1 (NaN fails).

    The tolerance is :func:`sum_tolerance` of ``dtype``, or, given the summed ``values``, that
    of bfloat16 or float16 for sums of values that are exactly numbers of that dtype (see
    :func:`sum_tolerances`).

    Args:
        name: the argument whose sums these are.
        sums: the sums, any shape (one per distribution).
        dtype: the dtype of the summed probabilities (sets the tolerance).
        over: what was summed, for the message (e.g. ``"the classes of each row"``).
        hint: appended to the message.
        values: the summed values (``sums.shape + (C,)``), or ``None``.
    """
    tolerances = sum_tolerances(sums, dtype, values)
    if tolerances is None:
        return
    deviation = (sums.detach().to(torch.float64) - 1).abs()
    deviation = torch.where(torch.isnan(deviation), math.inf, deviation)
    bad = deviation > tolerances
    if not bool(bad.any()):
        return
    worst = torch.where(bad, deviation, -1.0).flatten().argmax()
    index = list(torch.unravel_index(worst, sums.shape))
    where = ", ".join(str(int(i)) for i in index)
    tolerance = float(tolerances.flatten()[worst])
    kind = f"{dtype}"
    if tolerance != sum_tolerance(dtype):
        half = next(h for h in HALF_DTYPES if sum_tolerance(h) == tolerance)
        kind += f" holding {half} values"
    raise ValueError(
        f"{name} must hold probabilities that sum to 1 over {over} (within {tolerance:g} for "
        f"{kind}); found a sum of {sums.flatten()[worst].item()!r} at [{where}]{hint}"
    )


# --- the options of the loss modules ------------------------------------------------------------


def check_loss_options(options: Mapping[str, Any]) -> None:
    """Check the options a loss module passes to its function, by name.

    ``reduction``, ``ignore_index``, ``validate_args`` and the per-class vectors (``weight``,
    ``alpha``, ``class_weight``: 1-D, and finite and ``>= 0`` when ``validate_args`` is true)
    are checked here; options that belong to one loss (``variant``, ``n_nodes``, ...) are
    checked by that loss. Used by ``check_hyperparameters`` of the loss modules.
    """
    validate_args = options.get("validate_args", True)
    if "validate_args" in options:
        check_flag("validate_args", validate_args)
    if "reduction" in options:
        check_reduction(options["reduction"])
    if "ignore_index" in options:
        check_ignore_index(options["ignore_index"])
    for name in CLASS_VECTOR_OPTIONS:
        if options.get(name) is not None:
            check_class_weights(name, options[name], validate_args=validate_args)
