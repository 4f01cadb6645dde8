"""Binary (sigmoid) losses: logits and float targets in [0, 1] of the same shape.

Soft targets mix the positive and negative terms linearly: ``y * L(x) + (1 - y) * L(-x)`` with
the roles of ``alpha`` and ``1 - alpha`` swapped for the negative term. Everything is written
with ``logsigmoid`` so that no ``log(0)`` or ``pow`` of a zero base appears.

Every loss takes the options of :func:`torch.nn.functional.binary_cross_entropy_with_logits`
and kornia's ``binary_focal_loss_with_logits``: ``pos_weight`` multiplies the positive term
(broadcast against the target: for ``[N, C]`` targets one weight per class, shape ``[C]``), and
elements whose target equals ``ignore_index`` (default ``-100``) contribute neither loss nor
gradient; ``"mean"`` divides by the number of the other elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_losses.functional._core import compute_dtype, reduce_loss
from lightning_losses.functional.checks import (
    check_finite,
    check_ignore_index,
    check_range,
    check_reduction,
    check_same_device,
    check_soft_target,
)
from lightning_losses.functional.target_probability import check_focal, check_hard_truncated
from lightning_losses.functional.truncation import check_soft_truncated
from lightning_losses.loss_ranges import LOSS_RANGES


def check_binary_focal(gamma: float, alpha: float | None) -> None:
    """``gamma >= 0`` (as :func:`check_focal`) and ``alpha`` in ``[0, 1]`` or ``None``."""
    check_focal(gamma)
    if alpha is not None:
        check_range("alpha", alpha, **LOSS_RANGES["binary_focal"]["alpha"])


def check_binary_ignore_index(ignore_index: int | None) -> None:
    """``ignore_index`` of a binary loss: ``None`` or an integer outside ``[0, 1]``.

    A value inside ``[0, 1]`` (0 or 1) is a valid target: ignoring it would be ambiguous.

    Raises:
        TypeError: neither ``None`` nor an integer.
        ValueError: an integer inside ``[0, 1]``.
    """
    if ignore_index is None:
        return
    check_ignore_index(ignore_index)
    if 0 <= ignore_index <= 1:
        raise ValueError(
            "ignore_index must lie outside [0, 1], the range of the binary targets (e.g. the "
            f"default -100), or be None to ignore nothing; got {ignore_index!r}"
        )


def check_pos_weight_values(pos_weight: Tensor | None, *, validate_args: bool = True) -> None:
    """``pos_weight``: ``None`` or a floating-point tensor; with ``validate_args`` finite, ``>= 0``.

    Raises:
        TypeError: not a floating-point tensor.
        ValueError: NaN, an infinity or a negative weight (only with ``validate_args``).
    """
    if pos_weight is None:
        return
    form = "(the weight of the positive term, broadcast against the target)"
    if not isinstance(pos_weight, Tensor):
        raise TypeError(
            f"pos_weight must be a floating-point tensor {form}; got {type(pos_weight).__name__}"
        )
    if not pos_weight.is_floating_point():
        raise TypeError(
            f"pos_weight must be a floating-point tensor {form}; got dtype {pos_weight.dtype}"
        )
    if validate_args and pos_weight.numel() > 0:
        check_finite("pos_weight", pos_weight)
        negative = pos_weight.detach() < 0
        if bool(negative.any()):
            index = negative.nonzero()[0].tolist()
            raise ValueError(
                f"pos_weight must hold weights >= 0; found "
                f"{pos_weight[tuple(index)].item()!r} at pos_weight{index}"
            )


def check_pos_weight_shape(shape: Sequence[int], target_shape: Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``shape`` broadcasts to ``target_shape`` without enlarging it.

    As in :func:`torch.nn.functional.binary_cross_entropy_with_logits`: for ``[N, C]`` targets
    one weight per class is ``[C]``, for ``[N, C, H, W]`` targets ``[C, 1, 1]``.

    Example:
        >>> check_pos_weight_shape([3, 1, 1], [8, 3, 4, 4])
        >>> check_pos_weight_shape([4], [8, 5])
        Traceback (most recent call last):
        ...
        ValueError: pos_weight must broadcast to the target's shape [8, 5] (for [N, C] targets: one weight per class, shape [5]); got shape [4]
    """  # noqa: E501
    shape, target_shape = torch.Size(shape), torch.Size(target_shape)
    try:
        fits = torch.broadcast_shapes(shape, target_shape) == target_shape
    except RuntimeError:
        fits = False
    if fits:
        return
    if len(target_shape) >= 2:
        ones = ", 1" * (len(target_shape) - 2)
        rest = ", *" if len(target_shape) > 2 else ""
        form = f"for [N, C{rest}] targets: one weight per class, shape [{target_shape[1]}{ones}]"
    else:
        form = "for [N] targets: one weight, shape [1], or one per element"
    raise ValueError(
        f"pos_weight must broadcast to the target's shape {list(target_shape)} ({form}); "
        f"got shape {list(shape)}"
    )


