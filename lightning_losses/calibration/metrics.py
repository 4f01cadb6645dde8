"""Calibration metrics as torchmetrics ``Metric``s, for any LightningModule and for DDP.

The equal-width metrics keep three float64 sums per bin (``count``, ``conf_sum``,
``correct_sum``), reduced across processes with ``dist_reduce_fx="sum"``: memory is O(bins),
a DDP sync moves ``3 x n_bins`` numbers, and a reliability diagram is drawn from :meth:`bins`.
The adaptive (equal-mass) error needs the confidences themselves (O(N) memory, gathered with
``"cat"``). Brier, NLL, accuracy and mean confidence keep a float64 sum and a count.

Input forms, ``input_format``, ``task`` and ``ignore_index`` are those of
:mod:`lightning_losses.calibration.functional`: with ``ignore_index`` (default ``None``, keep
everything) each ``update`` drops the samples (multi-label: the single labels) whose target
equals it before anything else, so they count nowhere, and the result is that of the functions
on the concatenated kept samples whatever the batching. Updates whose samples are all ignored
add nothing; a metric that has seen no kept sample computes NaN.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from lightning_losses.calibration import bootstrap as BS
from lightning_losses.calibration import debiased as DB
from lightning_losses.calibration import functional as CF
from lightning_losses.calibration import smooth as SM
from lightning_losses.calibration.functional import InputFormat, Norm, Task
from lightning_losses.functional.checks import check_flag

__all__ = [
    "Accuracy",
    "AdaptiveCalibrationError",
    "BrierScore",
    "CalibrationError",
    "CalibrationSummary",
    "ClasswiseCalibrationError",
    "MeanConfidence",
    "NegativeLogLikelihood",
]


class _CalibrationMetric(Metric):
    """Argument checks shared by every metric here (scalars at construction, tensors per update)."""

    is_differentiable = False
    higher_is_better: bool | None = False
    full_state_update = False

    def __init__(
        self,
        *,
        num_classes: int | None,
        input_format: InputFormat,
        task: Task | None,
        validate_args: bool,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        CF.check_choice("input_format", input_format, CF.INPUT_FORMATS)
        if task is not None:
            CF.check_choice("task", task, CF.TASKS)
        if ignore_index is not None:
            CF.check_ignore_index(ignore_index)
        if num_classes is not None and (
            isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
        ):
            raise ValueError(f"num_classes must be None or an int >= 1; got {num_classes!r}")
        self.num_classes = num_classes
        self.input_format = input_format
        self.task = task
        self.validate_args = validate_args
        self.ignore_index = ignore_index

    def _resolve(self, preds: Tensor, target: Tensor) -> str:
        """Task of this batch; checks ``num_classes`` against ``[N, C]`` or ``[N, C, *]`` preds."""
        task = CF.resolve_task(preds, target, self.task)
        if self.num_classes is not None and preds.dim() >= 2 and preds.shape[1] != self.num_classes:
            raise ValueError(
                f"preds has {preds.shape[1]} columns but the metric was built with "
                f"num_classes={self.num_classes}"
            )
        return task

    def _options(self, task: str) -> dict[str, Any]:
        return {
            "input_format": self.input_format,
            "task": task,
            "validate_args": self.validate_args,
            "ignore_index": self.ignore_index,
        }

    def _synced(self, read: Any) -> Any:
        """``read()`` on the states synced across processes (as in ``compute``), then restored."""
        if self._is_synced:
            return read()
        with self.sync_context(
            dist_sync_fn=self.dist_sync_fn,
            should_sync=self._to_sync,
            should_unsync=self._should_unsync,
        ):
            return read()


class _EqualWidthMetric(_CalibrationMetric):
    """States ``count``, ``conf_sum``, ``correct_sum``: float64 ``[n_bins]`` sums, DDP-summed."""

    # The states (add_state), declared for type checkers, which otherwise read them through
    # nn.Module.__getattr__ as ``Tensor | Module``.
    count: Tensor
    conf_sum: Tensor
    correct_sum: Tensor

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
        for name in ("count", "conf_sum", "correct_sum"):
            zeros = torch.zeros(n_bins, dtype=torch.float64)
            self.add_state(name, default=zeros, dist_reduce_fx="sum")

    def _add_bins(self, confidence: Tensor, correct: Tensor) -> None:
        count, conf_sum, correct_sum = CF.binned_statistics(confidence, correct, self.n_bins)
        # In place: a state assignment goes through two __setattr__ layers (nn.Module's and
        # torchmetrics'), a large part of an update's time on a small batch.
        self.count.add_(count)
        self.conf_sum.add_(conf_sum)
        self.correct_sum.add_(correct_sum)

    def _bins(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.count.clone(), self.conf_sum.clone(), self.correct_sum.clone()

    def bins(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(count, conf_sum, correct_sum)``: float64 ``[n_bins]`` copies, synced under DDP.

        Per bin ``b`` (``(b/B, (b+1)/B]``): mean confidence ``conf_sum / count``, accuracy
        ``correct_sum / count``; what a reliability diagram draws.
        """
        return self._synced(self._bins)


