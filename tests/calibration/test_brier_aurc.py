"""Classwise ECE, the Brier decomposition and AURC against plain numpy formulas written here.

References are float64 numpy loops over the definitions: Kull et al.'s classwise ECE (the
mean over classes of the one-vs-rest ECE on equal-width bins), the Brier score's
reliability / resolution / uncertainty with the within-bin variance and covariance of
Stephenson, Coelho and Jolliffe computed sample by sample, and AURC as the mean over k of the
error rate of the k most confident samples (ties: the mean over every order of the tied
samples, enumerated). The Metrics must give the functions' values over any batching with
state independent of N; the 2-process DDP check of these Metrics is in
``tests/calibration/test_dense_calibration.py`` (one gloo run covers every metric).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import brier_score_loss

from lightning_losses.calibration import (
    AURC,
    BrierDecomposition,
    ClasswiseCalibrationError,
    aurc,
    brier_decomposition,
    brier_score,
    calibration_error,
    classwise_calibration_error,
)
from lightning_losses.calibration.aurc import (
    aurc_from_histogram,
    aurc_histogram_bound,
    aurc_histogram_edges,
)


def _data(n: int, classes: int, seed: int = 0, scale: float = 2.5):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=generator, dtype=torch.float64) * scale
    target = torch.multinomial((logits / scale).softmax(1), 1, generator=generator)[:, 0]
    return logits, target


def _bins(p: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width bins (k/B, (k+1)/B], 0 in the first (no value here lies on an edge)."""
    return np.clip(np.ceil(p * n_bins).astype(int) - 1, 0, n_bins - 1)


def _batches(n: int, sizes: tuple[int, ...]) -> list[slice]:
    out, start, i = [], 0, 0
    while start < n:
        stop = min(n, start + sizes[i % len(sizes)])
        out.append(slice(start, stop))
        start, i = stop, i + 1
    return out


# --- classwise ECE (Kull et al.) --------------------------------------------------------------


def _classwise_ece_numpy(probs: np.ndarray, labels: np.ndarray, n_bins: int) -> float:
    """(1/C) sum_c sum_b |B_cb|/N |mean_{i in B_cb} 1[y_i = c] - mean_{i in B_cb} p_ic|."""
    n, classes = probs.shape
    total = 0.0
    for c in range(classes):
        p, y = probs[:, c], (labels == c).astype(float)
        index = _bins(p, n_bins)
        for b in range(n_bins):
            members = index == b
            if members.any():
                total += members.sum() / n * abs(y[members].mean() - p[members].mean())
    return total / classes


@pytest.mark.parametrize("n_bins", [1, 7, 15])
def test_classwise_ece_is_kull_definition(n_bins):
    logits, target = _data(600, 5)
    probs = logits.softmax(1)
    expected = _classwise_ece_numpy(probs.numpy(), target.numpy(), n_bins)
    got = classwise_calibration_error(probs, target, n_bins=n_bins)
    assert abs(got.item() - expected) < 1e-12
    got = classwise_calibration_error(logits, target, n_bins=n_bins, input_format="logits")
    assert abs(got.item() - expected) < 1e-12
    # binary [N] preds: the two classes 1 - p and p
    p = probs[:, 0] / probs[:, :2].sum(1)
    y = (target == 0).long()
    binary = _classwise_ece_numpy(np.stack([1 - p.numpy(), p.numpy()], 1), y.numpy(), n_bins)
    assert abs(classwise_calibration_error(p, y, n_bins=n_bins).item() - binary) < 1e-12


def test_classwise_metric_state_is_classes_by_bins_over_any_batching():
    logits, target = _data(517, 4, seed=1)
    target[::7] = -100
    kept = target != -100
    expected = _classwise_ece_numpy(logits[kept].softmax(1).numpy(), target[kept].numpy(), 10)
    for sizes in [(517,), (1, 64, 3), (100, 31)]:
        metric = ClasswiseCalibrationError(
            num_classes=4, n_bins=10, input_format="logits", ignore_index=-100
        )
        for part in _batches(517, sizes):
            metric.update(logits[part], target[part])
            assert metric.count.shape == metric.conf_sum.shape == (4, 10)  # not O(N)
        assert abs(metric.compute().item() - expected) < 1e-12


