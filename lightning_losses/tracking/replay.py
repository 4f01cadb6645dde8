"""``lightning-losses sync-tracking``: replay of spools into the store once it is back.

A spool is a file that anyone able to write the run's folder could have written, so its lines
are not obeyed blindly: a spool is replayed into one store, which its lines may only repeat,
for one run, and uploads only files inside the run's folder (see :func:`sync_tracking`).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

from lightning_losses.tracking.constants import SPOOL_NAME, SYNCED_SUFFIX
from lightning_losses.tracking.history import Resume, _marker_tags
from lightning_losses.tracking.process import process_is_gone
from lightning_losses.tracking.spool import _locked, copy_bytes, iter_spool
from lightning_losses.tracking.uri import (
    SQLITE_PREFIX,
    fail_fast_http,
    resolve_tracking_uri,
    store_key,
)

# --- which store, which run, which files ----------------------------------------------------

#: Tables every MLflow SQLite store has (a SQLite file without them is not a store).
_MLFLOW_TABLES = {"experiments", "runs", "metrics", "alembic_version"}


class SpoolReplayError(RuntimeError):
    """A spool was not replayed whole: some lines, or all of them (its store was refused).

    Attributes:
        done: what was replayed, counted per kind.
        problems: why each line that was not replayed was not, by line number (empty when the
            whole spool was refused).
    """

    def __init__(
        self, message: str, done: dict[str, int], problems: Mapping[int, str] | None = None
    ) -> None:
        super().__init__(message)
        self.done = done
        self.problems = dict(problems or {})


class _Refused(Exception):
    """A spool line that is not replayed, for the reason its message gives."""


def _one_line(text: str, most: int = 300) -> str:
    """``text`` on one line, at most ``most`` characters (spool content may hold newlines)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= most else flat[: most - 3] + "..."


def _is_mlflow_sqlite(key: str) -> bool:
    """Whether the store key ``sqlite:///<path>`` names an existing MLflow SQLite store.

    The file is opened read-only: nothing is created or changed.
    """
    path = Path(key[len(SQLITE_PREFIX) :])
    if not key.startswith(SQLITE_PREFIX) or not path.is_absolute() or not path.is_file():
        return False
    try:
        with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.Error:
        return False
    return _MLFLOW_TABLES <= {name for (name,) in rows}


def _artifact_source(record: Mapping[str, Any], folder: Path) -> Path:
    """The file an ``artifact`` record names, resolved, if it lies inside the run's ``folder``.

    A relative path is taken from the folder. Symbolic links and ``..`` are resolved first, so
    neither leads out of it.

    Raises:
        _Refused: the path is not a string, or leads outside ``folder``, or to no regular file.
    """
    path = record.get("path")
    if not isinstance(path, str) or not path or "\0" in path:
        raise _Refused(f"its artifact 'path' is not a file name ({path!r:.100})")
    real = Path(os.path.realpath(folder / path))  # an absolute path replaces the folder
    if not real.is_relative_to(folder):
        raise _Refused(f"artifact {path!r:.200} is outside the run's folder {folder}")
    if not real.is_file():
        raise _Refused(f"artifact {path!r:.200} is not a file in the run's folder {folder}")
    return real


def _artifact_folder(record: Mapping[str, Any]) -> str | None:
    """The record's ``artifact_path``: ``None`` or a relative folder without ``..``.

    Raises:
        _Refused: anything else (an absolute folder or ``..`` could write outside the run's
            artifacts in a local artifact store).
    """
    value = record.get("artifact_path")
    if value is None or value == "":
        return None
    parts = value.split("/") if isinstance(value, str) else []
    bad = not parts or value.startswith("/") or any(c in value for c in "\\:\0")
    if bad or any(part in ("", ".", "..") for part in parts):
        raise _Refused(f"artifact folder {value!r:.200} is not a plain relative folder")
    return value


