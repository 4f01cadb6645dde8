"""The result of ``compare --group-by`` and its text and CSV: a preamble, a table, groups.csv.

:class:`GroupComparison` (one :class:`GroupRow` per metric and group) is what
:func:`~lightning_losses.compare.groups.compare_groups` returns. :func:`format_groups` prints
it as a table that fits a width, after a preamble that says what was grouped and states the
verdict rules in the order :func:`~lightning_losses.compare.decide.decide` applies them;
:func:`write_groups_csv` writes it in full precision with every group's per-seed values, so
that each verdict can be recomputed.

Imports only the standard library.
"""

from __future__ import annotations

import csv
import json
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_losses.compare.decide import MAX_SEEDS, Decision
from lightning_losses.compare.query import coverage_target
from lightning_losses.compare.table import _GAP

__all__ = [
    "GROUP_CSV_COLUMNS",
    "HIGHER_IS_BETTER",
    "SEED_PARAM",
    "GroupComparison",
    "GroupRow",
    "format_groups",
    "higher_is_better",
    "verdict_text",
    "write_groups_csv",
]

#: The param holding a run's seed (LightningCLI's ``--seed_everything``).
SEED_PARAM = "seed_everything"
#: Quantities where higher is better; lower is better for the others (NLL, ECE, Brier).
HIGHER_IS_BETTER = frozenset({"acc"})


def higher_is_better(metric: str) -> bool:
    """The direction of a compared metric (``val/acc``: higher; NLL, ECE, set sizes: lower).

    Example:
        >>> higher_is_better("test/acc"), higher_is_better("test/conformal_raps_0.1_size")
        (True, False)
    """
    return metric.split("/", 1)[1] in HIGHER_IS_BETTER


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
        notes: runs left out (without the param, or not comparable with the baseline), seeds run
            twice, seeds dropped to pair.
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


def verdict_text(decision: Decision, *, higher_is_better: bool = True) -> str:
    """The verdict cell: better, worse, ``equivalent (±margin)`` or ``undecided (needs ~k seeds)``.

    :func:`~lightning_losses.compare.decide.decide` tests equivalence first: a difference
    inside the margin that is also beyond noise (its interval excludes 0) reads
    ``equivalent (±margin), worse beyond noise`` (or ``better``), so neither finding is hidden.

    Args:
        decision: from :func:`~lightning_losses.compare.decide.decide`.
        higher_is_better: the metric's direction, as given to ``decide``.

    Example:
        >>> from lightning_losses.compare.decide import decide
        >>> verdict_text(decide([0.02, -0.01, 0.03], margin=0.005))
        'undecided (needs ~12 seeds)'
        >>> verdict_text(decide([0.001, -0.001, 0.0005, -0.0002], margin=0.01))
        'equivalent (±0.01)'
        >>> verdict_text(decide([-0.007, -0.0075, -0.0065, -0.007], margin=0.01))
        'equivalent (±0.01), worse beyond noise'
    """
    if decision.verdict == "equivalent":
        text = f"equivalent (±{decision.margin:g})"
        if decision.different:
            side = "better" if (decision.difference > 0) == higher_is_better else "worse"
            text += f", {side} beyond noise"
        return text
    if decision.verdict == "undecided":
        if decision.n < 2:
            return "undecided (needs at least 2 seeds)"
        if decision.seeds_needed is None:
            return f"undecided (needs over {MAX_SEEDS} seeds)"
        return f"undecided (needs ~{decision.seeds_needed} seeds)"
    return decision.verdict


# --- the table -------------------------------------------------------------------------------