# --- Brier decomposition ----------------------------------------------------------------------


def _decomposition_numpy(forecasts: np.ndarray, events: np.ndarray, n_bins: int) -> np.ndarray:
    """[BS, REL, RES, UNC, WBV, WBC] of [N, R] forecasts of [N, R] 0/1 events, summed over R.

    Per row, sample by sample: BS = mean (f - o)^2; REL = sum_k n_k/N (fbar_k - obar_k)^2;
    RES = sum_k n_k/N (obar_k - obar)^2; UNC = obar (1 - obar); WBV = (1/N) sum (f - fbar_k)^2;
    WBC = (2/N) sum (o - obar_k)(f - fbar_k).
    """
    out = np.zeros(6)
    n = forecasts.shape[0]
    for f, o in zip(forecasts.T, events.T, strict=True):
        index = _bins(f, n_bins)
        rate = o.mean()
        parts = np.array([np.mean((f - o) ** 2), 0.0, 0.0, rate * (1 - rate), 0.0, 0.0])
        for b in range(n_bins):
            members = index == b
            if not members.any():
                continue
            fb, ob, nb = f[members].mean(), o[members].mean(), members.sum()
            parts[1] += nb / n * (fb - ob) ** 2
            parts[2] += nb / n * (ob - rate) ** 2
            parts[4] += np.sum((f[members] - fb) ** 2) / n
            parts[5] += 2 * np.sum((o[members] - ob) * (f[members] - fb)) / n
        out += parts
    return out


@pytest.mark.parametrize("n_bins", [1, 5, 15])
def test_brier_decomposition_equals_numpy_and_adds_up(n_bins):
    logits, target = _data(700, 6, seed=2)
    probs = logits.softmax(1)
    onehot = np.eye(6)[target.numpy()]
    expected = _decomposition_numpy(probs.numpy(), onehot, n_bins)
    for preds, fmt in [(probs, "probs"), (logits, "logits")]:
        parts = brier_decomposition(preds, target, n_bins=n_bins, input_format=fmt)
        np.testing.assert_allclose(torch.stack(parts).numpy(), expected, rtol=0, atol=1e-12)
        brier, rel, res, unc, wbv, wbc = (p.item() for p in parts)
        assert abs(brier - (rel - res + unc + wbv - wbc)) < 1e-12  # the identity
    # the Brier score is the package's multiclass one, sum_c (p_c - y_c)^2
    assert abs(expected[0] - np.mean(np.sum((probs.numpy() - onehot) ** 2, 1))) < 1e-12
    assert abs(parts.brier.item() - brier_score(probs, target).item()) < 1e-12
    # uncertainty 1 - sum_c obar_c^2
    assert abs(parts.uncertainty.item() - (1 - np.sum(onehot.mean(0) ** 2))) < 1e-12
    first_four = brier_decomposition(probs, target, n_bins=n_bins)[:4]
    assert len(first_four) == 4


