"""Run specifications and verdict rules of ``lightning-losses reproduce``.

A :class:`Claim` is a statement of one seed, the :class:`Variant` runs that test it (a config
plus CLI overrides) and the numeric :class:`Condition` s that decide its verdict. A verdict is
``supported`` only when every condition holds on the numbers shown, ``not supported`` when none
holds, and ``mixed`` otherwise; a missing or NaN number never holds.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

#: Repository root: shipped configs are found relative to it from any working directory.
REPOSITORY = Path(__file__).resolve().parents[2]
#: Folder of the experiment files, one ``claim-<number>-<slug>.yaml`` per claim.
EXPERIMENTS = "configs/experiments"

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


def config_path(config: str) -> str:
    """``config`` as given if it exists, else relative to the repository root."""
    if Path(config).is_file():
        return config
    return str(REPOSITORY / config)


def override_argument(key: str, value: Any) -> str:
    """``--key=value`` for the CLI; booleans, None and numbers as YAML reads them back.

    Example:
        >>> override_argument("model.criterion.init_args.alpha", None)
        '--model.criterion.init_args.alpha=null'
    """
    text = value if isinstance(value, str) else json.dumps(value)
    return f"--{key}={text}"


def _overrides(mapping: Any, where: str) -> tuple[str, ...]:
    if mapping is None:
        return ()
    if not isinstance(mapping, Mapping):
        raise ValueError(f"{where}: overrides must be a mapping of dotted keys to values")
    return tuple(override_argument(str(k), v) for k, v in mapping.items())


def load_variants(path: str | Path) -> tuple[Variant, ...]:
    """The variants of an experiment file (``configs/experiments/claim-<n>-<slug>.yaml``).

    The file holds ``epochs`` (the default budget), optional ``overrides`` applied to every
    variant, and ``variants``: a list of ``{name, config, label, overrides, epochs}`` where
    ``overrides`` maps dotted CLI keys (``model.criterion.init_args.k``) to values.

    Raises:
        FileNotFoundError: no such file (the experiments ship with the repository, not the
            wheel).
        ValueError: a variant without ``name`` or ``config``, a repeated name, or
            ``overrides`` that are not a mapping.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"experiment file {str(path)!r} not found: run `lightning-losses reproduce` from a "
            f"checkout of the repository, which has {EXPERIMENTS}/"
        )
    spec = yaml.safe_load(path.read_text()) or {}
    epochs = int(spec.get("epochs", 15))
    shared = _overrides(spec.get("overrides"), f"{path}")
    variants: list[Variant] = []
    for i, item in enumerate(spec.get("variants") or []):
        where = f"{path}: variants[{i}]"
        if not isinstance(item, Mapping) or "name" not in item or "config" not in item:
            raise ValueError(f"{where} must be a mapping with at least 'name' and 'config'")
        name = str(item["name"])
        if any(v.name == name for v in variants):
            raise ValueError(f"{where}: variant name {name!r} is used twice")
        own = _overrides(item.get("overrides"), where)
        variants.append(
            Variant(
                name,
                str(item["config"]),
                (*shared, *own),
                int(item.get("epochs", epochs)),
                str(item.get("label", "")),
            )
        )
    if not variants:
        raise ValueError(f"{path}: 'variants' must list at least one variant")
    return tuple(variants)


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

    The runs are the variants of ``configs/experiments/<experiment>.yaml`` unless
    ``fixed_variants`` names them (claim 1, a closed-form analysis, has no configs).

    Args:
        number: claim number (1...).
        slug: short name; the MLflow experiment is ``claim-<number>-<slug>``.
        title: one line.
        statement: the claim as the seed makes it, and its seed.
        metrics: ``(MLflow metric key, column header)`` of the table.
        conditions: builds the verdict conditions from the table.
        rule: the verdict rule in words, printed in the report.
        fixed_variants: the runs when they do not come from an experiment file.
    """

    number: int
    slug: str
    title: str
    statement: str
    metrics: tuple[tuple[str, str], ...] = ()
    conditions: Callable[[Table], list[Condition]] = field(default=lambda table: [])
    rule: str = ""
    fixed_variants: tuple[Variant, ...] = ()

    @property
    def experiment(self) -> str:
        """MLflow experiment name, e.g. ``claim-3-gamma-ce``."""
        return f"claim-{self.number}-{self.slug}"

    @property
    def experiment_file(self) -> str:
        """Path of the claim's experiment file (``configs/experiments/claim-3-gamma-ce.yaml``)."""
        return config_path(f"{EXPERIMENTS}/{self.experiment}.yaml")

    @cached_property
    def variants(self) -> tuple[Variant, ...]:
        """The runs, each repeated over seeds (read once from the experiment file)."""
        return self.fixed_variants or load_variants(self.experiment_file)

    def variant(self, name: str) -> Variant:
        """The variant called ``name``."""
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)
