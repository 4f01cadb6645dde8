"""Compare the MLflow runs of an experiment side by side: ``lightning-losses compare``.

Each run logged by the package's MLflow logger carries the tags ``loss``, ``dataset`` and
``config``, the resolved config flattened into dotted params (``model.criterion.init_args.gamma``,
``trainer.callbacks.0.class_path``, ...) and metric histories (``val/acc``, ``val/ece``, ...).
:func:`collect_runs` turns every finished or running run into one flat row: its loss, its key
hyper-parameters (with a summary of any loss schedule), its dataset, the final value of the
validation metrics (read from the run's one-value-per-step history, so that a resumed run shows
what its resumed fit logged), the number of epochs and the wall time. :func:`format_table`,
:func:`write_csv` and :func:`comparison_figure` present the rows; :func:`main` is the command
line.

mlflow and matplotlib are imported inside the functions that need them, so importing this
module stays light.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

__all__ = [
    "COLUMNS",
    "METRICS",
    "collect_runs",
    "comparison_figure",
    "format_table",
    "hparams_text",
    "main",
    "resolve_tracking_uri",
    "run_row",
    "sort_rows",
    "unflatten",
    "write_csv",
]

#: Experiment that :func:`main` compares when none is given.
DEFAULT_EXPERIMENT = "lightning-losses"
#: Tracking URI used when neither the argument nor ``MLFLOW_TRACKING_URI`` gives one.
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"

#: The metrics of a row, each with the MLflow metric keys it is read from (first one present).
METRICS: dict[str, tuple[str, ...]] = {
    "val/acc": ("val/acc", "val/accuracy"),
    "val/nll": ("val/nll",),
    "val/ece": ("val/ece",),
    "val/brier": ("val/brier",),
}
#: The keys of a row, in CSV column order.
COLUMNS: tuple[str, ...] = (
    "run_id",
    "run_name",
    "status",
    "loss",
    "hparams",
    "dataset",
    "config",
    *METRICS,
    "epochs",
    "wall_time_s",
)
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

#: Run statuses listed when no run ids are given.
LISTED_STATUSES = ("FINISHED", "RUNNING")
#: Loss constructor arguments that are not hyper-parameters of the loss.
NON_HPARAMS = frozenset({"reduction", "ignore_index", "validate_args"})
#: Callbacks whose configuration is summarised next to the hyper-parameters.
SCHEDULE_CALLBACKS = ("GammaAnnealing", "LossScheduler", "LossSwitch")
#: Reliability diagrams logged by CalibrationMonitor: ``calibration/val_epoch=NNN.png``.
DIAGRAM_DIR = "calibration"
DIAGRAM_PATTERN = re.compile(r"val_epoch=(\d+)\.png$")

#: Comparison figure geometry in inches (scatter panel, one diagram tile, height) and DPI.
SCATTER_WIDTH = 6.0
DIAGRAM_WIDTH = 4.5
FIGURE_HEIGHT = 5.0
DPI = 100
#: Label offsets (points) of the scatter points, cycled along the accuracy axis.
LABEL_OFFSETS = ((6, 6), (6, -14), (6, 18), (6, -26))
#: Environment variable that turns MLflow's artifact download progress bar off.
PROGRESS_BAR_VARIABLE = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


# --------------------------------------------------------------------------------------------
# Tracking store
# --------------------------------------------------------------------------------------------


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """The tracking URI to read: the argument, else ``MLFLOW_TRACKING_URI``, else the default.

    Args:
        tracking_uri: an explicit URI, or ``None``.

    Returns:
        ``tracking_uri``, the environment variable ``MLFLOW_TRACKING_URI`` or
        ``sqlite:///mlflow.db`` (a SQLite store in the working directory), first one set; a
        relative SQLite path is made absolute (MLflow caches stores by URI).

    Example:
        >>> resolve_tracking_uri("sqlite:////tmp/x.db")
        'sqlite:////tmp/x.db'
    """
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    path = _sqlite_path(uri)
    if path is not None and not path.is_absolute():
        query = uri.partition("?")[1] + uri.partition("?")[2]
        uri = f"sqlite:///{path.resolve()}{query}"
    return uri


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (``None`` for other URIs and ``:memory:``)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    path = uri[len(prefix) :].split("?", 1)[0]
    if path in ("", ":memory:"):
        return None
    return Path(path)


def _client(tracking_uri: str) -> MlflowClient:
    """An MlflowClient for ``tracking_uri``; a missing SQLite file is an error, not created.

    Raises:
        ValueError: the URI names a SQLite database that does not exist.
    """
    path = _sqlite_path(tracking_uri)
    if path is not None and not path.is_file():
        raise ValueError(
            f"no MLflow store at {path} (tracking URI {tracking_uri!r}): log runs first "
            "(lightning-losses fit ...) or pass --tracking-uri / set MLFLOW_TRACKING_URI"
        )
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _experiment_id(client: MlflowClient, experiment: str) -> str:
    """The id of the experiment named ``experiment``.

    Raises:
        ValueError: no such experiment; the message lists the existing ones.
    """
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    names = sorted(e.name for e in client.search_experiments())
    listing = ", ".join(repr(name) for name in names) or "none"
    raise ValueError(f"no MLflow experiment named {experiment!r}; existing experiments: {listing}")


def _search(client: MlflowClient, experiment_id: str, filter_string: str = "") -> list[Run]:
    """All runs of an experiment matching ``filter_string``, oldest first, across pages."""
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=filter_string,
            max_results=1000,
            order_by=["attributes.start_time ASC"],
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _find_runs(
    client: MlflowClient, experiment: str, experiment_id: str, run_ids: Sequence[str]
) -> list[Run]:
    """The runs of an experiment with the given ids, in the given order, whatever their status.

    Raises:
        ValueError: some ids are not runs of the experiment.
    """
    quoted = ", ".join("'" + run_id.replace("'", "") + "'" for run_id in run_ids)
    runs = _search(client, experiment_id, f"attributes.run_id IN ({quoted})")
    found = {run.info.run_id: run for run in runs}
    missing = [run_id for run_id in run_ids if run_id not in found]
    if missing:
        raise ValueError(f"runs not in experiment {experiment!r}: {', '.join(missing)}")
    return [found[run_id] for run_id in dict.fromkeys(run_ids)]


# --------------------------------------------------------------------------------------------
# Params: flattened config -> nested values -> short text
# --------------------------------------------------------------------------------------------


def _parse(value: str) -> Any:
    """A param string as a Python value where it reads as one (JSON or a literal), else as is."""
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def _listify(node: Any) -> Any:
    """Turn dicts whose keys are ``0..n-1`` (flattened lists) back into lists, recursively."""
    if not isinstance(node, dict):
        return node
    node = {key: _listify(value) for key, value in node.items()}
    if node and all(key.isdigit() for key in node):
        indices = sorted(int(key) for key in node)
        if indices == list(range(len(indices))):
            return [node[str(i)] for i in indices]
    return node


def unflatten(params: Mapping[str, str], prefix: str) -> Any:
    """The nested value under ``prefix`` of dotted, flattened params.

    Args:
        params: MLflow params (``{"a.b.0": "1", ...}``).
        prefix: the dotted key to rebuild, e.g. ``"trainer.callbacks.0"``.

    Returns:
        ``None`` when nothing is logged under ``prefix``; the parsed value when ``prefix`` itself
        is a param; otherwise nested dicts, with integer-keyed levels turned into lists.

    Example:
        >>> unflatten({"c.0.name": "focal", "c.0.gamma": "2.0", "c.1": "ce"}, "c")
        [{'name': 'focal', 'gamma': 2.0}, 'ce']
    """
    if prefix in params:
        return _parse(params[prefix])
    tree: dict[str, Any] = {}
    start = prefix + "."
    for key, value in params.items():
        if not key.startswith(start):
            continue
        *parents, leaf = key[len(start) :].split(".")
        node = tree
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # a leaf and a branch share a key: keep the leaf
                break
            node = child
        else:
            node[leaf] = _parse(value)
    return _listify(tree) if tree else None


def _class_name(class_path: Any) -> str:
    """The class name at the end of a dotted ``class_path``."""
    return str(class_path).rsplit(".", 1)[-1]


def _text(value: Any) -> str:
    """A short rendering of a param value: ``0.5``, ``2``, ``[5, 3]``, ``ce``."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def _kwargs_text(init_args: Any) -> str:
    """``gamma=0.5, threshold=0.2`` from init args; ``None`` values and non-hparams left out."""
    if not isinstance(init_args, dict):
        return ""
    items = sorted((k, v) for k, v in init_args.items() if k not in NON_HPARAMS and v is not None)
    return ", ".join(f"{key}={_text(value)}" for key, value in items)


