"""Histogram binning, top-label and one-vs-rest.

References, independent of the code under test: netcal's ``HistogramBinning`` called directly
(on the top confidences and their correctness, or on the softmax probabilities), and plain
NumPy float64 formulas (bin masks in a loop, the top-label share of the rest). The package's
floor is applied to netcal's probabilities by its formula, ``(p + eps) / (1 + C eps)``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.warned import package_warns
from netcal.binning import HistogramBinning as NetcalHistogramBinning

from lightning_losses.calibration import HistogramBinning
from lightning_losses.calibration.posthoc import get_calibrator


def overconfident(n: int, n_classes: int, scale: float, seed: int) -> tuple[torch.Tensor, ...]:
    """Logits ``scale * z`` of a softmax model ``z`` whose labels are drawn from softmax(z)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(n_classes, 6, generator=g, dtype=torch.float64)
    z = torch.randn(n, 6, generator=g, dtype=torch.float64) @ weights.T
    target = torch.multinomial(z.softmax(dim=1), 1, generator=g).squeeze(1)
    return scale * z, target


FLOOR = 1e-6  # HistogramBinning's default floor


def floored(p: np.ndarray, floor: float = FLOOR) -> np.ndarray:
    """Each row mixed with the floor and renormalised: ``(p + eps) / (1 + C eps)``."""
    return (p + floor) / (1.0 + p.shape[1] * floor)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def top_label_reference(z: np.ndarray, top: np.ndarray) -> np.ndarray:
    """The predicted class gets ``top``; the others share ``1 - top`` as their softmax does."""
    p = softmax(z)
    k = p.argmax(axis=1)
    rows = np.arange(len(p))
    others = np.ones_like(p, dtype=bool)
    others[rows, k] = False
    rest = np.where(others, p, 0.0).sum(axis=1)  # not 1 - p_k, which cancels when p_k ~ 1
    out = p * ((1.0 - top) / rest)[:, None]
    out[rows, k] = top
    return out


