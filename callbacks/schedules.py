"""Pure schedules: a hyper-parameter value as a function of training progress.

A schedule is called as ``schedule(progress, total)``: ``progress`` is the current step (or
epoch), counted from 0, and ``total`` the number of steps (or epochs) of the whole run, so
progress runs over ``0, 1, ..., total - 1``. ``total`` is only used to resolve boundaries given
as fractions of training, so a schedule written with absolute steps can be called without it.

Boundaries (``start``, ``end``, ``milestones``) are either an ``int``, an absolute step or epoch
count, or a ``float`` in ``[0, 1]``, a fraction of training resolved as the step
``round(fraction * (total - 1))`` (Python's ``round``: halves go to the even integer): ``0.0``
is the first step, ``1.0`` the last one, so a schedule that ends at ``1.0`` takes its end value
at the last step of training. Write ``1.0``, not ``1``, for "the end of training" (the ``int``
``1`` is step 1).

A schedule also says which values bound it (:meth:`Schedule.extremes`), so a callback can check
them against the loss before training starts, and whether its timing depends on ``total``
(:attr:`Schedule.uses_fractions`): one with ``int`` boundaries only does not, so it keeps its
timing when a resumed run changes the length of training.

Each schedule is a small class, so it can be written in YAML as ``class_path``/``init_args``::

    schedule:
      class_path: lightning_losses.callbacks.CosineSchedule
      init_args: {start_value: 0.0, end_value: 1.0, start: 0.1, end: 0.9}
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Sequence
from itertools import pairwise
from numbers import Real
from typing import ClassVar

from typing_extensions import override

from lightning_losses.functional.checks import check_real

#: A boundary: an absolute step (or epoch) count, or a fraction of training in ``[0, 1]``.
Boundary = int | float

#: ``(progress, value)``: a value of a schedule and the earliest progress where it is taken.
Extreme = tuple[float, float]


def check_boundary(name: str, value: Boundary) -> Boundary:
    """Check a boundary: an ``int >= 0`` (absolute) or a ``float`` in ``[0, 1]`` (fraction)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name} must be a step/epoch count >= 0; got {value!r}")
        return value
    if isinstance(value, float):
        if not 0.0 <= value <= 1.0:
            raise ValueError(
                f"{name} is a float, so it is a fraction of training and must lie in [0, 1]; "
                f"got {value!r} (use an int for an absolute step or epoch)"
            )
        return value
    raise ValueError(
        f"{name} must be an int (absolute step or epoch) or a float in [0, 1] (fraction of "
        f"training); got {value!r}"
    )


def _after(later: Boundary, earlier: Boundary) -> bool | None:
    """Whether ``later > earlier`` when it is known without ``total``, else ``None``."""
    if type(later) is type(earlier) or later == 0 or earlier == 0:
        return later > earlier
    return None


def check_order(start_name: str, start: Boundary, end_name: str, end: Boundary) -> None:
    """``ValueError`` if ``end`` is not after ``start`` (when that is known without ``total``).

    An ``int`` and a fraction can only be compared once ``total`` is known, unless one is 0.

    Example:
        >>> check_order("start", 0.5, "end", 0.25)
        Traceback (most recent call last):
        ...
        ValueError: end must be after start; got start=0.5, end=0.25
    """
    if _after(end, start) is False:
        raise ValueError(
            f"{end_name} must be after {start_name}; got {start_name}={start!r}, {end_name}={end!r}"
        )


def resolve_boundary(name: str, value: Boundary, total: float | None) -> int:
    """The absolute step (or epoch) of a boundary.

    Steps are numbered ``0, ..., total - 1``: the fraction ``0.0`` is the first step and ``1.0``
    the last one.

    Args:
        name: the argument's name, for the error message.
        value: an ``int`` (returned as it is) or a fraction ``float`` in ``[0, 1]``.
        total: the number of steps (or epochs) of training; needed for a fraction.

    Returns:
        ``value`` for an ``int``, ``round(value * (total - 1))`` for a ``float`` (0 when
        ``total`` is 0).

    Example:
        >>> resolve_boundary("end", 1.0, 100), resolve_boundary("end", 0.5, 101)
        (99, 50)
        >>> resolve_boundary("end", 30, None)
        30
    """
    if not isinstance(value, float):
        return value
    if total is None:
        raise ValueError(
            f"{name}={value!r} is a fraction of training, so the schedule needs the total "
            "number of steps or epochs; got total=None"
        )
    if isinstance(total, bool) or not isinstance(total, Real) or not 0 <= total < math.inf:
        raise ValueError(
            f"{name}={value!r} is a fraction of training, so the total number of steps or "
            f"epochs must be finite and >= 0; got total={total!r}"
        )
    return round(value * max(total - 1, 0))


