"""Half-precision probabilities cast up pass the row-sum check; unnormalised rows still fail.

A softmax computed in bfloat16 rounds every probability to 8 significant bits, so its rows sum
to 1 within ``2**-8`` (about 2e-3 in practice: torchmetrics' dtype tests see 1.0017). Cast to
float32 or float64, such rows used to be judged by the wider dtype's 1e-3 and rejected. Each
accepted input is checked against a plain float64 numpy formula computed here from the same
upcast probabilities; each rejected one against the existing message.
"""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses import calibration as cal
from lightning_losses.calibration.netcal_bridge import to_netcal
from lightning_losses.calibration.posthoc.temperature import fit_temperature
from lightning_losses.callbacks import CalibrationMonitor

HALVES = [torch.bfloat16, torch.float16]
WIDER = [torch.float32, torch.float64]
SHAPES = [(256, 2), (256, 10), (128, 1000)]
SUM_MESSAGE = r"preds must hold probabilities that sum to 1 over the classes of each row"
RANGE_MESSAGE = r"preds must be probabilities in \[0, 1\] with input_format='probs'"


def half_softmax(rows, classes, half, wider, seed=0):
    """``torch.softmax(x.to(half)).to(wider)`` and targets that the top class often hits."""
    gen = torch.Generator().manual_seed(seed + classes)
    logits = 3 * torch.randn(rows, classes, generator=gen)
    target = (logits + 2 * torch.randn(rows, classes, generator=gen)).argmax(dim=1)
    return torch.softmax(logits.to(half), dim=1).to(wider), target


# --- float64 references, written plainly -------------------------------------------------------


def bin_index(conf, n_bins, dtype):
    """Bins (k/B, (k+1)/B], a confidence of 0 in the first, the edges k/B written in ``dtype``."""
    edges = torch.arange(1, n_bins, dtype=torch.float64).div(n_bins).to(dtype).double().numpy()
    return (conf[:, None] > edges[None, :]).sum(axis=1)


def top_label_errors(p, y, n_bins=15, dtype=torch.float64):
    """ECE, MCE, RMSCE of the top label (bins of :func:`bin_index`)."""
    conf, correct = p.max(axis=1), (p.argmax(axis=1) == y).astype(np.float64)
    index = bin_index(conf, n_bins, dtype)
    ece = mce = squares = 0.0
    for k in range(n_bins):
        inside = index == k
        if inside.any():
            gap = abs(conf[inside].mean() - correct[inside].mean())
            ece += inside.mean() * gap
            squares += inside.mean() * gap**2
            mce = max(mce, gap)
    return ece, mce, np.sqrt(squares)


def classwise_ece(p, y, n_bins=15, dtype=torch.float64):
    """Mean over classes of the equal-width ECE of each class's probability against 1[y = c]."""
    values = []
    for c in range(p.shape[1]):
        pc, hit = p[:, c], (y == c).astype(np.float64)
        index = bin_index(pc, n_bins, dtype)
        values.append(
            sum(
                (index == k).mean() * abs(pc[index == k].mean() - hit[index == k].mean())
                for k in range(n_bins)
                if (index == k).any()
            )
        )
    return np.mean(values)


def references(p, y, dtype=torch.float64):
    onehot = np.eye(p.shape[1])[y]
    ece, mce, rmsce = top_label_errors(p, y, dtype=dtype)
    return {
        "ece": ece,
        "mce": mce,
        "rmsce": rmsce,
        "brier": ((p - onehot) ** 2).sum(axis=1).mean(),
        "nll": -np.log(p[np.arange(len(y)), y]).mean(),
        "accuracy": (p.argmax(axis=1) == y).mean(),
        "confidence": p.max(axis=1).mean(),
    }


# --- (a) upcast half-precision probabilities are accepted ------------------------------------


