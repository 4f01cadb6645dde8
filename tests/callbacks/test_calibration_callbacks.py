"""CalibrationMonitor and TemperatureScalingCallback inside real Lightning fits."""

from __future__ import annotations

import csv

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger

from lightning_losses import LossMixin
from lightning_losses.callbacks import CalibrationMonitor, TemperatureScalingCallback
from lightning_losses.data.digits import DigitsDataModule, NMDigitsDataModule, RareDigitDataModule
from lightning_losses.lightning.classifier import ClassifierModule


def fit(tmp_path, model, dm, callbacks, epochs=2, **kwargs):
    options = {"enable_checkpointing": False, **kwargs}
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=CSVLogger(tmp_path, name="run"),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **options,
    )
    trainer.fit(model, dm)
    return trainer


def validation_logits(model, dm):
    """The model's logits on the whole validation split, computed independently."""
    model.eval()
    xs, ys = zip(*dm.val_dataloader(), strict=True)
    with torch.no_grad():
        return model(torch.cat(xs)).double(), torch.cat(ys)


def numpy_top_label_errors(logits, target, n_bins=15):
    """ECE, MCE, RMSCE with bins (k/B, (k+1)/B] written plainly in numpy."""
    probs = torch.softmax(logits, dim=1).numpy()
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == target.numpy()).astype(float)
    ece = mce = sq = 0.0
    for k in range(n_bins):
        low, high = k / n_bins, (k + 1) / n_bins
        members = (confidence > low) & (confidence <= high)
        if k == 0:
            members |= confidence == 0
        if members.any():
            gap = abs(confidence[members].mean() - correct[members].mean())
            weight = members.mean()
            ece += weight * gap
            sq += weight * gap**2
            mce = max(mce, gap)
    return ece, mce, np.sqrt(sq)


def test_monitor_logs_the_metrics_of_the_validation_set(tmp_path):
    L.seed_everything(0)
    dm = DigitsDataModule(batch_size=100)
    model = ClassifierModule("focal", hidden=[32])
    monitor = CalibrationMonitor(n_bins=15, diagram_every_n_epochs=1)
    trainer = fit(tmp_path, model, dm, [monitor])
    logits, target = validation_logits(model, dm)
    ece, mce, rmsce = numpy_top_label_errors(logits, target)
    metrics = trainer.callback_metrics
    assert float(metrics["val/ece"]) == pytest.approx(ece, abs=1e-6)
    assert float(metrics["val/mce"]) == pytest.approx(mce, abs=1e-6)
    assert float(metrics["val/rmsce"]) == pytest.approx(rmsce, abs=1e-6)
    probs = torch.softmax(logits, dim=1)
    nll = F.cross_entropy(logits, target)
    brier = ((probs - F.one_hot(target, 10)) ** 2).sum(dim=1).mean()
    accuracy = (probs.argmax(1) == target).double().mean()
    assert float(metrics["val/nll"]) == pytest.approx(float(nll), abs=1e-5)
    assert float(metrics["val/brier"]) == pytest.approx(float(brier), abs=1e-6)
    # The module's val/acc is the one accuracy logged (the monitor leaves it to the module).
    assert float(metrics["val/acc"]) == pytest.approx(float(accuracy), abs=1e-6)
    assert "val/accuracy" not in metrics
    assert float(metrics["val/confidence"]) == pytest.approx(
        float(probs.max(1).values.mean()), abs=1e-6
    )
    # One diagram per validation epoch, in the logger's directory.
    diagrams = sorted((tmp_path / "run" / "version_0" / "calibration").glob("val_epoch=*.png"))
    assert [p.name for p in diagrams] == ["val_epoch=000.png", "val_epoch=001.png"]
    assert diagrams[-1].stat().st_size > 5_000


@pytest.mark.parametrize("final", [True, False])
def test_monitor_by_default_draws_only_the_last_validation_epoch(tmp_path, final):
    dm = DigitsDataModule(batch_size=200)
    model = ClassifierModule("ce", hidden=[16])
    monitor = CalibrationMonitor(final_diagram=final)
    assert monitor.diagram_every_n_epochs == 0
    fit(tmp_path, model, dm, [monitor], epochs=3)
    folder = tmp_path / "run" / "version_0" / "calibration"
    expected = ["val_epoch=002.png"] if final else []
    assert sorted(p.name for p in folder.glob("*.png")) == expected


