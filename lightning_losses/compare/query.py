"""The runs of an MLflow experiment as rows: the store, the experiment, the runs, one row each.

Each run logged by the package's MLflow logger carries the tags ``loss``, ``dataset`` and
``config``, the resolved config flattened into dotted params and metric histories
(``val/acc``, ``val/ece``, ...). :func:`collect_runs` turns every finished or running run (or
every run of the statuses asked for, :func:`select_runs`) into one flat row (:func:`run_row`):
its loss, its key hyper-parameters
(:func:`~lightning_losses.compare.describe.hparams_text`), its dataset, the final value of each
of :data:`METRICS` (read from the run's one-value-per-step history, so that a resumed run shows
what its resumed fit logged), the number of epochs, the start time and the fit's wall time.

The wall time is the fit's own (:func:`fit_seconds`): a later ``test`` or ``validate`` of the
run's checkpoint logs into the same run and moves the run's end, so the run's end minus its
start would count it. The fit's end is read from the timestamps of the metrics that only a fit
logs (:data:`FIT_METRICS`: ``time/epoch_seconds``, logged at the end of every training epoch,
else the ``train/`` metrics).

Imports only the standard library; mlflow is imported inside the functions that use it.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_losses.compare.alike import TASK_PARAM, matches
from lightning_losses.compare.describe import hparams_text
from lightning_losses.compare.params import class_name, parse_param

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

__all__ = [
    "COLUMNS",
    "CONFORMAL_MARGINS",
    "CONFORMAL_METRIC",
    "DEFAULT_TRACKING_URI",
    "FIT_METRICS",
    "LISTED_STATUSES",
    "METRICS",
    "OPTIONAL_METRICS",
    "RUN_STATUSES",
    "collect_runs",
    "conformal_keys",
    "conformal_metrics",
    "coverage_target",
    "fit_seconds",
    "mlflow_client",
    "resolve_tracking_uri",
    "run_fields",
    "run_fields_of",
    "run_row",
    "run_statuses",
    "select_runs",
]

#: Tracking URI used when neither the argument nor ``MLFLOW_TRACKING_URI`` gives one.
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
#: The metrics of a row, each with the MLflow metric keys it is read from (first one present).
#: One name per quantity, the module's first (``ClassifierModule`` logs ``val/acc`` and
#: ``val/nll``, ``CalibrationMonitor`` ``val/ece``, ``val/brier`` and, with ``smooth=True``,
#: ``val/smooth_ece``); ``val/accuracy``, the
#: same quantity under the monitor's name as older stores hold it, is read only where
#: ``val/acc`` is missing. ``val/posthoc_nll`` and ``val/posthoc_ece`` are the calibrated
#: values ``PostHocCalibration`` logs beside the raw ones.
METRICS: dict[str, tuple[str, ...]] = {
    "val/acc": ("val/acc", "val/accuracy"),
    "val/nll": ("val/nll",),
    "val/ece": ("val/ece",),
    "val/brier": ("val/brier",),
    "val/smooth_ece": ("val/smooth_ece",),
    "val/posthoc_nll": ("val/posthoc_nll",),
    "val/posthoc_ece": ("val/posthoc_ece",),
}
#: Metrics logged only on request (``CalibrationMonitor(smooth=True)``, ``PostHocCalibration``):
#: the text table shows their column only when some run has a value.
OPTIONAL_METRICS: tuple[str, ...] = ("val/smooth_ece", "val/posthoc_nll", "val/posthoc_ece")
#: The prediction-set metrics ``ConformalPrediction`` logs at ``test`` that are compared:
#: ``test/conformal_<method>_<alpha>_size`` (the mean set size: smaller is better, the coverage
#: being guaranteed) and ``..._coverage`` (shown with its interval, without a verdict: it should
#: sit at ``1 - alpha``, neither side of it better).
CONFORMAL_METRIC = re.compile(
    r"test/conformal_(?P<method>[a-z_]+?)_(?P<alpha>[0-9][0-9.e+-]*)_(?P<measure>coverage|size)"
)
#: Equivalence margins of the prediction-set metrics, by measure: a tenth of a label of mean set
#: size, two points of coverage.
CONFORMAL_MARGINS = {"size": 0.1, "coverage": 0.02}


def coverage_target(metric: str) -> float | None:
    """``1 - alpha`` for a conformal coverage metric, ``None`` for any other metric.

    Example:
        >>> coverage_target("test/conformal_aps_0.1_coverage")
        0.9
        >>> coverage_target("test/conformal_aps_0.1_size") is None
        True
    """
    found = CONFORMAL_METRIC.fullmatch(metric)
    if found is None or found["measure"] != "coverage":
        return None
    return round(1.0 - float(found["alpha"]), 12)


def conformal_keys(keys: Iterable[str]) -> list[str]:
    """The prediction-set metric keys among ``keys`` (:data:`CONFORMAL_METRIC`), in order.

    Ordered by score, level, then coverage before size.

    Example:
        >>> conformal_keys(
        ...     ["val/acc", "test/conformal_lac_0.1_size", "test/conformal_aps_0.1_size"]
        ... )
        ['test/conformal_aps_0.1_size', 'test/conformal_lac_0.1_size']
    """
    found = [CONFORMAL_METRIC.fullmatch(key) for key in keys]
    order = lambda m: (m["method"], float(m["alpha"]), m["measure"])  # noqa: E731
    return [m[0] for m in sorted(filter(None, found), key=order)]


def conformal_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The prediction-set metrics among ``metrics``, in :func:`conformal_keys`' order.

    Example:
        >>> conformal_metrics({"val/acc": 0.9, "test/conformal_lac_0.1_size": 1.2,
        ...                    "test/conformal_lac_0.1_coverage": 0.91})
        {'test/conformal_lac_0.1_coverage': 0.91, 'test/conformal_lac_0.1_size': 1.2}
    """
    return {key: float(metrics[key]) for key in conformal_keys(metrics)}


