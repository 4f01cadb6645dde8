"""Run specifications and verdict rules of ``lightning-losses reproduce``.

A :class:`Claim` is a statement of one source, the :class:`Variant` runs that test it (a
config plus CLI overrides) and the numeric :class:`Condition` s that decide its verdict.

Seed noise is part of every comparison, and one rule decides them all: :func:`decide` of
:mod:`lightning_losses.compare.decide`, the rule of ``lightning-losses compare --group-by``.
Variants share seeds (the same split and the same initial weights per seed), so two variants
are compared on their per-seed differences (:func:`compare`), a number against a constant on
the differences of each seed's value from it (:func:`against`): Student's t interval for the
number of seeds at :data:`LEVEL`, and two one-sided tests (TOST) against an equivalence
margin. What a condition claims decides which of :func:`decide`'s verdicts support it
(:data:`SUPPORTING`):

- ``<``, ``>``: a difference in that direction; it holds when the interval lies on the
  claimed side of 0 ("better"), and fails when it lies on the other side or, with a margin,
  when the difference is equivalent to 0 within it.
- ``<=``, ``>=``: not worse than the other side by more than ``margin`` (non-inferiority,
  :func:`~lightning_losses.compare.decide.non_inferior`): it holds when the one-sided test at
  5% puts the difference above ``-margin`` (on the worse side), and fails when it puts it
  beyond ``-margin``; a difference on the worse side of 0 beyond noise but possibly within
  the margin is undecided, not a failure. Without a margin: holds on the claimed side
  beyond noise, fails on the other side beyond it.
- ``~``: about the same within ``margin`` (which must be > 0); it holds when TOST shows the
  difference inside ``(-margin, margin)``, and fails when it is beyond the noise either way.

Anything else is ``undecided``, with the number of seeds that the same mean and spread would
need to decide it. A claim is ``supported`` when every condition holds, ``not supported`` when
every condition fails, ``mixed`` when at least one holds and one fails, and ``undecided``
otherwise (some conditions undecided, the others all holding or all failing). A missing or NaN
number never holds.
"""

from __future__ import annotations

import dataclasses
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

from lightning_losses.compare.decide import MAX_SEEDS, Decision, decide, non_inferior

#: Repository root: shipped configs are found relative to it from any working directory.
REPOSITORY = Path(__file__).resolve().parents[2]
#: Folder of the experiment files, one ``claim-<number>-<slug>.yaml`` per claim.
EXPERIMENTS = "configs/experiments"
#: What fits a variant's config (an experiment file's ``program``): the classifier CLI
#: (``lightning-losses fit``) or the language model's (``python -m lightning_losses.lm fit``).
PROGRAMS = ("classifier", "lm")

SUPPORTED = "supported"
NOT_SUPPORTED = "not supported"
MIXED = "mixed"
UNDECIDED = "undecided"

#: Level of every two-sided interval of the report; the tests run at ``alpha = 1 - LEVEL``.
LEVEL = 0.95

#: Comparison operators a condition decided on the numbers alone may use (``~``: within the
#: condition's margin).
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
#: The operator of a condition of equivalence ("about the same").
EQUIVALENT = "~"
#: The verdicts of :func:`decide` that support a condition, by its operator.
#: Operators read as "not worse by more than the margin" when a margin is given.
NON_INFERIORITY = frozenset({"<=", ">="})

