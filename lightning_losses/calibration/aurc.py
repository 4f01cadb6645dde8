r"""AURC: the area under the selective risk-coverage curve.

A selective classifier answers only on the samples it is most confident about. With the ``N``
decisions sorted by confidence, most confident first, the selective risk at coverage ``k/N``
is the error rate among the first ``k``, and

.. math::

    \operatorname{AURC} = \frac{1}{N} \sum_{k=1}^{N} \frac{1}{k} \sum_{j=1}^{k} e_{(j)},

with ``e = 1 - correct`` the 0/1 error of the top-label decision and its confidence ``max_c
p_c`` (binary and multi-label: ``max(p, 1 - p)`` of the decision ``p > 0.5``), as in
:func:`~lightning_losses.calibration.functional.accuracy` and
:func:`~lightning_losses.calibration.functional.mean_confidence`. Source: Geifman, Uziel and
El-Yaniv, "Bias-Reduced Uncertainty Estimation for Deep Neural Classifiers", ICLR 2019 (AURC;
selective risk and coverage from Geifman and El-Yaniv, "Selective Classification for Deep
Neural Networks", NeurIPS 2017). Lower is better; a classifier whose errors are its least
confident decisions has the smallest AURC its accuracy allows.

Ties: samples of equal confidence have no order, so each tied group takes, at every one of
its positions, its mean error: the value is the mean of the AURC over all orders of the tied
samples, and it depends only on the multiset of (confidence, correct) pairs, not on their
order in the data or on the batching.

:class:`AURC` keeps, by default, a histogram of the confidences: ``histogram_bins`` bins of
equal width in log-odds ``log(c / (1 - c))`` over ``[-36, 36]`` (confidences beyond fall in
the end bins) and one more, the last, for the confidences equal to 1 (saturated softmax
outputs, all tied), each with its count and number of errors: O(bins) state, summed across
processes. Its value treats each bin as one tied group, which is the exact AURC whenever no
bin holds two different confidences, and otherwise lies within :func:`aurc_histogram_bound`
of it (see there). ``exact=True`` keeps every confidence
instead (O(N) state, gathered across processes) and gives :func:`aurc`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.utilities.data import dim_zero_cat

from lightning_losses.calibration import functional as CF
from lightning_losses.calibration.functional import InputFormat, Task
from lightning_losses.calibration.metrics import _CalibrationMetric
from lightning_losses.functional.checks import check_flag, check_int

__all__ = ["AURC", "aurc", "aurc_from_histogram", "aurc_histogram_bound", "aurc_histogram_edges"]

#: The histogram covers the log-odds ``[-LOG_ODDS_RANGE, LOG_ODDS_RANGE]`` of the confidence.
LOG_ODDS_RANGE = 36.0

#: Default number of histogram bins of :class:`AURC`: log-odds bins 0.0072 wide, and one for
#: confidences equal to 1.
HISTOGRAM_BINS = 10_000


def _exact_aurc(confidence: Tensor, correct: Tensor) -> Tensor:
    """AURC of 1-D confidences and 0/1 correctness, ties by their group's mean error."""
    confidence = confidence.reshape(-1).to(torch.float64)
    errors = 1 - correct.reshape(-1).to(torch.float64)
    n = confidence.numel()
    if n == 0:
        return confidence.new_tensor(float("nan"))
    order = torch.argsort(confidence, descending=True)
    _, counts = torch.unique_consecutive(confidence[order], return_counts=True)
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    group_errors = torch.zeros(counts.numel(), dtype=torch.float64, device=confidence.device)
    group_errors.index_add_(0, group, errors[order])
    before = counts.cumsum(0) - counts  # samples in more confident groups
    errors_before = group_errors.cumsum(0) - group_errors
    rate = group_errors / counts
    position = torch.arange(1, n + 1, dtype=torch.float64, device=confidence.device)
    # errors among the first k: those of the more confident groups, and the group's mean
    # error at each of its positions so far
    cumulative = errors_before[group] + (position - before[group]) * rate[group]
    return (cumulative / position).sum() / n


