"""Bootstrap intervals of the calibration numbers: coverage, a NumPy reference, invariance.

- Coverage: confidences ``c ~ Beta(4, 1.5)``, outcomes ``y ~ Bernoulli(f(c))`` for a known
  calibration curve ``f``; the population values (binned ECE, l2 binned error, accuracy,
  Brier, NLL) are integrals over the Beta density, computed here in float64 by the midpoint
  rule on 2,000,000 points. Over 200 independent draws (data and bootstrap seed) at N = 400
  and N = 10,000 the 95% interval must cover the population value in 90-99% of them.
- The intervals equal a NumPy re-implementation of the documented algorithm: the hash on
  uint64 arrays, Poisson(1) thresholds from ``scipy.stats.poisson``, replicate sums, quantiles
  with ``numpy.quantile``.
- The same interval over any batching, with shuffled rows and their ``index``, and over two
  gloo processes with uneven shares; states that do not grow with N; a ``level`` outside (0,
  1) is an error naming ``level``; the monitor logs the intervals in a plain LightningModule and
  its diagram draws Wilson intervals (checked against ``scipy.stats.binomtest``).
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from helpers.ddp import spawn_gloo
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.calibration import (
    CalibrationErrorInterval,
    CalibrationSummary,
    DebiasedCalibrationError,
    calibration_error,
    calibration_error_interval,
    debiased_calibration_error,
)
from lightning_losses.calibration.diagram import reliability_diagram
from lightning_losses.callbacks import CalibrationMonitor

BINS = 15
ALPHA, BETA = 4.0, 1.5
CURVES = {"calibrated": lambda c: c, "over-confident": lambda c: c**1.6}


# --- population values -----------------------------------------------------------------------


def population(curve) -> dict[str, float]:
    """Population values of binary preds ``c`` with ``P(y = 1 | c) = f(c)``, by quadrature."""
    points = 2_000_000
    c = (np.arange(points) + 0.5) / points
    log_norm = math.lgamma(ALPHA + BETA) - math.lgamma(ALPHA) - math.lgamma(BETA)
    weight = np.exp((ALPHA - 1) * np.log(c) + (BETA - 1) * np.log1p(-c) + log_norm) / points
    f = curve(c)
    k = np.clip(np.ceil(c * BINS) - 1, 0, BINS - 1).astype(np.int64)
    share = np.bincount(k, weight, BINS)
    gap = np.bincount(k, (c - f) * weight, BINS)  # share_k * (conf_k - acc_k)
    return {
        "ece": float(np.abs(gap).sum()),
        "l2": float(np.sqrt((gap * gap / np.where(share > 0, share, 1)).sum())),
        "accuracy": float((np.where(c > 0.5, f, 1 - f) * weight).sum()),
        "brier": float(((c * c - 2 * c * f + f) * weight).sum()),
        "nll": float((-(f * np.log(c) + (1 - f) * np.log1p(-c)) * weight).sum()),
    }


def draw(n: int, curve, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    c = rng.beta(ALPHA, BETA, size=n)
    y = (rng.random(n) < curve(c)).astype(np.int64)
    return torch.from_numpy(c), torch.from_numpy(y)


@pytest.mark.parametrize("name", list(CURVES))
def test_interval_covers_the_population_ece_and_debiasing_halves_the_error(name):
    curve = CURVES[name]
    truth = population(curve)
    for n in (400, 10_000):
        covered, plain_error, debiased_error = 0, [], []
        for seed in range(200):
            preds, target = draw(n, curve, 1000 * n + seed)
            estimate, low, high = calibration_error_interval(preds, target, seed=seed)
            assert float(low) <= float(estimate) <= float(high)
            covered += float(low) <= truth["ece"] <= float(high)
            plain_error.append(
                abs(calibration_error(preds, target, norm="l2").item() - truth["l2"])
            )
            debiased_error.append(
                abs(debiased_calibration_error(preds, target).item() - truth["l2"])
            )
        assert 0.90 <= covered / 200 <= 0.99, (name, n, covered)
        if name == "calibrated":  # the bias dominates the error; with large gaps it does not
            assert np.mean(debiased_error) < 0.5 * np.mean(plain_error), (n, plain_error)


def test_intervals_of_accuracy_brier_and_nll_cover_their_population_values():
    curve = CURVES["over-confident"]
    truth = population(curve)
    covered = dict.fromkeys(("accuracy", "brier", "nll"), 0)
    for seed in range(200):
        preds, target = draw(400, curve, seed)
        summary = CalibrationSummary(intervals=True, seed=seed)
        summary.update(preds, target)
        values = summary.compute()
        for name in covered:
            assert float(values[f"{name}_low"]) <= float(values[name])
            assert float(values[name]) <= float(values[f"{name}_high"])
            covered[name] += (
                float(values[f"{name}_low"]) <= truth[name] <= float(values[f"{name}_high"])
            )
    for name, count in covered.items():
        assert 0.90 <= count / 200 <= 0.99, (name, count)


# --- an independent NumPy implementation of the documented algorithm -------------------------

MASK = np.uint64(0xFFFFFFFF)


def np_mix32(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x21F0AAAD)) & MASK
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x735A2D97)) & MASK
    return x ^ (x >> np.uint64(15))


def np_key(seed: int, domain: int) -> np.uint64:
    low = np_mix32(np.array([domain ^ (seed & 0xFFFFFFFF)], dtype=np.uint64))
    return np_mix32(low ^ np.uint64(seed >> 32))[0]


def np_groups(positions, offsets, seed, n_groups):
    h = np_mix32((positions.astype(np.uint64) & MASK) ^ np_key(seed, 0x9E3779B9))
    h = np_mix32(h ^ (positions.astype(np.uint64) >> np.uint64(32)))
    h = np_mix32(h ^ offsets.astype(np.uint64))
    return ((h * np.uint64(n_groups)) >> np.uint64(32)).astype(np.int64)


def np_weights(seed, n_bootstrap, n_groups):
    key = np_key(seed, 0x85EBCA77)
    r = np_mix32(np.arange(n_bootstrap, dtype=np.uint64) ^ key)
    h = np_mix32(r[:, None] ^ np.arange(n_groups, dtype=np.uint64)[None, :])
    thresholds = np.floor(stats.poisson.cdf(np.arange(16), 1.0) * 2.0**32)
    return (h[..., None].astype(np.float64) >= thresholds).sum(-1).astype(np.float64)


def np_intervals(conf, correct, scores, groups, weights, level):
    """ECE interval (zero-world low end, centred high end) and percentile intervals of means."""
    n_groups = weights.shape[1]
    k = np.clip(np.ceil(conf * BINS) - 1, 0, BINS - 1).astype(np.int64)
    sums = np.zeros((n_groups, BINS, 3))
    np.add.at(sums, (groups, k), np.stack([np.ones_like(conf), conf, correct], axis=1))
    rep = np.einsum("rm,mbj->rbj", weights, sums)
    data = sums.sum(0)
    ece = np.abs(data[:, 1] - data[:, 2]).sum() / data[:, 0].sum()
    gap = (data[:, 1] - data[:, 2]) / np.maximum(data[:, 0], 1)
    r_gap = (rep[..., 1] - rep[..., 2]) / np.maximum(rep[..., 0], 1)
    r_share = rep[..., 0] / rep[..., 0].sum(-1, keepdims=True)
    r_ece = (r_share * np.abs(r_gap)).sum(-1)
    zero = (r_share * np.abs(r_gap - gap)).sum(-1)
    a = (1 - level) / 2
    out = {
        "ece_low": max(ece - np.quantile(zero, 1 - a), 0.0),
        "ece_high": ece + r_ece.mean() - np.quantile(r_ece, a),
    }
    if scores is not None:
        score_sums = np.zeros((n_groups, 3))
        np.add.at(score_sums, groups, scores)
        means = (weights @ score_sums) / rep[..., 0].sum(-1, keepdims=True)
        for column, name in enumerate(("brier", "nll", "accuracy")):
            out[f"{name}_low"] = np.quantile(means[:, column], a)
            out[f"{name}_high"] = np.quantile(means[:, column], 1 - a)
    return out


def test_multiclass_intervals_equal_the_numpy_reference():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(3000, 7, generator=generator, dtype=torch.float64) * 2.5
    target = torch.randint(0, 7, (3000,), generator=generator)
    target[::9] = -100
    seed, n_groups, level = 12345678901, 512, 0.9
    options = {"seed": seed, "n_groups": n_groups, "level": level, "n_bootstrap": 300}
    summary = CalibrationSummary(
        input_format="logits", ignore_index=-100, intervals=True, **options
    )
    summary.update(logits, target)
    got = summary.compute()

    keep = (target != -100).numpy()
    log_probs = torch.log_softmax(logits, 1).numpy()[keep]
    labels = target.numpy()[keep]
    probs = np.exp(log_probs)
    conf, correct = probs.max(1), (probs.argmax(1) == labels).astype(np.float64)
    onehot = np.eye(7)[labels]
    scores = np.stack(
        [((probs - onehot) ** 2).sum(1), -log_probs[np.arange(len(labels)), labels], correct], 1
    )
    groups = np_groups(np.arange(3000)[keep], np.zeros(keep.sum()), seed, n_groups)
    want = np_intervals(conf, correct, scores, groups, np_weights(seed, 300, n_groups), level)
    for name, value in want.items():
        assert got[name].item() == pytest.approx(value, abs=1e-12), name
    _, low, high = calibration_error_interval(
        logits, target, input_format="logits", ignore_index=-100, **options
    )
    assert (low.item(), high.item()) == pytest.approx(
        (want["ece_low"], want["ece_high"]), abs=1e-12
    )


def test_multilabel_decisions_are_grouped_by_position_and_label():
    generator = torch.Generator().manual_seed(2)
    probs = torch.rand(800, 5, generator=generator, dtype=torch.float64)
    target = (torch.rand(800, 5, generator=generator, dtype=torch.float64) < probs**1.5).long()
    target[torch.rand(800, 5, generator=generator) < 0.1] = -1
    index = torch.randperm(5000, generator=generator)[:800]
    metric = CalibrationErrorInterval(ignore_index=-1, n_groups=256, n_bootstrap=100, seed=3)
    metric.update(probs, target, index=index)
    _, low, high = metric.compute()

    keep = (target != -1).numpy()
    positions = np.broadcast_to(index.numpy()[:, None], (800, 5))[keep]
    offsets = np.broadcast_to(np.arange(5), (800, 5))[keep]
    groups = np_groups(positions, offsets, 3, 256)
    labels = target.numpy()[keep].astype(np.float64)
    want = np_intervals(probs.numpy()[keep], labels, None, groups, np_weights(3, 100, 256), 0.95)
    assert (low.item(), high.item()) == pytest.approx(
        (want["ece_low"], want["ece_high"]), abs=1e-12
    )


def test_replicate_weights_are_poisson_one():
    weights = np_weights(0, 500, 2000).ravel()  # the reference draws what the package draws
    from lightning_losses.calibration.bootstrap import replicate_weights

    ours = replicate_weights(seed=0, n_bootstrap=500, n_groups=2000).numpy().ravel()
    assert np.array_equal(ours, weights)
    assert ours.mean() == pytest.approx(1.0, abs=0.01)
    assert ours.var() == pytest.approx(1.0, abs=0.01)
    for k in range(5):
        assert np.mean(ours == k) == pytest.approx(stats.poisson.pmf(k, 1.0), abs=0.003)


# --- invariance ------------------------------------------------------------------------------


def _data(n: int = 1518, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 6, generator=generator, dtype=torch.float64) * 2.5
    target = torch.multinomial((logits / 2.5).softmax(1), 1, generator=generator)[:, 0]
    target[::13] = -100
    return logits, target


OPTIONS = {"input_format": "logits", "ignore_index": -100, "n_bootstrap": 120}


def test_same_interval_over_any_batching_and_shuffled_rows_with_their_index():
    logits, target = _data()
    want = torch.stack(calibration_error_interval(logits, target, **OPTIONS))
    summary_want = None
    for size in (1518, 500, 97, 1):
        metric = CalibrationErrorInterval(**OPTIONS)
        for rows in torch.arange(1518).split(size):
            metric.update(logits[rows], target[rows])
        assert torch.allclose(torch.stack(metric.compute()), want, rtol=0, atol=1e-12)
        if size == 1:
            continue
        summary = CalibrationSummary(intervals=True, smooth=True, debiased=True, **OPTIONS)
        for rows in torch.arange(1518).split(size):
            if size == 500:
                summary(logits[rows], target[rows])  # forward: the positions run on
            else:
                summary.update(logits[rows], target[rows])
        values = summary.compute()
        assert values["ece_low"].item() == pytest.approx(want[1].item(), abs=1e-12)
        assert values["ece_high"].item() == pytest.approx(want[2].item(), abs=1e-12)
        if summary_want is None:
            summary_want = values
        for name, value in values.items():
            assert value.item() == pytest.approx(summary_want[name].item(), abs=1e-12), name
    order = torch.randperm(1518, generator=torch.Generator().manual_seed(0))
    shuffled = CalibrationErrorInterval(**OPTIONS)
    for rows in order.split(200):
        shuffled.update(logits[rows], target[rows], index=rows)
    assert torch.allclose(torch.stack(shuffled.compute()), want, rtol=0, atol=1e-12)
    other_seed = calibration_error_interval(logits, target, seed=1, **OPTIONS)
    assert other_seed[1].item() != want[1].item()  # the seed changes the replicates


def test_state_does_not_grow_with_n():
    def size(metric) -> int:
        return sum(getattr(metric, name).numel() for name in metric._defaults)

    for build in (
        lambda: CalibrationErrorInterval(),
        lambda: CalibrationSummary(intervals=True, debiased=True, smooth=True),
    ):
        sizes = []
        for n in (100, 50_000):
            metric = build()
            generator = torch.Generator().manual_seed(n)
            metric.update(
                torch.randn(n, 10, generator=generator).softmax(1),
                torch.randint(0, 10, (n,), generator=generator),
            )
            sizes.append(size(metric))
        assert sizes[0] == sizes[1]


def test_level_outside_the_unit_interval_is_an_error_naming_level():
    preds, target = torch.tensor([0.8, 0.3]), torch.tensor([1, 0])
    for level in (0, 1, 1.5, -0.2, 0.0, 1.0):
        with pytest.raises(ValueError, match="level"):
            calibration_error_interval(preds, target, level=level)
        with pytest.raises(ValueError, match="level"):
            CalibrationErrorInterval(level=level)
        with pytest.raises(ValueError, match="level"):
            CalibrationSummary(intervals=True, level=level)
        with pytest.raises(ValueError, match="level"):
            CalibrationMonitor(intervals=True, level=level)
        with pytest.raises(ValueError, match="level"):
            reliability_diagram([2, 2], [1.0, 1.8], [1, 2], level=level)
    with pytest.raises(TypeError, match="level"):
        calibration_error_interval(preds, target, level="0.95")
    with pytest.raises(ValueError, match="n_bootstrap"):
        calibration_error_interval(preds, target, n_bootstrap=1)
    with pytest.raises(ValueError, match="index"):
        calibration_error_interval(preds, target, index=torch.tensor([0, 1, 2]))


# --- two gloo processes ----------------------------------------------------------------------

SHARES = (1001, 517)


def _worker(rank: int, out: str) -> None:
    logits, target = _data()
    start = sum(SHARES[:rank])
    mine = torch.arange(start, start + SHARES[rank])  # contiguous, uneven: with index
    interval = CalibrationErrorInterval(**OPTIONS)
    debiased = DebiasedCalibrationError(input_format="logits", ignore_index=-100)
    for rows in mine.split((300, 128)[rank]):
        interval.update(logits[rows], target[rows], index=rows)
        debiased.update(logits[rows], target[rows])
    strided = torch.arange(rank, 1518, 2)  # UnpaddedDistributedSampler's share: default
    summary = CalibrationSummary(intervals=True, debiased=True, smooth=True, **OPTIONS)
    for rows in strided.split((97, 250)[rank]):
        summary.update(logits[rows], target[rows])
    results = {
        "interval": interval.compute(),
        "debiased": debiased.compute(),
        "summary": summary.compute(),
    }
    torch.save(results, Path(out) / f"rank{rank}.pt")


@pytest.mark.slow
def test_two_gloo_processes_with_uneven_shares_equal_one_process(tmp_path):
    spawn_gloo(_worker, str(tmp_path))
    logits, target = _data()
    want = torch.stack(calibration_error_interval(logits, target, **OPTIONS))
    single = CalibrationSummary(intervals=True, debiased=True, smooth=True, **OPTIONS)
    single.update(logits, target)
    summary_want = single.compute()
    debiased_want = debiased_calibration_error(
        logits, target, input_format="logits", ignore_index=-100
    )
    for rank in range(2):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.allclose(torch.stack(results["interval"]), want, rtol=0, atol=1e-12)
        assert results["debiased"].item() == pytest.approx(debiased_want.item(), abs=1e-12)
        for name, value in summary_want.items():
            assert results["summary"][name].item() == pytest.approx(value.item(), abs=1e-12), name


# --- the monitor and its diagram -------------------------------------------------------------


class Plain(pl.LightningModule):
    """Nothing of lightning_losses: a linear classifier returning logits and targets."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 4)

    def forward(self, x):
        return 3 * self.layer(x)

    def training_step(self, batch, batch_idx):
        x, target = batch
        return nn.functional.cross_entropy(self(x), target)

    def validation_step(self, batch, batch_idx):
        x, target = batch
        return {"logits": self(x), "target": target}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.3)


