"""Histogram binning and isotonic regression never emit probability 0 (issue 38).

Overconfident logits: the fit split's predictions are all right, so the top-label maps give 1
(the other classes 0) and the one-vs-rest maps 0 to a class's small probabilities; on a test
split whose labels are often not the prediction, the NLL of a misclassified sample was then
infinite (the maps' values before the floor, ``_mapped_log_probs``, show it). With it every
log-probability is finite, every row sums to 1, and no probability is below
``eps / (1 + C eps)``.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_losses.calibration import HistogramBinning, IsotonicCalibration


def overconfident(n: int, seed: int, *, right: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Confident logits; labels the prediction (``right``) or uniform over the 5 classes."""
    g = torch.Generator().manual_seed(seed)
    logits = 6.0 * torch.randn(n, 5, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 5, (n,), generator=g)
    return logits, (logits.argmax(1) if right else labels)


@pytest.mark.parametrize(
    "calibrator",
    [
        lambda: HistogramBinning(),
        lambda: HistogramBinning(mode="one_vs_rest"),
        lambda: IsotonicCalibration(),
        lambda: IsotonicCalibration(mode="one_vs_rest"),
        lambda: HistogramBinning(n_bins=5, floor=1e-3),
    ],
)
def test_every_log_probability_and_nll_is_finite(calibrator) -> None:
    z, y = overconfident(2000, seed=0, right=True)
    z_test, y_test = overconfident(500, seed=1, right=False)
    model = calibrator().fit(z, y)
    unfloored = model._mapped_log_probs(z_test).gather(1, y_test[:, None])
    assert int((unfloored == float("-inf")).sum()) > 100  # what the floor is there for
    log_probs = model(z_test)
    assert bool(log_probs.isfinite().all())
    nll = -log_probs.gather(1, y_test[:, None])[:, 0]
    assert bool(nll.isfinite().all())
    assert torch.allclose(log_probs.exp().sum(1), torch.ones(500, dtype=torch.float64))
    floor = model.floor
    assert float(log_probs.min()) >= math.log(floor / (1 + 5 * floor)) - 1e-12


def test_floor_is_checked() -> None:
    with pytest.raises(ValueError, match="floor must lie in"):
        HistogramBinning(floor=0.0)
    with pytest.raises(ValueError, match="floor must lie in"):
        IsotonicCalibration(floor=0.5)
