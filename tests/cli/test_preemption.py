"""SIGTERM / SIGUSR1 stop a fit with a checkpoint, a KILLED run and exit status 143.

A resume that fails at its start leaves the run as it was.

Real ``lightning-losses fit`` processes are stopped with ``os.kill`` once the MLflow store (read
with :mod:`sqlite3`, not with the package) holds their first training metrics. The resumed fit
is compared with an uninterrupted fit of the same seed through MLflow's raw metric histories
and the weights of ``last.ckpt``: equal, value for value. The in-process tests send the signal
from a callback at a chosen point of the loop.
"""

from __future__ import annotations

import os
import shlex
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers.ddp import DDP_ARGS
from helpers.paths import ROOT, SCRIPT
from lightning.pytorch.callbacks import Callback
from mlflow.tracking import MlflowClient

from lightning_losses import compare
from lightning_losses.callbacks.preemption import (
    PREEMPTED_EXIT_STATUS,
    RESUME_COMMAND_TAG,
    Preemption,
    resume_command,
)
from lightning_losses.cli.console import console_main
from lightning_losses.cli.fit import main
from lightning_losses.tracking import PID_TAG, RESUME_TAG

CONFIG = ROOT / "configs" / "digits_gamma_ce_annealed.yaml"  # GammaAnnealing over the fit
BATCHES = 48  # training batches per epoch (of 8 samples): a stop lands inside an epoch
BATCH_SIZE = 8
FIT = [
    "fit",
    "--config",
    str(CONFIG),
    f"--data.init_args.batch_size={BATCH_SIZE}",
    f"--trainer.limit_train_batches={BATCHES}",
    "--trainer.limit_val_batches=4",
    "--trainer.log_every_n_steps=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]
# Small in-process fits: 4 batches of 64 per epoch.
TINY = [
    "fit",
    "--config",
    str(CONFIG),
    "--trainer.limit_train_batches=4",
    "--trainer.limit_val_batches=3",
    "--trainer.log_every_n_steps=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--model.hidden=[16]",
]

pytestmark = pytest.mark.usefixtures("isolated_tracking")


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def only_run(folder: Path) -> Any:
    """The one MLflow run of ``folder/mlflow.db`` (read with MLflow's own client)."""
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run


def raw_history(folder: Path, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """MLflow's raw history of every metric but the timings: ``{key: [(step, value), ...]}``."""
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    keys = client.get_run(run_id).data.metrics
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in keys
        if not key.startswith("time/")
    }


def training_steps_logged(folder: Path) -> int:
    """Rows of ``train/loss_step`` in the store, read with sqlite3 (0 while there is none)."""
    try:
        with sqlite3.connect(folder / "mlflow.db", timeout=1) as db:
            query = "SELECT COUNT(*) FROM metrics WHERE key = 'train/loss_step'"
            return int(db.execute(query).fetchone()[0])
    except sqlite3.Error:
        return 0


def start(folder: Path, args: list[str], **popen: Any) -> subprocess.Popen:
    folder.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    log = (folder / "fit.log").open("a")
    command = [str(SCRIPT), *args]
    return subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=log, **popen)


