"""Dual focal loss: focal loss whose weight also grows with the runner-up probability.

Source: Tao, Dong and Xu, "Dual Focal Loss for Calibration" (ICML 2023), and its released
``DualFocalLoss`` criterion.

Per element, with ``p = softmax(x)``, ``p_t`` the target's probability and ``p_j`` the largest
probability strictly below ``p_t`` (0 if there is none)::

    loss = -(1 - p_t + p_j)^gamma log p_t

For ``[N, C]`` logits one autograd function computes it a chunk of rows at a time (log-softmax
once, ``p = exp(log p)``, the masked maximum) and saves only per-row numbers for the backward,
which recomputes the softmax; ``[N, C, *]`` logits are flattened to rows first.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_losses.functional._core import (
    CPU_SMOOTHING_ELEMENTS,
    compute_dtype,
    reduce_loss,
    row_chunks,
)
from lightning_losses.functional._kernel_checks import check_index_values
from lightning_losses.functional.checks import (
    check_dual_focal,
    check_index_target,
    check_reduction,
)
from lightning_losses.kernels.availability import use_kernels

__all__ = ["dual_focal_loss", "dual_focal_terms"]


def _chunks(logits: Tensor) -> list[tuple[int, int]]:
    """Row ranges of the passes: cache-sized on a CPU (several passes read each chunk)."""
    elements = CPU_SMOOTHING_ELEMENTS if logits.device.type == "cpu" else None
    return row_chunks(logits.shape[0], logits.shape[1], elements)


def dual_focal_terms(log_p_t: Tensor, p_j: Tensor, gamma: float) -> tuple[Tensor, Tensor, Tensor]:
    """The loss and its two per-row gradient factors from ``log p_t`` and ``p_j``.

    With ``b = 1 - p_t + p_j`` (``1 - p_t`` computed as ``-expm1(log p_t)``), ``w = b^gamma``
    and ``A = -log p_t``, the loss is ``w A`` and its gradient with respect to the logits is
    ``c_t (e_t - p) + c_j (e_j - p)`` with::

        c_t = -(w + G p_t),   c_j = G p_j,   G = gamma b^(gamma - 1) A = gamma w (A / b)

    ``A / b`` is bounded (``b >= 1 - p_t`` and ``A / (1 - p_t) -> 1`` as ``p_t -> 1``), and
    ``b = 0`` only where ``A = 0``: there ``G = 0`` (the limit), not the ``0 * inf`` of a
    naive ``pow`` gradient for ``gamma < 1``.

    Returns:
        ``(loss, c_t, c_j)``, each of the shape of ``log_p_t``.

    Example:
        >>> log_p_t = torch.tensor([0.5]).log()
        >>> loss, c_t, c_j = dual_focal_terms(log_p_t, torch.tensor([0.3]), 2.0)
        >>> loss  # (1 - 0.5 + 0.3)^2 * log 2
        tensor([0.4436])
    """
    p_t = torch.exp(log_p_t)
    base = -torch.expm1(log_p_t) + p_j
    weight = base.pow(gamma)
    nll = -log_p_t
    positive = base > 0
    ratio = torch.where(positive, nll / torch.where(positive, base, 1.0), 0.0)
    slope = gamma * weight * ratio
    return weight * nll, -(weight + slope * p_t), slope * p_j


class _FusedDualFocal(torch.autograd.Function):
    """``-(1 - p_t + p_j)^gamma log p_t`` per row of 2-D logits, a chunk of rows at a time.

    The forward takes each chunk's log-softmax, ``p = exp(log p)``, the target's entry and the
    largest entry strictly below it (``p < p_t``, the reference's mask) with its column ``j``;
    it saves ``j`` and the two factors of :func:`dual_focal_terms`. The backward writes
    ``g * (c_t e_t + c_j e_j - (c_t + c_j) softmax)`` for an upstream gradient ``g``.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, valid: Tensor, gamma: float) -> Tensor:
        dtype = compute_dtype(logits.dtype)
        rows = logits.shape[0]
        log_p_t = torch.empty(rows, dtype=dtype, device=logits.device)
        p_j = torch.empty(rows, dtype=dtype, device=logits.device)
        runner_up = torch.empty(rows, dtype=torch.long, device=logits.device)
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in _chunks(logits):
                log_p = torch.log_softmax(logits[start:stop].to(dtype), dim=1)
                chunk_log_p_t = log_p.gather(1, target[start:stop, None])
                p = log_p.exp_()  # in place: the log-softmax is not needed any more
                top, index = p.mul_(p < chunk_log_p_t.exp()).max(dim=1)  # 0 where p >= p_t
                log_p_t[start:stop] = chunk_log_p_t[:, 0]
                p_j[start:stop] = top
                runner_up[start:stop] = index
            zero = torch.zeros((), dtype=dtype, device=logits.device)
            log_p_t = torch.where(valid, log_p_t, zero)
            p_j = torch.where(valid, p_j, zero)
            value, c_t, c_j = dual_focal_terms(log_p_t, p_j, gamma)
        ctx.save_for_backward(
            logits,
            target,
            runner_up,
            torch.where(valid, c_t, zero),
            torch.where(valid, c_j, zero),
        )
        return torch.where(valid, value, zero)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        logits, target, runner_up, c_t, c_j = ctx.saved_tensors
        g = grad_output.to(c_t.dtype)
        scale_t, scale_j = (g * c_t)[:, None], (g * c_j)[:, None]
        total = -(scale_t + scale_j)
        grad = torch.empty_like(logits)
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in _chunks(logits):
                softmax = torch.softmax(logits[start:stop].to(c_t.dtype), dim=1)
                out = grad[start:stop] if grad.dtype == softmax.dtype else softmax
                torch.mul(softmax, total[start:stop], out=out)
                out.scatter_add_(1, target[start:stop, None], scale_t[start:stop])
                out.scatter_add_(1, runner_up[start:stop, None], scale_j[start:stop])
                if out is softmax:
                    grad[start:stop] = softmax
        return grad, None, None, None


