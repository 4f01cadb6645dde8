"""Configurations compared over seeds: ``lightning-losses compare --group-by PARAM``.

The runs of an experiment are grouped by one param (:func:`resolve_group_by`,
:func:`group_runs`): one group per value of, e.g., ``model.criterion.class_path``, each holding
one run per seed (the ``seed_everything`` param; where a seed was run more than once, its latest
run counts). :func:`compare_groups` gives, per metric, each group's mean over its seeds with
its Student-t interval (:func:`~lightning_losses.compare.decide.t_interval`), and each group's
difference to a baseline group with the verdict of
:func:`~lightning_losses.compare.decide.decide`: paired by seed (``--pair-by seed``) or Welch's
(unpaired). :func:`format_groups` prints it as a table that fits a width,
:func:`write_groups_csv` writes it in full precision with every group's per-seed values, so
that each verdict can be recomputed.

The default baseline is the one group whose runs all train with ``CrossEntropyLoss``, else the
first group (groups are in ascending order of their value). The default equivalence margins
are :data:`DEFAULT_MARGINS`.

Imports only the standard library (SciPy through ``decide``, when a verdict is computed).
"""

from __future__ import annotations

import csv
import difflib
import json
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_losses.compare.decide import MAX_SEEDS, Decision, decide, pair_by_seed, t_interval
from lightning_losses.compare.params import class_name, parse_param
from lightning_losses.compare.query import METRICS, _loss_name
from lightning_losses.compare.table import _GAP, _cut

if TYPE_CHECKING:
    from mlflow.entities import Run

__all__ = [
    "BASELINE_LOSS",
    "DEFAULT_MARGINS",
    "GROUP_CSV_COLUMNS",
    "PAIR_BY",
    "RUN_FIELDS",
    "SEED_PARAM",
    "GroupComparison",
    "GroupRow",
    "RunRecord",
    "collect_records",
    "compare_groups",
    "format_groups",
    "group_runs",
    "parse_level",
    "parse_margins",
    "resolve_group_by",
    "verdict_text",
    "write_groups_csv",
]

#: The param holding a run's seed (LightningCLI's ``--seed_everything``).
SEED_PARAM = "seed_everything"
#: What ``--pair-by`` takes, with the param it reads.
PAIR_BY: dict[str, str] = {"seed": SEED_PARAM}
#: Names ``--group-by`` takes besides params: the run's name, its ``config`` tag, its loss (the
#: ``loss`` tag, else the class of ``model.criterion.class_path``).
RUN_FIELDS = ("run_name", "config", "loss")
#: The loss of the default baseline group.
BASELINE_LOSS = "CrossEntropyLoss"
#: Stages whose metrics are compared (``test/`` ones when a ``lightning-losses test`` logged them).
STAGES = ("val", "test")
#: Quantities compared, each under every stage (``val/acc``, ``test/acc``, ...).
QUANTITIES = tuple(name.split("/", 1)[1] for name in METRICS)
#: Quantities where higher is better; lower is better for the others (NLL, ECE, Brier).
HIGHER_IS_BETTER = frozenset({"acc"})
#: Equivalence margins by quantity, in the metric's units (``--margin`` overrides them): one
#: point of accuracy, 0.02 nats of NLL, half a point of ECE and of the Brier score (the same for
#: the calibrated NLL and ECE of ``PostHocCalibration``).
DEFAULT_MARGINS: dict[str, float] = {
    "acc": 0.01,
    "nll": 0.02,
    "ece": 0.005,
    "brier": 0.005,
    "smooth_ece": 0.005,
    "posthoc_nll": 0.02,
    "posthoc_ece": 0.005,
}
#: The columns of :func:`write_groups_csv`.
GROUP_CSV_COLUMNS = (
    "metric",
    "group",
    "n",
    "seeds",
    "mean",
    "low",
    "high",
    "baseline",
    "method",
    "level",
    "margin",
    "difference",
    "difference_low",
    "difference_high",
    "verdict",
    "seeds_needed",
    "values",
)
#: Narrowest the group column is cut to when the table must fit a width.
MIN_GROUP_WIDTH = 8


