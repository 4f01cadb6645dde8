"""Reliability diagrams, the netcal bridge and temperature scaling.

References are written here independently of the code under test: per-bin statistics and ECE by
an explicit loop over bin masks in NumPy, NLL by a NumPy log-sum-exp, netcal's own classes
called directly, a 1-D grid search for the binary temperature, and the pixels of the saved PNG
located through the axes' data-to-pixel transform.
"""

from __future__ import annotations

import ast
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from lightning_losses.calibration import diagram, netcal_bridge, scaling
from lightning_losses.calibration.diagram import reliability_diagram, save_reliability_diagram
from lightning_losses.calibration.netcal_bridge import (
    netcal_metrics,
    netcal_reliability_diagram,
    to_netcal,
)
from lightning_losses.calibration.scaling import TemperatureScaler, fit_temperature

N_BINS = 10
TAB_BLUE = np.array([0x1F, 0x77, 0xB4]) / 255.0


# ---------------------------------------------------------------- independent references


def reference_bins(confidence: np.ndarray, correct: np.ndarray, n_bins: int):
    """Per-bin count / confidence sum / correct sum over bins (k/B, (k+1)/B], by masks."""
    count, conf_sum, correct_sum = (np.zeros(n_bins) for _ in range(3))
    for k in range(n_bins):
        lo, hi = k / n_bins, (k + 1) / n_bins
        mask = (confidence > lo) & (confidence <= hi)
        if k == 0:
            mask |= confidence == 0
        count[k] = mask.sum()
        conf_sum[k] = confidence[mask].sum()
        correct_sum[k] = correct[mask].sum()
    return count, conf_sum, correct_sum