#: The keys of a row, in CSV column order.
COLUMNS: tuple[str, ...] = (
    "run_id",
    "run_name",
    "status",
    "start_time",
    "loss",
    "hparams",
    "dataset",
    "task",
    "config",
    *METRICS,
    "epochs",
    "wall_time_s",
)
#: Metrics only a fit logs, whose timestamps tell when it ended: ``time/epoch_seconds``
#: (``ClassifierModule``, at the end of every training epoch); runs without it are read from
#: their metrics under :data:`FIT_PREFIX` (logged by training steps and epochs only).
FIT_METRICS: tuple[str, ...] = ("time/epoch_seconds",)
FIT_PREFIX = "train/"
#: Run statuses listed when no run ids and no statuses are given.
LISTED_STATUSES = ("FINISHED", "RUNNING")
#: The statuses a listing can ask for (MLflow's), and ``any`` for every run.
RUN_STATUSES = ("FINISHED", "RUNNING", "KILLED", "FAILED", "SCHEDULED")
ANY_STATUS = "any"


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


def mlflow_client(tracking_uri: str) -> MlflowClient:
    """An MlflowClient for ``tracking_uri``; a missing SQLite file is an error, not created.

    Args:
        tracking_uri: a resolved tracking URI (:func:`resolve_tracking_uri`).

    Returns:
        A client of that store.

    Raises:
        ValueError: the URI names a SQLite database that does not exist, or a folder or file
            (a path, or ``file:``): no store the package writes; the message says how to
            point at the SQLite store.
    """
    _refuse_a_path(tracking_uri)
    path = _sqlite_path(tracking_uri)
    if path is not None and not path.is_file():
        raise ValueError(
            f"no MLflow store at {path} (tracking URI {tracking_uri!r}): log runs first "
            "(lightning-losses fit ...) or pass --tracking-uri / set MLFLOW_TRACKING_URI"
        )
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _refuse_a_path(tracking_uri: str) -> None:
    """Refuse a tracking URI that is a path or a ``file:`` URI, with how to name the store.

    Raises:
        ValueError: for such a URI; where the folder holds ``mlflow.db`` (or the path is a
            ``.db`` file), the message gives the ``sqlite:///`` URI to pass.

    Example:
        >>> _refuse_a_path("sqlite:////tmp/mlflow.db")  # a store URI: nothing to say
    """
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    parsed = urlparse(tracking_uri)
    if parsed.scheme not in ("", "file") and len(parsed.scheme) > 1:  # "C:" is a drive
        return
    text = url2pathname(parsed.path) if parsed.scheme == "file" else tracking_uri
    path = Path(text).expanduser().resolve()
    database = path if path.suffix == ".db" else path / "mlflow.db"
    if database.is_file():
        hint = f"the store there is --tracking-uri sqlite:///{database}"
    else:
        hint = (
            "pass the SQLite file the fits logged to, e.g. --tracking-uri "
            f"sqlite:///{path / 'mlflow.db'} (fit's default: sqlite:///mlflow.db in the folder "
            "it ran in), or a server's http:// URI"
        )
    raise ValueError(f"no MLflow store here: {tracking_uri!r} is a path, not a store URI; {hint}")