def bin_reference(p: np.ndarray, hit: np.ndarray, n_bins: int) -> np.ndarray:
    """theta_k over bins (k/B, (k+1)/B] (0 in the first) by masks; empty bins: the midpoint."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    theta = np.empty(n_bins)
    for k in range(n_bins):
        mask = (p > edges[k]) & (p <= edges[k + 1])
        if k == 0:
            mask |= p == 0
        theta[k] = hit[mask].mean() if mask.any() else 0.5 * (edges[k] + edges[k + 1])
    return theta


def off_edges(p: np.ndarray, n_bins: int) -> bool:
    """No probability on an inner bin edge (where netcal's fit and transform differ)."""
    return not np.isin(p, np.linspace(0.0, 1.0, n_bins + 1)[1:-1]).any()


@pytest.mark.parametrize("n_bins", [10, 15])
def test_top_label_equals_netcal(n_bins: int) -> None:
    """The calibrated top probability is netcal's fit on (confidence, correct) within 1e-12."""
    z, y = overconfident(2000, 5, 3.0, seed=0)
    z_test, _ = overconfident(800, 5, 3.0, seed=1)
    p, p_test = z.softmax(1).numpy(), z_test.softmax(1).numpy()
    conf, correct = p.max(1), (p.argmax(1) == y.numpy()).astype(np.int64)
    assert off_edges(conf, n_bins)
    assert off_edges(p_test.max(1), n_bins)
    reference = NetcalHistogramBinning(bins=n_bins).fit(conf, correct)
    top = reference.transform(p_test.max(1))
    ours = HistogramBinning(n_bins=n_bins).fit(z, y)
    probs = ours(z_test).exp().numpy()
    expected = floored(top_label_reference(z_test.numpy(), top))
    np.testing.assert_allclose(probs, expected, atol=1e-12)
    np.testing.assert_allclose(
        ours.params["values"][0].numpy(), bin_reference(conf, correct, n_bins)
    )


@pytest.mark.parametrize("n_classes", [2, 5])
def test_one_vs_rest_equals_netcal(n_classes: int) -> None:
    """One map per class, rows renormalised: netcal's multiclass fit within 1e-12 (C=2: one map)."""
    z, y = overconfident(3000, n_classes, 2.0, seed=2)
    z_test, _ = overconfident(800, n_classes, 2.0, seed=3)
    p, p_test = z.softmax(1).numpy(), z_test.softmax(1).numpy()
    assert off_edges(p, 10)
    assert off_edges(p_test, 10)
    reference = NetcalHistogramBinning(bins=10).fit(p, y.numpy()).transform(p_test)
    if n_classes == 2:  # netcal reads two columns as one binary task on p_1
        reference = np.stack([1.0 - reference, reference], axis=1)
    ours = HistogramBinning(mode="one_vs_rest").fit(z, y)
    np.testing.assert_allclose(ours(z_test).exp().numpy(), floored(reference), atol=1e-12)
    expected_rows = n_classes if n_classes > 2 else 1
    assert ours.params["values"].shape == (expected_rows, 10)


def test_absent_class_gets_the_floor_where_netcal_gives_zero() -> None:
    """A class without a sample in the fit: netcal's 0 becomes the floor, eps / (1 + C eps)."""
    z, y = overconfident(3000, 4, 1.0, seed=4)
    keep = y != 3
    z, y = z[keep], y[keep]
    z_test, _ = overconfident(500, 4, 1.0, seed=5)
    reference = NetcalHistogramBinning(bins=10).fit(z.softmax(1).numpy(), y.numpy())
    expected = reference.transform(z_test.softmax(1).numpy())
    log_probs = HistogramBinning(mode="one_vs_rest").fit(z, y)(z_test)
    np.testing.assert_allclose(log_probs.exp().numpy(), floored(expected), atol=1e-12)
    assert (expected[:, 3] == 0).all()
    np.testing.assert_allclose(log_probs[:, 3].numpy(), np.log(FLOOR / (1 + 4 * FLOOR)))


def test_edges_and_empty_bins_follow_the_stated_rule() -> None:
    """A probability on an inner edge k/B lies in bin (k-1)/B..k/B; empty bins: their midpoint."""
    z = torch.tensor([[0.0, 0.0]] * 3 + [[2.0, 0.0]] * 5 + [[0.0, 0.0]] * 2, dtype=torch.float64)
    y = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1])  # p_top = 0.5 exactly in the first 3, last 2
    binning = HistogramBinning(n_bins=10).fit(z, y)
    conf = z.softmax(1).max(1).values.numpy()
    correct = (z.argmax(1) == y).numpy().astype(float)
    assert (conf == 0.5).sum() == 5
    theta = bin_reference(conf, correct, 10)
    np.testing.assert_allclose(binning.params["values"][0].numpy(), theta)
    assert theta[4] == 3 / 5
    assert theta[5] == 0.55


