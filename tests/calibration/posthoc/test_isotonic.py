"""Isotonic regression, top-label and one-vs-rest.

References, independent of the code under test: scikit-learn's
``IsotonicRegression(out_of_bounds="clip")`` and netcal's ``IsotonicRegression`` (which calls
it), fitted and applied on the same probabilities. Our fit sums integer counts where
scikit-learn averages running means, so values agree to rounding: 1e-12. The package's floor
is applied to the references' probabilities by its formula, ``(p + eps) / (1 + C eps)``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.warned import package_warns
from netcal.binning import IsotonicRegression as NetcalIsotonic
from sklearn.isotonic import IsotonicRegression

from lightning_losses.calibration import IsotonicCalibration
from lightning_losses.calibration.posthoc import get_calibrator
from lightning_losses.calibration.posthoc.isotonic import interpolate_maps, isotonic_maps


def overconfident(n: int, n_classes: int, scale: float, seed: int) -> tuple[torch.Tensor, ...]:
    """Logits ``scale * z`` of a softmax model ``z`` whose labels are drawn from softmax(z)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(n_classes, 6, generator=g, dtype=torch.float64)
    z = torch.randn(n, 6, generator=g, dtype=torch.float64) @ weights.T
    target = torch.multinomial(z.softmax(dim=1), 1, generator=g).squeeze(1)
    return scale * z, target


FLOOR = 1e-6  # IsotonicCalibration's default floor


def floored(p: np.ndarray, floor: float = FLOOR) -> np.ndarray:
    """Each row mixed with the floor and renormalised: ``(p + eps) / (1 + C eps)``."""
    return (p + floor) / (1.0 + p.shape[1] * floor)


def sklearn_map(x: np.ndarray, y: np.ndarray) -> IsotonicRegression:
    return IsotonicRegression(out_of_bounds="clip").fit(x, y.astype(np.float64))


@pytest.mark.parametrize("scale", [1.0, 6.0])
def test_top_label_equals_sklearn_and_netcal(scale: float) -> None:
    """The calibrated top probability is scikit-learn's (and netcal's) map of the confidence."""
    z, y = overconfident(3000, 6, scale, seed=0)
    z_test, _ = overconfident(1000, 6, scale * 1.3, seed=1)  # wider: some clipped at the ends
    p, p_test = z.softmax(1).numpy(), z_test.softmax(1).numpy()
    conf, correct = p.max(1), (p.argmax(1) == y.numpy()).astype(np.int64)
    expected = sklearn_map(conf, correct).predict(p_test.max(1))
    np.testing.assert_allclose(
        NetcalIsotonic().fit(conf, correct).transform(p_test.max(1)), expected, atol=1e-12
    )
    probs = IsotonicCalibration().fit(z, y)(z_test).exp().numpy()
    rows, k = np.arange(len(p_test)), p_test.argmax(1)
    np.testing.assert_allclose(probs[rows, k], (expected + FLOOR) / (1 + 6 * FLOOR), atol=1e-12)
    others = p_test.copy()
    others[rows, k] = 0.0
    share = others / others.sum(1, keepdims=True) * (1.0 - expected)[:, None]
    share[rows, k] = expected
    np.testing.assert_allclose(probs, floored(share), atol=1e-12)


@pytest.mark.parametrize(("n_classes", "scale"), [(2, 2.0), (5, 1.0), (5, 8.0)])
def test_one_vs_rest_equals_netcal(n_classes: int, scale: float) -> None:
    """One map per class, rows renormalised, as netcal (C=2: one map of p_1).

    Scale 8 gives many probabilities below 1e-15, which scikit-learn merges into one value.
    """
    z, y = overconfident(4000, n_classes, scale, seed=2)
    z_test, _ = overconfident(1000, n_classes, scale, seed=3)
    p, p_test = z.softmax(1).numpy(), z_test.softmax(1).numpy()
    if scale > 4:
        assert (p < 1e-15).mean() > 0.05
    expected = NetcalIsotonic().fit(p, y.numpy()).transform(p_test)
    if n_classes == 2:
        expected = np.stack([1.0 - expected, expected], axis=1)
    else:  # netcal's result is scikit-learn's maps, renormalised
        maps = [sklearn_map(p[:, c], y.numpy() == c).predict(p_test[:, c]) for c in range(5)]
        by_class = np.stack(maps, axis=1)
        np.testing.assert_allclose(expected, by_class / by_class.sum(1, keepdims=True))
    ours = IsotonicCalibration(mode="one_vs_rest").fit(z, y)
    np.testing.assert_allclose(ours(z_test).exp().numpy(), floored(expected), atol=1e-12)


def test_knots_equal_sklearn_thresholds() -> None:
    """Several rows at once, each fitted alone: scikit-learn's kept thresholds, exactly in x.

    Rows: continuous values; values rounded to 2 decimals (ties averaged); dense values below
    1e-13 whose neighbours lie closer than 1e-15 (scikit-learn's greedy merge of values within
    1e-15 of a run's first); one value repeated; and values 0.5 + k ulps, k < 40, where a
    search for 0.5 + 1e-15 (rounded to 0.5 + 9 ulps) must be corrected to 10 ulps.
    """
    rng = np.random.default_rng(0)
    n = 4000
    u = rng.uniform(size=n)
    ulps = 0.5 + 2.0**-53 * rng.integers(0, 40, size=n)  # 0.5 + 1e-15 rounds to 0.5 + 9 ulps
    rows = [u, np.round(u, 2), rng.uniform(0.0, 1e-13, size=n), np.full(n, 0.3), ulps]
    labels = [
        (rng.uniform(size=n) < np.clip(r * 1e13 if r.max() < 1e-12 else r, 0, 1)) for r in rows
    ]
    knots_x, knots_y = isotonic_maps(
        torch.from_numpy(np.stack(rows)), torch.from_numpy(np.stack(labels).astype(np.float64))
    )
    for r, (x, y) in enumerate(zip(rows, labels, strict=True)):
        reference = sklearn_map(x, y)
        k = len(reference.X_thresholds_)
        assert r != 2 or k > 30  # the dense row is merged into many runs, not one
        np.testing.assert_array_equal(knots_x[r, :k].numpy(), reference.X_thresholds_)
        np.testing.assert_allclose(knots_y[r, :k].numpy(), reference.y_thresholds_, atol=1e-12)
        assert bool((knots_x[r, k:] == knots_x[r, k - 1]).all())  # padding repeats the last knot
        assert bool((knots_y[r, k:] == knots_y[r, k - 1]).all())


