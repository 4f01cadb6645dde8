r"""Histogram binning, and what it shares with isotonic regression: maps of one probability.

Both calibrate with maps :math:`f : [0, 1] \to [0, 1]` of a single probability, fitted to the
labels, in one of two modes (as netcal's binning methods):

- ``mode="top_label"``: one map of the top confidence :math:`\hat p_i = \max_c
  \operatorname{softmax}(z_i)_c` to the frequency with which the predicted class
  :math:`k_i = \arg\max_c z_{ic}` (the first one on ties) is right. The calibrated top
  probability is :math:`q_i = f(\hat p_i)`; the other classes share :math:`1 - q_i` in
  proportion to their softmax probabilities:

  .. math::

      \log \tilde p_{i k_i} = \log q_i, \qquad
      \log \tilde p_{ic} = \log(1 - q_i) + z_{ic} - \log \sum_{c' \ne k_i} e^{z_{ic'}}
      \quad (c \ne k_i).

- ``mode="one_vs_rest"``: one map per class :math:`c` of :math:`p_{ic} =
  \operatorname{softmax}(z_i)_c` to the frequency of class :math:`c`, then each row is
  renormalised, :math:`\tilde p_{ic} = f_c(p_{ic}) / \sum_{c'} f_{c'}(p_{ic'})`. As in netcal,
  a class with no sample in the fit gets :math:`f_c \equiv 0`; a row whose calibrated values
  are all 0 (which netcal leaves as NaN) keeps its uncalibrated softmax. Two classes are one
  binary task, as netcal reads them: one map of :math:`p_{i1}` and
  :math:`\tilde p_i = (1 - f(p_{i1}), f(p_{i1}))`.

A map may give exactly 0 or 1 (a bin without a right prediction, say), where netcal returns
the 0 and the NLL of a sample whose label gets it is infinite. Here no probability is 0: every
row :math:`\tilde p_i` (of :math:`C` classes) is mixed with a floor :math:`\varepsilon`
(``floor``, default ``1e-6``) and renormalised,

.. math::

    \hat p_{ic} = \frac{\tilde p_{ic} + \varepsilon}{1 + C \varepsilon} \ge
    \frac{\varepsilon}{1 + C \varepsilon},

computed in log space (``logaddexp(log p, log eps) - log1p(C eps)``): rows still sum to 1,
the order of the classes is kept, and every log-probability (and every sample's NLL) is finite.

Histogram binning (Zadrozny and Elkan, "Obtaining calibrated probability estimates from
decision trees and naive Bayesian classifiers", ICML 2001): :math:`B` equal-width bins, the map
is the frequency of the positives among the fitted samples of each bin.
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar, Literal

import numpy as np
import torch
from torch import Tensor

from lightning_losses.calibration.posthoc.base import PostHocCalibrator
from lightning_losses.functional.checks import check_choice, check_int, check_real

__all__ = [
    "DEFAULT_FLOOR",
    "HistogramBinning",
    "ProbabilityMapCalibrator",
    "bin_edges",
    "bin_index",
]

Mode = Literal["top_label", "one_vs_rest"]
MODES: tuple[str, ...] = ("top_label", "one_vs_rest")
#: The default floor mixed into every calibrated row: no probability is below about 1e-6.
DEFAULT_FLOOR = 1e-6


class ProbabilityMapCalibrator(PostHocCalibrator):
    r"""Base of the calibrators by maps of one probability (see the module): the two modes.

    Subclasses implement :meth:`_fit_maps` (``R`` rows of probabilities and their 0/1 labels
    to the maps' parameters, one row per map) and :meth:`_apply_maps`, and name in
    :attr:`values_key` the parameter whose rows, set to 0, make a map identically 0.

    Args:
        mode: ``"top_label"`` or ``"one_vs_rest"``.
        floor: the floor :math:`\varepsilon` mixed into every row (see the module), in
            ``(0, 0.01]``.
    """

    #: The parameter ``[R, K]`` of the maps' values (all 0: the map is 0 everywhere).
    values_key: ClassVar[str] = "values"

    def __init__(self, *, mode: Mode = "top_label", floor: float = DEFAULT_FLOOR) -> None:
        super().__init__()
        check_choice(f"{type(self).__name__}: mode", mode, MODES)
        self.mode: Mode = mode
        self.floor = check_real(
            f"{type(self).__name__}: floor", floor, low=0.0, high=0.01, low_open=True
        )

    @abc.abstractmethod
    def _fit_maps(self, scores: Tensor, hits: Tensor) -> dict[str, Tensor]:
        """The maps' parameters from float64 probabilities ``[R, N]`` and 0/1 labels ``[R, N]``."""

    @abc.abstractmethod
    def _apply_maps(self, scores: Tensor) -> Tensor:
        """The calibrated values ``[R, N]`` of probabilities ``[R, N]`` (``R`` as fitted)."""

    def _rows(self, num_classes: int) -> int:
        """How many maps the mode fits for ``num_classes`` classes."""
        return num_classes if self.mode == "one_vs_rest" and num_classes > 2 else 1

    def _scores(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """The mapped probabilities ``[R, N]``, and the predicted class ``[N]`` (top-label)."""
        probs = torch.softmax(logits, dim=1)
        confidence, predicted = probs.max(dim=1)
        if self.mode == "top_label":
            return confidence[None], predicted
        if logits.shape[1] == 2:
            return probs[:, 1][None], predicted
        return probs.T.contiguous(), predicted

    def _fit(self, logits: Tensor, target: Tensor) -> dict[str, Tensor]:
        scores, predicted = self._scores(logits)
        num_classes = logits.shape[1]
        if self.mode == "top_label":
            hits = (predicted == target)[None]
        elif num_classes == 2:
            hits = (target == 1)[None]
        else:
            classes = torch.arange(num_classes, device=target.device)
            hits = target[None, :] == classes[:, None]
        params = self._fit_maps(scores, hits.to(torch.float64))
        if self._rows(num_classes) > 1:  # netcal: no map (0) for a class absent from the fit
            params[self.values_key][~hits.any(dim=1)] = 0.0
        return params

    def _log_probs(self, logits: Tensor) -> Tensor:
        """The maps' log-probabilities, each row mixed with the floor and renormalised."""
        out = self._mapped_log_probs(logits)
        floor = torch.full((), math.log(self.floor), dtype=out.dtype, device=out.device)
        return torch.logaddexp(out, floor) - math.log1p(logits.shape[1] * self.floor)

    def _mapped_log_probs(self, logits: Tensor) -> Tensor:
        rows = self.params[self.values_key].shape[0]
        if rows != self._rows(logits.shape[1]):
            raise ValueError(
                f"{self.name}: the fitted state holds {rows} maps, mode={self.mode!r} needs "
                f"{self._rows(logits.shape[1])}; load it into a calibrator built with the mode "
                f"it was fitted with"
            )
        scores, predicted = self._scores(logits)
        mapped = self._apply_maps(scores).clamp(0.0, 1.0)
        if self.mode == "top_label":
            return _top_label_log_probs(logits, predicted, mapped[0])
        if logits.shape[1] == 2:
            return torch.stack([torch.log1p(-mapped[0]), torch.log(mapped[0])], dim=1)
        calibrated = mapped.T
        total = calibrated.sum(dim=1, keepdim=True)
        out = torch.log(calibrated) - torch.log(total)
        empty = (total == 0).squeeze(1)
        return torch.where(empty[:, None], torch.log_softmax(logits, dim=1), out)

    def extra_repr(self) -> str:
        """The mode and whether it is fitted."""
        return f"mode={self.mode!r}, floor={self.floor:g}, {super().extra_repr()}"


def _top_label_log_probs(logits: Tensor, predicted: Tensor, top: Tensor) -> Tensor:
    """Log-probabilities with ``top`` on the predicted class, ``1 - top`` shared by the rest."""
    is_top = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, predicted[:, None], True)
    rest = torch.logsumexp(logits.masked_fill(is_top, float("-inf")), dim=1, keepdim=True)
    others = torch.log1p(-top)[:, None] + logits - rest
    return torch.where(is_top, torch.log(top)[:, None], others)


def bin_edges(n_bins: int, like: Tensor) -> Tensor:
    """The ``n_bins + 1`` equal-width edges of [0, 1], as ``numpy.linspace(0, 1, n_bins + 1)``."""
    edges = torch.from_numpy(np.linspace(0.0, 1.0, n_bins + 1))
    return edges.to(device=like.device, dtype=torch.float64)


def bin_index(scores: Tensor, n_bins: int) -> Tensor:
    """Bin ``k`` of each probability: ``edges[k] < p <= edges[k + 1]``, and 0 for ``p = 0``.

    Example:
        >>> bin_index(torch.tensor([0.0, 0.1, 0.15, 0.5, 1.0], dtype=torch.float64), 10).tolist()
        [0, 0, 1, 4, 9]
    """
    index = torch.searchsorted(bin_edges(n_bins, scores), scores.contiguous(), right=False) - 1
    return index.clamp(0, n_bins - 1)


class HistogramBinning(ProbabilityMapCalibrator):
    r"""Histogram binning: each probability replaced by the frequency of its bin.

    With ``B`` equal-width bins :math:`I_k = (k/B, (k+1)/B]` (a probability of 0 in the first,
    edges as ``numpy.linspace(0, 1, B + 1)``) the map of the positives' frequency is

    .. math::

        f(p) = \theta_k \text{ for } p \in I_k, \qquad
        \theta_k = \frac{\sum_i y_i \, [p_i \in I_k]}{\sum_i [p_i \in I_k]},

    and an empty bin gets its midpoint :math:`\theta_k = (k + 1/2) / B` (netcal's rule). In
    ``mode="top_label"`` :math:`p` is the top confidence and :math:`y` whether the prediction
    is right; in ``mode="one_vs_rest"`` one map per class of :math:`p_c` and
    :math:`y = [\text{label} = c]`, rows renormalised (see the module for both, and for
    probabilities of 0). This is netcal's ``HistogramBinning`` (``equal_intervals=True``)
    fitted on the top confidences and their correctness (top-label) or on the softmax
    probabilities (one-vs-rest); except that netcal's fit puts a probability lying exactly on
    an inner edge into the upper bin while its transform (and this class, fit and transform)
    reads the bins as :math:`(k/B, (k+1)/B]`.

    ``params``: ``values`` ``[R, B]``, the :math:`\theta_k` of each map (``R = 1``, or ``C``
    in one-vs-rest with more than 2 classes). A fit needs at least ``n_bins`` samples (as many
    as each map has parameters) and two classes among the labels; with fewer it falls back to
    the identity with a warning.

    Source: Zadrozny and Elkan, "Obtaining calibrated probability estimates from decision trees
    and naive Bayesian classifiers", ICML 2001; one-vs-rest: Zadrozny and Elkan, "Transforming
    classifier scores into accurate multiclass probability estimates", KDD 2002.

    Args:
        n_bins: the number of equal-width bins ``B`` (``>= 1``; netcal's default 10).
        mode: ``"top_label"`` (default) or ``"one_vs_rest"``.
        floor: every probability is at least ``floor / (1 + C floor)`` (module docstring).

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [2.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
        >>> binning = HistogramBinning(n_bins=4).fit(z, torch.tensor([0, 0, 1, 1]))
        >>> binning.params["values"]  # confidence 0.88 in (0.75, 1]: 3 of 4 right; others empty
        tensor([[0.1250, 0.3750, 0.6250, 0.7500]], dtype=torch.float64)
        >>> binning(z).exp()
        tensor([[0.7500, 0.2500],
                [0.7500, 0.2500],
                [0.7500, 0.2500],
                [0.2500, 0.7500]])
    """

    method: ClassVar[str] = "histogram"

    def __init__(
        self, *, n_bins: int = 10, mode: Mode = "top_label", floor: float = DEFAULT_FLOOR
    ) -> None:
        super().__init__(mode=mode, floor=floor)
        self.n_bins = check_int(f"{type(self).__name__}: n_bins", n_bins, low=1)

    def min_samples(self, num_classes: int) -> int:
        """``n_bins`` samples: as many as each map has parameters."""
        return self.n_bins

    def _fit_maps(self, scores: Tensor, hits: Tensor) -> dict[str, Tensor]:
        rows, bins = scores.shape[0], self.n_bins
        offset = torch.arange(rows, device=scores.device)[:, None] * bins
        flat = (bin_index(scores, bins) + offset).reshape(-1)
        counts = torch.zeros(rows * bins, dtype=torch.float64, device=scores.device)
        counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.float64))
        positives = torch.zeros_like(counts).index_add_(0, flat, hits.reshape(-1))
        edges = bin_edges(bins, scores)
        midpoints = (0.5 * (edges[:-1] + edges[1:])).repeat(rows)
        values = torch.where(counts > 0, positives / counts.clamp_min(1.0), midpoints)
        return {"values": values.reshape(rows, bins)}

    def _apply_maps(self, scores: Tensor) -> Tensor:
        values = self.param("values", scores)
        if values.shape[1] != self.n_bins:
            raise ValueError(
                f"{self.name}: the fitted state has {values.shape[1]} bins, this calibrator "
                f"n_bins={self.n_bins}; build it with the n_bins it was fitted with"
            )
        return values.gather(1, bin_index(scores, self.n_bins))

    def extra_repr(self) -> str:
        """The number of bins, the mode and whether it is fitted."""
        return f"n_bins={self.n_bins}, {super().extra_repr()}"