def run_fields(
    params: Mapping[str, str],
    tags: Mapping[str, str],
    run_name: str | None = None,
    status: str | None = None,
) -> dict[str, str]:
    """A run's params and tags in one mapping, with its name, status and loss (for ``--where``).

    Example:
        >>> run_fields({"model.criterion.class_path": "x.FocalLoss"}, {"config": "f"}, "r")
        {'config': 'f', 'model.criterion.class_path': 'x.FocalLoss', 'run_name': 'r', 'loss': 'FocalLoss'}
    """  # noqa: E501
    fields = {**tags, **params}
    if run_name:
        fields["run_name"] = run_name
    if status:
        fields["status"] = status
    loss = _loss_name(tags, params)
    if loss:
        fields["loss"] = loss
    return fields


def run_fields_of(run: Run) -> dict[str, str]:
    """:func:`run_fields` of an MLflow run."""
    return run_fields(run.data.params, run.data.tags, run.info.run_name, run.info.status)


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


def run_statuses(status: str | Sequence[str] | None = None) -> frozenset[str] | None:
    """The run statuses a listing keeps; ``None``: every run.

    Args:
        status: a status (``FINISHED``, ``RUNNING``, ``KILLED``, ``FAILED``, ``SCHEDULED``, in any
            case), several, or ``any``; ``None``: :data:`LISTED_STATUSES`.

    Raises:
        ValueError: an unknown status; the message lists the known ones.

    Example:
        >>> sorted(run_statuses())
        ['FINISHED', 'RUNNING']
        >>> sorted(run_statuses(["killed", "FAILED"])), run_statuses("any")
        (['FAILED', 'KILLED'], None)
    """
    if status is None:
        return frozenset(LISTED_STATUSES)
    names = [status] if isinstance(status, str) else list(status)
    if any(name.lower() == ANY_STATUS for name in names):
        return None
    unknown = [name for name in names if name.upper() not in RUN_STATUSES]
    if unknown or not names:
        known = ", ".join((*RUN_STATUSES, ANY_STATUS))
        raise ValueError(f"--status {' '.join(unknown)}: not a run status; choose from {known}")
    return frozenset(name.upper() for name in names)


def select_runs(
    client: MlflowClient,
    experiment_id: str,
    status: str | Sequence[str] | None = None,
    skipped: dict[str, int] | None = None,
) -> list[Run]:
    """The runs of an experiment whose status is among ``status``, oldest first.

    Args:
        client: the store's client.
        experiment_id: the experiment.
        status: as for :func:`run_statuses` (default: finished and running runs).
        skipped: if given, filled with the number of runs left out, by status.

    Raises:
        ValueError: an unknown status.
    """
    keep = run_statuses(status)
    runs = []
    for run in _search(client, experiment_id):
        if keep is None or run.info.status in keep:
            runs.append(run)
        elif skipped is not None:
            skipped[run.info.status] = skipped.get(run.info.status, 0) + 1
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