def reference_ece(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    """sum_k (n_k / N) |acc_k - conf_k| from the samples, bin by bin."""
    count, conf_sum, correct_sum = reference_bins(confidence, correct, n_bins)
    ece = 0.0
    for k in range(n_bins):
        if count[k]:
            ece += (
                count[k] / len(confidence) * abs(correct_sum[k] / count[k] - conf_sum[k] / count[k])
            )
    return ece


def reference_nll(logits: np.ndarray, target: np.ndarray, temperature: float) -> float:
    """Mean NLL of softmax(z / T) (or sigmoid(z / T) for 1-D z) in NumPy float64."""
    z = logits / temperature
    if z.ndim == 1:  # -log sigmoid(s) = log(1 + exp(-s)) with s = +z for y = 1, -z for y = 0
        s = np.where(target == 1, z, -z)
        return float(np.mean(np.logaddexp(0.0, -s)))
    m = z.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
    return float(np.mean(lse - z[np.arange(len(z)), target]))


def overconfident_logits(n: int, n_classes: int, factor: float, seed: int):
    """True logits z of a softmax model, labels drawn from softmax(z), presented as factor * z."""
    g = torch.Generator().manual_seed(seed)
    weights = 0.45 * torch.randn(n_classes, 4, generator=g, dtype=torch.float64)
    z = torch.randn(n, 4, generator=g, dtype=torch.float64) @ weights.T
    target = torch.multinomial(z.softmax(dim=1), 1, generator=g).squeeze(1)
    return factor * z, target


@pytest.fixture(scope="module")
def sample_bins():
    """Top-label statistics of 4000 samples whose confidences avoid bins 0-2 and bin 6."""
    rng = np.random.default_rng(0)
    confidence = rng.uniform(0.3, 1.0, 4000)
    confidence = confidence[(confidence <= 0.6) | (confidence > 0.7)]
    correct = (rng.uniform(size=confidence.size) < confidence**2).astype(np.float64)
    return confidence, correct, reference_bins(confidence, correct, N_BINS)


def _pixel(image: np.ndarray, fig, ax, x: float, y: float) -> np.ndarray:
    """RGB of the saved image at data point (x, y) of ax (display pixels equal PNG pixels)."""
    px, py = ax.transData.transform((x, y))
    return image[round(float(fig.bbox.height - py)), round(float(px)), :3]


# ------------------------------------------------------------------------------ diagram


def test_diagram_png_size_content_and_empty_bins(tmp_path, sample_bins):
    _, _, (count, conf_sum, correct_sum) = sample_bins
    path = tmp_path / "reliability.png"
    fig = reliability_diagram(
        torch.from_numpy(count), torch.from_numpy(conf_sum), correct_sum, path=path
    )
    image = matplotlib.image.imread(path)
    width, height = fig.get_size_inches() * 100
    assert image.shape[:2] == (round(height), round(width)) == (600, 500)

    rgb = image[..., :3].reshape(-1, 3)
    assert len(np.unique(np.round(rgb * 255), axis=0)) > 50  # bars, hatching, text
    assert (rgb.min(axis=1) < 0.9).mean() > 0.05  # not a blank page

    # Pixels at the foot of each bin's column, located through the axes' transform: a
    # non-empty bin shows its blue accuracy bar, an empty one shows the white background.
    top = fig.axes[0]
    for k in range(N_BINS):
        colour = _pixel(image, fig, top, (k + 0.5) / N_BINS, 0.04)
        if count[k] > 0:
            np.testing.assert_allclose(colour, TAB_BLUE, atol=0.02)
        else:
            np.testing.assert_allclose(colour, [1.0, 1.0, 1.0], atol=0.02)


def test_diagram_bars_are_the_bins(sample_bins):
    _, _, (count, conf_sum, correct_sum) = sample_bins
    fig = reliability_diagram(count, conf_sum, correct_sum)
    top, hist = fig.axes
    bars = {c.get_label(): c for c in top.containers}
    nonempty = np.flatnonzero(count)
    assert set(bars) == {"Accuracy", "Gap"}
    assert len(nonempty) < N_BINS  # the fixture has empty bins
    accuracy = correct_sum[nonempty] / count[nonempty]
    confidence = conf_sum[nonempty] / count[nonempty]

    acc_patches = bars["Accuracy"].patches
    assert len(acc_patches) == len(nonempty)
    assert sum(p.get_height() > 0 for p in acc_patches) == len(nonempty)
    np.testing.assert_allclose([p.get_x() for p in acc_patches], nonempty / N_BINS, atol=1e-12)
    np.testing.assert_allclose([p.get_width() for p in acc_patches], 1 / N_BINS, atol=1e-12)
    np.testing.assert_allclose([p.get_height() for p in acc_patches], accuracy, atol=1e-12)

    gap = bars["Gap"].patches
    np.testing.assert_allclose([p.get_y() for p in gap], np.minimum(accuracy, confidence))
    np.testing.assert_allclose([p.get_height() for p in gap], np.abs(confidence - accuracy))
    assert all(p.get_hatch() for p in gap)
    assert top.get_xlabel() == ""
    assert top.get_ylabel() == "Accuracy"
    assert hist.get_xlabel() == "Confidence"
    assert hist.get_ylabel() == "Count"

    (samples,) = hist.containers
    np.testing.assert_array_equal([p.get_height() for p in samples], count)
    vlines = sorted(line.get_xdata()[0] for line in hist.lines)
    expected = sorted([conf_sum.sum() / count.sum(), correct_sum.sum() / count.sum()])
    np.testing.assert_allclose(vlines, expected)

    single = reliability_diagram(count, conf_sum, correct_sum, show_histogram=False)
    assert len(single.axes) == 1
    assert single.axes[0].get_xlabel() == "Confidence"


def test_diagram_title_shows_the_ece(sample_bins):
    confidence, correct, (count, conf_sum, correct_sum) = sample_bins
    expected = reference_ece(confidence, correct, N_BINS)
    assert expected > 0.02  # miscalibrated on purpose: the check below can tell values apart

    title = reliability_diagram(count, conf_sum, correct_sum).axes[0].get_title()
    assert title.startswith("ECE = ")
    assert float(title.removeprefix("ECE = ")) == pytest.approx(expected, abs=5e-5)

    titled = reliability_diagram(count, conf_sum, correct_sum, title="val", ece=0.123456)
    assert titled.axes[0].get_title() == "val\nECE = 0.1235"


def test_diagram_rejects_bad_bins():
    with pytest.raises(ValueError, match="empty"):
        reliability_diagram(np.zeros(5), np.zeros(5), np.zeros(5))
    with pytest.raises(ValueError, match="same length"):
        reliability_diagram(np.ones(5), np.ones(4), np.ones(5))
    with pytest.raises(ValueError, match="1-D"):
        reliability_diagram(np.ones((2, 5)), np.ones((2, 5)), np.ones((2, 5)))
    with pytest.raises(ValueError, match="correct_sum"):
        reliability_diagram(np.ones(3), np.full(3, 0.5), np.full(3, 2.0))


def test_save_reliability_diagram_accepts_tuple_or_metric(tmp_path, sample_bins):
    _, _, bins = sample_bins

    class Metric:
        def bins(self):
            return tuple(torch.from_numpy(b) for b in bins)

    from_tuple = save_reliability_diagram(bins, tmp_path / "a.png", title="t")
    from_metric = save_reliability_diagram(Metric(), tmp_path / "b.png", title="t")
    assert (tmp_path / "a.png").stat().st_size > 1000
    np.testing.assert_array_equal(
        matplotlib.image.imread(tmp_path / "a.png"), matplotlib.image.imread(tmp_path / "b.png")
    )
    assert from_tuple.axes[0].get_title() == from_metric.axes[0].get_title()
    with pytest.raises(TypeError, match="bins"):
        save_reliability_diagram(np.ones(3), tmp_path / "c.png")


@pytest.mark.slow
def test_no_pyplot_figures_and_lazy_imports(tmp_path, sample_bins):
    _, _, bins = sample_bins
    before = plt.get_fignums()
    reliability_diagram(*bins, path=tmp_path / "r.png")
    logits, target = overconfident_logits(500, 4, 3.0, seed=1)
    netcal_reliability_diagram(logits, target, path=tmp_path / "n.png", input_format="logits")
    assert plt.get_fignums() == before

    # torchmetrics (imported by the package) already loads matplotlib, so for matplotlib the
    # check is on the source: no module-level import outside `if TYPE_CHECKING:`.
    for module in (diagram, netcal_bridge, scaling):
        for node in ast.parse(Path(module.__file__).read_text()).body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names] + [getattr(node, "module", None) or ""]
                roots = {name.split(".")[0] for name in names}
                assert not roots & {"matplotlib", "netcal"}, (module.__name__, ast.unparse(node))
    code = "import sys, lightning_losses.calibration.netcal_bridge; print('netcal' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------- netcal bridge


