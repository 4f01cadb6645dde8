"""A ``--ckpt_path`` that names no file: one ``error:`` line, exit status 2, no MLflow run."""

from __future__ import annotations

import os

import pytest
from helpers.preloaded import run_preloaded
from mlflow.tracking import MlflowClient

from lightning_losses.cli.fit import main


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Whatever a failing check would leave (a store, run folders) lands in tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def runs_in(uri: str) -> list:
    """Every run of every experiment of the store at ``uri`` (none if it was never created)."""
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments) if experiments else []


@pytest.mark.slow
def test_test_with_a_missing_checkpoint_is_one_line_and_creates_no_run(tmp_path):
    missing = tmp_path / "mlflow_runs" / "1" / "abc" / "checkpoints" / "last.ckpt"
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = run_preloaded(  # a process of its own, forked from a warm interpreter
        ["test", "--ckpt_path", str(missing), f"--trainer.logger.init_args.tracking_uri={uri}"],
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"lightning-losses test: error: --ckpt_path {missing}: no such file")
    assert runs_in(uri) == []  # no FAILED run left behind


@pytest.mark.parametrize("command", ["fit", "validate", "predict"])
@pytest.mark.slow
def test_other_commands_refuse_a_missing_checkpoint_before_any_run(command, tmp_path, capsys):
    missing = tmp_path / "missing.ckpt"
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    with pytest.raises(SystemExit) as stop:
        main(
            [
                command,
                "--ckpt_path",
                str(missing),
                f"--trainer.logger.init_args.tracking_uri={uri}",
                f"--trainer.logger.init_args.save_dir={tmp_path / 'mlflow_runs'}",
            ]
        )
    assert stop.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    expected = f"lightning-losses {command}: error: --ckpt_path {missing}: no such file"
    assert line.startswith(expected)
    assert runs_in(uri) == []


def test_a_folder_is_not_a_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["test", "--ckpt_path", str(tmp_path)])
    assert stop.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert f"--ckpt_path {tmp_path}: is a folder, not a checkpoint file" in line
