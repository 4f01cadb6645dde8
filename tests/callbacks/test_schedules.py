"""The pure schedules against their closed forms, at every integer step of a run."""

from __future__ import annotations

import doctest
import math
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_losses.callbacks import (
    ConstantSchedule,
    CosineSchedule,
    ExponentialSchedule,
    LinearSchedule,
    Schedule,
    StepSchedule,
)
from lightning_losses.callbacks import schedules as schedules_module

# (start, end, total, s, e): the boundaries as given, and the steps they resolve to, worked out
# by hand from round(fraction * (total - 1)), steps being 0..total-1 (Python rounds halves to
# even: 2.5 -> 2, 7.5 -> 8, 13.5 -> 14).
TIMINGS = [
    pytest.param(0, 10, 10, 0, 10, id="ints"),
    pytest.param(0.1, 0.9, 21, 2, 18, id="fractions"),
    pytest.param(3, 0.5, 16, 3, 8, id="int-start-fraction-end"),
    pytest.param(0.0, 7, 9, 0, 7, id="fraction-start-int-end"),
    pytest.param(0.25, 1.0, 11, 2, 10, id="half-rounds-to-even"),
    pytest.param(0.25, 0.75, 19, 4, 14, id="halves-both-ways"),
    pytest.param(5, 12, 8, 5, 12, id="end-after-total"),
]
VALUES = [(0.0, 1.0), (2.0, -1.0), (0.5, 0.5), (-3.0, 4.0)]
POSITIVE_VALUES = [(1.0, 0.01), (0.2, 5.0), (-2.0, -0.5)]


def clamped_fraction(p: int, s: int, e: int) -> float:
    return min(max((p - s) / (e - s), 0.0), 1.0)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize(("lo", "hi"), VALUES)
@pytest.mark.parametrize(("start", "end", "total", "s", "e"), TIMINGS)
def test_linear_closed_form(lo, hi, start, end, total, s, e):
    schedule = LinearSchedule(lo, hi, start=start, end=end)
    for p in range(total + 1):
        expected = lo + (hi - lo) * clamped_fraction(p, s, e)
        assert close(schedule(p, total), expected), (p, schedule(p, total), expected)


@pytest.mark.parametrize(("lo", "hi"), VALUES)
@pytest.mark.parametrize(("start", "end", "total", "s", "e"), TIMINGS)
def test_cosine_closed_form(lo, hi, start, end, total, s, e):
    schedule = CosineSchedule(lo, hi, start=start, end=end)
    for p in range(total + 1):
        f = clamped_fraction(p, s, e)
        expected = hi + (lo - hi) * (1 + math.cos(math.pi * f)) / 2
        assert close(schedule(p, total), expected), (p, schedule(p, total), expected)


@pytest.mark.parametrize(("lo", "hi"), POSITIVE_VALUES)
@pytest.mark.parametrize(("start", "end", "total", "s", "e"), TIMINGS)
def test_exponential_closed_form(lo, hi, start, end, total, s, e):
    schedule = ExponentialSchedule(lo, hi, start=start, end=end)
    for p in range(total + 1):
        expected = lo * (hi / lo) ** clamped_fraction(p, s, e)
        assert close(schedule(p, total), expected), (p, schedule(p, total), expected)


def test_exponential_midpoint_is_geometric_mean():
    schedule = ExponentialSchedule(4.0, 1.0, start=0, end=10)
    assert close(schedule(5), 2.0)