class _Binary(NamedTuple):
    """The checked inputs of a binary loss in the compute dtype."""

    x: Tensor
    y: Tensor  # 0 where ignored
    keep: Tensor | None  # the elements not ignored; None when nothing is ignored
    pos_weight: Tensor | None


def _prepare(
    logits: Tensor,
    target: Tensor,
    *,
    pos_weight: Tensor | None,
    ignore_index: int | None,
    reduction: str,
    validate_args: bool,
) -> _Binary:
    check_reduction(reduction)
    check_binary_ignore_index(ignore_index)
    check_soft_target(logits, target, validate_args=validate_args, ignore_index=ignore_index)
    dtype = compute_dtype(logits.dtype)
    if pos_weight is not None:
        check_pos_weight_values(pos_weight, validate_args=False)  # the type
        check_same_device("pos_weight", pos_weight, "logits", logits)
        check_pos_weight_shape(pos_weight.shape, target.shape)
        check_pos_weight_values(pos_weight, validate_args=validate_args)
        pos_weight = pos_weight.to(dtype)
    y = target.to(dtype)
    keep = None
    if ignore_index is not None:
        keep = target != ignore_index
        y = torch.where(keep, y, torch.zeros((), dtype=dtype, device=y.device))
    return _Binary(logits.to(dtype), y, keep, pos_weight)


