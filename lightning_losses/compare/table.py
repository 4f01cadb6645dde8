"""Presenting comparison rows: sorted, as an aligned text table, as CSV.

The text table (:func:`format_table`) names each run by its name, the first 8 characters of
its id and its start time, so that two fits of one config are told apart. It fits a given
width: what all runs share (their loss, dataset, or some hyper-parameters) moves from the
columns into one ``common:`` line under the table; when that is not enough, the start-time
column is left out, the hyper-parameter and dataset columns are cut (ending in ``...``) down to
a minimum width, then the dataset, epochs, Brier and wall-time columns are left out, in that
order, and a last line says what was left out; run names are never cut (two configs whose
names start alike would look the same). A status column appears when the runs listed have
several statuses, a task column when they have several tasks. ``wide=True`` shows every
column in full.

Imports only the standard library.
"""

from __future__ import annotations

import csv
import os
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_losses.compare.describe import join_hparams, split_hparams
from lightning_losses.compare.query import (
    COLUMNS,
    CONFORMAL_METRIC,
    METRICS,
    OPTIONAL_METRICS,
)

__all__ = [
    "DEFAULT_WIDTH",
    "MAX_CELL",
    "NUMERIC_COLUMNS",
    "TABLE_COLUMNS",
    "format_sets",
    "format_table",
    "sort_rows",
    "write_csv",
]


def _short_id(value: Any) -> str:
    """The first 8 characters of a run id (enough to tell runs apart, and to find them)."""
    return str(value)[:8]


def _short_dataset(text: str) -> str:
    """A DataModule's class name without its :data:`DATASET_SUFFIX`: ``LongTailedDigits``."""
    if text.endswith(DATASET_SUFFIX) and len(text) > len(DATASET_SUFFIX):
        return text[: -len(DATASET_SUFFIX)]
    return text


def _short_time(value: Any) -> str:
    """``MM-DD HH:MM:SS`` of a ``YYYY-MM-DD HH:MM:SS`` start time."""
    text = str(value)
    return text[5:19] if len(text) >= 19 else text


#: Columns of the text table: (row key, header, format of a value: a format string or a
#: function). The id and the start time are shortened unless the table is wide.
TABLE_COLUMNS: tuple[tuple[str, str, str | Callable[[Any], str]], ...] = (
    ("run_name", "run", "{}"),
    ("run_id", "id", _short_id),
    ("status", "status", "{}"),
    ("start_time", "started", _short_time),
    ("loss", "loss", "{}"),
    ("hparams", "hparams", "{}"),
    ("dataset", "dataset", "{}"),
    ("task", "task", "{}"),
    *((name, name, "{:.4f}") for name in METRICS),
    ("epochs", "epochs", "{:d}"),
    ("wall_time_s", "wall s", "{:.1f}"),
)
#: Columns holding numbers: right-aligned in the table.
NUMERIC_COLUMNS = frozenset((*METRICS, "epochs", "wall_time_s"))
#: Widest hparams cell in the text table (longer ones are cut with "...") unless it is wide.
MAX_CELL = 60
#: Width of the table the command line prints when its output is not a terminal.
DEFAULT_WIDTH = 100
#: Columns whose value, when all runs share it, moves to the ``common:`` line (as do the
#: hparams items that all runs have).
COMMON_COLUMNS = ("loss", "dataset")
#: Ending of the DataModule class names, left out of the dataset column unless it is wide.
DATASET_SUFFIX = "DataModule"
#: Text columns left out when no run has a value for them.
OPTIONAL_TEXT = frozenset({"run_id", "start_time", "loss", "hparams", "dataset"})
#: Columns shown only when the rows do not all have the same value: the status (``--status
#: any`` lists runs of several) and the task (a binary run beside multiclass ones).
WHEN_THEY_DIFFER = frozenset({"status", "task"})
#: Columns cut to fit the width, with the narrowest each is cut to. Run names are never cut:
#: two configs whose names start alike must not look the same.
MIN_WIDTHS: dict[str, int] = {"hparams": 16, "dataset": 10}
#: Columns cut only when nothing else makes the table fit, with the narrowest each is cut to.
LAST_CUT: dict[str, int] = {"loss": 9}
#: Columns left out to fit the width: the first before any cut, the others after cutting.
FIRST_DROPPED = "start_time"
DROPPED = ("dataset", "epochs", "val/brier", "wall_time_s")
#: Spaces between columns.
_GAP = 2


