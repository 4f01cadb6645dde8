"""A diverging fit ends in one line naming the cause and the fix; its MLflow run ends FAILED.

In process: :class:`DivergenceCheck` on a tiny module whose loss turns NaN at a chosen step
(checked every step, and read back every N steps as on an accelerator), with a real sqlite
MLflow store. Through the console script: ``fit --config digits_ce`` with a learning rate of
1e12 (its logits overflow at step 1), and ``--trainer.precision=16-true`` (Adam's ``eps`` is 0
in float16): one ``error:`` line, exit status 1, no traceback unless ``--verbose``, the run
FAILED with its cause in the tag ``lightning_losses.failure``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers.preloaded import run_preloaded
from mlflow.tracking import MlflowClient
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.cli.failures import (
    Divergence,
    DivergenceCheck,
    divergence_fix,
    failure_cause,
    learning_rate_option,
)
from lightning_losses.cli.fit import main
from lightning_losses.functional.checks import check_finite
from lightning_losses.tracking import FAILURE_TAG, TrackingLogger

TINY = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=3",
    "--trainer.limit_val_batches=1",
]
DIVERGING = ["fit", "--config", "digits_ce", "--model.optimizer.init_args.lr=1e12", *TINY]
#: What the console script prints for DIVERGING: the logits overflow at the second step.
DIVERGED = (
    "lightning-losses fit: error: the training logits became nan at step 1, epoch 0 "
    "(logits[0, 0]): the fit diverged; lower the learning rate "
    "(--model.optimizer.init_args.lr, 1e+12 now) or clip the gradients "
    "(--trainer.gradient_clip_val=1.0)"
)


class NaNAt(L.LightningModule):
    """A linear classifier whose training loss is NaN from global step ``bad`` on."""

    def __init__(self, bad: int) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.bad = bad

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.layer(x), y)
        loss = loss * float("nan") if self.global_step >= self.bad else loss
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.25)


def fit(module: L.LightningModule, folder: Path, check: DivergenceCheck, **options) -> L.Trainer:
    """Fit ``module`` on 16 random rows (batches of 2) with ``check``; the trainer."""
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,)))
    defaults = {"logger": False, "enable_checkpointing": False, "max_epochs": 1}
    trainer = L.Trainer(
        callbacks=[check, *options.pop("callbacks", [])],
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=folder,
        **{**defaults, **options},
    )
    trainer.fit(module, DataLoader(data, batch_size=2))
    return trainer


def test_a_nan_loss_stops_the_fit_at_its_step_naming_the_learning_rate(tmp_path):
    check = DivergenceCheck(lr_option="model.optimizer.init_args.lr")
    with pytest.raises(Divergence) as stop:
        fit(NaNAt(bad=3), tmp_path, check)
    assert str(stop.value) == (
        "the training loss became nan at step 3, epoch 0: the fit diverged; lower the learning "
        "rate (--model.optimizer.init_args.lr, 0.25 now) or clip the gradients "
        "(--trainer.gradient_clip_val=1.0)"
    )
    assert check.failure == str(stop.value)


def test_read_back_every_n_steps_still_names_the_first_bad_step(tmp_path):
    module = NaNAt(bad=5)
    check = DivergenceCheck(every_n_steps=4)  # as on an accelerator: steps 4-7 read at once
    with pytest.raises(Divergence, match=r"^the training loss became nan at step 5, epoch 0:"):
        fit(module, tmp_path, check)
    assert module.trainer.global_step == 8  # stopped when steps 4 to 7 were read back


def test_a_diverged_model_is_never_saved(tmp_path):
    """Read back only at the epoch's end: the checkpoint of that epoch is not written."""
    check = DivergenceCheck(every_n_steps=1000)
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    with pytest.raises(Divergence, match="at step 6, epoch 0"):
        fit(NaNAt(bad=6), tmp_path, check, callbacks=[saver], enable_checkpointing=True)
    assert not (tmp_path / "ckpt").exists() or list((tmp_path / "ckpt").iterdir()) == []


