"""The shared core of the target-probability family and the reductions.

A member of the family is ``phi(log p_t)`` for a scalar function ``phi``. Its gradient with
respect to the logits is ``phi'(log p_t) * (softmax(x) - onehot(t))``, which is exactly the
gradient of cross-entropy scaled row by row. So the core computes ``log p_t`` with PyTorch's own
cross-entropy kernel (``reduction="none"``: one logsumexp per row, and the usual fused backward)
and applies ``phi`` to the resulting vector of N numbers in a small autograd function whose
backward multiplies by ``phi'``. Nothing after ``log p_t`` touches a second ``[N, C]`` tensor.

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


def target_log_prob(logits: Tensor, target: Tensor, ignore_index: int) -> Tensor:
    """``log softmax(logits)[t]`` per element, ``[N, *]``, in float32 at least; 0 where ignored."""
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
        weight: optional per-class factor ``[C]``. ``"mean"`` then divides by the sum of the
            weights of the non-ignored elements, as :func:`torch.nn.functional.cross_entropy`.
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.
        validate_args: check target values (costs a device synchronisation).
        **hyperparameters: passed to ``phi``.
    """
    check_reduction(reduction)
    check_index_target(logits, target, ignore_index=ignore_index, validate_args=validate_args)
    weight = check_class_vector("weight", weight, logits)
    valid = target != ignore_index
    log_p = target_log_prob(logits, target, ignore_index)
    loss = apply_phi(log_p, phi, **hyperparameters)
    if weight is None:
        loss = torch.where(valid, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
        return reduce_loss(loss, reduction, valid.sum())
    element_weight = weight.to(loss.dtype)[torch.where(valid, target, 0)] * valid
    return reduce_loss(loss * element_weight, reduction, element_weight.sum())
