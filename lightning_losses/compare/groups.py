"""Configurations compared over seeds: ``lightning-losses compare --group-by PARAM``.

The runs of an experiment are grouped by one param (:func:`resolve_group_by`,
:func:`group_runs`): one group per value of, e.g., ``model.criterion.class_path``, split further
where its runs differ in anything else that can change a result
(:func:`~lightning_losses.compare.alike.canonical`: a FocalLoss group of gamma 1 and gamma 2
runs becomes ``FocalLoss (gamma=1)`` and ``FocalLoss (gamma=2)``), so that the runs of a group
differ only in their seed (the ``seed_everything`` param; where a seed was run more than once,
its latest run counts). :func:`compare_groups` gives, per metric, each group's mean over its
seeds with its Student-t interval (:func:`~lightning_losses.compare.decide.t_interval`), and
each group's difference to a baseline group with the verdict of
:func:`~lightning_losses.compare.decide.decide`: paired on the seeds both hold (``--pair-by
seed``) or Welch's (unpaired). A group is compared with the baseline only when it differs from
it in what ``--group-by`` varies (:func:`~lightning_losses.compare.alike.treatment`) and in
nothing else, the task above all; the others are left out, and a note names them with the
filter that selects them. :mod:`~lightning_losses.compare.group_table` prints and writes it.

The default baseline is the one group whose runs all train with ``CrossEntropyLoss``, else the
first group (groups are in ascending order of their value); several such groups are an error
that names what they differ in and the ``--where`` filter that keeps one. The default
equivalence margins are :data:`DEFAULT_MARGINS`.

Imports only the standard library (SciPy through ``decide``, when a verdict is computed).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightning_losses.compare.alike import (
    TASK_PARAM,
    canonical,
    differing,
    key_named,
    matches,
    short_names,
    treatment,
)
from lightning_losses.compare.decide import decide, t_interval
from lightning_losses.compare.group_table import (
    GROUP_CSV_COLUMNS,
    SEED_PARAM,
    GroupComparison,
    GroupRow,
    format_groups,
    higher_is_better,
    verdict_text,
    write_groups_csv,
)
from lightning_losses.compare.params import class_name, parse_param
from lightning_losses.compare.query import (
    CONFORMAL_MARGINS,
    CONFORMAL_METRIC,
    METRICS,
    _loss_name,
    conformal_keys,
    coverage_target,
    run_fields,
)

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
        status: the run's status (``FINISHED``, ...; ``""`` when unknown).
    """

    run_id: str
    run_name: str | None
    start_time: int
    params: Mapping[str, str]
    tags: Mapping[str, str]
    metrics: Mapping[str, float]
    status: str = ""

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
            status=str(run.info.status or ""),
        )

    def fields(self) -> dict[str, str]:
        """Its params and tags in one mapping, for ``--where`` (:func:`run_fields`)."""
        return run_fields(self.params, self.tags, self.run_name, self.status)

    @property
    def name(self) -> str:
        """The run's name and the first 8 characters of its id: ``digits_ce 1a2b3c4d``."""
        return " ".join(filter(None, (self.run_name, self.run_id[:8])))

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
    where: Sequence[tuple[str, str]] = (),
    configs: Sequence[str] | None = None,
) -> list[RunRecord]:
    """A :class:`RunRecord` per finished or running run (or per run of ``run_ids``).

    ``status``, ``skipped``, ``where`` and ``configs`` are those of
    :func:`~lightning_losses.compare.query.collect_runs`.

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
        run_fields_of,
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
    runs = matches(runs, run_fields_of, where=where, configs=configs)
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
    or one metric (``val/acc``, ``test/ece``, a prediction set's
    ``test/conformal_aps_0.1_size``); ``VALUE`` a number >= 0 in the metric's units (0: never
    equivalent).

    Raises:
        ValueError: naming ``--margin``, for a malformed option, an unknown metric or a value
            that is not a number >= 0.

    Example:
        >>> parse_margins(["acc=0.02", "test/ece=0.01", "test/conformal_lac_0.05_size=0.2"])
        {'acc': 0.02, 'test/ece': 0.01, 'test/conformal_lac_0.05_size': 0.2}
    """
    known = [*QUANTITIES, *_metric_keys()]
    margins: dict[str, float] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or (name not in known and not CONFORMAL_METRIC.fullmatch(name)):
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
    conformal = CONFORMAL_METRIC.fullmatch(metric)
    default = CONFORMAL_MARGINS[conformal["measure"]] if conformal else DEFAULT_MARGINS[quantity]
    return margins.get(metric, margins.get(quantity, default))


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
    found = key_named(name, keys, "--group-by")
    if found is not None:
        return found
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