def _criterion_text(spec: Any) -> str:
    """A criterion spec of LossSwitch: ``ce``, ``FocalLoss(gamma=2)`` or ``focal(gamma=2)``."""
    if isinstance(spec, dict) and "class_path" in spec:
        name, kwargs = _class_name(spec["class_path"]), spec.get("init_args")
    elif isinstance(spec, dict) and "name" in spec:
        name, kwargs = str(spec["name"]), {k: v for k, v in spec.items() if k != "name"}
    else:
        return _text(spec)
    args = _kwargs_text(kwargs)
    return f"{name}({args})" if args else name


def _schedule_text(spec: Any) -> str:
    """A schedule spec: ``CosineSchedule 0->0.2, 2..8``, ``ConstantSchedule =0.5``, ..."""
    if not isinstance(spec, dict) or "class_path" not in spec:
        return _text(spec)
    name = _class_name(spec["class_path"])
    args = spec.get("init_args") if isinstance(spec.get("init_args"), dict) else {}
    if "start_value" in args or "end_value" in args:
        text = f"{name} {_text(args.get('start_value'))}->{_text(args.get('end_value'))}"
        if "start" in args or "end" in args:
            text += f", {_text(args.get('start', 0))}..{_text(args.get('end', 1.0))}"
        return text
    if "value" in args:
        return f"{name} ={_text(args['value'])}"
    if "values" in args:
        return f"{name} {_text(args['values'])} @ {_text(args.get('milestones'))}"
    return f"{name}({_kwargs_text(args)})" if _kwargs_text(args) else name