def test_murphy_three_terms_are_exact_when_each_bin_holds_one_forecast():
    # forecasts on the bin centres of 10 bins: n_k identical forecasts per bin
    generator = torch.Generator().manual_seed(4)
    f = (torch.randint(0, 10, (2000,), generator=generator).double() + 0.5) / 10
    o = (torch.rand(2000, generator=generator, dtype=torch.float64) < f**1.5).long()
    parts = brier_decomposition(f, o, n_bins=10)
    assert abs(parts.within_bin_variance.item()) < 1e-12
    assert abs(parts.within_bin_covariance.item()) < 1e-12
    # Murphy 1973 over the distinct forecast values
    fn, on = f.numpy(), o.numpy().astype(float)
    rate = on.mean()
    rel = sum((fn == v).mean() * (v - on[fn == v].mean()) ** 2 for v in np.unique(fn))
    res = sum((fn == v).mean() * (on[fn == v].mean() - rate) ** 2 for v in np.unique(fn))
    assert abs(parts.reliability.item() - rel) < 1e-12
    assert abs(parts.resolution.item() - res) < 1e-12
    assert abs(parts.uncertainty.item() - rate * (1 - rate)) < 1e-12
    assert abs(parts.brier.item() - (rel - res + rate * (1 - rate))) < 1e-12
    assert abs(parts.brier.item() - brier_score_loss(on, fn)) < 1e-12


def test_binary_and_multilabel_decompose_the_positive_class():
    generator = torch.Generator().manual_seed(5)
    p = torch.rand(300, 4, generator=generator, dtype=torch.float64)
    y = (torch.rand(300, 4, generator=generator, dtype=torch.float64) < p).long()
    y[::5, 1] = -1
    kept = (y != -1).numpy()
    expected = _decomposition_numpy(
        p.numpy()[kept][:, None], y.numpy()[kept][:, None].astype(float), 8
    )
    parts = brier_decomposition(p, y, n_bins=8, ignore_index=-1)
    np.testing.assert_allclose(torch.stack(parts).numpy(), expected, rtol=0, atol=1e-12)
    assert abs(parts.brier.item() - brier_score_loss(y.numpy()[kept], p.numpy()[kept])) < 1e-12
    binary = brier_decomposition(p[:, 0], y[:, 0], n_bins=8)
    reference = _decomposition_numpy(p[:, :1].numpy(), y[:, :1].numpy().astype(float), 8)
    np.testing.assert_allclose(torch.stack(binary).numpy(), reference, rtol=0, atol=1e-12)


def test_reliability_is_the_sum_of_squared_classwise_rms_errors():
    logits, target = _data(400, 3, seed=6)
    parts = brier_decomposition(logits, target, n_bins=12, input_format="logits")
    probs = logits.softmax(1)
    # per class: RMSCE_c^2 of the one-vs-rest forecast (binary [N] preds: the positive class)
    squares = sum(
        calibration_error(probs[:, c].contiguous(), target == c, n_bins=12, norm="l2") ** 2
        for c in range(3)
    )
    assert abs(parts.reliability.item() - squares.item()) < 1e-12


def test_brier_metric_over_any_batching_with_state_independent_of_n():
    logits, target = _data(611, 5, seed=7)
    target[3::11] = -100
    expected = brier_decomposition(
        logits, target, n_bins=15, input_format="logits", ignore_index=-100
    )
    for sizes in [(611,), (1, 2, 300), (64,)]:
        metric = BrierDecomposition(num_classes=5, input_format="logits", ignore_index=-100)
        for part in _batches(611, sizes):
            metric.update(logits[part], target[part])
            assert metric.sums.shape == (5, 5, 15)
        got = metric.compute()
        np.testing.assert_allclose(torch.stack(got), torch.stack(expected), rtol=0, atol=1e-12)
        assert metric.bins().shape == (5, 5, 15)
    binary = BrierDecomposition(n_bins=6)
    binary.update(logits[:, 0].sigmoid(), (target == 0).long())
    assert abs(binary.compute().brier - brier_score(logits[:, 0].sigmoid(), target == 0)) < 1e-12
    with pytest.warns(UserWarning, match="before the ``update``"):  # torchmetrics' warning
        assert math.isnan(BrierDecomposition(num_classes=5).compute().brier.item())