def test_zero_probabilities_and_all_zero_rows() -> None:
    """A map's 0 gives the floor (finite log); a one-vs-rest row of zeros keeps its softmax."""
    p = torch.tensor(
        [[0.35, 0.35, 0.30], [0.60, 0.05, 0.35]] + [[0.1, 0.8, 0.1]] * 4 + [[0.05, 0.05, 0.9]] * 4,
        dtype=torch.float64,
    )
    y = torch.tensor([2, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    binning = HistogramBinning(mode="one_vs_rest").fit(p.log(), y)
    test = torch.tensor([[0.35, 0.31, 0.34], [0.1, 0.8, 0.1]], dtype=torch.float64).log()
    out = binning(test)
    # row 0: every class's bin (0.3, 0.4] holds only samples of other classes
    softmax_row = floored(torch.softmax(test[:1], 1).numpy())
    np.testing.assert_allclose(out[0].exp().numpy(), softmax_row[0], atol=1e-15)
    reference = NetcalHistogramBinning(bins=10).fit(p.numpy(), y.numpy())
    with np.errstate(invalid="ignore"):
        netcal_row = reference.transform(test.exp().numpy())[0]
    assert np.isnan(netcal_row).all()  # what netcal returns there (0 / 0)
    np.testing.assert_allclose(out[1].exp().numpy(), floored(np.array([[0.0, 1.0, 0.0]]))[0])
    assert float(out[1, 0]) == pytest.approx(np.log(FLOOR / (1 + 3 * FLOOR)), rel=1e-12)
    top = HistogramBinning(n_bins=10).fit(p.log(), y)
    # four right of four: the map gives 1 and the rest 0, then the floor
    np.testing.assert_allclose(top(test[1:]).exp().numpy(), floored(np.array([[0.0, 1.0, 0.0]])))
    assert bool(top(test[1:]).isfinite().all())


def test_binary_logits_and_dtype() -> None:
    """[N] binary logits are read as [0, z]; float32 in, float32 out (computed in float64)."""
    z, y = overconfident(400, 2, 2.0, seed=6)
    d = (z[:, 1] - z[:, 0]).float()
    binning = HistogramBinning(n_bins=8).fit(d, y)
    pair = torch.stack([torch.zeros_like(d), d], 1)
    out = binning(d)
    assert out.dtype == torch.float32
    assert out.shape == (400, 2)
    assert torch.equal(out, binning(pair))


@pytest.mark.parametrize("mode", ["top_label", "one_vs_rest"])
def test_state_dict_round_trip(mode: str) -> None:
    """A fresh calibrator with the same hyper-parameters loads the fit and gives the same output."""
    z, y = overconfident(600, 4, 2.0, seed=7)
    fitted = HistogramBinning(n_bins=12, mode=mode).fit(z, y)  # type: ignore[arg-type]
    fresh = HistogramBinning(n_bins=12, mode=mode)  # type: ignore[arg-type]
    fresh.load_state_dict(fitted.state_dict())
    assert torch.equal(fresh(z), fitted(z))
    wrong = HistogramBinning(n_bins=5, mode=mode)  # type: ignore[arg-type]
    wrong.load_state_dict(fitted.state_dict())
    with pytest.raises(ValueError, match="HistogramBinning: the fitted state has 12 bins"):
        wrong(z)
    other = "one_vs_rest" if mode == "top_label" else "top_label"
    swapped = HistogramBinning(n_bins=12, mode=other)  # type: ignore[arg-type]
    swapped.load_state_dict(fitted.state_dict())
    with pytest.raises(ValueError, match="HistogramBinning: the fitted state holds"):
        swapped(z)


def test_too_few_samples_or_one_class_fall_back() -> None:
    """Fewer samples than bins, or one class: the identity, with the package's warning."""
    z, y = overconfident(9, 3, 1.0, seed=8)
    with package_warns(
        r"HistogramBinning \(histogram\) falls back.*9 samples are fewer than the 10"
    ):
        binning = HistogramBinning().fit(z, y)
    assert binning.fallback
    assert torch.equal(binning(z), torch.log_softmax(z, 1))
    with package_warns(r"HistogramBinning \(histogram\) falls back.*one class"):
        HistogramBinning(n_bins=2).fit(z, torch.zeros(9, dtype=torch.long))


def test_bad_input_names_the_method() -> None:
    """Bad hyper-parameters and inputs: errors that name HistogramBinning and the argument."""
    with pytest.raises(ValueError, match="HistogramBinning: mode must be one of"):
        HistogramBinning(mode="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="HistogramBinning: n_bins"):
        HistogramBinning(n_bins=0)
    with pytest.raises(TypeError):
        HistogramBinning(10)  # type: ignore[misc]
    z, y = torch.zeros(20, 3), torch.zeros(20, dtype=torch.long)
    with pytest.raises(ValueError, match=r"HistogramBinning\.fit: logits contain NaN"):
        HistogramBinning().fit(z.index_fill(0, torch.tensor([1]), float("nan")), y)
    with pytest.raises(
        ValueError, match=r"HistogramBinning\.fit: target labels must lie in \[0, 2\]"
    ):
        HistogramBinning().fit(z, torch.full((20,), 3))
    calibrator = get_calibrator("histogram", n_bins=4, mode="one_vs_rest")
    assert isinstance(calibrator, HistogramBinning)
    assert calibrator.n_bins == 4