@dataclass
class _Survey:
    """What a spool is about, from a first read: its run, its store, its resume markers.

    Attributes:
        run_id: the run of the spool's first record; lines of another run are refused.
        store: the tracking URI of the first record of that run that names one (the logger
            records its store in every record); lines naming another store are refused.
        markers: the resume markers in the spool's ``tags`` records of that run and store.
    """

    run_id: str | None = None
    store: str | None = None
    markers: dict[int, Resume] = field(default_factory=dict)

    def add(self, record: Mapping[str, Any]) -> None:
        """Take one valid record into account (in file order)."""
        self.run_id = self.run_id or record["run_id"]
        if record["run_id"] == self.run_id:
            self.store = self.store or record.get("tracking_uri")
        tags = record.get("tags")
        if record["kind"] == "tags" and isinstance(tags, dict) and self.refusal(record) is None:
            self.markers.update(_marker_tags(tags))

    def refusal(self, record: Mapping[str, Any]) -> str | None:
        """Why a record is not replayed because of its run or its store, or ``None``."""
        if record["run_id"] != self.run_id:
            return f"belongs to run {record['run_id']!r:.100}, not this spool's run {self.run_id}"
        uri = record.get("tracking_uri")
        if uri and uri != self.store and store_key(uri) != store_key(self.store or ""):
            ours = store_key(self.store or "")
            return f"names the store {store_key(uri)}, not this spool's {ours}"
        return None


def _target(path: Path, survey: _Survey, tracking_uri: str | None) -> str:
    """The one store a spool is replayed into.

    ``tracking_uri`` when given; else the spool's recorded store (the default store when it
    records none) when it is the default store (``$MLFLOW_TRACKING_URI`` or
    ``sqlite:///mlflow.db``, whose credentials then come from the environment) or an existing
    MLflow SQLite file; a SQLite store is never created.

    Raises:
        SpoolReplayError: no store given and the recorded one is neither (nothing is sent to
            it, no file is created).
    """
    if tracking_uri is not None:
        return resolve_tracking_uri(tracking_uri)
    default = resolve_tracking_uri()
    key = store_key(survey.store or default)
    if key.startswith(SQLITE_PREFIX) and not _is_mlflow_sqlite(key):
        reason = "is not an existing MLflow SQLite store"
    elif key == store_key(default):
        return default  # as the user wrote it: credentials, options
    elif key.startswith(SQLITE_PREFIX):
        return key
    else:
        reason = f"is neither --tracking-uri nor the default store ({store_key(default)})"
    raise SpoolReplayError(
        f"not replayed: its store, {key}, {reason}; nothing was sent and no file was created. "
        f"If the run is in a store of yours, name it with --tracking-uri URI",
        {},
    )


# --- replay -------------------------------------------------------------------------------


def _attempt(resumes: Sequence[Resume], timestamp: int) -> int:
    """Which attempt of a run logged at ``timestamp``: the number of resumes before it."""
    return sum(1 for resume in resumes if resume.time_ms <= timestamp)


class _Replay:
    """Replays one spool's records into one store, never writing a (metric, step) twice.

    Args:
        tracking_uri: the store (see :func:`_target`).
        survey: the spool's run, store and resume markers; records of another run or store
            are refused.
        folder: the run's folder (resolved); artifacts must lie inside it.
    """

    def __init__(self, tracking_uri: str, survey: _Survey, folder: Path) -> None:
        self.tracking_uri = tracking_uri
        self.survey = survey
        self.folder = folder
        self._client: MlflowClient | None = None
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

    @property
    def client(self) -> MlflowClient:
        """The store's client, made at the first record replayed."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(self.tracking_uri)
        return self._client

    def count(self, what: str, n: int = 1) -> None:
        self.done[what] = self.done.get(what, 0) + n

    def apply(self, record: Mapping[str, Any]) -> None:
        """Replay one record.

        Raises:
            _Refused: the record is of another run or store, or names a file it may not.
            Exception: what MLflow raises.
        """
        refusal = self.survey.refusal(record)
        if refusal is not None:
            raise _Refused(refusal)
        run_id = record["run_id"]
        if "timestamp" in record:
            self.last_time[run_id] = max(self.last_time.get(run_id, 0), int(record["timestamp"]))
        self.handlers[record["kind"]](self.client, run_id, record)
        self.count(record["kind"])

    def resumes(self, client: MlflowClient, run_id: str) -> list[Resume]:
        """The run's resume markers: its tags' and the spool's, oldest first."""
        if run_id not in self.markers:
            found = _marker_tags(client.get_run(run_id).data.tags)
            found.update(self.survey.markers)
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
        """Upload the file, if it lies inside the run's folder (checked right before)."""
        folder = _artifact_folder(record)
        source = _artifact_source(record, self.folder)
        client.log_artifact(run_id, str(source), artifact_path=folder)

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
        """Set ``KILLED`` the spool's run if it is still ``RUNNING`` and its process is gone.

        The end time is the last time the spool recorded for the run. A run that cannot be
        read is left as it is (its records failed already); so is a run none of whose
        records was replayed or tried.
        """
        run_id = self.survey.run_id
        if self._client is None or run_id is None:
            return
        try:
            run = self._client.get_run(run_id)
            if run.info.status == "RUNNING" and process_is_gone(run.data.tags):
                self._client.set_terminated(run_id, "KILLED", end_time=self.last_time.get(run_id))
                self.count("killed")
        except Exception:
            return


