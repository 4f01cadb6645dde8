"""The rule that decides a comparison over seeds, against SciPy's t-tests and TOST by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from lightning_losses.compare.decide import decide, pair_by_seed, t_interval

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("n", [2, 3, 5, 10])
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_paired_interval_is_scipys(n, level):
    a, b = RNG.normal(0.9, 0.02, n), RNG.normal(0.89, 0.02, n)
    reference = stats.ttest_rel(a, b).confidence_interval(confidence_level=level)
    decision = decide(pair_by_seed(dict(enumerate(a)), dict(enumerate(b))), margin=0.0, level=level)
    assert decision.difference == pytest.approx(np.mean(a - b), abs=1e-12)
    assert decision.low == pytest.approx(reference.low, abs=1e-12)
    assert decision.high == pytest.approx(reference.high, abs=1e-12)
    mean, low, high = t_interval(a - b, level)
    assert mean == pytest.approx(np.mean(a - b), abs=1e-12)
    assert (low, high) == pytest.approx((reference.low, reference.high), abs=1e-12)


@pytest.mark.parametrize("sizes", [(3, 3), (5, 8), (10, 4)])
def test_unpaired_interval_is_welchs(sizes):
    a, b = RNG.normal(0.05, 0.01, sizes[0]), RNG.normal(0.06, 0.02, sizes[1])
    reference = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    decision = decide(list(a), list(b), margin=0.0)
    assert decision.method == "Welch t"
    assert (decision.low, decision.high) == pytest.approx((reference.low, reference.high), 1e-10)


def tost_by_hand(d: np.ndarray, margin: float, alpha: float) -> bool:
    """Schuirmann's two one-sided tests on paired differences, written plainly."""
    n, mean, se = len(d), d.mean(), d.std(ddof=1) / math.sqrt(len(d))
    p_low = 1 - stats.t.cdf((mean + margin) / se, n - 1)  # H0: mean <= -margin
    p_high = stats.t.cdf((mean - margin) / se, n - 1)  # H0: mean >= margin
    return max(p_low, p_high) < alpha


def test_equivalence_is_tost_and_never_the_absence_of_a_difference():
    for _ in range(200):
        n = int(RNG.integers(2, 12))
        d = RNG.normal(RNG.normal(0, 0.01), RNG.uniform(0.001, 0.02), n)
        margin = float(RNG.uniform(0.002, 0.03))
        decision = decide(d, margin=margin)
        assert decision.equivalent == tost_by_hand(d, margin, 0.05)
        different = stats.ttest_1samp(d, 0.0).pvalue < 0.05
        assert decision.different == different
        if not decision.equivalent and not different:
            assert decision.verdict == "undecided"
    # The claim "gamma-CE is about CE's accuracy" at 3 seeds: 2.3 points lower, noisy.
    noisy = decide([-0.035, -0.005, -0.029], margin=0.01)
    assert noisy.verdict != "equivalent"


def test_direction_and_verdicts():
    assert decide([0.01, 0.012, 0.011], margin=0.0).verdict == "better"
    assert decide([0.01, 0.012, 0.011], margin=0.0, higher_is_better=False).verdict == "worse"
    assert decide([-0.01, -0.012, -0.011], margin=0.0, higher_is_better=False).verdict == "better"
    tiny = decide([0.0010, 0.0011, 0.0012, 0.0010], margin=0.01)
    assert tiny.verdict == "equivalent"
    assert tiny.different  # beyond noise, inside the margin


def test_seeds_needed_is_the_first_count_that_decides():
    d = np.array([0.02, -0.01, 0.03])
    decision = decide(d, margin=0.005)
    assert decision.verdict == "undecided"
    k, mean, sd = decision.seeds_needed, d.mean(), d.std(ddof=1)

    def decides(n: int) -> bool:
        se = sd / math.sqrt(n)
        return abs(mean) > stats.t.ppf(0.975, n - 1) * se or (
            abs(mean) + stats.t.ppf(0.95, n - 1) * se < 0.005
        )

    assert decides(k)
    assert not any(decides(n) for n in range(3, k))
    assert "needs ~" in decision.describe()
    assert decide([0.01], margin=0.0).seeds_needed is None


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="level must lie in"):
        decide([0.1, 0.2], margin=0.0, level=1.5)
    with pytest.raises(ValueError, match="margin"):
        decide([0.1, 0.2], margin=-1)
    with pytest.raises(ValueError, match=r"--pair-by.*seeds only in the candidate: \[2\]"):
        pair_by_seed({0: 1.0, 1: 1.0, 2: 1.0}, {0: 1.0, 1: 1.0})
    with pytest.raises(ValueError, match="finite"):
        decide([0.1, float("nan")], margin=0.0)


def test_non_inferiority_equals_scipys_one_sided_t_tests():
    """``non_inferior`` follows the one-sided t-tests of scipy.stats.ttest_1samp at 5%.

    It holds iff the one-sided t-test of ``d > -margin`` rejects at 5%, fails iff the one of
    ``d < -margin`` does, else is undecided.
    """
    from lightning_losses.compare.decide import non_inferior

    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(300):
        n = int(rng.integers(3, 12))
        diffs = rng.normal(rng.uniform(-0.03, 0.01), rng.uniform(0.001, 0.02), n)
        margin = 0.01
        outcome, needed = non_inferior(decide(diffs, margin=margin), margin)
        above = stats.ttest_1samp(diffs + margin, 0.0, alternative="greater").pvalue < 0.05
        below = stats.ttest_1samp(diffs + margin, 0.0, alternative="less").pvalue < 0.05
        expected = "holds" if above else "fails" if below else "undecided"
        assert outcome == expected
        seen.add(outcome)
        if outcome == "undecided" and needed is not None:
            mean, sd = diffs.mean(), diffs.std(ddof=1)
            decides = [
                mean - half > -margin or mean + half < -margin
                for half in (
                    stats.t.ppf(0.95, k - 1) * sd / math.sqrt(k) for k in (needed - 1, needed)
                )
            ]
            assert decides == [False, True]
        # Lower is better: the mirrored differences give the same outcome.
        mirrored = non_inferior(decide(-diffs, margin=margin), margin, higher_is_better=False)
        assert mirrored == (outcome, needed)
    assert seen == {"holds", "fails", "undecided"}


def test_below_zero_beyond_noise_but_maybe_within_the_margin_is_undecided():
    """FLSD-53's accuracy against CE's in the report's claim 8 is undecided.

    The difference is below 0 beyond noise but its one-sided bound crosses -0.01, so "not below
    by more than 0.01" is undecided.
    """
    from lightning_losses.reproduce.spec import Condition

    diffs = [-0.009, -0.012, -0.006, -0.010, -0.008]
    decision = decide(diffs, margin=0.01)
    assert decision.high < 0  # below 0 beyond noise
    condition = Condition("acc(a) not below acc(b) by 0.01", 0.9, ">=", 0.91, decision, 0.01)
    assert condition.outcome == "undecided"
    assert condition.seeds_text.startswith("needs ~")
    within = Condition("x", 0.9, ">=", 0.9, decide([-0.002, 0.001, -0.001, 0.0], margin=0.01), 0.01)
    assert within.result.startswith("holds: not below by more than 0.01")
    beyond = Condition("x", 0.9, ">=", 0.93, decide([-0.03, -0.025, -0.035], margin=0.01), 0.01)
    assert beyond.result == "fails: below by more than 0.01 beyond noise"