def test_small_random_cases_equal_sklearn() -> None:
    """300 small fits (1 to 40 samples, many ties) predict as scikit-learn's, at and off knots."""
    rng = np.random.default_rng(1)
    queries = np.linspace(-0.1, 1.1, 61)
    for _ in range(300):
        n = int(rng.integers(1, 41))
        x = rng.choice(np.linspace(0.0, 1.0, int(rng.integers(1, 12))), size=n)
        y = rng.uniform(size=n) < rng.uniform()
        knots_x, knots_y = isotonic_maps(
            torch.from_numpy(x)[None], torch.from_numpy(y.astype(np.float64))[None]
        )
        ours = interpolate_maps(knots_x, knots_y, torch.from_numpy(np.r_[queries, x])[None])
        expected = sklearn_map(x, y).predict(np.r_[queries, x])
        np.testing.assert_allclose(ours[0].numpy(), expected, atol=1e-12)


def test_absent_class_and_zero_probabilities() -> None:
    """A class absent from the fit: netcal's 0 becomes the floor, a finite log-probability."""
    z, y = overconfident(2000, 4, 1.0, seed=4)
    keep = y != 1
    z, y = z[keep], y[keep]
    z_test, _ = overconfident(300, 4, 1.0, seed=5)
    expected = NetcalIsotonic().fit(z.softmax(1).numpy(), y.numpy())
    log_probs = IsotonicCalibration(mode="one_vs_rest").fit(z, y)(z_test)
    reference = expected.transform(z_test.softmax(1).numpy())
    np.testing.assert_allclose(log_probs.exp().numpy(), floored(reference), atol=1e-12)
    assert (reference[:, 1] == 0).all()
    np.testing.assert_allclose(log_probs[:, 1].numpy(), np.log(FLOOR / (1 + 4 * FLOOR)))


def test_binary_logits_state_dict_and_dtype() -> None:
    """[N] logits read as [0, z]; a fresh calibrator loads the fit; float32 in, float32 out."""
    z, y = overconfident(500, 2, 2.0, seed=6)
    d = (z[:, 1] - z[:, 0]).float()
    fitted = IsotonicCalibration(mode="one_vs_rest").fit(d, y)
    fresh = IsotonicCalibration(mode="one_vs_rest")
    fresh.load_state_dict(fitted.state_dict())
    out = fresh(d)
    assert out.dtype == torch.float32
    assert torch.equal(out, fitted(torch.stack([torch.zeros_like(d), d], 1)))
    s = torch.sigmoid(d.double()).numpy()
    expected = sklearn_map(s, y.numpy() == 1).predict(s)
    np.testing.assert_allclose(
        out[:, 1].double().exp().numpy(), (expected + FLOOR) / (1 + 2 * FLOOR), atol=1e-6
    )
    top = IsotonicCalibration().fit(z, y)
    fresh_top = IsotonicCalibration()
    fresh_top.load_state_dict(top.state_dict())
    assert torch.equal(fresh_top(z), top(z))
    with pytest.raises(ValueError, match="IsotonicCalibration: fitted on 2 classes"):
        fresh_top(torch.zeros(3, 4))


def test_fallback_and_bad_input() -> None:
    """One sample or one class: the identity with a warning; errors name the method."""
    with package_warns(r"IsotonicCalibration \(isotonic\) falls back.*1 samples are fewer"):
        iso = IsotonicCalibration().fit(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
    assert torch.equal(iso(torch.zeros(2, 2)), torch.log_softmax(torch.zeros(2, 2), 1))
    with package_warns(r"IsotonicCalibration \(isotonic\) falls back.*one class"):
        IsotonicCalibration().fit(torch.randn(5, 3), torch.ones(5, dtype=torch.long))
    with pytest.raises(ValueError, match="IsotonicCalibration: mode must be one of"):
        IsotonicCalibration(mode="top")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"IsotonicCalibration\.fit: logits must be \[N, C\]"):
        IsotonicCalibration().fit(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long))
    assert isinstance(get_calibrator("isotonic", mode="one_vs_rest"), IsotonicCalibration)


@pytest.mark.parametrize("mode", ["top_label", "one_vs_rest"])
def test_the_fit_does_not_depend_on_the_order_of_the_rows(mode: str) -> None:
    """Rows gathered from several processes in any order give the same knots, exactly."""
    z, y = overconfident(3000, 5, 4.0, seed=8)
    z = torch.cat([z, z[:300]])  # repeated rows: ties between labels of equal probabilities
    y = torch.cat([y, (y[:300] + 1) % 5])
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    one = IsotonicCalibration(mode=mode).fit(z, y).params  # type: ignore[arg-type]
    other = IsotonicCalibration(mode=mode).fit(z[order], y[order]).params  # type: ignore[arg-type]
    assert torch.equal(one["x"], other["x"])
    assert torch.equal(one["y"], other["y"])