@pytest.mark.parametrize(("rows", "classes"), SHAPES)
@pytest.mark.parametrize("wider", WIDER)
@pytest.mark.parametrize("half", HALVES)
def test_upcast_half_softmax_gives_the_float64_values(half, wider, rows, classes):
    probs, target = half_softmax(rows, classes, half, wider)
    deviation = float((probs.double().sum(dim=1) - 1).abs().max())
    if half == torch.bfloat16:  # what the old check (1e-3 for float32/64) rejected
        assert deviation > 1e-3
    p, y = probs.double().numpy(), target.numpy()
    want = references(p, y, wider)
    got = {
        "ece": cal.calibration_error(probs, target),
        "mce": cal.calibration_error(probs, target, norm="max"),
        "rmsce": cal.calibration_error(probs, target, norm="l2"),
        "brier": cal.brier_score(probs, target),
        "nll": cal.negative_log_likelihood(probs, target),
        "accuracy": cal.accuracy(probs, target),
        "confidence": cal.mean_confidence(probs, target),
    }
    for name, value in got.items():
        np.testing.assert_allclose(float(value), want[name], rtol=1e-9, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(
        float(cal.classwise_calibration_error(probs, target)),
        classwise_ece(p, y, dtype=wider),
        rtol=1e-9,
    )
    # The Metric classes, fed in two batches.
    summary, metric = cal.CalibrationSummary(), cal.CalibrationError()
    for part in (slice(0, rows // 3), slice(rows // 3, rows)):
        summary.update(probs[part], target[part])
        metric.update(probs[part], target[part])
    np.testing.assert_allclose(float(metric.compute()), want["ece"], rtol=1e-9)
    for name, value in summary.compute().items():
        np.testing.assert_allclose(float(value), want[name], rtol=1e-9, atol=1e-12, err_msg=name)
    # The checks must not change what the unchecked formulas give.
    for fn in (cal.adaptive_calibration_error, cal.smooth_calibration_error):
        unchecked = fn(probs, target, validate_args=False)
        np.testing.assert_allclose(float(fn(probs, target)), float(unchecked), rtol=0)
    conf, correct = cal.confidence_and_correct(probs, target)
    np.testing.assert_array_equal(conf.double().numpy(), p.max(axis=1))
    np.testing.assert_array_equal(correct.numpy(), p.argmax(axis=1) == y)
    # The netcal bridge keeps the probabilities as given.
    np.testing.assert_array_equal(to_netcal(probs, target)[0], p)


@pytest.mark.parametrize("wider", WIDER)
def test_upcast_bfloat16_soft_labels_fit_the_float64_temperature(wider):
    gen = torch.Generator().manual_seed(5)
    logits = 2 * torch.randn(200, 10, generator=gen, dtype=torch.float64)
    soft = torch.softmax((logits / 2).bfloat16(), dim=1).to(wider)  # best T about 2
    assert float((soft.double().sum(dim=1) - 1).abs().max()) > 1e-3
    q = soft.double().numpy()
    z = logits.numpy()

    def soft_nll(log_t):
        scaled = z / np.exp(log_t)
        log_p = scaled - scaled.max(axis=1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
        return -(q * log_p).sum(axis=1).mean()

    best = minimize_scalar(soft_nll, bounds=(-5, 5), method="bounded", options={"xatol": 1e-10})
    np.testing.assert_allclose(fit_temperature(logits, soft), np.exp(best.x), rtol=1e-5)


class ReturnsProbs(pl.LightningModule):
    """A plain module whose validation_step returns ``to(softmax(logits in dtype))``."""

    def __init__(self, dtype: torch.dtype, to: torch.dtype, scale: float = 1.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 10)
        self.dtype_, self.to_, self.scale = dtype, to, scale

    def probabilities(self, x):
        return (self.scale * torch.softmax(self.layer(x).to(self.dtype_), dim=1)).to(self.to_)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return {"logits": self.probabilities(x), "target": y}


def validate(module, monitor):
    gen = torch.Generator().manual_seed(2)
    x, y = 3 * torch.randn(96, 4, generator=gen), torch.randint(0, 10, (96,), generator=gen)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[monitor],
    )
    trainer.validate(module, DataLoader(TensorDataset(x, y), batch_size=32), verbose=False)
    return trainer, x, y


@pytest.mark.parametrize("to", [torch.bfloat16, torch.float32])
def test_monitor_accepts_bfloat16_probabilities(to):
    torch.manual_seed(0)
    module = ReturnsProbs(torch.bfloat16, to)
    trainer, x, y = validate(module, CalibrationMonitor(input_format="probs"))
    with torch.no_grad():
        probs = module.probabilities(x).double()
    assert float((probs.sum(dim=1) - 1).abs().max()) > 1e-3
    want = references(probs.numpy(), y.numpy(), to)  # bin edges in the probabilities' dtype
    for name in ("ece", "brier", "nll"):
        got = float(trainer.callback_metrics[f"val/{name}"])
        np.testing.assert_allclose(got, want[name], rtol=1e-6, err_msg=name)


def test_monitor_rejects_scaled_bfloat16_probabilities():
    module = ReturnsProbs(torch.bfloat16, torch.float32, scale=0.9)  # bfloat16 values
    with pytest.raises(ValueError, match="rows that do not sum to 1: sums from"):
        validate(module, CalibrationMonitor(input_format="probs"))


# --- (b) rows that are not distributions are still rejected ----------------------------------


def scaled_rows(total, dtype, through_bfloat16):
    """Rows that sum to ``total``: small-logit softmax rows (each entry < 1/2) times ``total``."""
    gen = torch.Generator().manual_seed(7)
    probs = torch.softmax(0.5 * torch.randn(32, 10, generator=gen, dtype=torch.float64), dim=1)
    rows = total * probs
    if through_bfloat16:  # still rejected when every value is a bfloat16 number
        rows = rows.bfloat16()
    return rows.to(dtype), torch.randint(0, 10, (32,), generator=gen)


CALLS = [
    cal.calibration_error,
    cal.brier_score,
    cal.negative_log_likelihood,
    cal.classwise_calibration_error,
    cal.adaptive_calibration_error,
    cal.smooth_calibration_error,
    lambda p, t: cal.CalibrationError().update(p, t),
    lambda p, t: cal.CalibrationSummary().update(p, t),
]


@pytest.mark.parametrize("through_bfloat16", [False, True])
@pytest.mark.parametrize("dtype", WIDER)
@pytest.mark.parametrize("total", [1.05, 0.9, 2.0])
def test_rows_that_are_not_distributions_are_rejected(total, dtype, through_bfloat16):
    rows, target = scaled_rows(total, dtype, through_bfloat16)
    for call in CALLS:
        with pytest.raises(ValueError, match=SUM_MESSAGE) as info:
            call(rows, target)
        assert "pass input_format='logits' for logits" in str(info.value)
    with pytest.raises(ValueError, match="the rows of preds do not sum to 1"):
        to_netcal(rows, target)
    soft_target = rows / rows.sum(dim=1, keepdim=True) * total
    with pytest.raises(ValueError, match="target must hold probabilities that sum to 1"):
        fit_temperature(torch.zeros(32, 10, dtype=torch.float64), soft_target)


@pytest.mark.parametrize("dtype", WIDER)
def test_logits_and_scores_passed_as_probabilities_are_rejected(dtype):
    gen = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(16, 10, generator=gen)).bfloat16().to(dtype)
    target = torch.randint(0, 10, (16,), generator=gen)
    scores = torch.sigmoid(logits)  # in [0, 1], rows summing to about 5
    for call in CALLS:
        with pytest.raises(ValueError, match=RANGE_MESSAGE):
            call(logits, target)
        with pytest.raises(ValueError, match=SUM_MESSAGE):
            call(scores, target)


def test_the_message_names_the_tolerance_a_row_was_held_to():
    rows, target = scaled_rows(1.05, torch.float32, through_bfloat16=True)
    with pytest.raises(ValueError, match=r"within 0\.03125 for torch\.float32 holding") as info:
        cal.calibration_error(rows, target)
    assert "torch.bfloat16 values" in str(info.value)
    rows, target = scaled_rows(1.05, torch.float32, through_bfloat16=False)
    with pytest.raises(ValueError, match=r"within 0\.001 for torch\.float32\)"):
        cal.calibration_error(rows, target)


def test_float16_numbers_cast_up_get_the_float16_tolerance():
    # 0.5 + k 2**-11 is a float16 number, not a bfloat16 one for odd k
    target = torch.tensor([0, 1])
    for wider in WIDER:
        inside = torch.tensor([[0.5, 0.5 + 5 * 2**-11], [0.25, 0.75]], dtype=wider)  # 1.0024
        assert float(cal.calibration_error(inside, target)) >= 0
        outside = torch.tensor([[0.5, 0.5 + 9 * 2**-11], [0.25, 0.75]], dtype=wider)  # 1.0044
        with pytest.raises(ValueError, match=r"within 0\.00390625 for torch\.float\d+ holding"):
            cal.calibration_error(outside, target)
