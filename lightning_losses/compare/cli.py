"""``lightning-losses compare``: the command line (argument parser and entry point).

Imports only the standard library at import time, so that ``lightning-losses compare --help``
stays fast: :func:`build_parser` reads nothing else, and :func:`main` imports the rest of the
package (and mlflow) once the arguments are parsed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from pathlib import Path

__all__ = ["DEFAULT_EXPERIMENT", "build_parser", "main", "table_width"]

#: Experiment that :func:`main` compares when none is given.
DEFAULT_EXPERIMENT = "lightning-losses"
#: Shown in ``--help``; the same as ``query.DEFAULT_TRACKING_URI`` (a test checks).
_DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
#: The values of ``--status``; the same as ``query.RUN_STATUSES`` and ``query.ANY_STATUS`` (a
#: test checks).
_STATUSES = ("FINISHED", "RUNNING", "KILLED", "FAILED", "SCHEDULED", "any")
#: Width of the table when standard output is not a terminal; the same as
#: ``table.DEFAULT_WIDTH`` (a test checks).
_DEFAULT_WIDTH = 100


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lightning-losses compare``.

    Returns:
        A parser whose namespace has ``experiment``, ``tracking_uri``, ``sort_by``,
        ``descending``, ``out``, ``diagrams``, ``runs``, ``where``, ``config``, ``status``,
        ``ece`` and ``wide``, and for
        configurations over seeds ``group_by``, ``pair_by``, ``baseline``, ``margin`` and
        ``level``.

    Example:
        >>> args = build_parser().parse_args(["--sort-by", "acc", "--runs", "a1", "b2"])
        >>> args.experiment, args.sort_by, args.runs, args.diagrams
        ('lightning-losses', 'acc', ['a1', 'b2'], 4)
    """
    parser = argparse.ArgumentParser(
        prog="lightning-losses compare",
        description="Compare the MLflow runs of an experiment: a table, a CSV and a figure.",
    )
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="experiment name")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help=f"MLflow tracking URI (default: $MLFLOW_TRACKING_URI or {_DEFAULT_TRACKING_URI})",
    )
    parser.add_argument(
        "--sort-by",
        default=None,
        help="column to sort by (default: the --ece column, val/ece or val/smooth_ece)",
    )
    parser.add_argument("--descending", action="store_true", help="sort largest first")
    parser.add_argument(
        "--out",
        default=None,
        help="output folder (default: comparison/ beside the SQLite store, else in the current "
        "folder)",
    )
    parser.add_argument(
        "--diagrams", type=int, default=4, help="reliability diagrams in the figure (4)"
    )
    parser.add_argument("--runs", nargs="+", metavar="ID", help="only these run ids")
    parser.add_argument(
        "--where",
        action="append",
        metavar="KEY=VALUE",
        help="only the runs whose param or tag KEY (or the param it ends, e.g. gamma) has "
        "VALUE (2 matches 2.0); repeatable, all must hold",
    )
    parser.add_argument(
        "--config",
        nargs="+",
        metavar="NAME",
        help="only the runs fitted from these configs (digits_ce or configs/digits_ce.yaml)",
    )
    parser.add_argument(
        "--status",
        nargs="+",
        type=_status,
        metavar="STATUS",
        help="list the runs of these statuses: FINISHED, RUNNING, KILLED, FAILED, or any "
        "(default: FINISHED RUNNING; --runs lists its runs whatever their status)",
    )
    parser.add_argument(
        "--ece",
        choices=("binned", "smooth"),
        default="binned",
        help="the calibration error of the figure: binned (val/ece, default) or smooth "
        "(val/smooth_ece, logged by CalibrationMonitor(smooth=True))",
    )
    parser.add_argument(
        "--wide",
        action="store_true",
        help=f"print every column in full (default: fit the terminal, or {_DEFAULT_WIDTH} "
        "columns when the output is not a terminal)",
    )
    groups = parser.add_argument_group(
        "configurations over seeds",
        "one row per configuration and metric: mean over seeds with its Student-t interval, "
        "the difference to a baseline group and a verdict (better, worse, equivalent within a "
        "margin, or undecided with the seeds that would decide); writes groups.csv",
    )
    groups.add_argument(
        "--group-by",
        metavar="PARAM",
        help="a run param (model.criterion.class_path, or its last parts: gamma), or run_name, "
        "config, loss",
    )
    groups.add_argument(
        "--pair-by",
        choices=("seed",),
        help="pair the runs of each group with the baseline's by seed_everything (paired t); "
        "default: Welch's t, unpaired",
    )
    groups.add_argument(
        "--baseline",
        metavar="GROUP",
        help="the group the others are compared with (default: the cross-entropy group, "
        "else the first)",
    )
    groups.add_argument(
        "--margin",
        action="append",
        metavar="METRIC=VALUE",
        help="equivalence margin, repeatable (defaults: acc=0.01, nll=0.02, ece=0.005, "
        "brier=0.005, smooth_ece=0.005; a prediction set's size 0.1, coverage 0.02)",
    )
    groups.add_argument(
        "--level", metavar="LEVEL", help="level of the intervals, in (0, 1) (default 0.95)"
    )
    return parser


