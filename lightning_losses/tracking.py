"""MLflow tracking: the CLI's default logger, a crash-safe spool, its replay, and history readers.

- :class:`TrackingLogger` is Lightning's ``MLFlowLogger`` with the project's defaults (a local
  SQLite store, ``sqlite:///mlflow.db``, unless ``tracking_uri`` or ``MLFLOW_TRACKING_URI`` says
  otherwise), a start-up check that fails within seconds when an HTTP server cannot be reached,
  run-local folders for checkpoints and diagrams, and a spool: whatever cannot be sent while
  the server is down (metrics with their steps, params, tags, artifacts, the run's end) is
  appended to ``tracking-spool.jsonl`` beside the run's checkpoints, training goes on, and a
  warning says where the spool is. Each spool line is one JSON record ended by a newline,
  flushed and fsynced; a (metric, step) is spooled at most once.
- Resume: ``fit --ckpt_path`` continues the checkpoint's run (the CLI passes ``run_id`` and
  ``resume_step``). The logger records a *resume marker*, the tag ``resume.<k>`` (``k`` = 1,
  2, ...) holding ``{"step": s, "time_ms": t, "previous_status": ...}``: ``s`` is the
  checkpoint's global step, ``t`` the time the resumed fit started. MLflow keeps every logged
  value, so the abandoned attempt's values at steps ``>= s`` (logged before ``t``) stay in
  the raw history beside the resumed fit's; :func:`metric_history` and :func:`final_metrics`
  drop them and give one value per step (``compare`` and ``reproduce`` read runs this way).
- :func:`sync_tracking` (``lightning-losses sync-tracking PATH``) replays a spool into the
  server once it is back: every valid line, without writing a (metric, step) twice; damaged
  lines are named by number and kept; a run left ``RUNNING`` by a killed process is marked
  ``KILLED``.
- :class:`TrackingConfigCallback` (the CLI's ``SaveConfigCallback``) logs the resolved config as
  an artifact and as flattened params, tags each run (loss, dataset, config), and writes the
  run id and tracking URI into every checkpoint so that ``fit --ckpt_path`` continues the
  same run in the same store.

Only rank 0 talks to MLflow (Lightning's ``rank_zero_only``): one run per fit under DDP.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

if TYPE_CHECKING:
    from mlflow.entities import Metric, Run
    from mlflow.tracking import MlflowClient

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "lightning-losses"
#: Default root of the local run folders (``<save_dir>/<experiment id>/<run id>/``).
DEFAULT_SAVE_DIR = "mlflow_runs"
SPOOL_NAME = "tracking-spool.jsonl"
#: Suffix of the journal of replayed spool lines (``tracking-spool.jsonl.synced``).
SYNCED_SUFFIX = ".synced"
CHECKPOINT_KEY = "tracking"
#: Prefix of the resume-marker tags: ``resume.1``, ``resume.2``, ... (JSON of :class:`Resume`).
RESUME_TAG = "resume."
#: Tags naming the host and process that log a run (to tell a killed run from a live one).
HOST_TAG = "tracking.host"
PID_TAG = "tracking.pid"
#: The kinds of spool records.
SPOOL_KINDS = ("metrics", "params", "tags", "artifact", "terminate")


def now_ms() -> int:
    """Milliseconds since the epoch: the clock of MLflow metric timestamps and resume markers."""
    return int(time.time() * 1000)


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``.

    A relative SQLite path is made absolute (MLflow caches stores by URI, so a relative one
    would follow the first working directory, not the current one).

    Example:
        >>> resolve_tracking_uri("http://127.0.0.1:5000")
        'http://127.0.0.1:5000'
    """
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        uri = prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