def _value_text(value: str | None) -> str:
    """A param value in a group's label: a class by its name, a number as ``%g``."""
    if value is None:
        return "unset"
    parsed = parse_param(value)
    if isinstance(parsed, float):
        return f"{parsed:g}"
    if isinstance(parsed, str) and "." in parsed and class_name(parsed)[:1].isupper():
        return class_name(parsed)
    text = str(parsed)
    return text if len(text) <= 24 else text[:21] + "..."


#: Most params named in a group's label (the CSV's ``group`` holds the same label).
LABEL_PARAMS = 3


def _split(runs: Sequence[RunRecord], label: str) -> dict[str, list[RunRecord]]:
    """Runs of one value of the group-by key, split where anything else that counts differs.

    Each part is labelled ``label (name=value, ...)`` with the params that tell the parts
    apart (:func:`~lightning_losses.compare.alike.short_names`), at most :data:`LABEL_PARAMS`;
    ``label`` alone when the runs agree.
    """
    canon = [canonical(run.params) for run in runs]
    split = differing(canon)
    if not split:
        return {label: list(runs)}
    callbacks = [key for key in split if key.startswith("trainer.callbacks.")]
    shown = [key for key in split if key not in callbacks or key.endswith(".class_path")]
    names = short_names(shown)
    parts: dict[tuple[str | None, ...], list[RunRecord]] = {}
    for run, params in zip(runs, canon, strict=True):
        parts.setdefault(tuple(params.get(key) for key in split), []).append(run)
    labelled: dict[str, list[RunRecord]] = {}
    for values, members in parts.items():
        items = [
            f"{names[key]}={_value_text(value)}"
            for key, value in zip(split, values, strict=True)
            if key in names
        ]
        text = ", ".join(items[:LABEL_PARAMS]) + (", ..." if len(items) > LABEL_PARAMS else "")
        name = f"{label} ({text})" if text else label
        if name in labelled:  # parts told apart only beyond the params shown
            name = f"{label} ({text}; {members[0].run_id[:6]})"
        labelled[name] = members
    return labelled


def group_runs(
    records: Sequence[RunRecord], key: str
) -> tuple[dict[str, list[RunRecord]], list[str]]:
    """The runs by their value of ``key``, split until they differ only in seed; one run a seed.

    Args:
        records: the runs.
        key: a param or run field (:func:`resolve_group_by`).

    Returns:
        Groups in ascending order of their value, each labelled by that value (the class name
        for a ``class_path`` param, unless two groups share it); where the runs of one value
        differ in any other param that can change a result
        (:func:`~lightning_losses.compare.alike.canonical`), one group per combination, its
        label followed by what tells it apart (``FocalLoss (gamma=1)``). Each group's runs in
        seed order (runs without a seed last). And the notes: runs without ``key``, and where a
        seed was run more than once in a group, the run that counts (the latest) and the
        earlier ones, which do not.
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
        for label, members in _split(runs, labels[value]).items():
            groups[label] = _one_per_seed(label, members, notes)
    return groups, notes


def _one_per_seed(label: str, runs: Sequence[RunRecord], notes: list[str]) -> list[RunRecord]:
    """The latest run of each seed in seed order, then the unseeded runs; a note per repeat."""
    by_seed: dict[Any, list[RunRecord]] = {}
    unseeded = []
    for record in sorted(runs, key=lambda r: r.start_time):
        if record.seed is None:
            unseeded.append(record)
        else:
            by_seed.setdefault(record.seed, []).append(record)
    for seed, repeats in by_seed.items():
        if len(repeats) > 1:
            earlier = ", ".join(r.name for r in repeats[:-1])
            notes.append(
                f"{label}: seed {seed} ran {len(repeats)} times; the latest run counts, "
                f"{repeats[-1].name}, not {earlier}"
            )
    ordered = [by_seed[seed][-1] for seed in sorted(by_seed, key=_seed_order)]
    return ordered + unseeded


def _baseline(groups: Mapping[str, list[RunRecord]], baseline: str | None) -> str:
    """The baseline's label: the one named (by label or value), else the CE group, else first.

    Raises:
        ValueError: naming ``--baseline``, when no group has that name; when several groups
            have it (or, by default, several are cross-entropy groups), naming what they
            differ in and the ``--where`` filter that keeps one.
    """
    labels = list(groups)
    if baseline is None:
        candidates = [
            label
            for label, runs in groups.items()
            if runs and all(r.get("loss") == BASELINE_LOSS for r in runs)
        ]
        if not candidates:
            return labels[0]
        name = BASELINE_LOSS
    elif baseline in groups:
        return baseline
    else:
        # the full value of a class_path group, or the same number, names it
        candidates = [
            label
            for label in labels
            if _base_label(label) in (baseline, class_name(baseline))
            or _same_number(_base_label(label), baseline)
        ]
        if not candidates:
            close = difflib.get_close_matches(baseline, labels, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"--baseline: no group named {baseline!r}; {hint}groups: "
                f"{', '.join(labels) or 'none'}"
            )
        name = baseline
    if len(candidates) > 1:
        raise ValueError(_ambiguous(name, {label: groups[label] for label in candidates}))
    return candidates[0]


def _base_label(label: str) -> str:
    """A group's label without what tells it from the other groups of its value."""
    return label.split(" (", 1)[0]


