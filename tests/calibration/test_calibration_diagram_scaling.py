"""Reliability diagrams and the netcal bridge.

References are written here independently of the code under test: per-bin statistics and ECE by
an explicit loop over bin masks in NumPy, netcal's own classes called directly, and the pixels
of the saved PNG located through the axes' data-to-pixel transform. Temperature scaling is
tested in tests/calibration/posthoc/test_temperature.py.
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

from lightning_losses.calibration import diagram, netcal_bridge
from lightning_losses.calibration.diagram import reliability_diagram, save_reliability_diagram
from lightning_losses.calibration.netcal_bridge import (
    netcal_metrics,
    netcal_reliability_diagram,
    to_netcal,
)
from lightning_losses.calibration.posthoc import temperature

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
    for module in (diagram, netcal_bridge, temperature):
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