def _metric_keys() -> dict[str, tuple[str, ...]]:
    """Each compared metric with the MLflow keys it is read from (first one present)."""
    return {
        f"{stage}/{quantity}": tuple(
            key.replace("val/", f"{stage}/", 1) for key in METRICS[f"val/{quantity}"]
        )
        for stage in STAGES
        for quantity in QUANTITIES
    }


@dataclass(frozen=True)
class RunRecord:
    """What grouping needs of one run: its names, params, tags and final metrics.

    Attributes:
        run_id: MLflow run id.
        run_name: the run's name.
        start_time: start in milliseconds since the epoch (0 when unknown).
        params: the run's params (the resolved config, flattened into dotted keys).
        tags: the run's tags (``loss``, ``dataset``, ``config``, ...).
        metrics: the final value of each metric key.
    """

    run_id: str
    run_name: str | None
    start_time: int
    params: Mapping[str, str]
    tags: Mapping[str, str]
    metrics: Mapping[str, float]

    @classmethod
    def from_run(cls, run: Run, metrics: Mapping[str, float] | None = None) -> RunRecord:
        """A record of an MLflow run (``metrics``: its final values, default MLflow's)."""
        return cls(
            run_id=run.info.run_id,
            run_name=run.info.run_name,
            start_time=int(run.info.start_time or 0),
            params=dict(run.data.params),
            tags=dict(run.data.tags),
            metrics=dict(run.data.metrics if metrics is None else metrics),
        )

    def get(self, key: str) -> str | None:
        """The value of a run field (:data:`RUN_FIELDS`) or of the param ``key``."""
        if key == "run_name":
            return self.run_name
        if key == "config":
            return self.tags.get("config")
        if key == "loss":
            return _loss_name(self.tags, self.params)
        return self.params.get(key)

    @property
    def seed(self) -> Any:
        """The run's seed (the parsed :data:`SEED_PARAM`), ``None`` when it has none."""
        value = self.params.get(SEED_PARAM)
        return None if value is None else parse_param(value)


def collect_records(
    experiment: str,
    *,
    tracking_uri: str | None = None,
    run_ids: list[str] | None = None,
    status: str | Sequence[str] | None = None,
    skipped: dict[str, int] | None = None,
) -> list[RunRecord]:
    """A :class:`RunRecord` per finished or running run (or per run of ``run_ids``).

    ``status`` and ``skipped`` are those of :func:`~lightning_losses.compare.query.collect_runs`.

    Final metrics are read as :func:`~lightning_losses.compare.query.collect_runs` reads them
    (a resumed run shows what its resumed fit logged last).

    Raises:
        ValueError: as :func:`~lightning_losses.compare.query.collect_runs`.
    """
    from lightning_losses.compare.query import (
        _experiment_id,
        _find_runs,
        mlflow_client,
        resolve_tracking_uri,
        run_statuses,
        select_runs,
    )
    from lightning_losses.tracking import final_metrics

    run_statuses(status)  # an unknown status fails before the store is opened

    client = mlflow_client(resolve_tracking_uri(tracking_uri))
    experiment_id = _experiment_id(client, experiment)
    if run_ids:
        runs = _find_runs(client, experiment, experiment_id, run_ids)
    else:
        runs = select_runs(client, experiment_id, status, skipped)
    return [RunRecord.from_run(run, final_metrics(client, run)) for run in runs]


def parse_level(text: str | float | None) -> float:
    """The ``--level`` of the intervals: a number in (0, 1); ``None`` is 0.95.

    Raises:
        ValueError: naming ``--level``, for anything else.

    Example:
        >>> parse_level("0.9"), parse_level(None)
        (0.9, 0.95)
    """
    if text is None:
        return 0.95
    try:
        level = float(text)
    except ValueError:
        level = math.nan
    if not 0.0 < level < 1.0:
        raise ValueError(f"--level must be a number in (0, 1), e.g. 0.95; got {text!r}")
    return level


