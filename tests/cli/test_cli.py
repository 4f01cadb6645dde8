"""The `lightning-losses` console script: every shipped config end to end, defaults, errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers.paths import ROOT
from helpers.preloaded import run_preloaded
from helpers.server import free_port

from lightning_losses import GammaCrossEntropyLoss, loss_class
from lightning_losses.callbacks import GammaAnnealing
from lightning_losses.cli.fit import main

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
QUICK = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # mlflow.set_tracking_uri() exports MLFLOW_TRACKING_URI: keep each test on its own store.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_configs_are_shipped():
    names = {path.stem for path in CONFIGS}
    for expected in (
        "digits_ce",
        "digits_focal",
        "digits_gamma_ce_annealed",
        "digits_soft_accuracy",
        "digits_exact",
        "digits_normface",
        "rare_digit_binary_focal",
        "rare_digit_binary_soft_truncated",
        "digits_multilabel",
        "digits_nm",
    ):
        assert expected in names


# Every shipped config fits end to end (tracked, its YAML's loss, finite metrics):
# tests/cli/test_kill_resume.py, in the same fit that checks its last.ckpt.


@pytest.mark.slow
def test_no_config_runs_the_default_annealed_gamma_ce():
    cli = main(["fit", *QUICK])
    assert isinstance(cli.model.criterion, GammaCrossEntropyLoss)
    assert any(isinstance(c, GammaAnnealing) for c in cli.trainer.callbacks)
    assert type(cli.datamodule).__name__ == "DigitsDataModule"


def test_print_config_loads_back_unchanged(tmp_path, capsys):
    config = ROOT / "configs" / "digits_gamma_ce_annealed.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    first = capsys.readouterr().out
    (tmp_path / "printed.yaml").write_text(first)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(tmp_path / "printed.yaml"), "--print_config"])
    second = capsys.readouterr().out
    assert "GammaAnnealing" in first
    assert second == first


def test_misspelled_key_fails_at_start_up_naming_it(tmp_path, capsys):
    text = (ROOT / "configs" / "digits_focal.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("gamma: 2.0", "gama: 2.0"))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(bad), *QUICK])
    assert exit_info.value.code != 0
    assert "gama" in capsys.readouterr().err
    assert not (tmp_path / "mlflow.db").exists()  # nothing ran


@pytest.mark.slow
def test_schedule_on_missing_attribute_fails_naming_it(tmp_path):
    text = (ROOT / "configs" / "digits_focal.yaml").read_text()
    scheduler = (
        "\n    - class_path: lightning_losses.callbacks.LossScheduler\n"
        "      init_args:\n"
        "        hyperparameter: margin\n"
        "        schedule:\n"
        "          class_path: lightning_losses.callbacks.LinearSchedule\n"
        "          init_args: {start_value: 0.0, end_value: 1.0}\n"
    )
    bad = tmp_path / "bad.yaml"
    assert "  callbacks:\n" in text
    bad.write_text(text.replace("  callbacks:\n", "  callbacks:" + scheduler, 1))
    with pytest.raises(ValueError, match="margin") as error:
        main(["fit", "--config", str(bad), *QUICK])
    assert "gamma" in str(error.value)  # the message lists what FocalLoss does have


@pytest.mark.slow
def test_fit_then_test_and_predict_from_checkpoint(tmp_path):
    config = str(ROOT / "configs" / "digits_focal.yaml")
    cli = main(["fit", "--config", config, *QUICK])
    checkpoint = cli.trainer.checkpoint_callback.best_model_path
    assert checkpoint
    assert Path(checkpoint).exists()
    torch.load(checkpoint, weights_only=True)
    tested = main(["test", "--config", config, "--ckpt_path", checkpoint, *QUICK[2:]])
    assert 0.0 <= float(tested.trainer.callback_metrics["test/acc"]) <= 1.0
    assert loss_class("focal") is type(tested.model.criterion)


def test_help_names_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("fit", "compare", "sync-tracking", "reproduce"):
        assert command in out, command


def test_abbreviated_option_is_an_error_naming_it(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--trainer.max_epoch=1", *QUICK[1:]])
    assert exit_info.value.code != 0
    assert "unrecognized arguments: --trainer.max_epoch=1" in capsys.readouterr().err


@pytest.mark.slow
def test_unreachable_tracking_server_is_one_short_message(tmp_path):
    port = free_port()  # a port nobody listens on
    uri = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    arguments = ["fit", f"--trainer.logger.init_args.tracking_uri={uri}", *QUICK]
    done = run_preloaded(arguments, cwd=tmp_path, env=env)  # forked from a warm interpreter
    assert done.returncode == 2
    [message] = [line for line in done.stderr.splitlines() if "error:" in line]
    option = "trainer.logger.init_args.tracking_uri"
    assert f"error: {option}: the MLflow tracking server at {uri} cannot be reached" in message
    assert "Traceback" not in done.stderr
    assert "Union" not in done.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing ran
