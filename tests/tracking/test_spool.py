"""The tracking spool and its replay (`lightning-losses sync-tracking`) on real SQLite stores.

Spool lines are written here as the documented format says (one JSON record per line, ended by a
newline); the expected store content is read back with a plain ``MlflowClient``.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers.paths import SCRIPT
from mlflow.tracking import MlflowClient

from lightning_losses.tracking import (
    SPOOL_NAME,
    Resume,
    TrackingLogger,
    append_spool_record,
    read_spool,
    resume_markers,
    sync_tracking,
)

T0 = 1_700_000_000_000  # timestamps of the records, in ms


pytestmark = pytest.mark.usefixtures("isolated_tracking")


@pytest.fixture
def store(tmp_path) -> tuple[str, MlflowClient, str]:
    """A SQLite store with one RUNNING run: (uri, client, run id)."""
    uri = f"sqlite:///{tmp_path}/store.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("spool", artifact_location=(tmp_path / "a").as_uri())
    return uri, client, client.create_run(experiment).info.run_id


def metrics_line(uri: str, run_id: str, step: int, value: float, timestamp: int) -> str:
    """One spool line holding the metric ``a`` at ``step``."""
    record = {"kind": "metrics", "metrics": {"a": value}, "step": step, "timestamp": timestamp}
    return json.dumps({**record, "run_id": run_id, "tracking_uri": uri})


def history(client: MlflowClient, run_id: str, key: str = "a") -> list[tuple[int, float]]:
    """The raw MLflow history of ``key``: (step, value) in step order."""
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def sync_script(*args: str) -> subprocess.CompletedProcess:
    """`lightning-losses sync-tracking ARGS` as a console script."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [str(SCRIPT), "sync-tracking", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_damaged_spool_replays_every_valid_record_and_keeps_the_bad_lines(store, tmp_path):
    uri, client, run_id = store
    tags = {"kind": "tags", "tags": {"note": "kept"}, "timestamp": T0 + 3}
    bad = "{this is not json"
    cut = metrics_line(uri, run_id, 3, 3.0, T0 + 4)[:40]  # a write cut off by a kill
    lines = [
        metrics_line(uri, run_id, 0, 0.5, T0),
        bad,
        metrics_line(uri, run_id, 1, 0.25, T0 + 1),
        json.dumps({**tags, "run_id": run_id, "tracking_uri": uri}),
    ]
    spool = tmp_path / SPOOL_NAME
    spool.write_text("\n".join(lines) + "\n" + cut)

    done = sync_script(str(spool))
    assert done.returncode == 1
    assert "line 2: not a JSON record" in done.stderr
    assert "line 5: cut off" in done.stderr
    assert "line 1:" not in done.stderr
    assert "line 3:" not in done.stderr
    assert history(client, run_id) == [(0, 0.5), (1, 0.25)]
    assert client.get_run(run_id).data.tags["note"] == "kept"
    assert spool.read_text() == bad + "\n" + cut  # the lines not replayed, byte for byte
    journal = spool.with_name(SPOOL_NAME + ".synced").read_text().splitlines()
    assert journal == [lines[0], lines[2], lines[3]]

    again = sync_script(str(spool))  # still damaged: named again, nothing written twice
    assert again.returncode == 1
    assert "line 1: not a JSON record" in again.stderr
    assert history(client, run_id) == [(0, 0.5), (1, 0.25)]


@pytest.mark.slow
def test_sync_of_a_folder_without_a_spool_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    done = sync_script(str(tmp_path / "empty"))
    assert done.returncode != 0
    assert f"no tracking spool ({SPOOL_NAME}) under {tmp_path / 'empty'}" in done.stderr


@pytest.mark.slow
def test_a_replay_run_twice_writes_nothing_twice(store, tmp_path):
    uri, client, run_id = store
    spool = tmp_path / SPOOL_NAME
    text = "".join(metrics_line(uri, run_id, s, 0.1 * s, T0 + s) + "\n" for s in range(3))
    spool.write_text(text)
    assert sync_tracking(spool) == {"metrics": 3}
    assert not spool.exists()
    spool.write_text(text)  # as if the first replay was killed before it removed the spool
    assert sync_tracking(spool) == {"metrics": 3, "skipped": 3}
    assert history(client, run_id) == [(0, 0.0), (1, 0.1), (2, 0.2)]


@pytest.mark.slow
def test_a_replay_skips_what_a_resume_superseded(store, tmp_path):
    uri, client, run_id = store
    resume = Resume(step=2, time_ms=T0 + 100, previous_status="KILLED")
    client.set_tag(run_id, "resume.1", resume.to_tag())
    end = {"kind": "terminate", "status": "FAILED", "timestamp": T0 + 50}
    lines = [
        metrics_line(uri, run_id, 1, 0.1, T0 + 10),  # before the checkpoint: kept
        metrics_line(uri, run_id, 3, 0.9, T0 + 30),  # abandoned attempt: superseded
        json.dumps({**end, "run_id": run_id, "tracking_uri": uri}),  # reopened by the resume
        metrics_line(uri, run_id, 3, 0.3, T0 + 200),  # the resumed fit's step 3
    ]
    spool = tmp_path / SPOOL_NAME
    spool.write_text("\n".join(lines) + "\n")
    assert sync_tracking(spool) == {"metrics": 3, "terminate": 1, "skipped": 2}
    assert history(client, run_id) == [(1, 0.1), (3, 0.3)]
    assert client.get_run(run_id).info.status == "RUNNING"


def test_a_record_after_a_cut_line_starts_a_line_of_its_own(tmp_path):
    spool = tmp_path / SPOOL_NAME
    spool.write_bytes(b'{"kind": "metrics", "met')  # a kill cut this write
    append_spool_record(spool, {"kind": "tags", "run_id": "r", "tags": {"k": "v"}})
    first, second = read_spool(spool.read_bytes())
    assert (first.number, first.record) == (1, None)
    assert (second.number, second.record) == (
        2,
        {"kind": "tags", "run_id": "r", "tags": {"k": "v"}},
    )
    assert spool.read_bytes().endswith(b"\n")


@pytest.mark.slow
def test_resuming_logger_marks_a_running_run_killed_and_cuts_its_spool(store, tmp_path):
    uri, client, run_id = store  # RUNNING: its process died without ending it
    experiment_id = client.get_run(run_id).info.experiment_id
    spool = tmp_path / "runs" / experiment_id / run_id / SPOOL_NAME
    end = {"kind": "terminate", "status": "FAILED", "timestamp": T0 + 9}
    lines = [
        metrics_line(uri, run_id, 1, 0.1, T0 + 1),
        metrics_line(uri, run_id, 3, 0.3, T0 + 3),
        json.dumps({**end, "run_id": run_id, "tracking_uri": uri}),
    ]
    spool.parent.mkdir(parents=True)
    spool.write_text("\n".join(lines) + "\n")

    logger = TrackingLogger(tracking_uri=uri, save_dir="runs", run_id=run_id, resume_step=2)
    assert logger.spool_path == spool
    logger.log_metrics({"resumed": 0.5}, step=2)  # its first metric records the resume
    run = client.get_run(run_id)
    [marker] = resume_markers(run.data.tags)
    assert (marker.step, marker.previous_status) == (2, "KILLED")
    assert run.info.status == "RUNNING"  # for the resumed fit
    assert spool.read_text() == lines[0] + "\n"  # the step-3 metric and the old end are gone
