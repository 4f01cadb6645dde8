"""Split conformal thresholds: the finite-sample quantile, marginal and class-conditional.

Given ``n`` calibration scores exchangeable with a test sample's, the threshold ``q`` is the
``k``-th smallest score with ``k = ceil((n + 1)(1 - alpha))`` (the empirical
``ceil((n + 1)(1 - alpha)) / n`` quantile, Vovk et al. 2005; Angelopoulos and Bates 2021).
Then ``P(s_test <= q) >= 1 - alpha``, and ``<= 1 - alpha + 1 / (n + 1)`` when the scores have
no ties. When ``k > n`` (``n < 1 / alpha - 1``) no finite threshold gives the guarantee: the
marginal threshold raises, naming ``n`` and ``alpha``; a class-conditional (Mondrian) threshold
of such a class is ``+inf`` (every label of that class is kept), with a warning.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from lightning_losses.functional.checks import check_class_indices, check_int, check_levels
from lightning_losses.warning import LightningLossesWarning

__all__ = [
    "class_conditional_thresholds",
    "conformal_rank",
    "conformal_threshold",
    "smallest_n",
]


def conformal_rank(n: int, alpha: float) -> int:
    """``k = ceil((n + 1)(1 - alpha))``, the rank of the threshold among ``n`` sorted scores.

    A relative ``1e-12`` is taken off the product before the ceiling, so that float error in
    ``(n + 1)(1 - alpha)`` (``10 * 0.7 = 7.000000000000001``) does not raise ``k`` by one.

    Example:
        >>> conformal_rank(9, 0.1), conformal_rank(9, 0.3), conformal_rank(100, 0.1)
        (9, 7, 91)
    """
    product = (n + 1) * (1.0 - alpha)
    return max(math.ceil(product - 1e-12 * max(1.0, product)), 0)


def smallest_n(alpha: float) -> int:
    """The fewest calibration scores with a finite threshold at ``alpha`` (``k <= n``).

    Example:
        >>> smallest_n(0.1), smallest_n(0.05), smallest_n(0.3)
        (9, 19, 3)
    """
    n = max(math.floor(1.0 / alpha - 1.0) - 1, 0)
    while conformal_rank(n, alpha) > n:
        n += 1
    return n


def conformal_threshold(scores: Tensor, alpha: float | Sequence[float] | Tensor) -> Tensor:
    """The split conformal threshold: the ``ceil((n + 1)(1 - alpha))``-th smallest score.

    ``q = s_(k)``, ``k = ceil((n + 1)(1 - alpha))``, over the last dimension of ``scores``
    (``n`` = its length), so ``[T, n]`` scores give ``T`` thresholds at once. Source: Vovk et
    al., "Algorithmic Learning in a Random World" (2005); the same order statistic as TorchCP's
    ``calculate_conformal_value`` and MAPIE's ``np.quantile(..., method="lower")``.

    Args:
        scores: ``[n]`` or ``[..., n]`` non-conformity scores of the calibration samples.
        alpha: a miscoverage level in ``(0, 1)``, or several.

    Returns:
        ``scores.shape[:-1]`` thresholds for one ``alpha``; ``[..., A]`` for ``A`` levels.

    Raises:
        ValueError: ``n < 1 / alpha - 1`` (no finite threshold has the guarantee), naming
            ``n``, ``alpha`` and the smallest ``n`` that works; an ``alpha`` outside ``(0, 1)``.

    Example:
        >>> conformal_threshold(torch.arange(1.0, 11.0), 0.2)  # k = ceil(11 * 0.8) = 9
        tensor(9.)
        >>> conformal_threshold(torch.arange(1.0, 11.0), [0.1, 0.5])
        tensor([10.,  6.])
        >>> conformal_threshold(torch.arange(1.0, 6.0), 0.1)
        Traceback (most recent call last):
        ...
        ValueError: conformal_threshold: n=5 calibration scores are too few for alpha=0.1: \
