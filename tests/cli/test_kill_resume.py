"""``last.ckpt`` is the latest state in every shipped config, and resuming from it is exact.

Every shipped config has two ``ModelCheckpoint`` callbacks: the best epoch by the validation
metric (``trainer.checkpoint_callback``) and a monitor-less one that overwrites ``last.ckpt``
after every epoch. The kill test stops a real ``lightning-losses fit`` process with SIGKILL,
resumes it with the README's own command and compares the final weights bit for bit with an
uninterrupted fit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import pytest
import torch
from helpers.paths import ROOT, SCRIPT
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_losses import cli, lm

DEFAULT = ROOT / "lightning_losses" / "default_config.yaml"
CONFIGS = [*sorted((ROOT / "configs").glob("*.yaml")), DEFAULT]
LM_CONFIGS = sorted((ROOT / "configs" / "lm").glob("*.yaml"))
TINY = [
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]
# Without MLflow the checkpoints go to ./checkpoints instead of the run folder; the callbacks
# are the config's (each new SQLite store costs seconds; the tracked tests are below).
UNTRACKED = ["--trainer.logger=false"]
LM_TINY = ["--data.init_args.max_vocab_size=300", "--data.init_args.context_length=8"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # mlflow.set_tracking_uri() exports MLFLOW_TRACKING_URI: keep each test on its own store.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def last_checkpoint(root: Path) -> Path:
    """The README's ``mlflow_runs/<experiment id>/<run id>/checkpoints/last.ckpt`` (one run)."""
    (path,) = root.glob("mlflow_runs/*/*/checkpoints/last.ckpt")
    return path