def dual_focal_loss(
    logits: Tensor,
    target: Tensor,
    *,
    gamma: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "mean",
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Dual focal loss ``-(1 - p_t + p_j)^gamma log p_t``.

    ``p_t`` is the target's softmax probability and ``p_j`` the largest probability strictly
    below it (0 when no class is below ``p_t``). Unlike focal loss, whose weight ``(1 -
    p_t)^gamma`` vanishes on confident samples, the weight stays large while the runner-up is
    close: the loss widens the gap between the target and the runner-up rather than only
    pushing ``p_t`` up, which the authors show balances over- and under-confidence. ``gamma =
    0`` is cross-entropy.

    As in the authors' code, ``p_j`` takes its gradient (it is the runner-up's softmax
    probability), and a class whose probability equals ``p_t`` (the target itself, a tie) is
    not a candidate for ``p_j`` (the strict ``<`` of their mask). The weight's ``1 - p_t`` is
    computed as ``-expm1(log p_t)``, accurate where ``p_t`` is near 1, and the gradient is
    written in closed form (see :func:`dual_focal_terms`), finite for every ``gamma >= 0``.

    Source: Tao, Dong and Xu, "Dual Focal Loss for Calibration" (ICML 2023). The authors'
    ``DualFocalLoss`` class defaults to ``gamma = 0`` (cross-entropy) and their training script
    to ``gamma = 1``, the default here. Their criterion sums over the batch
    (``size_average=False``); the default here is the mean (``reduction="sum"`` is theirs).

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1); ``[N, C, *]`` is
            treated as the rows ``[N * prod(*), C]``, as the authors' criterion flattens it.
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        gamma: focusing parameter, ``>= 0``.
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` (over the non-ignored elements)
            or ``"sum"``.
        validate_args: check target values and finite logits (device synchronisations; one
            with ``backend="triton"``).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the fused kernels of
            :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error) or ``"torch"``. The kernels
            (:mod:`lightning_losses.kernels.dual_focal`) find the runner-up in the forward's
            one pass and write its column's gradient in the backward's.

    Returns:
        The loss; float16 and bfloat16 logits are computed and returned in float32, as every
        loss of the package.

    Raises:
        ValueError: ``gamma`` negative, NaN or infinite (``TypeError`` if it is not a real
            number); a bad ``reduction`` or ``target``.

    Example:
        >>> logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
        >>> # row 0: p = (0.665, 0.245, 0.090), b = 1 - 0.665 + 0.245; row 1: no p_j, b = 2/3
        >>> dual_focal_loss(logits, torch.tensor([0, 2]), gamma=2.0, reduction="none")
        tensor([0.1369, 0.4883])
    """
    check_dual_focal(gamma)
    check_reduction(reduction)
    check_index_target(logits, target, ignore_index=ignore_index, validate_args=False)
    kernels = use_kernels(logits, backend)
    if validate_args:  # on the kernel path one synchronisation
        check_index_values(logits, target, ignore_index=ignore_index, kernels=kernels)
    classes = logits.shape[1]
    rows = logits if logits.dim() == 2 else logits.movedim(1, -1).reshape(-1, classes)
    flat_target = target.reshape(-1).long()
    valid = flat_target != ignore_index
    safe_target = torch.where(valid, flat_target, 0)
    if kernels:
        from lightning_losses.kernels.dual_focal import TritonDualFocal

        loss = TritonDualFocal.apply(rows, safe_target, valid, float(gamma), dual_focal_terms)
    else:
        loss = _FusedDualFocal.apply(rows, safe_target, valid, float(gamma))
    return reduce_loss(loss.reshape(target.shape), reduction, valid.sum())
