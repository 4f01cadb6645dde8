"""Confidence intervals of the binned ECE, the same over any batching and any number of ranks.

The replicates are those of :mod:`lightning_losses.calibration.bootstrap`: a Poisson bootstrap
whose weights are a function of ``(seed, sample position)`` only, kept as per-group bin sums
(state ``[n_groups, n_bins, 3]``, independent of ``N``). For a ``level`` and ``a = (1 -
level) / 2``, with ``ECE = sum_k p_k |g_k|`` (bin shares ``p_k``, gaps ``g_k = conf_k -
acc_k``), replicate bins ``p*_k``, ``g*_k`` and replicate errors ``ECE* = sum_k p*_k |g*_k|``:

- low end: ``max(0, ECE - q_{1-a}(sum_k p*_k |g*_k - g_k|))``: the basic bootstrap of a world
  in which every bin is calibrated, where the upward bias of ``|g_k|`` is largest;
- high end: ``ECE + mean(ECE*) - q_a(ECE*)``: the replicates' spread below their mean, with no
  bias correction (the plug-in's bias is never negative in expectation).

Why not a percentile interval: the binned ECE is biased upward (a calibrated model of 400
samples shows about 0.04), its replicates more so, and a percentile interval of them rarely
covers a small population ECE at all. ``|g|`` has a kink at 0, so no bootstrap centred on the
data's own gaps gets the bias of bins whose true gap is near 0 right (Fang and Santos,
"Inference on Directionally Differentiable Functions", Review of Economic Studies 2019); the
two ends take the largest and the smallest bias instead. The interval is for the population
binned ECE (the ECE of these bins on infinitely many samples).

Coverage of the 95% interval (confidences ``c ~ Beta(4, 1.5)``, ``correct ~ Bernoulli(f(c))``,
15 bins, 200 replicates, 200 independent draws as in the test): calibrated ``f(c) = c``: 94.5%
at N = 400 and at N = 10,000; over-confident ``f(c) = c^1.6`` (population ECE 0.109): 99.0% and
97.0%. Where bin gaps are comparable to a bin's noise (small N, slightly miscalibrated models)
it is conservative, up to 100% (the docs' table, from ``benchmarks/calibration_intervals.py
--coverage``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from lightning_losses.calibration import bootstrap as BS
from lightning_losses.calibration import functional as CF
from lightning_losses.calibration.functional import InputFormat, Task
from lightning_losses.calibration.metrics import _EqualWidthMetric

__all__ = ["CalibrationErrorInterval", "calibration_error_interval"]


def calibration_error_interval(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    level: float = 0.95,
    n_bootstrap: int = BS.DEFAULT_N_BOOTSTRAP,
    seed: int = 0,
    n_groups: int = BS.DEFAULT_N_GROUPS,
    index: Tensor | None = None,
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The binned top-label ECE and its bootstrap confidence interval: ``(estimate, low, high)``.

    ``estimate`` is :func:`~lightning_losses.calibration.functional.calibration_error` (l1,
    equal-width bins); ``[low, high]`` the interval of the module doc at ``level``, from
    ``n_bootstrap`` Poisson-bootstrap replicates over ``n_groups`` hashed groups of samples
    (:mod:`lightning_losses.calibration.bootstrap`). The plain ECE is biased upward, so it may
    lie above ``high`` when the model is nearly calibrated; the debiased estimates are
    :func:`~lightning_losses.calibration.debiased.debiased_calibration_error`.

    Args:
        preds: ``[N, C]`` or dense ``[N, C, *]`` (multiclass), ``[N]`` (binary) or ``[N, K]``
            (multi-label) floats.
        target: ``[N]`` (dense: ``[N, *]``) class indices, or labels in {0, 1} of the shape of
            ``preds``.
        n_bins: number of equal-width bins.
        level: confidence level in (0, 1).
        n_bootstrap: replicates (at least 2).
        seed: the replicates' seed (an int in ``[0, 2**63)``).
        n_groups: groups the samples are hashed into (the bootstrap's units).
        index: int ``[N]``, the samples' positions in the data set; ``None``: ``0 .. N-1``.
        input_format: ``"probs"`` or ``"logits"``.
        task: ``None`` (inferred from shapes), ``"multiclass"``, ``"binary"``, ``"multilabel"``.
        validate_args: check values as ``calibration_error`` does.
        ignore_index: target value whose samples (multi-label: labels) are left out.

    Returns:
        Three float64 scalar tensors; NaN for no samples.

    Raises:
        ValueError: ``level`` outside (0, 1), ``n_bootstrap < 2``, a bad ``seed``, ``n_groups``
            or ``index``, and everything ``calibration_error`` rejects.

    Example:
        >>> generator = torch.Generator().manual_seed(0)
        >>> confidence = 0.5 + 0.5 * torch.rand(2000, generator=generator, dtype=torch.float64)
        >>> correct = torch.rand(2000, generator=generator, dtype=torch.float64) < confidence - 0.1
        >>> preds = torch.stack([confidence, 1 - confidence], dim=1)
        >>> estimate, low, high = calibration_error_interval(preds, (~correct).long())
        >>> bool(low <= 0.1 <= high), bool(low < estimate < high)
        (True, True)
    """
    CF.check_n_bins(n_bins)
    level = BS.check_level(level)
    n_bootstrap = BS.check_n_bootstrap(n_bootstrap)
    seed = BS.check_seed(seed)
    n_groups = BS.check_n_groups(n_groups)
    task = CF.resolve_task(preds, target, task)
    confidence, correct = CF.confidence_and_correct(
        preds,
        target,
        input_format=input_format,
        task=task,
        validate_args=validate_args,
        ignore_index=ignore_index,
    )
    if index is None:
        index = torch.arange(target.shape[0], device=target.device)
    state = SimpleNamespace(
        boot_bins=torch.zeros(n_groups, n_bins, 3, dtype=torch.float64, device=preds.device),
        boot_seen=torch.zeros((), dtype=torch.int64, device=preds.device),
    )
    groups = BS.decision_groups(state, target, index, ignore_index, seed=seed, n_groups=n_groups)
    BS.add_batch(state, groups, confidence, correct, n_bins=n_bins)
    bins = CF.binned_statistics(confidence, correct, n_bins)
    estimate = CF.calibration_error_from_bins(*bins, "l1")
    values = BS.interval_values(state, bins, level=level, n_bootstrap=n_bootstrap, seed=seed)
    return estimate, values["ece_low"], values["ece_high"]


