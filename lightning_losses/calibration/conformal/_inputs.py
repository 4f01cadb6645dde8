"""Input checks and the ``[N, C, *]`` -> ``[M, C]`` rows every conformal function works on."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_losses.calibration._dense import flatten_dense
from lightning_losses.functional.checks import check_class_indices, check_ignore_index

__all__ = ["METHODS", "class_last", "class_second", "rows_and_target"]

#: The non-conformity scores, by name.
METHODS = ("lac", "aps", "raps", "saps", "top_k")


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
