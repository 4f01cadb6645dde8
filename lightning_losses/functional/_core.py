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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ._validation import check_class_vector, check_index_target, check_reduction

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


def row_chunks(rows: int, columns: int) -> list[tuple[int, int]]:
    """``(start, stop)`` row ranges of about ``CHUNK_ELEMENTS`` elements each."""
    step = max(1, CHUNK_ELEMENTS // max(columns, 1))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


class _FusedTargetProbability(torch.autograd.Function):
    """``phi(log p_t)`` per row of 2-D logits, a chunk of rows at a time.

    Forward takes each chunk's log-softmax, keeps only the target's entry and drops the rest;
    it saves ``phi'(log p_t)``, N numbers. Backward recomputes each chunk's softmax and writes
    ``g_i * (onehot(t_i) - softmax(x_i))`` into the gradient, ``g_i = grad_i * phi'(log p_i)``.
    Unlike ``F.cross_entropy`` it never keeps an ``[N, C]`` log-softmax (nor a zero-filled
    ``[N, C]`` gradient of it), so the extra memory is the logits' gradient plus one chunk.
    Half-precision chunks are computed in float32 (a chunk at a time, not a full upcast).
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        target: Tensor,
        valid: Tensor,
        phi: Phi,
        hyperparameters: dict[str, Any],
    ) -> Tensor:
        dtype = compute_dtype(logits.dtype)
        rows, columns = logits.shape
        target_log_p = torch.empty(rows, dtype=dtype, device=logits.device)
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in row_chunks(rows, columns):
                log_softmax = torch.log_softmax(logits[start:stop].to(dtype), dim=1)
                target_log_p[start:stop] = log_softmax.gather(1, target[start:stop, None])[:, 0]
            zero = torch.zeros((), dtype=dtype, device=logits.device)
            log_p = torch.where(valid, target_log_p, zero)
            value, derivative = phi(log_p, **hyperparameters)
        derivative = torch.where(valid, derivative, zero)
        ctx.save_for_backward(logits, target, derivative)
        return torch.where(valid, value, zero)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        logits, target, derivative = ctx.saved_tensors
        # d log p_t / dx = onehot - softmax; the softmax is recomputed chunk by chunk.
        scale = (grad_output * derivative)[:, None]
        grad = torch.empty_like(logits)
        rows, columns = logits.shape
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in row_chunks(rows, columns):
                softmax = torch.softmax(logits[start:stop].to(scale.dtype), dim=1)
                softmax.mul_(-scale[start:stop])
                softmax.scatter_add_(1, target[start:stop, None], scale[start:stop])
                grad[start:stop] = softmax
        return grad, None, None, None, None


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


def target_probability_loss(
    logits: Tensor,
    target: Tensor,
    phi: Phi,
    *,
    weight: Tensor | None = None,
    weight_name: str = "weight",
    ignore_index: int = -100,
    reduction: str = "mean",
    validate_args: bool = True,
    **hyperparameters: Any,
) -> Tensor:
    """``weight_t * phi(log p_t)`` per element, reduced; the engine of the family.

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
        validate_args: check target values, that the logits are finite and that the weights
            are finite and ``>= 0`` (costs a device synchronisation).
        **hyperparameters: passed to ``phi``.
    """
    check_reduction(reduction)
    check_index_target(logits, target, ignore_index=ignore_index, validate_args=validate_args)
    weight = check_class_vector(weight_name, weight, logits, validate_args=validate_args)
    valid = target != ignore_index
    if logits.dim() == 2:
        safe_target = torch.where(valid, target, 0)
        loss = _FusedTargetProbability.apply(logits, safe_target, valid, phi, hyperparameters)
    else:  # [N, C, *]: PyTorch's cross-entropy kernel gives log p_t, phi is applied after
        log_p = target_log_prob(logits, target, ignore_index)
        loss = apply_phi(log_p, phi, **hyperparameters)
        loss = torch.where(valid, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    if weight is None:
        return reduce_loss(loss, reduction, valid.sum())
    element_weight = weight.to(loss.dtype)[torch.where(valid, target, 0)] * valid
    return reduce_loss(loss * element_weight, reduction, element_weight.sum())