def test_to_netcal_converts_and_validates():
    logits, target = overconfident_logits(50, 4, 1.0, seed=2)
    probs, labels = to_netcal(logits.float(), target, input_format="logits")
    assert probs.dtype == np.float64
    assert labels.dtype == np.int64
    assert probs.shape == (50, 4)
    expected = np.exp(logits.numpy()) / np.exp(logits.numpy()).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(probs, expected, rtol=1e-6)
    np.testing.assert_array_equal(labels, target.numpy())

    binary, _ = to_netcal(np.array([0.0, 2.0]), np.array([0, 1]), input_format="logits")
    np.testing.assert_allclose(binary, [0.5, 1 / (1 + math.exp(-2))])
    same, _ = to_netcal(expected, target)
    np.testing.assert_array_equal(same, expected)

    with pytest.raises(ValueError, match="outside"):
        to_netcal(logits, target)  # logits declared as probabilities
    with pytest.raises(ValueError, match="sum to 1"):
        to_netcal(np.full((2, 3), 0.5), np.array([0, 1]))
    with pytest.raises(ValueError, match="labels"):
        to_netcal(expected, torch.full((50,), 4))
    with pytest.raises(ValueError, match="input_format"):
        to_netcal(expected, target, input_format="probabilities")
    with pytest.raises(ValueError, match="target"):
        to_netcal(expected, target[:-1])


def test_netcal_metrics_equal_netcal_called_directly():
    from netcal.metrics import ACE, ECE, MCE

    logits, target = overconfident_logits(3000, 6, 2.5, seed=3)
    probs = logits.softmax(dim=1).numpy()
    y = target.numpy()
    for n_bins in (10, 15):
        expected = {
            "ece": ECE(bins=n_bins).measure(probs, y),
            "mce": MCE(bins=n_bins).measure(probs, y),
            "ace": ACE(bins=n_bins).measure(probs, y),
        }
        from_logits = netcal_metrics(logits, target, n_bins=n_bins, input_format="logits")
        from_probs = netcal_metrics(probs, y, n_bins=n_bins)
        assert from_logits == pytest.approx(expected, rel=1e-12, abs=1e-15)
        assert from_probs == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert expected["ece"] > 0.05

    p1 = torch.sigmoid(logits[:, 0] - logits[:, 1]).numpy()
    y1 = (y % 2).astype(np.int64)
    binary = netcal_metrics(p1, y1)
    assert binary["ece"] == pytest.approx(ECE(bins=15).measure(p1, y1), rel=1e-12)
    assert binary["ace"] == pytest.approx(ACE(bins=15).measure(p1, y1), rel=1e-12)