def test_brier_metric_needs_num_classes_for_multiclass():
    logits, target = _data(10, 3)
    with pytest.raises(ValueError, match=r"num_classes=C\) \(here C=3\)"):
        BrierDecomposition().update(logits.softmax(1), target)
    with pytest.raises(ValueError, match="num_classes=4"):
        BrierDecomposition(num_classes=4).update(logits.softmax(1), target)
    with pytest.raises(ValueError, match="n_bins must be >= 1; got 0"):
        brier_decomposition(logits.softmax(1), target, n_bins=0)


# --- AURC -------------------------------------------------------------------------------------


def _aurc_sorted_numpy(confidence: np.ndarray, errors: np.ndarray) -> float:
    """Mean over k of the error rate among the k most confident (distinct confidences)."""
    order = np.argsort(-confidence, kind="stable")
    e = errors[order]
    return float(np.mean([e[:k].sum() / k for k in range(1, len(e) + 1)]))


def _aurc_all_tie_orders(confidence: np.ndarray, errors: np.ndarray) -> float:
    """The mean of the sort-based AURC over every order of the tied samples (enumerated)."""
    groups = [np.flatnonzero(confidence == v) for v in np.unique(confidence)[::-1]]
    values = []
    for orders in itertools.product(*(itertools.permutations(g) for g in groups)):
        e = errors[np.concatenate(orders)]
        values.append(np.mean([e[:k].sum() / k for k in range(1, len(e) + 1)]))
    return float(np.mean(values))


def test_aurc_is_the_sorted_definition():
    logits, target = _data(500, 7, seed=8)
    probs = logits.softmax(1)
    confidence, predicted = probs.max(1)
    errors = (predicted != target).double().numpy()
    expected = _aurc_sorted_numpy(confidence.numpy(), errors)
    assert abs(aurc(probs, target).item() - expected) < 1e-12
    assert abs(aurc(logits, target, input_format="logits").item() - expected) < 1e-12
    # a shuffled copy: the same value
    perm = torch.randperm(500, generator=torch.Generator().manual_seed(0))
    assert abs(aurc(probs[perm], target[perm]).item() - expected) < 1e-12


def test_aurc_ties_are_the_mean_over_all_orders():
    confidence = np.array([0.9, 0.9, 0.9, 0.7, 0.7, 0.6, 0.6, 0.6, 0.6, 0.55])
    errors = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    expected = _aurc_all_tie_orders(confidence, errors)
    preds = torch.tensor(confidence)
    target = torch.tensor(1 - errors).long()  # binary: p > 0.5 is class 1, confidence p
    assert abs(aurc(preds, target).item() - expected) < 1e-12
    for order in [torch.arange(10).flip(0), torch.tensor([3, 0, 9, 5, 1, 8, 2, 7, 4, 6])]:
        assert abs(aurc(preds[order], target[order]).item() - expected) < 1e-12
    # the same samples as a tie-free AURC would depend on the order; the tied value does not
    histogram = AURC()
    for part in torch.arange(10).split(3):
        histogram.update(preds[part], target[part])
    assert abs(histogram.compute().item() - expected) < 1e-12  # one confidence per bin


def test_aurc_drops_ignored_samples_and_is_nan_when_empty():
    logits, target = _data(200, 4, seed=9)
    target[::3] = -100
    kept = target != -100
    assert aurc(logits, target, ignore_index=-100, input_format="logits").item() == pytest.approx(
        aurc(logits[kept], target[kept], input_format="logits").item(), abs=1e-15
    )
    assert math.isnan(aurc(torch.rand(0, 3), torch.zeros(0, dtype=torch.long)).item())
    with pytest.warns(UserWarning, match="before the ``update``"):  # torchmetrics' warning
        histogram = AURC().compute()
    with pytest.warns(UserWarning, match="before the ``update``"):
        exact = AURC(exact=True).compute()
    assert math.isnan(histogram.item())
    assert math.isnan(exact.item())