class Schedule(ABC):
    """A value as a pure function of training progress: ``value = schedule(progress, total)``."""

    #: The constructor arguments, shown by ``repr``.
    _fields: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def __call__(self, progress: float, total: float | None = None) -> float:
        """The value at ``progress`` (a step or epoch) of a run of ``total`` steps or epochs."""

    @property
    def uses_fractions(self) -> bool:
        """Whether a boundary is a fraction of training, so the timing depends on ``total``.

        The base class cannot tell and answers ``True``; the shipped schedules answer for
        their own boundaries.
        """
        return True

    def extremes(self, first: float, last: float, total: float | None = None) -> list[Extreme]:
        """The values that bound the schedule over ``first <= progress <= last``.

        Every ``schedule(p, total)`` with ``first <= p <= last`` lies between the smallest and
        the largest returned value; each comes with the earliest progress in the window where
        the schedule takes it. The base class assumes a monotone schedule and returns its
        values at ``first`` and ``last``; a schedule that is not monotone must override this.

        Args:
            first: the first step (or epoch) of the window.
            last: the last step (or epoch) of the window, ``math.inf`` for an unbounded run.
            total: the number of steps (or epochs) of training, to resolve fractions.
        """
        return [(first, self(first, total)), (last, self(last, total))]

    @override
    def __repr__(self) -> str:
        args = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({args})"


class ConstantSchedule(Schedule):
    """The same value at every step: ``value(p) = value``.

    Args:
        value: the value.

    Example:
        >>> ConstantSchedule(0.5)(1000)
        0.5
    """

    _fields = ("value",)

    def __init__(self, value: float) -> None:
        self.value = check_real("value", value)

    @override
    def __call__(self, progress: float, total: float | None = None) -> float:
        return self.value

    @property
    @override
    def uses_fractions(self) -> bool:
        return False

    @override
    def extremes(self, first: float, last: float, total: float | None = None) -> list[Extreme]:
        return [(first, self.value)]


class IntervalSchedule(Schedule):
    """Base of the schedules that go from ``start_value`` to ``end_value`` over ``[start, end]``.

    With ``s`` and ``e`` the resolved boundaries, the progress fraction is
    ``f = clamp((p - s) / (e - s), 0, 1)``; the value is ``start_value`` while ``f == 0`` (up to
    ``start``), ``end_value`` once ``f == 1`` (from ``end`` on) and ``interpolate(f)`` between.
    If rounding fractions makes ``e == s``, the value jumps from ``start_value`` to ``end_value``
    at ``s``.

    Args:
        start_value: the value up to ``start``.
        end_value: the value from ``end`` on.
        start: where the change begins: an absolute step (``int``) or a fraction (``float``).
        end: where the change ends, after ``start``; same forms.
    """

    _fields = ("start_value", "end_value", "start", "end")

    def __init__(
        self,
        start_value: float,
        end_value: float,
        start: Boundary = 0,
        end: Boundary = 1.0,
    ) -> None:
        self.start_value = check_real("start_value", start_value)
        self.end_value = check_real("end_value", end_value)
        self.start = check_boundary("start", start)
        self.end = check_boundary("end", end)
        check_order("start", self.start, "end", self.end)

    def fraction(self, progress: float, total: float | None = None) -> float:
        """``f = clamp((progress - s) / (e - s), 0, 1)`` with the resolved ``start``, ``end``."""
        s = resolve_boundary("start", self.start, total)
        e = resolve_boundary("end", self.end, total)
        if e < s:
            raise ValueError(
                f"end must be after start; got start={self.start!r} (step {s}) and "
                f"end={self.end!r} (step {e}) with total={total!r}"
            )
        if progress >= e:
            return 1.0
        if progress <= s:
            return 0.0
        return (progress - s) / (e - s)

    @abstractmethod
    def interpolate(self, fraction: float) -> float:
        """The value at ``0 < fraction < 1`` of the way from ``start_value`` to ``end_value``.

        It must lie between ``start_value`` and ``end_value`` and be monotone in ``fraction``
        (:meth:`extremes` relies on it).
        """

    @property
    @override
    def uses_fractions(self) -> bool:
        return isinstance(self.start, float) or isinstance(self.end, float)

    @override
    def extremes(self, first: float, last: float, total: float | None = None) -> list[Extreme]:
        """The values at ``first`` and ``last``: the schedule is monotone.

        The value at ``last`` is dated where it is first taken, ``end`` when the window
        reaches it.

        Example:
            >>> LinearSchedule(0.0, 2.0, end=0.5).extremes(0, 10, total=11)
            [(0, 0.0), (5, 2.0)]
        """
        end = resolve_boundary("end", self.end, total)
        reached = min(max(end, first), last)
        return [(first, self(first, total)), (reached, self(last, total))]

    @override
    def __call__(self, progress: float, total: float | None = None) -> float:
        f = self.fraction(progress, total)
        if f <= 0.0:
            return self.start_value
        if f >= 1.0:
            return self.end_value
        return self.interpolate(f)