def _gamma_annealing_text(args: dict[str, Any]) -> str:
    """``GammaAnnealing(gamma 0->1, 0..0.8)`` (class defaults where an argument is absent)."""
    text = f"gamma {_text(args.get('start', 0.0))}->{_text(args.get('end', 1.0))}"
    if "begin" in args or "until" in args:
        text += f", {_text(args.get('begin', 0))}..{_text(args.get('until', 1.0))}"
    if args.get("shape", "linear") != "linear":
        text += f", {args['shape']}"
    return f"GammaAnnealing({text})"


def _loss_scheduler_text(args: dict[str, Any]) -> str:
    """``LossScheduler(threshold: CosineSchedule 0->0.2, 2..8)``."""
    return f"LossScheduler({_text(args.get('attribute'))}: {_schedule_text(args.get('schedule'))})"


def _loss_switch_text(args: dict[str, Any]) -> str:
    """``LossSwitch(ce, FocalLoss(gamma=2)@10)``: each later criterion with its first epoch."""
    criteria = args.get("criteria")
    milestones = args.get("milestones")
    criteria = criteria if isinstance(criteria, list) else [criteria]
    milestones = milestones if isinstance(milestones, list) else [milestones]
    parts = [_criterion_text(criteria[0])]
    for i, spec in enumerate(criteria[1:]):
        epoch = milestones[i] if i < len(milestones) else "?"
        parts.append(f"{_criterion_text(spec)}@{_text(epoch)}")
    return f"LossSwitch({', '.join(parts)})"


def _callback_text(callback: Any) -> str | None:
    """The summary of one callback entry when it is a loss schedule, else ``None``."""
    if not isinstance(callback, dict) or "class_path" not in callback:
        return None
    name = _class_name(callback["class_path"])
    if name not in SCHEDULE_CALLBACKS:
        return None
    args = callback.get("init_args")
    args = args if isinstance(args, dict) else {}
    if name == "GammaAnnealing":
        return _gamma_annealing_text(args)
    if name == "LossScheduler":
        return _loss_scheduler_text(args)
    return _loss_switch_text(args)