def test_aurc_histogram_metric_within_its_bound_over_any_batching():
    for seed, scale in [(10, 1.0), (11, 4.0), (12, 12.0)]:
        logits, target = _data(3000, 10, seed=seed, scale=scale)
        logits = logits.float()  # saturated float32 confidences tie at 1
        exact = aurc(logits, target, input_format="logits").item()
        values = []
        for sizes in [(3000,), (1, 500, 7), (999,)]:
            histogram = AURC(input_format="logits")
            precise = AURC(input_format="logits", exact=True)
            for part in _batches(3000, sizes):
                histogram.update(logits[part], target[part])
                precise.update(logits[part], target[part])
                assert histogram.count.shape == histogram.errors.shape == (10_000,)
            values.append(histogram.compute().item())
            assert abs(precise.compute().item() - exact) < 1e-12
            bound = histogram.error_bound().item()
            assert abs(values[-1] - exact) <= bound + 1e-12
            assert bound < 0.01
        assert values[0] == values[1] == values[2]  # counts are exact: bit-identical
    # a coarse histogram: the bound still holds, and is not vacuous
    coarse = AURC(histogram_bins=20, input_format="logits")
    coarse.update(logits, target)
    gap = abs(coarse.compute().item() - exact)
    assert 0 < gap <= coarse.error_bound().item() < 0.2


def test_aurc_histogram_bound_closed_form_equals_the_sum():
    generator = torch.Generator().manual_seed(13)
    for _ in range(50):
        bins = int(torch.randint(2, 9, (), generator=generator))
        count = torch.randint(0, 15, (bins,), generator=generator).double()
        errors = torch.floor(
            torch.rand(bins, generator=generator, dtype=torch.float64) * (count + 1)
        )
        if count.sum() == 0:
            continue
        n_all, errors_np = count.numpy()[::-1], errors.numpy()[::-1]
        total, before = 0.0, 0.0
        for n, e in zip(n_all, errors_np, strict=True):
            q = min(e, n - e)
            for j in range(1, int(n) + 1):
                if q > 0:
                    total += min((1 - q / n) * min(j, n - j), q) / (before + j)
            before += n
        assert abs(aurc_histogram_bound(count, errors).item() - total / count.sum()) < 1e-12
        # and the histogram value is the tie-averaged AURC of the bins' samples
        confidence = np.repeat(np.arange(bins, dtype=float), count.numpy().astype(int))
        wrong = np.concatenate(
            [
                np.r_[np.ones(int(e)), np.zeros(int(n - e))]
                for n, e in zip(count, errors, strict=True)
            ]
        )
        reference = aurc(
            torch.tensor(0.51 + 0.4 * confidence / bins), torch.tensor(1 - wrong).long()
        )
        assert abs(aurc_from_histogram(count, errors).item() - reference.item()) < 1e-12


def test_aurc_histogram_edges_are_log_odds_and_a_bin_for_one():
    edges = aurc_histogram_edges(10_000)
    assert edges.shape == (9_999,)
    assert bool((edges.diff() >= 0).all())
    assert bool((edges < 1).all())  # so a confidence of 1 lands in the last bin alone
    assert edges[-1].item() == np.nextafter(1.0, 0.0)
    # equal width 72 / 9,999 in log-odds, where float64 resolves it (below log-odds 30)
    steps = np.arange(1, 9_999) * 72 / 9_999 - 36
    resolved = steps < 30
    np.testing.assert_allclose(
        np.log(edges[:-1].numpy() / (1 - edges[:-1].numpy()))[resolved],
        steps[resolved],
        rtol=0,
        atol=1e-3,
    )
    saturated = torch.tensor([1.0, 1.0, 1 - 2**-52, 0.999], dtype=torch.float64)
    index = torch.bucketize(saturated, edges, right=False)
    assert index.tolist()[:2] == [9_999, 9_999]
    assert index[2] < 9_999
    with pytest.raises(ValueError, match="histogram_bins must be >= 2; got 1"):
        AURC(histogram_bins=1)
    with pytest.raises(TypeError, match="exact must be True or False"):
        AURC(exact=1)
