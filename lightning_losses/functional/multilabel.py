"""Softmax-style cross-entropy for multi-label and n-by-m classification.

After Su Jianlin, "An unsuccessful attempt: extending multi-label cross-entropy to n m-class tasks".

Every ``log(1 + sum exp(a))`` here is a ``logsumexp`` over the terms plus one zero column, with
absent terms at ``-inf`` (never a large constant, which overflows float16). Decisions of the
multi-label loss are ``x > 0``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_losses.functional._core import compute_dtype, reduce_loss
from lightning_losses.functional.checks import (
    check_choice,
    check_class_indices,
    check_finite,
    check_ignore_index,
    check_logits,
    check_reduction,
    check_same_device,
    check_soft_target,
    check_sums_to_one,
)

NM_VARIANTS = ("pairwise", "centered")


def check_nm(variant: str) -> None:
    """``variant`` of the n-by-m loss: ``"pairwise"`` or ``"centered"``."""
    check_choice("variant", variant, NM_VARIANTS)


def _log1p_sum_exp(terms: Tensor, dim: int) -> Tensor:
    """``log(1 + sum(exp(terms), dim))``, exact for ``-inf`` terms and large ones alike."""
    zero = torch.zeros_like(terms.narrow(dim, 0, 1))
    return torch.logsumexp(torch.cat([terms, zero], dim=dim), dim=dim)


def multilabel_categorical_crossentropy(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    validate_args: bool = True,
) -> Tensor:
    """Multi-label categorical cross-entropy: softmax + cross-entropy generalised to many labels.

    ``loss = log(1 + sum_i y_i e^{-x_i}) + log(1 + sum_i (1 - y_i) e^{x_i})`` per row: every
    positive label's score is pushed above 0 and every negative label's below 0, with the
    balance of a softmax instead of K independent sigmoids. With hard labels it is Su Jianlin's
    "multi-label softmax + cross-entropy"; soft ``y`` in ``[0, 1]`` weights the terms.
    Entries equal to ``ignore_index`` are left out of both sums. Predict label ``i`` where
    ``x_i > 0``.

    Source: Su Jianlin, "将'softmax+交叉熵'推广到多标签分类问题" (2020).

    Args:
        logits: ``[N, K, *]`` scores (labels along dimension 1).
        target: float labels in ``[0, 1]`` (or ``ignore_index``) of the same shape.
        ignore_index: label value left out of the loss; a row with every label ignored is an
            error.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        validate_args: check label values, rows that are all ignored and finite logits.

    Example:
        >>> logits = torch.tensor([[3.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
        >>> target = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
        >>> multilabel_categorical_crossentropy(logits, target, reduction="none")
        tensor([0.6315, 1.3863])
    """
    check_reduction(reduction)
    check_ignore_index(ignore_index)
    check_logits(logits)
    check_soft_target(logits, target, validate_args=validate_args, ignore_index=ignore_index)
    dtype = compute_dtype(logits.dtype)
    x, y = logits.to(dtype), target.to(dtype)
    keep = y != ignore_index
    if validate_args and bool((~keep.any(dim=1)).any()):
        raise ValueError(
            f"target has a row whose labels all equal ignore_index={ignore_index}; each row "
            "needs at least one label that is not ignored"
        )
    y = torch.where(keep, y, 0.0)
    not_y = torch.where(keep, 1.0 - y, 0.0)
    positive = _log1p_sum_exp(torch.log(y) - x, dim=1)
    negative = _log1p_sum_exp(torch.log(not_y) + x, dim=1)
    return reduce_loss(positive + negative, reduction)


def nm_categorical_crossentropy(
    logits: Tensor,
    target: Tensor,
    *,
    variant: str = "pairwise",
    reduction: str = "mean",
    validate_args: bool = True,
) -> Tensor:
    """Cross-entropy for ``n`` classification tasks of ``m`` classes each, one softmax-like sum.

    ``s, t`` have shape ``[N, n, m]`` (``t`` may also be ``[N, n]`` class indices). Per sample:

    - ``"pairwise"``: ``sum_j log(1 + sum_i sum_{k != j} t_ij e^{s_ik - s_ij})``, which with hard
      labels pushes each task's target score above its other scores;
    - ``"centered"``: ``sum_j log(1 + sum_i t_ij e^{-s_ij + mean_k s_ik})``, whose optimum for soft
      labels is ``t = softmax(s)`` (zero gradient at ``s = log t``), but which with hard labels
      need not rank the target first.

    Both reduce to :func:`multilabel_categorical_crossentropy` when ``m = 2`` (the centered one
    with the logits halved).

    Source: Su Jianlin, "多标签“Softmax+交叉熵”的软标签版本" and "n个m分类" posts.

    Args:
        logits: ``[N, n, m]`` scores, ``m >= 2``.
        target: ``[N, n, m]`` soft labels in ``[0, 1]``, each task's ``m`` labels summing to 1
            (within :func:`~lightning_losses.functional.checks.sum_tolerance`: 1e-3 for
            float32), or ``[N, n]`` class indices in ``[0, m)``.
        variant: ``"pairwise"`` or ``"centered"``.
        reduction: ``"none"`` (shape ``[N]``), ``"mean"`` or ``"sum"``.
        validate_args: check label values, that soft labels sum to 1 per task and that the
            logits are finite.

    Example:
        >>> s = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
        >>> nm_categorical_crossentropy(s, torch.tensor([[0, 1]]), reduction="none")
        tensor([0.7910])
    """
    check_reduction(reduction)
    check_nm(variant)
    check_logits(logits, min_dim=3)
    if logits.dim() != 3 or logits.shape[2] < 2:
        raise ValueError(f"logits must have shape [N, n, m] with m >= 2; got {list(logits.shape)}")
    m = logits.shape[2]
    if isinstance(target, Tensor) and not target.is_floating_point():
        if tuple(target.shape) != tuple(logits.shape[:2]):
            raise ValueError(
                f"integer target must have shape {list(logits.shape[:2])} (one class index per "
                f"task); got {list(target.shape)}"
            )
        check_same_device("target", target, "logits", logits)
        if validate_args:
            check_class_indices("target", target, m)
            check_finite("logits", logits)
        target = torch.nn.functional.one_hot(target.long(), m).to(compute_dtype(logits.dtype))
    else:
        check_soft_target(logits, target, validate_args=validate_args)
        if validate_args:
            sums = target.sum(dim=2, dtype=compute_dtype(target.dtype))
            check_sums_to_one("target", sums, target.dtype, over="the m classes of each task")
    dtype = compute_dtype(logits.dtype)
    s, log_t = logits.to(dtype), torch.log(target.to(dtype))
    if variant == "pairwise":
        # others[b, i, j] = log sum_{k != j} exp(s_ik - s_ij)
        diff = s[:, :, None, :] - s[:, :, :, None]
        diagonal = torch.eye(m, dtype=torch.bool, device=s.device)
        others = torch.logsumexp(diff.masked_fill(diagonal, -torch.inf), dim=3)
        terms = log_t + others
    else:
        terms = log_t - s + s.mean(dim=2, keepdim=True)
    return reduce_loss(_log1p_sum_exp(terms, dim=1).sum(dim=1), reduction)