def _sort_key(rows: Sequence[Mapping[str, Any]], sort_by: str) -> str:
    """The row key ``sort_by`` names (``"ece"`` is short for ``"val/ece"``).

    Raises:
        ValueError: no such column.
    """
    keys = set(COLUMNS).union(*(row.keys() for row in rows))
    if sort_by in keys:
        return sort_by
    if f"val/{sort_by}" in keys:
        return f"val/{sort_by}"
    raise ValueError(f"cannot sort by {sort_by!r}; choose one of {', '.join(sorted(keys))}")


def sort_rows(
    rows: Iterable[Mapping[str, Any]], sort_by: str = "val/ece", descending: bool = False
) -> list[dict[str, Any]]:
    """Rows sorted by one column; rows without a value for it come last either way.

    Args:
        rows: comparison rows.
        sort_by: a row key, e.g. ``"val/ece"`` (``"ece"`` also works), ``"loss"``.
        descending: largest first.

    Returns:
        A new, sorted list (stable: ties keep their order).

    Raises:
        ValueError: ``sort_by`` is not a column.
    """
    copies = [dict(row) for row in rows]
    key = _sort_key(copies, sort_by)
    present = [row for row in copies if row.get(key) is not None]
    missing = [row for row in copies if row.get(key) is None]
    return sorted(present, key=lambda row: row[key], reverse=descending) + missing


def _shown(key: str, cells: Sequence[str]) -> bool:
    """Whether a column is shown (a text column of no run's value, or one all runs share, not).

    :data:`OPTIONAL_TEXT` columns when some row has a value, :data:`WHEN_THEY_DIFFER` columns
    when the rows differ in it, every other column always.
    """
    if key in WHEN_THEY_DIFFER:
        return len(set(cells)) > 1
    return key not in OPTIONAL_TEXT or set(cells) != {"-"}


def _cell(value: Any, fmt: str | Callable[[Any], str]) -> str:
    """One table cell: ``-`` for ``None``; a value the format does not take, as ``str``."""
    if value is None or value == "":
        return "-"
    try:
        return fmt(value) if callable(fmt) else fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in ``...`` when cut."""
    if len(text) <= width:
        return text
    return text[: width - 3] + "..." if width > 3 else text[:width]


def _common_hparams(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """The hparams items every row has, and each row's hparams text without them."""
    split = [split_hparams(row.get("hparams")) for row in rows]
    sets = [{item for group in groups for item in group} for groups in split]
    first = [item for group in split[0] for item in group] if split else []
    common = [item for item in first if all(item in items for items in sets)]
    rest = [join_hparams([[i for i in g if i not in common] for g in groups]) for groups in split]
    return common, rest


def _fit(
    keys: list[str],
    natural: dict[str, int],
    headers: dict[str, str],
    width: int,
    keep: str,
) -> tuple[list[str], dict[str, int]]:
    """The columns kept and their widths, so that a line is at most ``width`` characters.

    Left out first :data:`FIRST_DROPPED`; then the columns of :data:`MIN_WIDTHS` are cut,
    widest first, down to their minimum; then :data:`DROPPED` are left out one by one; then
    the cut columns are cut down to 6 characters (or their header); then the loss is cut too
    (:data:`LAST_CUT`), all widest first. ``keep`` (the sort column) stays. When even that is
    too wide, the lines are longer than ``width``.
    """

    def fitted(
        active: list[str], floor: dict[str, int], last: bool = False
    ) -> dict[str, int] | None:
        widths = {key: natural[key] for key in active}
        cuttable = [key for key in active if key in floor]
        excess = sum(widths.values()) + _GAP * (len(active) - 1) - width
        while excess > 0:
            above = [key for key in cuttable if widths[key] > floor[key]]
            if not above:
                return widths if last else None
            widest = max(above, key=lambda key: widths[key])
            widths[widest] -= 1
            excess -= 1
        return widths

    soft = {key: max(low, len(headers[key])) for key, low in MIN_WIDTHS.items() if key in keys}
    hard = {key: max(6, len(headers[key])) for key in soft}
    last = {**hard, **{key: low for key, low in LAST_CUT.items() if key in keys}}
    active = list(keys)
    attempts: list[tuple[str | None, dict[str, int]]] = [(None, {}), (FIRST_DROPPED, {})]
    attempts += [(None, soft), *((key, soft) for key in DROPPED), (None, hard)]
    for dropped, floor in attempts:
        if dropped is not None:
            if dropped not in active or dropped == keep:
                continue
            active.remove(dropped)
        widths = fitted(active, floor)
        if widths is not None:
            return active, widths
    return active, fitted(active, last, last=True) or {}