def parse_margins(texts: Sequence[str]) -> dict[str, float]:
    """The ``--margin METRIC=VALUE`` options: equivalence margins by quantity or metric.

    ``METRIC`` is a quantity (``acc``, ``nll``, ``ece``, ``brier``, ``smooth_ece``: every stage)
    or one metric (``val/acc``, ``test/ece``); ``VALUE`` a number >= 0 in the metric's units
    (0: never equivalent).

    Raises:
        ValueError: naming ``--margin``, for a malformed option, an unknown metric or a value
            that is not a number >= 0.

    Example:
        >>> parse_margins(["acc=0.02", "test/ece=0.01"])
        {'acc': 0.02, 'test/ece': 0.01}
    """
    known = [*QUANTITIES, *_metric_keys()]
    margins: dict[str, float] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(
                f"--margin expects METRIC=VALUE with METRIC one of {', '.join(QUANTITIES)} "
                f"(or val/acc, test/ece, ...), e.g. --margin acc=0.02; got {text!r}"
            )
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number >= 0):
            raise ValueError(
                f"--margin {name}= needs a number >= 0, e.g. {name}=0.01; got {text!r}"
            )
        margins[name] = number
    return margins


def _margin(metric: str, margins: Mapping[str, float]) -> float:
    """The margin of ``metric``: given for it, else for its quantity, else the default."""
    quantity = metric.split("/", 1)[1]
    return margins.get(metric, margins.get(quantity, DEFAULT_MARGINS[quantity]))


def resolve_group_by(name: str, records: Sequence[RunRecord]) -> str:
    """The param (or run field) that ``--group-by name`` names.

    ``name`` is a run field (:data:`RUN_FIELDS`), a param as MLflow stores it
    (``model.criterion.class_path``), or the last dotted parts of exactly one param
    (``gamma`` for ``model.criterion.init_args.gamma``).

    Raises:
        ValueError: naming ``--group-by``: no such param (with "did you mean"), or several.

    Example:
        >>> run = RunRecord("r", "a", 0, {"model.criterion.init_args.gamma": "2"}, {}, {})
        >>> resolve_group_by("gamma", [run]), resolve_group_by("run_name", [run])
        ('model.criterion.init_args.gamma', 'run_name')
    """
    if name in RUN_FIELDS:
        return name
    keys = sorted(set().union(*(record.params for record in records)))
    if name in keys:
        return name
    matches = [key for key in keys if key.endswith("." + name)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(
            f"--group-by {name!r} names several params ({', '.join(matches)}); pass the full name"
        )
    names = [*RUN_FIELDS, *keys, *dict.fromkeys(key.rsplit(".", 1)[-1] for key in keys)]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        example = "model.criterion.class_path" if "model.criterion.class_path" in keys else ""
        example = example or (keys[0] if keys else "seed_everything")
        hint = f"pass a param of the runs (e.g. {example}) or one of {', '.join(RUN_FIELDS)}"
    raise ValueError(f"--group-by: no param or run field {name!r} in the runs; {hint}")


def _sort_key(item: tuple[str, Any]) -> tuple[int, float, str]:
    """Groups in ascending order: numbers by value first, then text."""
    value = parse_param(item[0])
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), item[0])
    return (1, 0.0, item[0])


def _seed_order(seed: Any) -> tuple[int, float, str]:
    if isinstance(seed, (int, float)) and not isinstance(seed, bool):
        return (0, float(seed), "")
    return (1, 0.0, str(seed))