def _status(text: str) -> str:
    """A ``--status`` value: a run status in any case, or ``any``.

    Example:
        >>> _status("killed"), _status("ANY")
        ('KILLED', 'any')
    """
    value = "any" if text.lower() == "any" else text.upper()
    if value not in _STATUSES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a run status; choose from {', '.join(_STATUSES)}"
        )
    return value


def skipped_text(skipped: dict[str, int]) -> str:
    """The line that says how many runs a listing left out for their status ("" for none).

    Example:
        >>> skipped_text({"FAILED": 2, "KILLED": 1})
        'skipped 3 runs for their status (1 KILLED, 2 FAILED): --status any lists every run'
        >>> skipped_text({})
        ''
    """
    total = sum(skipped.values())
    if not total:
        return ""
    order = {name: index for index, name in enumerate(_STATUSES)}
    counts = ", ".join(
        f"{skipped[name]} {name}" for name in sorted(skipped, key=lambda n: order.get(n, 99))
    )
    runs = "run" if total == 1 else "runs"
    return f"skipped {total} {runs} for their status ({counts}): --status any lists every run"


def _no_runs_text(
    experiment: str,
    status: list[str] | None,
    skipped: dict[str, int],
    args: argparse.Namespace | None = None,
) -> str:
    """The message of a listing without runs: which statuses and filters, what was skipped."""
    if status and "any" in status:
        wanted = ""
    else:
        wanted = " or ".join(s.lower() for s in status or ("finished", "running")) + " "
    text = f"no {wanted}runs in experiment {experiment!r}"
    filters = [f"--where {w}" for w in (args.where or [])] if args is not None else []
    if args is not None and args.config:
        filters.append(f"--config {' '.join(args.config)}")
    if filters:
        text += f" match {' '.join(filters)}"
    more = skipped_text(skipped)
    return f"{text}; {more}" if more else text


#: The options that only apply with ``--group-by``.
_GROUP_OPTIONS = ("pair_by", "baseline", "margin", "level")


def table_width() -> int:
    """The width the table must fit: the terminal's, or 100 when stdout is not a terminal.

    Returns:
        ``shutil.get_terminal_size().columns`` (which honours ``COLUMNS``) when standard
        output is a terminal, else :data:`_DEFAULT_WIDTH`.
    """
    if sys.stdout.isatty():
        return shutil.get_terminal_size((_DEFAULT_WIDTH, 24)).columns
    return _DEFAULT_WIDTH