the ceil((n + 1)(1 - alpha)) = 6-th smallest does not exist; use n >= 9 or alpha >= 0.1667
    """
    if not isinstance(scores, Tensor) or scores.dim() < 1 or scores.is_complex():
        raise TypeError(f"scores must be a real tensor [..., n]; got {type(scores).__name__}")
    alphas, single = check_levels(alpha)
    n = scores.shape[-1]
    ranks = []
    for a in alphas:
        k = conformal_rank(n, a)
        if k > n:
            raise ValueError(
                f"conformal_threshold: n={n} calibration scores are too few for alpha={a}: "
                f"the ceil((n + 1)(1 - alpha)) = {k}-th smallest does not exist; use "
                f"n >= {smallest_n(a)} or alpha >= {1.0 / (n + 1):.4g}"
            )
        ranks.append(max(k, 1) - 1)
    ordered = scores.sort(dim=-1).values
    index = torch.tensor(ranks, device=scores.device)
    q = ordered.index_select(-1, index)
    return q[..., 0] if single else q


def class_conditional_thresholds(
    scores: Tensor,
    target: Tensor,
    alpha: float | Sequence[float] | Tensor,
    *,
    num_classes: int,
) -> Tensor:
    """Mondrian (class-conditional) thresholds: :func:`conformal_threshold` within each class.

    ``q_c = s^c_(k_c)``, ``k_c = ceil((n_c + 1)(1 - alpha))`` over the ``n_c`` calibration
    scores of class ``c``; the set ``{y : s(x, y) <= q_y}`` then covers a test sample of class
    ``c`` with probability ``>= 1 - alpha`` for every ``c`` (Vovk 2012; Löfström et al. 2015).
    A class with ``n_c < 1 / alpha - 1`` (none included) gets ``+inf`` and a
    :class:`~lightning_losses.warning.LightningLossesWarning` naming it.

    Args:
        scores: ``[n]`` scores of the calibration samples.
        target: ``[n]`` their classes.
        alpha: a miscoverage level in ``(0, 1)``, or several.
        num_classes: the number of classes ``C``.

    Returns:
        ``[C]`` thresholds, or ``[A, C]`` for ``A`` levels.

    Example:
        >>> s = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
        >>> class_conditional_thresholds(s, torch.tensor([0, 0, 0, 1, 1, 1]), 0.25, num_classes=2)
        tensor([0.3000, 0.6000])
    """
    check_int("num_classes", num_classes, low=1)
    if not isinstance(scores, Tensor) or scores.dim() != 1:
        raise ValueError("scores must be a [n] tensor for class-conditional thresholds")
    if not isinstance(target, Tensor) or tuple(target.shape) != tuple(scores.shape):
        raise ValueError(f"target must have the shape of scores {list(scores.shape)}")
    check_class_indices("target", target, num_classes)
    alphas, single = check_levels(alpha)
    target = target.long()
    order = scores.argsort(stable=True)
    order = order[target[order].argsort(stable=True)]  # by class, then by score
    ordered = scores[order]
    counts = torch.bincount(target, minlength=num_classes).tolist()
    starts = [0]
    for c in counts[:-1]:
        starts.append(starts[-1] + c)
    rows = []
    for a in alphas:
        q = torch.full((num_classes,), math.inf, dtype=scores.dtype, device=scores.device)
        index, classes, short = [], [], []
        for c, (n_c, start) in enumerate(zip(counts, starts, strict=True)):
            k = conformal_rank(n_c, a)
            if k > n_c:
                short.append(c)
            else:
                index.append(start + max(k, 1) - 1)
                classes.append(c)
        if index:
            q[torch.tensor(classes, device=q.device)] = ordered[
                torch.tensor(index, device=q.device)
            ]
        if short:
            warnings.warn(
                f"class_conditional_thresholds: classes {short} have fewer than "
                f"{smallest_n(a)} calibration scores, too few for alpha={a}; their "
                "threshold is +inf (every label of theirs is in every set)",
                LightningLossesWarning,
                stacklevel=2,
            )
        rows.append(q)
    return rows[0] if single else torch.stack(rows)