SUPPORTING: dict[str, frozenset[str]] = {
    "<": frozenset({"better"}),
    ">": frozenset({"better"}),
    "<=": frozenset({"better", "equivalent"}),
    ">=": frozenset({"better", "equivalent"}),
    EQUIVALENT: frozenset({"equivalent"}),
}


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
        program: what fits the config: ``"classifier"`` (``lightning-losses fit``) or
            ``"lm"`` (``python -m lightning_losses.lm fit``, the tiny language model);
            :data:`PROGRAMS`.
    """

    name: str
    config: str
    overrides: tuple[str, ...] = ()
    epochs: int = 15
    label: str = ""
    program: str = "classifier"

    def scaled_epochs(self, scale: float) -> int:
        """Epochs under ``--epochs-scale`` (at least one)."""
        return max(1, round(self.epochs * scale))

    def fingerprint(self) -> str:
        """12 hex digits of SHA-1 over the config file's text and the overrides.

        A run is reused only under the same fingerprint (and the same code version, see
        :mod:`~lightning_losses.reproduce.version`): editing the config or the overrides of a
        variant makes ``reproduce`` train it again.
        """
        text = Path(config_path(self.config)).read_text() if self.config else ""
        digest = hashlib.sha1(text.encode())
        for override in self.overrides:
            digest.update(b"\0" + override.encode())
        return digest.hexdigest()[:12]


def seeds_text(decision: Decision) -> str:
    """What an undecided :class:`Decision` needs, e.g. ``needs ~12 seeds``.

    Example:
        >>> seeds_text(decide([0.02, -0.01, 0.03], margin=0.005))
        'needs ~12 seeds'
    """
    if decision.seeds_needed is not None:
        return f"needs ~{decision.seeds_needed} seeds"
    if decision.n < 2:
        return "needs at least 2 seeds"
    return f"needs more than {MAX_SEEDS} seeds"


@dataclass(frozen=True)
class Condition:
    """A comparison ``left op right``, decided over seeds (``decision``) or on the numbers.

    With a ``decision`` (from :func:`compare` or :func:`against`) the outcome is the verdict
    of :func:`decide` on the per-seed differences read by :data:`SUPPORTING`; without one
    (claim 1's closed form, a median over seeds) it is the comparison of the numbers.

    Args:
        text: what the comparison means, e.g. ``"ECE(gamma 0.5) < ECE(CE)"``.
        left: left-hand number (a mean over seeds).
        op: one of ``<``, ``<=``, ``>``, ``>=`` and ``~`` (about the same within ``margin``).
        right: right-hand number.
        decision: :func:`decide` on the per-seed differences ``left - right``, or None.
        margin: the equivalence margin, in the metric's units (required for ``~``).

    Example:
        >>> c = compare(
        ...     {"a": {"m": Stats(0, 0, 3, (0.020, 0.030, 0.010))},
        ...      "b": {"m": Stats(0, 0, 3, (0.025, 0.020, 0.030))}},
        ...     "m(a) < m(b)", "a", "<", "b", "m")
        >>> c.outcome, c.seeds_text
        ('undecided', 'needs ~38 seeds')
    """

    text: str
    left: float
    op: str
    right: float
    decision: Decision | None = None
    margin: float = 0.0

    def __post_init__(self) -> None:
        if self.op not in SUPPORTING:
            raise ValueError(f"op must be one of {', '.join(SUPPORTING)}; got {self.op!r}")
        from lightning_losses.functional.checks import check_real

        check_real("margin", self.margin, low=0.0)
        if self.op == EQUIVALENT and self.margin <= 0:
            raise ValueError(
                f"{self.text!r}: op '~' (about the same) needs an equivalence margin > 0; "
                "pass margin=..."
            )

    @property
    def difference(self) -> float:
        """Mean of ``left - right`` (over the paired seeds, with a decision)."""
        if self.decision is not None:
            return self.decision.difference
        return self.left - self.right

    @property
    def outcome(self) -> str:
        """``holds``, ``fails``, ``undecided`` or ``missing``."""
        if _missing(self.left) or _missing(self.right):
            return "missing"
        if self.decision is None:
            if self.op == EQUIVALENT:
                return "holds" if abs(self.left - self.right) < self.margin else "fails"
            return "holds" if OPERATORS[self.op](self.left, self.right) else "fails"
        if self.op in NON_INFERIORITY and self.margin > 0:
            outcome = self._non_inferior()[0]
            return UNDECIDED if outcome == "undecided" else outcome
        if self.decision.verdict in SUPPORTING[self.op]:
            return "holds"
        if self.decision.verdict == "undecided":
            return UNDECIDED
        return "fails"

    def _non_inferior(self) -> tuple[str, int | None]:
        """:func:`non_inferior` of the decision, in the direction of ``op``."""
        assert self.decision is not None
        return non_inferior(self.decision, self.margin, higher_is_better=self.op == ">=")

    @property
    def holds(self) -> bool:
        """Whether the comparison supports the claim; False for a missing (NaN) number."""
        return self.outcome == "holds"

    @property
    def seeds_text(self) -> str:
        """For an undecided condition, e.g. ``needs ~12 seeds``; else ``""``."""
        if self.outcome != UNDECIDED or self.decision is None:
            return ""
        if self.op in NON_INFERIORITY and self.margin > 0:
            needed = self._non_inferior()[1]
            return seeds_text(dataclasses.replace(self.decision, seeds_needed=needed))
        return seeds_text(self.decision)

    @property
    def result(self) -> str:
        """The outcome with its reason, e.g. ``holds: equivalent within ±0.01``."""
        outcome, decision = self.outcome, self.decision
        if decision is None or outcome == "missing":
            return outcome
        if outcome == UNDECIDED:
            return f"undecided ({self.seeds_text})"
        if self.op in NON_INFERIORITY and self.margin > 0:
            side = "below" if self.op == ">=" else "above"
            if outcome == "holds":
                return f"holds: not {side} by more than {self.margin:g} (one-sided t, 5%)"
            return f"fails: {side} by more than {self.margin:g} beyond noise"
        if decision.verdict == "equivalent":
            return f"{outcome}: equivalent within ±{self.margin:g}"
        if outcome == "holds":
            return "holds: beyond noise"
        if self.op == EQUIVALENT:
            return "fails: differs beyond noise"
        return "fails: the other way beyond noise"

    def describe(self) -> str:
        """One line: the rule, the numbers, the interval of the difference and the outcome."""
        numbers = f"{self.text}: {self.left:.4f} {self.op} {self.right:.4f}"
        decision = self.decision
        if decision is None or self.outcome == "missing":
            return f"{numbers} -> {self.outcome}"
        interval = (
            f"difference {decision.difference:+.4f}, {decision.level:.0%} {decision.method} "
            f"CI [{decision.low:+.4f}, {decision.high:+.4f}], n={decision.n}"
        )
        if self.margin > 0:
            interval += f", margin ±{self.margin:g}"
        return f"{numbers} ({interval}) -> {self.result}"


def stats(table: Table, variant: str, metric: str) -> Stats:
    """The :class:`Stats` of ``metric`` for ``variant``; all-NaN when absent."""
    return table.get(variant, {}).get(metric, MISSING)


def paired_differences(a: Sequence[float], b: Sequence[float], offset: float = 0.0) -> list[float]:
    """``a_s - (b_s + offset)`` for each seed where both are numbers, in seed order.

    Example:
        >>> paired_differences([1.0, 2.0, float("nan")], [0.0, 1.5, 1.0])
        [1.0, 0.5]
    """
    return [
        x - (y + offset) for x, y in zip(a, b, strict=False) if not (_missing(x) or _missing(y))
    ]


def _decision(differences: Sequence[float], op: str, margin: float, level: float) -> Decision:
    return decide(
        differences, margin=margin, level=level, higher_is_better=op != "<" and op != "<="
    )


def compare(
    table: Table,
    text: str,
    left: str,
    op: str,
    right: str,
    metric: str,
    *,
    offset: float = 0.0,
    margin: float = 0.0,
    right_metric: str | None = None,
    level: float = LEVEL,
) -> Condition:
    """``left op right + offset`` on ``metric``, decided on the per-seed differences.

    The differences ``left_s - (right_s + offset)`` of the seeds both variants have go to
    :func:`decide` with ``margin`` and ``level``; :data:`SUPPORTING` reads its verdict. With
    ``right_metric`` the right-hand side is that metric of ``right`` (e.g. the ECE after
    temperature scaling against the ECE before), still paired by seed.

    Args:
        table: the claim's table.
        text: what the comparison means.
        left: left-hand variant.
        op: one of ``<``, ``<=``, ``>``, ``>=``, ``~``.
        right: right-hand variant.
        metric: MLflow metric key.
        offset: added to the right-hand side.
        margin: the equivalence margin in the metric's units (0: never equivalent).
        right_metric: the right-hand metric, when it is not ``metric``.
        level: level of the interval.
    """
    a, b = stats(table, left, metric), stats(table, right, right_metric or metric)
    pairs = paired_differences(a.values, b.values, offset)
    if not pairs:  # no seed with both numbers: nothing to decide on
        return Condition(text, math.nan, op, b.mean + offset, None, margin)
    decision = _decision(pairs, op, margin, level)
    return Condition(text, a.mean, op, b.mean + offset, decision, margin)


def against(
    table: Table,
    text: str,
    variant: str,
    metric: str,
    op: str,
    value: float,
    *,
    margin: float = 0.0,
    level: float = LEVEL,
) -> Condition:
    """``mean(variant) op value`` on ``metric``, decided on each seed's ``value_s - value``.

    One-sample Student's t through :func:`decide`: ``>=`` with ``margin=0`` holds when the
    mean lies above ``value`` beyond the noise; ``~`` with a margin holds when TOST puts the
    mean within ``±margin`` of ``value``.
    """
    a = stats(table, variant, metric)
    differences = [v - value for v in a.values if not _missing(v)]
    if not differences:
        return Condition(text, math.nan, op, value, None, margin)
    return Condition(text, a.mean, op, value, _decision(differences, op, margin, level), margin)


def median_against(
    table: Table, text: str, variant: str, metric: str, op: str, value: float
) -> Condition:
    """``median over seeds of metric op value``, decided on the numbers (a robust summary).

    The text is followed by how many seeds satisfy ``op value`` on their own.

    Example:
        >>> table = {"cnn": {"nll": Stats(0, 0, 5, (0.001, 0.02, 0.003, 0.002, 0.05))}}
        >>> c = median_against(table, "median train NLL < 0.01", "cnn", "nll", "<", 0.01)
        >>> c.left, c.holds, c.text
        (0.003, True, 'median train NLL < 0.01 (3 of 5 seeds)')
    """
    values = [v for v in stats(table, variant, metric).values if not _missing(v)]
    if not values:
        return Condition(text, math.nan, op, value)
    count = sum(OPERATORS[op](v, value) for v in values)
    return Condition(
        f"{text} ({count} of {len(values)} seeds)", statistics.median(values), op, value
    )


def mark(condition: Condition) -> str:
    """A table cell: yes / no / undecided, the mean paired difference and its interval."""
    outcome = condition.outcome
    decision = condition.decision
    if outcome == "missing" or decision is None:
        return "n/a"
    word = {"holds": "yes", "fails": "no"}.get(outcome) or f"undecided, {condition.seeds_text}"
    if decision.verdict == "equivalent":
        word += f", equivalent within ±{condition.margin:g}"
    return f"{word} ({decision.difference:+.4f} [{decision.low:+.4f}, {decision.high:+.4f}])"


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
    ``program`` (:data:`PROGRAMS`, default ``classifier``: what fits the configs), optional
    ``overrides`` applied to every variant, and ``variants``: a list of ``{name, config,
    label, overrides, epochs}`` where ``overrides`` maps dotted CLI keys
    (``model.criterion.init_args.k``) to values.

    Raises:
        FileNotFoundError: no such file (the experiments ship with the repository, not the
            wheel).
        ValueError: a variant without ``name`` or ``config``, a repeated name,
            ``overrides`` that are not a mapping, ``min_seeds`` below 1 or an unknown
            ``program``.
    """
    import yaml

    from lightning_losses.functional.checks import check_int  # torch: imported when used

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"experiment file {str(path)!r} not found: run `lightning-losses reproduce` from a "
            f"checkout of the repository, which has {EXPERIMENTS}/"
        )
    spec = yaml.safe_load(path.read_text()) or {}
    epochs = int(spec.get("epochs", 15))
    try:
        min_seeds = check_int("min_seeds", spec.get("min_seeds", 1), low=1)
    except ValueError as error:  # an ArgumentTypeError too
        raise ValueError(f"{path}: {error}") from error
    program = str(spec.get("program", "classifier"))
    if program not in PROGRAMS:
        raise ValueError(f"{path}: program must be one of {', '.join(PROGRAMS)}; got {program!r}")
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
                program,
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
    """``supported``, ``not supported``, ``mixed`` or ``undecided`` (see the module).

    No conditions at all is ``not supported``: a claim needs numbers to be supported. A
    missing number counts as a condition that fails.

    Example:
        >>> verdict([Condition("a < b", 1.0, "<", 2.0)])
        'supported'
    """
    outcomes = [c.outcome for c in conditions]
    held = outcomes.count("holds")
    undecided = outcomes.count(UNDECIDED)
    failed = len(outcomes) - held - undecided
    if held and failed:
        return MIXED
    if undecided:
        return UNDECIDED
    return SUPPORTED if held else NOT_SUPPORTED