def group_runs(
    records: Sequence[RunRecord], key: str
) -> tuple[dict[str, list[RunRecord]], list[str]]:
    """The runs by their value of ``key``, one run per seed, and notes on the runs left out.

    Args:
        records: the runs.
        key: a param or run field (:func:`resolve_group_by`).

    Returns:
        Groups in ascending order of their value, each labelled by that value (the class name
        for a ``class_path`` param, unless two groups share it), with its runs in seed order
        (runs without a seed last); and the notes: runs without ``key``, and, where a seed was
        run more than once in a group, the earlier runs, which do not count.
    """
    notes = []
    missing = [record for record in records if record.get(key) is None]
    if missing:
        names = ", ".join(str(r.run_name or r.run_id[:8]) for r in missing)
        notes.append(f"left out {len(missing)} run(s) without {key}: {names}")
    by_value: dict[str, list[RunRecord]] = {}
    for record in records:
        value = record.get(key)
        if value is not None:
            by_value.setdefault(str(value), []).append(record)
    labels = {value: value for value in by_value}
    if key.endswith("class_path"):
        short = {value: class_name(value) for value in by_value}
        if len(set(short.values())) == len(short):
            labels = short
    groups: dict[str, list[RunRecord]] = {}
    for value, runs in sorted(by_value.items(), key=_sort_key):
        latest: dict[Any, RunRecord] = {}
        unseeded = []
        for record in sorted(runs, key=lambda r: r.start_time):
            if record.seed is None:
                unseeded.append(record)
                continue
            if record.seed in latest:
                older = latest[record.seed]
                earlier = " ".join(filter(None, (older.run_name, older.run_id[:8])))
                notes.append(
                    f"{labels[value]}: seed {record.seed} ran more than once; the latest run "
                    f"counts, not the earlier run {earlier}"
                )
            latest[record.seed] = record
        ordered = [latest[seed] for seed in sorted(latest, key=_seed_order)]
        groups[labels[value]] = ordered + unseeded
    return groups, notes


def verdict_text(decision: Decision) -> str:
    """The verdict cell: better, worse, ``equivalent (±margin)`` or ``undecided (needs ~k seeds)``.

    Example:
        >>> verdict_text(decide([0.02, -0.01, 0.03], margin=0.005))
        'undecided (needs ~12 seeds)'
        >>> verdict_text(decide([0.001, -0.001, 0.0005, -0.0002], margin=0.01))
        'equivalent (±0.01)'
    """
    if decision.verdict == "equivalent":
        return f"equivalent (±{decision.margin:g})"
    if decision.verdict == "undecided":
        if decision.n < 2:
            return "undecided (needs at least 2 seeds)"
        if decision.seeds_needed is None:
            return f"undecided (needs over {MAX_SEEDS} seeds)"
        return f"undecided (needs ~{decision.seeds_needed} seeds)"
    return decision.verdict


@dataclass(frozen=True)
class GroupRow:
    """One group's line for one metric.

    Attributes:
        metric: e.g. ``val/acc``.
        group: the group's label.
        values: the group's value per seed (seed order; runs without a seed keyed by run id).
        mean: mean over ``values`` (``None`` when no run of the group logged the metric).
        low: low end of its Student-t interval.
        high: high end.
        decision: the comparison with the baseline; ``None`` for the baseline itself and where
            no comparison could be made (see ``note``).
        note: why there is no decision (``"baseline"`` or the reason).
    """

    metric: str
    group: str
    values: dict[Any, float]
    mean: float | None
    low: float | None
    high: float | None
    decision: Decision | None
    note: str | None = None


@dataclass(frozen=True)
class GroupComparison:
    """What :func:`compare_groups` found.

    Attributes:
        group_by: the param or run field the runs are grouped by.
        baseline: the baseline group's label.
        paired: differences paired by seed (else Welch's unpaired interval).
        level: the level of every interval.
        margins: the equivalence margin of each metric compared.
        groups: each group's label with its seeds, in order.
        rows: one per metric and group, metric by metric.
        notes: runs left out, seeds run twice, metrics that could not be paired.
        runs: the number of runs compared.
    """

    group_by: str
    baseline: str
    paired: bool
    level: float
    margins: dict[str, float]
    groups: dict[str, list[Any]]
    rows: list[GroupRow]
    notes: list[str] = field(default_factory=list)
    runs: int = 0

    @property
    def method(self) -> str:
        """``"paired t"`` or ``"Welch t"``, as :class:`Decision` names them."""
        return "paired t" if self.paired else "Welch t"


