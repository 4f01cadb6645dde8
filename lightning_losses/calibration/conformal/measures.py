"""How good are the sets: coverage, size, empty and singleton rates, SSCV, coverage gap.

Every measure is a function of a few sums over the test samples, kept by
:func:`set_statistics`: per class, the number of samples and how many sets hold their label;
per set size ``0..C``, the number of sets and how many hold the label. Sums add across batches
and processes, so the :class:`~.metrics.PredictionSetMetrics` built on them is exact under DDP.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from lightning_losses.calibration.conformal._inputs import rows_and_target
from lightning_losses.calibration.conformal.scores import (
    ranked_rows,
    score_rows_and_draws,
    sorted_order_scores,
)

__all__ = [
    "CHUNK_ELEMENTS",
    "DEFAULT_STRATA",
    "MEASURES",
    "SetStatistics",
    "all_measures",
    "class_coverage_gap",
    "coverage",
    "empty_rate",
    "mean_set_size",
    "set_statistics",
    "set_statistics_by_method",
    "singleton_rate",
    "size_stratified_coverage_violation",
    "summed_statistics",
]

#: Angelopoulos et al.'s set-size strata for SSCV (TorchCP's default).
DEFAULT_STRATA: tuple[tuple[int, int], ...] = ((0, 1), (2, 3), (4, 10), (11, 100), (101, 1000))

#: Every measure of :func:`all_measures`, by name.
MEASURES = ("coverage", "size", "empty", "singleton", "sscv", "coverage_gap")

#: Rows per chunk of :func:`set_statistics_by_method`: about this many probabilities (4 MiB in
#: float64), so that its two ``[rows, C]`` buffers stay in the last-level cache and every chunk
#: reuses them instead of faulting in fresh pages for the temporaries of a large batch (2^19
#: took 5-15% less time than 2^18 at ``[100,000, 100]``, fewer calls for the same work).
CHUNK_ELEMENTS = 1 << 19


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
    covered = rows.gather(1, labels[:, None])[:, 0]
    return _sums(covered, rows.sum(1), labels, sets.shape[1])


def summed_statistics(parts: Iterable[SetStatistics]) -> SetStatistics:
    """The :class:`SetStatistics` of several batches' sets together: each sum added up.

    Example:
        >>> a = set_statistics(torch.tensor([[True, False]]), torch.tensor([0]))
        >>> summed_statistics([a, a]).class_covered
        tensor([2., 0.], dtype=torch.float64)
    """
    total: SetStatistics | None = None
    for part in parts:
        total = part if total is None else SetStatistics(*map(torch.add, total, part))
    if total is None:
        raise ValueError("summed_statistics needs at least one SetStatistics")
    return total


def _sums(covered: Tensor, size: Tensor, labels: Tensor, classes: int) -> SetStatistics:
    """:class:`SetStatistics` of ``[M]`` sets: whether each holds its label, its size, the label."""
    weights = covered.double()
    return SetStatistics(
        class_count=torch.bincount(labels, minlength=classes).double(),
        class_covered=torch.bincount(labels, weights=weights, minlength=classes).double(),
        size_count=torch.bincount(size, minlength=classes + 1).double(),
        size_covered=torch.bincount(size, weights=weights, minlength=classes + 1).double(),
    )


def set_statistics_by_method(
    probs: Tensor,
    target: Tensor,
    thresholds: Mapping[str, Sequence[float]],
    *,
    randomized: bool = True,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
    k_reg: int = 1,
    lam: float = 0.01,
    weight: float = 0.2,
    ignore_index: int | None = None,
) -> dict[str, list[SetStatistics]]:
    """:func:`set_statistics` of each method's sets at each of its thresholds, sets unbuilt.

    ``thresholds`` maps a method to its thresholds ``q``; entry ``k`` of a method's list equals
    ``set_statistics(all_label_scores_by_method(probs, methods, ...)[method] <= q[k], target)``
    with the same draws ``U`` (one per row of ``probs``, ignored rows included), bit for bit.
    The scores are the same numbers, kept in the rank order in which they are computed: the
    values are sorted once for every method (:func:`~.scores.ranked_rows`) and nothing is
    scattered back to label order. Per threshold a set is its size and whether it holds the
    label (the true label's score ``<= q``); where every row's scores are non-decreasing in
    rank order (checked per method; every score here is in exact arithmetic) the size is a
    binary search, else a count. What :class:`~lightning_losses.callbacks.ConformalPrediction`
    measures at ``test``.

    Example:
        >>> probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
        >>> s = set_statistics_by_method(probs, torch.tensor([1, 2]), {"aps": [0.85]},
        ...                              randomized=False)
        >>> s["aps"][0].size_count, s["aps"][0].class_covered
        (tensor([0., 1., 1., 0.], dtype=torch.float64), tensor([0., 1., 0.], dtype=torch.float64))
    """
    _, u = score_rows_and_draws(
        probs,
        thresholds,
        randomized=randomized,
        generator=generator,
        noise=noise,
        k_reg=k_reg,
        lam=lam,
        weight=weight,
    )
    rows, labels = rows_and_target(probs, target, ignore_index=ignore_index)
    if ignore_index is not None:
        u = u[(target != ignore_index).reshape(-1)]
    sorting = any(method != "lac" for method in thresholds)
    step = max(1, CHUNK_ELEMENTS // max(1, rows.shape[1]))
    # each method's levels as a row [1, L] in the scores' dtype (what `score <= q` compares
    # against), and as [step, L] rows for the binary searches of every level at once
    level_rows = {
        m: torch.tensor([list(q)], dtype=rows.dtype, device=rows.device)
        for m, q in thresholds.items()
    }
    searched = {
        m: q.expand(min(step, rows.shape[0]), -1).contiguous() for m, q in level_rows.items()
    }
    # per method: [m, L] whether each set holds its label, and its size, chunk by chunk
    covered: dict[str, list[Tensor]] = {m: [] for m in thresholds}
    sizes: dict[str, list[Tensor]] = {m: [] for m in thresholds}
    # Where a row's scores never decrease in rank order, its set size is a binary search. In
    # rank order 1 - p and r + 1 - U never decrease (rounding is monotone). Without draws, the
    # cumulative sums of APS, RAPS and SAPS never decrease either where the steps are >= 0 (the
    # sorted row's last, smallest, probability; lam >= 0 and weight > 0) and the sum is
    # accumulated in order, as torch's CPU cumsum does (a rounded sum of one more term >= 0 is
    # never smaller); otherwise the rows are checked.
    sums_rise = rows.is_cpu and not bool(u.ne(0).any())
    one = torch.ones((), dtype=rows.dtype, device=rows.device)
    # two [step, C] buffers and one of booleans, reused by every chunk
    work = rows.new_empty((2, min(step, rows.shape[0]), rows.shape[1]))
    rising = torch.empty(
        (work.shape[1], max(0, rows.shape[1] - 1)), dtype=torch.bool, device=rows.device
    )
    for start in range(0, rows.shape[0], step):
        part = slice(start, start + step)
        chunk, chunk_labels = rows[part], labels[part]
        m = chunk.shape[0]
        ordered, rank, steps_nonnegative = None, None, False
        if sorting:
            ordered, rank = ranked_rows(chunk, chunk_labels, out=work[0, :m])
            steps_nonnegative = sums_rise and bool((ordered[:, -1] >= 0).all())
        for method in thresholds:
            if ordered is None or rank is None:  # LAC alone: its scores in label order
                scores = 1.0 - chunk
                true_score = scores.gather(1, chunk_labels[:, None])
            else:  # in rank order: LAC's 1 - p too
                if method == "lac":
                    scores = torch.sub(one, ordered, out=work[1, :m])
                else:
                    scores = sorted_order_scores(
                        ordered,
                        u[part],
                        method=method,
                        k_reg=k_reg,
                        lam=lam,
                        weight=weight,
                        out=work[1, :m],
                    )
                true_score = scores.gather(1, rank)
            increasing = ordered is not None and (
                method in ("lac", "top_k")
                or steps_nonnegative
                or bool(torch.ge(scores[:, 1:], scores[:, :-1], out=rising[:m]).all())
            )
            covered[method].append(true_score <= level_rows[method])
            if increasing:  # every level's size by one binary search per row
                sizes[method].append(torch.searchsorted(scores, searched[method][:m], right=True))
            else:
                counts = [(scores <= q).sum(1) for q in level_rows[method][0]]
                sizes[method].append(torch.stack(counts, 1) if counts else true_score[:, :0].long())
    classes = probs.shape[1]
    found = {}
    for method, levels in thresholds.items():
        held = _joined(covered[method], torch.bool, labels.device, len(levels))
        size = _joined(sizes[method], torch.long, labels.device, len(levels))
        found[method] = [_sums(held[:, k], size[:, k], labels, classes) for k in range(len(levels))]
    return found


def _joined(parts: list[Tensor], dtype: torch.dtype, device: torch.device, levels: int) -> Tensor:
    """The chunks' ``[m, L]`` tensors end to end (an empty ``[0, L]`` one when there are none)."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat(parts) if parts else torch.zeros(0, levels, dtype=dtype, device=device)


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


def all_measures(
    stats: SetStatistics, *, alpha: float, strata: Sequence[tuple[int, int]] = DEFAULT_STRATA
) -> dict[str, Tensor]:
    """Every measure of :data:`MEASURES` of one score's sets at level ``alpha``, float64 scalars.

    Example:
        >>> sets = torch.tensor([[True, False], [True, True], [False, False]])
        >>> m = all_measures(set_statistics(sets, torch.tensor([0, 1, 1])), alpha=0.1)
        >>> float(m["coverage"]), float(m["size"]), float(m["empty"])
        (0.6666666666666666, 1.0, 0.3333333333333333)
    """
    return {
        "coverage": coverage(stats),
        "size": mean_set_size(stats),
        "empty": empty_rate(stats),
        "singleton": singleton_rate(stats),
        "sscv": size_stratified_coverage_violation(stats, alpha=alpha, strata=strata),
        "coverage_gap": class_coverage_gap(stats, alpha=alpha),
    }
