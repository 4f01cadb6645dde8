"""AdaFocalUpdate in training: the gammas follow the paper's rule, resume exactly, agree under DDP.

The references replay the reference implementation's update (Ghosh, Schaaf, Gormley, "AdaFocal:
Calibration-aware Adaptive Focal Loss", NeurIPS 2022) written plainly here: numpy's interpolated
equal-mass edges, a loop over the bins, and the multiplicative rule in Python floats.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from helpers.ddp import DDP_ARGS, run_ddp_console
from helpers.paths import CONFIGS
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import Logger
from torch import nn

from lightning_losses import AdaFocalLoss, FocalLoss, cli
from lightning_losses.callbacks import AdaFocalUpdate
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.classifier import ClassifierModule

CONFIG = CONFIGS / "digits_adafocal.yaml"
QUICK = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


# --- the reference, plainly --------------------------------------------------------------------


def reference_update(
    gammas: list[float],
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    lam: float = 1.0,
    switch: float = 0.2,
    low: float = -20.0,
    high: float = 20.0,
) -> tuple[list[float], np.ndarray]:
    """One validation epoch's update: (new gammas, edges), float64, loops."""
    probs = torch.softmax(logits.double(), dim=1)
    confidence, prediction = probs.max(dim=1)
    conf = confidence.numpy()
    correct = (prediction == target).double().numpy()
    n, bins = len(conf), len(gammas)
    edges = np.interp(np.linspace(0, n, bins + 1), np.arange(n), np.sort(conf))
    new = []
    for k in range(bins):
        members = (conf > edges[k]) & (conf <= edges[k + 1])
        if k == 0:
            members |= conf == edges[0]  # ours: the smallest confidence is in the first bin
        gap = float(conf[members].mean() - correct[members].mean()) if members.any() else 0.0
        g = gammas[k]
        g = g * math.exp(lam * gap) if g > 0 else g * math.exp(-lam * gap)
        if abs(g) < switch:
            g = -switch if g > 0 else switch
        new.append(max(min(g, high), low))
    return new, edges


# --- a plain LightningModule: nothing of ours but the loss and the callback ----------------------


