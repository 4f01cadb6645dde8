"""TemperatureScalingCallback with soft labels and with ``ignore_index``.

The soft-label fit is checked against the float64 cross-entropy written plainly here and
minimised by scipy (a dependency of scikit-learn, which the package requires); ``ignore_index``
against the fit on the rows masked by hand. The scaler's own soft-label and ``ignore_index``
tests are in tests/calibration/posthoc/test_temperature.py.
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.calibration.posthoc.temperature import TemperatureScaler, fit_temperature
from lightning_losses.callbacks import TemperatureScalingCallback

IGNORE = -100


def soft_labels(target: torch.Tensor, classes: int, seed: int = 1) -> torch.Tensor:
    """Annotator-like soft labels: most mass on the label, the rest spread at random."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.rand(target.shape[0], classes, generator=gen, dtype=torch.float64)
    q = 0.3 * noise / noise.sum(dim=1, keepdim=True)
    return q + 0.7 * F.one_hot(target, classes).double()


def plain_soft_nll(logits: torch.Tensor, q: torch.Tensor, t: float) -> float:
    """-(1/N) sum_i sum_c q_ic log softmax(z_i / T)_c in float64, term by term."""
    z = logits.double()
    total = 0.0
    for i in range(z.shape[0]):
        row = z[i] / t
        log_norm = math.log(sum(math.exp(float(v - row.max())) for v in row)) + float(row.max())
        total -= sum(float(q[i, c]) * (float(row[c]) - log_norm) for c in range(z.shape[1]))
    return total / z.shape[0]


# ----------------------------------------------------------------------------------------------
# TemperatureScalingCallback
# ----------------------------------------------------------------------------------------------


class PaddedClassifier(pl.LightningModule):
    """A plain LightningModule: [B, L, C] logits and [B, L] targets padded by -100."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(6, 4)

    def forward(self, x):
        return self.layer(x) * 4

    def training_step(self, batch, batch_idx):
        x, target = batch
        return F.cross_entropy(self(x).flatten(0, 1), target.flatten(), ignore_index=IGNORE)

    def validation_step(self, batch, batch_idx):
        x, target = batch
        return {"logits": self(x), "target": target}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_temperature_scaling_callback_with_ignore_index(tmp_path):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(48, 5, 6, generator=gen)
    # labels the inputs predict, with noise (labels the logits do not predict would drive the
    # temperature to infinity, with a warning)
    teacher = torch.randn(6, 4, generator=gen)
    target = (x @ teacher + 2.0 * torch.randn(48, 5, 4, generator=gen)).argmax(dim=-1)
    target[:, 3:][torch.rand(48, 2, generator=gen) < 0.5] = IGNORE
    loader = DataLoader(TensorDataset(x, target), batch_size=16)
    module = PaddedClassifier()
    callback = TemperatureScalingCallback(n_bins=10, ignore_index=IGNORE)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[callback],
        default_root_dir=tmp_path,
    )
    trainer.fit(module, loader, loader)
    with torch.no_grad():
        logits = module(x).flatten(0, 1)
    keep = target.flatten() != IGNORE
    want = fit_temperature(logits[keep], target.flatten()[keep])
    assert callback.report["temperature"] == pytest.approx(want, rel=1e-6)
    report = TemperatureScaler(temperature=want).report(
        logits[keep], target.flatten()[keep], n_bins=10
    )
    for key in ("ece_before", "ece_after", "nll_before", "nll_after"):
        assert callback.report[key] == pytest.approx(report[key], abs=1e-6), key
    with pytest.raises(TypeError, match="ignore_index"):
        TemperatureScalingCallback(ignore_index="pad")


class SoftLabelClassifier(pl.LightningModule):
    """Nothing of lightning_losses: [N, C] logits and [N, C] soft labels (distillation-like)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(6, 5)

    def forward(self, x):
        return self.layer(x) * 5

    def training_step(self, batch, batch_idx):
        x, q = batch
        return F.cross_entropy(self(x), q)  # PyTorch's soft-target cross-entropy

    def validation_step(self, batch, batch_idx):
        x, q = batch
        return {"logits": self(x), "target": q}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def soft_trainer(tmp_path, callback):
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[callback],
        default_root_dir=tmp_path,
    )


def test_temperature_scaling_callback_with_soft_labels(tmp_path):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(120, 6, generator=gen)
    q = soft_labels(torch.randint(0, 5, (120,), generator=gen), 5).float()
    loader = DataLoader(TensorDataset(x, q), batch_size=32)  # 120 = 3 x 32 + 24
    module = SoftLabelClassifier()
    callback = TemperatureScalingCallback(soft_labels=True)
    soft_trainer(tmp_path, callback).fit(module, loader, loader)
    with torch.no_grad():
        logits = module(x)
    fitted = callback.report["temperature"]
    # the soft NLL, written plainly, is at its minimum there (within the fit's tolerance)
    best = minimize_scalar(
        lambda t: plain_soft_nll(logits, q, t), bounds=(0.05, 20), method="bounded"
    ).x
    assert fitted == pytest.approx(best, rel=1e-3)
    assert callback.report["nll_after"] == pytest.approx(plain_soft_nll(logits, q, fitted), 1e-5)

    # without soft_labels=True the [N, C] targets are multi-label ones: skipped, with a hint
    plain = TemperatureScalingCallback()
    with pytest.warns(UserWarning, match="soft_labels=True"):
        soft_trainer(tmp_path, plain).fit(SoftLabelClassifier(), loader, loader)
    assert plain.report == {}


def test_soft_labels_with_ignore_index_is_an_error_naming_it():
    with pytest.raises(ValueError, match="ignore_index applies to integer class labels"):
        TemperatureScalingCallback(soft_labels=True, ignore_index=IGNORE)
    with pytest.raises(TypeError, match="soft_labels must be True or False"):
        TemperatureScalingCallback(soft_labels="yes")
