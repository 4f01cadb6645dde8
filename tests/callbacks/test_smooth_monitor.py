"""The smooth ECE as an option: CalibrationSummary(smooth=True) and CalibrationMonitor(smooth=True).

References: :func:`smooth_calibration_error` on the same (hand-masked) data, and the summary
without the option for every other number. The monitor runs in a plain LightningModule that
inherits nothing of lightning_losses, fitted for two epochs, then tested from its checkpoint.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.calibration import (
    CalibrationSummary,
    SmoothCalibrationError,
    smooth_calibration_error,
)
from lightning_losses.callbacks import CalibrationMonitor

IGNORE = -100
CLASSES, FEATURES = 4, 6


def data(n: int = 240, seed: int = 0, ignored: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=gen)
    target = torch.randint(0, CLASSES, (n,), generator=gen)
    target[torch.randperm(n, generator=gen)[:ignored]] = IGNORE
    return x, target


@pytest.mark.parametrize("input_format", ["probs", "logits"])
@pytest.mark.parametrize("ignore_index", [None, IGNORE])
def test_summary_smooth_ece_equals_the_function(input_format, ignore_index):
    gen = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(500, CLASSES, generator=gen, dtype=torch.float64)
    target = torch.randint(0, CLASSES, (500,), generator=gen)
    if ignore_index is not None:
        target[::7] = ignore_index
    preds = logits if input_format == "logits" else logits.softmax(1)
    options = {"input_format": input_format, "ignore_index": ignore_index}
    smooth = CalibrationSummary(smooth=True, **options)
    plain = CalibrationSummary(**options)
    for rows in torch.arange(500).split(77):
        smooth.update(preds[rows], target[rows])
        plain.update(preds[rows], target[rows])
    values, want = smooth.compute(), plain.compute()
    assert sorted(values) == sorted([*want, "smooth_ece"])
    for name in want:
        assert torch.equal(values[name], want[name]), name
    reference = smooth_calibration_error(preds, target, **options)
    assert abs(values["smooth_ece"].item() - reference.item()) < 1e-12
    metric = SmoothCalibrationError(**options)
    metric.update(preds, target)
    for ours, theirs in zip(smooth.grid(), metric.grid(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    assert plain.grid() is None


def test_summary_and_monitor_smooth_must_be_a_bool():
    with pytest.raises(TypeError, match="smooth must be True or False"):
        CalibrationSummary(smooth="yes")
    with pytest.raises(TypeError, match="smooth must be True or False"):
        CalibrationMonitor(smooth=1)


class Plain(pl.LightningModule):
    """Nothing of lightning_losses: a linear classifier returning logits and targets."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        return 4 * self.layer(x)

    def training_step(self, batch, batch_idx):
        x, target = batch
        return nn.functional.cross_entropy(self(x), target, ignore_index=IGNORE)

    def validation_step(self, batch, batch_idx):
        x, target = batch
        return {"logits": self(x), "target": target}

    def test_step(self, batch, batch_idx):
        return self.validation_step(batch, batch_idx)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def trainer(root, monitor, **kw):
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        default_root_dir=root,
        logger=pl.loggers.CSVLogger(root),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[monitor],
        **kw,
    )


# Lightning's note that a checkpoint tested by a second trainer was written in another folder.
@pytest.mark.filterwarnings("ignore:The dirpath has changed from:UserWarning")
def test_monitor_logs_smooth_ece_and_saves_both_diagrams(tmp_path):
    torch.manual_seed(0)
    module = Plain()
    x, target = data(ignored=30)
    train = DataLoader(TensorDataset(*data(seed=1)), batch_size=32)
    val = DataLoader(TensorDataset(x, target), batch_size=50)  # 240 = 4 x 50 + 40
    monitor = CalibrationMonitor(smooth=True, ignore_index=IGNORE)
    fit = trainer(tmp_path, monitor, max_epochs=2, num_sanity_val_steps=0)
    fit.fit(module, train, val)
    with torch.no_grad():
        logits = module(x)
    want = smooth_calibration_error(logits, target, input_format="logits", ignore_index=IGNORE)
    assert float(fit.callback_metrics["val/smooth_ece"]) == pytest.approx(want.item(), abs=1e-6)
    folder = monitor.last_diagram.parent
    assert monitor.last_diagram.name == "val_epoch=001.png"
    assert monitor.last_smooth_diagram == folder / "val_smooth_epoch=001.png"
    assert monitor.last_smooth_diagram.stat().st_size > 10_000

    checkpoint = next((tmp_path / "lightning_logs").rglob("*.ckpt"))
    tester = CalibrationMonitor(smooth=True, ignore_index=IGNORE)
    test = trainer(tmp_path / "test", tester)
    test.test(Plain(), val, ckpt_path=checkpoint, verbose=False)
    assert float(test.callback_metrics["test/smooth_ece"]) == pytest.approx(want.item(), abs=1e-6)
    assert tester.last_smooth_diagram.name == "test_smooth_epoch=001.png"
    assert tester.last_smooth_diagram.exists()


def test_monitor_without_smooth_logs_and_draws_no_smooth_ece(tmp_path):
    monitor = CalibrationMonitor()
    run = trainer(tmp_path, monitor, max_epochs=1, num_sanity_val_steps=0)
    loader = DataLoader(TensorDataset(*data()), batch_size=60)
    run.fit(Plain(), loader, loader)
    assert "val/smooth_ece" not in run.callback_metrics
    assert monitor.last_smooth_diagram is None
    assert not list(monitor.last_diagram.parent.glob("*smooth*"))