def stop_when_training(process: subprocess.Popen, folder: Path, send: Any) -> int:
    """Once two training steps are in the store, ``send()`` the signal; the exit status."""
    deadline = time.monotonic() + 300
    try:
        while training_steps_logged(folder) < 2:
            assert process.poll() is None, (folder / "fit.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no training step in time"
            time.sleep(0.02)
        send()
        return process.wait(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()


def the_checkpoint(folder: Path) -> Path:
    (path,) = folder.glob("mlflow_runs/*/*/checkpoints/last.ckpt")
    return path


def assert_stopped_mid_epoch(checkpoint: Path) -> int:
    """The checkpoint is inside an epoch, its loader at the batch after the last trained one."""
    state = load(checkpoint)
    step = state["global_step"]
    assert step % BATCHES != 0, step
    assert state["epoch"] == step // BATCHES
    loader = state["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert loader == [{"epoch": step // BATCHES, "position": (step % BATCHES) * BATCH_SIZE}]
    return step


# --- real processes -------------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_checkpoints_mid_epoch_ends_killed_and_resumes_exactly(tmp_path, monkeypatch):
    fit = [*FIT, "--trainer.max_epochs=2"]
    killed = tmp_path / "killed"
    started = time.monotonic()
    process = start(killed, fit)
    assert stop_when_training(process, killed, lambda: os.kill(process.pid, signal.SIGTERM)) == 143
    log = (killed / "fit.log").read_text()
    checkpoint = the_checkpoint(killed)
    step = assert_stopped_mid_epoch(checkpoint)
    # Only epoch-end checkpoints besides it (the best one), none at the stop.
    others = [load(p)["global_step"] for p in checkpoint.parent.glob("*.ckpt") if p != checkpoint]
    assert all(s % BATCHES == 0 for s in others), others

    run = only_run(killed)
    assert run.info.status == "KILLED"
    hint = run.data.tags[RESUME_COMMAND_TAG]
    assert shlex.split(hint) == ["lightning-losses", *fit, "--ckpt_path", str(checkpoint)]
    assert f"stopped by SIGTERM at step {step}" in log
    assert hint in log

    # The uninterrupted fit, in its own store; then the command the run names (the README's:
    # fit --config ... --ckpt_path .../last.ckpt), through the console script's entry point
    # (in this process: one start-up less), from another directory.
    straight = tmp_path / "straight"
    straight.mkdir()
    monkeypatch.chdir(straight)
    main(fit)
    monkeypatch.chdir(tmp_path)
    assert console_main(shlex.split(hint)[1:]) == 0

    run = only_run(killed)
    assert run.info.status == "FINISHED"
    assert run.data.tags[f"{RESUME_TAG}1"].startswith(f'{{"step": {step}, ')
    assert '"previous_status": "KILLED"' in run.data.tags[f"{RESUME_TAG}1"]
    expected = raw_history(straight, only_run(straight).info.run_id)
    got = raw_history(killed, run.info.run_id)
    assert got.keys() == expected.keys()
    assert {"train/loss_epoch", "train/acc_epoch", "val/nll", "criterion/gamma"} <= got.keys()
    for key, values in expected.items():
        assert got[key] == values, key  # each step once, the same value
    # The interrupted epoch's time counts from the resume, not from the process's start.
    client = MlflowClient(f"sqlite:///{killed / 'mlflow.db'}")
    seconds = client.get_metric_history(run.info.run_id, "time/epoch_seconds")
    assert len(seconds) == 2
    assert all(0 < m.value < time.monotonic() - started for m in seconds)
    final, reference = load(the_checkpoint(killed)), load(the_checkpoint(straight))
    assert final["global_step"] == reference["global_step"] == 2 * BATCHES
    for key, value in reference["state_dict"].items():
        assert torch.equal(final["state_dict"][key], value), key


@pytest.mark.slow
def test_ddp_signal_to_every_process_gives_one_checkpoint_and_one_killed_run(tmp_path):
    folder = tmp_path / "ddp"
    ddp = [*DDP_ARGS, "--trainer.max_epochs=1"]
    process = start(folder, [*FIT, *ddp], start_new_session=True)  # its own process group

    def to_every_process() -> None:  # as a scheduler does
        os.killpg(process.pid, signal.SIGTERM)

    assert stop_when_training(process, folder, to_every_process) == 143
    checkpoints = list(folder.rglob("*.ckpt"))
    assert checkpoints == [the_checkpoint(folder)]
    assert_stopped_mid_epoch(checkpoints[0])
    assert only_run(folder).info.status == "KILLED"
    deadline = time.monotonic() + 30
    while True:  # rank 1 ends too
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a process of the fit is still running"
        time.sleep(0.2)


# --- in-process: where the stop lands ---------------------------------------------------------


class Signal(Callback):
    """Send ``signum`` to this process at a validation batch of a fit (or of its sanity check)."""

    def __init__(self, signum: int, *, sanity: bool, epoch: int = 0) -> None:
        self.signum, self.sanity, self.epoch = signum, sanity, epoch
        self.sent = False

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        wanted = trainer.sanity_checking == self.sanity and trainer.current_epoch == self.epoch
        if wanted and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


class SignalAtStep(Callback):
    """Send ``signum`` to this process at the end of the training batch ``batch_idx``."""

    def __init__(self, signum: int, batch_idx: int) -> None:
        self.signum, self.batch_idx = signum, batch_idx

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.batch_idx + 1:
            os.kill(os.getpid(), self.signum)


@pytest.mark.slow
def test_sigusr1_stops_as_sigterm_does(tmp_path, capsys):
    # Before the fit nothing handles SIGUSR1 (its default ends the process); Preemption does.
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    sender = SignalAtStep(signal.SIGUSR1, batch_idx=1)  # before Preemption in the callbacks
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--trainer.max_epochs=2"], trainer_defaults={"callbacks": [sender]})
    assert stop.value.code == PREEMPTED_EXIT_STATUS == 143
    checkpoint = next(tmp_path.rglob("last.ckpt"))
    state = load(checkpoint)
    assert (state["global_step"], state["epoch"]) == (2, 0)  # the batch the signal came in
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [
        {"epoch": 0, "position": 2 * 64}
    ]
    run = only_run(tmp_path)
    assert run.info.status == "KILLED"
    assert shlex.split(run.data.tags[RESUME_COMMAND_TAG])[-2:] == ["--ckpt_path", str(checkpoint)]
    assert "stopped by SIGUSR1 at step 2" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # put back


@pytest.mark.parametrize("when", ["validation", "last batch"])
@pytest.mark.slow
def test_signal_at_the_epoch_end_stops_after_it(tmp_path, capsys, when):
    if when == "validation":
        sender: Signal | SignalAtStep = Signal(signal.SIGTERM, sanity=False)
    else:  # the last of epoch 0's 4 batches
        sender = SignalAtStep(signal.SIGTERM, batch_idx=3)
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--trainer.max_epochs=2"], trainer_defaults={"callbacks": [sender]})
    assert stop.value.code == 143
    run = only_run(tmp_path)
    assert run.info.status == "KILLED"
    # Epoch 0 ended as usual (validation logged at its last step, 3), then the first batch of
    # epoch 1 (global step 5) is the stop.
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/nll")] == [3]
    checkpoints = {load(p)["global_step"]: p.name for p in tmp_path.rglob("*.ckpt")}
    assert checkpoints == {4: checkpoints[4], 5: "last.ckpt"}  # the best epoch's, and the stop
    state = load(next(tmp_path.rglob("last.ckpt")))
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [
        {"epoch": 1, "position": 64}
    ]
    assert "stopped by SIGTERM at step 5" in capsys.readouterr().err


def test_signal_before_the_first_step_ends_killed_without_checkpoint(tmp_path, capsys):
    sender = Signal(signal.SIGTERM, sanity=True)
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--trainer.max_epochs=2"], trainer_defaults={"callbacks": [sender]})
    assert stop.value.code == 143
    run = only_run(tmp_path)
    assert run.info.status == "KILLED"
    assert RESUME_COMMAND_TAG not in run.data.tags
    assert list(tmp_path.rglob("*.ckpt")) == []
    assert "before the first training step ended" in capsys.readouterr().err


class Handlers(Callback):
    """Records the handlers of SIGTERM and SIGUSR1 during training."""

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.sigterm = signal.getsignal(signal.SIGTERM)
        self.sigusr1 = signal.getsignal(signal.SIGUSR1)


@pytest.mark.parametrize("slurm_requeue", [False, True])
def test_slurm_auto_requeue_keeps_lightnings_sigusr1(monkeypatch, slurm_requeue):
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from lightning_losses.data.digits import DigitsDataModule
    from lightning_losses.lightning.classifier import ClassifierModule

    plugins = []
    if slurm_requeue:
        for name, value in {
            "SLURM_NTASKS": "1",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_JOB_NAME": "train",
            "SLURM_JOB_ID": "1",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
        }.items():
            monkeypatch.setenv(name, value)
        plugins = [SLURMEnvironment(auto_requeue=True)]
    preemption, handlers = Preemption(command=["fit"]), Handlers()
    before = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)
    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[preemption, handlers],
        plugins=plugins,
        accelerator="cpu",
        devices=1,
    )
    data = DigitsDataModule(batch_size=64)
    trainer.fit(ClassifierModule(input_dim=64, num_classes=10, hidden=[8]), data)
    assert getattr(handlers.sigterm, "__self__", None) is preemption
    if slurm_requeue:  # Lightning's requeue handler (hpc checkpoint, scontrol requeue)
        assert getattr(handlers.sigusr1, "__self__", None) is not preemption
        assert handlers.sigusr1 not in (signal.SIG_DFL, None)
    else:
        assert getattr(handlers.sigusr1, "__self__", None) is preemption
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)) == before