def test_monitor_logs_intervals_and_debiased_values_in_a_plain_module(tmp_path):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(330, 8, generator=generator)
    target = (x[:, :4] + torch.randn(330, 4, generator=generator)).argmax(1)
    torch.manual_seed(0)
    module = Plain()
    monitor = CalibrationMonitor(
        intervals=True, debiased=True, diagram_every_n_epochs=1, n_bootstrap=150, seed=4
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        default_root_dir=tmp_path,
        logger=pl.loggers.CSVLogger(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=[monitor],
    )
    val = DataLoader(TensorDataset(x, target), batch_size=64)
    trainer.fit(module, DataLoader(TensorDataset(x, target), batch_size=64), val)
    with torch.no_grad():
        logits = module(x)
    logged = {key: float(value) for key, value in trainer.callback_metrics.items()}
    estimate, low, high = calibration_error_interval(
        logits, target, input_format="logits", n_bootstrap=150, seed=4
    )
    assert logged["val/ece"] == pytest.approx(estimate.item(), abs=1e-6)
    assert logged["val/ece_low"] == pytest.approx(low.item(), abs=1e-6)
    assert logged["val/ece_high"] == pytest.approx(high.item(), abs=1e-6)
    for norm, key in (("l1", "val/ece_debiased"), ("l2", "val/rmsce_debiased")):
        want = debiased_calibration_error(logits, target, norm=norm, input_format="logits")
        assert logged[key] == pytest.approx(want.item(), abs=1e-6)
    for name in ("nll", "brier", "accuracy"):
        assert logged[f"val/{name}_low"] <= logged[f"val/{name}"] <= logged[f"val/{name}_high"]
    assert monitor.last_diagram.stat().st_size > 10_000


def test_diagram_draws_wilson_intervals_of_each_bins_accuracy():
    count, conf_sum, correct_sum = [0, 12, 1, 40], [0.0, 5.5, 0.6, 35.0], [0, 4, 1, 31]
    figure = reliability_diagram(count, conf_sum, correct_sum, level=0.9)
    bars = [c for c in figure.axes[0].containers if c.get_label() == "90% Wilson interval"]
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()
    assert len(segments) == 3  # one per non-empty bin
    for segment, n, k in zip(segments, (12, 1, 40), (4, 1, 31), strict=True):
        want = stats.binomtest(k, n).proportion_ci(confidence_level=0.9, method="wilson")
        assert segment[:, 1] == pytest.approx([want.low, want.high], abs=1e-12)
    plain = reliability_diagram(count, conf_sum, correct_sum)
    assert not [c for c in plain.axes[0].containers if "Wilson" in str(c.get_label())]


def test_dense_inputs_keep_their_interval_over_batchings_of_samples():
    generator = torch.Generator().manual_seed(8)
    logits = torch.randn(10, 5, 6, 7, generator=generator, dtype=torch.float64) * 2
    target = torch.randint(0, 5, (10, 6, 7), generator=generator)
    target[:, 0] = -100
    options = {"input_format": "logits", "ignore_index": -100, "n_bootstrap": 100}
    estimate, low, high = calibration_error_interval(logits, target, **options)
    flat = logits.movedim(1, -1).reshape(-1, 5)[target.reshape(-1) != -100]
    want = calibration_error(flat, target[target != -100], input_format="logits")
    assert estimate.item() == pytest.approx(want.item(), abs=1e-12)
    for size in (1, 3, 10):
        metric = CalibrationErrorInterval(**options)
        for rows in torch.arange(10).split(size):
            metric.update(logits[rows], target[rows])
        got = torch.stack(metric.compute())
        assert torch.allclose(got, torch.stack([estimate, low, high]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [400, 100_000])
@pytest.mark.parametrize("attempts", [0, 4])
def test_smooth_replicates_equal_the_one_grid_smooth_ece(n, attempts):
    """Every replicate's smECE equals the single-grid path, row by row.

    The replicates use the secant search, or bisection with ``attempts=0``; the single-grid path
    is ``smooth_calibration_error_from_grid``.
    """
    from lightning_losses.calibration.bootstrap import REPLICATE_GRID_SIZE, _smooth_values
    from lightning_losses.calibration.smooth import smooth_calibration_error_from_grid

    rng = np.random.default_rng(n + attempts)
    confidence = rng.beta(4.0, 1.5, n)
    correct = rng.uniform(size=n) < confidence**1.4
    node = np.rint(confidence * REPLICATE_GRID_SIZE).astype(np.int64)
    weights = np.vstack([np.ones(n), rng.poisson(1.0, (40, n))])
    size = REPLICATE_GRID_SIZE + 1
    mass = np.stack([np.bincount(node, weights=w, minlength=size) for w in weights])
    residual = np.stack(
        [np.bincount(node, weights=w * (confidence - correct), minlength=size) for w in weights]
    )
    fast = _smooth_values(mass, residual, attempts=attempts)
    for row in range(len(weights)):
        expected = float(smooth_calibration_error_from_grid(mass[row], residual[row]))
        assert fast[row] == pytest.approx(expected, abs=1e-12), row