def _mix(inputs: _Binary, positive: Tensor, negative: Tensor, reduction: str) -> Tensor:
    if inputs.pos_weight is not None:
        positive = inputs.pos_weight * positive
    loss = inputs.y * positive + (1 - inputs.y) * negative
    if inputs.keep is None:
        return reduce_loss(loss, reduction)
    loss = torch.where(inputs.keep, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    return reduce_loss(loss, reduction, inputs.keep.sum())


def binary_focal_loss(
    logits: Tensor,
    target: Tensor,
    *,
    gamma: float = 2.0,
    alpha: float | None = None,
    pos_weight: Tensor | None = None,
    ignore_index: int | None = -100,
    reduction: str = "mean",
    validate_args: bool = True,
) -> Tensor:
    """Sigmoid focal loss (Lin et al., "Focal Loss for Dense Object Detection", ICCV 2017).

    With ``s = sigmoid(x)`` and ``w`` the ``pos_weight``:
    ``-alpha w (1-s)^gamma log s`` for ``y = 1`` and ``-(1-alpha) s^gamma log(1-s)`` for
    ``y = 0``; soft ``y`` mixes the two linearly. The focal weights are
    ``exp(gamma * logsigmoid(-x))`` and ``exp(gamma * logsigmoid(x))``, finite with finite
    gradients for every ``gamma >= 0``. ``gamma = 0`` without ``alpha`` is
    :func:`torch.nn.functional.binary_cross_entropy_with_logits` (with its ``pos_weight``);
    ``gamma = 1`` without ``alpha`` equals :func:`binary_soft_truncated_loss` with ``k = 1``.

    Args:
        logits: unnormalised scores of any shape.
        target: float targets in ``[0, 1]`` (or ``ignore_index``) of the same shape.
        gamma: focusing parameter, ``>= 0``.
        alpha: weight of the positive term in ``[0, 1]`` (the negative gets ``1 - alpha``);
            ``None`` weights both by 1.
        pos_weight: floating-point weights ``>= 0`` of the positive term, multiplied with
            ``alpha``; broadcast against the target as in
            :func:`torch.nn.functional.binary_cross_entropy_with_logits` (for ``[N, C]`` targets
            one per class, shape ``[C]``; for ``[N, C, H, W]`` shape ``[C, 1, 1]``).
        ignore_index: target value whose elements contribute neither loss nor gradient (0 in
            ``"none"``); outside ``[0, 1]``, or ``None`` to ignore nothing.
        reduction: ``"none"``, ``"mean"`` (over the elements not ignored) or ``"sum"``.
        validate_args: check that the targets lie in ``[0, 1]``, the logits are finite and the
            ``pos_weight`` finite and ``>= 0``.

    Returns:
        The loss: a scalar, or the target's shape with ``reduction="none"``.

    Raises:
        ValueError: a value out of range or a ``pos_weight`` that does not broadcast to the
            target; the message names the argument.
        TypeError: an argument of the wrong type (e.g. an integer ``pos_weight``).

    Example:
        >>> binary_focal_loss(torch.tensor([2.0, -1.0]), torch.tensor([1.0, 1.0]), reduction="none")
        tensor([0.0018, 0.7019])
        >>> logits, target = torch.tensor([[2.0, -1.0]]), torch.tensor([[1.0, 1.0]])
        >>> binary_focal_loss(logits, target, pos_weight=torch.tensor([1.0, 2.0]), reduction="none")
        tensor([[0.0018, 1.4037]])
        >>> binary_focal_loss(torch.tensor([2.0, -1.0]), torch.tensor([-100.0, 1.0]))
        tensor(0.7019)
    """
    check_binary_focal(gamma, alpha)
    inputs = _prepare(
        logits,
        target,
        pos_weight=pos_weight,
        ignore_index=ignore_index,
        reduction=reduction,
        validate_args=validate_args,
    )
    log_s, log_not_s = F.logsigmoid(inputs.x), F.logsigmoid(-inputs.x)
    positive = -torch.exp(gamma * log_not_s) * log_s
    negative = -torch.exp(gamma * log_s) * log_not_s
    if alpha is not None:
        positive, negative = alpha * positive, (1 - alpha) * negative
    return _mix(inputs, positive, negative, reduction)


def binary_soft_truncated_loss(
    logits: Tensor,
    target: Tensor,
    *,
    k: float = 1.0,
    pos_weight: Tensor | None = None,
    ignore_index: int | None = -100,
    reduction: str = "mean",
    validate_args: bool = True,
) -> Tensor:
    """Sigmoid soft truncation.

    After Su Jianlin, "From hard truncation of the loss, through softening, to focal loss".

    With ``w`` the ``pos_weight``: ``-w sigmoid(-k x) log sigmoid(x)`` for ``y = 1`` and
    ``-sigmoid(k x) log sigmoid(-x)`` for ``y = 0``; soft ``y`` mixes the two linearly.

    Args:
        logits: unnormalised scores of any shape.
        target: float targets in ``[0, 1]`` (or ``ignore_index``) of the same shape.
        k: sharpness, ``>= 0``.
        pos_weight: floating-point weights ``>= 0`` of the positive term, broadcast against
            the target as in :func:`torch.nn.functional.binary_cross_entropy_with_logits` (for
            ``[N, C]`` targets one per class, shape ``[C]``).
        ignore_index: target value whose elements contribute neither loss nor gradient (0 in
            ``"none"``); outside ``[0, 1]``, or ``None`` to ignore nothing.
        reduction: ``"none"``, ``"mean"`` (over the elements not ignored) or ``"sum"``.
        validate_args: check that the targets lie in ``[0, 1]``, the logits are finite and the
            ``pos_weight`` finite and ``>= 0``.

    Returns:
        The loss: a scalar, or the target's shape with ``reduction="none"``.

    Raises:
        ValueError: a value out of range or a ``pos_weight`` that does not broadcast to the
            target; the message names the argument.
        TypeError: an argument of the wrong type.

    Example:
        >>> binary_soft_truncated_loss(
        ...     torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.0]), reduction="none"
        ... )
        tensor([0.0151, 0.0842])
        >>> binary_soft_truncated_loss(
        ...     torch.tensor([[2.0, -1.0]]), torch.tensor([[1.0, 0.0]]),
        ...     pos_weight=torch.tensor([3.0, 3.0]), reduction="none",
        ... )
        tensor([[0.0454, 0.0842]])
        >>> binary_soft_truncated_loss(torch.tensor([2.0, -1.0]), torch.tensor([1.0, -100.0]))
        tensor(0.0151)
    """
    check_soft_truncated(k)  # the range of the softmax soft truncation
    inputs = _prepare(
        logits,
        target,
        pos_weight=pos_weight,
        ignore_index=ignore_index,
        reduction=reduction,
        validate_args=validate_args,
    )
    x = inputs.x
    positive = -torch.sigmoid(-k * x) * F.logsigmoid(x)
    negative = -torch.sigmoid(k * x) * F.logsigmoid(-x)
    return _mix(inputs, positive, negative, reduction)


def binary_hard_truncated_loss(
    logits: Tensor,
    target: Tensor,
    *,
    margin: float = 0.5,
    pos_weight: Tensor | None = None,
    ignore_index: int | None = -100,
    reduction: str = "mean",
    validate_args: bool = True,
) -> Tensor:
    """Sigmoid hard truncation.

    After Su Jianlin, "From hard truncation of the loss, through softening, to focal loss".

    With ``w`` the ``pos_weight``: ``-w log s`` for ``y = 1`` where ``s <= margin`` (0 where
    the positive is already confident), ``-log(1 - s)`` for ``y = 0`` where
    ``1 - s <= margin``; soft ``y`` mixes linearly.

    Args:
        logits: unnormalised scores of any shape.
        target: float targets in ``[0, 1]`` (or ``ignore_index``) of the same shape.
        margin: in ``[0, 1]``.
        pos_weight: floating-point weights ``>= 0`` of the positive term, broadcast against
            the target as in :func:`torch.nn.functional.binary_cross_entropy_with_logits` (for
            ``[N, C]`` targets one per class, shape ``[C]``).
        ignore_index: target value whose elements contribute neither loss nor gradient (0 in
            ``"none"``); outside ``[0, 1]``, or ``None`` to ignore nothing.
        reduction: ``"none"``, ``"mean"`` (over the elements not ignored) or ``"sum"``.
        validate_args: check that the targets lie in ``[0, 1]``, the logits are finite and the
            ``pos_weight`` finite and ``>= 0``.

    Returns:
        The loss: a scalar, or the target's shape with ``reduction="none"``.

    Raises:
        ValueError: a value out of range or a ``pos_weight`` that does not broadcast to the
            target; the message names the argument.
        TypeError: an argument of the wrong type.

    Example:
        >>> binary_hard_truncated_loss(
        ...     torch.tensor([2.0, -1.0]), torch.tensor([1.0, 1.0]), reduction="none"
        ... )
        tensor([0.0000, 1.3133])
        >>> binary_hard_truncated_loss(
        ...     torch.tensor([[2.0, -1.0]]), torch.tensor([[1.0, 1.0]]),
        ...     pos_weight=torch.tensor([2.0, 2.0]), reduction="none",
        ... )
        tensor([[0.0000, 2.6265]])
        >>> binary_hard_truncated_loss(torch.tensor([2.0, -1.0]), torch.tensor([-100.0, 1.0]))
        tensor(1.3133)
    """
    check_hard_truncated(margin)  # the range of the softmax hard truncation
    inputs = _prepare(
        logits,
        target,
        pos_weight=pos_weight,
        ignore_index=ignore_index,
        reduction=reduction,
        validate_args=validate_args,
    )
    x = inputs.x
    s = torch.sigmoid(x)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    positive = torch.where(s <= margin, -F.logsigmoid(x), zero)
    negative = torch.where(1 - s <= margin, -F.logsigmoid(-x), zero)
    return _mix(inputs, positive, negative, reduction)