def aurc(
    preds: Tensor,
    target: Tensor,
    *,
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> Tensor:
    """Area under the selective risk-coverage curve, exact (O(N log N) time, O(N) memory).

    ``AURC = (1/N) sum_k (errors among the k most confident decisions) / k``, tied confidences
    taking their group's mean error (see :mod:`lightning_losses.calibration.aurc`). Source:
    Geifman, Uziel and El-Yaniv, "Bias-Reduced Uncertainty Estimation for Deep Neural
    Classifiers", ICLR 2019.

    Arguments (``[N, C, *]`` dense inputs and ``ignore_index`` included) are those of
    :func:`~lightning_losses.calibration.functional.calibration_error`.

    Returns:
        A float64 scalar tensor; NaN for no samples.

    Example:
        >>> preds = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.4, 0.6]])
        >>> aurc(preds, torch.tensor([0, 1, 0]))  # the error is the least confident
        tensor(0.1111, dtype=torch.float64)
    """
    preds, target, task = CF._prepare(
        preds, target, task, input_format, validate_args, ignore_index=ignore_index
    )
    confidence, correct = CF._top_label_terms(preds, target, task, input_format)
    return _exact_aurc(confidence, correct)


def aurc_histogram_edges(histogram_bins: int = HISTOGRAM_BINS, device: Any = None) -> Tensor:
    """Inner edges ``[histogram_bins - 1]`` (float64, increasing) of :class:`AURC`'s histogram.

    With ``B = histogram_bins``, edge ``k < B - 1`` is ``sigmoid(-36 + 72 k / (B - 1))``: ``B -
    1`` bins of equal width in log-odds; the last edge is the largest float64 below 1, so the
    last bin holds the confidences equal to 1. Bin ``b`` is ``(e_{b-1}, e_b]``
    (``torch.bucketize``), the first holding everything up to ``e_0``. The edges are float64:
    above log-odds 30 (``1 - c < 1e-13``) they round onto the coarse float64 grid near 1, and
    some of those bins are empty, as coarse as the float64 confidences they would separate.

    Example:
        >>> aurc_histogram_edges(4)
        tensor([6.1442e-06, 9.9999e-01, 1.0000e+00], dtype=torch.float64)
    """
    check_int("histogram_bins", histogram_bins, low=2)
    steps = torch.arange(1, histogram_bins - 1, dtype=torch.float64, device=device)
    edges = torch.sigmoid(LOG_ODDS_RANGE * (2 * steps / (histogram_bins - 1) - 1))
    below_one = torch.tensor([1.0 - 2.0**-53], dtype=torch.float64, device=device)
    return torch.cat([edges, below_one])


def _histogram_positions(count: Tensor, errors: Tensor) -> tuple[Tensor, ...]:
    """Most confident bin first: counts, errors, samples and errors before each bin, ``N``."""
    count = count.to(torch.float64).flip(0)
    errors = errors.to(torch.float64).flip(0)
    before = count.cumsum(0) - count
    errors_before = errors.cumsum(0) - errors
    return count, errors, before, errors_before, count.sum()


def _harmonic(start: Tensor, stop: Tensor) -> Tensor:
    """``sum_{k = start + 1}^{stop} 1 / k`` for integer-valued float64 ``0 <= start <= stop``."""
    return torch.digamma(stop + 1) - torch.digamma(start + 1)


def aurc_from_histogram(count: Tensor, errors: Tensor) -> Tensor:
    """AURC of a confidence histogram, each bin one tied group (bins in increasing confidence).

    With bin ``b`` holding ``n_b`` samples, ``e_b`` errors, after ``s_b`` samples and ``E_b``
    errors of the more confident bins, its positions ``k = s_b + j`` add ``(E_b + j e_b /
    n_b) / k``; summed in closed form, ``(E_b - s_b e_b / n_b) (H_{s_b + n_b} - H_{s_b}) +
    e_b``, with harmonic numbers ``H`` from ``digamma`` (relative rounding about 1e-15 per
    bin). NaN for an empty histogram.

    Example:
        >>> aurc_from_histogram(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([1.0, 0.0, 0.0]))
        tensor(0.1111, dtype=torch.float64)
    """
    count, errors, before, errors_before, total = _histogram_positions(count, errors)
    if not bool(total > 0):
        return total.new_tensor(float("nan"))
    filled = count > 0
    rate = errors / torch.where(filled, count, torch.ones_like(count))
    terms = (errors_before - before * rate) * _harmonic(before, before + count) + errors
    return torch.where(filled, terms, torch.zeros_like(terms)).sum() / total


def aurc_histogram_bound(count: Tensor, errors: Tensor, *, last_bin_tied: bool = False) -> Tensor:
    """How far the exact AURC can lie from :func:`aurc_from_histogram` of the same samples.

    Take bin ``b`` with ``n`` samples after ``s`` more confident ones and ``q`` the fewer of its
    errors and hits, ``r = 1 - q / n``. Whatever the order of its samples, the errors among its
    first ``j`` lie between ``max(0, j - (n - e))`` and ``min(j, e)``, so they differ from the
    tied-group value ``j e / n`` by at most ``d_j = min(r min(j, n - j), q)``; hence

    ``|AURC - AURC_hist| <= (1/N) sum_b sum_{j=1}^{n_b} d_j / (s_b + j)``,

    summed here in closed form (harmonic numbers from ``digamma``). A bin whose samples are all
    right or all wrong costs nothing, nor does the last bin with ``last_bin_tied=True`` (it
    holds one confidence: :class:`AURC`'s bin of confidences equal to 1); the bound is largest
    for mixed bins among the most confident decisions (small ``s``). 0 for an empty histogram.

    Example:
        >>> aurc_histogram_bound(torch.tensor([0.0, 2.0]), torch.tensor([0.0, 1.0]))
        tensor(0.2500, dtype=torch.float64)
    """
    count, errors, before, _, total = _histogram_positions(count, errors)
    if not bool(total > 0):
        return total.new_zeros(())
    q = torch.minimum(errors, count - errors).clamp_(min=0)
    if last_bin_tied:
        q[0] = 0.0  # flipped: the most confident bin comes first
    n, s = count, before
    mixed = q > 0
    safe_n = torch.where(mixed, n, torch.ones_like(n))
    r = 1 - q / safe_n
    # d_j = r j up to T, q in the middle (T < j < U), r (n - j) from U on
    t = torch.floor(q * safe_n / torch.where(mixed, safe_n - q, torch.ones_like(n)))
    low = torch.minimum(t, torch.floor(n / 2))
    high = torch.maximum(n - low, low + 1)
    rising = r * (low - s * _harmonic(s, s + low))
    middle = q * _harmonic(s + low, s + high - 1)
    falling = r * ((n + s) * _harmonic(s + high - 1, s + n) - (n - high + 1))
    terms = (rising + middle + falling).clamp_(min=0)
    return torch.where(mixed, terms, torch.zeros_like(terms)).sum() / total


class AURC(_CalibrationMetric):
    """Area under the selective risk-coverage curve (see :func:`aurc`) as a ``Metric``.

    Default (``exact=False``): a histogram of the top-label confidences, ``histogram_bins - 1``
    bins of equal width in log-odds over ``[-36, 36]`` and a last one for confidences equal to
    1 (:func:`aurc_histogram_edges`), with states ``count`` and ``errors`` (float64
    ``[histogram_bins]``, ``dist_reduce_fx="sum"``): O(bins) memory, independent of N, and the
    same value over any batching and any number of processes. :meth:`compute` treats each bin
    as a tied group: the exact :func:`aurc` when no bin holds two different confidences,
    otherwise within :meth:`error_bound` of it, ``(1/N) sum_b sum_{j=1}^{n_b} d_j / (s_b +
    j)`` with ``d_j = min((1 - q_b / n_b) min(j, n_b - j), q_b)``, ``q_b`` the fewer of the
    bin's errors and hits and ``s_b`` the samples of the more confident bins
    (:func:`aurc_histogram_bound`).

    ``exact=True`` keeps every confidence and correctness instead (list states
    ``confidence`` and ``correct``, float64, ``dist_reduce_fx="cat"``: O(N) memory, a DDP sync
    gathers them all) and computes :func:`aurc` exactly.

    ``input_format``, ``task``, ``validate_args``, ``ignore_index`` and ``kwargs`` are as in
    :class:`~lightning_losses.calibration.metrics.CalibrationError`.

    Args:
        num_classes: if given, ``[N, C]`` preds must have ``C == num_classes`` columns.
        histogram_bins: bins of the histogram (``exact=False``), at least 2.
        exact: keep the confidences and compute the exact AURC.

    Example:
        >>> metric = AURC()
        >>> metric.update(torch.tensor([[0.9, 0.1], [0.3, 0.7]]), torch.tensor([0, 1]))
        >>> metric.update(torch.tensor([[0.4, 0.6]]), torch.tensor([0]))
        >>> metric.compute(), metric.error_bound()
        (tensor(0.1111, dtype=torch.float64), tensor(0., dtype=torch.float64))
    """

    # The states (add_state), declared for type checkers: with ``exact`` the lists of batches
    # (one tensor while synced), else the float64 [histogram_bins] histogram.
    confidence: list[Tensor]
    correct: list[Tensor]
    count: Tensor
    errors: Tensor

    def __init__(
        self,
        num_classes: int | None = None,
        histogram_bins: int = HISTOGRAM_BINS,
        exact: bool = False,
        input_format: InputFormat = "probs",
        task: Task | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            num_classes=num_classes,
            input_format=input_format,
            task=task,
            validate_args=validate_args,
            ignore_index=ignore_index,
            **kwargs,
        )
        check_flag("exact", exact)
        self.histogram_bins = check_int("histogram_bins", histogram_bins, low=2)
        self.exact = exact
        if exact:
            self.add_state("confidence", default=[], dist_reduce_fx="cat")
            self.add_state("correct", default=[], dist_reduce_fx="cat")
        else:
            for name in ("count", "errors"):
                zeros = torch.zeros(histogram_bins, dtype=torch.float64)
                self.add_state(name, default=zeros, dist_reduce_fx="sum")
        self._edges: Tensor | None = None

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch: its confidences to the histogram (or the list, with ``exact``)."""
        task = self._resolve(preds, target)
        preds, target, task = CF._prepare(
            preds,
            target,
            task,
            self.input_format,
            self.validate_args,
            ignore_index=self.ignore_index,
        )
        confidence, correct = CF._top_label_terms(preds, target, task, self.input_format)
        if self.exact:
            self.confidence.append(confidence)
            self.correct.append(correct)
            return
        if self._edges is None or self._edges.device != confidence.device:
            self._edges = aurc_histogram_edges(self.histogram_bins, confidence.device)
        index = torch.bucketize(confidence, self._edges, right=False)
        self.count.add_(torch.bincount(index, minlength=self.histogram_bins))
        self.errors.index_add_(0, index, 1 - correct)

    def _value(self) -> Tensor:
        if not self.exact:
            return aurc_from_histogram(self.count, self.errors)
        if isinstance(self.confidence, list) and not self.confidence:
            return torch.tensor(float("nan"), dtype=torch.float64, device=self.device)
        return _exact_aurc(dim_zero_cat(self.confidence), dim_zero_cat(self.correct))

    def compute(self) -> Tensor:
        """The AURC of everything seen (synced across processes); NaN before any sample."""
        return self._value()

    def error_bound(self) -> Tensor:
        """Bound on ``|exact AURC - compute()|`` (synced; 0 with ``exact=True``)."""
        if self.exact:
            return torch.zeros((), dtype=torch.float64, device=self.device)
        return self._synced(
            lambda: aurc_histogram_bound(self.count, self.errors, last_bin_tied=True)
        )
