"""Metrics sent off the training path (issue 24, 6): queued, batched, flushed, each step once.

The reference for what a run must hold is Lightning's own ``CSVLogger`` beside the
``TrackingLogger`` in the same fit (every value Lightning handed to its loggers, by step), or the
values the test itself logged; the store is a real SQLite file in ``tmp_path``.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger

from lightning_losses.callbacks import CalibrationMonitor, GammaAnnealing
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.classifier import ClassifierModule
from lightning_losses.tracking import TrackingLogger

pytestmark = pytest.mark.usefixtures("isolated_tracking")


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def csv_reference(log_dir: str) -> dict[str, dict[int, float]]:
    """Every (metric, step) -> value that Lightning gave its CSVLogger."""
    expected: dict[str, dict[int, float]] = {}
    for row in csv.DictReader((Path(log_dir) / "metrics.csv").open()):
        step = int(row.pop("step"))
        for key, value in row.items():
            if value:
                expected.setdefault(key, {})[step] = float(value)
    return expected


def check_each_step_once(uri: str, run_id: str, expected: dict[str, dict[int, float]]) -> None:
    c = client(uri)
    assert set(c.get_run(run_id).data.metrics) == set(expected)
    for key, values in expected.items():
        history = c.get_metric_history(run_id, key)
        steps = Counter(m.step for m in history)
        assert max(steps.values()) == 1, (key, steps)  # each (metric, step) once
        assert {m.step: m.value for m in history} == pytest.approx(values), key


class StoredAtEpochStart(Callback):
    """At each epoch's start, the steps of ``val/ece`` a separate client finds in the store."""

    def __init__(self, uri: str, logger: TrackingLogger) -> None:
        self.uri, self.logger, self.seen = uri, logger, []

    def on_train_epoch_start(self, trainer, pl_module):
        history = client(self.uri).get_metric_history(self.logger.run_id, "val/ece")
        self.seen.append(sorted(m.step for m in history))


@pytest.mark.slow
def test_a_fit_writes_each_metric_step_once_and_leaves_nothing_queued(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    L.seed_everything(0)
    tracking = TrackingLogger(tracking_uri=uri, save_dir=str(tmp_path / "runs"))
    stored = StoredAtEpochStart(uri, tracking)
    local = CSVLogger(tmp_path, name="reference")
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        limit_train_batches=3,
        limit_val_batches=2,
        log_every_n_steps=1,
        logger=[tracking, local],
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[GammaAnnealing(), CalibrationMonitor(final_diagram=False), stored],
    )
    model = ClassifierModule({"name": "gamma_ce", "gamma": 0.0}, hidden=[16])
    trainer.fit(model, DigitsDataModule(batch_size=64))
    assert tracking.flush_metrics(timeout=0)  # finalize left nothing queued
    expected = csv_reference(local.log_dir)
    assert {"train/loss_step", "criterion/gamma", "val/ece", "epoch"} <= set(expected)
    check_each_step_once(uri, tracking.run_id, expected)
    assert client(uri).get_run(tracking.run_id).info.status == "FINISHED"
    # The epoch's checkpoint was saved, so its validation was in the store at the next start.
    assert stored.seen == [[], sorted(expected["val/ece"])[:1]]


@pytest.mark.slow
def test_finalize_sends_everything_queued(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = TrackingLogger(tracking_uri=uri, save_dir=str(tmp_path / "runs"))
    steps = 400
    for step in range(steps):
        tracking.log_metrics({"a": step / 7, "b": -float(step)}, step=step)
    # A repeat of one value at one step is sent once; another value at that step is sent too.
    for value in (1.0, 1.0, 2.0):
        tracking.log_metrics({"c": value}, step=steps)
    tracking.finalize("success")
    assert tracking.flush_metrics(timeout=0)
    c = client(uri)
    for key, value in (("a", lambda step: step / 7), ("b", lambda step: -float(step))):
        history = c.get_metric_history(tracking.run_id, key)
        assert sorted((m.step, m.value) for m in history) == [(s, value(s)) for s in range(steps)]
    assert sorted(m.value for m in c.get_metric_history(tracking.run_id, "c")) == [1.0, 2.0]
    assert c.get_run(tracking.run_id).info.status == "FINISHED"


SCRIPT = """
import os, signal, sys
import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.classifier import ClassifierModule
from lightning_losses.tracking import TrackingLogger

uri = sys.argv[1]

class TermAt(Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 5:
            os.kill(os.getpid(), signal.SIGTERM)

killed = TrackingLogger(tracking_uri=uri, experiment_name="killed", save_dir="runs")
trainer = L.Trainer(
    accelerator="cpu", max_epochs=3, limit_train_batches=4, limit_val_batches=1,
    log_every_n_steps=1, logger=[killed, CSVLogger("reference")], callbacks=[TermAt()],
    enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
)
try:
    trainer.fit(ClassifierModule("ce", hidden=[8]), DigitsDataModule(batch_size=64))
except BaseException as error:
    print("stopped by", type(error).__name__)
print("killed run", killed.run_id, trainer.loggers[1].log_dir)

# No finalize: what is still queued at exit is sent by the atexit flush.
left = TrackingLogger(tracking_uri=uri, experiment_name="exit", save_dir="runs")
for step in range(300):
    left.log_metrics({"x": float(step)}, step=step)
print("exit run", left.run_id)
"""


@pytest.mark.slow
def test_sigterm_and_exit_lose_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), uri],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    lines = done.stdout.splitlines()
    assert "stopped by SIGTERMException" in lines, done.stdout
    [killed] = [line.split()[2:] for line in lines if line.startswith("killed run")]
    [left] = [line.split()[2] for line in lines if line.startswith("exit run")]
    run_id, reference = killed
    expected = csv_reference(reference)
    assert max(step for values in expected.values() for step in values) >= 4  # 5 steps
    check_each_step_once(uri, run_id, expected)
    assert client(uri).get_run(run_id).info.status == "FAILED"
    check_each_step_once(uri, left, {"x": {step: float(step) for step in range(300)}})