def _loss_name(tags: Mapping[str, str], params: Mapping[str, str]) -> str | None:
    """The ``loss`` tag, else the class at the end of ``model.criterion.class_path``."""
    if tags.get("loss"):
        return tags["loss"]
    if params.get("model.criterion.class_path"):
        return class_name(params["model.criterion.class_path"])
    return params.get("model.criterion") or None


def _dataset_name(tags: Mapping[str, str], params: Mapping[str, str]) -> str | None:
    """The ``dataset`` tag, else the class at the end of ``data.class_path``."""
    if tags.get("dataset"):
        return tags["dataset"]
    if params.get("data.class_path"):
        return class_name(params["data.class_path"])
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
    value = parse_param(params.get("trainer.max_epochs", ""))
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


def _wall_time(start_ms: int | None, end_ms: int | None) -> float | None:
    """Seconds from start to end; a run without an end (still running) counts up to now."""
    if start_ms is None:
        return None
    end = float(end_ms) if end_ms else time.time() * 1000.0
    return max(0.0, (end - start_ms) / 1000.0)


def _start_text(start_ms: int | None) -> str | None:
    """A run's start as local time, ``YYYY-MM-DD HH:MM:SS`` (``None`` when unknown)."""
    if not start_ms:
        return None
    return datetime.fromtimestamp(start_ms / 1000.0).isoformat(sep=" ", timespec="seconds")


def fit_seconds(timestamps: Sequence[int], starts: Sequence[int]) -> float | None:
    """The wall time of a fit, from the timestamps of the metrics only a fit logs.

    A fit may run in several attempts (a fit resumed into the same run from a checkpoint):
    each attempt lasts from its start to the last fit metric logged before the next attempt
    started. Metrics logged by a later ``test`` or ``validate`` are not among ``timestamps``, so
    they do not count, nor do the pauses between attempts.

    Args:
        timestamps: milliseconds since the epoch at which the fit logged its epoch-end metrics
            (:data:`FIT_METRICS`).
        starts: when each attempt started, in milliseconds: the run's start, then the time of
            each resume marker, ascending.

    Returns:
        The sum over attempts of (last timestamp in the attempt - its start) in seconds;
        ``None`` when no timestamp falls in any attempt.

    Example:
        >>> fit_seconds([1_500, 3_000], starts=[1_000])  # fit from 1.0 s to 3.0 s
        2.0
        >>> fit_seconds([1_500, 3_000, 9_000, 9_500], starts=[1_000, 8_000])  # resumed at 8 s
        3.5
    """
    total, found = 0.0, False
    bounds = [*starts, math.inf]
    for begin, end in itertools.pairwise(bounds):
        inside = [stamp for stamp in timestamps if begin <= stamp < end]
        if inside:
            total += max(inside) - begin
            found = True
    return total / 1000.0 if found else None


def _fit_wall_time(client: MlflowClient, run: Run) -> float | None:
    """:func:`fit_seconds` of a run (``None``: it logged no fit metric, or has no start)."""
    from lightning_losses.tracking import resume_markers

    if run.info.start_time is None:
        return None
    logged = run.data.metrics
    keys = [key for key in FIT_METRICS if key in logged]
    keys = keys or sorted(key for key in logged if key.startswith(FIT_PREFIX))
    stamps = [
        metric.timestamp
        for key in keys
        for metric in client.get_metric_history(run.info.run_id, key)
    ]
    starts = [run.info.start_time, *(r.time_ms for r in resume_markers(run.data.tags))]
    return fit_seconds(stamps, sorted(starts))


