"""Presenting comparison rows: sorted, as an aligned text table, as CSV.

Imports only the standard library.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .query import COLUMNS, METRICS, OPTIONAL_METRICS

__all__ = ["MAX_CELL", "NUMERIC_COLUMNS", "TABLE_COLUMNS", "format_table", "sort_rows", "write_csv"]

#: Columns of the text table: (row key, header, format of a value).
TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run_name", "run", "{}"),
    ("loss", "loss", "{}"),
    ("hparams", "hparams", "{}"),
    ("dataset", "dataset", "{}"),
    *((name, name, "{:.4f}") for name in METRICS),
    ("epochs", "epochs", "{:d}"),
    ("wall_time_s", "wall s", "{:.1f}"),
)
#: Columns holding numbers: right-aligned in the table.
NUMERIC_COLUMNS = frozenset((*METRICS, "epochs", "wall_time_s"))
#: Widest hparams cell in the text table (longer ones are cut with "...").
MAX_CELL = 60


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
    rows = [dict(row) for row in rows]
    key = _sort_key(rows, sort_by)
    present = [row for row in rows if row.get(key) is not None]
    missing = [row for row in rows if row.get(key) is None]
    return sorted(present, key=lambda row: row[key], reverse=descending) + missing


def _cell(value: Any, fmt: str) -> str:
    """One table cell: ``-`` for ``None``, long text cut to :data:`MAX_CELL` characters."""
    if value is None:
        return "-"
    try:
        text = fmt.format(value)
    except (ValueError, TypeError):
        text = str(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def format_table(
    rows: Iterable[Mapping[str, Any]], sort_by: str = "val/ece", descending: bool = False
) -> str:
    """The rows as an aligned text table, sorted by ``sort_by``.

    Args:
        rows: comparison rows (from :func:`collect_runs`).
        sort_by: the column to sort by (see :func:`sort_rows`).
        descending: largest first.

    Returns:
        A header line, a rule and one line per run; missing values are shown as ``-``. The
        columns of :data:`~lightning_losses.compare.query.OPTIONAL_METRICS` (the smooth ECE)
        appear only when some row has a value.

    Example:
        >>> print(format_table([
        ...     {"run_name": "a", "loss": "Focal", "val/ece": 0.05, "epochs": 3},
        ...     {"run_name": "b", "loss": "CE", "val/ece": 0.02},
        ... ]))
        run  loss   hparams  dataset  val/acc  val/nll  val/ece  val/brier  epochs  wall s
        ----------------------------------------------------------------------------------
        b    CE     -        -              -        -   0.0200          -       -       -
        a    Focal  -        -              -        -   0.0500          -       3       -
    """
    rows = sort_rows(rows, sort_by, descending)
    columns = [
        column
        for column in TABLE_COLUMNS
        if column[0] not in OPTIONAL_METRICS or any(row.get(column[0]) is not None for row in rows)
    ]
    header = [title for _, title, _ in columns]
    body = [[_cell(row.get(key), fmt) for key, _, fmt in columns] for row in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        aligned = [
            cell.rjust(width) if key in NUMERIC_COLUMNS else cell.ljust(width)
            for (key, _, _), cell, width in zip(columns, cells, widths, strict=True)
        ]
        return "  ".join(aligned).rstrip()

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    return "\n".join([line(header), rule, *(line(cells) for cells in body)])


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
