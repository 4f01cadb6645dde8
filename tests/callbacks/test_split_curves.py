"""SplitCurves: the logged curve values against plain float64 formulas on the same model."""

from __future__ import annotations

import csv
import math

import lightning as L
import pytest
import torch

from lightning_losses.callbacks import SplitCurves
from lightning_losses.data.digits import DigitsDataModule, RareDigitDataModule
from lightning_losses.lightning.classifier import ClassifierModule


def fit(tmp_path, callback: SplitCurves, epochs: int, datamodule, **model_args):
    L.seed_everything(0)
    model = ClassifierModule(hidden=[16], **model_args)
    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="curves")
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=logger,
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=2,
    )
    trainer.fit(model, datamodule=datamodule)
    with open(f"{logger.log_dir}/metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    return model, rows


def curve_rows(rows, key):
    return [(int(row["step"]), float(row[key])) for row in rows if row.get(key)]


def reference(model, datamodule, split: str, n_bins: int = 15) -> dict[str, float]:
    """NLL, accuracy and ECE of the whole split, float64, written out as loops."""
    features, target = datamodule.dataset(split).tensors
    model.eval()
    with torch.no_grad():
        logits = model(features).double()
    if logits.ndim == 1:
        p = torch.sigmoid(logits)
        y = target.double()
        nll = float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())
        accuracy = float(((p > 0.5).double() == y).double().mean())
        # binary ECE of the positive class, as CalibrationMonitor (and netcal) compute it
        confidence, correct = p, y
    else:
        log_probs = torch.log_softmax(logits, dim=1)
        nll = float(-log_probs[torch.arange(len(target)), target].mean())
        confidence, predicted = log_probs.exp().max(dim=1)
        correct = (predicted == target).double()
        accuracy = float(correct.mean())
    ece = 0.0
    for k in range(n_bins):
        members = (confidence > k / n_bins) & (confidence <= (k + 1) / n_bins)
        if k == 0:
            members |= confidence == 0
        if members.any():
            gap = abs(float(confidence[members].mean() - correct[members].mean()))
            ece += float(members.double().mean()) * gap
    return {"nll": nll, "acc": accuracy, "ece": ece}


def test_curves_are_logged_every_n_epochs_and_at_the_last(tmp_path):
    dm = DigitsDataModule(batch_size=64)
    model, rows = fit(tmp_path, SplitCurves("test", every_n_epochs=2), 3, dm, criterion="focal")
    steps_per_epoch = math.ceil(len(dm.split_indices["train"]) / 64)
    for name in ("nll", "acc", "ece"):
        logged = curve_rows(rows, f"curve/test_{name}")
        # epochs 2 and 3 (the last), never the sanity check
        assert [step for step, _ in logged] == [2 * steps_per_epoch, 3 * steps_per_epoch]
    expected = reference(model, dm, "test")
    for name, value in expected.items():
        assert curve_rows(rows, f"curve/test_{name}")[-1][1] == pytest.approx(value, abs=1e-6)


def test_binary_curves_use_the_sigmoid_and_the_monitors_ece_convention(tmp_path):
    dm = RareDigitDataModule(batch_size=128)
    model, rows = fit(
        tmp_path,
        SplitCurves("val", every_n_epochs=1),
        1,
        dm,
        task="binary",
        criterion="binary_focal",
    )
    expected = reference(model, dm, "val")
    for name, value in expected.items():
        assert curve_rows(rows, f"curve/val_{name}")[-1][1] == pytest.approx(value, abs=1e-6)


# The fit is given no validation data, on purpose: Lightning notes it before SplitCurves fails.
@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
def test_a_trainer_without_the_split_fails_at_setup():
    dm = DigitsDataModule(batch_size=64)
    trainer = L.Trainer(
        max_epochs=1, accelerator="cpu", logger=False, callbacks=[SplitCurves("test")]
    )
    model = ClassifierModule(hidden=[8])
    with pytest.raises(ValueError, match=r"SplitCurves\(split='test'\).*no DataModule"):
        trainer.fit(model, train_dataloaders=dm.train_dataloader())
    assert trainer.global_step == 0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"split": "holdout"}, "split must be one of 'train', 'val', 'test'; got 'holdout'"),
        ({"every_n_epochs": 0}, "every_n_epochs must be >= 1; got 0"),
        ({"n_bins": 2.5}, r"n_bins must be an int >= 1; got 2\.5 \(float\)"),
    ],
)
def test_bad_arguments_name_the_argument(arguments, message):
    with pytest.raises(ValueError, match=message):
        SplitCurves(**arguments)