def test_netcal_metrics_multiclass_with_two_label_values():
    # netcal reads labels with two distinct values as a binary task; the bridge hands it the
    # top-label pair, so a 5-class set whose labels happen to be 0 and 1 is still top-label.
    logits, target = overconfident_logits(2000, 5, 2.0, seed=4)
    target = target % 2
    probs = logits.softmax(dim=1).numpy()
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == target.numpy()).astype(np.float64)
    result = netcal_metrics(logits, target, input_format="logits")
    assert result["ece"] == pytest.approx(reference_ece(confidence, correct, 15), rel=1e-9)


def test_netcal_reliability_diagram_png(tmp_path):
    logits, target = overconfident_logits(2000, 5, 2.0, seed=5)
    path = tmp_path / "netcal.png"
    fig = netcal_reliability_diagram(logits, target, path=path, input_format="logits")
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (600, 700)
    rgb = image[..., :3].reshape(-1, 3)
    assert len(np.unique(np.round(rgb * 255), axis=0)) > 50
    assert (rgb.min(axis=1) < 0.9).mean() > 0.05
    assert [ax.get_title() for ax in fig.axes] == ["Confidence Histogram", "Reliability Diagram"]


# --------------------------------------------------------------------- temperature scaling


@pytest.fixture(scope="module")
def overconfident():
    logits, target = overconfident_logits(20000, 10, 3.0, seed=6)
    # netcal takes log(p) clipped at float64 eps; with no probability below eps its input is
    # exactly these logits up to a per-row shift, so both fits see the same problem.
    assert logits.log_softmax(dim=1).min() > math.log(np.finfo(np.float64).eps)
    return logits, target, TemperatureScaler().fit(logits, target)


def test_temperature_recovers_the_overconfidence_factor(overconfident):
    logits, target, scaler = overconfident
    assert scaler.temperature == pytest.approx(3.0, rel=0.03)
    assert scaler.temperature == fit_temperature(logits, target)

    report = scaler.report(logits, target, n_bins=15)
    assert report["temperature"] == scaler.temperature
    assert report["ece_after"] < 0.3 * report["ece_before"]
    assert report["nll_after"] < report["nll_before"]

    z, y = logits.numpy(), target.numpy()
    assert report["nll_before"] == pytest.approx(reference_nll(z, y, 1.0), rel=1e-12)
    assert report["nll_after"] == pytest.approx(reference_nll(z, y, scaler.temperature), rel=1e-12)
    for key, t in (("ece_before", 1.0), ("ece_after", scaler.temperature)):
        probs = torch.softmax(logits / t, dim=1).numpy()
        correct = (probs.argmax(axis=1) == y).astype(np.float64)
        assert report[key] == pytest.approx(reference_ece(probs.max(axis=1), correct, 15), rel=1e-9)


def test_fitted_temperature_is_a_minimum_of_the_nll(overconfident):
    logits, target, scaler = overconfident
    z, y, t = logits.numpy(), target.numpy(), scaler.temperature
    best = reference_nll(z, y, t)
    assert best < reference_nll(z, y, t * 1.05)
    assert best < reference_nll(z, y, t / 1.05)
    assert best <= reference_nll(z, y, t * (1 + 1e-4))
    assert best <= reference_nll(z, y, t / (1 + 1e-4))


def test_temperature_matches_netcal(overconfident):
    from netcal.scaling import TemperatureScaling

    logits, target, scaler = overconfident
    netcal_ts = TemperatureScaling(method="mle")
    netcal_ts.fit(logits.softmax(dim=1).numpy(), target.numpy())
    # netcal's "temperature" is the weight w of softmax(w * log p), i.e. 1 / T.
    netcal_temperature = 1.0 / float(netcal_ts.temperature[0])
    assert netcal_temperature == pytest.approx(scaler.temperature, rel=1e-3)


