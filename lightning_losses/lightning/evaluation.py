"""Per-task NLL and accuracy, and the float64 mean they are logged with."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric


def nll_terms(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Per-term negative log-likelihoods: one per sample, per task (nm) or per label."""
    if task == "multiclass":
        return F.cross_entropy(logits.float(), target, reduction="none")
    if task == "nm":
        return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), reduction="none")
    return F.binary_cross_entropy_with_logits(logits.float(), target.float(), reduction="none")


def correct_terms(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Per-term hits (bool): top-1 per sample, per task (nm), ``x > 0`` per label otherwise."""
    if task == "multiclass":
        return logits.argmax(dim=1) == target
    if task == "nm":
        return logits.argmax(dim=2) == target
    return (logits > 0) == (target > 0.5)


def task_nll(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Mean negative log-likelihood of the model's probabilities, whatever the loss trained it.

    Softmax cross-entropy for ``multiclass`` and ``nm`` (averaged over tasks), sigmoid binary
    cross-entropy for ``binary`` and ``multilabel`` (averaged over labels).
    """
    return nll_terms(logits, target, task).mean()


def task_accuracy(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Accuracy: top-1 (``multiclass``), per task (``nm``), per label with ``x > 0`` otherwise."""
    return correct_terms(logits, target, task).float().mean()


class MeanOfTerms(Metric):
    """The mean of every term seen, kept as a float64 sum and count summed across processes.

    ``update(values, weight)`` adds ``weight * values.sum()`` to the total and ``weight *
    values.numel()`` to the count; ``compute()`` is ``total / count``. Both states reduce with
    ``dist_reduce_fx="sum"``, so under DDP the value is the mean over the terms of every process,
    however many each holds (a mean of per-process means is not, when the counts differ).

    Example:
        >>> mean = MeanOfTerms()
        >>> mean.update(torch.tensor([1.0, 0.0, 1.0]))  # three terms
        >>> mean.update(torch.tensor(0.5), weight=5)  # a batch mean over five samples
        >>> round(float(mean.compute()), 6)  # (2 + 2.5) / 8
        0.5625
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        zero = torch.zeros((), dtype=torch.float64)
        self.add_state("total", default=zero.clone(), dist_reduce_fx="sum")
        self.add_state("count", default=zero.clone(), dist_reduce_fx="sum")

    def update(self, values: Tensor, weight: float = 1.0) -> None:
        """Add ``values`` (any shape), each term counted ``weight`` times."""
        values = values.detach()
        self.total += weight * values.sum(dtype=torch.float64)
        self.count += weight * values.numel()

    def forward(self, values: Tensor, weight: float = 1.0) -> Tensor:
        """:meth:`update`, and return the mean of this batch's terms alone (no collective).

        The value ``torchmetrics``' own ``forward`` gives (for a ``full_state_update=False``
        metric it resets, updates and computes a copy of the state, then merges it back), at
        the cost of one update: it is what Lightning logs each step for a metric logged with
        ``on_step=True``.

        Example:
            >>> from torchmetrics import Metric
            >>> ours, reference = MeanOfTerms(), MeanOfTerms()
            >>> for values in (torch.tensor([0.1, 1.7, 2.9]), torch.tensor([0.3])):
            ...     batch = ours(values, weight=7)
            ...     same = torch.equal(batch, Metric.forward(reference, values, weight=7))
            ...     print(same, torch.equal(ours.total, reference.total))
            True True
            True True
        """
        self.update(values, weight)
        values = values.detach()
        self._forward_cache = (weight * values.sum(dtype=torch.float64)) / (weight * values.numel())
        return self._forward_cache

    def to(self, *args: Any, **kwargs: Any) -> MeanOfTerms:
        """``nn.Module.to``; a move to the states' own device (no dtype) returns at once.

        Lightning moves each logged metric to the logged value's device at every ``self.log``
        call; for states already there that is a no-op, and skipping ``torchmetrics``' walk
        over the states saves about 0.1 ms per call (per step and per validation batch).

        Example:
            >>> mean = MeanOfTerms()
            >>> mean.to("cpu") is mean, mean.total.dtype
            (True, torch.float64)
            >>> mean.to(torch.float32).total.dtype  # a dtype still converts the states
            torch.float32
        """
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is None and (device is None or device == self.total.device):
            return self
        return super().to(*args, **kwargs)

    def compute(self) -> Tensor:
        """``total / count`` (NaN before any term)."""
        return self.total / self.count


def evaluation_metrics() -> nn.ModuleDict:
    return nn.ModuleDict({name: MeanOfTerms() for name in ("loss", "acc", "nll")})
