"""Soft truncation: the smooth counterpart of the hard-truncated cross-entropy.

After Su Jianlin, "From hard truncation of the loss, through softening, to focal loss".
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_losses.functional._core import compute_dtype, reduce_loss, target_log_prob
from lightning_losses.functional.checks import (
    check_choice,
    check_class_vector,
    check_index_target,
    check_range,
    check_reduction,
)
from lightning_losses.functional.target_probability import check_no_label_smoothing
from lightning_losses.kernels.availability import BACKENDS
from lightning_losses.loss_ranges import LOSS_RANGES


def check_soft_truncated(k: float) -> None:
    """``k`` of soft truncation (plain and binary), ``>= 0``."""
    check_range("k", k, **LOSS_RANGES["soft_truncated"]["k"])


def soft_truncated_loss(
    logits: Tensor,
    target: Tensor,
    *,
    k: float = 1.0,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Soft truncation ``-softmax(-k x)_t * log softmax(x)_t``.

    After Su Jianlin, "From hard truncation of the loss, through softening, to focal loss".

    The hard truncation's step ``[p_t <= margin]`` is replaced by the smooth factor
    ``softmax(-k x)_t``, which is near 1 when the target logit is the smallest and near 0 when it
    dominates; the loss is differentiated through both factors. Unlike the target-probability
    family it reads every logit twice (two softmaxes), so it costs about two cross-entropies.

    Source: Su Jianlin, "从loss的硬截断、软化到focal loss" (2017).

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1).
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        k: sharpness of the truncation, ``>= 0`` (``k = 0`` gives ``-log p_t / C``).
        weight: optional ``[C]`` class weights, finite and ``>= 0``; ``"mean"`` divides by
            the sum of the weights of the non-ignored elements (0 if that sum is 0).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        label_smoothing: only 0 is accepted (so that a config may keep the key); other
            values raise ``TypeError``: label smoothing belongs to cross-entropy and gamma
            cross-entropy.
        validate_args: check target values, finite logits and weights (device
            synchronisations).
        backend: ``"auto"`` or ``"torch"`` (PyTorch); ``"triton"`` raises a one-line
            ``ValueError``: the loss is not of the target-probability family (its factor
            ``softmax(-k x)_t`` needs a second log-sum-exp and its own gradient), so the
            family's kernels do not compute it. Accepted so that a config can switch losses
            and keep the key.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> soft_truncated_loss(logits, torch.tensor([0, 2]), k=1.0, reduction="none")
        tensor([0.0152, 0.3662])
    """
    check_no_label_smoothing("soft truncation", label_smoothing)
    check_soft_truncated(k)
    check_reduction(reduction)
    check_choice("backend", backend, BACKENDS)
    if backend == "triton":
        raise ValueError(
            "backend='triton' is not available for soft_truncated_loss (not of the "
            "target-probability family, no kernel); use backend='auto' or 'torch'"
        )
    check_index_target(logits, target, ignore_index=ignore_index, validate_args=validate_args)
    weight = check_class_vector("weight", weight, logits, validate_args=validate_args)
    valid = target != ignore_index
    x = logits.to(compute_dtype(logits.dtype))  # half logits: -k x must not overflow
    log_p = target_log_prob(x, target, ignore_index)
    truncation = torch.exp(target_log_prob(x * (-float(k)), target, ignore_index))
    loss = -truncation * log_p
    if weight is None:
        element_weight = valid.to(loss.dtype)
    else:
        element_weight = weight.to(loss.dtype)[torch.where(valid, target, 0)] * valid
    return reduce_loss(loss * element_weight, reduction, element_weight.sum())