def _plus_minus(centre: float | None, high: float | None, sign: str = "") -> str:
    """``0.9123 ± 0.0081``: the centre of a symmetric interval and its half width.

    An interval of one seed is infinite: ``0.9123 (one seed)``, no ``± inf``.

    Example:
        >>> _plus_minus(0.9123, 0.9204), _plus_minus(0.9123, math.inf), _plus_minus(None, None)
        ('0.9123 ± 0.0081', '0.9123 (one seed)', '-')
    """
    if centre is None or high is None:
        return "-"
    if not math.isfinite(high):
        return f"{centre:{sign}.4f} (one seed)"
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
        f"Verdict, the first rule that holds: (1) equivalent (±margin) when two one-sided "
        f"t-tests at alpha {alpha} put the diff within ±margin (', worse beyond noise' or "
        f"', better beyond noise' added when its {pct} interval also excludes 0); (2) better "
        f"or worse when the diff's {pct} interval excludes 0; (3) else undecided, with about "
        "how many seeds would decide.",
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
        cells["verdict"] = verdict_text(row.decision, higher_is_better=higher_is_better(row.metric))
    elif row.note:
        cells["verdict"] = row.note
    return cells


#: Columns right-aligned in the table.
_NUMERIC = frozenset({"n", "mean", "difference"})
#: Columns left out, in turn, when the table does not fit its width.
DROPPED = (("mean",),)
#: What the last line says of a column left out.
_DROPPED_TEXT = {"mean": "the groups' means (in the CSV)"}


def _fit(
    keys: list[str], natural: Mapping[str, int], width: int
) -> tuple[list[str], bool, list[str]]:
    """The columns kept, whether the group names go on lines of their own, and what was done.

    Group names are never cut (two groups must not look alike). Tried in turn: every column,
    then without those of each entry of :data:`DROPPED`; then the same with each group's name
    on a line of its own above its numbers (indented by :data:`WRAP_INDENT`). The first that
    fits ``width`` is taken, else the last (its lines are then longer than ``width``).
    """
    for wrapped in (False, True):
        for dropped in ((), *DROPPED):
            kept = [key for key in keys if key not in dropped]
            shown = [key for key in kept if not (wrapped and key == "group")]
            total = sum(natural[k] for k in shown) + _GAP * (len(shown) - 1)
            total += WRAP_INDENT if wrapped else 0
            if total <= width:
                break
        else:
            continue
        break
    fitted = ["each group's name on its own line"] if wrapped else []
    if dropped:
        fitted.append("left out " + ", ".join(_DROPPED_TEXT[key] for key in dropped))
    return kept, wrapped, fitted


#: Indent of a group's numbers under its name, when the names go on lines of their own.
WRAP_INDENT = 2


def format_groups(result: GroupComparison, *, width: int | None = None) -> str:
    """The comparison as text: a preamble, then per metric one line per group.

    The columns: group, n (left out when every group has the same seeds: the preamble says
    how many), the mean over seeds ± the half width of its Student-t interval (a group of one
    seed shows its value and ``(one seed)``), the difference to the baseline ± the half width
    of its interval (the headers name the level and the method; both intervals are
    symmetric) and the verdict. Group names are never cut: to fit ``width``, the groups'
    means are left out, then each group's name goes on a line of its own above its numbers;
    a last line says what was done.

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
    wrapped = False
    fitted: list[str] = []
    if width is not None:
        keys, wrapped, fitted = _fit(keys, natural, width)
    shown = [k for k in keys if not (wrapped and k == "group")]
    indent = " " * (WRAP_INDENT if wrapped else 0)

    def line(texts: Mapping[str, str]) -> str:
        parts = [
            texts[k].rjust(natural[k]) if k in _NUMERIC else texts[k].ljust(natural[k])
            for k in shown
        ]
        return (indent + (" " * _GAP).join(parts)).rstrip()

    rule = "-" * (len(indent) + sum(natural[k] for k in shown) + _GAP * (len(shown) - 1))
    lines = (["group"] if wrapped else []) + [line(headers), rule]
    metric = None
    for row, texts in zip(result.rows, cells, strict=True):
        if row.metric != metric:
            metric = row.metric
            target = coverage_target(metric)
            if target is not None:
                lines.append(f"{metric} (should be {target:g}, the level the sets guarantee)")
            else:
                better = "higher" if higher_is_better(metric) else "lower"
                margin = result.margins[metric]
                lines.append(f"{metric} ({better} is better; equivalence margin ±{margin:g})")
        if wrapped:
            lines.append(texts["group"])
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