@pytest.mark.parametrize(
    ("values", "milestones", "total", "expected"),
    [
        ([1.0, 0.5, 0.1], [2, 5], None, [1.0, 1.0, 0.5, 0.5, 0.5, 0.1, 0.1, 0.1]),
        ([1.0, 0.5, 0.1], [0.25, 0.5], 8, [1.0, 1.0, 0.5, 0.5, 0.1, 0.1, 0.1, 0.1, 0.1]),
        ([3.0, 2.0, 1.0], [1, 0.5], 7, [3.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0]),
        ([7.0], [], None, [7.0, 7.0, 7.0]),
        ([0.0, 1.0], [0], None, [1.0, 1.0]),
        # 0.3 * 3 and 0.35 * 3 both round to 1: the middle value is skipped.
        ([1.0, 2.0, 3.0], [0.3, 0.35], 4, [1.0, 3.0, 3.0, 3.0, 3.0]),
    ],
)
def test_step_closed_form(values, milestones, total, expected):
    schedule = StepSchedule(values, milestones)
    assert [schedule(p, total) for p in range(len(expected))] == expected


@pytest.mark.parametrize("total", [None, 0, 10, math.inf])
def test_constant(total):
    schedule = ConstantSchedule(0.25)
    assert [schedule(p, total) for p in range(12)] == [0.25] * 12


@pytest.mark.parametrize("cls", [LinearSchedule, CosineSchedule, ExponentialSchedule])
def test_exact_values_outside_the_interval(cls):
    schedule = cls(0.3, 0.7, start=4, end=0.5)
    for p in (-5, 0, 3, 4):
        assert schedule(p, 20) == 0.3
    for p in (10, 11, 20, 1000):
        assert schedule(p, 20) == 0.7
    assert 0.3 < schedule(7, 20) < 0.7


