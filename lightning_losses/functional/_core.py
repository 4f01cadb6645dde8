"""The shared core of the target-probability family and the reductions.

A member of the family is ``phi(log p_t)`` for a scalar function ``phi``. Its gradient with
respect to the logits is ``phi'(log p_t) * (onehot(t) - softmax(x))`` (``phi'`` taken in
``log p``), exactly the gradient of cross-entropy scaled row by row. For ``[N, C]`` logits one
autograd function does it all a chunk of rows at a time (log-softmax in the forward, softmax
recomputed in the backward), so the loss costs what cross-entropy costs in time and less in
memory. For ``[N, C, *]`` logits ``log p_t`` comes from PyTorch's cross-entropy kernel
(``reduction="none"``) and ``phi`` is applied to that vector in a small autograd function whose
backward multiplies by ``phi'``. Either way nothing after ``log p_t`` touches a second
``[N, C]`` tensor.

Each ``phi`` returns its value and its derivative together, written in log space so that neither
has a ``0 * inf`` (see :mod:`lightning_losses.functional.target_probability`).

Label smoothing (``eps``) adds ``eps / C * sum_c w_c (-log p_c)`` to ``(1 - eps)`` times the
weighted loss. In the fused path that sum is taken from each chunk's log-softmax (on a CPU in
blocks small enough to stay in cache) and its gradient ``W softmax - w`` joins the backward's
one pass over the chunk, so smoothing keeps no ``[N, C]`` tensor either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_losses.functional.checks import (
    check_class_vector,
    check_index_target,
    check_reduction,
)

#: ``phi(log_p, **hyperparameters) -> (value, derivative)``, both of the shape of ``log_p``.
Phi = Callable[..., tuple[Tensor, Tensor]]


class _ApplyPhi(torch.autograd.Function):
    """``phi`` on a vector, with the derivative ``phi`` itself supplies."""

    @staticmethod
    def forward(ctx: Any, log_p: Tensor, phi: Phi, hyperparameters: dict[str, Any]) -> Tensor:
        value, derivative = phi(log_p, **hyperparameters)
        ctx.save_for_backward(derivative)
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, None, None]:
        (derivative,) = ctx.saved_tensors
        return grad_output * derivative, None, None


def apply_phi(log_p: Tensor, phi: Phi, **hyperparameters: Any) -> Tensor:
    """Return ``phi(log_p)`` whose backward multiplies by ``phi'(log_p)``."""
    if log_p.requires_grad:
        return _ApplyPhi.apply(log_p, phi, hyperparameters)
    return phi(log_p, **hyperparameters)[0]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are computed and returned in float32; others keep their dtype."""
    return torch.promote_types(dtype, torch.float32)


#: Elements of one chunk of logits in the fused path (32 MiB of float32): large enough that the
#: loop and the thread pool cost nothing per chunk, small next to the [N, C] tensors it spares.
CHUNK_ELEMENTS = 1 << 23


#: Elements of one chunk of the smoothed forward on a CPU (2 MiB of float32): the row sums of
#: the smoothing term then read a log-softmax still in cache, which makes them nearly free
#: (measured on one core: 3 ms more per 8192 x 1000 logits with 32 MiB chunks, none with 2 MiB).
CPU_SMOOTHING_ELEMENTS = 1 << 19


def row_chunks(rows: int, columns: int, elements: int | None = None) -> list[tuple[int, int]]:
    """``(start, stop)`` row ranges of about ``elements`` (``CHUNK_ELEMENTS``) elements each."""
    step = max(1, (CHUNK_ELEMENTS if elements is None else elements) // max(columns, 1))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


class _FusedTargetProbability(torch.autograd.Function):
    """``phi(log p_t)`` per row of 2-D logits, a chunk of rows at a time.

    Forward takes each chunk's log-softmax, keeps only the target's entry and drops the rest;
    it saves ``phi'(log p_t)``, N numbers. Backward recomputes each chunk's softmax and writes
    ``g_i * (onehot(t_i) - softmax(x_i))`` into the gradient, ``g_i = grad_i * phi'(log p_i)``.
    Unlike ``F.cross_entropy`` it never keeps an ``[N, C]`` log-softmax (nor a zero-filled
    ``[N, C]`` gradient of it), so the extra memory is the logits' gradient plus one chunk.
    Half-precision chunks are computed in float32 (a chunk at a time, not a full upcast).

    With ``smoothing`` it also returns the label-smoothing term ``s_i = sum_c w_c (-log p_ic)``
    (``w`` the class weights ``smooth_weight``, all 1 when ``None``; 0 where ignored), summed
    from the same chunk's log-softmax. Its gradient ``W softmax(x_i) - w`` (``W = sum_c w_c``)
    is added in the same pass of the backward: ``softmax * (h_i W - g_i) - h_i w`` plus ``g_i``
    at the target, ``h_i`` the upstream gradient of ``s_i``. Nothing of size ``[N, C]`` is
    kept for it either (the ignore mask and ``w`` are).
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        target: Tensor,
        valid: Tensor,
        phi: Phi,
        hyperparameters: dict[str, Any],
        smoothing: bool = False,
        smooth_weight: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        dtype = compute_dtype(logits.dtype)
        rows, columns = logits.shape
        target_log_p = torch.empty(rows, dtype=dtype, device=logits.device)
        smooth = torch.empty(rows, dtype=dtype, device=logits.device) if smoothing else None
        if smooth_weight is not None:
            smooth_weight = smooth_weight.to(dtype)
        row_weight = None
        if smoothing:  # a matrix-vector product sums rows in half the time of sum(dim=1) (CPU)
            row_weight = smooth_weight
            if row_weight is None:
                row_weight = torch.ones(columns, dtype=dtype, device=logits.device)
        elements = CHUNK_ELEMENTS
        if smoothing and logits.device.type == "cpu":
            elements = min(elements, CPU_SMOOTHING_ELEMENTS)
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in row_chunks(rows, columns, elements):
                log_softmax = torch.log_softmax(logits[start:stop].to(dtype), dim=1)
                target_log_p[start:stop] = log_softmax.gather(1, target[start:stop, None])[:, 0]
                if smooth is not None and row_weight is not None:
                    torch.mv(log_softmax, row_weight, out=smooth[start:stop])
            zero = torch.zeros((), dtype=dtype, device=logits.device)
            log_p = torch.where(valid, target_log_p, zero)
            value, derivative = phi(log_p, **hyperparameters)
        derivative = torch.where(valid, derivative, zero)
        value = torch.where(valid, value, zero)
        ctx.smoothing = smoothing
        if smooth is None:  # not smoothing
            ctx.save_for_backward(logits, target, derivative)
            return value
        ctx.save_for_backward(logits, target, derivative, valid, smooth_weight)
        return value, torch.where(valid, smooth.neg_(), zero)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grad_outputs: Tensor) -> tuple[Tensor | None, ...]:
        logits, target, derivative, *smoothing = ctx.saved_tensors
        # d log p_t / dx = onehot - softmax; the softmax is recomputed chunk by chunk.
        scale = (grad_outputs[0] * derivative)[:, None]
        if ctx.smoothing:  # d s / dx = W softmax - w: one factor per row on the softmax
            valid, smooth_weight = smoothing
            h = torch.where(valid, grad_outputs[1], 0).to(scale.dtype)[:, None]
            total = logits.shape[1] if smooth_weight is None else smooth_weight.sum()
            factor = h * total - scale
        else:
            factor = -scale
        grad = torch.empty_like(logits)
        rows, columns = logits.shape
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in row_chunks(rows, columns):
                softmax = torch.softmax(logits[start:stop].to(scale.dtype), dim=1)
                # written straight into the gradient when the dtypes agree (no extra copy)
                out = grad[start:stop] if grad.dtype == softmax.dtype else softmax
                if not ctx.smoothing:
                    torch.mul(softmax, factor[start:stop], out=out)
                elif smooth_weight is None:
                    torch.addcmul(-h[start:stop], softmax, factor[start:stop], out=out)
                else:
                    torch.mul(softmax, factor[start:stop], out=out)
                    out.addr_(h[start:stop, 0], smooth_weight, alpha=-1)
                out.scatter_add_(1, target[start:stop, None], scale[start:stop])
                if out is softmax:
                    grad[start:stop] = softmax
        return grad, None, None, None, None, None, None


