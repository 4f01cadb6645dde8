"""``lightning-losses sync-tracking``: replay of spools into the store once it is back."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

from lightning_losses.tracking.constants import SPOOL_NAME, SYNCED_SUFFIX
from lightning_losses.tracking.history import Resume, _marker_tags
from lightning_losses.tracking.process import process_is_gone
from lightning_losses.tracking.spool import SpoolLine, _join, _locked, _rewrite, read_spool
from lightning_losses.tracking.uri import fail_fast_http, resolve_tracking_uri

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
    from lightning_losses.commands import sync_tracking_parser

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
    from lightning_losses.commands import PROG

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