def test_int_boundaries_need_no_total():
    schedule = LinearSchedule(0.0, 1.0, start=2, end=6)
    assert [schedule(p) for p in range(8)] == [0.0, 0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert schedule(4, math.inf) == 0.5


def test_boundaries_rounded_together_make_a_jump():
    schedule = LinearSchedule(0.0, 1.0, start=2, end=0.5)
    assert [schedule(p, 4) for p in range(5)] == [0.0, 0.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("cls", [LinearSchedule, CosineSchedule, ExponentialSchedule])
@pytest.mark.parametrize(
    ("total", "match"),
    [(None, r"start=0\.1 is a fraction.*total=None"), (math.inf, r"finite.*total=inf")],
)
def test_fraction_needs_a_finite_total(cls, total, match):
    with pytest.raises(ValueError, match=match):
        cls(1.0, 2.0, start=0.1, end=0.9)(3, total)


def test_step_fraction_needs_a_total():
    with pytest.raises(ValueError, match=r"milestones\[0\]=0\.5 is a fraction.*total=None"):
        StepSchedule([1.0, 2.0], [0.5])(3)


def test_mixed_boundaries_resolving_out_of_order():
    with pytest.raises(ValueError, match=r"end must be after start.*step 30.*step 5"):
        LinearSchedule(0.0, 1.0, start=30, end=0.5)(0, 11)
    with pytest.raises(ValueError, match=r"milestones must be increasing.*\[30, 5\]"):
        StepSchedule([1.0, 2.0, 3.0], [30, 0.5])(0, 11)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start": 5, "end": 5}, r"end must be after start"),
        ({"start": 6, "end": 2}, r"end must be after start"),
        ({"start": 0.5, "end": 0.5}, r"end must be after start"),
        ({"start": 0, "end": 0.0}, r"end must be after start"),
        ({"start": 0.3, "end": 0}, r"end must be after start"),
        ({"start": -1}, r"start must be a step/epoch count >= 0"),
        ({"end": 1.5}, r"end is a float.*\[0, 1\]"),
        ({"end": -0.1}, r"end is a float"),
        ({"start": "0"}, r"start must be an int"),
        ({"start": True}, r"start must be an int"),
        ({"end": math.nan}, r"end is a float"),
        ({"start_value": math.nan}, r"start_value must be a finite real number"),
        ({"end_value": math.inf}, r"end_value must be a finite real number"),
        ({"end_value": None}, r"end_value must be a finite real number"),
    ],
)
@pytest.mark.parametrize("cls", [LinearSchedule, CosineSchedule, ExponentialSchedule])
def test_interval_schedule_bad_arguments(cls, kwargs, match):
    arguments = {"start_value": 1.0, "end_value": 2.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        cls(**arguments)


@pytest.mark.parametrize(("start_value", "end_value"), [(0.0, 1.0), (1.0, 0.0), (1.0, -1.0)])
def test_exponential_needs_non_zero_values_of_one_sign(start_value, end_value):
    with pytest.raises(ValueError, match=r"start_value and end_value .* non-zero .* same sign"):
        ExponentialSchedule(start_value, end_value)


@pytest.mark.parametrize(
    ("values", "milestones", "match"),
    [
        ([1.0, 2.0], [], r"values must have one more entry than milestones"),
        ([1.0], [3], r"values must have one more entry than milestones"),
        ([1.0, 2.0, 3.0], [5, 3], r"milestones must be increasing"),
        ([1.0, 2.0, 3.0], [0.5, 0.5], r"milestones must be increasing"),
        ([1.0, 2.0], [1.5], r"milestones\[0\] is a float"),
        ([1.0, 2.0], [-2], r"milestones\[0\] must be a step/epoch count"),
        ([1.0, math.nan], [2], r"values\[1\] must be a finite real number"),
        (1.0, [], r"values must be a list"),
        ([1.0, 2.0], 3, r"milestones must be a list"),
    ],
)
def test_step_bad_arguments(values, milestones, match):
    with pytest.raises(ValueError, match=match):
        StepSchedule(values, milestones)


def test_constant_bad_argument():
    with pytest.raises(ValueError, match="value must be a finite real number"):
        ConstantSchedule(math.inf)


@given(
    lo=st.floats(-10, 10),
    hi=st.floats(-10, 10),
    s=st.integers(0, 50),
    length=st.integers(1, 50),
)
def test_linear_and_cosine_are_monotone_and_bounded(lo, hi, s, length):
    e = s + length
    for cls in (LinearSchedule, CosineSchedule):
        schedule = cls(lo, hi, start=s, end=e)
        values = [schedule(p) for p in range(e + 3)]
        assert all(min(lo, hi) - 1e-12 <= v <= max(lo, hi) + 1e-12 for v in values)
        steps = [b - a for a, b in pairwise(values)]
        sign = 1.0 if hi >= lo else -1.0
        assert all(sign * d >= -1e-12 for d in steps)


# --- extremes: the values that bound a schedule over a window ---------------------------------


def assert_extremes_bound(schedule: Schedule, first: int, last: int, total: int) -> None:
    """Each extreme is the schedule's value where it is dated, inside the window.

    Every value at an integer step of the window lies between the smallest and the largest.
    """
    extremes = schedule.extremes(first, last, total)
    for at, value in extremes:
        assert first <= at <= last, (at, extremes)
        assert schedule(at, total) == value, (at, value)
    low = min(value for _, value in extremes)
    high = max(value for _, value in extremes)
    for p in range(first, last + 1):
        assert low - 1e-12 <= schedule(p, total) <= high + 1e-12, (p, extremes)


@given(
    lo=st.floats(0.01, 10),
    hi=st.floats(0.01, 10),
    start=st.integers(0, 30) | st.floats(0.0, 0.4),
    end=st.integers(31, 60) | st.floats(0.5, 1.0),
    total=st.integers(1, 80),
    first=st.integers(0, 80),
    length=st.integers(0, 80),
)
def test_interval_extremes_bound_every_value(lo, hi, start, end, total, first, length):
    resolved = [round(b * total) if isinstance(b, float) else b for b in (start, end)]
    if resolved[1] < resolved[0]:
        return  # boundaries out of order for this total: an error (tested above)
    for cls in (LinearSchedule, CosineSchedule, ExponentialSchedule):
        schedule = cls(lo, hi, start=start, end=end)
        assert_extremes_bound(schedule, first, first + length, total)


@given(
    values=st.lists(st.floats(-5, 5), min_size=1, max_size=6),
    gaps=st.lists(st.integers(1, 10), min_size=5, max_size=5),
    first=st.integers(0, 40),
    length=st.integers(0, 40),
)
def test_step_extremes_bound_every_value(values, gaps, first, length):
    milestones = [sum(gaps[: i + 1]) for i in range(len(values) - 1)]
    schedule = StepSchedule(values, milestones)
    assert_extremes_bound(schedule, first, first + length, 50)


def test_extremes_closed_forms():
    # The end value is dated at the resolved end (0.5 * (11 - 1) = 5) when the window reaches it.
    assert LinearSchedule(0.0, 2.0, start=2, end=0.5).extremes(0, 10, 11) == [(0, 0.0), (5, 2.0)]
    # A window that stops before the end: its first and last values, (1 + cos(pi p / 4)) / 2.
    (at_1, first), (at_2, last) = CosineSchedule(1.0, 0.0, start=0, end=4).extremes(1, 2)
    assert (at_1, at_2) == (1, 2)
    assert close(first, (1 + math.cos(math.pi / 4)) / 2)
    assert close(last, 0.5)
    # A run of 8 steps: 0..7, the end value at the last one.
    assert ExponentialSchedule(1.0, 0.01).extremes(0, 7, 8) == [(0, 1.0), (7, 0.01)]
    # Every value of a step schedule whose milestone lies in (first, last]: 0.25 * 7 -> 2.
    step = StepSchedule([5.0, 0.5, 3.0, 9.0], milestones=[0.25, 4, 100])
    assert step.extremes(0, 8, 8) == [(0, 5.0), (2, 0.5), (4, 3.0)]
    assert step.extremes(3, 8, 8) == [(3, 0.5), (4, 3.0)]
    assert step.extremes(0, math.inf, 8) == [
        (0, 5.0),
        (2, 0.5),
        (4, 3.0),
        (100, 9.0),
    ]
    assert ConstantSchedule(0.3).extremes(0, 10) == [(0, 0.3)]


def test_extremes_of_an_unbounded_run_with_int_boundaries():
    assert LinearSchedule(0.0, 1.0, start=3, end=7).extremes(0, math.inf) == [(0, 0.0), (7, 1.0)]


def test_extremes_need_a_total_for_fractions():
    with pytest.raises(ValueError, match=r"end=0\.5 is a fraction.*total=None"):
        LinearSchedule(0.0, 1.0, end=0.5).extremes(0, 10)


def test_base_schedule_extremes_are_its_ends():
    class Square(Schedule):
        def __call__(self, progress: float, total: float | None = None) -> float:
            return float(progress) ** 2

    assert Square().extremes(2, 5) == [(2, 4.0), (5, 25.0)]
    assert Square().uses_fractions  # it cannot tell, so it is assumed to depend on the total


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (ConstantSchedule(1.0), False),
        (LinearSchedule(0.0, 1.0, start=0, end=10), False),
        (LinearSchedule(0.0, 1.0, start=0, end=1.0), True),
        (CosineSchedule(0.0, 1.0, start=0.0, end=10), True),
        (ExponentialSchedule(1.0, 2.0, start=2, end=5), False),
        (StepSchedule([1.0, 2.0], [3]), False),
        (StepSchedule([1.0, 2.0, 3.0], [3, 0.5]), True),
    ],
)
def test_uses_fractions(schedule, expected):
    assert schedule.uses_fractions is expected


def test_repr_shows_the_arguments():
    assert repr(CosineSchedule(1.0, 0.0, start=0.1, end=20)) == (
        "CosineSchedule(start_value=1.0, end_value=0.0, start=0.1, end=20)"
    )
    assert repr(StepSchedule([1, 2], [3])) == "StepSchedule(values=[1.0, 2.0], milestones=[3])"


def test_docstring_examples():
    results = doctest.testmod(schedules_module)
    assert results.attempted > 0
    assert results.failed == 0
