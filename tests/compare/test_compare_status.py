"""``compare --status``: runs of any status can be listed, and the listing says what it skipped.

A real SQLite store holds runs ended with each MLflow status (two FINISHED, one RUNNING, one
KILLED, two FAILED). The expected listings and skip counts are read off the statuses the
fixture set, not from the code under test.
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from lightning_losses import compare
from lightning_losses.compare import cli as compare_cli
from lightning_losses.compare import query

EXPERIMENT = "status-test"
#: run name -> the status it ends with (None: left RUNNING).
RUNS = {
    "done-a": "FINISHED",
    "done-b": "FINISHED",
    "live": None,
    "preempted": "KILLED",
    "crashed-a": "FAILED",
    "crashed-b": "FAILED",
}


def _status(name: str) -> str:
    return RUNS[name] or "RUNNING"


@pytest.fixture(autouse=True)
def _no_http(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """The store's URI; each run has a seed param and a final val/acc, val/nll, val/ece."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("status")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment(EXPERIMENT, artifact_location=root.as_uri())
    only_failed = client.create_experiment("only-failed", artifact_location=root.as_uri())
    failed = client.create_run(only_failed, run_name="lost").info.run_id
    client.set_terminated(failed, status="FAILED")
    for index, (name, status) in enumerate(RUNS.items()):
        run_id = client.create_run(
            experiment_id, run_name=name, start_time=1_700_000_000_000 + index
        ).info.run_id
        metrics = [
            Metric(key, value, 1_700_000_000_000 + index, 0)
            for key, value in (("val/acc", 0.9), ("val/nll", 0.3), ("val/ece", 0.05))
        ]
        params = [
            Param("model.criterion", "ce"),
            Param("seed_everything", str(index % 2)),
        ]
        client.log_batch(run_id, metrics=metrics, params=params)
        if status is not None:
            client.set_terminated(run_id, status=status)
    return uri


def _compare(store: str, tmp_path: Path, *options: str) -> int:
    argv = ["--experiment", EXPERIMENT, "--tracking-uri", store, "--out", str(tmp_path)]
    return compare.main([*argv, "--diagrams", "0", *options])


def _csv_runs(tmp_path: Path) -> dict[str, str]:
    with (tmp_path / "comparison.csv").open(newline="") as handle:
        return {row["run_name"]: row["status"] for row in csv.DictReader(handle)}


def _skipped_line(names: set[str]) -> str:
    """The expected line, from the fixture's statuses of the runs left out."""
    counts = Counter(_status(name) for name in names)
    order = ["FINISHED", "RUNNING", "KILLED", "FAILED"]
    parts = ", ".join(f"{counts[s]} {s}" for s in order if counts[s])
    total = sum(counts.values())
    runs = "run" if total == 1 else "runs"
    return f"skipped {total} {runs} for their status ({parts}): --status any lists every run"


def test_default_lists_finished_and_running_and_counts_the_rest(store, tmp_path, capsys):
    assert _compare(store, tmp_path) == 0
    printed = capsys.readouterr().out
    listed = {name for name in RUNS if _status(name) in ("FINISHED", "RUNNING")}
    assert _csv_runs(tmp_path) == {name: _status(name) for name in listed}
    assert _skipped_line(set(RUNS) - listed) in printed
    assert "skipped 3 runs for their status (1 KILLED, 2 FAILED)" in printed


@pytest.mark.parametrize(
    "statuses", [["KILLED"], ["killed", "Failed"], ["FINISHED", "KILLED"], ["RUNNING"]]
)
def test_status_lists_the_runs_of_those_statuses(store, tmp_path, capsys, statuses):
    assert _compare(store, tmp_path, "--status", *statuses) == 0
    printed = capsys.readouterr().out
    wanted = {s.upper() for s in statuses}
    listed = {name for name in RUNS if _status(name) in wanted}
    assert _csv_runs(tmp_path) == {name: _status(name) for name in listed}
    assert _skipped_line(set(RUNS) - listed) in printed


def test_status_any_lists_every_run_and_skips_none(store, tmp_path, capsys):
    assert _compare(store, tmp_path, "--status", "any") == 0
    printed = capsys.readouterr().out
    assert _csv_runs(tmp_path) == {name: _status(name) for name in RUNS}
    assert "skipped" not in printed


def test_runs_option_lists_named_runs_whatever_the_status(store, tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    by_name = {r.info.run_name: r.info.run_id for r in client.search_runs([experiment_id])}
    options = ["--runs", by_name["crashed-a"], by_name["preempted"], "--status", "FINISHED"]
    assert _compare(store, tmp_path, *options) == 0
    assert _csv_runs(tmp_path) == {"crashed-a": "FAILED", "preempted": "KILLED"}


def test_no_listed_run_says_what_was_skipped(store, tmp_path, capsys):
    argv = ["--experiment", "only-failed", "--tracking-uri", store, "--out", str(tmp_path)]
    assert compare.main(argv) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "no finished or running runs in experiment 'only-failed'; skipped 1 run for their "
        "status (1 FAILED): --status any lists every run"
    )
    assert compare.main([*argv, "--status", "KILLED"]) == 1
    assert "no killed runs in experiment 'only-failed'" in capsys.readouterr().err
    assert compare.main([*argv, "--status", "any", "--diagrams", "0"]) == 0


def test_unknown_status_is_a_usage_error(store, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        _compare(store, tmp_path, "--status", "DONE")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--status" in err
    assert "'DONE' is not a run status" in err
    assert "KILLED" in err
    with pytest.raises(ValueError, match="DONE: not a run status"):
        compare.collect_runs(EXPERIMENT, tracking_uri=store, status=["DONE"])


def test_group_by_takes_the_status_too(store, tmp_path, capsys):
    argv = ["--experiment", EXPERIMENT, "--tracking-uri", store, "--out", str(tmp_path)]
    assert compare.main([*argv, "--group-by", "loss", "--status", "any"]) == 0
    assert "skipped" not in capsys.readouterr().out
    assert compare.main([*argv, "--group-by", "loss"]) == 0
    assert _skipped_line({"preempted", "crashed-a", "crashed-b"}) in capsys.readouterr().out
    records = compare.collect_records(EXPERIMENT, tracking_uri=store, status="KILLED")
    assert [record.run_id for record in records] == [
        row["run_id"]
        for row in compare.collect_runs(EXPERIMENT, tracking_uri=store, status=["KILLED"])
    ]
    assert len(records) == 1


def test_collect_runs_reports_skipped_counts(store):
    skipped: dict[str, int] = {}
    rows = compare.collect_runs(EXPERIMENT, tracking_uri=store, skipped=skipped)
    assert sorted(row["run_name"] for row in rows) == ["done-a", "done-b", "live"]
    assert skipped == {"KILLED": 1, "FAILED": 2}


def test_the_cli_knows_the_query_statuses():
    assert compare_cli._STATUSES == (*query.RUN_STATUSES, query.ANY_STATUS)
