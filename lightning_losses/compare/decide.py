"""Decide whether two configurations differ, over seeds: one rule for ``compare`` and the report.

Given one value of a metric per seed for a candidate and a baseline, :func:`decide` says
whether the candidate is **better** or **worse** beyond the seed noise, **equivalent** within a
stated margin, or **undecided**, and in the last case about how many seeds would decide it.

- Paired (the same seeds on both sides, as ``--pair-by seed`` and the report's runs): the
  differences ``d_s = candidate_s - baseline_s``, their mean ``m`` and standard deviation ``s``,
  and Student's t with ``n - 1`` degrees of freedom: the two-sided interval
  ``m ± t_{(1+level)/2, n-1} s / sqrt(n)``.
- Unpaired: Welch's interval on the difference of the means (Welch-Satterthwaite degrees of
  freedom).
- A difference is *beyond noise* when that interval excludes 0 (a two-sided t-test at
  ``1 - level``).
- *Equivalent within a margin* ``delta`` is two one-sided tests at ``alpha = 1 - level``
  (Schuirmann's TOST): the ``1 - 2 alpha`` interval lies inside ``(-delta, delta)``. Failing to
  find a difference is never called equivalence.
- Equivalence is reported first: a difference that is beyond noise but inside the margin is
  ``equivalent`` (``Decision.different`` still says it was detected).
- Undecided: :attr:`Decision.seeds_needed` is the smallest number of seeds at which the same
  mean and standard deviation would decide either way (``None`` beyond 1,000 or with fewer than
  2 seeds).

Standard library and SciPy only (``scipy.stats.t``), imported by ``compare`` and ``reproduce``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["VERDICTS", "Decision", "decide", "non_inferior", "pair_by_seed", "t_interval"]

#: The verdicts :func:`decide` gives.
VERDICTS = ("better", "worse", "equivalent", "undecided")
#: The most seeds :attr:`Decision.seeds_needed` looks at.
MAX_SEEDS = 1000


def _t_quantile(probability: float, dof: float) -> float:
    from scipy.stats import t

    return float(t.ppf(probability, dof))


def _check_values(name: str, values: Sequence[float]) -> list[float]:
    values = [float(v) for v in values]
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"{name} must be finite numbers; got {values}")
    return values


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` and its two-sided Student-t interval at ``level``.

    ``mean ± t_{(1+level)/2, n-1} · sd / sqrt(n)``, ``sd`` with ``n - 1`` in the denominator;
    with one value the interval is ``(-inf, inf)``.

    Example:
        >>> mean, low, high = t_interval([1.0, 2.0, 3.0], level=0.95)
        >>> mean, round(low, 4), round(high, 4)
        (2.0, -0.4841, 4.4841)
    """
    # compare/ imports no torch at import time (the checks module does): imported when used
    from lightning_losses.functional.checks import check_fraction

    level = check_fraction("level", level, example="0.95")
    values = _check_values("values", values)
    if not values:
        raise ValueError("values must hold at least one number")
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, -math.inf, math.inf
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = _t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def pair_by_seed(
    candidate: Mapping[int, float], baseline: Mapping[int, float], *, option: str = "--pair-by"
) -> list[float]:
    """The paired differences ``candidate[s] - baseline[s]`` over the seeds, in seed order.

    Raises:
        ValueError: naming ``option`` and the seeds that only one side has.

    Example:
        >>> [round(d, 6) for d in pair_by_seed({0: 0.9, 1: 0.8}, {1: 0.7, 0: 0.85})]
        [0.05, 0.1]
    """
    only_candidate = sorted(set(candidate) - set(baseline))
    only_baseline = sorted(set(baseline) - set(candidate))
    if only_candidate or only_baseline:
        raise ValueError(
            f"{option}: the groups must hold the same seeds to be paired; seeds only in the "
            f"candidate: {only_candidate or 'none'}, only in the baseline: "
            f"{only_baseline or 'none'} (run the missing seeds, or compare unpaired)"
        )
    return [float(candidate[s]) - float(baseline[s]) for s in sorted(candidate)]


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` found: the difference, its interval, and the verdict.

    Attributes:
        verdict: one of :data:`VERDICTS`, from the candidate's side ("better": higher, or lower
            for a metric where lower is better).
        difference: mean of candidate minus baseline.
        low: low end of the two-sided interval of the difference at ``level``.
        high: high end.
        level: the level of the interval (and ``1 - level`` the tests' alpha).
        margin: the equivalence margin (0: equivalence is not tested).
        n: seeds (pairs, or the smaller group unpaired).
        different: the interval excludes 0.
        equivalent: TOST inside ``±margin`` at alpha ``1 - level``.
        seeds_needed: for "undecided", the seeds at which the same mean and spread would
            decide, else ``None``.
        method: ``"paired t"`` or ``"Welch t"``.
        tost_low: low end of the ``1 - 2 (1 - level)`` interval (the one-sided tests' bound).
        tost_high: its high end.
        sd: the per-seed spread behind the intervals (for seed counts).
    """

    verdict: str
    difference: float
    low: float
    high: float
    level: float
    margin: float
    n: int
    different: bool
    equivalent: bool
    seeds_needed: int | None
    method: str
    tost_low: float = -math.inf
    tost_high: float = math.inf
    sd: float = 0.0

    def describe(self, digits: int = 4) -> str:
        """The verdict in a few words, e.g. ``better (+0.0123, 95% CI [+0.0051, +0.0195])``.

        Example:
            >>> decide([0.01, 0.012, 0.011], margin=0.0).describe()
            'better (+0.0110, 95% paired t CI [+0.0085, +0.0135], n=3)'
        """
        ci = f"{self.level:.0%} {self.method} CI [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"
        head = self.verdict
        if self.verdict == "equivalent":
            head = f"equivalent within ±{self.margin:g}"
        elif self.verdict == "undecided":
            needs = (
                f"needs ~{self.seeds_needed} seeds"
                if self.seeds_needed is not None
                else f"more than {MAX_SEEDS} seeds"
                if self.n >= 2
                else "needs at least 2 seeds"
            )
            head = f"undecided ({needs})"
        return f"{head} ({self.difference:+.{digits}f}, {ci}, n={self.n})"


def _decided(mean: float, sd: float, n: int, level: float, margin: float) -> bool:
    """Whether ``n`` seeds with this mean and spread would give a verdict (paired t)."""
    if n < 2:
        return False
    se = sd / math.sqrt(n)
    if abs(mean) > _t_quantile((1 + level) / 2, n - 1) * se:
        return True
    return margin > 0 and abs(mean) + _t_quantile(level, n - 1) * se < margin


def _seeds_needed(mean: float, sd: float, n: int, level: float, margin: float) -> int | None:
    if n < 2:
        return None
    for seeds in range(n + 1, MAX_SEEDS + 1):
        if _decided(mean, sd, seeds, level, margin):
            return seeds
    return None


def decide(
    candidate: Sequence[float],
    baseline: Sequence[float] | None = None,
    *,
    margin: float,
    level: float = 0.95,
    higher_is_better: bool = True,
) -> Decision:
    """Decide candidate against baseline: better, worse, equivalent within ``margin``, undecided.

    Args:
        candidate: paired differences ``candidate - baseline`` per seed when ``baseline`` is
            ``None`` (see :func:`pair_by_seed`); else the candidate's value per seed.
        baseline: the baseline's values per seed, for an unpaired (Welch) comparison.
        margin: the equivalence margin ``delta >= 0`` in the metric's units; 0 never declares
            equivalence.
        level: the level of the two-sided interval; the tests run at ``alpha = 1 - level``.
        higher_is_better: the metric's direction (False for ECE, NLL, Brier).

    Returns:
        A :class:`Decision`.

    Raises:
        ValueError: ``level`` outside (0, 1), a negative or non-finite ``margin``, no values, or
            non-finite values.

    Example:
        >>> decide([0.010, 0.012, 0.011], margin=0.0).verdict  # consistent gain, 3 seeds
        'better'
        >>> decide([0.010, 0.012, 0.011], margin=0.0, higher_is_better=False).verdict
        'worse'
        >>> decide([0.001, -0.001, 0.0005, -0.0002], margin=0.01).verdict
        'equivalent'
        >>> d = decide([0.02, -0.01, 0.03], margin=0.005)
        >>> d.verdict, d.seeds_needed
        ('undecided', 12)
    """
    from lightning_losses.functional.checks import check_fraction, check_real

    level = check_fraction("level", level, example="0.95")
    margin = check_real("margin", margin, low=0.0)
    candidate = _check_values("candidate", candidate)
    if baseline is None:
        if not candidate:
            raise ValueError("candidate must hold at least one paired difference")
        n = len(candidate)
        mean, low, high = t_interval(candidate, level)
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in candidate) / (n - 1)) if n > 1 else 0.0
        if n > 1:
            _, tost_low, tost_high = t_interval(candidate, 1 - 2 * (1 - level))
        else:
            tost_low, tost_high = -math.inf, math.inf
        method = "paired t"
    else:
        baseline = _check_values("baseline", baseline)
        if len(candidate) < 1 or len(baseline) < 1:
            raise ValueError("candidate and baseline must each hold at least one value")
        mean, low, high, tost_low, tost_high, sd, n = _welch(candidate, baseline, level)
        method = "Welch t"
    different = low > 0 or high < 0
    equivalent = margin > 0 and -margin < tost_low and tost_high < margin
    if equivalent:
        verdict = "equivalent"
    elif different:
        verdict = "better" if (mean > 0) == higher_is_better else "worse"
    else:
        verdict = "undecided"
    needed = _seeds_needed(mean, sd, n, level, margin) if verdict == "undecided" else None
    return Decision(
        verdict,
        mean,
        low,
        high,
        level,
        float(margin),
        n,
        different,
        equivalent,
        needed,
        method,
        tost_low,
        tost_high,
        sd,
    )


def non_inferior(
    decision: Decision, margin: float, *, higher_is_better: bool = True
) -> tuple[str, int | None]:
    """Whether the candidate is not worse than the baseline by more than ``margin``.

    The one-sided tests at ``alpha = 1 - level`` on the ``1 - 2 alpha`` interval of the
    difference ``d`` (candidate minus baseline; with ``higher_is_better=False`` its negative,
    so that worse is always below): ``holds`` when its low end
    is above ``-margin`` (not worse by more than the margin), ``fails`` when its high end is
    below ``-margin`` (worse by more than the margin beyond noise), ``undecided`` otherwise,
    with the seeds at which the same mean and spread would decide (paired t; ``None`` past
    :data:`MAX_SEEDS` or with fewer than 2 seeds). A difference below 0 beyond noise but
    within the margin is not a failure.

    Example:
        >>> d = decide([-0.009, -0.012, -0.006, -0.010, -0.008], margin=0.01)
        >>> d.high < 0, non_inferior(d, 0.01)  # below 0 beyond noise; within 0.01 undecided
        (True, ('undecided', 16))
        >>> non_inferior(decide([-0.002, 0.001, -0.001, 0.0], margin=0.01), 0.01)
        ('holds', None)
        >>> non_inferior(decide([-0.03, -0.025, -0.035], margin=0.01), 0.01)
        ('fails', None)
    """
    sign = 1.0 if higher_is_better else -1.0
    low, high = sorted((sign * decision.tost_low, sign * decision.tost_high))
    mean = sign * decision.difference
    if low > -margin:
        return "holds", None
    if high < -margin:
        return "fails", None
    if decision.n < 2:
        return "undecided", None
    for seeds in range(decision.n + 1, MAX_SEEDS + 1):
        half = _t_quantile(decision.level, seeds - 1) * decision.sd / math.sqrt(seeds)
        if mean - half > -margin or mean + half < -margin:
            return "undecided", seeds
    return "undecided", None


def _welch(
    a: list[float], b: list[float], level: float
) -> tuple[float, float, float, float, float, float, int]:
    """Welch's intervals of ``mean(a) - mean(b)`` at ``level`` and ``1 - 2 (1 - level)``.

    Also returns a per-seed spread ``sd`` such that ``sd / sqrt(n)`` is the standard error at
    ``n = min(len(a), len(b))`` (for :func:`_seeds_needed`), and ``n``.
    """
    na, nb = len(a), len(b)
    ma, mb = math.fsum(a) / na, math.fsum(b) / nb
    mean = ma - mb
    if na < 2 or nb < 2:
        return mean, -math.inf, math.inf, -math.inf, math.inf, 0.0, min(na, nb)
    va = math.fsum((v - ma) ** 2 for v in a) / (na - 1)
    vb = math.fsum((v - mb) ** 2 for v in b) / (nb - 1)
    se2 = va / na + vb / nb
    se = math.sqrt(se2)
    if se == 0.0:
        return mean, mean, mean, mean, mean, 0.0, min(na, nb)
    dof = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    half = _t_quantile((1 + level) / 2, dof) * se
    tost_half = _t_quantile(level, dof) * se
    n = min(na, nb)
    return mean, mean - half, mean + half, mean - tost_half, mean + tost_half, se * math.sqrt(n), n