def test_the_run_ends_failed_with_the_cause_as_a_tag(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = TrackingLogger(tracking_uri=uri, save_dir=str(tmp_path / "runs"))
    with pytest.raises(Divergence) as stop:
        fit(NaNAt(bad=2), tmp_path, DivergenceCheck(), logger=logger, log_every_n_steps=1)
    run = MlflowClient(uri).get_run(logger.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[FAILURE_TAG] == str(stop.value)
    assert str(stop.value).startswith("the training loss became nan at step 2, epoch 0:")
    losses = MlflowClient(uri).get_metric_history(logger.run_id, "train/loss")
    assert [m.step for m in losses] == [0, 1]  # the two finite steps were logged, not the NaN
    assert all(0 < m.value < 10 for m in losses)


class _Raises(L.LightningModule):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.error = error

    def training_step(self, batch, batch_idx):
        raise self.error

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_any_other_failure_is_tagged_with_its_type_and_first_line(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = TrackingLogger(tracking_uri=uri, save_dir=str(tmp_path / "runs"))
    logger.log_metrics({"x": 1.0}, step=0)  # the run starts
    check = DivergenceCheck()
    with pytest.raises(LookupError):
        fit(_Raises(LookupError("no column 'y'\nsecond line")), tmp_path, check, logger=logger)
    assert check.failure is None  # not a divergence: the traceback stays
    run = MlflowClient(uri).get_run(logger.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[FAILURE_TAG] == "LookupError: no column 'y'"


def test_a_losss_check_of_finite_logits_is_a_divergence_while_fitting(tmp_path):
    with pytest.raises(ValueError, match="must be finite") as found:  # as a loss raises it
        check_finite("logits", torch.tensor([[0.0, float("inf")]]))
    check = DivergenceCheck(lr_option="model.lr")
    with pytest.raises(ValueError, match=r"^logits must be finite"):
        fit(_Raises(found.value), tmp_path, check)
    assert check.failure == (
        "the training logits became inf at step 0, epoch 0 (logits[0, 1]): the fit diverged; "
        "lower the learning rate (--model.lr, 0.1 now) or clip the gradients "
        "(--trainer.gradient_clip_val=1.0)"
    )
    other = L.Trainer(logger=False)  # not fitting: not a divergence
    assert failure_cause(found.value, other) is None
    with pytest.raises(ValueError, match="must be finite") as hidden:  # a linear head's input
        check_finite("hidden", torch.tensor([[float("nan")]]))
    with pytest.raises(ValueError, match=r"^hidden must be finite"):
        fit(_Raises(hidden.value), tmp_path, check)
    assert check.failure.startswith("the training hidden states became nan at step 0, epoch 0")
    with pytest.raises(ValueError, match="must be finite") as option:  # the user's, not the fit's
        check_finite("pos_weight", torch.tensor([float("inf")]))
    with pytest.raises(ValueError, match=r"^pos_weight must be finite"):
        fit(_Raises(option.value), tmp_path, check)
    assert check.failure is None


def test_off_the_cpu_the_check_is_read_back_every_log_every_n_steps():
    trainer = L.Trainer(logger=False, log_every_n_steps=7)
    on_device = torch.zeros((), device="meta")  # not the CPU: no value can be read back
    assert DivergenceCheck()._every(trainer, on_device) == 7
    assert DivergenceCheck()._every(trainer, torch.zeros(())) == 1
    assert DivergenceCheck(every_n_steps=3)._every(trainer, torch.zeros(())) == 3


def test_a_resumed_run_loses_the_failure_tag_of_its_earlier_attempt(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = TrackingLogger(tracking_uri=uri, save_dir=str(tmp_path / "runs"))
    first.log_metrics({"x": 1.0}, step=0)
    first.record_failure("the training loss became nan at step 3, epoch 0: ...")
    first.finalize("failed")
    client = MlflowClient(uri)
    assert client.get_run(first.run_id).data.tags[FAILURE_TAG].startswith("the training loss")
    resumed = TrackingLogger(
        tracking_uri=uri, save_dir=str(tmp_path / "runs"), run_id=first.run_id, resume_step=3
    )
    assert resumed.experiment is not None  # the run continues (as when a fit starts)
    resumed.log_metrics({"x": 2.0}, step=4)  # the resume is recorded at its first metric
    resumed.flush_metrics()
    run = client.get_run(first.run_id)
    assert run.info.status == "RUNNING"
    assert FAILURE_TAG not in run.data.tags


def test_the_language_models_command_gets_the_check_and_names_itself(tmp_path):
    from lightning_losses.lm.cli import main as lm_main

    with contextlib.chdir(tmp_path):
        cli = lm_main(["--trainer.logger=false"], run=False)
    assert isinstance(cli.trainer.callbacks[0], DivergenceCheck)
    assert cli.trainer.callbacks[0].lr_option == "model.init_args.optimizer.init_args.lr"
    assert cli.error_prog == "lightning-losses lm"


def test_the_fix_names_the_precision_to_change():
    assert divergence_fix("bf16-true").endswith(", or use --trainer.precision=bf16-mixed")
    assert divergence_fix("bf16-mixed").endswith(", or train in --trainer.precision=32-true")
    assert divergence_fix("64-true") == (
        "lower the learning rate or clip the gradients (--trainer.gradient_clip_val=1.0)"
    )


def test_the_learning_rate_option_is_found_in_the_language_models_config():
    config = {
        "model": {"class_path": "a.LM", "init_args": {"optimizer": {"init_args": {"lr": 2e-3}}}}
    }
    assert learning_rate_option(config) == "model.init_args.optimizer.init_args.lr"


# --- through the console script ---------------------------------------------------------------


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``lightning-losses ARGS``, forked from a warm interpreter (:mod:`helpers.preloaded`)."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return run_preloaded(args, cwd=cwd, env=env, timeout=600)


def the_run(folder: Path):
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run


@pytest.mark.slow
def test_a_diverging_fit_prints_one_line_and_fails_its_run(tmp_path):
    done = run_cli(DIVERGING, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.splitlines() == [DIVERGED]  # no traceback, no other line
    run = the_run(tmp_path)
    assert run.info.status == "FAILED"
    assert run.data.tags[FAILURE_TAG] == DIVERGED.removeprefix("lightning-losses fit: error: ")
    assert list(tmp_path.rglob("*.ckpt")) == []  # no epoch ended: nothing saved


@pytest.mark.slow
def test_verbose_shows_the_traceback_then_the_line(tmp_path, capsys):
    with contextlib.chdir(tmp_path), pytest.raises(SystemExit) as stop:
        main([*DIVERGING, "--verbose"])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last):" in err
    assert "ValueError: logits must be finite" in err
    assert err.splitlines()[-1] == DIVERGED


@pytest.mark.slow
def test_16_true_prints_one_line_naming_the_precision_to_use(tmp_path):
    done = run_cli(["fit", *TINY, "--trainer.precision=16-true"], tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    [line] = done.stderr.splitlines()
    assert line.startswith("lightning-losses fit: error: non-finite "), line
    assert "under trainer.precision=16-true:" in line
    assert line.endswith(
        "use --trainer.precision=16-mixed (or bf16-mixed), which keeps float32 weights and "
        "computes in float16"
    )
    run = the_run(tmp_path)
    assert run.info.status == "FAILED"
    assert run.data.tags[FAILURE_TAG] == line.removeprefix("lightning-losses fit: error: ")


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is not None,
    reason="transformer_engine is installed here: the precision can be built",
)
def test_a_precision_without_its_package_is_one_line(tmp_path, capsys):
    with contextlib.chdir(tmp_path), pytest.raises(SystemExit) as stop:
        main(["fit", *TINY, "--trainer.precision=transformer-engine"])
    assert stop.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "lightning-losses fit: error: --trainer.precision=transformer-engine: Requirement "
        "'transformer_engine"
    )
    assert line.endswith(
        "choose another precision (32-true, 16-mixed, bf16-mixed) or install the package"
    )