class PlainModule(L.LightningModule):
    """A user's own module: its own layers, optimizer and steps; it keeps its validation logits."""

    def __init__(self, criterion: nn.Module) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.criterion = criterion
        self.val_logits: dict[int, list[torch.Tensor]] = {}
        self.val_target: dict[int, list[torch.Tensor]] = {}
        self.gammas_in_training: dict[int, list[float]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.gammas_in_training.setdefault(self.current_epoch, self.criterion.gammas.tolist())
        return self.criterion(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        logits = self(x)
        if not self.trainer.sanity_checking:
            self.val_logits.setdefault(self.current_epoch, []).append(logits.detach())
            self.val_target.setdefault(self.current_epoch, []).append(y)
        return {"logits": logits, "target": y}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


class MetricsRecorder(Logger):
    """A logger that keeps what it is given (a real Lightning logger, in memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))


def trainer(tmp_path: Path, **kwargs: Any) -> L.Trainer:
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "deterministic": True,
        "default_root_dir": tmp_path,
    }
    options.update(kwargs)
    return L.Trainer(**options)


def test_gammas_follow_the_reference_update_in_a_plain_module(tmp_path):
    L.seed_everything(0)
    model = PlainModule(AdaFocalLoss(num_bins=15))
    recorder = MetricsRecorder()
    update = AdaFocalUpdate(final_diagram=True)
    t = trainer(tmp_path, max_epochs=3, callbacks=[update], logger=recorder)
    t.fit(model, DigitsDataModule(batch_size=64))

    gammas = [1.0] * 15
    logged = {step: m for step, m in recorder.logged if "adafocal/gamma_00" in m}
    for epoch in range(3):
        # The training of this epoch used the gammas of the previous validation.
        assert model.gammas_in_training[epoch] == pytest.approx(gammas, abs=1e-12)
        logits = torch.cat(model.val_logits[epoch])
        target = torch.cat(model.val_target[epoch])
        assert logits.shape[0] == 359  # the whole validation split, the sanity check excluded
        gammas, edges = reference_update(gammas, logits, target)
        assert [logged[epoch][f"adafocal/gamma_{k:02d}"] for k in range(15)] == pytest.approx(
            gammas, abs=1e-12
        )
    assert model.criterion.gammas.tolist() == pytest.approx(gammas, abs=1e-12)
    assert model.criterion.edges.numpy() == pytest.approx(edges, abs=1e-12)
    assert sorted(logged) == [0, 1, 2]  # one value per bin per epoch, stepped by the epoch
    assert update.last_diagram is not None
    assert update.last_diagram.name == "adafocal_epoch=002.png"
    assert update.last_diagram.stat().st_size > 10_000
    assert gammas != [1.0] * 15  # the loop did move the gammas


def test_a_criterion_that_is_not_adafocal_fails_at_setup(tmp_path):
    model = PlainModule(FocalLoss(gamma=1.0))
    t = trainer(tmp_path, max_epochs=1, callbacks=[AdaFocalUpdate()])
    with pytest.raises(TypeError, match=r"PlainModule\.criterion to be an AdaFocalLoss.*FocalLoss"):
        t.fit(model, DigitsDataModule(batch_size=64))
    assert t.global_step == 0

    class NoCriterion(PlainModule):
        def __init__(self) -> None:
            super().__init__(nn.CrossEntropyLoss())
            del self.criterion

    with pytest.raises(
        ValueError, match=r"^AdaFocalUpdate\(attribute='criterion'\): NoCriterion has no attribute"
    ):
        trainer(tmp_path, max_epochs=1, callbacks=[AdaFocalUpdate()]).fit(
            NoCriterion(), DigitsDataModule(batch_size=64)
        )


def test_a_validation_step_without_logits_fails_on_the_sanity_batch(tmp_path):
    class ReturnsLoss(PlainModule):
        def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return self.criterion(self(x), y)

    t = trainer(tmp_path, max_epochs=1, callbacks=[AdaFocalUpdate()])
    with pytest.raises(ValueError, match="return a dict with 'logits' and 'target'"):
        t.fit(ReturnsLoss(AdaFocalLoss()), DigitsDataModule(batch_size=64))
    assert t.global_step == 0  # before any training step


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lambda_": 0.0}, r"lambda_ must lie in \(0, inf\)"),
        ({"lambda_": -1.0}, r"lambda_ must lie in \(0, inf\)"),
        ({"gamma_min": 5.0, "gamma_max": 1.0}, "gamma_min must be below gamma_max"),
        ({"gamma_min": 2.0, "gamma_max": 2.0}, "gamma_min must be below gamma_max"),
        ({"switch_point": -0.1}, r"switch_point must lie in \[0, inf\)"),
        ({"diagram_every_n_epochs": -1}, "diagram_every_n_epochs must be >= 0"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaFocalUpdate(**kwargs)


def test_without_validation_it_warns_that_nothing_was_updated(tmp_path):
    model = PlainModule(AdaFocalLoss())
    t = trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    t.callbacks.append(AdaFocalUpdate())
    with pytest.warns(UserWarning, match="made no update in this fit"):
        t.fit(model, DigitsDataModule(batch_size=64))
    assert model.criterion.gammas.tolist() == [1.0] * 15


# --- resume: the state is in the checkpoint ---------------------------------------------------


class Preempted(RuntimeError):
    pass


class PreemptAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise Preempted(f"step {self.step}")


def adafocal_fit(tmp_path: Path, ckpt_path: Path | None = None, callbacks=()) -> tuple:
    """Four epochs of the ClassifierModule with AdaFocal on the digits (17 steps an epoch)."""
    L.seed_everything(0)
    model = ClassifierModule(AdaFocalLoss(num_bins=15), hidden=[32])
    recorder = MetricsRecorder()
    t = trainer(
        tmp_path,
        max_epochs=4,
        logger=recorder,
        callbacks=[AdaFocalUpdate(final_diagram=False), *callbacks],
        enable_checkpointing=bool(callbacks),
    )
    try:
        t.fit(model, DigitsDataModule(batch_size=64), ckpt_path=ckpt_path)
    except Preempted:
        pass
    gammas = {s: m for s, m in recorder.logged if "adafocal/gamma_00" in m}
    return model, gammas


# Lightning's note that the resumed trainer lacks the checkpoint's callbacks: on purpose (the
# Preemption / ModelCheckpoint that wrote it is not needed to resume).
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks used to create")
def test_resume_mid_epoch_gives_bit_identical_gammas_and_weights(tmp_path):
    straight, straight_gammas = adafocal_fit(tmp_path / "straight")
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_train_steps=40)
    adafocal_fit(tmp_path / "part", callbacks=[saver, PreemptAt(step=41)])
    path = tmp_path / "ckpt" / "epoch=2-step=40.ckpt"  # 6 steps into the third epoch
    checkpoint = torch.load(path, weights_only=True)
    saved = checkpoint["state_dict"]["criterion.gammas"]
    # Two validations have run: the checkpoint holds the gammas of the second one, exactly.
    assert saved.dtype == torch.float64
    assert saved.tolist() == [straight_gammas[1][f"adafocal/gamma_{k:02d}"] for k in range(15)]

    resumed, resumed_gammas = adafocal_fit(tmp_path / "resumed", ckpt_path=path)
    assert sorted(resumed_gammas) == [2, 3]
    for epoch in (2, 3):
        assert resumed_gammas[epoch] == straight_gammas[epoch]  # exact
    for key, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    assert torch.equal(straight.criterion.gammas, resumed.criterion.gammas)
    assert torch.equal(straight.criterion.edges, resumed.criterion.edges)


@pytest.mark.slow
def test_readme_resume_command_restores_the_gammas(tmp_path, monkeypatch):
    """``fit --config configs/digits_adafocal.yaml`` then ``--ckpt_path .../last.ckpt``."""
    monkeypatch.chdir(tmp_path)
    budget = [*QUICK, "--trainer.logger=false", "--trainer.limit_train_batches=4"]
    config = ["fit", "--config", str(CONFIG), *budget]
    straight = cli.main([*config, "--trainer.max_epochs=3"]).trainer.lightning_module
    (tmp_path / "straight").mkdir()
    for path in Path("checkpoints").iterdir():
        path.rename(tmp_path / "straight" / path.name)
    cli.main([*config, "--trainer.max_epochs=2"])
    last = Path("checkpoints") / "last.ckpt"
    assert torch.load(last, weights_only=True)["epoch"] == 1
    resumed = cli.main([*config, "--trainer.max_epochs=3", f"--ckpt_path={last}"])
    module = resumed.trainer.lightning_module
    assert module.criterion.gammas.tolist() != [1.0] * 15
    assert torch.equal(module.criterion.gammas, straight.criterion.gammas)
    assert torch.equal(module.criterion.edges, straight.criterion.edges)
    for key, value in straight.state_dict().items():
        assert torch.equal(value, module.state_dict()[key]), key


def test_load_from_checkpoint_keeps_the_saved_bins(tmp_path):
    model, _ = adafocal_fit(tmp_path / "fit", callbacks=[ModelCheckpoint(dirpath=tmp_path / "c")])
    (path,) = (tmp_path / "c").glob("*.ckpt")
    loaded = ClassifierModule.load_from_checkpoint(path, weights_only=True)
    assert torch.equal(loaded.criterion.gammas, model.criterion.gammas)
    assert loaded.criterion.gammas.dtype == torch.float64


# --- DDP: 2 gloo processes, uneven validation shares -------------------------------------------


@pytest.mark.slow
def test_ddp_gammas_equal_the_single_process_update(tmp_path):
    """One epoch under DDP; the validation after it used the final weights (last.ckpt)."""
    uri = f"sqlite:///{tmp_path}/ddp.db"
    run_ddp_console(
        [
            "fit",
            "--config",
            str(CONFIG),
            f"--trainer.logger.init_args.tracking_uri={uri}",
            "--data.init_args.batch_size=179",  # 359 validation rows: 180 on rank 0, 179 on 1
            *DDP_ARGS,
            "--trainer.max_epochs=1",
            *QUICK,
        ],
        tmp_path,
    )

    checkpoint = next((tmp_path / "mlflow_runs").rglob("last.ckpt"))
    model = ClassifierModule.load_from_checkpoint(checkpoint, weights_only=True).eval()
    features, target = DigitsDataModule().dataset("val").tensors
    with torch.no_grad():
        logits = model(features)
    expected, edges = reference_update([1.0] * 15, logits, target)
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert saved["criterion.gammas"].tolist() == pytest.approx(expected, abs=1e-6)
    assert saved["criterion.edges"].numpy() == pytest.approx(edges, abs=1e-6)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lightning-losses").experiment_id])
    for k in range(15):
        (point,) = client.get_metric_history(run.info.run_id, f"adafocal/gamma_{k:02d}")
        assert point.step == 0  # stepped by the epoch
        assert point.value == saved["criterion.gammas"][k].item()  # both processes agreed
