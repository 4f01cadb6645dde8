"""Shared pytest settings for the loss tests.

Hypothesis runs a bounded, derandomized number of examples without a deadline (the first call
of a torch op can be slow), so the suite is reproducible and stays inside its time budget.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from collections.abc import Iterator

import pytest
import torch
from helpers.server import Server
from hypothesis import HealthCheck, settings

# New SQLite MLflow stores are filled from one store MLflow migrated once (see
# helpers/store_template): here, and in every subprocess through its sitecustomize.py.
STORE_TEMPLATE = os.path.join(os.path.dirname(__file__), "helpers", "store_template")
sys.path.insert(0, STORE_TEMPLATE)
import mlflow_store_template  # noqa: E402

mlflow_store_template.install()
if STORE_TEMPLATE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (STORE_TEMPLATE, os.environ.get("PYTHONPATH")) if p
    )

settings.register_profile(
    "losses",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.load_profile("losses")


def drop_hypothesis_gc_callback() -> None:
    """Remove the garbage-collector callback Hypothesis installs to time collections.

    Hypothesis' engine inserts ``gc_callback`` (``hypothesis.internal.conjecture.junkdrawer``) in
    ``gc.callbacks`` on its first test and never removes it. At interpreter exit the module's
    globals are torn down while collections still run, and the callback then fails on each of
    them (``TypeError: 'NoneType' object is not callable``), which Python prints as an
    "Exception ignored in" traceback after a passing run. ``atexit`` handlers run before that
    teardown, while the callback is no longer needed.
    """
    gc.callbacks[:] = [
        callback
        for callback in gc.callbacks
        if getattr(callback, "__module__", None) != "hypothesis.internal.conjecture.junkdrawer"
    ]


atexit.register(drop_hypothesis_gc_callback)

# The tests use tiny tensors and run as two xdist workers on two cores (`make test`). With the
# default of one intra-op thread per core, each worker's OpenMP threads spin against the other
# workers' (and against any other load), which makes small ops 10-50x slower.
torch.set_num_threads(1)
# The same in every process the tests start (fits, DDP ranks, servers): one thread each, as the
# workers, instead of two OpenMP threads per process spinning against the other worker's.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"


@pytest.fixture
def isolated_tracking(tmp_path, monkeypatch):
    """Run in ``tmp_path`` with no inherited MLflow store and an HTTP client that fails fast."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[Server]:
    """A real ``mlflow server`` (SQLite store) on 127.0.0.1, shared by the tests of a module."""
    with Server(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the files that hold slow tests first, each file's tests still together and in order.

    ``make test`` spreads the tests over workers that steal from each other's queues: what
    runs last decides when the suite ends. With the minute-long tests (subprocess fits, DDP, the
    README's commands) first, the last in the queues are the sub-second ones, and neither core
    waits long for the other at the end.
    """
    slow_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)