def _configs(runs: Sequence[RunRecord]) -> str:
    """The configs (else run names) the runs were fitted from: ``digits_ce, digits_focal``."""
    names = sorted({str(r.tags.get("config") or r.run_name or r.run_id[:8]) for r in runs})
    return ", ".join(names)


def _ambiguous(name: str, candidates: Mapping[str, Sequence[RunRecord]]) -> str:
    """The message for a baseline that names several groups: what differs, the filter to use."""
    canon = {label: canonical(runs[0].params) for label, runs in candidates.items()}
    keys = differing(list(canon.values()))
    chosen = max(candidates, key=lambda label: len(candidates[label]))  # most seeds; first tie
    usable = [k for k in keys if canon[chosen].get(k) is not None] or keys
    key = next((k for k in usable if not k.startswith("trainer.callbacks.")), usable[0])
    values = "; ".join(
        f"{_value_text(canon[label].get(key))}: {_configs(runs)}"
        for label, runs in candidates.items()
    )
    names = short_names(keys)
    what = ", ".join(names[k] for k in keys[:LABEL_PARAMS]) + (
        ", ..." if len(keys) > LABEL_PARAMS else ""
    )
    keep = f"--where {key}={canon[chosen].get(key)}"
    return (
        f"the baseline {name} is ambiguous: {len(candidates)} groups of {name} runs differ in "
        f"{what} ({key} {values}); keep one with {keep} (or pass --baseline "
        f"{chosen!r})"
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
        pair_by: ``"seed"``: differences paired on the seeds a group shares with the baseline
            (a note says how many seeds each group dropped); ``None``: Welch's unpaired
            interval.
        baseline: the baseline group's label (or value); default: the one group whose runs all
            train with :data:`BASELINE_LOSS`, else the first group.
        level: level of every interval; the equivalence tests run at ``alpha = 1 - level``.
        margins: equivalence margins by quantity or metric (:func:`parse_margins`); the others
            are :data:`DEFAULT_MARGINS`.

    Returns:
        A :class:`GroupComparison` over the metrics that some run logged, ``val/`` then
        ``test/``, of the baseline and the groups that differ from it only in what
        ``group_by`` varies; the notes name the other groups (another task, model or data)
        and the ``--where`` filter that compares them apart.

    Raises:
        ValueError: naming the option: ``--group-by`` naming nothing of the runs, ``--baseline``
            naming no group or several (the message names what they differ in and the filter
            that keeps one), ``--level`` outside (0, 1), or no run with a compared metric.
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
    groups = _comparable(groups, base, key, notes)
    paired = pair_by is not None
    shared = _shared_seeds(groups, base, notes) if paired else {}
    metric_keys = _logged_metrics(groups)
    rows = [
        _group_row(
            metric,
            label,
            _values(runs, keys),
            _values(groups[base], keys),
            is_base=label == base,
            seeds=shared.get(label) if paired else None,
            margin=_margin(metric, margins),
            level=level,
        )
        for metric, keys in metric_keys.items()
        for label, runs in groups.items()
    ]
    seeds = {label: [r.seed for r in runs] for label, runs in groups.items()}
    return GroupComparison(
        group_by=key,
        baseline=base,
        paired=paired,
        level=level,
        margins={metric: _margin(metric, margins) for metric in metric_keys},
        groups=seeds,
        rows=rows,
        notes=notes,
        runs=sum(len(runs) for runs in groups.values()),
    )


def _comparable(
    groups: Mapping[str, list[RunRecord]], base: str, key: str, notes: list[str]
) -> dict[str, list[RunRecord]]:
    """The baseline and the groups that differ from it only in what ``key`` varies.

    Every other group (another task, backbone, data set, or any other param that
    :func:`~lightning_losses.compare.alike.treatment` does not count as the group-by key's) is
    left out, with a note that names what it differs in and the ``--where`` filter that
    compares such runs apart.
    """
    varies = treatment(key)
    reference = canonical(groups[base][0].params)
    kept = {}
    for label, runs in groups.items():
        params = canonical(runs[0].params)
        differ = [
            k
            for k in sorted(set(reference) | set(params))
            if reference.get(k) != params.get(k) and (k == TASK_PARAM or not varies(k))
        ]
        if not differ:
            kept[label] = runs
            continue
        differ.sort(key=lambda k: k != TASK_PARAM)  # the task first
        names = short_names(differ)
        what = ", ".join(f"{names[k]}={_value_text(params.get(k))}" for k in differ[:LABEL_PARAMS])
        what += ", ..." if len(differ) > LABEL_PARAMS else ""
        chosen = next((k for k in differ if params.get(k) is not None), None)
        apart = f"; compare such runs apart: --where {chosen}={params[chosen]}" if chosen else ""
        notes.append(
            f"not compared with the baseline {base}: {label} [{_configs(runs)}], "
            f"{len(runs)} run(s) that differ from it in {what}{apart}"
        )
    return kept


def _shared_seeds(
    groups: Mapping[str, list[RunRecord]], base: str, notes: list[str]
) -> dict[str, list[Any]]:
    """The seeds each group shares with the baseline; a note for each group that drops some."""
    from lightning_losses.compare.group_table import _seeds_text

    for label, runs in groups.items():
        unseeded = [r.name for r in runs if r.seed is None]
        if unseeded:
            notes.append(
                f"{label}: {len(unseeded)} run(s) without a {SEED_PARAM} param cannot be "
                f"paired: {', '.join(unseeded)}"
            )
    base_seeds = {r.seed for r in groups[base] if r.seed is not None}
    shared: dict[str, list[Any]] = {}
    for label, runs in groups.items():
        if label == base:
            continue
        seeds = {r.seed for r in runs if r.seed is not None}
        common = sorted(seeds & base_seeds, key=_seed_order)
        own = sorted(seeds - base_seeds, key=_seed_order)
        theirs = sorted(base_seeds - seeds, key=_seed_order)
        shared[label] = common
        if own or theirs:
            dropped = [
                f"{_seeds_text(own)} of its own" if own else "",
                f"{_seeds_text(theirs)} of the baseline's" if theirs else "",
            ]
            notes.append(
                f"{label}: paired on the {len(common)} seed(s) it shares with the baseline"
                f"{' (' + _seeds_text(common) + ')' if common else ''}; dropped "
                f"{len(own) + len(theirs)}: {' and '.join(filter(None, dropped))}"
            )
    return shared


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
    logged = {key for runs in groups.values() for run in runs for key in run.metrics}
    metric_keys.update((key, (key,)) for key in conformal_keys(logged))
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
    seeds: Sequence[Any] | None,
    margin: float,
    level: float,
) -> GroupRow:
    """One group's row for one metric: its interval and its decision against the baseline.

    Args:
        metric: the compared metric, e.g. ``val/acc``.
        label: the group's label.
        values: the group's value per seed (:func:`_values`).
        base_values: the baseline group's.
        is_base: the group is the baseline (no decision).
        seeds: paired: the seeds the group shares with the baseline; ``None``: Welch's
            unpaired comparison.
        margin: the metric's equivalence margin.
        level: level of the intervals.
    """
    higher = higher_is_better(metric)
    mean = low = high = None
    if values:
        mean, low, high = t_interval(list(values.values()), level)
    decision, note = None, None
    if is_base:
        note = "baseline"
    elif coverage_target(metric) is not None:
        note = "no verdict (a coverage)"
    elif not values or not base_values:
        note = "not logged"
    elif seeds is not None:
        common = [seed for seed in seeds if seed in values and seed in base_values]
        if common:
            differences = [values[seed] - base_values[seed] for seed in common]
            decision = decide(differences, margin=margin, level=level, higher_is_better=higher)
        else:
            note = "no seed shared with the baseline"
    else:
        decision = decide(
            list(values.values()),
            list(base_values.values()),
            margin=margin,
            level=level,
            higher_is_better=higher,
        )
    return GroupRow(metric, label, values, mean, low, high, decision, note)
