"""Input checks and the ``[N, C, *]`` -> ``[M, C]`` rows every conformal function works on."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lightning_losses.calibration._dense import flatten_dense
from lightning_losses.functional.checks import (
    check_choice,
    check_class_indices,
    check_ignore_index,
)

__all__ = ["METHODS", "check_alphas", "check_probs", "rows_and_target"]

#: The non-conformity scores, by name.
METHODS = ("lac", "aps", "raps", "saps", "top_k")


def check_probs(probs: object, *, name: str = "probs") -> Tensor:
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
        >>> check_probs(torch.tensor([0.2, 0.8]))
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


def rows_and_target(
    probs: Tensor, target: Tensor, *, ignore_index: int | None, name: str = "probs"
) -> tuple[Tensor, Tensor]:
    """``[M, C]`` rows and ``[M]`` class indices of the kept (not ignored) positions.

    Args:
        probs: ``[N, C, *]`` probabilities (or sets), class dimension 1.
        target: ``[N, *]`` class indices.
        ignore_index: positions whose target equals it are dropped; ``None`` keeps all.
        name: the first argument's name, for the messages.

    Returns:
        The rows and their targets, in row-major order of ``target``.

    Raises:
        TypeError: ``target`` is not an integer tensor.
        ValueError: the shapes do not match, or a kept target is outside ``[0, C)``.

    Example:
        >>> rows, t = rows_and_target(torch.rand(2, 3, 4), torch.tensor([[0, 1, -100, 2]] * 2),
        ...                           ignore_index=-100)
        >>> rows.shape, t.tolist()
        (torch.Size([6, 3]), [0, 1, 2, 0, 1, 2])
    """
    if not isinstance(target, Tensor) or target.is_floating_point() or target.dtype == torch.bool:
        kind = target.dtype if isinstance(target, Tensor) else type(target).__name__
        raise TypeError(f"target must be an integer tensor of class indices; got {kind}")
    expected = (probs.shape[0], *probs.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(
            f"target must have shape {list(expected)} to match {name} of shape "
            f"{list(probs.shape)} (class dimension 1); got {list(target.shape)}"
        )
    if ignore_index is not None:
        check_ignore_index(ignore_index)
    keep = None if ignore_index is None else target != ignore_index
    if probs.dim() == 2:
        rows, labels = (probs, target) if keep is None else (probs[keep], target[keep])
    else:
        if keep is None:
            keep = torch.ones_like(target, dtype=torch.bool)
        rows, labels = flatten_dense(probs, target, keep)
    check_class_indices("target", labels, probs.shape[1], ignore_index=None)
    return rows, labels.long()


def class_last(probs: Tensor) -> Tensor:
    """``[N, C, *]`` as ``[M, C]`` rows (every position), row-major over ``N, *``."""
    return probs.movedim(1, -1).reshape(-1, probs.shape[1])


def class_second(rows: Tensor, like: Tensor) -> Tensor:
    """Inverse of :func:`class_last`: ``[M, C]`` rows back to the layout of ``like``."""
    shape = (like.shape[0], *like.shape[2:], like.shape[1])
    return rows.reshape(shape).movedim(-1, 1)


def check_method(method: object) -> str:
    """Check a score's name (one of :data:`METHODS`) and return it."""
    check_choice("method", method, METHODS)
    return str(method)


def check_alphas(alpha: float | Sequence[float] | Tensor) -> tuple[list[float], bool]:
    """``alpha`` as a list of miscoverage levels in ``(0, 1)``, and whether it was one number.

    Example:
        >>> check_alphas(0.1), check_alphas([0.05, 0.1])
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