def format_table(
    rows: Iterable[Mapping[str, Any]],
    sort_by: str = "val/ece",
    descending: bool = False,
    *,
    width: int | None = None,
    wide: bool = False,
) -> str:
    """The rows as an aligned text table, sorted by ``sort_by``.

    Args:
        rows: comparison rows (from :func:`collect_runs`).
        sort_by: the column to sort by (see :func:`sort_rows`).
        descending: largest first.
        width: the longest line allowed (the command line passes the terminal's width, or
            :data:`DEFAULT_WIDTH`); ``None``: no limit.
        wide: every column in full (whole run ids and start times, no ``common:`` line, no
            cut); ``width`` is then ignored.

    Returns:
        A header line, a rule and one line per run, with the run's name, id (first 8
        characters) and start time first; missing values are shown as ``-``. The columns of
        :data:`~lightning_losses.compare.query.OPTIONAL_METRICS` (the smooth ECE) appear only
        when some row has a value, and so do the id, start-time, loss, hparams and dataset
        columns. Unless ``wide``, a loss or dataset that all rows share, and the hparams items
        that all rows have, are left out of the columns and named on a ``common:`` line after a
        blank line; a column left out or cut to fit ``width`` is named on a last line.

    Raises:
        ValueError: ``sort_by`` is not a column, or ``width`` is not an int >= 1 (nor None).

    Example:
        >>> print(format_table([
        ...     {"run_name": "a", "loss": "Focal", "val/ece": 0.05, "epochs": 3},
        ...     {"run_name": "b", "loss": "CE", "val/ece": 0.02},
        ... ]))
        run  loss   val/acc  val/nll  val/ece  val/brier  epochs  wall s
        ----------------------------------------------------------------
        b    CE           -        -   0.0200          -       -       -
        a    Focal        -        -   0.0500          -       3       -
    """
    # compare/ imports no torch at import time (the checks module does): imported when used
    from lightning_losses.functional.checks import check_int

    width = check_int("width", width, low=1, optional=True)
    rows = sort_rows(rows, sort_by, descending)
    keep = _sort_key(rows, sort_by)
    columns = [
        column
        for column in TABLE_COLUMNS
        if column[0] not in OPTIONAL_METRICS or any(row.get(column[0]) is not None for row in rows)
    ]
    headers = {key: title for key, title, _ in columns}
    if wide:
        formats = {key: "{}" if callable(fmt) else fmt for key, _, fmt in columns}
        cells = {key: [_cell(row.get(key), formats[key]) for row in rows] for key in formats}
        keys = [key for key in headers if _shown(key, cells[key])]
        return _render(keys, headers, cells, {})
    cells = {key: [_cell(row.get(key), fmt) for row in rows] for key, _, fmt in columns}
    common: dict[str, str] = {}
    if len(rows) > 1:
        shared, rest = _common_hparams(rows)
        if shared:
            common["hparams"] = ", ".join(shared)
            cells["hparams"] = [_cell(text, "{}") for text in rest]
        for key in COMMON_COLUMNS:
            values = set(cells[key])
            if len(values) == 1 and "-" not in values and key != keep:
                common[key] = values.pop()
                cells[key] = ["-"] * len(rows)
    shared_text = [f"{headers[key]} {common[key]}" for key in headers if key in common]
    cells["dataset"] = [_short_dataset(text) for text in cells["dataset"]]
    cells["hparams"] = [_cut(cell, MAX_CELL) for cell in cells["hparams"]]
    keys = [key for key in headers if _shown(key, cells[key])]
    natural = {key: max(len(text) for text in [headers[key], *cells[key]]) for key in keys}
    if width is None:
        return _render(keys, headers, cells, natural, _notes(shared_text, [], [], None))
    shown, widths = _fit(keys, natural, headers, width, keep)
    left_out = [headers[key] for key in keys if key not in shown]
    cut = [headers[key] for key in shown if widths[key] < natural[key]]
    return _render(shown, headers, cells, widths, _notes(shared_text, left_out, cut, width))


