"""Shared pytest settings for the loss tests.

Hypothesis runs a bounded, derandomized number of examples without a deadline (the first call
of a torch op can be slow), so the suite is reproducible and stays inside its time budget.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator

import pytest
import torch
from helpers.server import Server
from hypothesis import HealthCheck, settings

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
# worker's (and against any other load), which makes small ops 10-50x slower.
torch.set_num_threads(1)


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
