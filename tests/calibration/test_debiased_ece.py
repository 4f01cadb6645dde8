"""The debiased calibration error against Kumar, Liang and Ma's own package on the same bins.

The reference is ``uncertainty-calibration`` (``import calibration``), the code of "Verified
Uncertainty Calibration" (NeurIPS 2019). Its ``get_calibration_error`` bins discrete
probabilities by their distinct values; here every distinct confidence is the centre of one of
our equal-width bins, so both group the samples alike. On continuous probabilities its
``lower_bound_scaling_ce`` takes the binning scheme: ``get_equal_prob_bins`` gives the edges
``k/B`` and ``searchsorted`` puts a value equal to an edge in the bin below, as ours does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

calibration = pytest.importorskip("calibration", reason="uncertainty-calibration (dev extra)")

from lightning_losses.calibration import (  # noqa: E402
    CalibrationSummary,
    DebiasedCalibrationError,
    debiased_calibration_error,
)
from lightning_losses.calibration.debiased import (  # noqa: E402
    debiased_calibration_error_from_bins,
)

BINS = 15


def _discrete_top_label(seed: int, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    """``[n, 3]`` rows whose top probabilities are bin centres, labels from a tempered model."""
    rng = np.random.default_rng(seed)
    centres = (np.arange(6, BINS) + 0.5) / BINS  # 0.43 .. 0.97: each the top of its row
    top = rng.choice(centres, size=n)
    rows = np.stack([top, (1 - top) * 0.6, (1 - top) * 0.4], axis=1)
    order = np.argsort(rng.random((n, 3)), axis=1)
    probs = np.take_along_axis(rows, order, axis=1)
    tempered = probs**0.6 / (probs**0.6).sum(axis=1, keepdims=True)  # over-confident model
    labels = (rng.random(n)[:, None] > tempered.cumsum(axis=1)).sum(axis=1)
    return probs, labels


def test_l2_equals_get_calibration_error_on_discrete_top_label_probabilities():
    for seed in range(3):
        probs, labels = _discrete_top_label(seed)
        assert calibration.utils.is_discrete(probs)  # their binning: one bin per value
        want = calibration.get_calibration_error(probs, labels, p=2, debias=True, mode="top-label")
        got = debiased_calibration_error(torch.from_numpy(probs), torch.from_numpy(labels))
        assert want > 0.01
        assert got.item() == pytest.approx(want, abs=1e-6)


def test_l2_equals_their_estimator_on_equal_width_bins_of_continuous_probabilities():
    rng = np.random.default_rng(4)
    for n, scale, temper in ((400, 2.0, 0.5), (5000, 3.0, 0.7), (20000, 1.0, 1.0)):
        logits = rng.normal(size=(n, 5)) * scale
        probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        truth = np.exp(temper * logits) / np.exp(temper * logits).sum(axis=1, keepdims=True)
        labels = (rng.random(n)[:, None] > truth.cumsum(axis=1)).sum(axis=1)
        want = calibration.lower_bound_scaling_ce(
            probs,
            labels,
            p=2,
            debias=True,
            num_bins=BINS,
            binning_scheme=calibration.get_equal_prob_bins,
            mode="top-label",
        )
        got = debiased_calibration_error(torch.from_numpy(probs), torch.from_numpy(labels))
        assert got.item() == pytest.approx(want, abs=1e-6)
        from_logits = debiased_calibration_error(
            torch.from_numpy(np.log(probs)), torch.from_numpy(labels), input_format="logits"
        )
        assert from_logits.item() == pytest.approx(want, abs=1e-6)


def test_l2_equals_their_estimator_on_binary_probabilities():
    rng = np.random.default_rng(5)
    centres = (np.arange(BINS) + 0.5) / BINS
    probs = rng.choice(centres, size=4000)
    labels = (rng.random(4000) < probs**1.4).astype(np.int64)
    want = calibration.get_calibration_error(probs, labels, p=2, debias=True)
    got = debiased_calibration_error(torch.from_numpy(probs), torch.from_numpy(labels))
    assert got.item() == pytest.approx(want, abs=1e-6)


def test_l1_is_the_limit_of_their_gaussian_resampling():
    """Their ``p=1`` estimator averages 1,000 random draws; with 40,000 it is within ~1e-4."""
    rng = np.random.default_rng(6)
    probs = rng.random(6000)
    labels = (rng.random(6000) < probs**1.3).astype(np.int64)
    data = list(zip(probs, labels.astype(np.float64), strict=True))
    binned = calibration.utils.bin(data, calibration.get_equal_prob_bins(probs, BINS))
    np.random.seed(0)
    want = calibration.utils.normal_debiased_ce(binned, power=1, resamples=40000)
    got = debiased_calibration_error(
        torch.from_numpy(probs), torch.from_numpy(labels), norm="l1"
    ).item()
    assert got == pytest.approx(want, abs=2e-4)
    plugin = calibration.utils.plugin_ce(binned, power=1)
    assert got < plugin  # the correction is downward


def test_metric_and_summary_equal_the_function_over_any_batching():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(1500, 6, generator=generator, dtype=torch.float64) * 2
    target = torch.randint(0, 6, (1500,), generator=generator)
    target[::11] = -100
    options = {"input_format": "logits", "ignore_index": -100}
    for norm in ("l1", "l2"):
        want = debiased_calibration_error(logits, target, norm=norm, **options)
        for size in (1, 97, 1500):
            metric = DebiasedCalibrationError(norm=norm, **options)
            for rows in torch.arange(1500).split(size):
                metric.update(logits[rows], target[rows])
            assert metric.compute().item() == pytest.approx(want.item(), abs=1e-12)
    summary = CalibrationSummary(debiased=True, **options)
    for rows in torch.arange(1500).split(400):
        summary.update(logits[rows], target[rows])
    values = summary.compute()
    assert values["ece_debiased"].item() == pytest.approx(
        debiased_calibration_error(logits, target, norm="l1", **options).item(), abs=1e-12
    )
    assert values["rmsce_debiased"].item() == pytest.approx(
        debiased_calibration_error(logits, target, norm="l2", **options).item(), abs=1e-12
    )


def test_l2_formula_by_hand_and_edge_cases():
    count = torch.tensor([40.0, 1.0, 0.0, 60.0], dtype=torch.float64)
    conf_sum = torch.tensor([10.0, 0.9, 0.0, 54.0], dtype=torch.float64)
    correct_sum = torch.tensor([10.0, 0.0, 0.0, 40.0], dtype=torch.float64)
    # bins of fewer than 2 samples add nothing, but count in N = 101
    e0 = 0.0 - 0.25 * 0.75 / 39
    e3 = (0.9 - 40 / 60) ** 2 - (40 / 60) * (20 / 60) / 59
    want = np.sqrt((40 * e0 + 60 * e3) / 101)
    got = debiased_calibration_error_from_bins(count, conf_sum, correct_sum)
    assert got.item() == pytest.approx(want, abs=1e-15)
    empty = torch.zeros(3, dtype=torch.float64)
    assert torch.isnan(debiased_calibration_error_from_bins(empty, empty, empty))
    assert torch.isnan(debiased_calibration_error_from_bins(empty, empty, empty, "l1"))
    with pytest.raises(ValueError, match="norm"):
        debiased_calibration_error_from_bins(count, conf_sum, correct_sum, "max")
    with pytest.raises(ValueError, match="norm"):
        DebiasedCalibrationError(norm="mean")


def test_state_does_not_grow_with_n():
    sizes = []
    for n in (50, 50_000):
        metric = DebiasedCalibrationError()
        metric.update(torch.rand(n, 4).softmax(1), torch.randint(0, 4, (n,)))
        sizes.append(sum(getattr(metric, name).numel() for name in metric._defaults))
    assert sizes[0] == sizes[1] == 3 * BINS


def test_dense_inputs_give_the_value_of_their_pixels_flattened_by_hand():
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(6, 4, 9, 11, generator=generator, dtype=torch.float64) * 2
    target = torch.randint(0, 4, (6, 9, 11), generator=generator)
    target[:, :2] = 255
    rows = logits.movedim(1, -1).reshape(-1, 4)
    keep = target.reshape(-1) != 255
    for norm in ("l1", "l2"):
        want = debiased_calibration_error(
            rows[keep], target.reshape(-1)[keep], norm=norm, input_format="logits"
        )
        metric = DebiasedCalibrationError(norm=norm, input_format="logits", ignore_index=255)
        for part in torch.arange(6).split(4):
            metric.update(logits[part], target[part])
        assert metric.compute().item() == pytest.approx(want.item(), abs=1e-12)
