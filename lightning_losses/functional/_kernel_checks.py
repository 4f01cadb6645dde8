"""The value checks of the kernel path, read with one host synchronisation.

On the torch path each value check (targets in range, finite logits, class weights finite and
``>= 0``) reads its own scalar, a device synchronisation each. On the kernel path
(``backend="triton"``, :mod:`lightning_losses.kernels`) the conditions are computed on the
device, stacked into one boolean tensor and read once; only when one of them fails are the
package's own checks run again to raise their one-line error (the slow path is the error
path). With ``validate_args=False`` nothing is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lightning_losses.functional.checks import (
    check_class_indices,
    check_class_weights,
    check_finite,
)

__all__ = ["check_index_values", "check_kernel_inputs"]

#: A condition computed on the device (a bool scalar, true when the input is bad) and the check
#: that raises its error (run only when the condition is true).
Condition = tuple[Tensor, Callable[[], None]]


def _discard(_: object) -> None:
    """Drop a check's return value (the check raises or passes)."""


def check_kernel_inputs(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int,
    weight: Tensor | None = None,
    weight_name: str = "weight",
    extra: Sequence[Condition] = (),
) -> None:
    """Check targets, logits, class weights (and ``extra`` conditions) with one synchronisation.

    The conditions: a non-ignored target outside ``[0, C)``; a non-finite sum of the logits
    (NaN and inf propagate through a sum; a finite sum means finite logits); a class weight
    negative or not finite; each ``extra`` condition. They are stacked and read with one
    ``tolist()``; a true one reruns its check, which raises the package's error (a sum that
    overflowed on finite logits passes that check).

    Args:
        logits: ``[N, C]`` logits.
        target: ``[N]`` class indices or ``ignore_index``.
        ignore_index: the target value of an ignored row.
        weight: optional ``[C]`` class weights.
        weight_name: their name in the error (``alpha`` for focal loss).
        extra: more ``(bad, check)`` pairs, e.g. AdaFocal's bins.

    Raises:
        ValueError: the error of the first failing check.

    Example:
        >>> logits = torch.zeros(2, 3)
        >>> check_kernel_inputs(logits, torch.tensor([0, -100]), ignore_index=-100)
        >>> check_kernel_inputs(logits, torch.tensor([0, 3]), ignore_index=-100)
        Traceback (most recent call last):
        ...
        ValueError: target values must lie in [0, 2] (C=3 classes) or equal ignore_index=-100; \
found 3
    """
    classes = logits.shape[1]
    conditions: list[Condition] = [
        (
            (((target < 0) | (target >= classes)) & (target != ignore_index)).any(),
            lambda: check_class_indices("target", target, classes, ignore_index=ignore_index),
        ),
        (
            ~torch.isfinite(logits.detach().sum(dtype=torch.float32)),
            lambda: check_finite("logits", logits),
        ),
    ]
    if weight is not None:
        conditions.append(
            (
                ~((weight >= 0) & torch.isfinite(weight)).all(),
                lambda: _discard(check_class_weights(weight_name, weight)),
            )
        )
    conditions.extend(extra)
    flags = torch.stack([bad.to(device=logits.device).reshape(()) for bad, _ in conditions])
    for failed, (_, check) in zip(flags.tolist(), conditions, strict=True):  # the one read
        if failed:
            check()


def check_index_values(logits: Tensor, target: Tensor, *, ignore_index: int, kernels: bool) -> None:
    """The value checks of ``check_index_target`` (its shapes already checked).

    On the kernel path (``kernels``) in one read (:func:`check_kernel_inputs`); elsewhere the
    checks module's own checks, as ``check_index_target(..., validate_args=True)`` runs them.

    Example:
        >>> check_index_values(torch.zeros(2, 3), torch.tensor([0, 2]), ignore_index=-100,
        ...                    kernels=False)
    """
    if kernels:
        check_kernel_inputs(logits, target, ignore_index=ignore_index)
        return
    check_class_indices("target", target, logits.shape[1], ignore_index=ignore_index)
    check_finite("logits", logits)