def verdict_text(conditions: Sequence[Condition]) -> str:
    """:func:`verdict`, with the seeds an undecided claim needs: ``undecided (needs ~k seeds)``.

    ``k`` is the most any undecided condition needs.

    Example:
        >>> a = Stats(0.02, 0.0, 3, (0.02, 0.03, 0.01))
        >>> b = Stats(0.025, 0.0, 3, (0.025, 0.02, 0.03))
        >>> verdict_text([compare({"a": {"m": a}, "b": {"m": b}}, "a < b", "a", "<", "b", "m")])
        'undecided (needs ~38 seeds)'
    """
    result = verdict(conditions)
    if result != UNDECIDED:
        return result
    open_ = [c.decision for c in conditions if c.outcome == UNDECIDED and c.decision is not None]
    if any(d.n < 2 for d in open_):
        return f"{UNDECIDED} (needs at least 2 seeds)"
    if any(d.seeds_needed is None for d in open_):
        return f"{UNDECIDED} (needs more than {MAX_SEEDS} seeds)"
    needed = [d.seeds_needed for d in open_ if d.seeds_needed is not None]  # all, checked above
    return f"{UNDECIDED} (needs ~{max(needed)} seeds)"


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
        extra_metrics: MLflow metric keys that ``extra`` reads beyond ``metrics`` (in the
            table and the appendix, not columns).
        after_runs: called with ``(runs, tracking_uri, out)`` once all of the claim's runs
            are done, before they are read back: measures that need several runs (claim 9
            scores each run's generated text under cross-entropy's model of its seed).
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
    extra_metrics: tuple[str, ...] = ()
    after_runs: Callable[[dict[tuple[str, int], str], str, Path], object] | None = None

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
