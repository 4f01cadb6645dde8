r"""Ensemble temperature scaling: a mixture of the scaled, the raw and the uniform prediction.

Zhang, Kailkhura and Han, "Mix-n-Match: ensemble and compositional methods for uncertainty
calibration in deep learning" (ICML 2020), Section 3.1:

.. math::

    \hat p(z) = w_1 \operatorname{softmax}(z / T) + w_2 \operatorname{softmax}(z)
        + w_3 \frac{1}{C}, \qquad w \in \Delta^2 = \{w \ge 0,\ w_1 + w_2 + w_3 = 1\},

fitted in two stages, as the authors' code does: first ``T`` by temperature scaling
(:func:`~lightning_losses.calibration.posthoc.temperature.fit_temperature`), then, with ``T``
fixed, the weights minimising the NLL on the simplex,

.. math::

    w = \arg\min_{w \in \Delta^2} -\frac{1}{N} \sum_{i=1}^{N} \log \hat p(z_i)_{y_i} .

The authors' code fits both stages with the squared error by default and the NLL as an option
(``loss='ce'``), bounds ``T`` to ``[0.05, 5]`` and finds ``w`` with SLSQP. Here both stages use
the NLL, ``T`` is unbounded (it is temperature scaling's ``T``), and ``w`` is the exact
minimiser: the NLL is convex in ``w``, so its minimum over the simplex is the best of the
minimisers over the simplex's faces (each edge by bisection of the monotone derivative, the
interior by a damped Newton method), found to float64 precision. Where ``T`` is 1 the first two
components coincide and only ``w_1 + w_2`` is determined.

``forward`` returns ``log p`` computed stably, as the log-sum-exp of the three terms
``log w_k + log p_k`` (a zero weight contributes nothing).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from lightning_losses.calibration.posthoc.base import PostHocCalibrator
from lightning_losses.calibration.posthoc.temperature import (
    SEPARATED,
    TEMPERATURE_RANGE,
    TOO_EASY,
    fit_temperature,
    separated,
    why_uniform,
)
from lightning_losses.functional.checks import check_int

__all__ = ["EnsembleTemperatureScaling", "simplex_mixture_weights"]

#: Bisection steps on an edge: more than enough to reach float64 resolution of [0, 1].
_BISECTIONS = 200
#: Newton iterations in the simplex's interior.
_NEWTON_STEPS = 100


def _mean_nll(likelihoods: Tensor, weights: Tensor) -> float:
    """``-mean_i log(P_i w)`` (``inf`` where a mixture likelihood is 0)."""
    mixture = likelihoods @ weights
    if bool((mixture <= 0).any()):
        return math.inf
    return float(-mixture.log().mean())


def _edge_minimiser(first: Tensor, second: Tensor) -> float:
    """The ``t`` in ``[0, 1]`` minimising ``-mean log((1 - t) a + t b)`` (convex in ``t``).

    Its derivative ``-mean(d / (a + t d))``, ``d = b - a``, grows with ``t``: an end where it
    points outwards is the minimiser, else bisection finds its zero (``-inf`` at an end where a
    likelihood is 0, which the minimiser therefore avoids).
    """
    difference = second - first

    def slope(t: float) -> float:
        return float(-(difference / (first + t * difference)).mean())

    if slope(0.0) >= 0:
        return 0.0
    if slope(1.0) <= 0:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(_BISECTIONS):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if slope(middle) < 0:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def _interior_minimiser(likelihoods: Tensor) -> Tensor | None:
    """A damped Newton method on the simplex's interior from its centre (``None`` if stuck)."""
    base = likelihoods[:, 2]
    directions = likelihoods[:, :2] - base[:, None]  # P w = P_3 + A s, s = (w_1, w_2)
    s = torch.full((2,), 1.0 / 3.0, dtype=torch.float64, device=likelihoods.device)

    def value(point: Tensor) -> float:
        mixture = base + directions @ point
        return math.inf if bool((mixture <= 0).any()) else float(-mixture.log().mean())

    current = value(s)
    for _ in range(_NEWTON_STEPS):
        mixture = base + directions @ s
        scaled = directions / mixture[:, None]
        gradient = -scaled.mean(dim=0)
        if float(gradient.abs().max()) < 1e-15:
            break
        hessian = scaled.T @ scaled / scaled.shape[0]
        step = -(torch.linalg.pinv(hessian) @ gradient)
        alpha, moved = 1.0, False
        for _ in range(60):
            trial = s + alpha * step
            inside = bool((trial > 0).all()) and float(trial.sum()) < 1
            if inside:
                trial_value = value(trial)
                if trial_value <= current + 1e-4 * alpha * float(gradient @ step):
                    s, current, moved = trial, trial_value, True
                    break
            alpha /= 2
        if not moved:
            break
    if not math.isfinite(current):
        return None
    return torch.cat([s, 1 - s.sum(dim=0, keepdim=True)])


