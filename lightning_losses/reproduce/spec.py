"""Run specifications and verdict rules of ``lightning-losses reproduce``.

A :class:`Claim` is a statement of one seed, the :class:`Variant` runs that test it (a config
plus CLI overrides) and the numeric :class:`Condition` s that decide its verdict. A verdict is
``supported`` only when every condition holds on the numbers shown, ``not supported`` when none
holds, and ``mixed`` otherwise; a missing or NaN number never holds.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

SUPPORTED = "supported"
NOT_SUPPORTED = "not supported"
MIXED = "mixed"

#: Comparison operators a condition may use.
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}

#: ``table[variant][metric] = (mean, std, n)`` over seeds.
Table = Mapping[str, Mapping[str, tuple[float, float, int]]]


@dataclass(frozen=True)
class Variant:
    """One arm of an experiment: a shipped config plus CLI overrides.

    Args:
        name: short identifier, also the MLflow tag ``variant``.
        config: path of the YAML config, relative to the repository root.
        overrides: extra ``--key=value`` arguments of ``lightning-losses fit``.
        epochs: epochs at ``--epochs-scale 1``.
        label: what the variant is, for the report.
    """

    name: str
    config: str
    overrides: tuple[str, ...] = ()
    epochs: int = 15
    label: str = ""

    def scaled_epochs(self, scale: float) -> int:
        """Epochs under ``--epochs-scale`` (at least one)."""
        return max(1, round(self.epochs * scale))


@dataclass(frozen=True)
class Condition:
    """A numeric comparison ``left op right`` with the numbers it was decided on.

    Args:
        text: what the comparison means, e.g. ``"ECE(gamma 0.5) < ECE(CE)"``.
        left: left-hand number.
        op: one of ``<``, ``<=``, ``>``, ``>=``.
        right: right-hand number.
    """

    text: str
    left: float
    op: str
    right: float

    @property
    def holds(self) -> bool:
        """Whether the comparison is true; False for a missing (NaN) number."""
        if self.op not in OPERATORS:
            raise ValueError(f"op must be one of {', '.join(OPERATORS)}; got {self.op!r}")
        if _missing(self.left) or _missing(self.right):
            return False
        return OPERATORS[self.op](self.left, self.right)

    def describe(self) -> str:
        """One line: the rule, the numbers and whether it holds."""
        mark = "holds" if self.holds else "fails"
        return f"{self.text}: {self.left:.4f} {self.op} {self.right:.4f} -> {mark}"


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def verdict(conditions: Sequence[Condition]) -> str:
    """``supported`` if every condition holds, ``not supported`` if none does, else ``mixed``.

    No conditions at all is ``not supported``: a claim needs numbers to be supported.

    Example:
        >>> verdict([Condition("a < b", 1.0, "<", 2.0)])
        'supported'
    """
    held = [c.holds for c in conditions]
    if held and all(held):
        return SUPPORTED
    if not any(held):
        return NOT_SUPPORTED
    return MIXED


def mean_of(table: Table, variant: str, metric: str) -> float:
    """Mean of ``metric`` over seeds for ``variant``, NaN when absent."""
    return table.get(variant, {}).get(metric, (math.nan, math.nan, 0))[0]


@dataclass(frozen=True)
class Claim:
    """A claim, the runs that test it and its verdict rule.

    Args:
        number: claim number (1...).
        slug: short name; the MLflow experiment is ``claim-<number>-<slug>``.
        title: one line.
        statement: the claim as the seed makes it, and its seed.
        variants: the runs (each repeated over seeds).
        metrics: ``(MLflow metric key, column header)`` of the table.
        conditions: builds the verdict conditions from the table.
        rule: the verdict rule in words, printed in the report.
    """

    number: int
    slug: str
    title: str
    statement: str
    variants: tuple[Variant, ...] = ()
    metrics: tuple[tuple[str, str], ...] = ()
    conditions: Callable[[Table], list[Condition]] = field(default=lambda table: [])
    rule: str = ""

    @property
    def experiment(self) -> str:
        """MLflow experiment name, e.g. ``claim-3-gamma-ce``."""
        return f"claim-{self.number}-{self.slug}"

    def variant(self, name: str) -> Variant:
        """The variant called ``name``."""
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)