def hparams_text(params: Mapping[str, str]) -> str:
    """The key hyper-parameters of a run: the loss's init args, then its schedules.

    Args:
        params: the run's flattened params.

    Returns:
        e.g. ``"gamma=0.5, threshold=0.2"``, or with a schedule callback
        ``"gamma=0; GammaAnnealing(gamma 0->1, 0..0.8)"``; ``""`` when there is nothing to say.

    Example:
        >>> hparams_text({
        ...     "model.criterion.init_args.gamma": "0.5",
        ...     "model.criterion.init_args.reduction": "mean",
        ...     "trainer.callbacks.0.class_path": "lightning_losses.callbacks.LossScheduler",
        ...     "trainer.callbacks.0.init_args.attribute": "threshold",
        ...     "trainer.callbacks.0.init_args.schedule.class_path": "x.LinearSchedule",
        ...     "trainer.callbacks.0.init_args.schedule.init_args.start_value": "0.0",
        ...     "trainer.callbacks.0.init_args.schedule.init_args.end_value": "0.2",
        ... })
        'gamma=0.5; LossScheduler(threshold: LinearSchedule 0->0.2)'
    """
    parts = [_kwargs_text(unflatten(params, "model.criterion.init_args"))]
    callbacks = unflatten(params, "trainer.callbacks")
    if isinstance(callbacks, dict):  # a single callback, or indices with gaps
        callbacks = [callbacks] if "class_path" in callbacks else list(callbacks.values())
    for callback in callbacks if isinstance(callbacks, list) else []:
        parts.append(_callback_text(callback) or "")
    return "; ".join(part for part in parts if part)


# --------------------------------------------------------------------------------------------
# Runs -> rows
# --------------------------------------------------------------------------------------------


def _loss_name(tags: Mapping[str, str], params: Mapping[str, str]) -> str | None:
    """The ``loss`` tag, else the class at the end of ``model.criterion.class_path``."""
    if tags.get("loss"):
        return tags["loss"]
    if params.get("model.criterion.class_path"):
        return _class_name(params["model.criterion.class_path"])
    return params.get("model.criterion") or None


def _dataset_name(tags: Mapping[str, str], params: Mapping[str, str]) -> str | None:
    """The ``dataset`` tag, else the class at the end of ``data.class_path``."""
    if tags.get("dataset"):
        return tags["dataset"]
    if params.get("data.class_path"):
        return _class_name(params["data.class_path"])
    return None


def _final_metrics(metrics: Mapping[str, float]) -> dict[str, float | None]:
    """The last value (at the highest step) of each of :data:`METRICS`; ``None`` if missing."""
    row: dict[str, float | None] = {}
    for name, keys in METRICS.items():
        row[name] = next((float(metrics[key]) for key in keys if key in metrics), None)
    return row


def _epochs(metrics: Mapping[str, float], params: Mapping[str, str]) -> int | None:
    """Epochs run: last value of the ``epoch`` metric + 1, else param ``trainer.max_epochs``."""
    if "epoch" in metrics:
        return round(metrics["epoch"]) + 1
    value = _parse(params.get("trainer.max_epochs", ""))
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


def _wall_time(start_ms: int | None, end_ms: int | None) -> float | None:
    """Seconds from start to end; a run without an end (still running) counts up to now."""
    if start_ms is None:
        return None
    end_ms = end_ms if end_ms else time.time() * 1000.0
    return max(0.0, (end_ms - start_ms) / 1000.0)


def run_row(run: Run, metrics: Mapping[str, float] | None = None) -> dict[str, Any]:
    """One comparison row (keys :data:`COLUMNS`) for an MLflow run.

    Args:
        run: a run from ``MlflowClient.search_runs`` or ``get_run``.
        metrics: the final value of each metric (:func:`lightning_losses.tracking.final_metrics`,
            which applies the run's resume markers); default ``run.data.metrics``, MLflow's
            value at the highest step.

    Returns:
        The row: run id, name and status, loss, hparams text, dataset, config, final metrics,
        epochs and wall time in seconds.
    """
    tags, params = run.data.tags, run.data.params
    metrics = run.data.metrics if metrics is None else metrics
    return {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "status": run.info.status,
        "loss": _loss_name(tags, params),
        "hparams": hparams_text(params),
        "dataset": _dataset_name(tags, params),
        "config": tags.get("config"),
        **_final_metrics(metrics),
        "epochs": _epochs(metrics, params),
        "wall_time_s": _wall_time(run.info.start_time, run.info.end_time),
    }