def run_row(
    run: Run, metrics: Mapping[str, float] | None = None, *, wall_time_s: float | None = None
) -> dict[str, Any]:
    """One comparison row (keys :data:`COLUMNS`) for an MLflow run.

    Args:
        run: a run from ``MlflowClient.search_runs`` or ``get_run``.
        metrics: the final value of each metric (:func:`lightning_losses.tracking.final_metrics`,
            which applies the run's resume markers); default ``run.data.metrics``, MLflow's
            value at the highest step.
        wall_time_s: the fit's wall time (:func:`fit_seconds`); default: the run's end minus
            its start (up to now while it runs).

    Returns:
        The row: run id, name and status, start time (local, ``YYYY-MM-DD HH:MM:SS``), loss,
        hparams text, dataset, config, final metrics, epochs and wall time in seconds.
    """
    tags, params = run.data.tags, run.data.params
    metrics = run.data.metrics if metrics is None else metrics
    if wall_time_s is None:
        wall_time_s = _wall_time(run.info.start_time, run.info.end_time)
    return {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "status": run.info.status,
        "start_time": _start_text(run.info.start_time),
        "loss": _loss_name(tags, params),
        "hparams": hparams_text(params),
        "dataset": _dataset_name(tags, params),
        "task": params.get(TASK_PARAM),
        "config": tags.get("config"),
        **_final_metrics(metrics),
        "epochs": _epochs(metrics, params),
        "wall_time_s": wall_time_s,
        **conformal_metrics(metrics),  # after the columns: the CSV's last ones
    }


def collect_runs(
    experiment: str,
    *,
    tracking_uri: str | None = None,
    run_ids: list[str] | None = None,
    status: str | Sequence[str] | None = None,
    skipped: dict[str, int] | None = None,
    where: Sequence[tuple[str, str]] = (),
    configs: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per finished or running run (or per run of ``status``) of an MLflow experiment.

    Final metrics are read from each run's one-value-per-step history
    (:func:`lightning_losses.tracking.final_metrics`): a run resumed from an earlier
    checkpoint shows what its resumed fit logged last, not the abandoned attempt's values.
    The wall time is the fit's (:func:`fit_seconds` of the timestamps of :data:`FIT_METRICS`,
    else of the ``train/`` metrics), so a ``test`` or ``validate`` logged into the run later
    does not count; a run with neither counts from its start to its end (or to now).

    Args:
        experiment: the experiment's name.
        tracking_uri: where the runs are; ``None``: ``MLFLOW_TRACKING_URI`` or
            ``sqlite:///mlflow.db`` in the working directory.
        run_ids: only these runs, in this order and whatever their status (default: every
            run of ``status``, oldest first).
        status: the statuses listed without ``run_ids`` (:func:`run_statuses`: ``FINISHED``,
            ``RUNNING``, ``KILLED``, ``FAILED``, several, or ``any``); default finished and
            running runs.
        skipped: if given, filled with the number of runs left out for their status, by
            status (e.g. ``{"FAILED": 2}``).
        where: ``--where`` (key, value) pairs on the runs' params and tags
            (:func:`~lightning_losses.compare.alike.matches`).
        configs: ``--config`` names: only the runs fitted from these configs.

    Returns:
        Rows with the keys :data:`COLUMNS` (see :func:`run_row`); missing values are ``None``.

    Raises:
        ValueError: the experiment does not exist (the message lists those that do), a run id
            is not in it, a status is unknown, or the SQLite store does not exist.
    """
    run_statuses(status)  # an unknown status fails before the store is opened
    client = mlflow_client(resolve_tracking_uri(tracking_uri))
    experiment_id = _experiment_id(client, experiment)
    if run_ids:
        runs = _find_runs(client, experiment, experiment_id, run_ids)
    else:
        runs = select_runs(client, experiment_id, status, skipped)
    runs = matches(runs, run_fields_of, where=where, configs=configs)
    from lightning_losses.tracking import final_metrics

    return [
        run_row(run, final_metrics(client, run), wall_time_s=_fit_wall_time(client, run))
        for run in runs
    ]