def fail_fast_http() -> None:
    """Make MLflow's HTTP client give up in seconds, not minutes (unless the user chose).

    MLflow retries a failed request with back-off for minutes by default; with a spool behind
    it there is nothing to gain from waiting. Variables already set are left alone.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def check_reachable(tracking_uri: str, timeout: float = 5.0) -> None:
    """Raise ``ConnectionError`` naming the URI if an HTTP tracking server does not answer.

    Local stores (``sqlite:``, ``file:``, paths) need no check.
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return
    url = tracking_uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if response.status >= 500:
                raise OSError(f"HTTP {response.status}")
    except (OSError, urllib.error.URLError) as error:
        raise ConnectionError(
            f"the MLflow tracking server at {tracking_uri} cannot be reached ({error}). Start "
            "it, or choose another store with trainer.logger.init_args.tracking_uri or "
            f"MLFLOW_TRACKING_URI (the default is the local {DEFAULT_TRACKING_URI})."
        ) from None


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI; ``None`` for other stores.

    Example:
        >>> sqlite_file("sqlite:////tmp/runs/mlflow.db").as_posix()
        '/tmp/runs/mlflow.db'
        >>> sqlite_file("http://127.0.0.1:5000") is None
        True
    """
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix) or ":memory:" in tracking_uri:
        return None
    return Path(tracking_uri[len(prefix) :].split("?", 1)[0])


@contextmanager
def store_lock(tracking_uri: str) -> Iterator[None]:
    """Hold an exclusive lock on a SQLite store's folder while the block runs.

    Two fits started at once on one new ``mlflow.db`` would both create its tables (and its
    experiment): MLflow's schema migration is not safe against a concurrent one and one of
    them fails. Creating the store, the experiment and the run under this lock makes them
    take turns; the lock is a ``flock`` on the database's folder (no lock file is left
    behind), released when the block ends. Other stores (a server, ``file:``), a folder that
    does not exist and non-POSIX systems get no lock.
    """
    database = sqlite_file(tracking_uri)
    folder = database.parent if database is not None else None
    if folder is None or not folder.is_dir():
        yield
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the flock


def flatten(
    config: Mapping[str, Any], prefix: str = "", *, drop_none: bool = False
) -> dict[str, str]:
    """Flatten nested mappings and lists to dotted keys with string values.

    Args:
        config: nested mappings and lists.
        prefix: put before every key.
        drop_none: leave out the keys whose value is ``None`` (an unset option says nothing a
            missing param does not; MLflow params are for values).

    Example:
        >>> flatten({"model": {"criterion": {"init_args": {"gamma": 2.0}}}, "xs": [1, {"a": 2}]})
        {'model.criterion.init_args.gamma': '2.0', 'xs.0': '1', 'xs.1.a': '2'}
        >>> flatten({"ckpt_path": None, "model": {"scale": None, "margin": 0.0}}, drop_none=True)
        {'model.margin': '0.0'}
    """
    flat: dict[str, str] = {}
    items = config.items() if isinstance(config, Mapping) else enumerate(config)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) or (isinstance(value, (list, tuple)) and value):
            flat.update(flatten(value, name + ".", drop_none=drop_none))
        elif value is not None or not drop_none:
            flat[name] = str(value)
    return flat


@contextmanager
def _environment_kept(name: str) -> Iterator[None]:
    """Restore the environment variable ``name`` after the block (set, changed or removed)."""
    before = os.environ.get(name)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


# --- resume markers and the one-value-per-step history -------------------------------------


@dataclass(frozen=True)
class Resume:
    """A resume marker: at ``time_ms`` the run continued from a checkpoint at step ``step``.

    What the run logged before ``time_ms`` at steps ``>= step`` came from the abandoned attempt
    (it ran past the checkpoint, or the user went back to an earlier checkpoint) and is
    superseded by what the resumed fit logs from ``step`` on.

    Attributes:
        step: the checkpoint's ``global_step``, the first step the resumed fit logs.
        time_ms: when the resumed fit started, in milliseconds since the epoch (the clock of
            the metrics' timestamps).
        previous_status: how the previous attempt ended: ``FINISHED``, ``FAILED`` or
            ``KILLED`` (the run was still ``RUNNING``: its process died without ending it).

    Example:
        >>> marker = Resume(step=100, time_ms=5_000)
        >>> marker.supersedes(step=99, timestamp=4_000), marker.supersedes(100, 4_000)
        (False, True)
        >>> marker.supersedes(step=100, timestamp=6_000)  # logged by the resumed fit
        False
    """

    step: int
    time_ms: int
    previous_status: str | None = None

    def supersedes(self, step: int, timestamp: int) -> bool:
        """Whether an entry logged at ``timestamp`` for ``step`` belongs to the abandoned part."""
        return timestamp < self.time_ms and step >= self.step

    def to_tag(self) -> str:
        """The marker as the JSON value of its ``resume.<k>`` tag."""
        return json.dumps(asdict(self))

    @classmethod
    def from_tag(cls, value: str) -> Resume:
        """The marker a ``resume.<k>`` tag holds.

        Raises:
            ValueError: the value is not a marker's JSON.
        """
        fields = json.loads(value)
        if not isinstance(fields, dict):
            raise ValueError(f"a resume marker is a JSON object, not {value!r}")
        return cls(int(fields["step"]), int(fields["time_ms"]), fields.get("previous_status"))


def _marker_tags(tags: Mapping[str, str]) -> dict[int, Resume]:
    """The resume markers among a run's tags, by their index ``k`` (unreadable ones skipped)."""
    markers: dict[int, Resume] = {}
    for key, value in tags.items():
        index = key[len(RESUME_TAG) :]
        if not key.startswith(RESUME_TAG) or not index.isdigit():
            continue
        try:
            markers[int(index)] = Resume.from_tag(value)
        except (ValueError, KeyError, TypeError):
            continue
    return markers


def resume_markers(tags: Mapping[str, str]) -> list[Resume]:
    """A run's resume markers, oldest first, from its tags ``resume.1``, ``resume.2``, ...

    Example:
        >>> tags = {"resume.2": '{"step": 7, "time_ms": 20}', "loss": "FocalLoss",
        ...         "resume.1": '{"step": 4, "time_ms": 10, "previous_status": "KILLED"}'}
        >>> [(r.step, r.previous_status) for r in resume_markers(tags)]
        [(4, 'KILLED'), (7, None)]
    """
    markers = _marker_tags(tags)
    return [markers[index] for index in sorted(markers)]


def cut_history(metrics: Iterable[Metric], resumes: Sequence[Resume] = ()) -> list[Metric]:
    """One entry per step: a metric's raw MLflow history with the run's resumes applied.

    Each resume, oldest first, drops the entries logged before its time at steps ``>=`` its
    step; of the entries left at one step, the latest (by timestamp; on a tie, the later in
    ``metrics``) is kept. The result is sorted by step.

    Example:
        >>> from mlflow.entities import Metric
        >>> raw = [Metric("g", 0.5, 10, 0), Metric("g", 0.99, 20, 1), Metric("g", 0.29, 40, 1)]
        >>> [(m.step, m.value) for m in cut_history(raw, [Resume(step=1, time_ms=30)])]
        [(0, 0.5), (1, 0.29)]
    """
    kept = list(metrics)
    for resume in resumes:
        kept = [m for m in kept if not resume.supersedes(m.step, m.timestamp)]
    latest: dict[int, Metric] = {}
    for metric in sorted(kept, key=lambda m: m.timestamp):  # stable: ties keep their order
        latest[metric.step] = metric
    return [latest[step] for step in sorted(latest)]


def metric_history(
    client: MlflowClient, run_id: str, key: str, resumes: Sequence[Resume] | None = None
) -> list[Metric]:
    """One value per step of a run's metric, as ``compare``, ``reproduce`` and the report read it.

    Args:
        client: an ``MlflowClient`` on the run's store.
        run_id: the run.
        key: the metric, e.g. ``"val/acc"``.
        resumes: the run's resume markers (default: read from its tags).

    Returns:
        :func:`cut_history` of ``client.get_metric_history(run_id, key)``: sorted by step, the
        values of abandoned attempts dropped. A raw reader gets the same by dropping, for each
        ``resume.<k>`` tag in order, the entries with ``timestamp < time_ms`` and
        ``step >= step``, then keeping the latest entry per step.
    """
    if resumes is None:
        resumes = resume_markers(client.get_run(run_id).data.tags)
    return cut_history(client.get_metric_history(run_id, key), resumes)


def final_metrics(client: MlflowClient, run: Run) -> dict[str, float]:
    """The last value (at the highest step left) of every metric of a run, resumes applied.

    MLflow's ``run.data.metrics`` holds, per key, the value at the highest step whichever
    attempt logged it: after a resume from an earlier checkpoint the abandoned attempt's
    later steps would win. This reads :func:`metric_history` instead when the run has resume
    markers (and is ``run.data.metrics`` when it has none); a key whose every entry was
    superseded is left out.
    """
    resumes = resume_markers(run.data.tags)
    if not resumes:
        return dict(run.data.metrics)
    final: dict[str, float] = {}
    for key in run.data.metrics:
        history = metric_history(client, run.info.run_id, key, resumes)
        if history:
            final[key] = history[-1].value
    return final


# --- the process that logs a run ------------------------------------------------------------


def process_tags() -> dict[str, str]:
    """Tags naming this host and process: set when a run starts or resumes."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def _recorded_pid(tags: Mapping[str, str]) -> int | None:
    """The process id a run's tags record, if that process ran on this (POSIX) host."""
    pid = tags.get(PID_TAG, "")
    if os.name != "posix" or tags.get(HOST_TAG) != socket.gethostname() or not pid.isdigit():
        return None
    return int(pid)


def _process_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (signal 0 probes without signalling)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_is_gone(tags: Mapping[str, str]) -> bool:
    """Whether the process a run's tags name (``tracking.host``, ``tracking.pid``) has ended.

    ``False`` when it is alive, ran on another host, or the run has no such tags: only a
    process known to be gone makes a ``RUNNING`` run a killed one.
    """
    pid = _recorded_pid(tags)
    return pid is not None and not _process_exists(pid)


# --- the spool file: one JSON record per newline-ended line ---------------------------------


def _lock(handle: IO[bytes]) -> None:
    """Hold an exclusive ``flock`` on an open file until it is closed (no lock off POSIX)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)


def _is_current(handle: IO[bytes], path: Path) -> bool:
    """Whether ``handle`` is still the file at ``path`` (not removed or replaced meanwhile)."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(handle.fileno())
    return (on_disk.st_dev, on_disk.st_ino) == (opened.st_dev, opened.st_ino)


@contextmanager
def _locked(path: Path, mode: str) -> Iterator[IO[bytes]]:
    """``path`` opened in binary ``mode`` under an exclusive lock.

    Opens again when the file was removed or replaced while waiting for the lock, so that a
    writer never appends to a spool that a replay has just removed.
    """
    while True:
        handle = path.open(mode)
        try:
            _lock(handle)
            if _is_current(handle, path):
                yield handle
                return
        finally:
            handle.close()


def _rewrite(handle: IO[bytes], data: bytes) -> None:
    """Replace the content of an open, locked file and push it to disk."""
    handle.seek(0)
    handle.write(data)
    handle.truncate()
    handle.flush()
    os.fsync(handle.fileno())


def append_spool_record(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one record to a spool as one JSON line, flushed and fsynced, under a lock.

    A line counts only with its newline. If the file ends in a fragment (a write cut by a
    kill), a newline is written first, so the fragment stays one damaged line and the record
    starts a line of its own.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(dict(record)).encode() + b"\n"
    with _locked(path, "a+b") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                line = b"\n" + line
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


@dataclass(frozen=True)
class SpoolLine:
    """One line of a spool file.

    Attributes:
        number: its line number, from 1.
        raw: its bytes, without the newline.
        ended: whether the newline was there (only the file's last line can lack it).
        record: the record it holds, or ``None`` when it is damaged.
        problem: what is wrong with a damaged line, else ``None``.
    """

    number: int
    raw: bytes
    ended: bool
    record: dict[str, Any] | None
    problem: str | None


def _parse_line(raw: bytes, ended: bool) -> tuple[dict[str, Any] | None, str | None]:
    """The record of one spool line, or ``(None, what is wrong with it)``."""
    if not ended:
        return None, "cut off: no newline at its end (a write interrupted by a kill?)"
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except json.JSONDecodeError as error:
        return None, f"not a JSON record ({error.msg} at column {error.colno})"
    if not isinstance(record, dict) or not record.get("run_id"):
        return None, "not a spool record (a JSON object with 'kind' and 'run_id')"
    if record.get("kind") not in SPOOL_KINDS:
        return None, f"unknown record kind {record.get('kind')!r}"
    return record, None


def read_spool(data: bytes) -> list[SpoolLine]:
    """The non-blank lines of a spool, each with its record or what is wrong with it.

    Example:
        >>> data = b'{"kind": "tags", "run_id": "r", "tags": {}}\\nnot json\\n{"kind": "met'
        >>> [(line.number, line.problem is None) for line in read_spool(data)]
        [(1, True), (2, False), (3, False)]
    """
    pieces = data.split(b"\n")
    last_ended = pieces[-1] == b""
    if last_ended:
        pieces.pop()
    lines = []
    for number, raw in enumerate(pieces, start=1):
        if not raw.strip():
            continue
        ended = number < len(pieces) or last_ended
        record, problem = _parse_line(raw, ended)
        lines.append(SpoolLine(number, raw, ended, record, problem))
    return lines


def _join(lines: Iterable[SpoolLine]) -> bytes:
    """Spool lines back as bytes, each with its newline if it had one."""
    return b"".join(line.raw + (b"\n" if line.ended else b"") for line in lines)


# --- the logger -------------------------------------------------------------------------------


class TrackingLogger(MLFlowLogger):
    """Lightning's ``MLFlowLogger`` that never loses what it could not send.

    Args:
        experiment_name: MLflow experiment (created if missing).
        run_name: name of the run.
        tracking_uri: ``sqlite:///...``, ``http://host:port``, ...; default
            ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db`` in the working directory.
        tags: extra run tags.
        save_dir: local folder for run files (made absolute): ``<save_dir>/<experiment
            id>/<run id>/`` holds the checkpoints, the reliability diagrams and, if the server
            fails, the spool.
        log_model: log the best checkpoint as the artifact ``checkpoints/<name>.ckpt`` at the
            end of fit; with a local store the artifact is a hard link to the file in the run
            folder (stored once, see :meth:`link_artifact`), with a server a copy.
        run_id: continue this run (the CLI fills it in from a checkpoint on resume).
        resume_step: with ``run_id``, the global step of the checkpoint this fit resumes from
            (the CLI fills it in on ``fit --ckpt_path``). When the run starts, the logger
            records the resume marker ``resume.<k>`` (:class:`Resume`; a run found
            ``RUNNING`` is recorded as ``previous_status="KILLED"``), sets the run
            ``RUNNING`` and drops from the run's spool what the marker supersedes.
        connect_timeout: seconds to wait for an HTTP server at start-up.

    When the run starts (or resumes) it is tagged ``tracking.host`` and ``tracking.pid``, so
    that a later resume or ``sync-tracking`` can tell a run whose process was killed from a
    live one.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> logger = TrackingLogger(tracking_uri=f"sqlite:///{folder}/mlflow.db", save_dir=folder)
        >>> logger.experiment.get_experiment(logger.experiment_id).name
        'lightning-losses'
    """

    def __init__(
        self,
        experiment_name: str = DEFAULT_EXPERIMENT,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        save_dir: str = DEFAULT_SAVE_DIR,
        log_model: bool = True,
        run_id: str | None = None,
        resume_step: int | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        uri = resolve_tracking_uri(tracking_uri)
        fail_fast_http()
        check_reachable(uri, connect_timeout)
        # With a local store, artifacts of new experiments go beside the run folders (MLflow
        # would otherwise pick ./mlruns); a server decides for itself.
        local_store = not uri.startswith(("http://", "https://"))
        artifacts = (Path(save_dir) / "artifacts").resolve().as_uri() if local_store else None
        with store_lock(uri):  # a new SQLite store's tables are created here
            super().__init__(
                experiment_name=experiment_name,
                run_name=run_name,
                tracking_uri=uri,
                tags=tags,
                save_dir=save_dir,
                log_model=False,
                run_id=run_id,
                artifact_location=artifacts,
            )
        # Absolute, so that checkpoints record one folder whatever the working directory of a
        # later resume (ModelCheckpoint reloads its state only when its dirpath is unchanged).
        self._local_dir = os.path.abspath(save_dir)
        self._log_best_checkpoint = log_model
        self._resume_step = resume_step
        self._spooled_steps: set[tuple[str, int]] = set()
        self.spooled = 0
        #: Where :meth:`log_hyperparams` puts the module's hyper-parameters: ``None`` (plain
        #: use) logs them under their own dotted names; the CLI's config callback, which logs
        #: the config, sets the config's model section (``"model."``) so that only the values
        #: the config lacks (those linked from the data, such as ``model.input_dim``) are added.
        self.model_param_prefix: str | None = None
        self._logged_files: dict[tuple[str, str | None], tuple[int, int]] = {}

    # --- the run ----------------------------------------------------------------------------

    @property
    @rank_zero_experiment
    def experiment(self) -> MlflowClient:
        """The ``MlflowClient``; its first use creates the run, or continues ``run_id``.

        MLflow's ``set_tracking_uri`` would export ``MLFLOW_TRACKING_URI`` to the whole
        process (so that a later fit or resume in it would take this store for the user's
        choice): the variable is restored.
        """
        if self._initialized:
            return self._mlflow_client
        continuing = self._run_id is not None
        # Under the store's lock: two fits starting at once would both create the experiment.
        with _environment_kept("MLFLOW_TRACKING_URI"), store_lock(self._tracking_uri):
            client = super().experiment
        self._start_run(continuing)
        return client

    def _start_run(self, continuing: bool) -> None:
        """Tag a new or resumed run with this process; record the resume of a resumed one.

        A run continued without ``resume_step`` (``validate``/``test`` on a checkpoint) keeps
        its tags.
        """
        if continuing and self._resume_step is None:
            return
        tags = process_tags()
        if continuing:
            tags.update(self._record_resume())
        self.set_tags(tags)

    def _record_resume(self) -> dict[str, str]:
        """Record that this fit resumes the run: a marker tag, status ``RUNNING``, a cut spool.

        The marker ``resume.<k>`` (``k``: one more than the run's last) is
        ``Resume(step=resume_step, time_ms=now, previous_status=...)``. A run found
        ``RUNNING`` lost its process without ending (SIGKILL, a crash, a lost node): the
        marker says ``previous_status="KILLED"`` (a warning tells when the recorded process
        still runs on this host: two fits would then write one run). The run is set
        ``RUNNING`` for the resumed fit, which ends it ``FINISHED`` or ``FAILED`` as usual.
        The spool of the run loses what the marker supersedes, so that it never holds two
        values for one (metric, step).

        Returns:
            The marker's tag, to be set with the process tags.
        """
        client, run_id = self._mlflow_client, str(self._run_id)
        run = client.get_run(run_id)
        previous = run.info.status
        if previous == "RUNNING":
            pid = _recorded_pid(run.data.tags)
            if pid is not None and pid != os.getpid() and _process_exists(pid):
                rank_zero_warn(
                    f"MLflow run {run_id} is RUNNING and its process {pid} still exists on "
                    "this host: two fits would log into one run. Stop it before resuming."
                )
            previous = "KILLED"
        marker = Resume(int(self._resume_step or 0), now_ms(), previous)
        client.update_run(run_id, status="RUNNING")
        self._drop_superseded_spool(marker)
        index = max(_marker_tags(run.data.tags), default=0) + 1
        return {f"{RESUME_TAG}{index}": marker.to_tag()}

    def _drop_superseded_spool(self, marker: Resume) -> None:
        """Remove from the run's spool the metrics and run end that ``marker`` supersedes."""
        path = self.spool_path
        if not path.is_file():
            return
        with _locked(path, "r+b") as handle:
            lines = read_spool(handle.read())
            kept = [line for line in lines if not _superseded(line.record, marker, self._run_id)]
            if len(kept) < len(lines):
                _rewrite(handle, _join(kept))

    # --- where files go -------------------------------------------------------------------

    @property
    def save_dir(self) -> str:
        """Local root of the run folders (Lightning puts checkpoints under it)."""
        return self._local_dir

    @property
    def local_run_dir(self) -> Path:
        """``<save_dir>/<experiment id>/<run id>``: checkpoints, diagrams, spool."""
        return Path(self._local_dir) / str(self.name) / str(self.version)

    @property
    def log_dir(self) -> str:
        return str(self.local_run_dir)

    @property
    def spool_path(self) -> Path:
        return self.local_run_dir / SPOOL_NAME

    # --- the spool ------------------------------------------------------------------------

    def _spool(self, record: dict[str, Any], error: BaseException) -> None:
        """Append a record (with run id, tracking URI and time) to the spool; warn once."""
        path = self.spool_path
        record = {"timestamp": now_ms(), **record}
        record.update(run_id=self._run_id, tracking_uri=self._tracking_uri)
        append_spool_record(path, record)
        if self.spooled == 0:
            rank_zero_warn(
                f"MLflow tracking at {self._tracking_uri} failed ({type(error).__name__}: "
                f"{error}). Training goes on; what cannot be sent is kept in {path}. Replay it "
                f"with `lightning-losses sync-tracking {path}` once the server is back."
            )
        self.spooled += 1

    # --- logging, each call falling back to the spool ----------------------------------------

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log metrics at ``step``; spool them if the store fails (each (key, step) once)."""
        try:
            super().log_metrics(metrics, step)
        except Exception as error:
            step = step or 0
            values = {
                key: float(value)
                for key, value in metrics.items()
                if not isinstance(value, str) and (key, step) not in self._spooled_steps
            }
            if values:
                self._spooled_steps.update((key, step) for key in values)
                self._spool({"kind": "metrics", "metrics": values, "step": step}, error)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        """Log the module's hyper-parameters once each, as dotted params (see :meth:`log_params`).

        ``None`` values and private entries (LightningCLI's ``_instantiator``) are left out.
        With :attr:`model_param_prefix` set (by the CLI, which logs the config), each name is
        prefixed and the params the config logged already are not logged again.
        """
        values = params if isinstance(params, Mapping) else vars(params)
        values = {k: v for k, v in values.items() if not str(k).startswith("_")}
        flat = flatten(values, self.model_param_prefix or "", drop_none=True)
        if flat:
            self.log_params(flat)

    @rank_zero_only
    def log_params(self, params: Mapping[str, str]) -> None:
        """Log already-flat params (values cut to MLflow's 6,000 characters)."""
        from mlflow.entities import Param

        try:
            # A resumed run keeps the params it has (MLflow refuses to change a param's value).
            existing = self.experiment.get_run(self.run_id).data.params
            items = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in existing]
            for start in range(0, len(items), 100):
                self.experiment.log_batch(self.run_id, params=items[start : start + 100])
        except Exception as error:
            self._spool({"kind": "params", "params": dict(params)}, error)

    @rank_zero_only
    def set_tags(self, tags: Mapping[str, str]) -> None:
        try:
            for key, value in tags.items():
                self.experiment.set_tag(self.run_id, key, str(value))
        except Exception as error:
            self._spool({"kind": "tags", "tags": {k: str(v) for k, v in tags.items()}}, error)

    @rank_zero_only
    def log_file(
        self, path: str | Path, artifact_path: str | None = None, *, link: bool = False
    ) -> None:
        """Log a local file as an artifact of the run (spooled by path if the server fails).

        A file this logger logged already to the same ``artifact_path``, unchanged since (same
        size and modification time), is not sent again: the best checkpoint is logged at the
        end of every ``fit`` and ``test`` of the logger.

        Args:
            path: the file.
            artifact_path: the artifact folder (``None``: the run's artifact root).
            link: when the run's artifacts are a local folder (a local store), make the
                artifact a hard link to ``path`` instead of a copy, so that the file is stored
                once (:meth:`link_artifact`); a server's store gets a copy, as without it.
        """
        key = (os.path.realpath(path), artifact_path)
        try:
            stat = os.stat(path)
        except OSError:  # MLflow names the missing file (or the spool keeps its path)
            stat = None
        if stat is not None:
            version = (stat.st_size, stat.st_mtime_ns)
            if self._logged_files.get(key) == version:
                return
            self._logged_files[key] = version
        try:
            if not (link and self.link_artifact(path, artifact_path)):
                self.experiment.log_artifact(self.run_id, str(path), artifact_path=artifact_path)
        except Exception as error:
            record = {"kind": "artifact", "path": str(Path(path).resolve())}
            self._spool({**record, "artifact_path": artifact_path}, error)

    def local_artifact_dir(self) -> Path | None:
        """The run's artifact folder when its artifact store is local (``file:``), else ``None``.

        With the default local store (``sqlite:///mlflow.db``) it is
        ``<save_dir>/artifacts/<run id>/artifacts``.
        """
        uri = self.experiment.get_run(self.run_id).info.artifact_uri
        parsed = urllib.parse.urlparse(uri)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            return None
        return Path(urllib.request.url2pathname(parsed.path))

    def link_artifact(self, path: str | Path, artifact_path: str | None = None) -> bool:
        """Make ``path`` an artifact of the run by a hard link into its local artifact folder.

        The artifact and ``path`` are then one file on disk (one inode, stored once; deleting
        either name keeps the other); the link replaces an artifact of the same name.

        Returns:
            Whether the link was made: ``False`` when the artifact store is not a local
            folder (a server) or the file system refuses the link (another device, no hard
            links); then log a copy instead.
        """
        folder = self.local_artifact_dir()
        if folder is None:
            return False
        target = folder / (artifact_path or "") / Path(path).name
        staged = target.with_name(f".{target.name}.link")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() and os.path.samefile(path, target):
                return True
            staged.unlink(missing_ok=True)
            os.link(path, staged)
            os.replace(staged, target)  # whole or not at all: never a half-written artifact
        except OSError:
            staged.unlink(missing_ok=True)
            return False
        return True

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        # Lightning calls this after every save; keep the first callback that tracks a best
        # model (one with a monitor: the config's first, ``trainer.checkpoint_callback``), not
        # LastCheckpoint nor a monitor-less or later one a user added.
        kept = self._checkpoint_callback
        if kept is None or (
            getattr(checkpoint_callback, "monitor", None) and not getattr(kept, "monitor", None)
        ):
            self._checkpoint_callback = checkpoint_callback

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if not self._initialized:
            return
        callback = self._checkpoint_callback
        best = getattr(callback, "best_model_path", "") if callback is not None else ""
        if self._log_best_checkpoint and best and Path(best).exists():
            self.log_file(best, artifact_path="checkpoints", link=True)
        mlflow_status = "FINISHED" if status in ("success", "finished") else "FAILED"
        try:
            self.experiment.set_terminated(self.run_id, mlflow_status)
        except Exception as error:
            self._spool({"kind": "terminate", "status": mlflow_status}, error)
        if self.spooled:
            rank_zero_warn(
                f"{self.spooled} tracking calls could not reach {self._tracking_uri}; they are "
                f"in {self.spool_path}: `lightning-losses sync-tracking {self.spool_path}`"
            )


def _superseded(record: Mapping[str, Any] | None, marker: Resume, run_id: str | None) -> bool:
    """Whether a spool record of ``run_id`` is superseded by a resume ``marker``.

    Metrics logged before the marker at steps ``>=`` its step, and a run end recorded before
    it, are; other records, records without a time and damaged lines (``None``) are not.
    """
    if record is None or record.get("run_id") != run_id or "timestamp" not in record:
        return False
    if record["kind"] == "metrics":
        return marker.supersedes(int(record["step"]), int(record["timestamp"]))
    return record["kind"] == "terminate" and int(record["timestamp"]) < marker.time_ms


def describe_fit(pl_module: Any, callbacks: Iterable[Any]) -> str:
    """One line naming a fit's criterion and what changes it during training.

    The criterion's repr (its hyper-parameters) on one line, then the ``describe()`` text of
    every callback that has such a method returning a string (schedules, loss switches,
    AdaFocal's updates), in the trainer's order.

    Example:
        >>> from lightning_losses import FocalLoss
        >>> class Module:
        ...     criterion = FocalLoss(gamma=2.0)
        >>> class Halve:
        ...     def describe(self) -> str:
        ...         return "gamma halved every epoch"
        >>> describe_fit(Module(), [Halve(), object()])
        "criterion FocalLoss(gamma=2.0, reduction='mean'); gamma halved every epoch"
        >>> describe_fit(Module(), [])
        "criterion FocalLoss(gamma=2.0, reduction='mean'); fixed during training"
    """
    criterion = getattr(pl_module, "criterion", None)
    # A function by its name; a loss module (no __name__) by its repr, on one line.
    shown = getattr(criterion, "__name__", None) or " ".join(repr(criterion).split())
    described = []
    for callback in callbacks:
        describe = getattr(callback, "describe", None)
        text = describe() if callable(describe) else None
        if isinstance(text, str) and text.strip():
            described.append(" ".join(text.split()))
    return f"criterion {shown}; " + ("; ".join(described) or "fixed during training")


def without_password(uri: str) -> str:
    """``uri`` with the password of its user info replaced by ``***``, for printing.

    Example:
        >>> without_password("postgresql+psycopg2://mlflow:s3cret@db:5432/mlflow")
        'postgresql+psycopg2://mlflow:***@db:5432/mlflow'
        >>> without_password("http://user:pw@127.0.0.1:5000")
        'http://user:***@127.0.0.1:5000'
        >>> without_password("sqlite:////tmp/mlflow.db")
        'sqlite:////tmp/mlflow.db'
    """
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))


def view_command(tracking_uri: str) -> str:
    """How to look at a store's runs: ``mlflow ui`` for a local store, the address for a server.

    Example:
        >>> view_command("sqlite:////tmp/mlflow.db")
        'mlflow ui --backend-store-uri sqlite:////tmp/mlflow.db'
        >>> view_command("http://127.0.0.1:5000")
        'open http://127.0.0.1:5000'
    """
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri}"
    return f"mlflow ui --backend-store-uri {tracking_uri}"


#: The validation metrics a fit's closing summary reports, in this order (those logged).
SUMMARY_METRICS = ("val/acc", "val/nll", "val/ece")


def final_values(metrics: Mapping[str, Any], keys: Sequence[str] = SUMMARY_METRICS) -> str:
    """``"val/acc 0.9123, val/nll 0.3012"``: the ``keys`` found in ``metrics``, 4 decimals.

    Example:
        >>> final_values({"val/nll": 0.30121, "val/acc": 0.9, "train/loss": 1.0})
        'val/acc 0.9000, val/nll 0.3012'
        >>> final_values({})
        ''
    """
    return ", ".join(f"{key} {float(metrics[key]):.4f}" for key in keys if key in metrics)


def describe_run(
    logger: Any,
    checkpoint_dirs: Iterable[str],
    metrics: Mapping[str, Any] | None = None,
    diagram: str | Path | None = None,
) -> str:
    """A few lines on a finished fit: its run, final validation values, diagram, files, viewer.

    Args:
        logger: an ``MLFlowLogger`` (such as :class:`TrackingLogger`) whose run has started.
        checkpoint_dirs: the folders the fit's checkpoints were written to.
        metrics: the values logged last (``trainer.callback_metrics``): ``val/acc``,
            ``val/nll`` and ``val/ece`` are shown, 4 decimals, those present.
        diagram: the last reliability diagram written (``CalibrationMonitor.last_diagram``).

    Returns:
        The run line (run id, experiment, tracking URI), then one line each, indented, for the
        final validation values, the reliability diagram (when there are such), the checkpoint
        folder and the command to see the run.
    """
    uri = without_password(str(logger._tracking_uri))  # printed: never the password
    name = getattr(logger, "_experiment_name", None)
    if not getattr(logger, "spooled", 0):  # ask the store (a run continued by id may differ)
        try:
            name = logger.experiment.get_experiment(logger.experiment_id).name
        except Exception:
            pass
    folders = ", ".join(dict.fromkeys(str(d) for d in checkpoint_dirs if d)) or "none"
    lines = [f"MLflow run {logger.run_id} (experiment {name!r}) in {uri}"]
    values = final_values(metrics or {})
    if values:
        lines.append(f"  final validation: {values}")
    if diagram:
        lines.append(f"  reliability diagram: {diagram}")
    lines.append(f"  checkpoints: {folders}")
    lines.append(f"  to see it: {view_command(uri)}")
    return "\n".join(lines)


def last_diagram(callbacks: Iterable[Any]) -> Path | None:
    """The last reliability diagram a callback wrote (its ``last_diagram``), if any."""
    found = None
    for callback in callbacks:
        path = getattr(callback, "last_diagram", None)
        if path:
            found = Path(path)
    return found


class TrackingConfigCallback(SaveConfigCallback):
    """The CLI's config callback: config, params and tags to MLflow; run in checkpoints; summary.

    With a :class:`TrackingLogger` it writes the resolved config to the run's own folder
    (``<save_dir>/<experiment id>/<run id>/config.yaml``; nothing is written to a file shared
    by all runs, so fits started at once in one directory keep their own) and logs it as the
    artifact ``config.yaml``, logs the flattened config as params (``None`` values left out;
    the module's hyper-parameters then add only the values linked from the data, such as
    ``model.input_dim``), and tags ``loss`` (the criterion class), ``dataset`` (the DataModule
    class) and ``config`` (the config file's name). With other loggers only, the config file
    goes to the log directory, as LightningCLI's own callback does. Every checkpoint records
    the MLflow run id, experiment id and tracking URI under ``checkpoint["tracking"]``.

    On rank 0 it prints one line when a fit starts (:func:`describe_fit`: the criterion and
    the ``describe()`` of each callback that changes it) and a few when it ends
    (:func:`describe_run`: the run id, experiment and tracking URI; the final ``val/acc``,
    ``val/nll`` and ``val/ece``; the last reliability diagram; the checkpoint folder; how to
    see the run).
    """

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not any(hasattr(logger, "local_run_dir") for logger in trainer.loggers):
            super().setup(trainer, pl_module, stage)
            return
        kept = self.save_to_log_dir
        self.save_to_log_dir = False  # the run folder gets it (save_config), not the shared root
        try:
            super().setup(trainer, pl_module, stage)
        finally:
            self.save_to_log_dir = kept

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        loggers = [logger for logger in trainer.loggers if hasattr(logger, "log_file")]
        if not loggers:
            return
        config = self.parser.dump(self.config, skip_none=False, format="yaml")
        as_dict = self.parser.dump(self.config, skip_none=False, format="json")
        flat = flatten(json.loads(as_dict), drop_none=True)
        flat.pop("config", None)
        model_prefix = "model.init_args." if "model.class_path" in flat else "model."
        criterion = type(getattr(pl_module, "criterion", None)).__name__
        datamodule = getattr(trainer, "datamodule", None)
        config_files = [str(p) for p in (self.config.get("config") or []) if p]
        tags = {"loss": criterion, "dataset": type(datamodule).__name__}
        if config_files:
            tags["config"] = Path(config_files[-1]).stem
        for logger in loggers:
            path = logger.local_run_dir / "config.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(config)
            logger.log_file(path)
            logger.log_params(flat)
            logger.set_tags(tags)
            if hasattr(logger, "model_param_prefix"):
                logger.model_param_prefix = model_prefix

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            print(f"lightning-losses fit: {describe_fit(pl_module, trainer.callbacks)}", flush=True)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.is_global_zero:
            return
        folders = [getattr(cb, "dirpath", None) for cb in trainer.checkpoint_callbacks]
        metrics = trainer.callback_metrics
        diagram = last_diagram(trainer.callbacks)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger._run_id is not None:
                summary = describe_run(logger, folders, metrics, diagram)
                print(f"lightning-losses fit: {summary}", flush=True)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger._run_id is not None:
                checkpoint[CHECKPOINT_KEY] = {
                    "run_id": str(logger._run_id),
                    "experiment_id": str(logger._experiment_id),
                    "tracking_uri": str(logger._tracking_uri),
                }


def checkpoint_tracking(path: str | Path) -> dict[str, Any]:
    """What a checkpoint records of its MLflow run, and its global step.

    Returns:
        ``{"run_id", "experiment_id", "tracking_uri", "global_step"}`` for a checkpoint saved
        with :class:`TrackingConfigCallback`; ``{}`` for one saved without a run.
    """
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    info = dict(checkpoint.get(CHECKPOINT_KEY) or {})
    if info:
        info["global_step"] = int(checkpoint.get("global_step", 0))
    return info


def run_id_from_checkpoint(path: str | Path) -> str | None:
    """The MLflow run id a checkpoint was saved under (``None`` if it has none)."""
    return checkpoint_tracking(path).get("run_id")


def run_folder_root(checkpoint_path: str | Path, run_id: str, experiment_id: str) -> Path | None:
    """The ``save_dir`` a checkpoint was written under: the folder above its run folder.

    ``None`` unless the checkpoint lies inside ``<root>/<experiment id>/<run id>/``.

    Example:
        >>> run_folder_root("/x/mlflow_runs/1/abc/checkpoints/last.ckpt", "abc", "1").as_posix()
        '/x/mlflow_runs'
        >>> run_folder_root("/x/copied/last.ckpt", "abc", "1") is None
        True
    """
    for folder in Path(os.path.abspath(checkpoint_path)).parents:
        if folder.name == run_id and folder.parent.name == experiment_id:
            return folder.parent.parent
    return None


# --- replay -------------------------------------------------------------------------------


class SpoolReplayError(RuntimeError):
    """Some lines of a spool were not replayed; ``done`` counts what was (per kind)."""

    def __init__(self, message: str, done: dict[str, int]) -> None:
        super().__init__(message)
        self.done = done


def _spooled_markers(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, Resume]]:
    """Resume markers found in the spool's ``tags`` records, by run id."""
    found: dict[str, dict[int, Resume]] = {}
    for record in records:
        if record["kind"] == "tags":
            found.setdefault(record["run_id"], {}).update(_marker_tags(record["tags"]))
    return found


