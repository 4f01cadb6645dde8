"""Run specifications and verdict rules of ``lightning-losses reproduce``.

A :class:`Claim` is a statement of one seed, the :class:`Variant` runs that test it (a config
plus CLI overrides) and the numeric :class:`Condition` s that decide its verdict. A verdict is
``supported`` only when every condition holds on the numbers shown, ``not supported`` when none
holds, and ``mixed`` otherwise; a missing or NaN number never holds.

Seed noise is part of every comparison. Variants share seeds (the same split and the same
initial weights per seed), so two variants are compared on their per-seed differences: a
difference counts only when its mean passes ``NOISE_SE`` standard errors of those paired
differences (:func:`compare`); a number against a constant passes ``NOISE_SE`` standard errors
of its mean (:func:`against`). A claim that something does *not* differ ("not better", "about
the same") holds unless the data show the opposite beyond the noise.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

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

#: A difference counts when its mean passes this many standard errors of the seed noise.
NOISE_SE = 2.0


class Stats(NamedTuple):
    """One metric of one variant over seeds.

    Args:
        mean: mean over the finite values.
        std: sample standard deviation (0 for one value).
        n: number of finite values.
        values: the value of each seed, in seed order (NaN where missing).
    """

    mean: float
    std: float
    n: int
    values: tuple[float, ...] = ()


#: ``table[variant][metric]``: the metric's :class:`Stats` over seeds.
Table = Mapping[str, Mapping[str, Stats]]

MISSING = Stats(math.nan, math.nan, 0)


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

    def fingerprint(self) -> str:
        """12 hex digits of SHA-1 over the config file's text and the overrides.

        A run is reused only under the same fingerprint: editing the config or the overrides
        of a variant makes ``reproduce`` train it again.
        """
        text = Path(config_path(self.config)).read_text() if self.config else ""
        digest = hashlib.sha1(text.encode())
        for override in self.overrides:
            digest.update(b"\0" + override.encode())
        return digest.hexdigest()[:12]


@dataclass(frozen=True)
class Condition:
    """A numeric comparison ``left op right``, the seed noise and the numbers it was decided on.

    With ``noise = 0`` the comparison is decided on the numbers alone. With ``noise > 0`` the
    difference in the claimed direction (``left - right`` for ``>``/``>=``, ``right - left``
    for ``<``/``<=``) must exceed ``noise``; when it lies within ``+-noise`` the outcome is
    ``within noise``, which holds only for claims of no difference (``noise_holds=True``).

    Args:
        text: what the comparison means, e.g. ``"ECE(gamma 0.5) < ECE(CE)"``.
        left: left-hand number.
        op: one of ``<``, ``<=``, ``>``, ``>=``.
        right: right-hand number.
        noise: the margin the difference must pass (``NOISE_SE`` standard errors).
        noise_holds: a difference within the noise supports the claim ("not better than",
            "about the same as").

    Example:
        >>> Condition("ECE(a) < ECE(b)", 0.020, "<", 0.025, noise=0.008).outcome
        'within noise'
    """

    text: str
    left: float
    op: str
    right: float
    noise: float = 0.0
    noise_holds: bool = False

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"op must be one of {', '.join(OPERATORS)}; got {self.op!r}")

    @property
    def margin(self) -> float:
        """The difference in the claimed direction (positive when the comparison is true)."""
        if self.op in (">", ">="):
            return self.left - self.right
        return self.right - self.left

    @property
    def outcome(self) -> str:
        """``holds``, ``fails``, ``within noise`` or ``missing``."""
        if _missing(self.left) or _missing(self.right) or _missing(self.noise):
            return "missing"
        if self.noise <= 0:
            return "holds" if OPERATORS[self.op](self.left, self.right) else "fails"
        if self.margin > self.noise:
            return "holds"
        if self.margin < -self.noise:
            return "fails"
        return "within noise"

    @property
    def holds(self) -> bool:
        """Whether the comparison supports the claim; False for a missing (NaN) number."""
        outcome = self.outcome
        return outcome == "holds" or (outcome == "within noise" and self.noise_holds)

    def describe(self) -> str:
        """One line: the rule, the numbers, the noise and whether it holds."""
        numbers = f"{self.text}: {self.left:.4f} {self.op} {self.right:.4f}"
        if self.noise <= 0:
            return f"{numbers} -> {self.outcome}"
        noise = f"(difference {self.margin:+.4f}, noise {NOISE_SE:g} SE = {self.noise:.4f})"
        outcome = self.outcome
        if outcome == "within noise":
            outcome += ": holds (no difference claimed)" if self.holds else ": does not hold"
        return f"{numbers} {noise} -> {outcome}"


def stats(table: Table, variant: str, metric: str) -> Stats:
    """The :class:`Stats` of ``metric`` for ``variant``; all-NaN when absent."""
    return table.get(variant, {}).get(metric, MISSING)


def paired_standard_error(a: Sequence[float], b: Sequence[float]) -> float:
    """Standard error of the mean of the per-seed differences ``a - b`` (0 below two pairs).

    Example:
        >>> round(paired_standard_error([1.0, 2.0, 3.0], [0.0, 1.0, 1.0]), 4)
        0.3333
    """
    pairs = [x - y for x, y in zip(a, b, strict=False) if not (_missing(x) or _missing(y))]
    if len(pairs) < 2:
        return 0.0
    return statistics.stdev(pairs) / math.sqrt(len(pairs))


def compare(
    table: Table,
    text: str,
    left: str,
    op: str,
    right: str,
    metric: str,
    *,
    offset: float = 0.0,
    noise_holds: bool = False,
    right_metric: str | None = None,
) -> Condition:
    """``mean(left) op mean(right) + offset`` on ``metric``, with the paired seed noise.

    With ``right_metric`` the right-hand side is that metric of ``right`` (e.g. the ECE after
    temperature scaling against the ECE before), still paired by seed.

    Args:
        table: the claim's table.
        text: what the comparison means.
        left: left-hand variant.
        op: one of ``<``, ``<=``, ``>``, ``>=``.
        right: right-hand variant.
        metric: MLflow metric key.
        offset: added to the right-hand mean (a tolerance, e.g. ``-0.01``).
        noise_holds: a difference within the noise supports the claim.
        right_metric: the right-hand metric, when it is not ``metric``.
    """
    a, b = stats(table, left, metric), stats(table, right, right_metric or metric)
    noise = NOISE_SE * paired_standard_error(a.values, b.values)
    return Condition(text, a.mean, op, b.mean + offset, noise, noise_holds)


def against(
    table: Table,
    text: str,
    variant: str,
    metric: str,
    op: str,
    value: float,
    *,
    noise_holds: bool = False,
) -> Condition:
    """``mean(variant) op value`` on ``metric``, with the standard error of the mean as noise.

    ``noise_holds``: a mean within the noise of ``value`` supports the claim ("within 3
    points of the published number").
    """
    a = stats(table, variant, metric)
    noise = NOISE_SE * a.std / math.sqrt(a.n) if a.n > 1 else 0.0
    return Condition(text, a.mean, op, value, noise, noise_holds)


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


@dataclass(frozen=True)
class Experiment:
    """The contents of an experiment file.

    Args:
        variants: the runs, each repeated over seeds.
        min_seeds: the fewest seeds the claim runs whatever ``--seeds`` says (a noisy
            metric, such as claim 4's rare-class scores on a test split with about 17
            positives, needs more).
    """

    variants: tuple[Variant, ...]
    min_seeds: int = 1


def load_experiment(path: str | Path) -> Experiment:
    """Read an experiment file (``configs/experiments/claim-<n>-<slug>.yaml``).

    The file holds ``epochs`` (the default budget), optional ``min_seeds``, optional
    ``overrides`` applied to every variant, and ``variants``: a list of ``{name, config,
    label, overrides, epochs}`` where ``overrides`` maps dotted CLI keys
    (``model.criterion.init_args.k``) to values.

    Raises:
        FileNotFoundError: no such file (the experiments ship with the repository, not the
            wheel).
        ValueError: a variant without ``name`` or ``config``, a repeated name,
            ``overrides`` that are not a mapping, or ``min_seeds`` below 1.
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
    min_seeds = spec.get("min_seeds", 1)
    if isinstance(min_seeds, bool) or not isinstance(min_seeds, int) or min_seeds < 1:
        raise ValueError(f"{path}: min_seeds must be an integer >= 1; got {min_seeds!r}")
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
    return Experiment(tuple(variants), min_seeds)


def load_variants(path: str | Path) -> tuple[Variant, ...]:
    """The variants of an experiment file (see :func:`load_experiment`)."""
    return load_experiment(path).variants


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
    return stats(table, variant, metric).mean


@dataclass(frozen=True)
class Claim:
    """A claim, the runs that test it and its verdict rule.

    The runs are the variants of ``configs/experiments/<experiment>.yaml`` unless
    ``fixed_variants`` names them (claim 1, a closed-form analysis, has no configs).

    Args:
        number: claim number (1...).
        slug: short name; the MLflow experiment is ``claim-<number>-<slug>``.
        title: one line.
        statement: the claim as its source makes it, and the source by author and title.
        metrics: ``(MLflow metric key, column header)`` of the table.
        conditions: builds the verdict conditions from the table.
        rule: the verdict rule in words, printed in the report.
        fixed_variants: the runs when they do not come from an experiment file.
        extra: more markdown for the claim's section, built from the table (per-loss
            verdicts, published numbers beside ours).
    """

    number: int
    slug: str
    title: str
    statement: str
    metrics: tuple[tuple[str, str], ...] = ()
    conditions: Callable[[Table], list[Condition]] = field(default=lambda table: [])
    rule: str = ""
    fixed_variants: tuple[Variant, ...] = ()
    extra: Callable[[Table], list[str]] | None = None

    @property
    def experiment(self) -> str:
        """MLflow experiment name, e.g. ``claim-3-gamma-ce``."""
        return f"claim-{self.number}-{self.slug}"

    @property
    def experiment_file(self) -> str:
        """Path of the claim's experiment file (``configs/experiments/claim-3-gamma-ce.yaml``)."""
        return config_path(f"{EXPERIMENTS}/{self.experiment}.yaml")

    @cached_property
    def _experiment(self) -> Experiment:
        if self.fixed_variants:
            return Experiment(self.fixed_variants)
        return load_experiment(self.experiment_file)

    @property
    def variants(self) -> tuple[Variant, ...]:
        """The runs, each repeated over seeds (read once from the experiment file)."""
        return self._experiment.variants

    def seeds(self, requested: int) -> int:
        """Seeds to run: ``requested``, or the experiment file's ``min_seeds`` if larger."""
        return max(requested, self._experiment.min_seeds)

    def variant(self, name: str) -> Variant:
        """The variant called ``name``."""
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)