def _notes(common: list[str], left_out: list[str], cut: list[str], width: int | None) -> list[str]:
    """The lines under the table: what all runs share, what was left out or cut to fit."""
    notes = []
    if common:
        notes.append("common: " + "; ".join(common))
    fitted = []
    if left_out:
        fitted.append(f"left out {', '.join(left_out)}")
    if cut:
        fitted.append(f"cut {', '.join(cut)}")
    if fitted:
        notes.append(f"to fit {width} columns: {'; '.join(fitted)} (--wide shows everything)")
    if width is None:
        return notes
    return [line for note in notes for line in textwrap.wrap(note, width, subsequent_indent="  ")]


def _render(
    keys: list[str],
    headers: Mapping[str, str],
    cells: Mapping[str, list[str]],
    widths: Mapping[str, int],
    notes: Sequence[str] = (),
) -> str:
    """Header, rule, one aligned line per row, then the notes after a blank line."""
    count = len(next(iter(cells.values()), []))
    widths = {
        key: widths.get(key, max(len(text) for text in [headers[key], *cells[key]])) for key in keys
    }

    def line(texts: list[str]) -> str:
        aligned = [
            _cut(text, widths[key]).rjust(widths[key])
            if key in NUMERIC_COLUMNS
            else _cut(text, widths[key]).ljust(widths[key])
            for key, text in zip(keys, texts, strict=True)
        ]
        return (" " * _GAP).join(aligned).rstrip()

    rule = "-" * (sum(widths.values()) + _GAP * (len(keys) - 1))
    body = [line([cells[key][i] for key in keys]) for i in range(count)]
    table = "\n".join([line([headers[key] for key in keys]), rule, *body])
    return table + "\n\n" + "\n".join(notes) if notes else table


def format_sets(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The runs' prediction sets at ``test``: each score and level's coverage / mean set size.

    Read from the rows' ``test/conformal_<method>_<alpha>_{coverage,size}`` keys (what
    ``ConformalPrediction`` logs when ``lightning-losses test`` runs); ``None`` when no row
    has them. One line per run that has them, in the rows' order; ``-`` where a run lacks one.

    Example:
        >>> print(format_sets([
        ...     {"run_name": "ce", "run_id": "0123456789ab",
        ...      "test/conformal_aps_0.1_coverage": 0.9031, "test/conformal_aps_0.1_size": 1.84},
        ...     {"run_name": "no sets", "run_id": "ffff"},
        ... ]))
        prediction sets at test: coverage / mean set size, by score and alpha
        run  id        aps 0.1
        ---------------------------
        ce   01234567  0.903 / 1.84
    """
    pairs: dict[tuple[str, str], None] = {}
    for row in rows:
        for key in row:
            found = CONFORMAL_METRIC.fullmatch(key)
            if found:
                pairs[found["method"], found["alpha"]] = None
    if not pairs:
        return None
    order = sorted(pairs, key=lambda pair: (pair[0], float(pair[1])))

    def cell(row: Mapping[str, Any], method: str, alpha: str) -> str:
        key = f"test/conformal_{method}_{alpha}"
        coverage, size = row.get(f"{key}_coverage"), row.get(f"{key}_size")
        if coverage is None and size is None:
            return "-"
        return f"{_cell(coverage, '{:.3f}')} / {_cell(size, '{:.2f}')}"

    table = [["run", "id", *(f"{method} {alpha}" for method, alpha in order)]]
    for row in rows:
        cells = [cell(row, method, alpha) for method, alpha in order]
        if any(c != "-" for c in cells):
            table.append([str(row.get("run_name")), _short_id(row.get("run_id")), *cells])
    widths = [max(len(line[k]) for line in table) for k in range(len(table[0]))]
    text = [
        (" " * _GAP).join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]
    rule = "-" * (sum(widths) + _GAP * (len(widths) - 1))
    title = "prediction sets at test: coverage / mean set size, by score and alpha"
    return "\n".join([title, text[0], rule, *text[1:]])


def write_csv(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write the rows to a CSV file (columns :data:`COLUMNS`, then any other keys).

    Args:
        rows: comparison rows.
        path: the file to write; its folder is created.

    Returns:
        The path written. ``None`` is written as an empty field, floats in full precision.
    """
    rows = list(rows)
    extra = [key for row in rows for key in row if key not in COLUMNS]
    fieldnames = [*COLUMNS, *dict.fromkeys(extra)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fieldnames, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return path