def test_monitor_diagram_every_n_epochs_and_test_stage(tmp_path):
    dm = DigitsDataModule(batch_size=200)
    model = ClassifierModule("ce", hidden=[16])
    monitor = CalibrationMonitor(diagram_every_n_epochs=2, adaptive=True, classwise=True)
    trainer = fit(tmp_path, model, dm, [monitor], epochs=3)
    folder = tmp_path / "run" / "version_0" / "calibration"
    # epoch 1 (every 2nd), and epoch 2 as the final diagram of training
    assert sorted(p.name for p in folder.glob("*.png")) == [
        "val_epoch=001.png",
        "val_epoch=002.png",
    ]
    assert "val/adaptive_ece" in trainer.callback_metrics
    assert "val/classwise_ece" in trainer.callback_metrics
    trainer.test(model, dm)
    # The weights tested are those of the last epoch trained, epoch 2.
    assert [p.name for p in folder.glob("test_*.png")] == ["test_epoch=002.png"]
    assert 0.0 <= float(trainer.callback_metrics["test/ece"]) <= 1.0


@pytest.mark.parametrize("kind", ["binary", "nm"])
def test_monitor_other_tasks(tmp_path, kind):
    if kind == "binary":
        dm = RareDigitDataModule(batch_size=128, positive_fraction=0.2)
        criterion = "binary_focal"
    else:
        dm = NMDigitsDataModule(batch_size=128)
        criterion = "nm_ce"
    model = ClassifierModule(
        criterion,
        input_dim=dm.num_features,
        num_classes=dm.num_classes,
        num_tasks=dm.num_tasks,
        task=dm.task,
        hidden=[16],
    )
    trainer = fit(tmp_path, model, dm, [CalibrationMonitor()], epochs=1)
    model.eval()
    xs, ys = zip(*dm.val_dataloader(), strict=True)
    with torch.no_grad():
        logits, target = model(torch.cat(xs)).double(), torch.cat(ys)
    if kind == "binary":
        p = torch.sigmoid(logits)
        expected_brier = float(((p - target.double()) ** 2).mean())
    else:
        p = torch.softmax(logits, dim=2).flatten(0, 1)
        onehot = F.one_hot(target.flatten(), 3).double()
        expected_brier = float(((p - onehot) ** 2).sum(1).mean())
    assert float(trainer.callback_metrics["val/brier"]) == pytest.approx(expected_brier, abs=1e-6)


class NoLogits(ClassifierModule):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        return self.compute_loss(self(x), y)


def test_monitor_names_what_is_missing(tmp_path):
    model = NoLogits("ce", hidden=[8])
    with pytest.raises(ValueError, match="'logits' and 'target'") as error:
        fit(tmp_path, model, DigitsDataModule(), [CalibrationMonitor()], epochs=1)
    assert "NoLogits" in str(error.value)


def test_temperature_scaling_callback_fits_the_validation_logits(tmp_path):
    L.seed_everything(0)
    dm = DigitsDataModule(batch_size=64)
    # A small training set seen many times makes the model overconfident.
    model = ClassifierModule("ce", hidden=[64], temperature=0.5)
    callback = TemperatureScalingCallback(apply_to_model=False)
    trainer = fit(tmp_path, model, dm, [callback], epochs=8)
    logits, target = validation_logits(model, dm)
    # Independent check of optimality: NLL at T is below NLL at T * 1.05 and T / 1.05.
    temperature = callback.report["temperature"]

    def nll(t):
        return float(F.cross_entropy(logits / t, target))

    assert nll(temperature) < nll(temperature * 1.05)
    assert nll(temperature) < nll(temperature / 1.05)
    assert callback.report["nll_after"] == pytest.approx(nll(temperature), abs=1e-6)
    assert callback.report["nll_after"] <= callback.report["nll_before"]
    logged = (tmp_path / "run" / "version_0" / "metrics.csv").read_text()
    assert "calibration/temperature" in logged
    assert trainer.state.finished


# ----------------------------------------------------------------------------------------------
# input_format="probs" is checked; names the module logs stay the module's
# ----------------------------------------------------------------------------------------------


def test_monitor_with_probs_rejects_logits_before_any_training_step(tmp_path):
    model = ClassifierModule("ce", hidden=[8])  # returns logits
    before = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[CalibrationMonitor(input_format="probs")],
    )
    with pytest.raises(ValueError, match="values outside \\[0, 1\\]: min -") as error:
        trainer.fit(model, DigitsDataModule(batch_size=100))
    message = str(error.value)
    assert 'CalibrationMonitor(input_format="probs")' in message
    assert "input_format='logits'" in message
    assert trainer.global_step == 0  # raised in the sanity check, before training
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


