"""Smooth ECE (Błasiok and Nakkiran, ICLR 2024) against the authors' ``relplot`` and plain sums.

The references: ``relplot.smECE`` (automatic bandwidth), ``relplot.smECE_sigma`` (fixed
bandwidth), and the kernel sums written out below in float64 over the samples themselves,
with the reflected Gaussian ``K(t, x) = sum over the reflections z of x of φ_σ(t - z)`` (the
images ``x``, ``-x`` and ``2 - x`` of a point, each counted once, cut off at distance 1/2).
Confidence and correctness for ``relplot`` are computed here in NumPy from the raw inputs.
"""

from __future__ import annotations

import math

import matplotlib.image
import numpy as np
import pytest
import relplot
import torch
from matplotlib.figure import Figure

from lightning_losses.calibration.metrics import SmoothCalibrationError
from lightning_losses.calibration.smooth import (
    GRID_SIZE,
    smooth_calibration_error,
    smooth_calibration_error_from_grid,
    smooth_grid_statistics,
    smooth_reliability_curve,
)
from lightning_losses.calibration.smooth_diagram import (
    save_smooth_reliability_diagram,
    smooth_reliability_diagram,
)

#: One bisection step of the automatic bandwidth (as relplot: ten halvings of [0, 1]).
STEP = 2.0**-10


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _sample_labels(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    cumulative = probs.cumsum(axis=1)
    u = rng.uniform(size=(probs.shape[0], 1))
    return np.minimum((u > cumulative).sum(axis=1), probs.shape[1] - 1)


def make_case(name: str) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """``(preds, target, f, y)``: torch inputs and relplot's confidence/correctness pairs."""
    rng = np.random.default_rng(sum(map(ord, name)))
    if name in ("calibrated_binary", "binary_large"):
        n = 3000 if name == "calibrated_binary" else 100_000
        p = rng.uniform(size=n)
        truth = p if name == "calibrated_binary" else 0.5 + 0.6 * (p - 0.5)  # over-confident
        y = (rng.uniform(size=n) < truth).astype(np.float64)
        return torch.tensor(p), torch.tensor(y), p, y
    if name == "binary_far_off":  # a large smECE: bandwidths near 1/2, where the cut-off acts
        p = rng.beta(8, 1, size=2000)
        y = (rng.uniform(size=2000) < 0.4).astype(np.float64)
        return torch.tensor(p, dtype=torch.float32), torch.tensor(y), p.astype(np.float32), y
    if name in ("overconfident_multiclass", "underconfident_multiclass"):
        logits = rng.normal(size=(3000, 5)) * 2.0
        shown, true = (2.5, 1.0) if name.startswith("over") else (0.4, 1.0)
        target = _sample_labels(rng, _softmax(logits * true))
        probs = _softmax(logits * shown)
        f, y = probs.max(axis=1), (probs.argmax(axis=1) == target).astype(np.float64)
        return torch.tensor(probs), torch.tensor(target), f, y
    if name == "multilabel":
        p = rng.uniform(size=(800, 3))
        y = (rng.uniform(size=(800, 3)) < p**1.5).astype(np.float64)
        return torch.tensor(p), torch.tensor(y), p.reshape(-1), y.reshape(-1)
    if name.startswith("tiny"):
        n = int(name.removeprefix("tiny"))
        p = rng.uniform(size=n)
        y = (rng.uniform(size=n) < 0.5).astype(np.float64)
        return torch.tensor(p), torch.tensor(y), p, y
    if name == "endpoints":  # exactly 0 and 1 (saturated softmax), and a few inside
        p = np.array([0.0] * 40 + [1.0] * 300 + list(rng.uniform(size=60)))
        y = (rng.uniform(size=p.size) < np.where(p == 1.0, 0.8, 0.3)).astype(np.float64)
        return torch.tensor(p), torch.tensor(y), p, y
    if name == "onehot_multiclass":  # top-label confidence exactly 1 for most rows
        target = rng.integers(0, 4, size=500)
        guess = np.where(rng.uniform(size=500) < 0.7, target, rng.integers(0, 4, size=500))
        probs = np.eye(4)[guess]
        soft = rng.uniform(size=500) < 0.2
        probs[soft] = _softmax(rng.normal(size=(int(soft.sum()), 4)))
        f, y = probs.max(axis=1), (probs.argmax(axis=1) == target).astype(np.float64)
        return torch.tensor(probs), torch.tensor(target), f, y
    raise KeyError(name)


CASES = [
    "calibrated_binary",
    "binary_large",
    "binary_far_off",
    "overconfident_multiclass",
    "underconfident_multiclass",
    "multilabel",
    "tiny1",
    "tiny3",
    "tiny7",
    "endpoints",
    "onehot_multiclass",
]


def _metric_value(preds: torch.Tensor, target: torch.Tensor, **kwargs) -> SmoothCalibrationError:
    metric = SmoothCalibrationError(**kwargs)
    for chunk_p, chunk_t in zip(preds.tensor_split(3), target.tensor_split(3), strict=True):
        if chunk_p.shape[0]:
            metric.update(chunk_p, chunk_t)
    return metric


@pytest.mark.parametrize("name", CASES)
def test_automatic_bandwidth_matches_relplot(name):
    preds, target, f, y = make_case(name)
    ref_value, ref_sigma = relplot.smECE(np.asarray(f, np.float64), y, return_width=True)
    value, sigma = smooth_calibration_error(preds, target, return_bandwidth=True)
    assert value.dtype == torch.float64
    assert value.shape == ()
    assert abs(value.item() - ref_value) < 1e-3
    # The same bisection: a decision can flip only where smECE_σ and σ are within the two
    # discretisations' difference, which moves σ* by one step.
    assert abs(sigma.item() - ref_sigma) <= STEP + 1e-12
    metric = _metric_value(preds, target)
    assert abs(metric.compute().item() - ref_value) < 1e-3
    curve = metric.curve()
    assert curve.bandwidth == pytest.approx(sigma.item(), abs=1e-12)
    assert curve.value == pytest.approx(value.item(), abs=1e-12)


@pytest.mark.parametrize("name", ["overconfident_multiclass", "endpoints", "tiny3", "binary_large"])
@pytest.mark.parametrize("bandwidth", [0.001, 0.01, 0.05, 0.2, 0.45, 1.0])
def test_fixed_bandwidth_matches_relplot(name, bandwidth):
    preds, target, f, y = make_case(name)
    reference = relplot.smECE_sigma(np.asarray(f, np.float64), y, bandwidth)
    value = smooth_calibration_error(preds, target, bandwidth=bandwidth)
    assert abs(value.item() - reference) < 1e-3
    metric = _metric_value(preds, target, bandwidth=bandwidth)
    assert abs(metric.compute().item() - reference) < 1e-3


def _kernel(t: np.ndarray, x: np.ndarray, sigma: float) -> np.ndarray:
    """``K[t, i]``: the reflected Gaussian (each image once, cut off at 1/2), float64."""
    t, x = t[:, None], x[None, :]

    def phi(d):
        return np.where(np.abs(d) <= 0.5, np.exp(-0.5 * (d / sigma) ** 2), 0.0) / (
            math.sqrt(2 * math.pi) * sigma
        )

    return phi(t - x) + np.where(x > 0, phi(t + x), 0.0) + np.where(x < 1, phi(t - (2 - x)), 0.0)


@pytest.mark.parametrize("sigma", [0.01, 0.05, 0.3])
def test_value_and_curve_equal_plain_kernel_sums(sigma):
    # Confidences at the ends exactly, or at least 0.001 inside: within one grid spacing of an
    # end the grid blends the one image of an end point with the two of an inner point.
    rng = np.random.default_rng(5)
    f = np.concatenate([[0.0, 1.0, 1.0], rng.uniform(0.001, 0.999, size=50)])
    y = (rng.uniform(size=f.size) < f**2).astype(np.float64)
    mesh = np.linspace(0, 1, max(200, round(10 / sigma)))
    k = _kernel(mesh, f, sigma)
    smoothed_r, smoothed_y, dens = k @ (f - y), k @ y, k.sum(axis=1)
    expected = np.abs(smoothed_r).sum() / dens.sum()

    value = smooth_calibration_error(torch.tensor(f), torch.tensor(y), bandwidth=sigma)
    assert value.item() == pytest.approx(expected, rel=1e-4)
    curve = smooth_reliability_curve(
        *smooth_grid_statistics(torch.tensor(f), torch.tensor(y)), bandwidth=sigma
    )
    np.testing.assert_allclose(curve.mesh, mesh, rtol=0, atol=1e-15)
    np.testing.assert_allclose(curve.density, dens / f.size, rtol=1e-4, atol=1e-6)
    where = dens > 1e-3 * dens.max()
    np.testing.assert_allclose(curve.accuracy[where], (smoothed_y / dens)[where], atol=1e-4)
    np.testing.assert_allclose(curve.residual[where], (smoothed_r / dens)[where], atol=1e-4)
    assert curve.value == pytest.approx(expected, rel=1e-4)


def test_grid_statistics_split_each_sample_linearly():
    confidence = torch.tensor([0.0, 0.3, 0.3, 0.625, 1.0], dtype=torch.float64)
    correct = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    mass, residual = smooth_grid_statistics(confidence, correct, grid_size=4)
    # 0.3 * 4 = 1.2: 0.8 on node 1, 0.2 on node 2; 0.625 * 4 = 2.5: half on nodes 2 and 3.
    expected_mass = [1.0, 1.6, 0.4 + 0.5, 0.5, 1.0]
    gaps = [-1.0, 0.3, -0.7, -0.375, 1.0]
    expected_residual = [
        gaps[0],
        0.8 * (gaps[1] + gaps[2]),
        0.2 * (gaps[1] + gaps[2]) + 0.5 * gaps[3],
        0.5 * gaps[3],
        gaps[4],
    ]
    torch.testing.assert_close(mass, torch.tensor(expected_mass, dtype=torch.float64))
    torch.testing.assert_close(residual, torch.tensor(expected_residual, dtype=torch.float64))
    full_mass, full_residual = smooth_grid_statistics(confidence, correct)
    assert full_mass.shape == full_residual.shape == (GRID_SIZE + 1,)
    positions = torch.linspace(0, 1, GRID_SIZE + 1, dtype=torch.float64)
    # Linear splitting keeps the count, the first moment and the residual sum exact.
    assert full_mass.sum().item() == pytest.approx(5.0, abs=1e-12)
    assert (full_mass * positions).sum().item() == pytest.approx(confidence.sum().item(), 1e-12)
    assert full_residual.sum().item() == pytest.approx((confidence - correct).sum().item(), 1e-12)


@pytest.mark.parametrize("bandwidth", [None, 0.02])
def test_metric_is_batching_invariant_and_equals_functional(bandwidth):
    preds, target, _, _ = make_case("overconfident_multiclass")
    value, sigma = smooth_calibration_error(
        preds, target, bandwidth=bandwidth, return_bandwidth=True
    )
    rng = np.random.default_rng(11)
    grids = []
    for _ in range(4):
        cuts = np.sort(rng.choice(np.arange(1, preds.shape[0]), size=rng.integers(1, 12)))
        metric = SmoothCalibrationError(num_classes=5, bandwidth=bandwidth)
        start = 0
        for stop in [*cuts.tolist(), preds.shape[0]]:
            if stop > start:
                metric.update(preds[start:stop], target[start:stop])
            start = stop
        assert abs(metric.compute().item() - value.item()) < 1e-12
        grids.append(metric.grid())
        assert metric.curve().bandwidth == pytest.approx(sigma.item(), abs=1e-12)
    for mass, residual in grids[1:]:
        torch.testing.assert_close(mass, grids[0][0], rtol=0, atol=1e-12)
        torch.testing.assert_close(residual, grids[0][1], rtol=0, atol=1e-12)


def test_logits_and_float32_inputs():
    preds, target, f, y = make_case("overconfident_multiclass")
    from_probs = smooth_calibration_error(preds, target)
    from_logits = smooth_calibration_error(preds.log(), target, input_format="logits")
    assert from_logits.item() == pytest.approx(from_probs.item(), abs=1e-9)
    from_float32 = smooth_calibration_error(preds.float(), target)
    assert from_float32.item() == pytest.approx(relplot.smECE(f, y), abs=1e-3)


def test_ignore_index_leaves_the_samples_out():
    preds, target, f, y = make_case("overconfident_multiclass")
    drop = torch.arange(target.shape[0]) % 7 == 3
    padded = torch.where(drop, torch.full_like(target, -100), target)
    reference = relplot.smECE(f[~drop.numpy()], y[~drop.numpy()])
    value = smooth_calibration_error(preds, padded, ignore_index=-100)
    assert abs(value.item() - reference) < 1e-3
    kept = smooth_calibration_error(preds[~drop], target[~drop])
    assert value.item() == pytest.approx(kept.item(), abs=1e-12)
    metric = _metric_value(preds, padded, ignore_index=-100)
    assert metric.compute().item() == pytest.approx(kept.item(), abs=1e-12)


def test_empty_metric_and_grid_give_nan():
    metric = SmoothCalibrationError()
    with pytest.warns(UserWarning, match="called before the ``update``"):
        assert math.isnan(metric.compute().item())
    zeros = torch.zeros(GRID_SIZE + 1, dtype=torch.float64)
    value, sigma = smooth_calibration_error_from_grid(zeros, zeros, return_bandwidth=True)
    assert math.isnan(value.item())
    assert math.isnan(sigma.item())
    with pytest.raises(ValueError, match="empty"):
        smooth_reliability_curve(zeros, zeros)
    with pytest.raises(ValueError, match="empty"):
        smooth_reliability_diagram(zeros, zeros)


#: The bandwidth's message: None (automatic) or at least the narrowest kernel, 0.001.
BANDWIDTH = r"^bandwidth must be None or lie in \[0\.001, inf\); got "


@pytest.mark.parametrize("bad", [0.0, -0.1, 0.0009, float("nan"), float("inf")])
def test_bad_bandwidth_value_is_named(bad):
    preds, target = torch.tensor([0.2, 0.9]), torch.tensor([0, 1])
    with pytest.raises(ValueError, match=BANDWIDTH):
        smooth_calibration_error(preds, target, bandwidth=bad)
    with pytest.raises(ValueError, match=BANDWIDTH):
        SmoothCalibrationError(bandwidth=bad)
    mass, residual = smooth_grid_statistics(preds, target)
    with pytest.raises(ValueError, match=BANDWIDTH):
        smooth_calibration_error_from_grid(mass, residual, bandwidth=bad)


@pytest.mark.parametrize("bad", ["0.1", True, [0.1]])
def test_bad_bandwidth_type_is_named(bad):
    with pytest.raises(TypeError, match=BANDWIDTH):
        smooth_calibration_error(torch.tensor([0.2]), torch.tensor([1]), bandwidth=bad)
    with pytest.raises(TypeError, match=BANDWIDTH):
        SmoothCalibrationError(bandwidth=bad)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="preds must be probabilities"):
        smooth_calibration_error(torch.tensor([0.2, 1.5]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="target values must be 0 or 1"):
        smooth_calibration_error(torch.tensor([0.2, 0.5]), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="cannot match preds"):
        smooth_calibration_error(torch.rand(4, 3), torch.zeros(5, dtype=torch.long))
    with pytest.raises(TypeError, match="return_bandwidth must be True or False"):
        smooth_calibration_error(torch.tensor([0.2]), torch.tensor([1]), return_bandwidth=1)
    metric = SmoothCalibrationError(num_classes=3)
    with pytest.raises(ValueError, match="num_classes"):
        metric.update(torch.rand(2, 4).softmax(1), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="grid_size must be >= 2; got 1"):
        smooth_grid_statistics(torch.tensor([0.5]), torch.tensor([1.0]), grid_size=1)
    with pytest.raises(ValueError, match="confidence and correct must have the same length"):
        smooth_grid_statistics(torch.tensor([0.5]), torch.tensor([1.0, 0.0]))


def test_bad_grid_is_named():
    mass, residual = smooth_grid_statistics(torch.tensor([0.4, 0.7]), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="mass and residual must have the same length"):
        smooth_calibration_error_from_grid(mass, residual[:-1])
    with pytest.raises(ValueError, match="mass must be 1-D"):
        smooth_calibration_error_from_grid(mass[None], residual)
    with pytest.raises(ValueError, match="mass must be non-negative"):
        smooth_calibration_error_from_grid(-mass, residual)
    with pytest.raises(ValueError, match=r"\|residual\| <= mass"):
        smooth_calibration_error_from_grid(mass, residual * 5)
    with pytest.raises(ValueError, match="residual must hold finite values"):
        smooth_calibration_error_from_grid(mass, residual * float("nan"))
    with pytest.raises(TypeError, match="metric_or_grid must be"):
        save_smooth_reliability_diagram(mass, "unused.png")


def test_diagram_draws_and_saves(tmp_path):
    preds, target, _, _ = make_case("overconfident_multiclass")
    metric = _metric_value(preds, target)
    value = metric.compute().item()
    curve = metric.curve()

    fig = smooth_reliability_diagram(*metric.grid(), title="Digits, epoch 3")
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 2
    top, bottom = fig.axes
    assert top.get_title() == (f"Digits, epoch 3\nsmECE = {value:.4f} (σ = {curve.bandwidth:.4f})")
    line = top.collections[0]
    assert line.get_label() == "Smoothed accuracy"
    assert len(line.get_segments()) == curve.mesh.size - 1
    widths = np.asarray(line.get_linewidths())
    # thicker where the confidences are denser
    middle = (curve.density[:-1] + curve.density[1:]) / 2
    assert widths[np.argmax(middle)] == widths.max() > widths[np.argmin(middle)]
    assert bottom.collections[0].get_label() == "Density"

    single = smooth_reliability_diagram(*metric.grid(), show_density=False, bandwidth=0.05)
    assert len(single.axes) == 1
    assert "σ = 0.0500" in single.axes[0].get_title()

    path = tmp_path / "smooth.png"
    saved = save_smooth_reliability_diagram(metric, path)
    assert isinstance(saved, Figure)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(path).shape[:2] == (600, 500)
    fixed = SmoothCalibrationError(bandwidth=0.05)
    fixed.update(preds, target)
    other = save_smooth_reliability_diagram(fixed, tmp_path / "fixed.png")
    assert "σ = 0.0500" in other.axes[0].get_title()