def main(argv: list[str] | None = None) -> int:
    """``lightning-losses compare``: print the comparison table, write CSV and figure.

    Args:
        argv: the arguments after ``compare`` (default: ``sys.argv[1:]``).

    Returns:
        0 on success; 1 when there is no run to compare (none matches the filters); 2 on an
        error (unknown experiment, run, column or config, a ``--where`` key of no run, a
        missing store or a tracking URI that is a folder; with ``--group-by``: a param of no
        run, a baseline of no group or of several, a level outside (0, 1), a malformed
        margin), with the message on stderr, one line.
    """
    args = build_parser().parse_args(argv)
    if args.group_by is None:
        given = [name for name in _GROUP_OPTIONS if getattr(args, name) is not None]
        if given:
            option = "--" + given[0].replace("_", "-")
            print(
                f"lightning-losses compare: error: {option} needs --group-by PARAM",
                file=sys.stderr,
            )
            return 2
    else:
        return _compare_groups(args)
    from mlflow.exceptions import MlflowException

    from lightning_losses.compare.figure import comparison_figure, split_tasks
    from lightning_losses.compare.query import collect_runs, resolve_tracking_uri
    from lightning_losses.compare.table import format_sets, format_table, sort_rows, write_csv

    skipped: dict[str, int] = {}
    try:
        uri = resolve_tracking_uri(args.tracking_uri)
        rows = collect_runs(
            args.experiment,
            tracking_uri=uri,
            run_ids=args.runs,
            status=args.status,
            skipped=skipped,
            **_filters(args),
        )
        if not rows:
            print(_no_runs_text(args.experiment, args.status, skipped, args), file=sys.stderr)
            return 1
        sort_by = args.sort_by or ("val/smooth_ece" if args.ece == "smooth" else "val/ece")
        rows = sort_rows(rows, sort_by, args.descending)
        width = None if args.wide else table_width()
        table = format_table(rows, sort_by, args.descending, width=width, wide=args.wide)
        out = output_folder(args.out, uri)
        csv_path = write_csv(rows, out / "comparison.csv")
        png_path = comparison_figure(
            rows, out / "comparison.png", tracking_uri=uri, diagrams=args.diagrams, ece=args.ece
        )
        apart = split_tasks(rows)[1]
    except (ValueError, OSError, MlflowException) as error:
        print(f"lightning-losses compare: error: {error}", file=sys.stderr)
        return 2
    print(table)
    sets = format_sets(rows)
    if sets is not None:
        print(f"\n{sets}")
    if skipped:
        print(f"\n{skipped_text(skipped)}")
    if apart:
        print("\n" + "\n".join(textwrap.wrap(apart, width or 100, subsequent_indent="  ")))
    print(f"\nwrote {csv_path}\nwrote {png_path}")
    return 0


def _filters(args: argparse.Namespace) -> dict:
    """The collectors' ``where`` and ``configs`` arguments: ``--where`` and ``--config``."""
    from lightning_losses.compare.alike import parse_where

    return {"where": parse_where(args.where or []), "configs": args.config}


def output_folder(out: str | None, tracking_uri: str) -> Path:
    """Where the outputs go: ``--out``, else ``comparison/`` beside the SQLite store.

    Args:
        out: the ``--out`` option (``None``: not given).
        tracking_uri: the resolved tracking URI.

    Returns:
        ``out`` as given; by default ``comparison`` in the folder of the store's SQLite file,
        or in the current folder for a store without a file (a server).

    Example:
        >>> str(output_folder(None, "sqlite:////data/runs/mlflow.db"))
        '/data/runs/comparison'
        >>> str(output_folder("here", "sqlite:////data/runs/mlflow.db"))
        'here'
    """
    if out is not None:
        return Path(out)
    from lightning_losses.compare.query import _sqlite_path

    database = _sqlite_path(tracking_uri)
    return (database.parent if database is not None else Path.cwd()) / "comparison"


def _compare_groups(args: argparse.Namespace) -> int:
    """``compare --group-by``: print the groups' table and write ``groups.csv``."""
    from mlflow.exceptions import MlflowException

    from lightning_losses.compare.groups import (
        collect_records,
        compare_groups,
        format_groups,
        parse_level,
        parse_margins,
        write_groups_csv,
    )
    from lightning_losses.compare.query import resolve_tracking_uri

    try:
        level = parse_level(args.level)
        margins = parse_margins(args.margin or [])
        uri = resolve_tracking_uri(args.tracking_uri)
        skipped: dict[str, int] = {}
        records = collect_records(
            args.experiment,
            tracking_uri=uri,
            run_ids=args.runs,
            status=args.status,
            skipped=skipped,
            **_filters(args),
        )
        if not records:
            print(_no_runs_text(args.experiment, args.status, skipped, args), file=sys.stderr)
            return 1
        result = compare_groups(
            records,
            args.group_by,
            pair_by=args.pair_by,
            baseline=args.baseline,
            level=level,
            margins=margins,
        )
        text = format_groups(result, width=None if args.wide else table_width())
        csv_path = write_groups_csv(result, output_folder(args.out, uri) / "groups.csv")
    except (ValueError, OSError, MlflowException) as error:
        print(f"lightning-losses compare: error: {error}", file=sys.stderr)
        return 2
    print(text)
    if skipped:
        print(f"\n{skipped_text(skipped)}")
    print(f"\nwrote {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
