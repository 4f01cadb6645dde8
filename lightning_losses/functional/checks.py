"""The package's one home of argument checks: hyper-parameters, options and tensor inputs.

Every check of an argument's type or value that more than one place needs lives here, one
check per concept (an integer count, a fraction, a flag, a choice, a range, a probability
distribution, class indices, ...); the losses, heads, calibration functions, callbacks, data
modules and backbones call these instead of writing their own. A module keeps only the rules
that are its own (the relations between its arguments) and composes them from these checks.

Checks of Python scalars (``reduction``, ``gamma``, ...), of dtypes, shapes and devices always
run: they cost nothing. Checks that read tensor *values* (targets in range, finite logits,
probabilities in [0, 1], non-negative class weights, ...) run only when ``validate_args=True``
(the default), because on an accelerator they synchronise with the host.

Every error is a ``ValueError`` (bad value or shape) or ``TypeError`` (bad type) whose message
starts with the argument's name and says what was expected. A scalar of the wrong type raises
:class:`ArgumentTypeError`, which is both, so that callers catching either keep working.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast, overload

import torch
from torch import Tensor

# The interval's words and test, and the range's message, are the light module's: the console
# script checks command lines with them before torch is imported.
from lightning_losses.loss_ranges import LOSS_RANGES, count_bound, count_message, range_message
from lightning_losses.loss_ranges import interval as _interval
from lightning_losses.loss_ranges import outside as _outside

REDUCTIONS = ("none", "mean", "sum")

#: Options of the loss modules that hold one weight per class.
CLASS_VECTOR_OPTIONS = ("weight", "alpha", "class_weight")


class ArgumentTypeError(TypeError, ValueError):
    """A scalar argument of the wrong type: a ``TypeError`` that is also a ``ValueError``.

    The checks gathered here used to disagree (a float count was a ``ValueError`` in the data
    modules and a ``TypeError`` in the samplers); being both, this error keeps every caller's
    ``except`` working. It is not :class:`argparse.ArgumentTypeError`.

    Example:
        >>> issubclass(ArgumentTypeError, TypeError), issubclass(ArgumentTypeError, ValueError)
        (True, True)
    """


# --- Python scalars --------------------------------------------------------------------------


def check_reduction(reduction: str) -> None:
    """Check a loss's ``reduction``: one of ``"none"``, ``"mean"`` or ``"sum"``.

    Args:
        reduction: the value to check.

    Raises:
        ValueError: any other value.

    Example:
        >>> check_reduction("mean")
        >>> check_reduction("avg")
        Traceback (most recent call last):
        ...
        ValueError: reduction must be one of 'none', 'mean' or 'sum'; got 'avg'
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of 'none', 'mean' or 'sum'; got {reduction!r}")


def check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    """Check that ``value`` is one of the strings ``choices``.

    Args:
        name: the argument's name, for the message.
        value: the value to check.
        choices: the accepted strings.

    Raises:
        ValueError: any other value (a non-string too), listing the choices.

    Example:
        >>> check_choice("kind", "cosface", ("normface", "cosface", "arcface"))
        >>> check_choice("kind", "sphereface", ("normface", "cosface"))
        Traceback (most recent call last):
        ...
        ValueError: kind must be one of 'normface', 'cosface'; got 'sphereface'
    """
    if not isinstance(value, str) or value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {options}; got {value!r}")


def check_flag(name: str, value: object) -> None:
    """Check that ``value`` is a ``bool`` (``True`` or ``False``, not 0, 1 or a string).

    Args:
        name: the argument's name, for the message.
        value: the value to check.

    Raises:
        ArgumentTypeError: anything but a ``bool``.

    Example:
        >>> check_flag("validate_args", True)
        >>> check_flag("validate_args", "yes")
        Traceback (most recent call last):
        ...
        lightning_losses.functional.checks.ArgumentTypeError: validate_args must be True or \
False; got 'yes'
    """
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False; got {value!r}")


def check_ignore_index(ignore_index: object) -> None:
    """Check a loss's ``ignore_index``: an integer (not a ``bool``), any sign.

    Args:
        ignore_index: the value to check.

    Raises:
        ArgumentTypeError: anything but an integer.

    Example:
        >>> check_ignore_index(-100)
        >>> check_ignore_index(None)
        Traceback (most recent call last):
        ...
        lightning_losses.functional.checks.ArgumentTypeError: ignore_index must be an int; \
got None
    """
    if type(ignore_index) is int:  # the common case, without the abstract-class check
        return
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise ArgumentTypeError(f"ignore_index must be an int; got {ignore_index!r}")


