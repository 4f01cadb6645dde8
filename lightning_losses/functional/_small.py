"""Small ``[N, C]`` logits of short rows on a CPU: the family's loss in one autograd node.

At small sizes a loss costs the calls around its kernels, not its passes over the logits
(each PyTorch operation costs a few microseconds of dispatch; so does each autograd node), and
PyTorch's CPU log-softmax does not vectorise rows of fewer than 16 classes (measured on one
thread at ``[100, 10]``: 16 µs along the rows, 4.5 µs along the columns of the transpose;
2.6-3.6 µs either way from 16 classes on, 5 µs both ways at 3). For such rows one
:class:`torch.autograd.Function` takes the log-softmax of the transpose and does the rest of
the forward (``log p_t``, ``phi``, the weights, the label-smoothing term, the reduction), and
writes the gradient in the same forward::

    d loss / d x_ij = r_i (onehot(t_i)_j - p_ij) + h_i (W p_ij - w_j)

with ``r_i`` the row's coefficient (class weight, ``1 - eps``, the mean's ``1 /
denominator``) times ``phi'(log p_t)``, ``h_i`` that of the smoothing term ``eps / C * sum_c
w_c (-log p_ic)`` and ``W = sum_c w_c`` (see :mod:`._core`); the backward multiplies it by the
upstream gradient. The values are those of the other paths up to the order of a sum of ``C``
terms. :func:`._core.takes_small_rows` says which calls come here and what it saves.

The checks stay on: a target out of ``[0, C)`` makes the gather fail, and only then are the
targets looked at (the package's one-line error, or the batch again with its ignored rows
masked); the logits' finiteness is read from one sum, a CPU scalar.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lightning_losses.functional.checks import (
    check_class_indices,
    check_class_weights,
    check_finite,
)

#: Rows of fewer classes take the log-softmax of the transposed logits (see the module's text);
#: 3 is where the two meet.
TRANSPOSED_CLASSES = range(3, 16)


def log_softmax_rows(x: Tensor) -> Tensor:
    """``log_softmax(x, dim=1)`` of 2-D ``x``, along the columns of ``x.T`` for short rows.

    Example:
        >>> x = torch.tensor([[2.0, 0.0, 0.0, 1.0]])
        >>> torch.allclose(log_softmax_rows(x), torch.log_softmax(x, dim=1))
        True
    """
    if x.shape[1] in TRANSPOSED_CLASSES:
        return torch.log_softmax(x.T, dim=0).T
    return torch.log_softmax(x, dim=1)


#: ``(valid, coefficient, smooth, factor, reduction, validate, gradient)`` of :class:`_SmallRows`.
RowsSpec = tuple[
    Tensor | None, Tensor | None, tuple[Tensor, Tensor | None] | None, float, str, bool, bool
]


class _SmallRows(torch.autograd.Function):
    """``sum_i a_i phi(log p_ti) + b_i s_i`` (or its rows), ``s_i = sum_c w_c (-log p_ic)``.

    ``target`` holds class indices in ``[0, C)`` only (ignored rows point at class 0, have
    ``a_i = b_i = 0`` and their ``log p_t`` replaced by 0 before ``phi``, where every ``phi`` of
    the family is 0). ``spec`` (:data:`RowsSpec`): ``valid`` is ``None`` (nothing ignored) or
    the mask of the rows that count; ``coefficient`` is ``a`` (``None``: all 1); ``smooth`` is
    ``None`` or ``(b, w)`` (``w`` ``None``: all 1); ``factor`` multiplies the sum (``1 /
    denominator`` for ``"mean"``; ``0`` asks for ``mean()`` itself, nothing being weighted or
    ignored); with ``validate`` the logits' sum must be finite (else
    :func:`~lightning_losses.functional.checks.check_finite` names the entry); ``gradient``
    says whether the call is recorded for a backward (grad mode on, logits requiring grad). ``phi``
    ``None`` is cross-entropy (``phi = -log p``, ``phi' = -1``).

    The gradient is written in the forward, for an upstream gradient of 1 (the backward
    multiplies it by the upstream gradient: one operation): at this size that costs less than
    keeping the log-softmax and a dozen operations in a Python backward. Once differentiable.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        target: Tensor,
        spec: RowsSpec,
        phi: Any,
        hyperparameters: dict[str, Any],
    ) -> Tensor:
        valid, _, _, _, reduction, validate, gradient = spec
        if validate and not math.isfinite(logits.sum().item()):
            check_finite("logits", logits)
        log_softmax = log_softmax_rows(logits)
        index = target.unsqueeze(1)
        log_p = log_softmax.gather(1, index).view(-1)
        if valid is not None:  # ignored rows: log p_t = 0, where phi is 0
            log_p = torch.where(valid, log_p, 0.0)
        if phi is None:  # cross-entropy: phi = -log p, phi' = -1
            value, derivative = log_p.neg(), None
        else:
            value, derivative = phi(log_p, **hyperparameters)
        loss = _reduce(value, log_softmax, spec)
        ctx.reduction = reduction
        if gradient:
            ctx.save_for_backward(_gradient(log_softmax, index, derivative, spec))
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled():  # create_graph=True: PyTorch's error for a second order
            return _SmallRows._once_differentiable_backward(ctx, grad_output)
        (grad,) = ctx.saved_tensors
        upstream = grad_output.unsqueeze(1) if ctx.reduction == "none" else grad_output
        return grad * upstream, None, None, None, None

    @staticmethod
    @torch.autograd.function.once_differentiable
    def _once_differentiable_backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        with torch.no_grad():
            return _SmallRows.backward(ctx, grad_output)


