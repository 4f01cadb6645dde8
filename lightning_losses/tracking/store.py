"""The local SQLite store: its file, a lock around its creation, who may touch it, the clock.

Only global rank 0 of a distributed fit touches the store (:func:`global_rank_zero`): the
other processes, on this node or on others, create no database and open no connection to it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
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


#: The variables that launchers set to give a process its rank, read before Lightning's Trainer
#: exists: ``RANK`` and ``LOCAL_RANK`` (torchrun, Lightning's own launcher for the processes it
#: starts), ``NODE_RANK`` (Lightning, one command per node), ``GROUP_RANK`` (torchrun's node
#: rank), ``SLURM_PROCID`` (SLURM's ``srun``) and ``JSM_NAMESPACE_RANK`` (LSF's ``jsrun``).
RANK_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "SLURM_PROCID",
    "JSM_NAMESPACE_RANK",
)

#: The address given to MLflow's client in a process that is not global rank 0. That client is
#: never used (Lightning's loggers log from rank 0 only), and building one for an ``http`` URI
#: reads and writes nothing, where one for ``sqlite:///`` creates the database and its tables.
#: ``.invalid`` is a top-level domain that never resolves (RFC 2606).
NOT_RANK_ZERO_URI = "http://not-global-rank-zero.invalid"


def global_rank_zero(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is global rank 0 of its fit, as its launcher's environment says.

    A logger is built before Lightning's Trainer, so before Lightning knows the process's rank
    (LightningCLI builds it from the Trainer's arguments): on node 1 of a multi-node fit
    launched with ``NODE_RANK=1``, the first process has neither ``RANK`` nor ``LOCAL_RANK``
    yet and Lightning's ``rank_zero_only.rank`` still says 0. A process is global rank 0 when
    each of :data:`RANK_VARIABLES` is unset, empty or 0; only that process creates or opens
    the store.

    Args:
        environ: the environment to read (default ``os.environ``).

    Raises:
        ValueError: a rank variable that is not an integer (the message names it).

    Example:
        >>> global_rank_zero({})
        True
        >>> global_rank_zero({"NODE_RANK": "0", "LOCAL_RANK": "0"})
        True
        >>> global_rank_zero({"NODE_RANK": "1"}), global_rank_zero({"LOCAL_RANK": "1"})
        (False, False)
    """
    environ = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        value = (environ.get(name) or "").strip()
        if not value:
            continue
        try:
            rank = int(value)
        except ValueError:
            raise ValueError(
                f"the environment variable {name} must be an integer rank (0 on the first "
                f"node or process); got {value!r}: set it to the rank, or unset it"
            ) from None
        if rank != 0:
            return False
    return True


def client_uri(tracking_uri: str, environ: Mapping[str, str] | None = None) -> str:
    """The URI to build this process's MLflow client with: the store's on global rank 0 only.

    Other processes get :data:`NOT_RANK_ZERO_URI`, for which MLflow's client touches nothing,
    so that no node but node 0 creates a ``mlflow.db`` (nor opens one on a shared disk).

    Example:
        >>> client_uri("sqlite:////tmp/mlflow.db", {})
        'sqlite:////tmp/mlflow.db'
        >>> client_uri("sqlite:////tmp/mlflow.db", {"NODE_RANK": "1"})
        'http://not-global-rank-zero.invalid'
    """
    return tracking_uri if global_rank_zero(environ) else NOT_RANK_ZERO_URI
