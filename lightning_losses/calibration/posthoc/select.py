r"""Choosing a post-hoc calibrator by cross-validated NLL on the split it is fitted on.

Each candidate is fitted ``folds`` times, each time on all folds but one, and scored by the NLL
of the fold it did not see; the scores of all samples are averaged:

.. math::

    \mathrm{CV\text{-}NLL}(g) = -\frac{1}{N} \sum_{k=1}^{K} \sum_{i \in F_k}
        \log \hat p_{g^{(-k)}}(y_i \mid z_i),

where :math:`g^{(-k)}` is the calibrator fitted without fold :math:`F_k`. The candidate with
the lowest score is refitted on all samples. The identity (no calibration) is always scored
too, so a method that would worsen the held-out NLL is never chosen.

Folds do not depend on the order of the rows: the rows are first put in a canonical order
(by label, then lexicographically by their logits), and sample ``j`` of that order goes to
fold ``j mod K``. The folds are thus stratified by class, and the choice (and every fit) is the
same whether the logits come from one process or are gathered from several in any order.

Example:
    >>> import torch
    >>> from lightning_losses.calibration.posthoc.temperature import TemperatureScaler
    >>> z = torch.tensor([[3.0, 0.0]] * 6 + [[0.0, 3.0]] * 6)
    >>> y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0])
    >>> choice = select_calibrator([TemperatureScaler()], z, y, folds=3)
    >>> choice.method, sorted(choice.scores)
    ('temperature', ['none', 'temperature'])
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from lightning_losses.calibration.posthoc.base import (
    IdentityCalibrator,
    PostHocCalibrator,
    check_fit_inputs,
)
from lightning_losses.functional.checks import check_int
from lightning_losses.warning import LightningLossesWarning

__all__ = ["Selection", "canonical_order", "cross_validated_nll", "select_calibrator"]


@dataclass(frozen=True)
class Selection:
    """The outcome of :func:`select_calibrator`.

    Attributes:
        method: the chosen method's name (``"none"`` for the identity).
        calibrator: the chosen calibrator, refitted on all samples.
        scores: each candidate's cross-validated NLL, by method name (``inf`` where a fold's
            calibrated probability of a true label was 0).
        folds: the number of folds.
        fallbacks: the methods whose fit on all samples fell back to the identity, and why.
    """

    method: str
    calibrator: PostHocCalibrator
    scores: dict[str, float]
    folds: int
    fallbacks: dict[str, str] = field(default_factory=dict)


def canonical_order(logits: Tensor, target: Tensor) -> Tensor:
    """The permutation that sorts the rows by label, then lexicographically by their logits.

    Example:
        >>> canonical_order(torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 1.0]]),
        ...                 torch.tensor([1, 0, 0])).tolist()
        [2, 1, 0]
    """
    columns = logits.detach().to(torch.float64).cpu().numpy()
    keys = [columns[:, c] for c in range(columns.shape[1] - 1, -1, -1)]
    order = np.lexsort([*keys, target.detach().cpu().numpy()])
    return torch.from_numpy(order.astype(np.int64))


def _held_out_nll(calibrator: PostHocCalibrator, logits: Tensor, target: Tensor) -> Tensor:
    """The per-sample NLL of the calibrated log-probabilities (float64)."""
    log_probs = calibrator(logits).to(torch.float64)
    return -log_probs.gather(1, target[:, None])[:, 0]


def cross_validated_nll(
    candidate: PostHocCalibrator, logits: Tensor, target: Tensor, *, folds: int = 5
) -> float:
    """The mean NLL of ``candidate`` on each fold when fitted on the others (see the module).

    ``candidate`` is copied for each fold (it is not fitted itself). Inside the folds a fit that
    falls back to the identity does not warn: the identity's own score shows that case.
    """
    z, y = check_fit_inputs(logits, target, owner=candidate.name)
    order = canonical_order(z, y)
    z, y = z[order], y[order]
    fold_of = torch.arange(z.shape[0]) % folds
    total = torch.zeros((), dtype=torch.float64)
    for k in range(folds):
        held = fold_of == k
        if not bool(held.any()) or bool(held.all()):
            continue
        fitted = copy.deepcopy(candidate)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LightningLossesWarning)
            fitted.fit(z[~held], y[~held])
        with torch.no_grad():
            total += _held_out_nll(fitted, z[held], y[held]).sum()
    return float(total / z.shape[0])


def select_calibrator(
    candidates: Sequence[PostHocCalibrator],
    logits: Tensor,
    target: Tensor,
    *,
    folds: int = 5,
    ignore_index: int | None = None,
) -> Selection:
    """Score each candidate (and the identity) by cross-validated NLL; refit the best on all.

    Args:
        candidates: unfitted calibrators (their hyper-parameters set); copied, not fitted.
        logits: held-out logits ``[N, C]`` (or ``[N]`` binary).
        target: their integer labels ``[N]``.
        folds: the number of folds ``K >= 2`` (at most ``N``).
        ignore_index: the label of rows to leave out.

    Returns:
        The :class:`Selection`: the chosen method, fitted on all samples, and every score. Ties
        go to the earlier candidate, and the identity comes first.

    Raises:
        ValueError: two candidates with the same method name, ``folds`` out of range, or the
            inputs :func:`~lightning_losses.calibration.posthoc.base.check_fit_inputs` refuses.
    """
    check_int("folds", folds, low=2)
    names = [c.method for c in candidates]
    if len(set(names)) != len(names) or "none" in names:
        raise ValueError(
            f"candidates must have distinct methods other than 'none' (the identity is always "
            f"scored); got {names}"
        )
    z, y = check_fit_inputs(logits, target, owner="select_calibrator", ignore_index=ignore_index)
    if folds > z.shape[0]:
        raise ValueError(f"folds={folds} exceeds the {z.shape[0]} samples to fit on")
    order = canonical_order(z, y)
    z, y = z[order], y[order]
    pool: list[PostHocCalibrator] = [IdentityCalibrator(), *candidates]
    scores = {c.method: cross_validated_nll(c, z, y, folds=folds) for c in pool}
    best = min(pool, key=lambda c: (_rank(scores[c.method]), pool.index(c)))
    fallbacks: dict[str, str] = {}
    chosen = copy.deepcopy(best).fit(z, y)
    if chosen.fallback:
        fallbacks[chosen.method] = chosen.fallback
    return Selection(best.method, chosen, scores, folds, fallbacks)


def _rank(score: float) -> float:
    """NaN scores rank last, like infinite ones."""
    return math.inf if math.isnan(score) else score