def target_log_prob(logits: Tensor, target: Tensor, ignore_index: int) -> Tensor:
    """``log softmax(logits)[t]`` per element, ``[N, *]``, in float32 at least; 0 where ignored.

    ``target`` may hold any integer dtype (PyTorch's kernel wants int64: it gets a copy).
    """
    target = target.long()
    log_p = -F.cross_entropy(logits, target, reduction="none", ignore_index=ignore_index)
    return log_p.to(compute_dtype(logits.dtype))


def reduce_loss(loss: Tensor, reduction: str, denominator: Tensor | None = None) -> Tensor:
    """Reduce per-element losses that are already zero where ignored.

    ``"mean"`` divides by ``denominator`` (the number of non-ignored elements, or the sum of their
    class weights); a batch with nothing to average gives 0 and a zero gradient, not NaN.
    """
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    if denominator is None:
        return total / max(loss.numel(), 1)
    denominator = denominator.to(total.dtype)
    return total / torch.where(denominator > 0, denominator, torch.ones_like(denominator))


def _smoothing_term(logits: Tensor, weight: Tensor | None) -> tuple[Tensor, Tensor]:
    """``log p`` of ``[N, C, *]`` logits (float32 at least) and ``sum_c w_c (-log p_c)``."""
    log_p = torch.log_softmax(logits.to(compute_dtype(logits.dtype)), dim=1)
    if weight is None:
        return log_p, -log_p.sum(dim=1)
    weight = weight.to(log_p.dtype).view(-1, *[1] * (logits.dim() - 2))
    return log_p, -(log_p * weight).sum(dim=1)