def _attempt(resumes: Iterable[Resume], timestamp: int) -> int:
    """Which attempt of a run logged at ``timestamp``: the number of resumes before it."""
    return sum(1 for resume in resumes if resume.time_ms <= timestamp)


class _Replay:
    """Replays spool records into their MLflow stores, never writing a (metric, step) twice.

    Args:
        tracking_uri: store for every record (default: the one each record names).
        records: every valid record of the spool (their resume markers count from the start).
    """

    def __init__(self, tracking_uri: str | None, records: Sequence[Mapping[str, Any]]) -> None:
        self.tracking_uri = tracking_uri
        self.clients: dict[str, MlflowClient] = {}
        self.run_clients: dict[str, MlflowClient] = {}
        self.spooled_markers = _spooled_markers(records)
        self.markers: dict[str, list[Resume]] = {}
        self.present: dict[tuple[str, str], list[tuple[int, int]]] = {}
        self.last_time: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.handlers = {
            "metrics": self._metrics,
            "params": self._params,
            "tags": self._tags,
            "artifact": self._artifact,
            "terminate": self._terminate,
        }

    def count(self, what: str, n: int = 1) -> None:
        self.done[what] = self.done.get(what, 0) + n

    def apply(self, record: Mapping[str, Any]) -> None:
        """Replay one record (raises what MLflow raises)."""
        from mlflow.tracking import MlflowClient

        uri = self.tracking_uri or record.get("tracking_uri") or resolve_tracking_uri()
        client = self.clients.setdefault(uri, MlflowClient(uri))
        run_id = record["run_id"]
        self.run_clients.setdefault(run_id, client)
        if "timestamp" in record:
            self.last_time[run_id] = max(self.last_time.get(run_id, 0), int(record["timestamp"]))
        self.handlers[record["kind"]](client, run_id, record)
        self.count(record["kind"])

    def resumes(self, client: MlflowClient, run_id: str) -> list[Resume]:
        """The run's resume markers: its tags' and the spool's, oldest first."""
        if run_id not in self.markers:
            found = _marker_tags(client.get_run(run_id).data.tags)
            found.update(self.spooled_markers.get(run_id, {}))
            self.markers[run_id] = [found[index] for index in sorted(found)]
        return self.markers[run_id]

    def steps_present(self, client: MlflowClient, run_id: str, key: str) -> list[tuple[int, int]]:
        """``(step, timestamp)`` of every entry of a metric in the store (fetched once)."""
        if (run_id, key) not in self.present:
            history = client.get_metric_history(run_id, key)
            self.present[run_id, key] = [(m.step, m.timestamp) for m in history]
        return self.present[run_id, key]

    def _metrics(self, client: MlflowClient, run_id: str, record: Mapping[str, Any]) -> None:
        """Log the record's metrics, except those a resume supersedes or the store holds.

        The store holds an entry when it has the same (key, step) logged by the same or a
        later attempt: a step logged twice, or a replay interrupted and run again.
        """
        from mlflow.entities import Metric

        step, timestamp = int(record["step"]), int(record["timestamp"])
        resumes = self.resumes(client, run_id)
        attempt = _attempt(resumes, timestamp)
        superseded = any(resume.supersedes(step, timestamp) for resume in resumes)
        fresh = []
        for key, value in record["metrics"].items():
            present = self.steps_present(client, run_id, key)
            held = any(s == step and _attempt(resumes, t) >= attempt for s, t in present)
            if superseded or held:
                self.count("skipped")
                continue
            fresh.append(Metric(key, float(value), timestamp, step))
        if fresh:
            client.log_batch(run_id, metrics=fresh)
        for metric in fresh:
            self.present[run_id, metric.key].append((step, timestamp))

    def _params(self, client: MlflowClient, run_id: str, record: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        existing = client.get_run(run_id).data.params
        params = [Param(k, str(v)[:6000]) for k, v in record["params"].items() if k not in existing]
        for start in range(0, len(params), 100):
            client.log_batch(run_id, params=params[start : start + 100])

    def _tags(self, client: MlflowClient, run_id: str, record: Mapping[str, Any]) -> None:
        for key, value in record["tags"].items():
            client.set_tag(run_id, key, str(value))

    def _artifact(self, client: MlflowClient, run_id: str, record: Mapping[str, Any]) -> None:
        client.log_artifact(run_id, record["path"], artifact_path=record.get("artifact_path"))

    def _terminate(self, client: MlflowClient, run_id: str, record: Mapping[str, Any]) -> None:
        """End the run with the recorded status and time, unless a later resume reopened it."""
        timestamp = record.get("timestamp")
        if timestamp is not None and any(
            r.time_ms > int(timestamp) for r in self.resumes(client, run_id)
        ):
            self.count("skipped")
            return
        client.set_terminated(run_id, record["status"], end_time=timestamp)

    def mark_killed(self) -> None:
        """Set ``KILLED`` the replayed runs still ``RUNNING`` whose process is gone.

        The end time is the last time the spool recorded for the run. A run that cannot be
        read is left as it is (its records failed already).
        """
        for run_id, client in self.run_clients.items():
            try:
                run = client.get_run(run_id)
                if run.info.status == "RUNNING" and process_is_gone(run.data.tags):
                    client.set_terminated(run_id, "KILLED", end_time=self.last_time.get(run_id))
                    self.count("killed")
            except Exception:
                continue


def _settle(path: Path, data: bytes, kept: list[SpoolLine], replayed: list[SpoolLine]) -> None:
    """Journal the replayed lines; leave the others, and lines appended since, in the spool.

    Under the spool's lock: the replayed lines are appended to ``<name>.synced``; the spool
    is rewritten with the lines kept (damaged ones byte for byte) followed by whatever a
    live logger appended while the replay ran, or removed when nothing is left.
    """
    with _locked(path, "r+b") as handle:
        current = handle.read()
        appended = current[len(data) :] if current.startswith(data) else current
        if replayed:
            with path.with_name(path.name + SYNCED_SUFFIX).open("ab") as journal:
                journal.write(_join(replayed))
        remaining = _join(kept) + appended
        if remaining.strip():
            _rewrite(handle, remaining)
        else:
            path.unlink()


def _problems_text(path: Path, problems: Mapping[int, str], replayed: int, total: int) -> str:
    """The message of a partial replay: each line not replayed, by number, and why."""
    listing = "; ".join(f"line {number}: {problems[number]}" for number in sorted(problems))
    return (
        f"replayed {replayed} of {total} lines; {len(problems)} not replayed, kept in {path}: "
        f"{listing}"
    )


def sync_tracking(path: str | Path, tracking_uri: str | None = None) -> dict[str, int]:
    """Replay a spool file into MLflow; returns how many records of each kind were replayed.

    Each record carries its run id and tracking URI (``tracking_uri`` overrides the latter).

    - Every valid line is replayed, in order, even when others are damaged (a line cut off
      by a kill, one that is not a JSON record) or fail to replay.
    - Nothing is written twice: a metric entry is skipped (counted as ``skipped``) when the
      store already holds its (key, step) from the same or a later attempt of the run (a
      replay interrupted and run again) or when a resume marker supersedes it; a run end
      that a later resume reopened is skipped too.
    - A run of the spool still ``RUNNING`` afterwards whose process (tags ``tracking.host``,
      ``tracking.pid``) ran on this host and is gone is set ``KILLED`` (counted as
      ``killed``).
    - The replayed lines are appended to ``<name>.synced``. The spool keeps the lines not
      replayed (and any appended meanwhile by a running logger), or is removed when none
      are left.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        SpoolReplayError: some lines were not replayed; the message names each by its line
            number and says why; they remain in the spool, the others were replayed.
    """
    fail_fast_http()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spool file {path} does not exist")
    with _locked(path, "r+b") as handle:
        data = handle.read()
    lines = read_spool(data)
    replay = _Replay(tracking_uri, [line.record for line in lines if line.record is not None])
    problems = {line.number: line.problem for line in lines if line.problem is not None}
    replayed = []
    for line in lines:
        if line.record is None:
            continue
        try:
            replay.apply(line.record)
        except Exception as error:
            problems[line.number] = f"replay failed ({type(error).__name__}: {error})"
            continue
        replayed.append(line)
    replay.mark_killed()
    _settle(path, data, [line for line in lines if line.number in problems], replayed)
    if problems:
        raise SpoolReplayError(
            _problems_text(path, problems, len(replayed), len(lines)), replay.done
        )
    return replay.done


def _spools(given: Path) -> list[Path]:
    """The spool files a ``sync-tracking`` argument names (a file, or the spools in a folder).

    Raises:
        FileNotFoundError: nothing there, or a folder without a spool.
    """
    if given.is_dir():
        found = sorted(given.rglob(SPOOL_NAME))
        if not found:
            raise FileNotFoundError(f"no tracking spool ({SPOOL_NAME}) under {given}")
        return found
    if not given.exists():
        raise FileNotFoundError(f"{given} does not exist")
    return [given]


def _summary(done: Mapping[str, int]) -> str:
    """``'3 metrics, 1 tags'``-style text of replay counts."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(done.items())) or "nothing"


def sync_main(argv: Sequence[str] | None = None) -> int:
    """``lightning-losses sync-tracking PATH [PATH ...] [--tracking-uri URI]``.

    The options are parsed by :func:`lightning_losses.commands.sync_tracking_parser` (light:
    the console script answers ``--help`` from it without importing this module); the spools
    are replayed by :func:`sync_paths`.

    Returns:
        0 when every spool was replayed whole; 1 when a path holds no spool or a spool had
        lines that were not replayed (each named on stderr by its line number).
    """
    from .commands import sync_tracking_parser

    args = sync_tracking_parser().parse_args(None if argv is None else list(argv))
    return sync_paths(args.paths, args.tracking_uri)


def sync_paths(paths: Sequence[str | Path], tracking_uri: str | None = None) -> int:
    """Replay every spool in ``paths`` (spool files or folders holding them); print a summary.

    Args:
        paths: spool files (``tracking-spool.jsonl``) or folders searched for them.
        tracking_uri: the store to replay into; ``None``: the URI each spool recorded.

    Returns:
        0 when every spool was replayed whole; 1 when a path holds no spool or a spool had
        lines that were not replayed (each named on stderr by its line number).
    """
    from .commands import PROG

    prog = f"{PROG} sync-tracking"
    status = 0
    for given in paths:
        try:
            spools = _spools(Path(given))
        except OSError as error:
            print(f"{prog}: error: {error}", file=sys.stderr)
            status = 1
            continue
        for spool in spools:
            try:
                done = sync_tracking(spool, tracking_uri)
            except SpoolReplayError as error:
                print(f"{spool}: replayed {_summary(error.done)}")
                print(f"{prog}: error: {spool}: {error}", file=sys.stderr)
                status = 1
                continue
            except (OSError, RuntimeError, ValueError) as error:
                print(f"{prog}: error: {spool}: {error}", file=sys.stderr)
                status = 1
                continue
            print(f"{spool}: replayed {_summary(done)}")
    return status
