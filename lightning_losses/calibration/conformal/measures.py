"""How good are the sets: coverage, size, empty and singleton rates, SSCV, coverage gap.

Every measure is a function of a few sums over the test samples, kept by
:func:`set_statistics`: per class, the number of samples and how many sets hold their label;
per set size ``0..C``, the number of sets and how many hold the label. Sums add across batches
and processes, so the :class:`~.metrics.PredictionSetMetrics` built on them is exact under DDP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from lightning_losses.calibration.conformal._inputs import rows_and_target

__all__ = [
    "DEFAULT_STRATA",
    "SetStatistics",
    "class_coverage_gap",
    "coverage",
    "empty_rate",
    "mean_set_size",
    "set_statistics",
    "singleton_rate",
    "size_stratified_coverage_violation",
]

#: Angelopoulos et al.'s set-size strata for SSCV (TorchCP's default).
DEFAULT_STRATA: tuple[tuple[int, int], ...] = ((0, 1), (2, 3), (4, 10), (11, 100), (101, 1000))


class SetStatistics(NamedTuple):
    """The sums behind every measure (float64).

    Attributes:
        class_count: ``[C]`` test samples per class.
        class_covered: ``[C]`` of them whose set holds their label.
        size_count: ``[C + 1]`` sets per size ``0..C``.
        size_covered: ``[C + 1]`` of them that hold the label.
    """

    class_count: Tensor
    class_covered: Tensor
    size_count: Tensor
    size_covered: Tensor


def set_statistics(
    sets: Tensor, target: Tensor, *, ignore_index: int | None = None
) -> SetStatistics:
    """The sums of :class:`SetStatistics` for sets ``[N, C, *]`` and targets ``[N, *]``.

    Example:
        >>> sets = torch.tensor([[True, False], [True, True], [False, False]])
        >>> set_statistics(sets, torch.tensor([0, 1, 1])).size_count
        tensor([1., 1., 1.], dtype=torch.float64)
    """
    if not isinstance(sets, Tensor) or sets.dtype != torch.bool or sets.dim() < 2:
        raise TypeError("sets must be a boolean tensor [N, C] or [N, C, *] (class dimension 1)")
    rows, labels = rows_and_target(sets, target, ignore_index=ignore_index, name="sets")
    c = sets.shape[1]
    covered = rows.gather(1, labels[:, None])[:, 0].double()
    size = rows.sum(1)
    return SetStatistics(
        class_count=torch.bincount(labels, minlength=c).double(),
        class_covered=torch.bincount(labels, weights=covered, minlength=c).double(),
        size_count=torch.bincount(size, minlength=c + 1).double(),
        size_covered=torch.bincount(size, weights=covered, minlength=c + 1).double(),
    )


def _stats(
    sets: Tensor | SetStatistics, target: Tensor | None, ignore_index: int | None
) -> SetStatistics:
    if isinstance(sets, SetStatistics):
        return sets
    if target is None:
        raise ValueError("target is needed with sets (only SetStatistics come without one)")
    return set_statistics(sets, target, ignore_index=ignore_index)


def coverage(
    sets: Tensor | SetStatistics, target: Tensor | None = None, *, ignore_index: int | None = None
) -> Tensor:
    """The fraction of sets that hold the true label, ``mean_i 1[y_i in S_i]``.

    Example:
        >>> coverage(torch.tensor([[True, False], [False, True]]), torch.tensor([0, 0]))
        tensor(0.5000, dtype=torch.float64)
    """
    s = _stats(sets, target, ignore_index)
    return s.class_covered.sum() / s.class_count.sum()


def mean_set_size(
    sets: Tensor | SetStatistics, target: Tensor | None = None, *, ignore_index: int | None = None
) -> Tensor:
    """The mean number of labels per set, ``mean_i |S_i|``.

    Example:
        >>> mean_set_size(torch.tensor([[True, True], [False, True]]), torch.tensor([0, 0]))
        tensor(1.5000, dtype=torch.float64)
    """
    s = _stats(sets, target, ignore_index)
    sizes = torch.arange(s.size_count.shape[0], dtype=torch.float64, device=s.size_count.device)
    return (sizes * s.size_count).sum() / s.size_count.sum()


def empty_rate(
    sets: Tensor | SetStatistics, target: Tensor | None = None, *, ignore_index: int | None = None
) -> Tensor:
    """The fraction of empty sets.

    Example:
        >>> empty_rate(torch.tensor([[False, False], [False, True]]), torch.tensor([0, 0]))
        tensor(0.5000, dtype=torch.float64)
    """
    s = _stats(sets, target, ignore_index)
    return s.size_count[0] / s.size_count.sum()


def singleton_rate(
    sets: Tensor | SetStatistics, target: Tensor | None = None, *, ignore_index: int | None = None
) -> Tensor:
    """The fraction of sets of exactly one label.

    Example:
        >>> singleton_rate(torch.tensor([[True, True], [False, True]]), torch.tensor([0, 0]))
        tensor(0.5000, dtype=torch.float64)
    """
    s = _stats(sets, target, ignore_index)
    return s.size_count[1] / s.size_count.sum()


def size_stratified_coverage_violation(
    sets: Tensor | SetStatistics,
    target: Tensor | None = None,
    *,
    alpha: float,
    strata: Sequence[tuple[int, int]] = DEFAULT_STRATA,
    ignore_index: int | None = None,
) -> Tensor:
    """SSCV: ``max_j |cov(S_j) - (1 - alpha)|`` over the non-empty size strata ``S_j``.

    Stratum ``(a, b)`` holds the sets of ``a <= |S| <= b`` labels (Angelopoulos et al., ICLR
    2021; TorchCP's ``SSCV``). 0 is ideal: coverage does not depend on the set's size.

    Example:
        >>> sets = torch.tensor([[True, False, False], [True, True, False], [True, True, True]])
        >>> size_stratified_coverage_violation(sets, torch.tensor([1, 1, 2]), alpha=0.1)
        tensor(0.9000, dtype=torch.float64)
    """
    s = _stats(sets, target, ignore_index)
    sizes = torch.arange(s.size_count.shape[0], device=s.size_count.device)
    worst = torch.tensor(-1.0, dtype=torch.float64, device=s.size_count.device)
    for low, high in strata:
        inside = (sizes >= low) & (sizes <= high)
        n = s.size_count[inside].sum()
        if n > 0:
            gap = (s.size_covered[inside].sum() / n - (1.0 - alpha)).abs()
            worst = torch.maximum(worst, gap)
    return worst


def class_coverage_gap(
    sets: Tensor | SetStatistics,
    target: Tensor | None = None,
    *,
    alpha: float,
    ignore_index: int | None = None,
) -> Tensor:
    """The class-conditional coverage gap: ``mean_c |cov_c - (1 - alpha)|`` over present classes.

    Ding et al., "Class-Conditional Conformal Prediction with Many Classes" (NeurIPS 2023);
    TorchCP's ``CovGap`` is this times 100.

    Example:
        >>> sets = torch.tensor([[True, False], [True, False], [False, True]])
        >>> class_coverage_gap(sets, torch.tensor([0, 1, 1]), alpha=0.2)
        tensor(0.2500, dtype=torch.float64)
    """
    s = _stats(sets, target, ignore_index)
    present = s.class_count > 0
    per_class = s.class_covered[present] / s.class_count[present]
    return (per_class - (1.0 - alpha)).abs().mean()
