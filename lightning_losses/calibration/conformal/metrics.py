"""Conformal prediction as torchmetrics ``Metric``s, exact under DDP.

:class:`ConformalThreshold` keeps the calibration scores (and their classes) as ``"cat"``
state: a quantile needs every score, and the gathered scores are the same multiset whatever
the batching or the number of processes, so the thresholds are those of one process.
:class:`PredictionSetMetrics` keeps the float64 sums of :class:`~.measures.SetStatistics`
(``"sum"`` state, ``2 (2C + 1)`` numbers), from which every measure follows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from lightning_losses.calibration.conformal import measures as M
from lightning_losses.calibration.conformal._inputs import METHODS
from lightning_losses.calibration.conformal.scores import conformal_scores
from lightning_losses.calibration.conformal.threshold import (
    class_conditional_thresholds,
    conformal_threshold,
)
from lightning_losses.functional.checks import check_choice, check_flag, check_int, check_levels

__all__ = ["ConformalThreshold", "PredictionSetMetrics"]


class ConformalThreshold(Metric):
    """Split conformal thresholds from the scores of every ``update``, across processes.

    ``update(probs, target)`` adds :func:`~.conformal_scores` of the batch; ``compute()``
    returns :func:`~.conformal_threshold` (``[A]``, one per ``alpha``; torchmetrics
    returns one level as a 0-d tensor) or, with
    ``class_conditional=True``, :func:`~.class_conditional_thresholds` (``[A, C]``).

    Args:
        alpha: the miscoverage levels.
        method: the score, as in :func:`~.conformal_scores`.
        randomized: randomised scores (the draws come from ``generator`` per update).
        class_conditional: Mondrian thresholds, one per class (needs ``num_classes``).
        num_classes: the number of classes ``C``.
        generator: the source of the draws when randomised.
        ignore_index: targets to skip.
        score_options: ``k_reg``, ``lam``, ``weight`` for the score.
        kwargs: torchmetrics ``Metric`` options.

    Example:
        >>> metric = ConformalThreshold(alpha=[0.5], method="lac", randomized=False)
        >>> metric.update(torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.7, 0.3]]),
        ...               torch.tensor([0, 1, 1]))
        >>> metric.compute()  # scores 0.1, 0.4, 0.7; k = ceil(4 * 0.5) = 2
        tensor(0.4000, dtype=torch.float64)
    """

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False

    def __init__(
        self,
        *,
        alpha: float | Sequence[float] = 0.1,
        method: str = "lac",
        randomized: bool = False,
        class_conditional: bool = False,
        num_classes: int | None = None,
        generator: torch.Generator | None = None,
        ignore_index: int | None = None,
        k_reg: int = 1,
        lam: float = 0.01,
        weight: float = 0.2,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.alpha, _ = check_levels(alpha if not isinstance(alpha, float) else [alpha])
        check_choice("method", method, METHODS)
        self.method = str(method)
        check_flag("randomized", randomized)
        check_flag("class_conditional", class_conditional)
        if class_conditional:
            check_int("num_classes", num_classes, low=1)
        self.randomized = randomized
        self.class_conditional = class_conditional
        self.num_classes = num_classes
        self.generator = generator
        self.ignore_index = ignore_index
        self.k_reg, self.lam, self.weight = k_reg, lam, weight
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")

    def update(self, probs: Tensor, target: Tensor) -> None:
        """Add the scores of a batch of probabilities ``[N, C, *]`` and targets ``[N, *]``."""
        scores = conformal_scores(
            probs,
            target,
            method=self.method,
            randomized=self.randomized,
            generator=self.generator,
            ignore_index=self.ignore_index,
            k_reg=self.k_reg,
            lam=self.lam,
            weight=self.weight,
        )
        keep = target if self.ignore_index is None else target[target != self.ignore_index]
        cast(list[Tensor], self.scores).append(scores.double())
        cast(list[Tensor], self.labels).append(keep.reshape(-1).long())

    def compute(self) -> Tensor:
        """``[A]`` thresholds, or ``[A, C]`` class-conditional ones."""
        gathered = cast(list[Tensor] | Tensor, self.scores)
        scores = dim_zero_cat(gathered) if len(gathered) else torch.zeros(0, dtype=torch.float64)
        if self.class_conditional:
            classes = cast(list[Tensor] | Tensor, self.labels)
            labels = dim_zero_cat(classes) if len(classes) else scores.new_zeros(0).long()
            return class_conditional_thresholds(
                scores, labels, self.alpha, num_classes=int(self.num_classes or 1)
            )
        return conformal_threshold(scores, self.alpha)


class PredictionSetMetrics(Metric):
    """Coverage, mean size, empty and singleton rates, SSCV and coverage gap of sets.

    ``update(sets, target)`` adds the sums of :func:`~.set_statistics`; ``compute()`` returns
    a dict of float64 scalars: ``coverage``, ``size``, ``empty``, ``singleton``, ``sscv``,
    ``coverage_gap`` (the functions of :mod:`.measures` on the summed statistics).

    Args:
        num_classes: the number of classes ``C``.
        alpha: the nominal miscoverage, for SSCV and the gap.
        strata: the size strata of SSCV.
        ignore_index: targets to skip.
        kwargs: torchmetrics ``Metric`` options.

    Example:
        >>> metric = PredictionSetMetrics(num_classes=2, alpha=0.1)
        >>> metric.update(torch.tensor([[True, False], [True, True]]), torch.tensor([0, 1]))
        >>> {k: round(float(v), 3) for k, v in metric.compute().items()}["size"]
        1.5
    """

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False

    def __init__(
        self,
        *,
        num_classes: int,
        alpha: float = 0.1,
        strata: Sequence[tuple[int, int]] = M.DEFAULT_STRATA,
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        c = check_int("num_classes", num_classes, low=1)
        (self.alpha,), _ = check_levels(alpha)
        self.num_classes = c
        self.strata = tuple((int(a), int(b)) for a, b in strata)
        self.ignore_index = ignore_index
        for name, size in (
            ("class_count", c),
            ("class_covered", c),
            ("size_count", c + 1),
            ("size_covered", c + 1),
        ):
            self.add_state(
                name, default=torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum"
            )

    def update(self, sets: Tensor, target: Tensor) -> None:
        """Add the sums of boolean sets ``[N, C, *]`` against targets ``[N, *]``."""
        if sets.shape[1] != self.num_classes:
            raise ValueError(
                f"sets must have num_classes={self.num_classes} labels in dimension 1; "
                f"got {sets.shape[1]}"
            )
        s = M.set_statistics(sets, target, ignore_index=self.ignore_index)
        for name, value in zip(s._fields, s, strict=True):
            setattr(self, name, cast(Tensor, getattr(self, name)) + value)

    def statistics(self) -> M.SetStatistics:
        """The summed statistics (synchronised by ``compute``)."""
        return M.SetStatistics(*(cast(Tensor, getattr(self, f)) for f in M.SetStatistics._fields))

    def compute(self) -> dict[str, Tensor]:
        """The measures as float64 scalars."""
        return M.all_measures(self.statistics(), alpha=self.alpha, strata=self.strata)
