"""Prediction sets with a coverage guarantee: split conformal classification.

Three calls: :func:`conformal_scores` (the true label's non-conformity score per calibration
sample), :func:`conformal_threshold` (the ``ceil((n + 1)(1 - alpha))``-th smallest score) and
:func:`prediction_sets` (``[N, C]`` booleans ``s(x, y) <= q``). Scores: ``"lac"`` (THR),
``"aps"``, ``"raps"``, ``"saps"``, ``"top_k"``, deterministic or randomised.
:func:`class_conditional_thresholds` gives Mondrian thresholds; :mod:`.measures` coverage, set
size, empty and singleton rates, SSCV and the class-conditional coverage gap; the ``Metric``s
:class:`ConformalThreshold` and :class:`PredictionSetMetrics` do both across DDP processes.

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> probs = torch.rand(200, 5, generator=g).softmax(1)
    >>> target = torch.multinomial(probs, 1, generator=g)[:, 0]
    >>> q = conformal_threshold(conformal_scores(probs[:100], target[:100], method="lac"), 0.1)
    >>> sets = prediction_sets(probs[100:], q, method="lac")
    >>> sets.shape, sets.dtype
    (torch.Size([100, 5]), torch.bool)
"""

from lightning_losses.calibration.conformal._inputs import METHODS
from lightning_losses.calibration.conformal.measures import (
    CHUNK_ELEMENTS,
    DEFAULT_STRATA,
    MEASURES,
    SetStatistics,
    all_measures,
    class_coverage_gap,
    coverage,
    empty_rate,
    mean_set_size,
    set_statistics,
    set_statistics_by_method,
    singleton_rate,
    size_stratified_coverage_violation,
    summed_statistics,
)
from lightning_losses.calibration.conformal.metrics import ConformalThreshold, PredictionSetMetrics
from lightning_losses.calibration.conformal.scores import (
    all_label_scores,
    all_label_scores_by_method,
    conformal_scores,
)
from lightning_losses.calibration.conformal.sets import prediction_sets
from lightning_losses.calibration.conformal.threshold import (
    class_conditional_thresholds,
    conformal_rank,
    conformal_threshold,
)

__all__ = [
    "CHUNK_ELEMENTS",
    "DEFAULT_STRATA",
    "MEASURES",
    "METHODS",
    "ConformalThreshold",
    "PredictionSetMetrics",
    "SetStatistics",
    "all_label_scores",
    "all_label_scores_by_method",
    "all_measures",
    "class_conditional_thresholds",
    "class_coverage_gap",
    "conformal_rank",
    "conformal_scores",
    "conformal_threshold",
    "coverage",
    "empty_rate",
    "mean_set_size",
    "prediction_sets",
    "set_statistics",
    "set_statistics_by_method",
    "singleton_rate",
    "size_stratified_coverage_violation",
    "summed_statistics",
]
