"""The Brier score split into reliability, resolution and uncertainty over equal-width bins.

Which Brier score: the package's :func:`~lightning_losses.calibration.functional.brier_score`,
``mean_i sum_c (p_ic - y_ic)^2`` for multiclass inputs (``y_ic = 1[y_i = c]``), ``mean_i (p_i
- y_i)^2`` for binary ``[N]`` inputs and over the pooled ``N * K`` labels of multi-label ones.
A multiclass score is the sum over classes of the binary score of the one-vs-rest forecast
``p_c`` of the event ``y = c``, so it is decomposed class by class and the terms are summed
over classes (binary and multi-label inputs: one forecast, the positive-class probability).

For one forecast ``f_i`` of a binary event ``o_i`` in {0, 1}, over the ``B`` equal-width bins
``(k/B, (k+1)/B]`` of ``f`` (the bins of the calibration errors), with ``n_k`` samples, mean
forecast ``f̄_k`` and event frequency ``ō_k`` in bin ``k``, and ``ō`` the overall frequency:

- reliability ``REL = (1/N) sum_k n_k (f̄_k - ō_k)^2`` (the squared RMS calibration error);
- resolution ``RES = (1/N) sum_k n_k (ō_k - ō)^2``;
- uncertainty ``UNC = ō (1 - ō)``;
- within-bin variance ``WBV = (1/N) sum_k sum_{i in k} (f_i - f̄_k)^2``;
- within-bin covariance ``WBC = (2/N) sum_k sum_{i in k} (o_i - ō_k)(f_i - f̄_k)``;

and ``BS = REL - RES + UNC + WBV - WBC`` holds exactly (up to rounding). Murphy's three-term
decomposition ("A new vector partition of the probability score", Journal of Applied
Meteorology 1973) is exact when every bin holds one forecast value (then ``WBV = WBC = 0``);
with bins of differing forecasts the two extra terms are those of Stephenson, Coelho and
Jolliffe, "Two extra components in the Brier score decomposition", Weather and Forecasting 2008.

State, O(rows x bins) floats: per (row, bin) the count and the sums of ``f``, ``o``, ``f^2`` and
``f o`` (``o^2 = o`` for 0/1 events), which add up over batches and processes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from lightning_losses.calibration import functional as CF
from lightning_losses.calibration.functional import InputFormat, Task
from lightning_losses.calibration.metrics import _CalibrationMetric

__all__ = [
    "BrierComponents",
    "BrierDecomposition",
    "brier_decomposition",
    "brier_decomposition_from_bins",
]

#: The per-bin sums, in the order of the first dimension of the state.
SUMS = ("count", "forecast_sum", "event_sum", "forecast_sq_sum", "product_sum")


class BrierComponents(NamedTuple):
    """The Brier score and its terms, float64 scalars.

    ``brier = reliability - resolution + uncertainty + within_bin_variance -
    within_bin_covariance``. The first four are the ones the issue names;
    ``brier, rel, res, unc, *_ = ...`` unpacks them. Multiclass: each term summed over the
    classes' one-vs-rest forecasts.
    """

    brier: Tensor
    reliability: Tensor
    resolution: Tensor
    uncertainty: Tensor
    within_bin_variance: Tensor
    within_bin_covariance: Tensor


def _binned_sums(
    preds: Tensor, target: Tensor, task: str, input_format: str, n_bins: int
) -> Tensor:
    """The five per-bin sums of :data:`SUMS`, float64 ``[5, R, n_bins]``, of checked inputs.

    Multiclass: ``R = C`` one-vs-rest forecasts ``p_c`` of the events ``y = c``; no ``[M, C]``
    one-hot is made, the events are the target entries. Binary and multi-label (``[N]``,
    ``[N, K]``, or the kept labels flattened): ``R = 1``, the positive-class probability.
    """
    if task == "multiclass":
        probs = CF._class_probs(preds, input_format)  # [M, C]
        offset = torch.arange(probs.shape[1], device=probs.device) * n_bins
        index = CF._bin_index(probs, n_bins) + offset  # the bin of each class's forecast
        column = target.long()[:, None]
        event_index = index.gather(1, column)[:, 0]
        event_forecast = probs.gather(1, column)[:, 0]
    else:
        probs = CF._binary_probs(preds, input_format).reshape(-1, 1).contiguous()
        index = CF._bin_index(probs, n_bins)
        events = target.reshape(-1).to(torch.bool)
        event_index, event_forecast = index[events, 0], probs[events, 0]
    rows = probs.shape[1]
    size = rows * n_bins
    flat_index, forecast = index.reshape(-1), probs.reshape(-1).to(torch.float64)
    sums = torch.zeros(len(SUMS), size, dtype=torch.float64, device=probs.device)
    sums[0] = torch.bincount(flat_index, minlength=size).to(torch.float64)
    sums[1].index_add_(0, flat_index, forecast)
    sums[2] = torch.bincount(event_index, minlength=size).to(torch.float64)
    sums[3].index_add_(0, flat_index, forecast * forecast)
    sums[4].index_add_(0, event_index, event_forecast.to(torch.float64))
    return sums.reshape(len(SUMS), rows, n_bins)


def brier_decomposition_from_bins(sums: Tensor) -> BrierComponents:
    """The Brier score and its terms from the per-bin sums ``[5, R, B]`` (see the module doc).

    ``sums`` holds, per forecast row ``r`` and bin ``k``: the count ``n``, and the sums of the
    forecast ``f``, the event ``o``, ``f^2`` and ``f o`` (:data:`SUMS`). Each non-empty row is
    decomposed over its own ``N_r`` samples and the terms are summed over rows; rows without
    samples add nothing, and no sample at all gives NaN everywhere.

    Example:
        >>> sums = torch.tensor([2.0, 1.0, 1.0, 0.625, 0.75], dtype=torch.float64)[:, None, None]
        >>> brier_decomposition_from_bins(sums).brier  # f = (0.25, 0.75) -> o = (0, 1)
        tensor(0.0625, dtype=torch.float64)
    """
    sums = sums.to(torch.float64)
    if sums.dim() != 3 or sums.shape[0] != len(SUMS):
        raise ValueError(f"sums must be [5, R, n_bins] ({', '.join(SUMS)}); got {list(sums.shape)}")
    count, f, o, ff, fo = sums
    total = count.sum(dim=-1, keepdim=True)  # [R, 1]
    rows = total[:, 0] > 0
    safe_total = torch.where(total > 0, total, torch.ones_like(total))
    nonempty = count > 0
    safe_count = torch.where(nonempty, count, torch.ones_like(count))
    rate = o.sum(dim=-1, keepdim=True) / safe_total  # ō per row
    terms = torch.stack(
        [
            ff - 2 * fo + o,  # sum (f - o)^2, as o^2 = o
            (f - o).square() / safe_count,
            (o - count * rate).square() / safe_count,
            count * rate * (1 - rate),
            ff - f.square() / safe_count,
            2 * (fo - f * o / safe_count),
        ]
    )  # [6, R, B]; empty bins hold zeros
    per_row = terms.sum(dim=-1) / safe_total[:, 0]  # [6, R]
    values = torch.where(rows, per_row, torch.zeros_like(per_row)).sum(dim=-1)
    if not bool(rows.any()):
        values = torch.full_like(values, float("nan"))
    return BrierComponents(*values.unbind())


def brier_decomposition(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> BrierComponents:
    """The Brier score with Murphy's decomposition over equal-width bins, and its two extra terms.

    Returns :class:`BrierComponents` ``(brier, reliability, resolution, uncertainty,
    within_bin_variance, within_bin_covariance)`` with ``brier = reliability - resolution +
    uncertainty + within_bin_variance - within_bin_covariance``; ``brier`` is
    :func:`~lightning_losses.calibration.functional.brier_score`. Multiclass: the one-vs-rest
    forecast of each class binned on its own (the bins of
    :func:`~lightning_losses.calibration.functional.classwise_calibration_error`), terms summed
    over classes (so ``uncertainty = 1 - sum_c ō_c^2``); binary and multi-label (pooled
    labels): the positive-class probability. Definitions and sources in
    :mod:`lightning_losses.calibration.brier`.

    Arguments (``[N, C, *]`` dense inputs and ``ignore_index`` included) are those of
    :func:`~lightning_losses.calibration.functional.calibration_error`; targets are hard
    labels (the decomposition needs 0/1 events).

    Example:
        >>> preds = torch.tensor([[0.8, 0.2], [0.4, 0.6], [0.3, 0.7]])
        >>> parts = brier_decomposition(preds, torch.tensor([0, 0, 1]), n_bins=5)
        >>> round(parts.brier.item(), 4)
        0.3267
        >>> total = parts.reliability - parts.resolution + parts.uncertainty
        >>> round((total + parts.within_bin_variance - parts.within_bin_covariance).item(), 4)
        0.3267
    """
    CF.check_n_bins(n_bins)
    preds, target, task = CF._prepare(
        preds, target, task, input_format, validate_args, ignore_index=ignore_index
    )
    return brier_decomposition_from_bins(_binned_sums(preds, target, task, input_format, n_bins))


class BrierDecomposition(_CalibrationMetric):
    """The Brier score and its decomposition (see :func:`brier_decomposition`) as a ``Metric``.

    ``compute()`` returns :class:`BrierComponents`, equal to :func:`brier_decomposition` on all
    the data seen, whatever the batching and the number of processes.

    State (float64, ``dist_reduce_fx="sum"``): ``sums``, ``[5, R, n_bins]`` (count and the sums
    of ``f``, ``o``, ``f^2``, ``f o`` per forecast row and bin), ``R = num_classes`` (or 1):
    O(classes x bins), independent of N. :meth:`bins` returns it synced.

    ``input_format``, ``task``, ``validate_args``, ``ignore_index`` and ``kwargs`` are as in
    :class:`~lightning_losses.calibration.metrics.CalibrationError`.

    Args:
        num_classes: ``C``, required for multiclass inputs (``[N, C]`` or ``[N, C, *]``);
            leave ``None`` for binary and multi-label inputs, whose pooled positive-class
            forecast is one row (with ``num_classes`` set it is the first row).
        n_bins: number of equal-width bins per forecast row.

    Example:
        >>> metric = BrierDecomposition(num_classes=2, n_bins=5)
        >>> metric.update(torch.tensor([[0.8, 0.2], [0.4, 0.6]]), torch.tensor([0, 0]))
        >>> metric.update(torch.tensor([[0.3, 0.7]]), torch.tensor([1]))
        >>> round(metric.compute().brier.item(), 4)
        0.3267
    """

    higher_is_better = None

    # The state (add_state), declared for type checkers: float64 [5, R, n_bins].
    sums: Tensor

    def __init__(
        self,
        num_classes: int | None = None,
        n_bins: int = 15,
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
        CF.check_n_bins(n_bins)
        self.n_bins = n_bins
        zeros = torch.zeros(len(SUMS), num_classes or 1, n_bins, dtype=torch.float64)
        self.add_state("sums", default=zeros, dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch to the per-bin sums."""
        task = self._resolve(preds, target)
        if task == "multiclass" and self.num_classes is None:
            raise ValueError(
                f"multiclass preds {list(preds.shape)} need BrierDecomposition(num_classes=C) "
                f"(here C={preds.shape[1]}): the state holds one row of bins per class"
            )
        preds, target, task = CF._prepare(
            preds,
            target,
            task,
            self.input_format,
            self.validate_args,
            ignore_index=self.ignore_index,
        )
        sums = _binned_sums(preds, target, task, self.input_format, self.n_bins)
        self.sums[:, : sums.shape[1]].add_(sums)

    def compute(self) -> BrierComponents:
        """The decomposition of everything seen (synced across processes); NaN before any."""
        return brier_decomposition_from_bins(self.sums)

    def bins(self) -> Tensor:
        """The per-bin sums ``[5, R, n_bins]`` (float64 copy), synced under DDP."""
        return self._synced(lambda: self.sums.clone())