class Outputs(ClassifierModule):
    """Hands the callbacks ``transform(logits)`` instead of the logits it logs its metrics on.

    Built by :func:`outputs`: as an argument of ``__init__``, ``transform`` would be taken for a
    hyper-parameter (a lambda, which Lightning cannot save and warns about).
    """

    def __init__(self) -> None:
        super().__init__("ce", hidden=[16])
        self.transform = None

    def validation_step(self, batch, batch_idx):
        output = super().validation_step(batch, batch_idx)
        return {**output, "logits": self.transform(output["logits"])}


def outputs(transform) -> Outputs:
    """An :class:`Outputs` module handing the callbacks ``transform(logits)``."""
    model = Outputs()
    model.transform = transform
    return model


def test_monitor_with_probs_rejects_rows_that_do_not_sum_to_one(tmp_path):
    model = outputs(torch.sigmoid)  # in [0, 1], but rows sum to about 5
    with pytest.raises(ValueError, match="rows that do not sum to 1: sums from"):
        fit(tmp_path, model, DigitsDataModule(), [CalibrationMonitor(input_format="probs")], 1)


def test_monitor_with_probs_accepts_softmax_outputs(tmp_path):
    dm = DigitsDataModule(batch_size=100)
    model = outputs(lambda logits: torch.softmax(logits, dim=1))
    trainer = fit(tmp_path, model, dm, [CalibrationMonitor(input_format="probs")], epochs=1)
    logits, target = validation_logits(model, dm)
    ece, _, _ = numpy_top_label_errors(logits, target)
    assert float(trainer.callback_metrics["val/ece"]) == pytest.approx(ece, abs=1e-6)


def logged_column(tmp_path, name):
    """Every value of ``name`` that reached the CSV logger, in order."""
    rows = csv.DictReader((tmp_path / "run" / "version_0" / "metrics.csv").open())
    return [float(row[name]) for row in rows if row.get(name)]


def test_the_module_val_nll_reaches_the_logger_and_the_checkpoint_monitor(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    L.seed_everything(0)
    dm = DigitsDataModule(batch_size=100)
    # The monitor sees logits * 3: its NLL differs from the module's own val/nll.
    model = outputs(lambda logits: 3 * logits)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/nll", mode="min")
    callbacks = [CalibrationMonitor(), checkpoint]
    trainer = fit(tmp_path, model, dm, callbacks, epochs=1, enable_checkpointing=True)
    assert trainer.state.finished
    logits, target = validation_logits(model, dm)
    own_nll = float(F.cross_entropy(logits, target))
    monitor_nll = float(F.cross_entropy(3 * logits, target))
    assert abs(own_nll - monitor_nll) > 0.1
    assert logged_column(tmp_path, "val/nll") == [pytest.approx(own_nll, abs=1e-6)]
    assert float(checkpoint.best_model_score) == pytest.approx(own_nll, abs=1e-6)
    # The monitor still logs its other metrics, those of what it was given.
    ece, _, _ = numpy_top_label_errors(3 * logits, target)
    assert logged_column(tmp_path, "val/ece") == [pytest.approx(ece, abs=1e-6)]


class EpochEndNll(LossMixin, L.LightningModule):
    """A plain module that logs only its own val/nll, from its epoch-end hook (after callbacks')."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 10)
        self.set_criterion("ce")

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.compute_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return self.validation_output(self.layer(x), y)

    def on_validation_epoch_end(self):
        self.log("val/nll", 42.0)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_val_nll_logged_at_epoch_end_is_the_module_one_in_every_epoch(tmp_path):
    model = EpochEndNll()
    fit(tmp_path, model, DigitsDataModule(batch_size=200), [CalibrationMonitor()], epochs=2)
    assert logged_column(tmp_path, "val/nll") == [42.0, 42.0]
    assert len(logged_column(tmp_path, "val/ece")) == 2


class NoTemperature(LossMixin, L.LightningModule):
    """A plain module with a criterion but no ``temperature`` attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 10)
        self.set_criterion("ce")

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        raise AssertionError("training must not start")

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return self.validation_output(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_apply_to_model_without_a_temperature_fails_at_setup(tmp_path):
    dm = DigitsDataModule(batch_size=64)
    callback = TemperatureScalingCallback(apply_to_model=True)
    with pytest.raises(
        ValueError, match=r"apply_to_model=True\) scales NoTemperature\.temperature"
    ):
        fit(tmp_path, NoTemperature(), dm, [callback])