def test_binary_temperature_matches_grid_search():
    from netcal.scaling import TemperatureScaling

    g = torch.Generator().manual_seed(7)
    true_logit = 1.5 * torch.randn(5000, generator=g, dtype=torch.float64)
    target = torch.bernoulli(torch.sigmoid(true_logit), generator=g)
    logits = 2.5 * true_logit
    t = fit_temperature(logits, target)

    z, y = logits.numpy(), target.numpy()
    grid = np.arange(1.0, 5.0, 1e-3)
    nll = np.array([reference_nll(z, y, s) for s in grid])
    best = grid[nll.argmin()]
    assert best > 1.0
    assert best < 5.0 - 1e-3  # an interior minimum
    assert t == pytest.approx(grid[nll.argmin()], abs=1.5e-3)
    assert reference_nll(z, y, t) <= nll.min() + 1e-12
    assert t == pytest.approx(2.5, rel=0.08)

    netcal_ts = TemperatureScaling(method="mle").fit(torch.sigmoid(logits).numpy(), y)
    netcal_temperature = 1.0 / float(netcal_ts.temperature[0])
    assert netcal_temperature == pytest.approx(t, rel=1e-3)

    report = TemperatureScaler().fit(logits.float(), target.long()).report(logits, target)
    assert report["nll_after"] < report["nll_before"]
    assert report["ece_after"] < report["ece_before"]


def test_scaler_module_behaviour():
    scaler = TemperatureScaler(temperature=2.0)
    x = torch.tensor([[4.0, -2.0]], dtype=torch.float16, requires_grad=True)
    out = scaler(x)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, torch.tensor([[2.0, -1.0]], dtype=torch.float16))
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 0.5))
    assert "temperature=2" in repr(scaler)

    restored = TemperatureScaler()
    restored.load_state_dict(scaler.state_dict())
    assert restored.temperature == 2.0
    assert TemperatureScaler().temperature == 1.0
    with pytest.raises(ValueError, match="positive"):
        TemperatureScaler(temperature=0.0)
    fitted = TemperatureScaler()
    assert (
        fitted.fit(torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]), torch.tensor([0, 1, 1]))
        is fitted
    )
    assert fitted.temperature != 1.0


@pytest.mark.parametrize(
    ("logits", "target", "error", "match"),
    [
        (torch.zeros(4, 3, 2), torch.zeros(4, dtype=torch.long), ValueError, r"\[N, C\]"),
        (torch.zeros(4, 1), torch.zeros(4, dtype=torch.long), ValueError, "C >= 2"),
        (torch.zeros(4, 3), torch.zeros(5, dtype=torch.long), ValueError, "target must be"),
        (torch.zeros(4, 3), torch.full((4,), 3), ValueError, "labels"),
        (torch.zeros(4, 3), torch.zeros(4), TypeError, "integer class labels"),
        (torch.zeros(4), torch.tensor([0, 1, 2, 1]), ValueError, "0 and 1"),
        (torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), ValueError, "at least one"),
        (torch.tensor([[math.inf, 0.0]]), torch.tensor([0]), ValueError, "non-finite"),
        (torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, dtype=torch.long), TypeError, "float"),
    ],
)
def test_fit_temperature_rejects_bad_inputs(logits, target, error, match):
    with pytest.raises(error, match=match):
        fit_temperature(logits, target)


def test_report_bins_are_right_closed():
    # Top-label confidences 0.5 (exactly, from a zero binary logit) and 1.0 with n_bins = 2:
    # 0.5 belongs to (0, 0.5], so ECE = (|0.5 - 1| + |2 - 1|) / 3; a [0.5, 1) bin would give 1/6.
    logits = torch.tensor([0.0, 40.0, 40.0], dtype=torch.float64)
    target = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    report = TemperatureScaler().report(logits, target, n_bins=2)
    assert report["ece_before"] == pytest.approx(0.5, abs=1e-12)
    assert report["ece_after"] == report["ece_before"]
    with pytest.raises(ValueError, match="n_bins"):
        TemperatureScaler().report(logits, target, n_bins=0)