def target_probability_loss(
    logits: Tensor,
    target: Tensor,
    phi: Phi,
    *,
    weight: Tensor | Sequence[float] | None = None,
    weight_name: str = "weight",
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    validate_args: bool = True,
    **hyperparameters: Any,
) -> Tensor:
    """``weight_t * phi(log p_t)`` per element, reduced; the engine of the family.

    With ``label_smoothing = eps > 0`` the per-element loss is

        (1 - eps) * w_t * phi(log p_t) + eps / C * sum_c w_c * (-log p_c)

    (``w`` the class weights, all 1 without ``weight``): for ``phi = -log p`` the cross-entropy
    against ``(1 - eps) onehot(t) + eps / C``, as in :func:`torch.nn.functional.cross_entropy`.
    ``"mean"`` still divides by the sum of ``w_t`` over the non-ignored elements. For ``[N, C]``
    logits the smoothing term comes from the fused chunks (no ``[N, C]`` tensor kept for
    backward); for ``[N, C, *]`` from one log-softmax of the logits, kept by autograd.

    Args:
        logits: ``[N, C, *]`` unnormalised scores.
        target: ``[N, *]`` class indices, or ``ignore_index``.
        phi: ``phi(log_p, **hyperparameters) -> (value, derivative)``.
        weight: optional per-class factor ``[C]``, finite and ``>= 0``. ``"mean"`` then divides
            by the sum of the weights of the non-ignored elements, as
            :func:`torch.nn.functional.cross_entropy` (0 when that sum is 0).
        weight_name: the caller's name of ``weight``, for error messages (focal: ``alpha``).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.
        label_smoothing: ``eps`` in ``[0, 1)``, checked by the caller; 0 leaves the loss as it
            is (same path, same numbers).
        validate_args: check target values, that the logits are finite and that the weights
            are finite and ``>= 0`` (costs a device synchronisation).
        **hyperparameters: passed to ``phi``.
    """
    check_reduction(reduction)
    check_index_target(logits, target, ignore_index=ignore_index, validate_args=validate_args)
    weight = check_class_vector(weight_name, weight, logits, validate_args=validate_args)
    eps = float(label_smoothing)
    valid = target != ignore_index
    smooth = None
    if logits.dim() == 2:
        safe_target = torch.where(valid, target, 0)
        if eps == 0:
            loss = _FusedTargetProbability.apply(logits, safe_target, valid, phi, hyperparameters)
        else:
            loss, smooth = _FusedTargetProbability.apply(
                logits, safe_target, valid, phi, hyperparameters, True, weight
            )
    elif eps == 0:  # [N, C, *]: PyTorch's cross-entropy kernel gives log p_t, phi after
        log_p = target_log_prob(logits, target, ignore_index)
        loss = apply_phi(log_p, phi, **hyperparameters)
        loss = torch.where(valid, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    else:  # [N, C, *] smoothed: one log-softmax gives both terms
        all_log_p, smooth = _smoothing_term(logits, weight)
        zero = torch.zeros((), dtype=all_log_p.dtype, device=all_log_p.device)
        safe_target = torch.where(valid, target, 0).long()
        log_p = torch.where(valid, all_log_p.gather(1, safe_target.unsqueeze(1)).squeeze(1), zero)
        loss = torch.where(valid, apply_phi(log_p, phi, **hyperparameters), zero)
        smooth = torch.where(valid, smooth, zero)
    if weight is None:
        denominator = valid.sum()
    else:
        element_weight = weight.to(loss.dtype)[torch.where(valid, target, 0)] * valid
        loss = loss * element_weight
        denominator = element_weight.sum()
    if smooth is not None:
        loss = (1.0 - eps) * loss + (eps / logits.shape[1]) * smooth
    return reduce_loss(loss, reduction, denominator)
