"""The debiased calibration error of Kumar, Liang and Ma, from the equal-width bin sums.

Source: Kumar, Liang and Ma, "Verified Uncertainty Calibration", NeurIPS 2019, and their
``uncertainty-calibration`` package. The plug-in binned error ``sum_k p_k |conf_k - acc_k|^q``
is biased upward: the accuracy of a bin of ``n_k`` samples is noisy, and the noise adds to
``|conf_k - acc_k|`` on average. A perfectly calibrated model of 400 samples shows an ECE of
about 0.04.

- ``norm="l2"`` (their estimator with ``p=2``, ``debias=True``): each bin's squared gap minus
  the variance of its accuracy, ``e_k = (conf_k - acc_k)^2 - acc_k (1 - acc_k) / (n_k - 1)``
  (0 for bins of fewer than 2 samples), and ``sqrt(max(sum_k (n_k / N) e_k, 0))``. The sum is
  an unbiased estimate of the squared l2 binned calibration error; this is the value of
  ``calibration.get_calibration_error(probs, labels, p=2, debias=True, mode="top-label")``
  on the same bins.
- ``norm="l1"``: their ``p=1`` estimator draws each bin's accuracy from ``N(acc_k, acc_k (1 -
  acc_k) / n_k)`` 1,000 times and returns ``2 ECE - mean(resampled ECE)``. Here the mean over
  draws is replaced by its limit, the folded-normal mean ``E|N(d, s^2)| = s sqrt(2/pi)
  exp(-d^2 / 2s^2) + d (1 - 2 Phi(-d/s))``: the same estimator without its Monte-Carlo noise
  (their value is within ``~1/sqrt(1000)`` of the bins' spread of this one). It may be
  negative.

Both need only ``count``, ``conf_sum`` and ``correct_sum`` per bin (``acc_k (1 - acc_k)`` is the
variance of 0/1 correctness), so the metric's state is that of the ECE: O(bins), summed exactly
across batches and processes.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from lightning_losses.calibration import functional as CF
from lightning_losses.calibration.functional import InputFormat, Task

__all__ = [
    "debiased_calibration_error",
    "debiased_calibration_error_from_bins",
]

DebiasedNorm = Literal["l1", "l2"]
DEBIASED_NORMS = ("l1", "l2")


def debiased_calibration_error_from_bins(
    count: Tensor, conf_sum: Tensor, correct_sum: Tensor, norm: DebiasedNorm = "l2"
) -> Tensor:
    """The debiased calibration error from bin sums (the last dimension indexes the bins).

    See the module doc for both norms. NaN when there is no sample.

    Example:
        >>> count = torch.tensor([40.0, 0.0, 60.0], dtype=torch.float64)
        >>> conf_sum = torch.tensor([10.0, 0.0, 54.0], dtype=torch.float64)
        >>> correct_sum = torch.tensor([10.0, 0.0, 40.0], dtype=torch.float64)
        >>> debiased_calibration_error_from_bins(count, conf_sum, correct_sum)
        tensor(0.1688, dtype=torch.float64)
        >>> CF.calibration_error_from_bins(count, conf_sum, correct_sum, "l2")  # plain: higher
        tensor(0.1807, dtype=torch.float64)
    """
    CF.check_choice("norm", norm, DEBIASED_NORMS)
    count, conf_sum, correct_sum = (t.to(torch.float64) for t in (count, conf_sum, correct_sum))
    total = count.sum(dim=-1)
    safe = torch.where(count > 0, count, torch.ones_like(count))
    accuracy = correct_sum / safe
    gap = conf_sum / safe - accuracy
    share = count / total.unsqueeze(-1)
    label_variance = accuracy * (1 - accuracy)
    if norm == "l2":
        usable = count >= 2
        spread = label_variance / torch.where(usable, count - 1, torch.ones_like(count))
        per_bin = torch.where(usable, gap * gap - spread, torch.zeros_like(gap))
        return (share * per_bin).sum(dim=-1).clamp(min=0).sqrt().where(total > 0, torch.nan)
    sigma = (label_variance / safe).sqrt()
    noisy = sigma > 0
    safe_sigma = torch.where(noisy, sigma, torch.ones_like(sigma))
    z = gap / safe_sigma
    folded = safe_sigma * math.sqrt(2 / math.pi) * torch.exp(-0.5 * z * z) + gap * (
        1 - 2 * torch.special.ndtr(-z)
    )
    expected = torch.where(noisy, folded, gap.abs())
    ece = (share * gap.abs()).sum(dim=-1)
    return 2 * ece - (share * expected).sum(dim=-1)


def debiased_calibration_error(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    norm: DebiasedNorm = "l2",
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> Tensor:
    """Debiased top-label calibration error of Kumar, Liang and Ma (equal-width bins).

    ``norm="l2"`` (default): their unbiased estimator of the squared l2 calibration error, then
    the square root (the l2 counterpart of the ECE, ``calibration_error(norm="l2")``, is the
    plug-in it corrects); ``norm="l1"``: their Gaussian bias correction of the ECE, in closed
    form (see :mod:`lightning_losses.calibration.debiased`). Bins, confidence and correctness
    are those of :func:`~lightning_losses.calibration.functional.calibration_error`. Source:
    Kumar, Liang and Ma, "Verified Uncertainty Calibration", NeurIPS 2019.

    Args:
        preds: ``[N, C]`` or dense ``[N, C, *]`` (multiclass), ``[N]`` (binary) or ``[N, K]``
            (multi-label) floats.
        target: ``[N]`` (dense: ``[N, *]``) class indices, or labels in {0, 1} of the shape of
            ``preds``.
        n_bins: number of equal-width bins ``(k/B, (k+1)/B]``.
        norm: ``"l2"`` or ``"l1"``.
        input_format: ``"probs"`` or ``"logits"``.
        task: ``None`` (inferred from shapes), ``"multiclass"``, ``"binary"``, ``"multilabel"``.
        validate_args: check values as :func:`~lightning_losses.calibration.functional.
            calibration_error` does.
        ignore_index: target value whose samples (multi-label: labels) are left out.

    Returns:
        A float64 scalar tensor (NaN for no samples).

    Example:
        >>> generator = torch.Generator().manual_seed(0)
        >>> confidence = torch.rand(400, generator=generator, dtype=torch.float64)
        >>> labels = (torch.rand(400, generator=generator, dtype=torch.float64) < confidence)
        >>> preds = torch.stack([1 - confidence, confidence], dim=1)  # calibrated
        >>> plain = CF.calibration_error(preds, labels.long(), norm="l2")
        >>> debiased = debiased_calibration_error(preds, labels.long())
        >>> bool(debiased < plain)
        True
    """
    CF.check_n_bins(n_bins)
    CF.check_choice("norm", norm, DEBIASED_NORMS)
    confidence, correct = CF.confidence_and_correct(
        preds,
        target,
        input_format=input_format,
        task=task,
        validate_args=validate_args,
        ignore_index=ignore_index,
    )
    bins = CF.binned_statistics(confidence, correct, n_bins)
    return debiased_calibration_error_from_bins(*bins, norm)
