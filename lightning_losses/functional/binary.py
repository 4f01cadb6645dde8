"""Binary (sigmoid) losses: logits and float targets in [0, 1] of the same shape.

Soft targets mix the positive and negative terms linearly: ``y * L(x) + (1 - y) * L(-x)`` with
the roles of ``alpha`` and ``1 - alpha`` swapped for the negative term. Everything is written
with ``logsigmoid`` so that no ``log(0)`` or ``pow`` of a zero base appears.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._core import compute_dtype, reduce_loss
from ._validation import check_range, check_reduction, check_soft_target
from .target_probability import check_focal, check_hard_truncated
from .truncation import check_soft_truncated


def check_binary_focal(gamma: float, alpha: float | None) -> None:
    """``gamma >= 0`` (as :func:`check_focal`) and ``alpha`` in ``[0, 1]`` or ``None``."""
    check_focal(gamma)
    if alpha is not None:
        check_range("alpha", alpha, low=0.0, high=1.0)


def _prepare(logits: Tensor, target: Tensor, reduction: str, validate_args: bool):
    check_reduction(reduction)
    check_soft_target(logits, target, validate_args=validate_args)
    dtype = compute_dtype(logits.dtype)
    return logits.to(dtype), target.to(dtype)


def _mix(y: Tensor, positive: Tensor, negative: Tensor, reduction: str) -> Tensor:
    return reduce_loss(y * positive + (1 - y) * negative, reduction)


def binary_focal_loss(
    logits: Tensor,
    target: Tensor,
    *,
    gamma: float = 2.0,
    alpha: float | None = None,
    reduction: str = "mean",
    validate_args: bool = True,
) -> Tensor:
    """Sigmoid focal loss (Lin et al., ICCV 2017).

    With ``s = sigmoid(x)``: ``-alpha (1-s)^gamma log s`` for ``y = 1`` and
    ``-(1-alpha) s^gamma log(1-s)`` for ``y = 0``; soft ``y`` mixes the two linearly. The focal
    weights are ``exp(gamma * logsigmoid(-x))`` and ``exp(gamma * logsigmoid(x))``, finite with
    finite gradients for every ``gamma >= 0``. ``gamma = 1`` without ``alpha`` equals
    :func:`binary_soft_truncated_loss` with ``k = 1``.

    Args:
        logits: unnormalised scores of any shape.
        target: float targets in ``[0, 1]`` of the same shape.
        gamma: focusing parameter, ``>= 0``.
        alpha: weight of the positive term in ``[0, 1]`` (the negative gets ``1 - alpha``);
            ``None`` weights both by 1.
        reduction: ``"none"``, ``"mean"`` (over all elements) or ``"sum"``.
        validate_args: check that the targets lie in ``[0, 1]`` and the logits are finite.

    Example:
        >>> binary_focal_loss(torch.tensor([2.0, -1.0]), torch.tensor([1.0, 1.0]), reduction="none")
        tensor([0.0018, 0.7019])
    """
    check_binary_focal(gamma, alpha)
    x, y = _prepare(logits, target, reduction, validate_args)
    log_s, log_not_s = F.logsigmoid(x), F.logsigmoid(-x)
    positive = -torch.exp(gamma * log_not_s) * log_s
    negative = -torch.exp(gamma * log_s) * log_not_s
    if alpha is not None:
        positive, negative = alpha * positive, (1 - alpha) * negative
    return _mix(y, positive, negative, reduction)


def binary_soft_truncated_loss(
    logits: Tensor,
    target: Tensor,
    *,
    k: float = 1.0,
    reduction: str = "mean",
    validate_args: bool = True,
) -> Tensor:
    """Sigmoid soft truncation
    (Su Jianlin, "From hard truncation of the loss, through softening, to focal loss").

    ``-sigmoid(-k x) log sigmoid(x)`` for ``y = 1`` and ``-sigmoid(k x) log sigmoid(-x)`` for
    ``y = 0``; soft ``y`` mixes the two linearly.

    Args:
        logits: unnormalised scores of any shape.
        target: float targets in ``[0, 1]`` of the same shape.
        k: sharpness, ``>= 0``.
        reduction: ``"none"``, ``"mean"`` (over all elements) or ``"sum"``.
        validate_args: check that the targets lie in ``[0, 1]`` and the logits are finite.

    Example:
        >>> binary_soft_truncated_loss(
        ...     torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.0]), reduction="none"
        ... )
        tensor([0.0151, 0.0842])
    """
    check_soft_truncated(k)  # the range of the softmax soft truncation
    x, y = _prepare(logits, target, reduction, validate_args)
    positive = -torch.sigmoid(-k * x) * F.logsigmoid(x)
    negative = -torch.sigmoid(k * x) * F.logsigmoid(-x)
    return _mix(y, positive, negative, reduction)


def binary_hard_truncated_loss(
    logits: Tensor,
    target: Tensor,
    *,
    margin: float = 0.5,
    reduction: str = "mean",
    validate_args: bool = True,
) -> Tensor:
    """Sigmoid hard truncation
    (Su Jianlin, "From hard truncation of the loss, through softening, to focal loss").

    ``-log s`` for ``y = 1`` where ``s <= margin`` (0 where the positive is already confident),
    ``-log(1 - s)`` for ``y = 0`` where ``1 - s <= margin``; soft ``y`` mixes linearly.

    Args:
        logits: unnormalised scores of any shape.
        target: float targets in ``[0, 1]`` of the same shape.
        margin: in ``[0, 1]``.
        reduction: ``"none"``, ``"mean"`` (over all elements) or ``"sum"``.
        validate_args: check that the targets lie in ``[0, 1]`` and the logits are finite.

    Example:
        >>> binary_hard_truncated_loss(
        ...     torch.tensor([2.0, -1.0]), torch.tensor([1.0, 1.0]), reduction="none"
        ... )
        tensor([0.0000, 1.3133])
    """
    check_hard_truncated(margin)  # the range of the softmax hard truncation
    x, y = _prepare(logits, target, reduction, validate_args)
    s = torch.sigmoid(x)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    positive = torch.where(s <= margin, -F.logsigmoid(x), zero)
    negative = torch.where(1 - s <= margin, -F.logsigmoid(-x), zero)
    return _mix(y, positive, negative, reduction)
