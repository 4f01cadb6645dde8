"""Margin-based label smoothing (MbLS): cross-entropy plus a hinge on the logit distances.

Source: Liu, Ben Ayed, Galdran and Dolz, "The devil is in the margins: margin-based label
smoothing for network calibration" (CVPR 2022), and its released ``LogitMarginL1`` criterion.

Per element, with ``M = max_j x_j`` the largest logit and ``C`` classes::

    loss = -log p_t + alpha / C * sum_k max(0, M - x_k - margin)

For ``[N, C]`` logits one autograd function computes both terms a chunk of rows at a time
(log-softmax, row maximum and hinge in the forward; softmax and hinge mask recomputed in the
backward), so nothing of size ``[N, C]`` is kept for the backward but the logits themselves.
Small CPU logits (:data:`SMALL_ROWS_ELEMENTS`), where a call costs its dispatch, take the same
formula in PyTorch's own operations and autograd instead (:func:`_small_margin_loss`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_losses.functional._core import (
    CPU_SMOOTHING_ELEMENTS,
    compute_dtype,
    reduce_loss,
    row_chunks,
)
from lightning_losses.functional._kernel_checks import check_index_values
from lightning_losses.functional.checks import check_index_target, check_mbls, check_reduction
from lightning_losses.kernels.availability import use_kernels

__all__ = ["mbls_loss"]


def _chunks(logits: Tensor) -> list[tuple[int, int]]:
    """Row ranges of the passes: cache-sized on a CPU (several passes read each chunk)."""
    elements = CPU_SMOOTHING_ELEMENTS if logits.device.type == "cpu" else None
    return row_chunks(logits.shape[0], logits.shape[1], elements)


class _FusedMarginLoss(torch.autograd.Function):
    """``-log p_t + alpha / C * sum_k relu(M - x_k - margin)`` per row of 2-D logits.

    The forward saves, per row, the column of the maximum (the one ``max(dim=1)`` returns, as
    the reference's ``max`` does) and the maximum itself. The backward writes, for an upstream
    gradient ``g`` and ``h = g * alpha / C``: ``g * (softmax - onehot(t))`` for the
    cross-entropy, ``-h`` on every class whose hinge is active (``M - x_k - margin > 0``) and
    ``+h`` times the number of active classes on the maximum's column.
    """

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, valid: Tensor, margin: float, alpha: float
    ) -> Tensor:
        dtype = compute_dtype(logits.dtype)
        rows = logits.shape[0]
        value = torch.empty(rows, dtype=dtype, device=logits.device)
        maximum = torch.empty(rows, dtype=dtype, device=logits.device)
        argmax = torch.empty(rows, dtype=torch.long, device=logits.device)
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in _chunks(logits):
                chunk = logits[start:stop].to(dtype)
                log_p_t = torch.log_softmax(chunk, dim=1).gather(1, target[start:stop, None])
                top, index = chunk.max(dim=1, keepdim=True)
                hinge = (top - chunk).sub_(margin).clamp_min_(0.0).mean(dim=1)
                value[start:stop] = hinge.mul_(alpha).sub_(log_p_t[:, 0])
                maximum[start:stop] = top[:, 0]
                argmax[start:stop] = index[:, 0]
            value = torch.where(valid, value, torch.zeros((), dtype=dtype, device=value.device))
        ctx.margin, ctx.alpha = margin, alpha
        ctx.save_for_backward(logits, target, valid, maximum, argmax)
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        logits, target, valid, maximum, argmax = ctx.saved_tensors
        columns = logits.shape[1]
        g = torch.where(valid, grad_output, 0).to(maximum.dtype)[:, None]
        h = g * (ctx.alpha / columns)
        grad = torch.empty_like(logits)
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in _chunks(logits):
                chunk = logits[start:stop].to(maximum.dtype)
                g_rows, h_rows = g[start:stop], h[start:stop]
                softmax = torch.softmax(chunk, dim=1)
                # written straight into the gradient when the dtypes agree (no extra copy)
                out = grad[start:stop] if grad.dtype == softmax.dtype else softmax
                torch.mul(softmax, g_rows, out=out)
                # 1.0 where the hinge is active, as the forward's (M - x) - margin > 0
                active = (maximum[start:stop, None] - chunk).sub_(ctx.margin).gt_(0.0)
                count = active.sum(dim=1, keepdim=True)
                out.addcmul_(active, h_rows, value=-1.0)
                out.scatter_add_(1, target[start:stop, None], -g_rows)
                out.scatter_add_(1, argmax[start:stop, None], h_rows * count)
                if out is softmax:
                    grad[start:stop] = softmax
        return grad, None, None, None, None


#: Logits of at most this many elements (float32/float64, CPU) take :func:`_small_margin_loss`.
#: Forward + backward of ``MbLSLoss`` on one CPU thread, in one process, the two paths in turn
#: (8 rounds, each the best of three 500-call timings): composite over fused 0.68x at ``[100,
#: 10]`` and ``[32, 10]``, 0.77x at ``[256, 100]``, 1.15x at ``[1024, 100]``.
SMALL_ROWS_ELEMENTS = 1 << 15


def _small_margin_loss(
    rows: Tensor, target: Tensor, valid: Tensor, margin: float, alpha: float
) -> Tensor:
    """:class:`_FusedMarginLoss`'s rows from PyTorch's own operations and autograd.

    For small float32/float64 CPU logits, where a call costs its dispatch, not its passes: the
    same values bit for bit (``-log p_t`` is PyTorch's cross-entropy kernel, ``alpha * hinge``
    is added to it), the gradient up to the rounding of ``g * alpha / C`` (``relu``'s gradient
    flows where the hinge is ``> 0``, ``max``'s to the column ``max(dim=1)`` returns, as in the
    fused backward). See :data:`SMALL_ROWS_ELEMENTS` for what it saves.
    """
    cross_entropy = F.cross_entropy(rows, target, reduction="none")
    top = rows.max(dim=1, keepdim=True).values
    hinge = torch.relu((top - rows).sub(margin)).mean(dim=1)
    return torch.where(valid, hinge.mul(alpha).add(cross_entropy), 0.0)


def _takes_small_rows(rows: Tensor) -> bool:
    """Whether :func:`_small_margin_loss` computes the rows: small float32/float64 CPU logits."""
    return (
        rows.is_cpu
        and rows.dtype in (torch.float32, torch.float64)
        and rows.numel() <= SMALL_ROWS_ELEMENTS
        and not torch.is_autocast_enabled("cpu")
    )


def mbls_loss(
    logits: Tensor,
    target: Tensor,
    *,
    margin: float = 10.0,
    alpha: float = 0.1,
    ignore_index: int = -100,
    reduction: str = "mean",
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Margin-based label smoothing: cross-entropy plus a hinge on the logit distances.

    Per element, with ``M = max_j x_j`` the largest logit and ``C`` classes::

        loss = -log p_t + alpha * (1 / C) * sum_k max(0, M - x_k - margin)

    The penalty is zero while every logit lies within ``margin`` of the largest one; beyond,
    it pulls the distant logits up (and the largest down) linearly, a label smoothing that
    leaves distances up to ``margin`` free. ``alpha = 0`` is cross-entropy.

    The authors' criterion returns ``CE + alpha * mean`` of the hinge over the samples *and*
    the classes; the ``"mean"`` here, the mean over the non-ignored elements of the per-element
    loss above (``"none"``), is that value. ``[N, C, *]`` logits are treated as the rows
    ``[N * prod(*), C]``, as the authors' criterion flattens them. Ignored elements contribute
    neither term (the authors' code drops them only for ``ignore_index >= 0``; with its
    default ``-100`` their hinge would still count). The maximum's gradient goes to the column
    ``max(dim=1)`` returns, as in the authors' code.

    Source: Liu, Ben Ayed, Galdran and Dolz, "The devil is in the margins: margin-based label
    smoothing for network calibration" (CVPR 2022); defaults ``margin = 10``, ``alpha = 0.1``
    are those of the authors' ``LogitMarginL1``.

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1).
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        margin: the free distance to the largest logit, ``>= 0``.
        alpha: the weight of the hinge penalty, ``>= 0``.
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` (over the non-ignored elements)
            or ``"sum"``.
        validate_args: check target values and finite logits (device synchronisations; one
            with ``backend="triton"``).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the fused kernels of
            :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error) or ``"torch"``. The kernels
            (:mod:`lightning_losses.kernels.mbls`) fuse the hinge: its sum in the forward's
            one program per row, its gradient in the backward's one pass.

    Returns:
        The loss; float16 and bfloat16 logits are computed and returned in float32, as every
        loss of the package.

    Raises:
        ValueError: ``margin`` or ``alpha`` negative, NaN or infinite (``TypeError`` if one is
            not a real number); a bad ``reduction`` or ``target``.

    Example:
        >>> logits = torch.tensor([[12.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
        >>> # row 0: CE 1.1e-5 + 0.1 * (0 + 2 + 1) / 3 = 0.1000; row 1: log 3, no hinge
        >>> mbls_loss(logits, torch.tensor([0, 2]), reduction="none")
        tensor([0.1000, 1.0986])
        >>> mbls_loss(logits, torch.tensor([0, 2]))
        tensor(0.5993)
    """
    check_mbls(margin, alpha)
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
    if not kernels and _takes_small_rows(rows):
        loss = _small_margin_loss(rows, safe_target, valid, float(margin), float(alpha))
    else:
        fused: Any = _FusedMarginLoss
        if kernels:
            from lightning_losses.kernels.mbls import TritonMbLS

            fused = TritonMbLS
        loss = fused.apply(rows, safe_target, valid, float(margin), float(alpha))
    return reduce_loss(loss.reshape(target.shape), reduction, valid.sum())