def _reduce(value: Tensor, log_softmax: Tensor, spec: RowsSpec) -> Tensor:
    """``a_i phi_i + b_i s_i`` per row, or summed and times ``factor``."""
    valid, coefficient, smooth, factor, reduction, _, _ = spec
    total = None
    if smooth is not None:  # sum_c w_c log p_c = -s_i
        b, class_weight = smooth
        total = log_softmax.sum(1) if class_weight is None else log_softmax @ class_weight
        if valid is not None:
            total = torch.where(valid, total, 0.0)
    if reduction == "none":
        loss = value if coefficient is None else value * coefficient
        return loss if total is None else torch.addcmul(loss, total, b, value=-1.0)
    if factor == 0.0:
        return value.mean()
    loss = value.sum() if coefficient is None else torch.dot(value, coefficient)
    if total is not None:
        loss = loss.sub_(torch.dot(total, b))
    return loss if factor == 1.0 else loss.mul_(factor)


def _gradient(
    log_softmax: Tensor, index: Tensor, derivative: Tensor | None, spec: RowsSpec
) -> Tensor:
    """``r_i (onehot(t_i) - p_i) + h_i (W p_i - w)`` for an upstream gradient of 1.

    ``r = factor * a * phi'`` (``phi'`` ``None``: -1), ``h = factor * b``. Overwrites
    ``log_softmax`` (with the softmax, then the gradient).
    """
    _, coefficient, smooth, factor, _, _, _ = spec
    if factor == 0.0:
        factor = 1.0 / log_softmax.shape[0]
    if derivative is None:  # cross-entropy
        if coefficient is None:
            derivative = torch.full((log_softmax.shape[0],), -1.0, dtype=log_softmax.dtype)
        else:
            derivative = coefficient.neg()
    elif coefficient is not None:
        derivative = derivative * coefficient
    r = (derivative * factor if factor != 1.0 else derivative).unsqueeze(1)
    grad = log_softmax.exp_()
    if smooth is None:
        grad.mul_(r.neg())
    else:
        b, class_weight = smooth
        h = (b * factor).unsqueeze(1)
        total = log_softmax.shape[1] if class_weight is None else class_weight.sum()
        grad.mul_(h * total - r)
        grad.sub_(h if class_weight is None else h * class_weight)
    return grad.scatter_add_(1, index, r)


def small_rows(
    logits: Tensor,
    target: Tensor,
    phi: Any,
    hyperparameters: dict[str, Any],
    weight: Tensor | None,
    weight_name: str,
    ignore_index: int,
    reduction: str,
    eps: float,
    validate_args: bool,
    weighted_mean: bool,
) -> Tensor:
    """The family's loss of 2-D CPU logits in one autograd node (:class:`_SmallRows`).

    Same arguments and numbers as the core's other paths (``phi`` ``None`` for cross-entropy),
    for at least one row; half-precision logits are computed in float32. The checks: targets
    in ``[0, C)`` or ``ignore_index`` (always: an index out of range cannot be gathered),
    finite logits and weights (with ``validate_args``), each with the package's one-line
    error. A batch is first tried as if nothing were ignored (no mask): a target out of
    ``[0, C)`` makes the gather fail, and only then are the targets looked at.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> target = torch.tensor([0, -100])
        >>> options = ("weight", -100, "mean", 0.0, True, True)
        >>> small_rows(logits, target, None, {}, None, *options)  # -log p_0 of row 0
        tensor(0.2395)
    """
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    if target.dtype != torch.int64:
        target = target.long()
    if validate_args and weight is not None:
        check_class_weights(weight_name, weight)
    arguments = (phi, hyperparameters, weight, reduction, eps, validate_args, weighted_mean)
    classes = x.shape[1]
    if not 0 <= ignore_index < classes:  # the common case: nothing to mask unless it fails
        try:
            return _rows(x, target, None, *arguments)
        except (IndexError, RuntimeError):
            check_class_indices("target", target, classes, ignore_index=ignore_index)
            if not bool((target == ignore_index).any()):
                raise
    else:
        check_class_indices("target", target, classes, ignore_index=ignore_index)
    valid = target != ignore_index
    return _rows(x, torch.where(valid, target, 0), valid, *arguments)


def _rows(
    x: Tensor,
    target: Tensor,
    valid: Tensor | None,
    phi: Any,
    hyperparameters: dict[str, Any],
    weight: Tensor | None,
    reduction: str,
    eps: float,
    validate_args: bool,
    weighted_mean: bool,
) -> Tensor:
    """:class:`_SmallRows` with its coefficients; ``valid`` ``None``: nothing ignored."""
    rows, classes = x.shape
    count = rows if valid is None else int(valid.sum())
    coefficient: Tensor | None = None
    denominator: float = count
    if weight is not None:
        weight = weight.to(x.dtype)
        coefficient = weight[target]
        if valid is not None:
            coefficient = coefficient * valid
        if weighted_mean:
            denominator = coefficient.sum().item()
    elif valid is not None and count < rows:
        coefficient = valid.to(x.dtype)
    smooth = None
    if eps > 0:
        if coefficient is None:
            coefficient = torch.full((rows,), 1.0 - eps, dtype=x.dtype)
        else:
            coefficient = coefficient * (1.0 - eps)
        b = torch.full((rows,), eps / classes, dtype=x.dtype)
        smooth = (b if valid is None else b * valid, weight)
    factor = 1.0
    if reduction == "mean" and denominator > 0:
        factor = 1.0 / denominator
        if coefficient is None and smooth is None and valid is None:
            factor = 0.0  # mean() itself
    gradient = x.requires_grad and torch.is_grad_enabled()
    spec = (valid, coefficient, smooth, factor, reduction, validate_args, gradient)
    return _SmallRows.apply(x, target, spec, phi, hyperparameters)