def simplex_mixture_weights(likelihoods: Tensor) -> Tensor:
    """The weights ``w`` on the simplex minimising ``-mean_i log(sum_k w_k P_ik)``.

    The objective is convex in ``w``; its minimum over the simplex is the best of the
    minimisers over the faces: each vertex, each edge (bisection of the derivative, which is
    monotone), and the interior (a damped Newton method that stays inside).

    Args:
        likelihoods: ``P`` float64 ``[N, 3]``, each component's probability of the true label
            (non-negative; the third positive, e.g. ``1 / C``).

    Returns:
        ``w`` float64 ``[3]``, non-negative, summing to 1.

    Example:
        >>> p = torch.tensor([[0.9, 0.5, 0.25], [0.1, 0.5, 0.25]], dtype=torch.float64)
        >>> simplex_mixture_weights(p)  # the second component alone has the least NLL
        tensor([0., 1., 0.], dtype=torch.float64)
    """
    candidates = []
    for first, second in ((0, 1), (0, 2), (1, 2)):
        t = _edge_minimiser(likelihoods[:, first], likelihoods[:, second])
        weights = torch.zeros(3, dtype=torch.float64, device=likelihoods.device)
        weights[first], weights[second] = 1 - t, t
        candidates.append(weights)
    interior = _interior_minimiser(likelihoods)
    if interior is not None:
        candidates.append(interior)
    return min(candidates, key=lambda w: _mean_nll(likelihoods, w))


class EnsembleTemperatureScaling(PostHocCalibrator):
    r"""Ensemble temperature scaling (ETS): ``w1 softmax(z/T) + w2 softmax(z) + w3 / C``.

    .. math::

        \hat p(z) = w_1 \operatorname{softmax}(z / T) + w_2 \operatorname{softmax}(z)
            + \frac{w_3}{C}, \qquad
        T = \arg\min_T \mathrm{NLL}(\operatorname{softmax}(z / T)), \quad
        w = \arg\min_{w \in \Delta^2} \mathrm{NLL}(\hat p)

    (two stages: ``T`` as temperature scaling fits it, then the exact minimiser ``w`` on the
    simplex with ``T`` fixed; see :mod:`~lightning_losses.calibration.posthoc.ensemble` for how
    this differs from the authors' code). ``forward`` returns ``log p̂`` as the log-sum-exp of
    ``log w_k`` plus each component's log-probabilities. The fitted ``params`` are
    ``temperature`` and ``weights`` (``[w1, w2, w3]``). Falls back to the identity with fewer
    than 3 samples (``T`` and two free weights).

    Source: Zhang, Kailkhura and Han, "Mix-n-Match: ensemble and compositional methods for
    uncertainty calibration in deep learning", ICML 2020.

    Args:
        max_iter: the most L-BFGS iterations of the temperature fit (``>= 1``).

    Example:
        >>> z = torch.tensor([[4.0, 0.0]] * 8 + [[0.0, 4.0]] * 8)
        >>> y = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0])  # 3/4 right
        >>> ets = EnsembleTemperatureScaling().fit(z, y)
        >>> ets.probabilities(z[:1])  # calibrated: 0.75 for the predicted class
        tensor([[0.7500, 0.2500]])
    """

    method: ClassVar[str] = "ensemble_temperature"

    def __init__(self, *, max_iter: int = 100) -> None:
        super().__init__()
        self.max_iter = check_int("max_iter", max_iter, low=1)

    def min_samples(self, num_classes: int) -> int:
        """Three parameters: ``T`` and two free weights."""
        return 3

    def _fit(self, logits: Tensor, target: Tensor) -> dict[str, Tensor]:
        temperature = fit_temperature(logits, target, max_iter=self.max_iter)
        rows = torch.arange(logits.shape[0], device=logits.device)
        likelihoods = torch.stack(
            [
                torch.softmax(logits / temperature, dim=1)[rows, target],
                torch.softmax(logits, dim=1)[rows, target],
                torch.full_like(target, 1, dtype=torch.float64) / logits.shape[1],
            ],
            dim=1,
        )
        weights = simplex_mixture_weights(likelihoods.detach())
        return {"temperature": torch.tensor(temperature, dtype=torch.float64), "weights": weights}

    def bound_reason(self, logits: Tensor, target: Tensor) -> str:
        """Why the temperature of the first component ran to a bound ("" if it did not).

        Labels the logits separate drive ``T`` to 0 (the first component is then one-hot);
        a ``T`` above ``TEMPERATURE_RANGE[1]`` makes the first component uniform, like the
        third, so the map is ``w2 softmax(z) + (1 - w2) / C``; below ``TEMPERATURE_RANGE[0]``
        the first component is nearly one-hot.
        """
        low, high = TEMPERATURE_RANGE
        temperature = float(self.params["temperature"])
        w1, w2, _ = (float(w) for w in self.params["weights"])
        where = f"the temperature of its first component, T={temperature:.3g},"
        if separated(logits, target):
            return (
                f"{where} runs to 0: {SEPARATED.format(what='T shrinks')}; that component is "
                f"(nearly) one-hot and weighs w1 = {w1:.3g}. {TOO_EASY}"
            )
        if temperature > high:
            return (
                f"{where} is above {high:g}: {why_uniform(logits, target)}; that component is "
                "uniform, like the third, "
                f"so the calibrated probabilities are {w2:.3g} softmax(z) + {1.0 - w2:.3g} / C"
            )
        if temperature < low:
            return (
                f"{where} is below {low:g}: the logits nearly separate the validation labels; "
                f"that component is (nearly) one-hot and weighs w1 = {w1:.3g}"
            )
        return ""

    def _log_probs(self, logits: Tensor) -> Tensor:
        temperature = self.param("temperature", logits)
        log_weights = self.param("weights", logits).log()  # log 0 = -inf: no contribution
        terms = torch.stack(
            [
                log_weights[0] + torch.log_softmax(logits / temperature, dim=1),
                log_weights[1] + torch.log_softmax(logits, dim=1),
                (log_weights[2] - math.log(logits.shape[1])).expand_as(logits),
            ]
        )
        return torch.logsumexp(terms, dim=0)
