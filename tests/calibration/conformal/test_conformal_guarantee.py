"""The split conformal guarantee, by simulation: 2,000 random calibration/test splits.

A fixed pool of exchangeable samples (probabilities of an overconfident model, labels drawn
from the true, flatter distribution, one uniform draw ``U`` per sample) is permuted at random
per trial; the first ``n`` samples calibrate, the rest are tested. Given the pool, the ``n``
calibration scores and a test score are exchangeable, so the expected coverage is
``k / (n + 1)`` with ``k = ceil((n + 1)(1 - alpha))`` when the scores have no ties, inside
``[1 - alpha, 1 - alpha + 1 / (n + 1)]``; with ties (deterministic top-k: integer ranks) only the
lower bound holds. The mean over trials must lie in that interval widened by three Monte-Carlo
standard errors. Vectorised over trials: ``conformal_threshold`` takes ``[T, n]`` scores.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_losses.calibration.conformal import (
    all_label_scores,
    class_conditional_thresholds,
    conformal_scores,
    conformal_threshold,
    prediction_sets,
)

TRIALS, POOL, CLASSES, N_CAL = 2000, 1500, 5, 100
ALPHAS = [0.1, 0.2]
OPTIONS = {"k_reg": 1, "lam": 0.05, "weight": 0.2}


def pool(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(POOL, CLASSES, generator=g, dtype=torch.float64)
    labels = torch.multinomial((0.5 * logits).softmax(1), 1, generator=g)[:, 0]
    return logits.softmax(1), labels, torch.rand(POOL, generator=g, dtype=torch.float64)


CASES = [
    ("lac", False),
    ("aps", False),
    ("aps", True),
    ("raps", False),
    ("raps", True),
    ("saps", False),
    ("saps", True),
    ("top_k", True),
    ("top_k", False),
]


@pytest.mark.parametrize(("method", "randomized"), CASES)
def test_mean_coverage_lies_in_the_finite_sample_interval(method: str, randomized: bool) -> None:
    probs, labels, u = pool()
    noise = u if randomized else torch.zeros_like(u)
    scores = conformal_scores(probs, labels, method=method, noise=noise, **OPTIONS)
    # the sets hold the true label exactly when its score is at most the threshold
    every = all_label_scores(probs, method=method, noise=noise, **OPTIONS)
    for q in scores[:25]:
        sets = prediction_sets(probs, q, method=method, noise=noise, **OPTIONS)
        assert torch.equal(sets, every <= q)
        assert torch.equal(sets.gather(1, labels[:, None])[:, 0], scores <= q)
    g = torch.Generator().manual_seed(1)
    perm = torch.rand(TRIALS, POOL, generator=g).argsort(1)
    q = conformal_threshold(scores[perm[:, :N_CAL]], ALPHAS)  # [T, A]
    test = scores[perm[:, N_CAL:]]  # [T, POOL - n]
    covered = (test[:, :, None] <= q[:, None, :]).double().mean(1)  # [T, A]
    mean, se = covered.mean(0), covered.std(0) / math.sqrt(TRIALS)
    ties = method == "top_k" and not randomized
    for a, m, s in zip(ALPHAS, mean.tolist(), se.tolist(), strict=True):
        assert m >= 1 - a - 3 * s, (method, randomized, a, m, s)
        if not ties:
            assert m <= 1 - a + 1 / (N_CAL + 1) + 3 * s, (method, randomized, a, m, s)
            k = math.ceil((N_CAL + 1) * (1 - a) - 1e-9)
            assert abs(m - k / (N_CAL + 1)) <= 3 * s  # the exact expectation
    if ties:  # integer ranks: the lower bound holds, not the upper one (coverage overshoots)
        assert mean[0] > 1 - ALPHAS[0] + 1 / (N_CAL + 1)


def within_guarantee(mean: float, se: float, alpha: float, n: int) -> bool:
    """Mean coverage in ``[1 - alpha, 1 - alpha + 1 / (n + 1)]`` within three standard errors."""
    return 1 - alpha - 3 * se <= mean <= 1 - alpha + 1 / (n + 1) + 3 * se


def test_class_conditional_coverage_per_class() -> None:
    """Mondrian thresholds: every class's coverage is in its own interval (stratified splits)."""
    probs, labels, u = pool(seed=2)
    alpha, trials = 0.1, 1000
    scores = conformal_scores(probs, labels, method="aps", noise=u)
    g = torch.Generator().manual_seed(3)
    members = [torch.nonzero(labels == c)[:, 0] for c in range(CLASSES)]
    n_cal = [len(m) // 3 for m in members]
    assert min(n_cal) >= 9  # a finite threshold for alpha = 0.1
    covered = torch.zeros(trials, CLASSES, dtype=torch.float64)
    one_too_low = torch.zeros(trials, CLASSES, dtype=torch.float64)
    perms = [torch.rand(trials, len(m), generator=g).argsort(1) for m in members]
    cal_index = torch.cat([m[p[:, :n]] for m, p, n in zip(members, perms, n_cal, strict=True)], 1)
    cal_labels = labels[cal_index[0]]  # the same class layout in every trial
    for t in range(trials):
        q = class_conditional_thresholds(
            scores[cal_index[t]], cal_labels, alpha, num_classes=CLASSES
        )
        if t == 0:  # the thresholds against each class's order statistic, written out here
            for c, n in enumerate(n_cal):
                own = scores[cal_index[0][cal_labels == c]].sort().values
                assert q[c] == own[math.ceil((n + 1) * (1 - alpha) - 1e-9) - 1]
        for c, (m, p, n) in enumerate(zip(members, perms, n_cal, strict=True)):
            covered[t, c] = (scores[m[p[t, n:]]] <= q[c]).double().mean()
            cal = scores[m[p[t, :n]]].sort().values
            k = math.ceil((n + 1) * (1 - alpha) - 1e-9)
            one_too_low[t, c] = (scores[m[p[t, n:]]] <= cal[k - 2]).double().mean()
    mean, se = covered.mean(0), covered.std(0) / math.sqrt(trials)
    low_mean, low_se = one_too_low.mean(0), one_too_low.std(0) / math.sqrt(trials)
    rejected = 0
    for c in range(CLASSES):
        n = n_cal[c]
        k = math.ceil((n + 1) * (1 - alpha) - 1e-9)
        assert within_guarantee(mean[c], se[c], alpha, n), (c, n)
        assert abs(mean[c] - k / (n + 1)) <= 3 * se[c], (c, n)  # the exact expectation
        # The guarantee's check rejects a threshold one order statistic too low wherever that
        # threshold's expected coverage, (k - 1) / (n + 1), lies more than six standard errors
        # below 1 - alpha (how far depends on n: 0.8 to 9 standard errors for n of 95 to 114).
        if (1 - alpha) - (k - 1) / (n + 1) > 6 * low_se[c]:
            assert not within_guarantee(low_mean[c], low_se[c], alpha, n), (c, n)
            rejected += 1
        # The check has power: one order statistic lower, the simulation finds that threshold's
        # own expectation (k - 1) / (n + 1), below 1 - alpha and 1 / (n + 1) (8-9 standard
        # errors here) away from the one asserted above.
        assert abs(low_mean[c] - (k - 1) / (n + 1)) <= 3 * low_se[c], (c, n)
        assert low_mean[c] < 1 - alpha
        assert abs(low_mean[c] - k / (n + 1)) > 3 * se[c], (c, n, float(low_mean[c]))
    assert rejected >= 2, rejected  # the check has power on these class sizes