def last_of(trainer: L.Trainer) -> Path:
    """``last.ckpt`` in the folder of the trainer's checkpoints."""
    return Path(trainer.checkpoint_callback.dirpath) / "last.ckpt"


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_tensors(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        assert torch.equal(value, got[key]), key


class LastCheckpointProbe(Callback):
    """At each epoch start, reads ``last.ckpt``: it must hold the epoch that just ended.

    At the start of epoch ``e`` no step of ``e`` has run, so the model's weights are those at
    the end of epoch ``e - 1``, which ``last.ckpt`` must hold.
    """

    def __init__(self) -> None:
        self.epochs: list[int] = []

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 0:
            return
        checkpoint = load(last_of(trainer))
        assert checkpoint["epoch"] == trainer.current_epoch - 1
        assert_same_tensors(pl_module.state_dict(), checkpoint["state_dict"])
        self.epochs.append(checkpoint["epoch"])


def check_latest_state(trainer: L.Trainer, probe: LastCheckpointProbe, epochs: int) -> None:
    """``last.ckpt`` held the latest epoch throughout, and holds the final model now."""
    assert probe.epochs == list(range(epochs - 1))
    checkpoint = load(last_of(trainer))
    assert checkpoint["epoch"] == epochs - 1
    assert checkpoint["global_step"] == trainer.global_step
    assert_same_tensors(trainer.lightning_module.state_dict(), checkpoint["state_dict"])
    # The best-by-metric callback comes first (trainer.checkpoint_callback); one file each.
    assert trainer.checkpoint_callback.monitor in ("val/nll", "val/ppl")
    assert len(trainer.checkpoint_callbacks) == 2
    files = sorted(p.name for p in last_of(trainer).parent.iterdir())
    assert len(files) == 2, files
    assert "last.ckpt" in files, files


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
@pytest.mark.slow
def test_every_config_fits_end_to_end_and_last_ckpt_is_the_latest_epoch(config, tmp_path):
    """Every shipped config (and the default) fits, and ``last.ckpt`` holds the latest epoch.

    Two short epochs, tracked in the default local store, with the loss its YAML names.
    """
    probe = LastCheckpointProbe()
    args = ["fit", "--config", str(config), "--trainer.max_epochs=2", *TINY]
    # every post-hoc method scores, isotonic too (its zeros are floored): no warning expected
    done = cli.main(args, trainer_defaults={"callbacks": [probe]})
    trainer = done.trainer
    assert trainer.state.finished
    assert trainer.global_step == 4  # 2 epochs of 2 batches
    for key in ("train/loss_epoch", "val/loss", "val/acc", "val/nll"):
        assert torch.isfinite(trainer.callback_metrics[key]), key
    assert (tmp_path / "mlflow.db").is_file()  # the default local MLflow store
    class_path = done.config["fit"]["model"]["criterion"]["class_path"]
    assert type(done.model.criterion).__name__ == class_path.rsplit(".", 1)[-1]
    check_latest_state(trainer, probe, epochs=2)


@pytest.mark.parametrize("config", LM_CONFIGS, ids=[p.stem for p in LM_CONFIGS])
@pytest.mark.slow
def test_last_checkpoint_is_the_latest_epoch_in_every_lm_config(config):
    probe = LastCheckpointProbe()
    args = ["fit", "--config", str(config), "--trainer.max_epochs=2", *TINY, *LM_TINY, *UNTRACKED]
    done = lm.main(args, trainer_defaults={"callbacks": [probe]})
    check_latest_state(done.trainer, probe, epochs=2)


class Worst(NamedTuple):
    folder: Path
    trainer: L.Trainer
    probe: LastCheckpointProbe


@pytest.fixture(scope="module")
def worst(tmp_path_factory) -> Iterator[Worst]:
    """A tracked 3-epoch fit of ``digits_ce`` whose best checkpoint is not its last epoch.

    Its best-by-val/nll callback keeps the *largest* val/nll: its epoch is not the last one.
    Lightning's ``save_last`` beside it would have left ``last.ckpt`` at that epoch.
    """
    folder = tmp_path_factory.mktemp("worst")
    text = (ROOT / "configs" / "digits_ce.yaml").read_text()
    assert text.count("mode: min") == 1
    config = folder / "worst.yaml"
    config.write_text(text.replace("mode: min", "mode: max"))
    probe = LastCheckpointProbe()
    here, uri = os.getcwd(), os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.chdir(folder)
    try:
        args = ["fit", "--config", str(config), "--trainer.max_epochs=3", *TINY]
        yield Worst(folder, cli.main(args, trainer_defaults={"callbacks": [probe]}).trainer, probe)
    finally:
        os.chdir(here)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        if uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = uri


@pytest.mark.slow
def test_last_checkpoint_is_not_the_best_one(worst):
    best = load(Path(worst.trainer.checkpoint_callback.best_model_path))
    assert best["epoch"] != 2
    check_latest_state(worst.trainer, worst.probe, epochs=3)
    assert last_checkpoint(worst.folder) == last_of(worst.trainer)  # the README's path


@pytest.mark.slow
def test_mlflow_run_keeps_the_best_checkpoint(worst):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{worst.folder}/mlflow.db")
    logged = [a.path for a in client.list_artifacts(worst.trainer.logger.run_id, "checkpoints")]
    best = Path(worst.trainer.checkpoint_callback.best_model_path).name
    assert logged == [f"checkpoints/{best}"]


# --- a real fit process killed with SIGKILL, then resumed ---------------------------------------

KILLED_CONFIG = ROOT / "configs" / "digits_gamma_ce_annealed.yaml"  # GammaAnnealing 0 -> 1
EPOCHS = 6
BUDGET = [
    f"--trainer.max_epochs={EPOCHS}",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def start_fit(folder: Path, *extra: str) -> subprocess.Popen:
    """``lightning-losses fit --config <annealed gamma-CE> <budget>`` in ``folder``."""
    folder.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = [str(SCRIPT), "fit", "--config", str(KILLED_CONFIG), *BUDGET, *extra]
    log = (folder / "fit.log").open("a")
    return subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=log)


def finish(process: subprocess.Popen, folder: Path) -> None:
    assert process.wait(timeout=300) == 0, (folder / "fit.log").read_text()[-3000:]


def saved_epoch(folder: Path) -> int:
    """The epoch in ``last.ckpt`` (-1 before the first one is written)."""
    paths = list(folder.glob("mlflow_runs/*/*/checkpoints/last.ckpt"))
    return load(paths[0])["epoch"] if paths else -1


def wait_for_epoch(process: subprocess.Popen, folder: Path, epoch: int) -> float:
    """Poll until ``last.ckpt`` holds ``epoch`` (or later); the time it was seen."""
    deadline = time.monotonic() + 240
    while saved_epoch(folder) < epoch:
        assert process.poll() is None, (folder / "fit.log").read_text()[-3000:]
        assert time.monotonic() < deadline, f"no last.ckpt of epoch {epoch} in time"
        time.sleep(0.01)
    return time.monotonic()


@pytest.mark.slow
def test_fit_killed_mid_epoch_resumes_bit_identical(tmp_path):
    killed_folder = tmp_path / "killed"
    killed = start_fit(killed_folder)
    try:
        first = wait_for_epoch(killed, killed_folder, 0)
        second = wait_for_epoch(killed, killed_folder, 1)
        time.sleep((second - first) / 2)  # about half an epoch into the next one
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(timeout=60) == -signal.SIGKILL
    finally:
        if killed.poll() is None:
            killed.kill()
    checkpoint = last_checkpoint(killed_folder)
    interrupted = load(checkpoint)  # whole: checkpoints are written to a temporary file first
    # The kill landed before the last epoch was saved, so the resume has epochs left to train.
    assert interrupted["epoch"] < EPOCHS - 1

    # The README's resume command, from the same working directory ...
    resumed = start_fit(killed_folder, "--ckpt_path", str(checkpoint.relative_to(killed_folder)))
    # ... and meanwhile the uninterrupted fit, here (one thread, as the processes; untracked).
    straight = cli.main(["fit", "--config", str(KILLED_CONFIG), *BUDGET, *UNTRACKED]).trainer
    finish(resumed, killed_folder)

    expected = load(last_of(straight))
    assert_same_tensors(straight.lightning_module.state_dict(), expected["state_dict"])
    got = load(last_checkpoint(killed_folder))  # the resumed fit continues the same run folder
    assert got["epoch"] == expected["epoch"] == EPOCHS - 1
    assert got["global_step"] == expected["global_step"] == straight.global_step
    assert_same_tensors(expected["state_dict"], got["state_dict"])
    # 1,077 training rows in batches of 64: 17 steps an epoch, T = 17 * 6 = 102 steps; the
    # last step is step 101, where gamma = 101 / 101 = 1.0, in both runs.
    annealing = "GammaAnnealing{'attribute': 'gamma'}"
    assert got["callbacks"][annealing] == expected["callbacks"][annealing]
    assert expected["callbacks"][annealing]["total"] == 17 * EPOCHS
    assert expected["callbacks"][annealing]["last_value"] == 1.0