def _baseline(groups: Mapping[str, list[RunRecord]], baseline: str | None) -> str:
    """The baseline's label: the one named (by label or value), else the CE group, else first.

    Raises:
        ValueError: naming ``--baseline``, when no group has that name.
    """
    labels = list(groups)
    if baseline is None:
        ce = [
            label
            for label, runs in groups.items()
            if runs and all(r.get("loss") == BASELINE_LOSS for r in runs)
        ]
        return ce[0] if len(ce) == 1 else labels[0]
    if baseline in groups:
        return baseline
    for label in labels:  # the full value of a class_path group, or the same number, names it
        if label == class_name(baseline) or _same_number(label, baseline):
            return label
    close = difflib.get_close_matches(baseline, labels, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(
        f"--baseline: no group named {baseline!r}; {hint}groups: {', '.join(labels) or 'none'}"
    )


def _same_number(a: str, b: str) -> bool:
    """Whether two texts read as the same number (``2`` and ``2.0``)."""
    x, y = parse_param(a), parse_param(b)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
    return numbers and x == y


def _values(runs: Sequence[RunRecord], keys: Sequence[str]) -> dict[Any, float]:
    """The metric's value per seed (runs without a seed: per run id) of the runs that logged it."""
    values = {}
    for run in runs:
        value = next((float(run.metrics[key]) for key in keys if key in run.metrics), None)
        if value is not None:
            values[run.seed if run.seed is not None else run.run_id] = value
    return values


def compare_groups(
    records: Sequence[RunRecord],
    group_by: str,
    *,
    pair_by: str | None = None,
    baseline: str | None = None,
    level: float = 0.95,
    margins: Mapping[str, float] | None = None,
) -> GroupComparison:
    """Each group's mean and interval per metric, and its verdict against the baseline.

    Args:
        records: the runs (:func:`collect_records`).
        group_by: the ``--group-by`` name (:func:`resolve_group_by`).
        pair_by: ``"seed"``: differences paired by seed; ``None``: Welch's unpaired interval.
        baseline: the baseline group's label (or value); default: the one group whose runs all
            train with :data:`BASELINE_LOSS`, else the first group.
        level: level of every interval; the equivalence tests run at ``alpha = 1 - level``.
        margins: equivalence margins by quantity or metric (:func:`parse_margins`); the others
            are :data:`DEFAULT_MARGINS`.

    Returns:
        A :class:`GroupComparison` over the metrics that some run logged, ``val/`` then
        ``test/``.

    Raises:
        ValueError: naming the option: ``--group-by`` naming nothing of the runs, ``--baseline``
            naming no group, ``--pair-by`` with groups of different seeds or runs without a
            seed, ``--level`` outside (0, 1), or no run with a compared metric.
    """
    level = parse_level(level)
    margins = dict(margins or {})
    if pair_by is not None and pair_by not in PAIR_BY:
        raise ValueError(f"--pair-by: choose one of {', '.join(PAIR_BY)}; got {pair_by!r}")
    key = resolve_group_by(group_by, records)
    groups, notes = group_runs(records, key)
    if not groups:
        raise ValueError(f"--group-by: no run has a value for {key}")
    base = _baseline(groups, baseline)
    if pair_by is not None:
        _check_pairs(groups, base)
    metric_keys = _logged_metrics(groups)
    rows = [
        _group_row(
            metric,
            label,
            _values(runs, keys),
            _values(groups[base], keys),
            is_base=label == base,
            paired=pair_by is not None,
            margin=_margin(metric, margins),
            level=level,
            notes=notes,
        )
        for metric, keys in metric_keys.items()
        for label, runs in groups.items()
    ]
    seeds = {label: [r.seed for r in runs] for label, runs in groups.items()}
    return GroupComparison(
        group_by=key,
        baseline=base,
        paired=pair_by is not None,
        level=level,
        margins={metric: _margin(metric, margins) for metric in metric_keys},
        groups=seeds,
        rows=rows,
        notes=notes,
        runs=sum(len(runs) for runs in groups.values()),
    )


def _logged_metrics(groups: Mapping[str, list[RunRecord]]) -> dict[str, tuple[str, ...]]:
    """The compared metrics that some run logged, each with the keys it is read from.

    Raises:
        ValueError: no run logged any compared metric.
    """
    metric_keys = {
        metric: keys
        for metric, keys in _metric_keys().items()
        if any(key in run.metrics for runs in groups.values() for run in runs for key in keys)
    }
    if not metric_keys:
        raise ValueError(f"no run logged any of {', '.join(_metric_keys())}")
    return metric_keys


def _group_row(
    metric: str,
    label: str,
    values: dict[Any, float],
    base_values: dict[Any, float],
    *,
    is_base: bool,
    paired: bool,
    margin: float,
    level: float,
    notes: list[str],
) -> GroupRow:
    """One group's row for one metric: its interval and its decision against the baseline.

    Args:
        metric: the compared metric, e.g. ``val/acc``.
        label: the group's label.
        values: the group's value per seed (:func:`_values`).
        base_values: the baseline group's.
        is_base: the group is the baseline (no decision).
        paired: differences paired by seed, else Welch's unpaired comparison.
        margin: the metric's equivalence margin.
        level: level of the intervals.
        notes: a line is appended here when paired seeds do not match.
    """
    higher = metric.split("/", 1)[1] in HIGHER_IS_BETTER
    mean = low = high = None
    if values:
        mean, low, high = t_interval(list(values.values()), level)
    decision, note = None, None
    if is_base:
        note = "baseline"
    elif not values or not base_values:
        note = "not logged"
    elif paired:
        try:
            differences = pair_by_seed(values, base_values)
        except ValueError:
            note = "not paired"
            notes.append(
                f"{metric} of {label} not compared: logged for seeds "
                f"{sorted(values, key=_seed_order)}, by the baseline for "
                f"{sorted(base_values, key=_seed_order)}"
            )
        else:
            decision = decide(differences, margin=margin, level=level, higher_is_better=higher)
    else:
        decision = decide(
            list(values.values()),
            list(base_values.values()),
            margin=margin,
            level=level,
            higher_is_better=higher,
        )
    return GroupRow(metric, label, values, mean, low, high, decision, note)


def _check_pairs(groups: Mapping[str, list[RunRecord]], base: str) -> None:
    """Every group holds the baseline's seeds, and every run a seed.

    Raises:
        ValueError: naming ``--pair-by``: pair_by_seed's message, with the two groups.
    """
    unseeded = [r for runs in groups.values() for r in runs if r.seed is None]
    if unseeded:
        names = ", ".join(str(r.run_name or r.run_id[:8]) for r in unseeded)
        raise ValueError(
            f"--pair-by seed: runs without a {SEED_PARAM} param cannot be paired: {names} "
            "(compare unpaired, without --pair-by)"
        )
    base_seeds = {r.seed: 0.0 for r in groups[base]}
    for label, runs in groups.items():
        try:
            pair_by_seed({r.seed: 0.0 for r in runs}, base_seeds)
        except ValueError as error:
            raise ValueError(f"{error}; group {label!r} against the baseline {base!r}") from None


# --- the table -------------------------------------------------------------------------------


def _plus_minus(centre: float | None, high: float | None, sign: str = "") -> str:
    """``0.9123 ± 0.0081``: the centre of a symmetric interval and its half width."""
    if centre is None or high is None:
        return "-"
    return f"{centre:{sign}.4f} ± {high - centre:.4f}"


def _seeds_text(seeds: Sequence[Any]) -> str:
    """``0-4`` for consecutive integers, else the seeds listed."""
    ints = [s for s in seeds if isinstance(s, int) and not isinstance(s, bool)]
    if len(ints) == len(seeds) > 2 and ints == list(range(ints[0], ints[0] + len(ints))):
        return f"{ints[0]}-{ints[-1]}"
    return ", ".join(str(s) for s in seeds)


def _count(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _preamble(result: GroupComparison) -> list[str]:
    """The lines above the table: what was grouped, and how each column was computed."""
    pct = f"{result.level:.0%}"
    alpha = f"{1 - result.level:.3g}"
    seed_sets = {tuple(seeds) for seeds in result.groups.values()}
    if len(seed_sets) == 1:
        seeds = next(iter(seed_sets))
        each = f"{_count(len(seeds), 'seed')} each ({SEED_PARAM} {_seeds_text(seeds)})"
    else:
        sizes = sorted(len(seeds) for seeds in result.groups.values())
        each = f"{sizes[0]}-{sizes[-1]} seeds per group"
    how = (
        "paired t on the per-seed differences (--pair-by seed)"
        if result.paired
        else "Welch's t on the two groups' seeds (unpaired; --pair-by seed pairs them)"
    )
    return [
        f"{_count(result.runs, 'run')} in {_count(len(result.groups), 'group')} by "
        f"{result.group_by}, {each}; "
        f"baseline {result.baseline}.",
        f"mean: over seeds, ± the half width of its {pct} Student-t interval. diff: to the "
        f"baseline, {how}, ± the same. "
        f"Verdict: better or worse when the diff's {pct} interval excludes 0; equivalent when "
        f"two one-sided t-tests at alpha {alpha} put it within ±margin; else undecided, with "
        "about how many seeds would decide.",
    ]


def _cells(row: GroupRow) -> dict[str, str]:
    cells = {
        "group": row.group,
        "n": str(len(row.values)),
        "mean": _plus_minus(row.mean, row.high),
        "difference": "",
        "verdict": "",
    }
    if row.decision is not None:
        cells["difference"] = _plus_minus(row.decision.difference, row.decision.high, "+")
        cells["verdict"] = verdict_text(row.decision)
    elif row.note:
        cells["verdict"] = row.note
    return cells


#: Columns right-aligned in the table.
_NUMERIC = frozenset({"n", "mean", "difference"})
#: Columns left out, in turn, when cutting the group column does not make the table fit.
DROPPED = (("mean",),)
#: What the last line says of a column left out.
_DROPPED_TEXT = {"mean": "the groups' means (in the CSV)"}


def _fit(
    keys: list[str], natural: Mapping[str, int], width: int
) -> tuple[list[str], int, list[str]]:
    """The columns kept, the group column's width and what was done to fit ``width``.

    Tried in turn: every column, then without those of each entry of :data:`DROPPED`; in each,
    the group column is cut down to :data:`MIN_GROUP_WIDTH`. The first that fits is taken, else
    the last (its lines are then longer than ``width``).
    """
    floor = min(natural["group"], MIN_GROUP_WIDTH)
    for dropped in ((), *DROPPED):
        kept = [key for key in keys if key not in dropped]
        others = sum(natural[k] for k in kept if k != "group") + _GAP * (len(kept) - 1)
        group = max(floor, min(natural["group"], width - others))
        if group + others <= width or dropped == DROPPED[-1]:
            break
    fitted = ["cut group"] if group < natural["group"] else []
    if dropped:
        fitted.append("left out " + ", ".join(_DROPPED_TEXT[key] for key in dropped))
    return kept, group, fitted


def format_groups(result: GroupComparison, *, width: int | None = None) -> str:
    """The comparison as text: a preamble, then per metric one line per group.

    The columns: group, n (left out when every group has the same seeds: the preamble says
    how many), the mean over seeds ± the half width of its Student-t interval, the difference
    to the baseline ± the half width of its interval (the headers name the level and the
    method; both intervals are symmetric) and the verdict. To fit ``width``, the group column
    is cut (ending in ``...``) down to 8 characters; where that is not enough the groups'
    means are left out too; a last line says what was cut or left out.

    Args:
        result: from :func:`compare_groups`.
        width: the longest line allowed; ``None``: no limit.

    Returns:
        The text, without a final newline.
    """
    pct = f"{result.level:.0%}"
    headers = {
        "group": "group",
        "n": "n",
        "mean": f"mean ± {pct} t CI",
        "difference": f"diff ± {pct} {result.method} CI",
        "verdict": "verdict",
    }
    cells = [_cells(row) for row in result.rows]
    keys = list(headers)
    if len({tuple(seeds) for seeds in result.groups.values()}) == 1 and all(
        len(row.values) == len(result.groups[row.group]) for row in result.rows
    ):
        keys.remove("n")
    natural = {k: max(len(t) for t in [headers[k], *(c[k] for c in cells)]) for k in keys}
    widths = dict(natural)
    fitted: list[str] = []
    if width is not None:
        keys, widths["group"], fitted = _fit(keys, natural, width)

    def line(texts: Mapping[str, str]) -> str:
        parts = [
            _cut(texts[k], widths[k]).rjust(widths[k])
            if k in _NUMERIC
            else _cut(texts[k], widths[k]).ljust(widths[k])
            for k in keys
        ]
        return (" " * _GAP).join(parts).rstrip()

    lines = [line(headers), "-" * (sum(widths[k] for k in keys) + _GAP * (len(keys) - 1))]
    metric = None
    for row, texts in zip(result.rows, cells, strict=True):
        if row.metric != metric:
            metric = row.metric
            better = "higher" if metric.split("/", 1)[1] in HIGHER_IS_BETTER else "lower"
            margin = result.margins[metric]
            lines.append(f"{metric} ({better} is better; equivalence margin ±{margin:g})")
        lines.append(line(texts))
    notes = list(result.notes)
    if fitted:
        notes.append(f"to fit {width} columns: {'; '.join(fitted)} (--wide shows everything)")
    preamble = _preamble(result)
    if width is not None:
        wrap = lambda text: textwrap.wrap(text, width, subsequent_indent="  ")  # noqa: E731
        preamble = [part for text in preamble for part in wrap(text)]
        notes = [part for text in notes for part in wrap(text)]
    text = "\n".join([*preamble, "", *lines])
    return text + "\n\n" + "\n".join(notes) if notes else text


def write_groups_csv(result: GroupComparison, path: str | os.PathLike[str]) -> Path:
    """Write the comparison, one line per metric and group (columns :data:`GROUP_CSV_COLUMNS`).

    Floats are written in full precision; ``values`` is the group's value per seed as JSON
    (``{"0": 0.91, "1": 0.93}``), so that every interval and verdict can be recomputed.
    Empty fields: no value (the baseline has no difference).

    Returns:
        The path written; its folder is created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=GROUP_CSV_COLUMNS, restval="")
        writer.writeheader()
        for row in result.rows:
            d = row.decision
            record: dict[str, Any] = {
                "metric": row.metric,
                "group": row.group,
                "n": len(row.values),
                "seeds": " ".join(str(seed) for seed in row.values),
                "mean": row.mean,
                "low": row.low,
                "high": row.high,
                "baseline": result.baseline,
                "method": result.method,
                "level": result.level,
                "margin": result.margins[row.metric],
                "verdict": row.note if d is None else d.verdict,
                "values": json.dumps({str(seed): v for seed, v in row.values.items()}),
            }
            if d is not None:
                record.update(
                    difference=d.difference,
                    difference_low=d.low,
                    difference_high=d.high,
                    seeds_needed=d.seeds_needed,
                )
            writer.writerow({k: "" if v is None else v for k, v in record.items()})
    return path