class _Ranges(list[tuple[int, int]]):
    """Byte ranges ``(start, size)`` of spool lines, neighbours merged (memory stays small)."""

    def add(self, start: int, size: int) -> None:
        if self and self[-1][0] + self[-1][1] == start:
            self[-1] = (self[-1][0], self[-1][1] + size)
        else:
            self.append((start, size))

    def copy_bytes(self, source: IO[bytes], target: IO[bytes]) -> None:
        """Copy these ranges of ``source`` to ``target``, in order (not ``list.copy``)."""
        for start, size in self:
            copy_bytes(source, target, start, size)


def _prefix_digest(handle: IO[bytes], size: int) -> bytes:
    """The SHA-256 of the first ``size`` bytes of an open file."""
    digest = hashlib.sha256()
    handle.seek(0)
    while size > 0 and (chunk := handle.read(min(size, 1 << 16))):
        digest.update(chunk)
        size -= len(chunk)
    return digest.digest()


def _append_journal(path: Path, source: IO[bytes], replayed: _Ranges) -> None:
    """Append the replayed lines to ``<spool>.synced`` (never through a symbolic link)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(path.with_name(path.name + SYNCED_SUFFIX), flags, 0o666), "ab") as out:
        replayed.copy_bytes(source, out)
        out.flush()
        os.fsync(out.fileno())


def _settle(path: Path, seen: int, digest: bytes, kept: _Ranges, replayed: _Ranges) -> None:
    """Journal the replayed lines; leave the others, and lines appended since, in the spool.

    Under the spool's lock: the replayed lines are appended to ``<name>.synced``; the spool
    is replaced by a file holding the lines kept (damaged ones byte for byte) and whatever a
    live logger appended while the replay ran, with the spool's permissions, or removed when
    nothing is left. A spool whose first ``seen`` bytes changed meanwhile (a resume cut it,
    another replay settled it) is left as it is: a later replay skips what this one wrote.
    """
    with _locked(path, "r+b") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < seen or _prefix_digest(handle, seen) != digest:
            return
        if replayed:
            _append_journal(path, handle, replayed)
        if not kept and size == seen:
            path.unlink()
            return
        kept.add(seen, size - seen)  # what was appended since
        descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(descriptor, "wb") as out:
                kept.copy_bytes(handle, out)
                out.flush()
                os.fchmod(out.fileno(), stat.S_IMODE(os.fstat(handle.fileno()).st_mode))
                os.fsync(out.fileno())
            os.replace(name, path)  # a writer waiting for the lock then opens the new file
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise


def _problems_text(path: Path, problems: Mapping[int, str], replayed: int, total: int) -> str:
    """The message of a partial replay: a summary line, then each line not replayed and why."""
    listing = "".join(f"\nline {number}: {problems[number]}" for number in sorted(problems))
    return (
        f"replayed {replayed} of {total} lines; {len(problems)} not replayed, kept in {path}"
        f"{listing}"
    )


def sync_tracking(path: str | Path, tracking_uri: str | None = None) -> dict[str, int]:
    """Replay a spool file into MLflow; returns how many records of each kind were replayed.

    - The spool is replayed into one store: ``tracking_uri`` when given; else the store its
      records name, when that is the default store (``$MLFLOW_TRACKING_URI``, else
      ``sqlite:///mlflow.db``) or an existing MLflow SQLite file; else nothing is replayed
      (:class:`SpoolReplayError`: no request is sent, no file is created). Stores are
      compared by :func:`store_key` (without user info or query).
    - Lines are refused (kept, named) when their run is not the run of the spool's first
      record, or their store not the store of the first record that names one, or, for an
      ``artifact``, when the file (symbolic links and ``..`` resolved; relative paths taken
      from the spool's folder) lies outside the folder holding the spool, or the artifact
      folder is absolute or holds ``..``. Lines over 1 MiB are refused unread.
    - Every valid line is replayed, in order, even when others are damaged (a line cut off
      by a kill, one that is not a JSON record or not UTF-8) or fail to replay.
    - Nothing is written twice: a metric entry is skipped (counted as ``skipped``) when the
      store already holds its (key, step) from the same or a later attempt of the run (a
      replay interrupted and run again) or when a resume marker supersedes it; a run end
      that a later resume reopened is skipped too.
    - The spool's run, if still ``RUNNING`` afterwards and its process (tags
      ``tracking.host``, ``tracking.pid``) ran on this host and is gone, is set ``KILLED``
      (counted as ``killed``).
    - The replayed lines are appended to ``<name>.synced``. The spool keeps the lines not
      replayed (and any appended meanwhile by a running logger), or is removed when none
      are left.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        SpoolReplayError: some lines were not replayed (the message names each by its line
            number, one line each, and says why; they remain in the spool, the others were
            replayed), or none was (the spool's store is refused, or ``path`` is a symbolic
            link).
    """
    fail_fast_http()
    path = Path(path)
    if path.is_symlink():
        raise SpoolReplayError(
            f"not replayed: {path} is a symbolic link; replay the file it points to", {}
        )
    if not path.is_file():
        raise FileNotFoundError(f"spool file {path} does not exist")
    with _locked(path, "r+b") as handle:  # where the records end: no append under way
        reader = path.open("rb")  # the locked file: replacing it takes the lock
        end = os.fstat(handle.fileno()).st_size
    with reader:
        survey = _Survey()
        for line in iter_spool(reader, end):
            if line.record is not None:
                survey.add(line.record)
        target = _target(path, survey, tracking_uri) if survey.run_id is not None else ""
        replay = _Replay(target, survey, Path(os.path.realpath(path.parent)))
        problems: dict[int, str] = {}
        kept, replayed, total = _Ranges(), _Ranges(), 0
        digest = hashlib.sha256()
        for line in iter_spool(reader, end, digest):
            total += 1
            problem = line.problem
            if problem is None:
                problem = _replay_line(replay, line.record or {})
            if problem is None:
                replayed.add(line.start, line.size)
            else:
                problems[line.number] = problem
                kept.add(line.start, line.size)
        replay.mark_killed()
        _settle(path, end, digest.digest(), kept, replayed)
    if problems:
        text = _problems_text(path, problems, total - len(problems), total)
        raise SpoolReplayError(text, replay.done, problems)
    return replay.done


def _replay_line(replay: _Replay, record: Mapping[str, Any]) -> str | None:
    """Replay one record; ``None``, or why it was refused or failed (on one line)."""
    try:
        replay.apply(record)
    except _Refused as refusal:
        return f"refused: {_one_line(str(refusal))}"
    except Exception as error:
        return f"replay failed ({type(error).__name__}: {_one_line(str(error))})"
    return None


def spools_in(given: Path) -> list[Path]:
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


def replay_summary(done: Mapping[str, int]) -> str:
    """``'3 metrics, 1 tags'``-style text of replay counts."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(done.items())) or "nothing"
