"""The float64 means the Lightning layer logs its per-task NLL and accuracy with.

The per-term maths (NLL and hits of logits, per task) is
:mod:`lightning_losses.functional.evaluation`; here is the ``Metric`` side.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric


class MeanOfTerms(Metric):
    """The mean of every term seen, kept as a float64 sum and count summed across processes.

    ``update(values, weight)`` adds ``weight * values.sum()`` to the total and ``weight *
    values.numel()`` to the count; ``compute()`` is ``total / count``. Both states reduce with
    ``dist_reduce_fx="sum"``, so under DDP the value is the mean over the terms of every process,
    however many each holds (a mean of per-process means is not, when the counts differ).

    Why not torchmetrics' ``MeanMetric``: its float64 copy (``MeanMetric().set_dtype(
    torch.float64)``) keeps the same two sums and gives the same values, under DDP too (a test
    checks it), but this metric is updated and logged on every training step and validation
    batch, and ``MeanMetric`` is slower on each of those paths (torchmetrics 1.9, CPU, one
    thread, ``[256]`` terms): its ``update`` builds and casts a weight tensor of the values'
    shape and checks values and weights for NaN, a host sync per update on a GPU (about 1.5
    times the one float64 sum here); its ``nan_strategy="disable"``, which skips the check,
    also drops the ``weight`` argument (a batch mean would count as one term); its ``forward``
    is torchmetrics' reset-update-compute-merge, about three times :meth:`forward` here (the
    same value, to the bit); and its ``to`` walks the states at every ``self.log`` call (about
    40 us against under 1 us for :meth:`to` here; ``benchmarks/overhead.py`` times it in a fit).

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
    total: Tensor  # states, added by the constructor
    count: Tensor

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
        batch_mean = (weight * values.sum(dtype=torch.float64)) / (weight * values.numel())
        # torchmetrics initialises its forward cache to None and leaves it untyped, so mypy
        # takes None for its type; Metric.forward stores the batch value there too.
        self._forward_cache = batch_mean  # type: ignore[assignment]
        return batch_mean

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
    """One stage's ``loss``, ``acc`` and ``nll`` means (``ClassifierModule``'s validation and test).

    Example:
        >>> sorted(evaluation_metrics())
        ['acc', 'loss', 'nll']
    """
    return nn.ModuleDict({name: MeanOfTerms() for name in ("loss", "acc", "nll")})