def collect_runs(
    experiment: str,
    *,
    tracking_uri: str | None = None,
    run_ids: list[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per finished or running run of an MLflow experiment.

    Final metrics are read from each run's one-value-per-step history
    (:func:`lightning_losses.tracking.final_metrics`): a run resumed from an earlier
    checkpoint shows what its resumed fit logged last, not the abandoned attempt's values.

    Args:
        experiment: the experiment's name.
        tracking_uri: where the runs are; ``None``: ``MLFLOW_TRACKING_URI`` or
            ``sqlite:///mlflow.db`` in the working directory.
        run_ids: only these runs, in this order and whatever their status (default: every
            finished or running run, oldest first).

    Returns:
        Rows with the keys :data:`COLUMNS` (see :func:`run_row`); missing values are ``None``.

    Raises:
        ValueError: the experiment does not exist (the message lists those that do), a run id
            is not in it, or the SQLite store does not exist.
    """
    client = _client(resolve_tracking_uri(tracking_uri))
    experiment_id = _experiment_id(client, experiment)
    if run_ids:
        runs = _find_runs(client, experiment, experiment_id, run_ids)
    else:
        runs = [r for r in _search(client, experiment_id) if r.info.status in LISTED_STATUSES]
    from .tracking import final_metrics

    return [run_row(run, final_metrics(client, run)) for run in runs]


# --------------------------------------------------------------------------------------------
# Presentation: sorting, table, CSV
# --------------------------------------------------------------------------------------------


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
        A header line, a rule and one line per run; missing values are shown as ``-``.

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
    header = [title for _, title, _ in TABLE_COLUMNS]
    body = [[_cell(row.get(key), fmt) for key, _, fmt in TABLE_COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        aligned = [
            cell.rjust(width) if key in NUMERIC_COLUMNS else cell.ljust(width)
            for (key, _, _), cell, width in zip(TABLE_COLUMNS, cells, widths, strict=True)
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


# --------------------------------------------------------------------------------------------
# Figure
# --------------------------------------------------------------------------------------------


def _label(row: Mapping[str, Any], limit: int = 40) -> str:
    """A point label: the loss and its short hyper-parameters."""
    loss = row.get("loss") or row.get("run_name") or str(row.get("run_id", ""))[:8]
    hparams = row.get("hparams") or ""
    label = f"{loss} ({hparams})" if hparams else str(loss)
    return label if len(label) <= limit else label[: limit - 3] + "..."


def _latest_diagram(client: MlflowClient, run_id: str) -> str | None:
    """The artifact path of the run's reliability diagram with the highest epoch, if any."""
    best: tuple[int, str] | None = None
    for info in client.list_artifacts(run_id, DIAGRAM_DIR):
        match = DIAGRAM_PATTERN.search(info.path)
        if not info.is_dir and match and (best is None or int(match.group(1)) > best[0]):
            best = (int(match.group(1)), info.path)
    return None if best is None else best[1]


@contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the duration of a block (unless the user set it)."""
    previous = os.environ.get(name)
    os.environ.setdefault(name, value)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)


def _fetch_diagrams(
    rows: Sequence[Mapping[str, Any]], tracking_uri: str, limit: int, folder: str
) -> list[tuple[Mapping[str, Any], Path]]:
    """Download the latest diagram of the first ``limit`` rows that have one into ``folder``.

    Runs without a diagram are skipped; a diagram that cannot be read is skipped with a warning.
    """
    if limit <= 0:
        return []
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    found: list[tuple[Mapping[str, Any], Path]] = []
    for i, row in enumerate(rows):
        run_id = row.get("run_id")
        try:
            artifact = _latest_diagram(client, run_id) if run_id else None
            if artifact is None:
                continue
            local = mlflow.artifacts.download_artifacts(
                run_id=run_id,
                artifact_path=artifact,
                dst_path=os.path.join(folder, str(i)),
                tracking_uri=tracking_uri,
            )
        except (OSError, MlflowException) as error:
            warnings.warn(f"skipping the diagram of run {run_id}: {error}", stacklevel=2)
            continue
        found.append((row, Path(local)))
        if len(found) == limit:
            break
    return found


def _draw_scatter(ax: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """Accuracy (x) against ECE (y), one labelled point per run that has both."""
    points = [r for r in rows if r.get("val/acc") is not None and r.get("val/ece") is not None]
    for i, row in enumerate(points):
        ax.scatter(row["val/acc"], row["val/ece"], color=f"C{i % 10}", s=36, zorder=3)
    # Neighbours along x get different label offsets, so that close points stay readable.
    by_x = sorted(points, key=lambda row: (row["val/acc"], row["val/ece"]))
    for i, row in enumerate(by_x):
        ax.annotate(
            _label(row),
            (row["val/acc"], row["val/ece"]),
            xytext=LABEL_OFFSETS[i % len(LABEL_OFFSETS)],
            textcoords="offset points",
            fontsize=7,
            arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5},
        )
    if not points:
        ax.text(0.5, 0.5, "no run has val/acc and val/ece", ha="center", transform=ax.transAxes)
    ax.set_xlabel("validation accuracy")
    ax.set_ylabel("validation ECE")
    ax.set_title("accuracy vs calibration (lower ECE is better)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.margins(0.15)


def _draw_diagram(ax: Any, row: Mapping[str, Any], image_path: Path) -> None:
    """One reliability-diagram image, titled with the run's name and label."""
    from matplotlib.image import imread

    ax.imshow(imread(image_path))
    ax.set_title(f"{row.get('run_name') or ''}\n{_label(row)}", fontsize=8)
    ax.set_axis_off()


def comparison_figure(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    tracking_uri: str | None = None,
    diagrams: int = 4,
) -> Path:
    """Save one PNG comparing the runs: accuracy against ECE, and their reliability diagrams.

    The left panel plots each run's validation accuracy (x) against its ECE (y), labelled with
    its loss and hyper-parameters. To its right, side by side, come the latest reliability
    diagrams (``calibration/val_epoch=NNN.png`` with the highest epoch) of the first
    ``diagrams`` runs in ``rows`` that logged one. The PNG is
    ``(SCATTER_WIDTH + n * DIAGRAM_WIDTH) * DPI`` by ``FIGURE_HEIGHT * DPI`` pixels for ``n``
    diagrams shown.

    Args:
        rows: comparison rows, in the order of preference for the diagrams.
        path: the PNG to write; its folder is created.
        tracking_uri: where the runs' artifacts are (``None``: as in :func:`collect_runs`).
        diagrams: at most this many diagrams (``0``: the scatter panel only).

    Returns:
        The path written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = list(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="lightning-losses-compare-") as folder,
        _environ(PROGRESS_BAR_VARIABLE, "false"),
    ):
        tiles = _fetch_diagrams(rows, resolve_tracking_uri(tracking_uri), diagrams, folder)
        width = SCATTER_WIDTH + DIAGRAM_WIDTH * len(tiles)
        fig = Figure(figsize=(width, FIGURE_HEIGHT), dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        grid = fig.add_gridspec(
            1, 1 + len(tiles), width_ratios=[SCATTER_WIDTH] + [DIAGRAM_WIDTH] * len(tiles)
        )
        _draw_scatter(fig.add_subplot(grid[0, 0]), rows)
        for i, (row, image) in enumerate(tiles):
            _draw_diagram(fig.add_subplot(grid[0, i + 1]), row, image)
        fig.savefig(path, dpi=DPI)
    return path


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    """The argument parser of ``lightning-losses compare``."""
    parser = argparse.ArgumentParser(
        prog="lightning-losses compare",
        description="Compare the MLflow runs of an experiment: a table, a CSV and a figure.",
    )
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="experiment name")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help=f"MLflow tracking URI (default: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI})",
    )
    parser.add_argument("--sort-by", default="val/ece", help="column to sort by (val/ece)")
    parser.add_argument("--descending", action="store_true", help="sort largest first")
    parser.add_argument("--out", default="comparison", help="output folder (comparison)")
    parser.add_argument(
        "--diagrams", type=int, default=4, help="reliability diagrams in the figure (4)"
    )
    parser.add_argument("--runs", nargs="+", metavar="ID", help="only these run ids")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``lightning-losses compare``: print the comparison table, write CSV and figure.

    Args:
        argv: the arguments after ``compare`` (default: ``sys.argv[1:]``).

    Returns:
        0 on success; 1 when there is no run to compare; 2 on an error (unknown experiment,
        run or column, missing store), with the message on stderr.
    """
    args = _parser().parse_args(argv)
    from mlflow.exceptions import MlflowException

    uri = resolve_tracking_uri(args.tracking_uri)
    try:
        rows = collect_runs(args.experiment, tracking_uri=uri, run_ids=args.runs)
        if not rows:
            print(f"no finished or running runs in experiment {args.experiment!r}", file=sys.stderr)
            return 1
        rows = sort_rows(rows, args.sort_by, args.descending)
        table = format_table(rows, args.sort_by, args.descending)
        out = Path(args.out)
        csv_path = write_csv(rows, out / "comparison.csv")
        png_path = comparison_figure(
            rows, out / "comparison.png", tracking_uri=uri, diagrams=args.diagrams
        )
    except (ValueError, OSError, MlflowException) as error:
        print(f"lightning-losses compare: error: {error}", file=sys.stderr)
        return 2
    print(table)
    print(f"\nwrote {csv_path}\nwrote {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
