"""Temperature scaling with soft labels and with ``ignore_index``.

The soft-label fit is checked against the float64 cross-entropy written plainly here and
minimised by scipy (a dependency of scikit-learn, which the package requires); ``ignore_index``
against the fit on the rows masked by hand.
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

from lightning_losses.calibration.scaling import TemperatureScaler, fit_temperature
from lightning_losses.callbacks import TemperatureScalingCallback

IGNORE = -100


def overconfident(n: int = 300, classes: int = 5, seed: int = 0):
    """Logits whose argmax is right 60% of the time, scaled up: T* > 1."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, classes, (n,), generator=gen)
    logits = torch.randn(n, classes, generator=gen)
    hit = torch.rand(n, generator=gen) < 0.6
    logits[hit, target[hit]] += 2.0
    return logits * 3, target


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


def test_one_hot_soft_labels_give_the_integer_label_temperature():
    logits, target = overconfident()
    hard = fit_temperature(logits, target)
    for dtype in (torch.float32, torch.float64):
        one_hot = F.one_hot(target, 5).to(dtype)
        assert fit_temperature(logits, one_hot) == pytest.approx(hard, rel=1e-7)
    assert hard > 1.0


def test_soft_label_temperature_minimises_the_soft_nll():
    logits, target = overconfident(n=120)
    q = soft_labels(target, 5)
    fitted = fit_temperature(logits, q)
    best = minimize_scalar(
        lambda log_t: plain_soft_nll(logits, q, math.exp(log_t)),
        bounds=(-3.0, 3.0),
        method="bounded",
        options={"xatol": 1e-9},
    )
    assert fitted == pytest.approx(math.exp(best.x), rel=1e-5)
    # and it is not the hard-label temperature: the soft labels change the optimum
    assert abs(fitted - fit_temperature(logits, target)) > 1e-2
    scaler = TemperatureScaler().fit(logits, q)
    assert scaler.temperature == fitted
    report = scaler.report(logits, q, n_bins=10)
    assert report["nll_after"] == pytest.approx(plain_soft_nll(logits, q, fitted), abs=1e-10)
    assert report["nll_before"] == pytest.approx(plain_soft_nll(logits, q, 1.0), abs=1e-10)


def test_soft_label_report_ece_uses_the_label_mass_of_the_predicted_class():
    logits, target = overconfident(n=200)
    q = soft_labels(target, 5)
    scaler = TemperatureScaler(temperature=1.7)
    report = scaler.report(logits, q, n_bins=10)
    for key, t in (("ece_before", 1.0), ("ece_after", 1.7)):
        probs = torch.softmax(logits.double() / t, dim=1)
        confidence, predicted = probs.max(dim=1)
        correct = q[torch.arange(200), predicted]  # chance the prediction is right under q
        ece = 0.0
        for k in range(10):
            members = (confidence > k / 10) & (confidence <= (k + 1) / 10)
            ece += abs(float(confidence[members].sum() - correct[members].sum()))
        assert report[key] == pytest.approx(ece / 200, abs=1e-12)
    # one-hot soft labels report exactly what integer labels report
    assert scaler.report(logits, F.one_hot(target, 5).double()) == pytest.approx(
        scaler.report(logits, target), abs=1e-12
    )


@pytest.mark.parametrize("binary", [False, True])
def test_ignore_index_equals_the_fit_on_masked_rows(binary):
    logits, target = overconfident()
    if binary:
        logits, target = logits[:, 0] - logits[:, 1], (target == 0).long()
    padded = target.clone()
    padded[::7] = IGNORE
    keep = padded != IGNORE
    masked = fit_temperature(logits[keep], target[keep])
    assert fit_temperature(logits, padded, ignore_index=IGNORE) == pytest.approx(masked, abs=1e-12)
    assert masked != pytest.approx(fit_temperature(logits, target), abs=1e-6)
    scaler = TemperatureScaler().fit(logits, padded, ignore_index=IGNORE)
    assert scaler.temperature == pytest.approx(masked, abs=1e-12)
    report = scaler.report(logits, padded, ignore_index=IGNORE)
    assert report == pytest.approx(scaler.report(logits[keep], target[keep]), abs=1e-12)


@pytest.mark.parametrize(
    ("target", "options", "error", "match"),
    [
        (torch.full((6, 3), 1 / 3), {"ignore_index": IGNORE}, ValueError, "ignore_index applies"),
        (torch.full((6, 4), 1 / 4), {}, ValueError, "target of soft labels must be"),
        (torch.full((6, 3), 0.3), {}, ValueError, "target must hold probabilities that sum"),
        (torch.tensor([[1.5, -0.5, 0.0]]).repeat(6, 1), {}, ValueError, "target soft labels"),
        (torch.ones(6, 3, dtype=torch.long), {}, TypeError, "target"),
        (torch.zeros(6, dtype=torch.long), {"ignore_index": 1.5}, TypeError, "ignore_index"),
        (torch.zeros(6, dtype=torch.long), {"ignore_index": True}, TypeError, "ignore_index"),
        (torch.full((6,), IGNORE), {"ignore_index": IGNORE}, ValueError, "not ignored"),
        (torch.full((6,), 3), {"ignore_index": IGNORE}, ValueError, "ignore_index=-100"),
    ],
)
def test_bad_soft_labels_and_ignore_index_are_named(target, options, error, match):
    logits = torch.randn(6, 3)
    with pytest.raises(error, match=match):
        fit_temperature(logits, target, **options)
    with pytest.raises(error, match=match):
        TemperatureScaler().report(logits, target, **options)


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
    target = torch.randint(0, 4, (48, 5), generator=gen)
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
    report = TemperatureScaler(want).report(logits[keep], target.flatten()[keep], n_bins=10)
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