def test_resume_command_replaces_the_checkpoint_and_hides_passwords(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text("trainer: {}\n")
    args = [
        "fit",
        "-c",
        "my.yaml",
        "--ckpt_path",
        "old.ckpt",
        "--trainer.logger.init_args.tracking_uri=postgresql://mlflow:s3cret@db/mlflow",
        "--trainer.max_epochs=5",
    ]
    command = resume_command(args, "/runs/1/abc/checkpoints/last.ckpt")
    assert shlex.split(command) == [
        "lightning-losses",
        "fit",
        "-c",
        str(tmp_path / "my.yaml"),
        "--trainer.logger.init_args.tracking_uri=postgresql://mlflow:***@db/mlflow",
        "--trainer.max_epochs=5",
        "--ckpt_path",
        "/runs/1/abc/checkpoints/last.ckpt",
    ]
    assert "s3cret" not in command


# --- a resume that fails at its start ---------------------------------------------------------


def test_failed_resume_leaves_the_finished_run_finished(tmp_path):
    first = main([*TINY, "--trainer.max_epochs=1"])
    run_id = first.trainer.logger.run_id
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    before = client.get_run(run_id)
    assert before.info.status == "FINISHED"
    checkpoint = next(tmp_path.rglob("last.ckpt"))

    # The model's shape comes from the checkpoint's hyper-parameters, its head's from the data:
    # a binary task's head (1 output) cannot take the checkpoint's 10, so the restore fails.
    resume = [*TINY, "--trainer.max_epochs=2", f"--ckpt_path={checkpoint}"]
    binary = "--data=lightning_losses.data.digits.RareDigitDataModule"
    warning = f"run {run_id} failed before its first step; the run keeps its status FINISHED"
    with pytest.warns(UserWarning, match=warning):
        with pytest.raises(RuntimeError, match=r"size mismatch for head\.weight"):
            main([*resume, binary])

    after = client.get_run(run_id)
    assert after.info.status == "FINISHED"
    assert after.info.end_time == before.info.end_time
    assert not any(key.startswith(RESUME_TAG) for key in after.data.tags)
    assert after.data.tags[PID_TAG] == before.data.tags[PID_TAG]
    rows = compare.collect_runs(
        "lightning-losses", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"
    )
    assert [(row["run_id"], row["status"]) for row in rows] == [(run_id, "FINISHED")]