class CalibrationErrorInterval(_EqualWidthMetric):
    """The binned top-label ECE with its bootstrap interval, as a torchmetrics ``Metric``.

    :meth:`compute` returns ``(estimate, low, high)``, the values of
    :func:`calibration_error_interval` on everything seen, whatever the batching and the
    number of processes, provided every sample keeps its position (see ``update``).

    States (float64, ``dist_reduce_fx="sum"``): ``count``, ``conf_sum``, ``correct_sum``
    (``[n_bins]``, as :class:`~lightning_losses.calibration.CalibrationError`), ``boot_bins``
    ``[n_groups, n_bins, 3]``, and the int64 row counter ``boot_seen``: the memory does not
    grow with ``N``; a DDP sync moves ``3 n_bins (n_groups + 1) + 1`` numbers.

    Args:
        num_classes: if given, ``[N, C]`` preds must have ``C == num_classes`` columns.
        n_bins: number of equal-width bins.
        level: confidence level in (0, 1).
        n_bootstrap: replicates (at least 2), drawn at ``compute``.
        seed: the replicates' seed.
        n_groups: groups the samples are hashed into.
        input_format: ``"probs"`` or ``"logits"``.
        task: ``None`` (inferred per batch), ``"multiclass"``, ``"binary"``, ``"multilabel"``.
        validate_args: check values as the functions do.
        ignore_index: target value whose samples (multi-label: labels) are left out.
        kwargs: passed to ``torchmetrics.Metric``.

    Example:
        >>> metric = CalibrationErrorInterval(n_bins=5)
        >>> preds = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.7, 0.3]])
        >>> metric.update(preds[:3], torch.tensor([0, 1, 1]))
        >>> metric.update(preds[3:], torch.tensor([0]))
        >>> estimate, low, high = metric.compute()
        >>> bool(torch.allclose(torch.stack([estimate, low, high]), torch.stack(
        ...     calibration_error_interval(preds, torch.tensor([0, 1, 1, 0]), n_bins=5))))
        True
    """

    # ``forward`` must not restart the sample positions: it updates the full state first.
    full_state_update = True

    def __init__(
        self,
        num_classes: int | None = None,
        n_bins: int = 15,
        level: float = 0.95,
        n_bootstrap: int = BS.DEFAULT_N_BOOTSTRAP,
        seed: int = 0,
        n_groups: int = BS.DEFAULT_N_GROUPS,
        input_format: InputFormat = "probs",
        task: Task | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            num_classes, n_bins, input_format, task, validate_args, ignore_index, **kwargs
        )
        self.level = BS.check_level(level)
        self.n_bootstrap = BS.check_n_bootstrap(n_bootstrap)
        self.seed = BS.check_seed(seed)
        self.n_groups = BS.check_n_groups(n_groups)
        BS.add_states(self, n_bins=n_bins, n_groups=self.n_groups)

    def update(self, preds: Tensor, target: Tensor, index: Tensor | None = None) -> None:
        """Add a batch.

        Args:
            preds: as :func:`calibration_error_interval`.
            target: as :func:`calibration_error_interval`.
            index: int ``[N]``, the samples' positions in the data set. ``None``: row ``i`` of
                this batch is at ``rank + world_size * (rows seen before + i)``, the
                positions of ``UnpaddedDistributedSampler`` (or of one process reading the
                data set in order); a loader that shuffles or splits otherwise gives an
                interval that depends on the split unless it passes ``index``.
        """
        task = self._resolve(preds, target)
        confidence, correct = CF.confidence_and_correct(preds, target, **self._options(task))
        self._add_bins(confidence, correct)
        groups = BS.decision_groups(
            self, target, index, self.ignore_index, seed=self.seed, n_groups=self.n_groups
        )
        BS.add_batch(self, groups, confidence, correct, n_bins=self.n_bins)

    def compute(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(estimate, low, high)`` of everything seen (synced across processes)."""
        bins = (self.count, self.conf_sum, self.correct_sum)
        estimate = CF.calibration_error_from_bins(*bins, "l1")
        values = BS.interval_values(
            self, bins, level=self.level, n_bootstrap=self.n_bootstrap, seed=self.seed
        )
        return estimate, values["ece_low"], values["ece_high"]