class LinearSchedule(IntervalSchedule):
    """Linear: ``value = start_value + (end_value - start_value) * f``.

    ``f = clamp((p - s) / (e - s), 0, 1)``; see :class:`IntervalSchedule` for the arguments.

    Example:
        >>> schedule = LinearSchedule(0.0, 1.0, start=2, end=0.5)
        >>> [schedule(p, total=12) for p in (0, 2, 4, 6, 8)]
        [0.0, 0.0, 0.5, 1.0, 1.0]
    """

    @override
    def interpolate(self, fraction: float) -> float:
        return self.start_value + (self.end_value - self.start_value) * fraction


class CosineSchedule(IntervalSchedule):
    """Half-cosine: ``value = end_value + (start_value - end_value) * (1 + cos(pi f)) / 2``.

    ``f = clamp((p - s) / (e - s), 0, 1)``; see :class:`IntervalSchedule` for the arguments.

    Example:
        >>> schedule = CosineSchedule(1.0, 0.0, start=0, end=4)
        >>> [round(schedule(p), 4) for p in range(5)]
        [1.0, 0.8536, 0.5, 0.1464, 0.0]
    """

    @override
    def interpolate(self, fraction: float) -> float:
        cosine = (1.0 + math.cos(math.pi * fraction)) / 2.0
        return self.end_value + (self.start_value - self.end_value) * cosine


class ExponentialSchedule(IntervalSchedule):
    """Geometric: ``value = start_value * (end_value / start_value) ** f``.

    ``f = clamp((p - s) / (e - s), 0, 1)``; see :class:`IntervalSchedule` for the arguments.
    ``start_value`` and ``end_value`` must be non-zero and of the same sign.

    Example:
        >>> schedule = ExponentialSchedule(1.0, 0.01, start=0, end=1.0)
        >>> [round(schedule(p, total=5), 6) for p in range(5)]
        [1.0, 0.316228, 0.1, 0.031623, 0.01]
    """

    def __init__(
        self,
        start_value: float,
        end_value: float,
        start: Boundary = 0,
        end: Boundary = 1.0,
    ) -> None:
        super().__init__(start_value, end_value, start, end)
        if self.start_value * self.end_value <= 0.0:
            raise ValueError(
                "start_value and end_value of an exponential schedule must be non-zero and "
                f"of the same sign; got start_value={start_value!r}, end_value={end_value!r}"
            )

    @override
    def interpolate(self, fraction: float) -> float:
        return self.start_value * (self.end_value / self.start_value) ** fraction


class StepSchedule(Schedule):
    """Piecewise constant: ``value = values[k]``, ``k`` = the number of milestones ``<= p``.

    Args:
        values: the values, one more than ``milestones``.
        milestones: increasing boundaries, each an absolute step (``int``) or a fraction of
            training (``float`` in ``[0, 1]``).

    Example:
        >>> schedule = StepSchedule([1.0, 0.5, 0.1], milestones=[2, 0.5])
        >>> [schedule(p, total=8) for p in range(6)]
        [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]
    """

    _fields = ("values", "milestones")

    def __init__(self, values: Sequence[float], milestones: Sequence[Boundary]) -> None:
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ValueError(f"values must be a list of numbers; got {values!r}")
        if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Sequence):
            raise ValueError(f"milestones must be a list of boundaries; got {milestones!r}")
        if len(values) != len(milestones) + 1:
            raise ValueError(
                "values must have one more entry than milestones; got "
                f"{len(values)} values and {len(milestones)} milestones"
            )
        self.values = [check_real(f"values[{i}]", value) for i, value in enumerate(values)]
        self.milestones = [check_boundary(f"milestones[{i}]", m) for i, m in enumerate(milestones)]
        for i in range(1, len(self.milestones)):
            if _after(self.milestones[i], self.milestones[i - 1]) is False:
                raise ValueError(f"milestones must be increasing; got {list(milestones)!r}")

    @override
    def __call__(self, progress: float, total: float | None = None) -> float:
        steps = [
            resolve_boundary(f"milestones[{i}]", m, total) for i, m in enumerate(self.milestones)
        ]
        if any(later < earlier for earlier, later in pairwise(steps)):
            raise ValueError(
                f"milestones must be increasing; got {self.milestones!r}, which resolve to "
                f"steps {steps} with total={total!r}"
            )
        return self.values[bisect_right(steps, progress)]

    @property
    @override
    def uses_fractions(self) -> bool:
        return any(isinstance(milestone, float) for milestone in self.milestones)

    @override
    def extremes(self, first: float, last: float, total: float | None = None) -> list[Extreme]:
        """The value at ``first`` and the value from each milestone in ``(first, last]``.

        Example:
            >>> StepSchedule([1.0, 0.5, 3.0], milestones=[2, 0.5]).extremes(0, 5, total=8)
            [(0, 1.0), (2, 0.5), (4, 3.0)]
        """
        steps = [
            resolve_boundary(f"milestones[{i}]", m, total) for i, m in enumerate(self.milestones)
        ]
        inside = sorted({step for step in steps if first < step <= last})
        return [(first, self(first, total)), *((step, self(step, total)) for step in inside)]
