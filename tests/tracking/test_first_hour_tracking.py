"""What a user meets when they add a checkpoint, read the MLflow run and the end of a fit.

- A per-epoch ``ModelCheckpoint`` added to a shipped config on the command line runs beside the
  config's best and ``last.ckpt`` checkpoints, in one process and under 2-process DDP.
- Each checkpoint is stored once: the MLflow artifact of the best checkpoint is the run
  folder's file (a hard link with the local store), not a second copy; a copy only where the
  file system refuses the link.
- Only criterion values that change are metrics: ``criterion/gamma`` under ``GammaAnnealing``;
  the constants ``label_smoothing`` and ``threshold`` are params, never metrics. A plain
  ``LossMixin`` module logs none without a schedule, and logs what a schedule, a ``LossSwitch``
  or the user's own callback changes.
- The fit's closing lines give the final ``val/acc``, ``val/nll``, ``val/ece`` (the last values
  of the MLflow history), the last reliability diagram, the checkpoints and the viewer.

The tracked fit is in-process (the real LightningCLI, stdout captured); the DDP fit is a
``lightning-losses`` process.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import pytest
import torch
from helpers.ddp import DDP_ARGS, launch_env
from helpers.paths import CONFIGS
from helpers.preloaded import run_preloaded
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses import cli
from lightning_losses.callbacks import LossScheduler, LossSwitch
from lightning_losses.callbacks.schedules import LinearSchedule
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.mixin import LossMixin

ANNEALED = CONFIGS / "digits_gamma_ce_annealed.yaml"  # GammaAnnealing 0 -> 1 by step
EPOCHS, BATCHES = 2, 3
#: The issue's command line: one more ModelCheckpoint, one file per epoch.
OWN_CHECKPOINT = [
    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
    "--trainer.callbacks.every_n_epochs=1",
    "--trainer.callbacks.save_top_k=-1",
]
TINY = [
    f"--trainer.max_epochs={EPOCHS}",
    "--trainer.limit_val_batches=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def check_checkpoint_folder(folder: Path, steps_per_epoch: int) -> None:
    """The per-epoch files of the added callback, the config's best file and ``last.ckpt``."""
    names = sorted(p.name for p in folder.glob("*.ckpt"))
    per_epoch = [f"epoch={e}-step={(e + 1) * steps_per_epoch}.ckpt" for e in range(EPOCHS)]
    assert set(per_epoch) | {"last.ckpt"} <= set(names), names
    (best,) = [name for name in names if name.startswith("best-")]
    assert len(names) == EPOCHS + 2, names  # nothing else, no "-v1" copies
    for epoch, name in enumerate(per_epoch):
        saved = load(folder / name)
        assert (saved["epoch"], saved["global_step"]) == (epoch, (epoch + 1) * steps_per_epoch)
    last = load(folder / "last.ckpt")
    assert (last["epoch"], last["global_step"]) == (EPOCHS - 1, EPOCHS * steps_per_epoch)
    assert best.startswith(f"best-epoch={load(folder / best)['epoch']}-")


class Fit(NamedTuple):
    folder: Path
    trainer: L.Trainer
    stdout: str


@pytest.fixture(scope="module")
def fit(tmp_path_factory) -> Fit:
    """A tracked fit of the annealed gamma-CE config with the added per-epoch checkpoint."""
    folder = tmp_path_factory.mktemp("tracked")
    here, uri = os.getcwd(), os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.chdir(folder)
    out = io.StringIO()
    try:
        args = ["fit", "--config", str(ANNEALED), *OWN_CHECKPOINT, *TINY]
        args += [f"--trainer.limit_train_batches={BATCHES}", "--trainer.log_every_n_steps=1"]
        with contextlib.redirect_stdout(out):
            trainer = cli.main(args).trainer
    finally:
        os.chdir(here)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        if uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = uri
    return Fit(folder, trainer, out.getvalue())


def client_of(fit: Fit):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{fit.folder / 'mlflow.db'}")


# --- 1. an added per-epoch ModelCheckpoint --------------------------------------------------


@pytest.mark.slow
def test_own_per_epoch_checkpoint_beside_a_shipped_config(fit):
    folder = Path(fit.trainer.checkpoint_callback.dirpath)
    assert folder.parent.name == fit.trainer.logger.run_id  # the run folder's checkpoints/
    check_checkpoint_folder(folder, steps_per_epoch=BATCHES)
    assert fit.trainer.checkpoint_callback.monitor == "val/nll"  # the config's best comes first