class CalibrationError(_EqualWidthMetric):
    """Top-label calibration error with equal-width bins: ECE (``"l1"``), MCE, RMSCE.

    ``ECE = sum_b (n_b / N) |acc_b - conf_b|``, ``MCE = max_b |acc_b - conf_b|``, ``RMSCE =
    sqrt(sum_b (n_b / N) (acc_b - conf_b)^2)`` over bins ``(k/B, (k+1)/B]`` (0 in the first);
    ``norm="mean"`` weights every non-empty bin alike (netcal's ``ACE``). Multiclass: top label;
    binary ``[N]`` preds: the positive-class probability against ``y``; multi-label: every label
    as binary, pooled. Sources: Naeini et al., AAAI 2015; Guo et al., ICML 2017.

    States (float64, ``dist_reduce_fx="sum"``): ``count``, ``conf_sum``, ``correct_sum``, each
    ``[n_bins]``; :meth:`bins` returns them synced across processes.

    Args:
        num_classes: if given, ``[N, C]`` preds must have ``C == num_classes`` columns.
        n_bins: number of equal-width bins.
        norm: ``"l1"``, ``"max"``, ``"l2"`` or ``"mean"``.
        input_format: ``"probs"`` or ``"logits"``.
        task: ``None`` (inferred from shapes per batch), ``"multiclass"``, ``"binary"``,
            ``"multilabel"``.
        validate_args: check target values, that probabilities lie in [0, 1] with multiclass
            rows summing to 1 and that logits are finite (as the functions do).
        ignore_index: target value whose samples (multi-label: labels) each update leaves
            out, as in torchmetrics; ``None`` keeps all. Must be an int.
        kwargs: passed to ``torchmetrics.Metric``.

    Example:
        >>> metric = CalibrationError(n_bins=3)
        >>> metric.update(torch.tensor([[0.25, 0.20, 0.55], [0.55, 0.05, 0.40]]),
        ...               torch.tensor([0, 1]))
        >>> metric.update(torch.tensor([[0.10, 0.30, 0.60], [0.90, 0.05, 0.05]]),
        ...               torch.tensor([2, 0]))
        >>> metric.compute()
        tensor(0.2000, dtype=torch.float64)
        >>> metric.bins()[0]
        tensor([0., 3., 1.], dtype=torch.float64)
        >>> padded = CalibrationError(n_bins=3, ignore_index=-100)
        >>> padded.update(torch.tensor([[0.25, 0.20, 0.55], [0.55, 0.05, 0.40],
        ...                             [0.10, 0.30, 0.60], [0.90, 0.05, 0.05],
        ...                             [0.50, 0.25, 0.25]]), torch.tensor([0, 1, 2, 0, -100]))
        >>> padded.compute()
        tensor(0.2000, dtype=torch.float64)
    """

    def __init__(
        self,
        num_classes: int | None = None,
        n_bins: int = 15,
        norm: Norm = "l1",
        input_format: InputFormat = "probs",
        task: Task | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            num_classes, n_bins, input_format, task, validate_args, ignore_index, **kwargs
        )
        CF.check_choice("norm", norm, CF.NORMS)
        self.norm = norm

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch to the bin sums."""
        task = self._resolve(preds, target)
        confidence, correct = CF.confidence_and_correct(preds, target, **self._options(task))
        self._add_bins(confidence, correct)

    def compute(self) -> Tensor:
        """The calibration error of everything seen (synced across processes)."""
        return CF.calibration_error_from_bins(
            self.count, self.conf_sum, self.correct_sum, self.norm
        )


class AdaptiveCalibrationError(_CalibrationMetric):
    """Adaptive (equal-mass) calibration error: ECE over bins of equal sample counts.

    ``sum_b |conf_sum_b - correct_sum_b| / N`` with the sorted confidences split into ``B`` bins
    whose counts differ by at most one (see
    :func:`~lightning_losses.calibration.functional.equal_mass_binned_statistics`). Sources:
    Nixon et al., CVPR-W 2019; Mukhoti et al., NeurIPS 2020.

    Unlike the equal-width metrics, the bin edges depend on all the data, so this metric **keeps
    every confidence and correctness** (list states ``confidence`` and ``correct``, float64,
    ``dist_reduce_fx="cat"``): O(N) memory, and a DDP sync gathers all of them.

    Args: as :class:`CalibrationError`.

    Example:
        >>> metric = AdaptiveCalibrationError(n_bins=2)
        >>> metric.update(torch.tensor([0.9, 0.1]), torch.tensor([1, 0]))
        >>> metric.update(torch.tensor([0.8, 0.2]), torch.tensor([0, 1]))
        >>> metric.compute()
        tensor(0.3500, dtype=torch.float64)
    """

    # The states: lists of batches (one tensor while synced, see _bins).
    confidence: list[Tensor]
    correct: list[Tensor]

    def __init__(
        self,
        num_classes: int | None = None,
        n_bins: int = 15,
        norm: Norm = "l1",
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
        CF.check_choice("norm", norm, CF.NORMS)
        self.n_bins = n_bins
        self.norm = norm
        self.add_state("confidence", default=[], dist_reduce_fx="cat")
        self.add_state("correct", default=[], dist_reduce_fx="cat")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Store the batch's confidences and correctness."""
        task = self._resolve(preds, target)
        confidence, correct = CF.confidence_and_correct(preds, target, **self._options(task))
        self.confidence.append(confidence.to(torch.float64))
        self.correct.append(correct)

    def _bins(self) -> tuple[Tensor, Tensor, Tensor]:
        if isinstance(self.confidence, list) and not self.confidence:
            empty = torch.zeros(0, dtype=torch.float64, device=self.device)
            return CF.equal_mass_binned_statistics(empty, empty, self.n_bins)
        confidence, correct = dim_zero_cat(self.confidence), dim_zero_cat(self.correct)
        return CF.equal_mass_binned_statistics(confidence, correct, self.n_bins)

    def compute(self) -> Tensor:
        """The adaptive calibration error of everything seen (synced across processes)."""
        return CF.calibration_error_from_bins(*self._bins(), self.norm)

    def bins(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(count, conf_sum, correct_sum)`` of the equal-mass bins, float64, synced under DDP."""
        return self._synced(self._bins)


class ClasswiseCalibrationError(_CalibrationMetric):
    """Classwise ECE: equal-width calibration error of each class's probability, class-averaged.

    ``cwECE = (1/C) sum_c sum_b (n_{c,b} / N) |mean_{i in b} p_{i,c} - mean_{i in b} 1[y_i=c]|``
    (Kull et al., NeurIPS 2019). Multi-label: one class per label; binary ``[N]`` preds: two
    classes (``1 - p`` and ``p``), so ``num_classes=2``.

    States (float64, ``dist_reduce_fx="sum"``): ``count``, ``conf_sum``, ``correct_sum``, each
    ``[num_classes, n_bins]``.

    ``n_bins``, ``norm``, ``input_format``, ``task``, ``validate_args``, ``ignore_index`` and
    ``kwargs`` are as in :class:`CalibrationError`; a multi-label entry equal to
    ``ignore_index`` leaves out that label of that sample only.

    Args:
        num_classes: ``C`` (multiclass), ``K`` (multi-label) or 2 (binary); required.

    Example:
        >>> metric = ClasswiseCalibrationError(num_classes=2, n_bins=2)
        >>> metric.update(torch.tensor([[0.8, 0.2], [0.4, 0.6]]), torch.tensor([0, 0]))
        >>> metric.compute()
        tensor(0.4000, dtype=torch.float64)
    """

    # The states, float64 [num_classes, n_bins].
    count: Tensor
    conf_sum: Tensor
    correct_sum: Tensor

    def __init__(
        self,
        num_classes: int,
        n_bins: int = 15,
        norm: Norm = "l1",
        input_format: InputFormat = "probs",
        task: Task | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        if num_classes is None:
            raise ValueError("num_classes is required by ClasswiseCalibrationError")
        super().__init__(
            num_classes=num_classes,
            input_format=input_format,
            task=task,
            validate_args=validate_args,
            ignore_index=ignore_index,
            **kwargs,
        )
        CF.check_n_bins(n_bins)
        CF.check_choice("norm", norm, CF.NORMS)
        self.n_bins = n_bins
        self.norm = norm
        for name in ("count", "conf_sum", "correct_sum"):
            zeros = torch.zeros(num_classes, n_bins, dtype=torch.float64)
            self.add_state(name, default=zeros, dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch to the per-class bin sums."""
        task = self._resolve(preds, target)
        if task == "binary" and self.num_classes != 2:
            raise ValueError(
                f"binary preds [N] make two classes (1 - p and p): num_classes must be 2; "
                f"got {self.num_classes}"
            )
        probs, labels, keep = CF._classwise_inputs(
            preds, target, task, self.input_format, self.validate_args, self.ignore_index
        )
        count, conf_sum, correct_sum = CF._classwise_sums(probs, labels, self.n_bins, keep)
        self.count += count
        self.conf_sum += conf_sum
        self.correct_sum += correct_sum

    def compute(self) -> Tensor:
        """The mean over classes of each class's calibration error (synced across processes)."""
        per_class = CF.calibration_error_from_bins(
            self.count, self.conf_sum, self.correct_sum, self.norm
        )
        return per_class.mean()

    def bins(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(count, conf_sum, correct_sum)``, float64 ``[num_classes, n_bins]``, synced."""
        return self._synced(
            lambda: (self.count.clone(), self.conf_sum.clone(), self.correct_sum.clone())
        )


class _MeanMetric(_CalibrationMetric):
    """A float64 mean of per-sample (or per-label) terms: states ``score_sum`` and ``count``.

    Subclasses name their per-term function, ``terms(preds, target, task, input_format)``.
    """

    # The states, float64 scalars.
    score_sum: Tensor
    count: Tensor

    @staticmethod
    @abstractmethod
    def terms(preds: Tensor, target: Tensor, task: str, input_format: str) -> Tensor:
        """The per-sample (or per-label) terms whose mean is the metric (each subclass's own)."""

    def __init__(
        self,
        num_classes: int | None = None,
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
        zero = torch.zeros((), dtype=torch.float64)
        self.add_state("score_sum", default=zero.clone(), dist_reduce_fx="sum")
        self.add_state("count", default=zero.clone(), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch's terms to the sum and their number to the count."""
        task = self._resolve(preds, target)
        preds, target, task = CF._prepare(
            preds,
            target,
            task,
            self.input_format,
            self.validate_args,
            ignore_index=self.ignore_index,
        )
        terms = type(self).terms(preds, target, task, self.input_format)
        self.score_sum += terms.sum()
        self.count += terms.numel()

    def compute(self) -> Tensor:
        """The mean of every term seen (synced across processes); NaN before any sample."""
        return self.score_sum / self.count


class BrierScore(_MeanMetric):
    """Brier score: ``mean_i sum_c (p_ic - 1[y_i = c])^2`` (binary: ``mean (p - y)^2``).

    Multi-label: the binary score over all labels. States: ``score_sum``, ``count`` (float64,
    summed across processes). Source: Brier, Monthly Weather Review 1950.

    ``input_format``, ``task``, ``validate_args``, ``ignore_index`` and ``kwargs`` are as in
    :class:`CalibrationError`.

    Args:
        num_classes: if given, ``[N, C]`` preds must have ``C == num_classes`` columns.

    Example:
        >>> metric = BrierScore()
        >>> metric.update(torch.tensor([[0.8, 0.2], [0.4, 0.6]]), torch.tensor([0, 0]))
        >>> metric.compute()
        tensor(0.4000, dtype=torch.float64)
    """

    terms = staticmethod(CF._brier_terms)


class NegativeLogLikelihood(_MeanMetric):
    """Mean negative log-likelihood: ``mean_i -log p_{i, y_i}`` (binary/multi-label: BCE).

    From ``log_softmax`` for logits and ``log p`` for probabilities, in float64. States:
    ``score_sum``, ``count``.

    Args: as :class:`BrierScore`.

    Example:
        >>> metric = NegativeLogLikelihood(input_format="logits")
        >>> metric.update(torch.tensor([[0.0, 0.0], [2.0, 0.0]]), torch.tensor([0, 1]))
        >>> metric.compute()
        tensor(1.4100, dtype=torch.float64)
    """

    terms = staticmethod(CF.nll_terms)


class Accuracy(_MeanMetric):
    """Top-label accuracy ``mean_i 1[argmax_c p_ic = y_i]`` (binary labels: ``p > 0.5``).

    States: ``score_sum`` (number correct), ``count``.

    Args: as :class:`BrierScore`.

    Example:
        >>> metric = Accuracy()
        >>> metric.update(torch.tensor([[0.8, 0.2], [0.4, 0.6]]), torch.tensor([0, 0]))
        >>> metric.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    higher_is_better = True

    terms = staticmethod(CF._accuracy_terms)


class MeanConfidence(_MeanMetric):
    """Mean top-label confidence ``mean_i max_c p_ic`` (binary labels: ``max(p, 1 - p)``).

    States: ``score_sum``, ``count``.

    Args: as :class:`BrierScore`.

    Example:
        >>> metric = MeanConfidence()
        >>> metric.update(torch.tensor([[0.8, 0.2], [0.4, 0.6]]), torch.tensor([0, 0]))
        >>> metric.compute()
        tensor(0.7000, dtype=torch.float64)
    """

    higher_is_better = None

    terms = staticmethod(CF._confidence_terms)


class CalibrationSummary(_EqualWidthMetric):
    """Every equal-width calibration number of a stream in one metric, one pass per batch.

    :meth:`compute` returns a dict: ``ece``, ``mce``, ``rmsce`` (as :class:`CalibrationError`
    with ``norm`` ``"l1"``, ``"max"``, ``"l2"``), ``brier`` (:class:`BrierScore`), ``nll``
    (:class:`NegativeLogLikelihood`), ``accuracy`` (:class:`Accuracy`) and ``confidence``
    (:class:`MeanConfidence`), each equal to what that metric gives on the same data. One
    ``update`` resolves and checks the batch once, bins its top-label confidences, and takes
    the Brier and NLL terms from a single float64 log-softmax (for logits): this is what
    :class:`~lightning_losses.callbacks.CalibrationMonitor` runs on every validation batch.

    States (float64, ``dist_reduce_fx="sum"``): ``count``, ``conf_sum``, ``correct_sum``
    (``[n_bins]``, also :meth:`bins`), and the scalars ``brier_sum``, ``nll_sum``,
    ``top_correct``, ``top_confidence``; the number of terms (per sample, or per label for
    binary and multi-label inputs) is ``count.sum()``, one binned pair per term. A DDP sync
    moves ``3 n_bins + 4`` numbers.

    With ``smooth=True`` it also keeps the grid of
    :class:`SmoothCalibrationError` (states ``mass`` and
    ``residual``, float64 ``[GRID_SIZE + 1]``, from the same binned pairs) and ``compute`` adds
    ``smooth_ece``, the smooth ECE of Błasiok and Nakkiran at its automatic bandwidth, equal to
    that metric's value on the same data.

    With ``debiased=True`` ``compute`` adds ``ece_debiased`` and ``rmsce_debiased``, the
    debiased errors of Kumar, Liang and Ma (``norm="l1"`` and ``"l2"`` of
    :func:`~lightning_losses.calibration.debiased.debiased_calibration_error`), from the same
    bins (no extra state). With ``intervals=True`` it adds ``<name>_low`` and ``<name>_high``
    at ``level`` for ``ece`` (the interval of
    :func:`~lightning_losses.calibration.intervals.calibration_error_interval`), ``brier``,
    ``nll``, ``accuracy`` (percentile intervals of the replicates' means) and, with
    ``smooth=True``, ``smooth_ece`` (basic bootstrap on a coarse grid), from ``n_bootstrap``
    Poisson-bootstrap replicates whose weights depend only on ``(seed, sample position)``
    (:mod:`lightning_losses.calibration.bootstrap`). Its extra states are float64 sums per
    group of samples: ``boot_bins`` ``[n_groups, n_bins, 3]``, ``boot_scores`` ``[n_groups,
    3]`` and, with ``smooth``, ``boot_grid`` ``[n_groups, 257, 2]``, plus the row counter
    ``boot_seen``; none grows with ``N``. ``update`` then takes the samples' positions
    (``index``); see :meth:`update`.

    ``input_format``, ``task``, ``validate_args``, ``ignore_index`` and ``kwargs`` are as in
    :class:`CalibrationError`.

    Args:
        num_classes: if given, ``[N, C]`` preds must have ``C == num_classes`` columns.
        n_bins: number of equal-width bins.
        smooth: also compute the smooth ECE (``smooth_ece``; O(grid) state).
        intervals: also compute bootstrap intervals (``<name>_low``, ``<name>_high``).
        debiased: also compute ``ece_debiased`` and ``rmsce_debiased``.
        level: confidence level of the intervals, in (0, 1).
        n_bootstrap: bootstrap replicates (at least 2).
        seed: the replicates' seed.
        n_groups: groups the samples are hashed into (the bootstrap's units).

    Example:
        >>> metric = CalibrationSummary(n_bins=3)
        >>> metric.update(torch.tensor([[0.25, 0.20, 0.55], [0.55, 0.05, 0.40]]),
        ...               torch.tensor([0, 1]))
        >>> metric.update(torch.tensor([[0.10, 0.30, 0.60], [0.90, 0.05, 0.05]]),
        ...               torch.tensor([2, 0]))
        >>> values = metric.compute()
        >>> sorted(values)
        ['accuracy', 'brier', 'confidence', 'ece', 'mce', 'nll', 'rmsce']
        >>> [round(float(values[name]), 4) for name in ("ece", "accuracy", "confidence")]
        [0.2, 0.5, 0.65]
    """

    higher_is_better = None

    # The states, float64: scalar sums, and with ``smooth`` the [GRID_SIZE + 1] grid.
    brier_sum: Tensor
    nll_sum: Tensor
    top_correct: Tensor
    top_confidence: Tensor
    mass: Tensor
    residual: Tensor

    def __init__(
        self,
        num_classes: int | None = None,
        n_bins: int = 15,
        input_format: InputFormat = "probs",
        task: Task | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        smooth: bool = False,
        intervals: bool = False,
        debiased: bool = False,
        level: float = 0.95,
        n_bootstrap: int = BS.DEFAULT_N_BOOTSTRAP,
        seed: int = 0,
        n_groups: int = BS.DEFAULT_N_GROUPS,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            num_classes, n_bins, input_format, task, validate_args, ignore_index, **kwargs
        )
        check_flag("smooth", smooth)
        check_flag("intervals", intervals)
        check_flag("debiased", debiased)
        self.smooth = smooth
        self.intervals = intervals
        self.debiased = debiased
        self.level = BS.check_level(level)
        self.n_bootstrap = BS.check_n_bootstrap(n_bootstrap)
        self.seed = BS.check_seed(seed)
        self.n_groups = BS.check_n_groups(n_groups)
        if intervals:
            BS.add_states(self, n_bins=n_bins, n_groups=self.n_groups, scores=True, smooth=smooth)
        zero = torch.zeros((), dtype=torch.float64)
        for name in ("brier_sum", "nll_sum", "top_correct", "top_confidence"):
            self.add_state(name, default=zero.clone(), dist_reduce_fx="sum")
        if smooth:
            for name in ("mass", "residual"):
                grid = torch.zeros(SM.GRID_SIZE + 1, dtype=torch.float64)
                self.add_state(name, default=grid, dist_reduce_fx="sum")

    @property
    def full_state_update(self) -> bool:  # type: ignore[override]  # a class attribute in Metric
        """With intervals, ``forward`` updates the full state first: positions run on."""
        return bool(getattr(self, "intervals", False))

    def update(self, preds: Tensor, target: Tensor, index: Tensor | None = None) -> None:
        """Add a batch: its bin sums, Brier and NLL terms, top-label hits and confidences.

        ``index`` (used with ``intervals=True`` only): int ``[N]``, the samples' positions in
        the data set. ``None``: row ``i`` of this batch is at ``rank + world_size * (rows seen
        before + i)``, the positions of ``UnpaddedDistributedSampler`` (or of one process
        reading the data set in order), so the intervals are the same over any batching and
        any number of processes when each row is one sample of such a loader; other loaders
        (shuffled, split otherwise) give rank-dependent intervals unless they pass ``index``.
        """
        task = self._resolve(preds, target)
        original_target = target
        preds, target, task = CF._prepare(
            preds,
            target,
            task,
            self.input_format,
            self.validate_args,
            ignore_index=self.ignore_index,
        )
        # A multi-label batch with ignored labels comes back as its kept 1-D decisions.
        pooled = "binary" if task == "multilabel" and preds.dim() == 1 else task
        confidence, correct = CF.confidence_and_correct(
            preds, target, input_format=self.input_format, task=pooled, validate_args=False
        )
        self._add_bins(confidence, correct)
        if self.smooth:
            mass, residual = SM.smooth_grid_statistics(confidence, correct)
            self.mass.add_(mass)
            self.residual.add_(residual)
        brier, nll = CF._proper_terms(preds, target, task, self.input_format)
        self.brier_sum.add_(brier.sum())
        self.nll_sum.add_(nll.sum())
        if task == "multiclass":  # the binned pairs are the top-label ones
            top_confidence, top_correct = confidence, correct
        else:  # bins hold the positive class; accuracy and confidence use the decision
            top_confidence, top_correct = CF._top_label_terms(
                preds, target, task, self.input_format
            )
        self.top_correct.add_(top_correct.sum())
        self.top_confidence.add_(top_confidence.sum(dtype=torch.float64))
        if self.intervals:
            groups = BS.decision_groups(
                self,
                original_target,
                index,
                self.ignore_index,
                seed=self.seed,
                n_groups=self.n_groups,
            )
            scores = torch.stack([brier, nll, top_correct.to(torch.float64)], dim=1)
            BS.add_batch(self, groups, confidence, correct, n_bins=self.n_bins, scores=scores)

    def compute(self) -> dict[str, Tensor]:
        """The summary of everything seen, synced across processes.

        ``{ece, mce, rmsce, brier, nll, accuracy, confidence}``, and ``smooth_ece`` with
        ``smooth=True`` (more with ``debiased`` and ``intervals``, see the class).
        """
        return self._values()

    def compute_with_bins(self) -> tuple[dict[str, Tensor], tuple[Tensor, Tensor, Tensor]]:
        """:meth:`compute` and :meth:`bins` from one sync across processes."""
        return self._synced(lambda: (self._values(), self._bins()))

    def compute_with_state(
        self,
    ) -> tuple[dict[str, Tensor], tuple[Tensor, Tensor, Tensor], tuple[Tensor, Tensor] | None]:
        """:meth:`compute`, :meth:`bins` and :meth:`grid` from one sync across processes."""
        return self._synced(lambda: (self._values(), self._bins(), self._grid()))

    def _grid(self) -> tuple[Tensor, Tensor] | None:
        return (self.mass.clone(), self.residual.clone()) if self.smooth else None

    def grid(self) -> tuple[Tensor, Tensor] | None:
        """``(mass, residual)`` of the smooth ECE, synced under DDP; ``None`` unless ``smooth``.

        What :func:`~lightning_losses.calibration.smooth_diagram.smooth_reliability_diagram`
        draws.
        """
        return self._synced(self._grid)

    def _values(self) -> dict[str, Tensor]:
        bins = (self.count, self.conf_sum, self.correct_sum)
        terms = self.count.sum()  # one binned (confidence, correct) pair per term
        values = {
            "ece": CF.calibration_error_from_bins(*bins, "l1"),
            "mce": CF.calibration_error_from_bins(*bins, "max"),
            "rmsce": CF.calibration_error_from_bins(*bins, "l2"),
            "brier": self.brier_sum / terms,
            "nll": self.nll_sum / terms,
            "accuracy": self.top_correct / terms,
            "confidence": self.top_confidence / terms,
        }
        if self.smooth:
            values["smooth_ece"] = SM.smooth_calibration_error_from_grid(self.mass, self.residual)
        if self.debiased:
            values["ece_debiased"] = DB.debiased_calibration_error_from_bins(*bins, "l1")
            values["rmsce_debiased"] = DB.debiased_calibration_error_from_bins(*bins, "l2")
        if self.intervals:
            values.update(
                BS.interval_values(
                    self,
                    bins,
                    level=self.level,
                    n_bootstrap=self.n_bootstrap,
                    seed=self.seed,
                    smooth_estimate=values.get("smooth_ece"),
                )
            )
        return values


class SmoothCalibrationError(_CalibrationMetric):
    """Smooth ECE (smECE) as a torchmetrics ``Metric``: O(grid) state, DDP-summed.

    ``smECE_σ = ∫ |r_σ(t)| δ_σ(t) dt / ∫ δ_σ(t) dt`` with the kernel-smoothed residual ``r_σ``
    and kernel density ``δ_σ`` of the confidences (reflected Gaussian kernel), at the
    automatic bandwidth ``σ*`` solving ``smECE_σ* = σ*`` unless ``bandwidth`` fixes ``σ``
    (definitions in :mod:`lightning_losses.calibration.smooth`). Source: Błasiok and Nakkiran,
    "Smooth ECE: Principled Reliability Diagrams via Kernel Smoothing", ICLR 2024.

    States (float64 ``[GRID_SIZE + 1]``, ``dist_reduce_fx="sum"``): ``mass`` and ``residual``,
    each sample's mass and residual (confidence minus correctness) split linearly between its
    two nearest grid nodes; :meth:`grid` returns them synced across processes, :meth:`curve`
    the smoothed reliability diagram.

    Args:
        num_classes: if given, ``[N, C]`` preds must have ``C == num_classes`` columns.
        bandwidth: ``None`` (automatic ``σ*``) or a fixed ``σ >= 0.001``.
        input_format: ``"probs"`` or ``"logits"``.
        task: ``None`` (inferred from shapes per batch), ``"multiclass"``, ``"binary"``,
            ``"multilabel"``.
        validate_args: check target values, that probabilities lie in [0, 1] with multiclass
            rows summing to 1 and that logits are finite.
        ignore_index: target value whose samples (multi-label: decisions) are left out;
            ``None`` keeps every sample.
        kwargs: passed to ``torchmetrics.Metric``.

    Example:
        >>> metric = SmoothCalibrationError()
        >>> metric.update(torch.tensor([[0.9, 0.1], [0.2, 0.8]]), torch.tensor([0, 0]))
        >>> metric.update(torch.tensor([[0.3, 0.7], [0.6, 0.4]]), torch.tensor([1, 1]))
        >>> round(metric.compute().item(), 4)
        0.2498
        >>> curve = metric.curve()
        >>> round(curve.value, 4), curve.bandwidth
        (0.2498, 0.25)
    """

    # The states, float64 [GRID_SIZE + 1].
    mass: Tensor
    residual: Tensor

    def __init__(
        self,
        num_classes: int | None = None,
        bandwidth: float | None = None,
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
        self.bandwidth = SM.check_bandwidth(bandwidth)
        for name in ("mass", "residual"):
            zeros = torch.zeros(SM.GRID_SIZE + 1, dtype=torch.float64)
            self.add_state(name, default=zeros, dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch's mass and residual to the grid."""
        task = self._resolve(preds, target)
        confidence, correct = CF.confidence_and_correct(preds, target, **self._options(task))
        mass, residual = SM.smooth_grid_statistics(confidence, correct)
        self.mass.add_(mass)
        self.residual.add_(residual)

    def compute(self) -> Tensor:
        """The smECE of everything seen (synced across processes); NaN before any sample."""
        return SM.smooth_calibration_error_from_grid(
            self.mass, self.residual, bandwidth=self.bandwidth
        )

    def grid(self) -> tuple[Tensor, Tensor]:
        """``(mass, residual)``: float64 ``[GRID_SIZE + 1]`` copies, synced under DDP."""
        return self._synced(lambda: (self.mass.clone(), self.residual.clone()))

    def curve(self) -> SM.SmoothReliabilityCurve:
        """The smoothed reliability diagram (see :func:`smooth_reliability_curve`), synced."""
        return SM.smooth_reliability_curve(*self.grid(), bandwidth=self.bandwidth)


class DebiasedCalibrationError(_EqualWidthMetric):
    """Debiased top-label calibration error of Kumar, Liang and Ma as a torchmetrics ``Metric``.

    The value of :func:`~lightning_losses.calibration.debiased.debiased_calibration_error` on
    everything seen, from the states of :class:`~lightning_losses.calibration.CalibrationError`
    (float64 ``count``, ``conf_sum``, ``correct_sum`` per bin, ``dist_reduce_fx="sum"``):
    O(bins) memory, the same value over any batching and any number of processes. Source:
    Kumar, Liang and Ma, "Verified Uncertainty Calibration", NeurIPS 2019.

    Args:
        num_classes: if given, ``[N, C]`` preds must have ``C == num_classes`` columns.
        n_bins: number of equal-width bins.
        norm: ``"l2"`` (default) or ``"l1"``.
        input_format: ``"probs"`` or ``"logits"``.
        task: ``None`` (inferred per batch), ``"multiclass"``, ``"binary"``, ``"multilabel"``.
        validate_args: check values as the functions do.
        ignore_index: target value whose samples (multi-label: labels) are left out.
        kwargs: passed to ``torchmetrics.Metric``.

    Example:
        >>> generator = torch.Generator().manual_seed(0)
        >>> logits = 3 * torch.randn(1000, 5, generator=generator)
        >>> target = torch.randint(0, 5, (1000,), generator=generator)
        >>> metric = DebiasedCalibrationError(input_format="logits")
        >>> for rows in torch.arange(1000).split(300):
        ...     metric.update(logits[rows], target[rows])
        >>> torch.allclose(metric.compute(), DB.debiased_calibration_error(
        ...     logits, target, input_format="logits"))
        True
    """

    def __init__(
        self,
        num_classes: int | None = None,
        n_bins: int = 15,
        norm: DB.DebiasedNorm = "l2",
        input_format: InputFormat = "probs",
        task: Task | None = None,
        validate_args: bool = True,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            num_classes, n_bins, input_format, task, validate_args, ignore_index, **kwargs
        )
        CF.check_choice("norm", norm, DB.DEBIASED_NORMS)
        self.norm = norm

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch to the bin sums."""
        task = self._resolve(preds, target)
        confidence, correct = CF.confidence_and_correct(preds, target, **self._options(task))
        self._add_bins(confidence, correct)

    def compute(self) -> Tensor:
        """The debiased calibration error of everything seen (synced across processes)."""
        return DB.debiased_calibration_error_from_bins(
            self.count, self.conf_sum, self.correct_sum, self.norm
        )
