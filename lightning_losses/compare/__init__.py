"""Compare the MLflow runs of an experiment side by side: ``lightning-losses compare``.

The package, by what each part does:

- :mod:`~lightning_losses.compare.query`: the MLflow store, the experiment and its runs, one
  row per run (:func:`collect_runs`, :func:`run_row`, :data:`METRICS`, :data:`COLUMNS`), the
  fit's own wall time (:func:`fit_seconds`).
- :mod:`~lightning_losses.compare.decide`: better, worse, equivalent within a margin or
  undecided over seeds (paired or Welch t, TOST), the rule the report's verdicts use too
  (:func:`decide`, :func:`pair_by_seed`, :func:`t_interval`).
- :mod:`~lightning_losses.compare.groups`: ``--group-by``: runs grouped by a param and split
  until they differ only in their seed, one run per seed, each group's mean and Student-t
  interval per metric and its verdict against a baseline group of the same task and model
  (:func:`collect_records`, :func:`compare_groups`); printed and written by
  :mod:`~lightning_losses.compare.group_table` (:func:`format_groups`,
  :func:`write_groups_csv`).
- :mod:`~lightning_losses.compare.alike`: what sets two runs apart besides their seed
  (:func:`canonical`, :func:`treatment`), and the ``--where`` / ``--config`` filters
  (:func:`parse_where`, :func:`matches`).
- :mod:`~lightning_losses.compare.params`: flattened MLflow params back to nested values
  (:func:`unflatten`).
- :mod:`~lightning_losses.compare.describe`: a run's hyper-parameters as one short line: the
  loss's arguments and its schedules (:func:`hparams_text`).
- :mod:`~lightning_losses.compare.table`: sorting, the text table fitted to a width, and the
  CSV (:func:`sort_rows`, :func:`format_table`, :func:`write_csv`).
- :mod:`~lightning_losses.compare.figure`: accuracy against ECE with one label per run, placed
  so that labels do not overlap, the runs of one task only, and the runs' reliability
  diagrams (:func:`comparison_figure`, :func:`draw_scatter`, :func:`point_labels`,
  :func:`split_tasks`).
- :mod:`~lightning_losses.compare.cli`: the command line (:func:`build_parser`, :func:`main`);
  it imports only the standard library until it runs.

The names above are importable from ``lightning_losses.compare`` itself; they are loaded on
first use (PEP 562), so importing the package, or its ``cli`` for ``--help``, stays light.
mlflow and matplotlib are imported inside the functions that use them.
"""

from __future__ import annotations

from lightning_losses._lazy import lazy_exports

#: Each name importable from the package, with the submodule that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        ("DEFAULT_EXPERIMENT", "build_parser", "main", "output_folder", "table_width"), "cli"
    ),
    **dict.fromkeys(("canonical", "matches", "parse_where", "treatment"), "alike"),
    **dict.fromkeys(
        ("NON_HPARAMS", "SCHEDULE_CALLBACKS", "hparams_text", "join_hparams", "split_hparams"),
        "describe",
    ),
    **dict.fromkeys(
        (
            "DIAGRAM_DIR",
            "DIAGRAM_PATTERN",
            "DIAGRAM_WIDTH",
            "DPI",
            "FIGURE_HEIGHT",
            "PROGRESS_BAR_VARIABLE",
            "SCATTER_WIDTH",
            "comparison_figure",
            "draw_scatter",
            "point_labels",
            "split_tasks",
        ),
        "figure",
    ),
    "unflatten": "params",
    **dict.fromkeys(
        (
            "DEFAULT_MARGINS",
            "GroupComparison",
            "GroupRow",
            "RunRecord",
            "collect_records",
            "compare_groups",
            "format_groups",
            "parse_level",
            "parse_margins",
            "resolve_group_by",
            "verdict_text",
            "write_groups_csv",
        ),
        "groups",
    ),
    **dict.fromkeys(("VERDICTS", "Decision", "decide", "pair_by_seed", "t_interval"), "decide"),
    **dict.fromkeys(
        (
            "COLUMNS",
            "DEFAULT_TRACKING_URI",
            "FIT_METRICS",
            "LISTED_STATUSES",
            "METRICS",
            "_wall_time",  # used by tests written against the single-module version
            "collect_runs",
            "fit_seconds",
            "mlflow_client",
            "resolve_tracking_uri",
            "run_row",
        ),
        "query",
    ),
    **dict.fromkeys(
        (
            "DEFAULT_WIDTH",
            "MAX_CELL",
            "NUMERIC_COLUMNS",
            "TABLE_COLUMNS",
            "format_table",
            "sort_rows",
            "write_csv",
        ),
        "table",
    ),
}

__all__ = [
    "COLUMNS",
    "METRICS",
    "build_parser",
    "collect_runs",
    "comparison_figure",
    "draw_scatter",
    "fit_seconds",
    "format_table",
    "hparams_text",
    "main",
    "point_labels",
    "resolve_tracking_uri",
    "run_row",
    "sort_rows",
    "unflatten",
    "write_csv",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