@pytest.mark.slow
def test_own_per_epoch_checkpoint_under_ddp(tmp_path):
    config = CONFIGS / "digits_ce.yaml"
    done = run_preloaded(  # rank 0 forked from a warm interpreter; Lightning starts rank 1
        ["fit", "--config", str(config), *OWN_CHECKPOINT, *TINY, *DDP_ARGS],
        cwd=tmp_path,
        env=launch_env(OMP_NUM_THREADS="1"),
        timeout=400,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (folder,) = tmp_path.glob("mlflow_runs/*/*/checkpoints")
    # Two processes share each epoch: each trains on ceil(N / 2) samples in batches of 64.
    data = DigitsDataModule(batch_size=64, seed=0)
    data.setup("fit")
    samples = len(data.train_dataloader().dataset)
    check_checkpoint_folder(folder, steps_per_epoch=math.ceil(math.ceil(samples / 2) / 64))


# --- 2. each checkpoint stored once -----------------------------------------------------------


@pytest.mark.slow
def test_each_checkpoint_is_stored_once(fit):
    run_id = fit.trainer.logger.run_id
    run_folder = Path(fit.trainer.checkpoint_callback.dirpath)
    best = Path(fit.trainer.checkpoint_callback.best_model_path)
    # Every .ckpt under the working directory, one entry per file stored on disk (inode).
    stored: dict[tuple[int, int], list[Path]] = {}
    for path in fit.folder.rglob("*.ckpt"):
        if path.is_file() and not path.is_symlink():
            status = path.stat()
            stored.setdefault((status.st_dev, status.st_ino), []).append(path)
    assert len(stored) == len(list(run_folder.glob("*.ckpt")))  # no file beyond the run's own
    names = Counter(paths[0].name for paths in stored.values())
    assert max(names.values()) == 1, names
    # MLflow still lists the best checkpoint, and reads the run folder's bytes.
    client = client_of(fit)
    assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == [
        f"checkpoints/{best.name}"
    ]
    artifact = fit.trainer.logger.local_artifact_dir() / "checkpoints" / best.name
    assert os.path.samefile(artifact, best)
    digest = hashlib.sha256(best.read_bytes()).hexdigest()
    assert hashlib.sha256(artifact.read_bytes()).hexdigest() == digest
    assert load(artifact)["tracking"]["run_id"] == run_id


# --- 4. constants are params, scheduled values are metrics ------------------------------------


@pytest.mark.slow
def test_only_the_annealed_gamma_is_a_metric(fit):
    client, run_id = client_of(fit), fit.trainer.logger.run_id
    run = client.get_run(run_id)
    gamma = client.get_metric_history(run_id, "criterion/gamma")
    total = EPOCHS * BATCHES  # GammaAnnealing(0 -> 1): gamma = step / (T - 1), 1 at the last
    assert [m.step for m in gamma] == list(range(total))
    for metric in gamma:
        assert math.isclose(metric.value, metric.step / (total - 1), rel_tol=1e-6, abs_tol=1e-7)
    assert gamma[-1].value == 1.0
    for name in ("label_smoothing", "threshold"):
        assert client.get_metric_history(run_id, f"criterion/{name}") == []
        assert f"criterion/{name}" not in run.data.metrics
        assert run.data.params[f"model.criterion.init_args.{name}"] == "0.0"  # a param
    assert run.data.params["model.criterion.init_args.gamma"] == "0.0"


class PlainModule(LossMixin, L.LightningModule):
    """A plain LightningModule with ``LossMixin``: a linear layer and gamma-CE."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.set_criterion("gamma_ce", gamma=0.5)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.compute_loss(self.layer(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RaiseThreshold(Callback):
    """The user's own change: ``criterion.threshold = 0.2`` from step 3 on (no schedule)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step >= 3:
            pl_module.criterion.threshold = 0.2


def plain_fit(tmp_path: Path, callbacks: list[Callback]) -> dict[str, dict[int, float]]:
    """Fit :class:`PlainModule` 6 steps; the CSV history ``{metric: {step: value}}``."""
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(12, 4, generator=generator), torch.arange(12) % 3)
    trainer = L.Trainer(
        max_epochs=3,
        callbacks=callbacks,
        logger=CSVLogger(tmp_path, name="plain"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(PlainModule(), DataLoader(data, batch_size=6))
    (path,) = tmp_path.glob("plain/*/metrics.csv")
    history: dict[str, dict[int, float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if key != "step" and value:
                    history.setdefault(key, {})[int(row["step"])] = float(value)
    return history


def test_plain_module_without_schedule_logs_no_criterion_metric(tmp_path):
    history = plain_fit(tmp_path, [])
    assert list(history["train/loss"]) == list(range(6))  # the logger saw every step
    assert not [key for key in history if key.startswith("criterion/")]


def test_plain_module_logs_what_a_schedule_or_a_callback_changes(tmp_path):
    schedule = LossScheduler("label_smoothing", LinearSchedule(0.0, 0.25, start=0, end=5))
    history = plain_fit(tmp_path, [schedule, RaiseThreshold()])
    assert sorted(k for k in history if k.startswith("criterion/")) == [
        "criterion/label_smoothing",
        "criterion/threshold",
    ]
    smoothing = history["criterion/label_smoothing"]
    assert list(smoothing) == list(range(6))
    for step, value in smoothing.items():
        assert math.isclose(value, 0.25 * step / 5, rel_tol=1e-6)
    threshold = history["criterion/threshold"]
    assert list(threshold) == [3, 4, 5]  # from the step it changed on
    assert all(math.isclose(value, 0.2, rel_tol=1e-6) for value in threshold.values())


def test_plain_module_logs_what_a_loss_switch_changes(tmp_path):
    criteria = [{"name": "gamma_ce", "gamma": 0.0}, {"name": "gamma_ce", "gamma": 1.0}]
    history = plain_fit(tmp_path, [LossSwitch(criteria, milestones=[1])])  # 2 steps an epoch
    assert [k for k in history if k.startswith("criterion/")] == ["criterion/gamma"]
    assert history["criterion/gamma"] == {0: 0.0, 1: 0.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}


@pytest.mark.slow
def test_a_file_system_without_hard_links_gets_a_copy(tmp_path, monkeypatch):
    from lightning_losses.tracking import TrackingLogger

    logger = TrackingLogger(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", save_dir=str(tmp_path))
    source = tmp_path / "best.ckpt"
    source.write_bytes(b"weights")

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)
    logger.log_file(source, artifact_path="checkpoints", link=True)
    copied = logger.local_artifact_dir() / "checkpoints" / "best.ckpt"
    assert copied.read_bytes() == b"weights"
    assert not os.path.samefile(copied, source)
    listed = logger.experiment.list_artifacts(logger.run_id, "checkpoints")
    assert [a.path for a in listed] == ["checkpoints/best.ckpt"]


# --- 9. the closing summary -----------------------------------------------------------------


@pytest.mark.slow
def test_closing_summary_gives_the_final_values_diagram_and_files(fit):
    from lightning_losses.tracking import metric_history

    client, run_id = client_of(fit), fit.trainer.logger.run_id
    lines = fit.stdout.splitlines()
    uri = f"sqlite:///{fit.folder / 'mlflow.db'}"
    run_line = f"MLflow run {run_id} (experiment 'lightning-losses') in {uri}"
    closing = lines[lines.index(f"lightning-losses fit: {run_line}") + 1 :][:4]
    values = closing[0]
    assert values.startswith("  final validation: ")
    printed = dict(re.findall(r"(val/\w+) (\S+?)(?:,|$)", values))
    assert sorted(printed) == ["val/acc", "val/ece", "val/nll"]
    for key, text in printed.items():
        last = metric_history(client, run_id, key)[-1]
        assert last.step == EPOCHS * BATCHES - 1  # the last validation
        assert text == f"{last.value:.4f}"
    run_folder = Path(fit.trainer.checkpoint_callback.dirpath).parent
    diagram = run_folder / "calibration" / f"val_epoch={EPOCHS - 1:03d}.png"
    assert diagram.is_file()
    assert closing[1:] == [
        f"  reliability diagram: {diagram}",
        f"  checkpoints: {run_folder / 'checkpoints'}",
        f"  to see it: mlflow ui --backend-store-uri {uri}",
    ]


def test_closing_summary_never_prints_a_password():
    from types import SimpleNamespace

    from lightning_losses.tracking import describe_run

    secret = "s3cret-Pa55"
    logger = SimpleNamespace(
        _tracking_uri=f"postgresql+psycopg2://mlflow:{secret}@db.example:5432/mlflow",
        _experiment_name="lightning-losses",
        run_id="0" * 32,
        spooled=1,  # a run kept in the spool: the summary does not ask the store
    )
    text = describe_run(logger, ["runs/ckpt"], {"val/acc": 0.5}, None)
    assert secret not in text
    assert "postgresql+psycopg2://mlflow:***@db.example:5432/mlflow" in text
