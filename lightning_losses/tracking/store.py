"""The local SQLite store: its file, a lock around its creation, the clock in milliseconds."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


def now_ms() -> int:
    """Milliseconds since the epoch: the clock of MLflow metric timestamps and resume markers."""
    return int(time.time() * 1000)


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
