"""The logger's warnings name the real cause of a failed tracking call and the replay command.

A SQLite store on a "full disk" (a real file-size limit, ``RLIMIT_FSIZE``, in a child process,
with ``SIGXFSZ`` ignored so that writes fail with ``EFBIG``): the metrics that cannot be
written go to the spool, and both warnings (the first failure and the closing one) say what
failed (SQLite's "disk I/O error" on ``EFBIG``), not that a server "could not be reached", and
give the ``sync-tracking`` command with the store named.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

CHILD = textwrap.dedent(
    """
    import os, resource, signal, sys, warnings
    from lightning_losses.tracking import TrackingLogger
    uri = "sqlite:///" + os.path.abspath("store.db")
    logger = TrackingLogger(tracking_uri=uri, experiment_name="full-disk", save_dir="runs")
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"warm": 1.0}, step=0)
    logger.flush_metrics()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    size = sum(os.path.getsize(f) for f in os.listdir(".") if f.startswith("store.db"))
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 3000):
            logger.log_metrics({"a": float(step), "b": step / 7.0, "c": step / 3.0}, step=step)
        logger.finalize("success")
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    import json
    print(json.dumps({"warnings": [str(w.message) for w in caught], "spooled": logger.spooled,
                      "uri": uri, "spool": str(logger.spool_path)}))
    """
)


def test_a_full_disk_is_named_in_both_warnings_with_the_replay_command(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["spooled"] > 0
    tracking = [w for w in report["warnings"] if "tracking" in w]
    first, last = tracking[0], tracking[-1]
    cause = "(sqlite3.OperationalError) disk I/O error"
    assert cause in first
    assert "could not reach" not in first
    assert "(the first failure: MlflowException: " + cause in last
    assert "could not reach" not in last
    assert "\n" not in first
    assert "\n" not in last  # one line each
    command = f"lightning-losses sync-tracking {report['spool']} --tracking-uri {report['uri']}"
    assert command in first
    assert command in last