def check_range(
    name: str,
    value: float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Check that ``value`` is a finite real number with ``low <= value <= high``.

    ``<`` replaces ``<=`` on an open side; a bound left ``None`` is no bound. NaN and the
    infinities are outside every range. A one-element tensor is checked as its value; a
    tensor of several values passes (per-element hyper-parameters are checked by the loss that
    accepts them).

    Args:
        name: the argument's name, for the message.
        value: the value to check.
        low: the lower bound, or ``None``.
        high: the upper bound, or ``None``.
        low_open: exclude ``low`` itself.
        high_open: exclude ``high`` itself.

    Raises:
        ArgumentTypeError: ``value`` is not a real number (a ``bool`` is not one).
        ValueError: it is outside the range, or not finite.

    Example:
        >>> check_range("gamma", 2.0, low=0.0)
        >>> check_range("dropout", 1.0, low=0.0, high=1.0, high_open=True)
        Traceback (most recent call last):
        ...
        ValueError: dropout must lie in [0, 1); got 1.0
    """
    if isinstance(value, Tensor):
        if value.numel() != 1:
            return  # per-element hyper-parameters are checked by the loss that accepts them
        value = value.item()
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a real number; got {type(value).__name__}")
    message = range_message(name, value, low=low, high=high, low_open=low_open, high_open=high_open)
    if message is not None:
        raise ValueError(message)


@overload
def check_real(
    name: str,
    value: object,
    *,
    low: float | None = ...,
    high: float | None = ...,
    low_open: bool = ...,
    high_open: bool = ...,
    optional: Literal[False] = ...,
    example: str | None = ...,
) -> float: ...


@overload
def check_real(
    name: str,
    value: object,
    *,
    low: float | None = ...,
    high: float | None = ...,
    low_open: bool = ...,
    high_open: bool = ...,
    optional: bool,
    example: str | None = ...,
) -> float | None: ...


def check_real(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
    example: str | None = None,
) -> float | None:
    """Check that ``value`` is a finite real number, in a range if given, and return it.

    Any real number type is accepted (``int``, ``float``, numpy scalars, ``Fraction``); a
    ``bool`` is not. The bounds work as in :func:`check_range`; use that one for a
    hyper-parameter kept as given (a loss's, which may be a tensor).

    Args:
        name: the argument's name, for the message.
        value: the value to check.
        low: the lower bound, or ``None``.
        high: the upper bound, or ``None``.
        low_open: exclude ``low`` itself.
        high_open: exclude ``high`` itself.
        optional: accept ``None`` too (and return it), e.g. for "automatic".
        example: a typical value, quoted in the message (``"0.95"`` for a confidence level).

    Returns:
        ``float(value)``, or ``None`` for an accepted ``None``.

    Raises:
        ArgumentTypeError: ``value`` is not a real number (nor an accepted ``None``).
        ValueError: it is NaN, infinite or outside the range.

    Example:
        >>> check_real("start_value", 2)
        2.0
        >>> check_real("end_value", float("inf"))
        Traceback (most recent call last):
        ...
        ValueError: end_value must be a finite real number; got inf
        >>> check_real("bandwidth", 0.0, low=0.001, optional=True)
        Traceback (most recent call last):
        ...
        ValueError: bandwidth must be None or lie in [0.001, inf); got 0.0
    """
    if value is None and optional:
        return None
    bounded = low is not None or high is not None
    what = (
        f"lie in {_interval(low, high, low_open, high_open)}"
        if bounded
        else "be a finite real number"
    )
    if optional:
        what = f"be None or {what.removeprefix('be ')}"
    hint = "" if example is None else f", e.g. {example}"
    message = f"{name} must {what}{hint}; got {value!r}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(message)
    number = float(value)
    if _outside(number, low, high, low_open, high_open):
        raise ValueError(message)
    return number


def check_fraction(name: str, value: object, *, example: str | None = None) -> float:
    """Check that ``value`` is a fraction strictly between 0 and 1 and return it as a float.

    Some, but not all, of a set (a share of samples, of a split), or a confidence level.

    Args:
        name: the argument's name, for the message.
        value: the value to check.
        example: a typical value, quoted in the message (``"0.95"`` for a confidence level).

    Returns:
        ``float(value)``.

    Raises:
        ArgumentTypeError: ``value`` is not a real number.
        ValueError: it is not in ``(0, 1)``.

    Example:
        >>> check_fraction("val_fraction", 0.2)
        0.2
        >>> check_fraction("level", 1.0, example="0.95")
        Traceback (most recent call last):
        ...
        ValueError: level must lie in (0, 1), e.g. 0.95; got 1.0
    """
    return check_real(
        name, value, low=0.0, high=1.0, low_open=True, high_open=True, example=example
    )


@overload
def check_int(
    name: str,
    value: object,
    *,
    low: int | None = ...,
    high: int | None = ...,
    optional: Literal[False] = ...,
) -> int: ...


@overload
def check_int(
    name: str, value: object, *, low: int | None = ..., high: int | None = ..., optional: bool
) -> int | None: ...


def check_int(
    name: str,
    value: object,
    *,
    low: int | None = None,
    high: int | None = None,
    optional: bool = False,
) -> int | None:
    """Check an integer argument (a count, a size, a seed, a rank) and return it as an ``int``.

    Python and numpy integers are integers; a ``bool`` and an integral float (``2.0``) are not.

    Args:
        name: the argument's name, for the message.
        value: the value to check.
        low: the smallest value accepted, or ``None``.
        high: the largest value accepted, or ``None``.
        optional: accept ``None`` too (and return it).

    Returns:
        ``int(value)``, or ``None`` for an accepted ``None``.

    Raises:
        ArgumentTypeError: ``value`` is not an integer (nor an accepted ``None``).
        ValueError: it is below ``low`` or above ``high``.

    Example:
        >>> check_int("channels", 25, low=1)
        25
        >>> check_int("num_replicas", 0, low=1)
        Traceback (most recent call last):
        ...
        ValueError: num_replicas must be >= 1; got 0
        >>> check_int("rank", 0.5, low=0, optional=True)
        Traceback (most recent call last):
        ...
        lightning_losses.functional.checks.ArgumentTypeError: rank must be an int >= 0 or \
None; got 0.5 (float)
    """
    if value is None and optional:
        return None
    bound = count_bound(low, high)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        expected = " ".join(filter(None, ("an int", bound, "or None" if optional else "")))
        raise ArgumentTypeError(
            f"{name} must be {expected}; got {value!r} ({type(value).__name__})"
        )
    message = count_message(name, cast(int, value), low=low, high=high)  # numpy's ints too
    if message is not None:
        raise ValueError(message)
    return int(value)


# --- tensors: type, shape and device (always checked) ----------------------------------------


def check_same_device(name: str, tensor: Tensor, other_name: str, other: Tensor) -> None:
    """Check that two tensors are on one device.

    Args:
        name: the first tensor's argument name.
        tensor: the first tensor.
        other_name: the second tensor's argument name.
        other: the second tensor.

    Raises:
        ValueError: naming both tensors and their devices, when these differ.

    Example:
        >>> check_same_device("target", torch.zeros(2), "logits", torch.zeros(2, 3))
        >>> check_same_device("target", torch.zeros(2), "logits", torch.zeros(2, 3, device="meta"))
        Traceback (most recent call last):
        ...
        ValueError: target is on cpu but logits is on meta; move them to one device
    """
    if tensor.device != other.device:
        raise ValueError(
            f"{name} is on {tensor.device} but {other_name} is on {other.device}; move them to "
            "one device"
        )


def check_logits(logits: Tensor, *, name: str = "logits", min_dim: int = 2) -> None:
    """Check that ``logits`` is a floating-point tensor with at least ``min_dim`` dimensions.

    Args:
        logits: the tensor to check.
        name: its argument name, for the message.
        min_dim: the fewest dimensions accepted (2 for ``[N, C, *]``).

    Raises:
        TypeError: not a tensor, or not floating point.
        ValueError: too few dimensions.

    Example:
        >>> check_logits(torch.zeros(4, 3))
        >>> check_logits(torch.zeros(4))
        Traceback (most recent call last):
        ...
        ValueError: logits must have shape [N, C, *]; got shape (4,)
    """
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

    Args:
        logits: the logits, class dimension 1.
        target: integer class indices.
        ignore_index: the target value that marks an ignored element.
        validate_args: also check the values.

    Raises:
        TypeError: a wrong type or dtype.
        ValueError: a shape that does not match, another device, or (with
            ``validate_args``) a target out of range or non-finite logits.

    Example:
        >>> logits, options = torch.zeros(2, 3), {"ignore_index": -100, "validate_args": True}
        >>> check_index_target(logits, torch.tensor([0, -100]), **options)
        >>> check_index_target(logits, torch.tensor([0, 3]), **options)
        Traceback (most recent call last):
        ...
        ValueError: target values must lie in [0, 2] (C=3 classes) or equal ignore_index=-100; \
found 3
    """
    check_logits(logits)
    check_ignore_index(ignore_index)
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor; got {type(target).__name__}")
    if target.dtype is not torch.int64 and (
        target.is_floating_point() or target.is_complex() or target.dtype == torch.bool
    ):
        raise TypeError(
            "target must hold class indices (an integer tensor of shape [N, *]); got dtype "
            f"{target.dtype}. Soft or binary targets belong to the binary_* or multi-label losses."
        )
    if logits.dim() == 2:  # the common case, without building the expected shape
        matches = target.dim() == 1 and target.shape[0] == logits.shape[0]
    else:
        matches = tuple(target.shape) == (logits.shape[0], *logits.shape[2:])
    if not matches:
        expected = (logits.shape[0], *logits.shape[2:])
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
    """Check float targets in [0, 1] of the shape of the logits (and finite logits).

    Args:
        logits: the logits, any shape.
        target: probabilities of the shape of ``logits``.
        validate_args: also check that the targets lie in [0, 1] and the logits are finite.
        ignore_index: a target value that marks an ignored element, or ``None``.

    Raises:
        TypeError: a wrong type or dtype.
        ValueError: another shape or device, or (with ``validate_args``) a bad value.

    Example:
        >>> check_soft_target(torch.zeros(2), torch.tensor([0.0, 1.0]), validate_args=True)
        >>> check_soft_target(torch.zeros(2), torch.tensor([0.0, 2.0]), validate_args=True)
        Traceback (most recent call last):
        ...
        ValueError: target values must lie in [0, 1]; found 2.0
    """
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

    Args:
        name: the argument's name (``weight``, ``alpha``, ...).
        vector: one value per class, or ``None``.
        logits: the logits ``[N, C, *]`` it weighs.
        validate_args: also check the values.

    Returns:
        The vector as a tensor on the logits' device, or ``None``.

    Raises:
        TypeError: not a vector of real numbers.
        ValueError: not ``C`` values, another device, or a bad value.

    Example:
        >>> check_class_vector("alpha", [0.25, 0.75], torch.zeros(4, 2))
        tensor([0.2500, 0.7500])
        >>> check_class_vector("alpha", [1.0], torch.zeros(4, 2))
        Traceback (most recent call last):
        ...
        ValueError: alpha must be a vector of one value per class (shape [2]); got shape [1]
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

    Args:
        name: the argument's name.
        vector: one weight per class, a tensor or a sequence.
        validate_args: also check the values.

    Returns:
        The weights as a 1-D tensor.

    Raises:
        TypeError: not real numbers.
        ValueError: not one dimension, or (with ``validate_args``) a negative or non-finite
            weight.

    Example:
        >>> check_class_weights("weight", [1.0, 2.0])
        tensor([1., 2.])
        >>> check_class_weights("weight", [1.0, -2.0])
        Traceback (most recent call last):
        ...
        ValueError: weight must hold finite weights >= 0 (one per class); found -2.0 for class 1
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
    """Check that every entry of ``target`` is in ``[0, num_classes)`` (or ``ignore_index``).

    Args:
        name: the argument's name.
        target: integer class indices.
        num_classes: the number of classes ``C``.
        ignore_index: a value accepted besides the classes, or ``None``.

    Raises:
        ValueError: naming the first entry out of range.

    Example:
        >>> check_class_indices("target", torch.tensor([0, 1]), 2)
        >>> check_class_indices("target", torch.tensor([0, 2]), 2)
        Traceback (most recent call last):
        ...
        ValueError: target values must lie in [0, 1] (C=2 classes); found 2
    """
    if target.numel() == 0:
        return
    low, high = torch.aminmax(target)  # one reduction: most targets pass on it
    if target.is_cpu:
        bounds = [int(low), int(high)]
    else:
        bounds = torch.stack((low, high)).tolist()  # one synchronisation
    if bounds[0] >= 0 and bounds[1] < num_classes:
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
    """The first NaN or infinite entry of ``tensor`` and its index (for error messages).

    Args:
        tensor: a tensor holding at least one non-finite entry.

    Returns:
        ``(value, index)``.

    Example:
        >>> first_non_finite(torch.tensor([[0.0, 1.0], [float("inf"), 2.0]]))
        (inf, [1, 0])
    """
    index = (~torch.isfinite(tensor)).nonzero()[0].tolist()
    return tensor[tuple(index)].item(), index


def check_finite(name: str, tensor: Tensor) -> None:
    """Check that ``tensor`` holds no NaN and no infinity.

    One reduction (a sum: NaN and inf propagate through it), no tensor of the input's size;
    only a sum that is not finite (a non-finite entry, or finite entries whose sum overflows)
    is looked at again, and the offending entry located when there is one.

    Args:
        name: the argument's name.
        tensor: the tensor to check.

    Raises:
        ValueError: naming the first non-finite entry and its index.

    Example:
        >>> check_finite("logits", torch.zeros(2, 3))
        >>> check_finite("logits", torch.tensor([[0.0, float("nan")]]))
        Traceback (most recent call last):
        ...
        ValueError: logits must be finite (no NaN or inf; checked because validate_args=True); \
found nan at logits[0, 1]
    """
    if tensor.numel() == 0:
        return
    if math.isfinite(tensor.detach().sum().item()):
        return
    low, high = torch.aminmax(tensor.detach())  # propagates NaN
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

    Raises:
        ValueError: naming the sum farthest from 1, its index and the tolerance.

    Example:
        >>> probs = torch.tensor([[0.5, 0.5], [0.5, 0.4]])
        >>> check_sums_to_one("preds", probs.sum(1), probs.dtype, over="the classes of each row")
        Traceback (most recent call last):
        ...
        ValueError: preds must hold probabilities that sum to 1 over the classes of each row \
(within 0.001 for torch.float32); found a sum of 0.8999999761581421 at [1]
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


# --- the hyper-parameters of the margin and dual focal losses ------------------------------------


def check_mbls(margin: float, alpha: float) -> None:
    """Check MbLS's hyper-parameters: ``margin`` and ``alpha``, both finite and ``>= 0``.

    Raises:
        ValueError: a negative, NaN or infinite value (``TypeError`` for a non-number).

    Example:
        >>> check_mbls(10.0, 0.1)
        >>> check_mbls(-1.0, 0.1)
        Traceback (most recent call last):
        ...
        ValueError: margin must lie in [0, inf); got -1.0
    """
    check_range("margin", margin, **LOSS_RANGES["mbls"]["margin"])
    check_range("alpha", alpha, **LOSS_RANGES["mbls"]["alpha"])


def check_dual_focal(gamma: float) -> None:
    """Check dual focal loss's ``gamma``: finite and ``>= 0``.

    Raises:
        ValueError: a negative, NaN or infinite value (``TypeError`` for a non-number).

    Example:
        >>> check_dual_focal(-0.5)
        Traceback (most recent call last):
        ...
        ValueError: gamma must lie in [0, inf); got -0.5
    """
    check_range("gamma", gamma, **LOSS_RANGES["dual_focal"]["gamma"])


# --- the hyper-parameters of the batch-level calibration penalties ------------------------------


def check_mdca(beta: float, gamma: float) -> None:
    """Check MDCA's hyper-parameters: ``beta`` and ``gamma``, both finite and ``>= 0``.

    Raises:
        ValueError: a negative, NaN or infinite value (``TypeError`` for a non-number).

    Example:
        >>> check_mdca(1.0, 0.0)
        >>> check_mdca(-1.0, 0.0)
        Traceback (most recent call last):
        ...
        ValueError: beta must lie in [0, inf); got -1.0
    """
    check_range("beta", beta, **LOSS_RANGES["mdca"]["beta"])
    check_range("gamma", gamma, **LOSS_RANGES["mdca"]["gamma"])


def check_dca(beta: float) -> None:
    """Check DCA's ``beta``: finite and ``>= 0``.

    Raises:
        ValueError: a negative, NaN or infinite value (``TypeError`` for a non-number).
    """
    check_range("beta", beta, **LOSS_RANGES["dca"]["beta"])


def check_mmce(lambda_: float) -> None:
    """Check MMCE's ``lambda_``: finite and ``>= 0``.

    Raises:
        ValueError: a negative, NaN or infinite value (``TypeError`` for a non-number).

    Example:
        >>> check_mmce(-0.5)
        Traceback (most recent call last):
        ...
        ValueError: lambda_ must lie in [0, inf); got -0.5
    """
    check_range("lambda_", lambda_, **LOSS_RANGES["mmce"]["lambda_"])


# --- the options of the loss modules ------------------------------------------------------------


def check_loss_options(options: Mapping[str, Any]) -> None:
    """Check the options a loss module passes to its function, by name.

    ``reduction``, ``ignore_index``, ``validate_args`` and the per-class vectors (``weight``,
    ``alpha``, ``class_weight``: 1-D, and finite and ``>= 0`` when ``validate_args`` is true)
    are checked here; options that belong to one loss (``variant``, ``n_nodes``, ...) are
    checked by that loss. Used by ``check_hyperparameters`` of the loss modules.

    Args:
        options: the options by name; names not listed above are ignored.

    Raises:
        TypeError: an option of the wrong type.
        ValueError: an option with a bad value.

    Example:
        >>> check_loss_options({"reduction": "mean", "ignore_index": -100, "weight": [1.0, 2.0]})
        >>> check_loss_options({"reduction": "sum", "validate_args": 1})
        Traceback (most recent call last):
        ...
        lightning_losses.functional.checks.ArgumentTypeError: validate_args must be True or \
False; got 1
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


# --- conformal prediction -------------------------------------------------------------------


def check_probabilities(probs: object, *, name: str = "probs") -> Tensor:
    """Check probabilities ``[N, C, *]``: a floating tensor, class dimension 1, ``C >= 1``.

    Args:
        probs: the value to check.
        name: the argument's name, for the message.

    Returns:
        ``probs``.

    Raises:
        TypeError: not a floating tensor.
        ValueError: fewer than two dimensions.

    Example:
        >>> check_probabilities(torch.tensor([0.2, 0.8]))
        Traceback (most recent call last):
        ...
        ValueError: probs must have shape [N, C] or [N, C, *] (class dimension 1); got [2]
    """
    if not isinstance(probs, Tensor) or not probs.is_floating_point():
        kind = probs.dtype if isinstance(probs, Tensor) else type(probs).__name__
        raise TypeError(f"{name} must be a floating torch.Tensor of probabilities; got {kind}")
    if probs.dim() < 2 or probs.shape[1] < 1:
        raise ValueError(
            f"{name} must have shape [N, C] or [N, C, *] (class dimension 1); "
            f"got {list(probs.shape)}"
        )
    return probs


def check_levels(alpha: float | Sequence[float] | Tensor) -> tuple[list[float], bool]:
    """Miscoverage levels ``alpha``: a list of floats in ``(0, 1)``, and whether it was one number.

    A float, a sequence of floats or a tensor (0-d: one number).

    Example:
        >>> check_levels(0.1), check_levels([0.05, 0.1])
        (([0.1], True), ([0.05, 0.1], False))
    """
    if isinstance(alpha, Tensor):
        single = alpha.dim() == 0
        values = [float(a) for a in alpha.flatten().tolist()]
    elif isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
        single, values = True, [float(alpha)]
    elif isinstance(alpha, Sequence) and not isinstance(alpha, str):
        single, values = False, [float(a) for a in alpha]
    else:
        raise TypeError(f"alpha must be a float or a sequence of floats; got {alpha!r}")
    if not values:
        raise ValueError("alpha must hold at least one level; got an empty sequence")
    for a in values:
        if not 0.0 < a < 1.0:
            raise ValueError(f"alpha must lie in (0, 1) (a miscoverage level, e.g. 0.1); got {a}")
    return values, single
