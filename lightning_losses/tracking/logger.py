"""TrackingLogger: Lightning's MLFlowLogger with the project's defaults, run folders and a spool."""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

from lightning_losses.tracking.async_log import BackgroundSender
from lightning_losses.tracking.constants import (
    DEFAULT_EXPERIMENT,
    DEFAULT_SAVE_DIR,
    FAILURE_TAG,
    RESUME_TAG,
    SPOOL_NAME,
)
from lightning_losses.tracking.history import Resume, _marker_tags
from lightning_losses.tracking.params import flatten
from lightning_losses.tracking.process import _process_exists, _recorded_pid, process_tags
from lightning_losses.tracking.spool import (
    _join,
    _locked,
    _rewrite,
    append_spool_record,
    read_spool,
)
from lightning_losses.tracking.store import NOT_RANK_ZERO_URI, client_uri, now_ms, store_lock
from lightning_losses.tracking.uri import (
    check_reachable,
    fail_fast_http,
    keep_secrets_off_stdout,
    redact_text,
    redact_uri,
    resolve_tracking_uri,
    without_redacted,
)
from lightning_losses.warning import LightningLossesRuntimeWarning, LightningLossesWarning


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


def _experiment_id_for(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    """The id of the active experiment ``name``, created if missing.

    Fits started at once against a server can all find the experiment missing: the server
    creates it for the first and refuses the others with ``RESOURCE_ALREADY_EXISTS``; they
    take the experiment the first created. (A deleted experiment of that name is an error, as
    in MLflow.)
    """
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None and found.lifecycle_stage != "deleted":
        return found.experiment_id
    try:
        return client.create_experiment(name=name, artifact_location=artifact_location)
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        found = client.get_experiment_by_name(name)
        if found is None or found.lifecycle_stage == "deleted":
            raise
        return found.experiment_id


#: Characters Lightning's ``MLFlowLogger`` keeps in a metric name (it drops the others).
_METRIC_NAME_DROPPED = re.compile(r"[^a-zA-Z0-9_/. -]+")


def _metric_key(key: str) -> str:
    """``key`` as Lightning's ``MLFlowLogger`` logs it: other characters dropped, with a warning."""
    cleaned = _METRIC_NAME_DROPPED.sub("", key)
    if cleaned != key:
        rank_zero_warn(
            "MLFlow only allows '_', '/', '.' and ' ' special characters in metric name."
            f" Replacing {key} with {cleaned}.",
            category=LightningLossesRuntimeWarning,
        )
    return cleaned


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
        keep_secrets_off_stdout(uri)
        check_reachable(uri, connect_timeout)
        # With a local store, artifacts of new experiments go beside the run folders (MLflow
        # would otherwise pick ./mlruns); a server decides for itself.
        local_store = not uri.startswith(("http://", "https://"))
        artifacts = (Path(save_dir) / "artifacts").resolve().as_uri() if local_store else None
        # Only global rank 0 builds a client of the store: elsewhere (other processes, other
        # nodes) a sqlite:/// client would create an empty mlflow.db (tracking.store).
        with store_lock(client_uri(uri)):  # a new SQLite store's tables are created here
            super().__init__(
                experiment_name=experiment_name,
                run_name=run_name,
                tracking_uri=client_uri(uri),
                tags=tags,
                save_dir=save_dir,
                log_model=False,
                run_id=run_id,
                artifact_location=artifacts,
            )
        self._tracking_uri = uri
        # Absolute, so that checkpoints record one folder whatever the working directory of a
        # later resume (ModelCheckpoint reloads its state only when its dirpath is unchanged).
        self._local_dir = os.path.abspath(save_dir)
        self._log_best_checkpoint = log_model
        self._resume_step = resume_step
        #: A resume read but not yet recorded: (marker index, previous status); see _start_run.
        self._pending_resume: tuple[int, str] | None = None
        self._ended_killed = False
        #: Whether the resumed run carries the failure tag of an earlier attempt.
        self._failure_tagged = False
        self._spooled_steps: set[tuple[str, int]] = set()
        #: Metrics are sent by a background thread (:meth:`log_metrics`); the values queued
        #: at the latest step, so that a repeat of one (Lightning's ``epoch``) is sent once.
        self._metric_sender = BackgroundSender(
            self._send_metrics, self._spool_metrics, name="lightning-losses-metrics"
        )
        self._queued_step: int | None = None
        self._queued_values: dict[str, float] = {}
        self.spooled = 0
        #: The first failure that sent a call to the spool, for the closing warning.
        self.first_failure = ""
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
        # A server has no such lock: the experiment another fit created meanwhile is taken.
        with _environment_kept("MLFLOW_TRACKING_URI"), store_lock(self._tracking_uri):
            if self._mlflow_client.tracking_uri == NOT_RANK_ZERO_URI:  # built off rank 0
                from mlflow.tracking import MlflowClient

                self._mlflow_client = MlflowClient(self._tracking_uri)
            if not continuing and self._experiment_id is None:
                self._experiment_id = _experiment_id_for(
                    self._mlflow_client, self._experiment_name, self._artifact_location
                )
            client = super().experiment
        self._start_run(continuing)
        return client

    def _start_run(self, continuing: bool) -> None:
        """Tag a new run with this process; read (not yet record) the resume of a resumed one.

        A run continued without ``resume_step`` (``validate``/``test`` on a checkpoint) keeps
        its tags. A resumed run is left as it is until the resumed fit logs its first metric,
        saves a checkpoint or ends (:meth:`_record_resume`): a resume that fails before that
        (a checkpoint of another model, a missing file on this node) leaves the run's status,
        tags and spool as they were, so a FINISHED run stays FINISHED.
        """
        if continuing and self._resume_step is None:
            return
        if continuing:
            self._pending_resume = self._read_resume()
            return
        self.set_tags(process_tags())

    def _read_resume(self) -> tuple[int, str]:
        """The index of the run's next resume marker and the status its previous attempt ended.

        A run found ``RUNNING`` lost its process without ending (SIGKILL, a crash, a lost node):
        its previous status is ``KILLED`` (a warning tells when the recorded process still runs
        on this host: two fits would then write one run).
        """
        run_id = str(self._run_id)
        run = self._mlflow_client.get_run(run_id)
        previous = run.info.status
        self._failure_tagged = FAILURE_TAG in run.data.tags
        if previous == "RUNNING":
            pid = _recorded_pid(run.data.tags)
            if pid is not None and pid != os.getpid() and _process_exists(pid):
                rank_zero_warn(
                    f"MLflow run {run_id} is RUNNING and its process {pid} still exists on "
                    "this host: two fits would log into one run. Stop it before resuming.",
                    category=LightningLossesWarning,
                )
            previous = "KILLED"
        return max(_marker_tags(run.data.tags), default=0) + 1, previous

    def _record_resume(self) -> None:
        """Record that this fit resumes the run: a marker tag, status ``RUNNING``, a cut spool.

        Called once, at the resumed fit's first metric, checkpoint or end (not at a failure
        before them). The marker ``resume.<k>`` (``k``: one more than the run's last) is
        ``Resume(step=resume_step, time_ms=now, previous_status=...)`` (:meth:`_read_resume`),
        set with this process's tags. The run is set ``RUNNING`` for the resumed fit, which
        ends it ``FINISHED``, ``FAILED`` or ``KILLED``; the failure tag of an earlier attempt
        (:meth:`record_failure`) is removed. The spool of the run loses what the
        marker supersedes, so that it never holds two values for one (metric, step).
        """
        pending, self._pending_resume = self._pending_resume, None
        if pending is None:
            return
        index, previous = pending
        marker = Resume(int(self._resume_step or 0), now_ms(), previous)
        try:
            self._mlflow_client.update_run(str(self._run_id), status="RUNNING")
            if self._failure_tagged:  # the earlier attempt's cause no longer describes the run
                self._mlflow_client.delete_tag(str(self._run_id), FAILURE_TAG)
        except Exception:  # the store is away: the run's end is spooled as usual
            pass
        self._drop_superseded_spool(marker)
        self.set_tags({**process_tags(), f"{RESUME_TAG}{index}": marker.to_tag()})

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
        """The run folder (:attr:`local_run_dir`) as a string, where Lightning writes logs."""
        return str(self.local_run_dir)

    @property
    def spool_path(self) -> Path:
        """The run's spool file: records the tracking server could not take, for replay."""
        return self.local_run_dir / SPOOL_NAME

    # --- the spool ------------------------------------------------------------------------

    def _spool(self, record: dict[str, Any], error: BaseException) -> None:
        """Append a record (with run id, tracking URI and time) to the spool; warn once."""
        path = self.spool_path
        record = {"timestamp": now_ms(), **record}
        # Redacted: the spool never holds a password (sync-tracking takes it from the user).
        record.update(run_id=self._run_id, tracking_uri=redact_uri(self._tracking_uri))
        append_spool_record(path, record)
        if self.spooled == 0:
            message = redact_text(str(error), self._tracking_uri).strip().splitlines()
            cause = f"{type(error).__name__}: {message[0] if message else ''}"  # its first line
            self.first_failure = cause
            rank_zero_warn(
                f"MLflow tracking at {redact_uri(self._tracking_uri)} failed "
                f"({cause}). "
                f"Training goes on; what cannot be sent is kept in {path}. Replay it "
                f"with `{self.replay_command()}` once the cause is mended.",
                category=LightningLossesWarning,
            )
        self.spooled += 1

    # --- logging, each call falling back to the spool ----------------------------------------

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Queue metrics at ``step``; a background thread sends them (MLflow's ``log_batch``).

        The training loop never waits for the store: the values (with the time of this call)
        go to a queue whose worker sends everything queued in one ``log_batch`` (at most
        1,000 values), in order. What the store refuses is spooled (each (key, step) once).
        The queue is emptied at each checkpoint save, at :meth:`finalize` and at exit
        (:meth:`flush_metrics`). A value equal to one already queued for the same key at the
        same step (Lightning repeats ``epoch`` at the end of an epoch) is not sent again.
        """
        from mlflow.entities import Metric

        self._record_resume()  # a resumed fit's first metric: the resume is under way
        step = int(step or 0)
        if step != self._queued_step:
            self._queued_step, self._queued_values = step, {}
        timestamp = now_ms()
        batch = []
        for key, value in metrics.items():
            if isinstance(value, str):
                rank_zero_warn(
                    f"MLflow takes numbers only: metric {key}={value!r} is not logged.",
                    category=LightningLossesWarning,
                )
                continue
            key, value = _metric_key(key), float(value)
            if self._queued_values.get(key) == value:
                continue
            self._queued_values[key] = value
            batch.append(Metric(key=key, value=value, timestamp=timestamp, step=step))
        if not batch:
            return
        try:
            _ = self.run_id  # the run exists before its first metric is queued
        except Exception as error:
            self._spool_metrics(batch, error)
            return
        self._metric_sender.submit(batch)

    def flush_metrics(self, timeout: float | None = None) -> bool:
        """Wait until every metric logged so far is in the store or the spool.

        Args:
            timeout: seconds to wait at most; ``None`` waits as long as it takes.

        Returns:
            Whether nothing is left queued.
        """
        return self._metric_sender.flush(timeout)

    def _send_metrics(self, batch: list[Any]) -> None:
        """Send one batch of ``mlflow.entities.Metric`` (the worker thread's call)."""
        self._mlflow_client.log_batch(str(self._run_id), metrics=batch)

    def _spool_metrics(self, batch: list[Any], error: BaseException) -> None:
        """Spool a batch the store refused: one record per logging call, each (key, step) once.

        Each record keeps the time of its :meth:`log_metrics` call.
        """
        calls: dict[tuple[int, int], dict[str, float]] = {}
        for metric in batch:
            if (metric.key, metric.step) not in self._spooled_steps:
                self._spooled_steps.add((metric.key, metric.step))
                calls.setdefault((metric.step, metric.timestamp), {})[metric.key] = metric.value
        for (step, timestamp), values in calls.items():
            record = {"kind": "metrics", "metrics": values, "step": step}
            self._spool({**record, "timestamp": timestamp}, error)

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
        """Log already-flat params (values cut to MLflow's 6,000 characters, secrets redacted)."""
        from mlflow.entities import Param

        params = {k: redact_text(str(v), self._tracking_uri) for k, v in params.items()}
        try:
            # A resumed run keeps the params it has (MLflow refuses to change a param's value).
            existing = self.experiment.get_run(self.run_id).data.params
            items = [Param(k, v[:6000]) for k, v in params.items() if k not in existing]
            for start in range(0, len(items), 100):
                self.experiment.log_batch(self.run_id, params=items[start : start + 100])
        except Exception as error:
            self._spool({"kind": "params", "params": dict(params)}, error)

    @rank_zero_only
    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set the run's tags (secrets redacted; spooled if the server fails)."""
        tags = {k: redact_text(str(v), self._tracking_uri) for k, v in tags.items()}
        try:
            for key, value in tags.items():
                self.experiment.set_tag(self.run_id, key, value)
        except Exception as error:
            self._spool({"kind": "tags", "tags": {k: str(v) for k, v in tags.items()}}, error)

    @rank_zero_only
    def record_failure(self, cause: str) -> None:
        """Tag the run with why it fails (:data:`FAILURE_TAG`), before :meth:`finalize` ends it.

        Only a run that has started is tagged: a fit that fails before its first use of the
        store (a bad option, a refused resume) creates no run for it. The cause is one line,
        cut to MLflow's 5,000 characters of a tag value.
        """
        if self._initialized and self._pending_resume is None:
            self.set_tags({FAILURE_TAG: " ".join(cause.split())[:5000]})

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
        """Flush the metrics and remember which checkpoint callback's best model to log.

        Lightning calls this after every save; the first callback that tracks a best model is
        kept (one with a monitor: the config's first, ``trainer.checkpoint_callback``), not
        ``LastCheckpoint`` nor a monitor-less or later one a user added.
        """
        self._record_resume()
        self._metric_sender.flush()  # a checkpoint's metrics are in the store (or spool) first
        kept = self._checkpoint_callback
        if kept is None or (
            getattr(checkpoint_callback, "monitor", None) and not getattr(kept, "monitor", None)
        ):
            self._checkpoint_callback = checkpoint_callback

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """End the run: ``success``/``finished``: FINISHED, ``killed``: KILLED, else FAILED.

        ``killed`` (:class:`~lightning_losses.callbacks.preemption.Preemption`, at SIGTERM) is
        final: Lightning's ``failed`` that follows it leaves the run KILLED. A resumed fit that
        fails before recording its resume (:meth:`_start_run`) leaves the run as it was, with a
        warning naming its status.
        """
        if not self._initialized or self._ended_killed:
            return
        if status == "failed" and self._pending_resume is not None:
            self._pending_resume = None
            try:
                kept = (
                    f"keeps its status {self._mlflow_client.get_run(str(self._run_id)).info.status}"
                )
            except Exception:  # the store is away: nothing was changed there either
                kept = "is left as it was"
            rank_zero_warn(
                f"The resume of MLflow run {self._run_id} failed before its first step; the run "
                f"{kept}.",
                category=LightningLossesWarning,
            )
            return
        self._record_resume()
        self._metric_sender.close()  # every metric is in the store or the spool before the end
        callback = self._checkpoint_callback
        best = getattr(callback, "best_model_path", "") if callback is not None else ""
        if self._log_best_checkpoint and best and Path(best).exists():
            self.log_file(best, artifact_path="checkpoints", link=True)
        mlflow_status = {"success": "FINISHED", "finished": "FINISHED", "killed": "KILLED"}.get(
            status, "FAILED"
        )
        self._ended_killed = mlflow_status == "KILLED"
        try:
            self.experiment.set_terminated(self.run_id, mlflow_status)
        except Exception as error:
            self._spool({"kind": "terminate", "status": mlflow_status}, error)
        if self.spooled:
            rank_zero_warn(
                f"{self.spooled} tracking calls were not recorded in "
                f"{redact_uri(self._tracking_uri)} (the first failure: {self.first_failure}); "
                f"they are in {self.spool_path}: `{self.replay_command()}` replays them once "
                "the cause is mended (credentials from the environment)",
                category=LightningLossesWarning,
            )

    def replay_command(self) -> str:
        """``lightning-losses sync-tracking <spool> --tracking-uri <this store, no secrets>``."""
        store = without_redacted(redact_uri(self._tracking_uri))
        return f"lightning-losses sync-tracking {self.spool_path} --tracking-uri {store}"


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
