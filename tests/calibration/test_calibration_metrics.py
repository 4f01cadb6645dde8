"""Calibration metrics against plain float64 numpy references, netcal, torchmetrics and DDP.

References here are written from the definitions, one bin (or one class) at a time. netcal's
conventions (read from ``netcal/metrics/Miscalibration.py``): bins ``[k/B, (k+1)/B)`` from
``np.histogramdd`` on ``linspace(0, 1, B+1)`` after clipping to ``[eps, 1 - eps]``; ``ECE`` is the
count-weighted mean gap, ``MCE`` the largest gap (empty bins count 0), ``ACE`` the unweighted mean
gap over non-empty bins; ``equal_intervals=False`` uses ``np.quantile`` edges (equal mass). A
label vector with at most two distinct values is treated as binary (``X[:, 1]`` against ``y``).
Ours: bins ``(k/B, (k+1)/B]``, so the two agree except for confidences exactly on an inner edge.
"""

from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers.ddp import spawn_gloo
from netcal.metrics import ACE, ECE, MCE
from torchmetrics.functional.classification import (
    binary_calibration_error,
    multiclass_calibration_error,
)

from lightning_losses import calibration as cal
from lightning_losses.calibration import functional as CF

B = 15
NORMS = ("l1", "max", "l2", "mean")
NETCAL = {"l1": ECE, "max": MCE, "mean": ACE}


# --- float64 references, from the definitions --------------------------------------------------


def ref_edges(n_bins: int, dtype: torch.dtype = torch.float64) -> list[float]:
    """Edges ``k/B`` rounded to the confidences' dtype (as the metric compares them)."""
    return [
        float(torch.tensor(k / n_bins, dtype=torch.float64).to(dtype)) for k in range(n_bins + 1)
    ]


def ref_bins(conf, correct, n_bins, dtype=torch.float64):
    """Bins ``(e_k, e_{k+1}]``, with 0 (and anything at or below ``e_1``) in the first."""
    conf, correct = np.asarray(conf, np.float64), np.asarray(correct, np.float64)
    edges = ref_edges(n_bins, dtype)
    count, conf_sum, correct_sum = (np.zeros(n_bins) for _ in range(3))
    for b in range(n_bins):
        upper = conf <= edges[b + 1] if b < n_bins - 1 else np.ones(conf.shape, bool)
        inside = upper if b == 0 else upper & (conf > edges[b])
        count[b] = inside.sum()
        conf_sum[b] = conf[inside].sum()
        correct_sum[b] = correct[inside].sum()
    return count, conf_sum, correct_sum


def ref_error(count, conf_sum, correct_sum, norm):
    total = count.sum()
    gaps, weights = [], []
    for n, s, a in zip(count, conf_sum, correct_sum, strict=True):
        if n > 0:
            gaps.append(abs(s / n - a / n))
            weights.append(n / total)
    gaps, weights = np.array(gaps), np.array(weights)
    if norm == "l1":
        return float((weights * gaps).sum())
    if norm == "l2":
        return float(np.sqrt((weights * gaps**2).sum()))
    if norm == "max":
        return float(gaps.max())
    return float(gaps.mean())


def ref_top_label(p, y, task):
    """Per-decision (confidence, correct) in float64."""
    p, y = np.asarray(p, np.float64), np.asarray(y)
    if task == "multiclass":
        return p.max(axis=1), (p.argmax(axis=1) == y).astype(np.float64)
    return p.reshape(-1), y.reshape(-1).astype(np.float64)


def ref_adaptive(conf, correct, n_bins, norm="l1"):
    order = np.lexsort((correct, conf))  # by confidence, ties by correctness
    conf, correct = conf[order], correct[order]
    n = len(conf)
    count, conf_sum, correct_sum = (np.zeros(n_bins) for _ in range(3))
    for b in range(n_bins):
        lo, hi = (b * n) // n_bins, ((b + 1) * n) // n_bins
        count[b], conf_sum[b], correct_sum[b] = hi - lo, conf[lo:hi].sum(), correct[lo:hi].sum()
    return ref_error(count, conf_sum, correct_sum, norm)


def ref_classwise(p, y, task, n_bins, norm="l1"):
    p = np.asarray(p, np.float64)
    if task == "multiclass":
        labels = np.eye(p.shape[1])[np.asarray(y)]
    elif task == "binary":
        p, labels = np.stack([1 - p, p], 1), np.stack([1 - y, y], 1).astype(np.float64)
    else:
        labels = np.asarray(y, np.float64)
    errors = [ref_error(*ref_bins(p[:, c], labels[:, c], n_bins), norm) for c in range(p.shape[1])]
    return float(np.mean(errors))


def ref_brier(p, y, task):
    p = np.asarray(p, np.float64)
    if task == "multiclass":
        onehot = np.eye(p.shape[1])[np.asarray(y)]
        return float(np.mean([np.sum((p[i] - onehot[i]) ** 2) for i in range(len(p))]))
    return float(np.mean((p - np.asarray(y, np.float64)) ** 2))


def ref_nll(p, y, task):
    p = np.asarray(p, np.float64)
    if task == "multiclass":
        return float(np.mean([-np.log(p[i, y[i]]) for i in range(len(p))]))
    p, y = p.reshape(-1), np.asarray(y, np.float64).reshape(-1)
    terms = [-np.log(pi) if yi == 1 else -np.log(1 - pi) for pi, yi in zip(p, y, strict=True)]
    return float(np.mean(terms))


def ref_accuracy_confidence(p, y, task):
    p = np.asarray(p, np.float64)
    if task == "multiclass":
        return float(np.mean(p.argmax(1) == y)), float(np.mean(p.max(1)))
    p, y = p.reshape(-1), np.asarray(y).reshape(-1)
    return float(np.mean((p > 0.5) == (y == 1))), float(np.mean(np.maximum(p, 1 - p)))


# --- data --------------------------------------------------------------------------------------


def make_data(task: str, n: int = 600, classes: int = 4, seed: int = 0):
    """float64 probabilities and logits (softmax/sigmoid of the same logits) and targets.

    Confidences of exactly 0 and 1 (saturated rows) are mixed in where the task allows them.
    """
    gen = torch.Generator().manual_seed(seed)
    if task == "multiclass":
        logits = 2.5 * torch.randn(n, classes, generator=gen, dtype=torch.float64)
        target = torch.randint(0, classes, (n,), generator=gen)
        probs = torch.softmax(logits, dim=1)
        return probs, logits, target
    shape = (n,) if task == "binary" else (n, classes)
    logits = 2.5 * torch.randn(*shape, generator=gen, dtype=torch.float64)
    target = torch.randint(0, 2, shape, generator=gen)
    return torch.sigmoid(logits), logits, target


def with_saturated(probs: torch.Tensor, target: torch.Tensor, task: str):
    """Add rows whose confidence is exactly 1 (and, for binary labels, exactly 0)."""
    probs, target = probs.clone(), target.clone()
    if task == "multiclass":
        probs[:5] = torch.eye(probs.shape[1], dtype=probs.dtype)[torch.arange(5) % probs.shape[1]]
    else:
        probs.view(-1)[:6] = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0], dtype=probs.dtype)
    return probs, target


def netcal_inputs(probs: torch.Tensor, target: torch.Tensor, task: str):
    if task == "multilabel":
        return probs.reshape(-1).numpy(), target.reshape(-1).numpy()
    return probs.numpy(), target.numpy()


TASKS = ("multiclass", "binary", "multilabel")


# --- equal-width errors -----------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("norm", NORMS)
def test_calibration_error_matches_reference_and_netcal(task, norm):
    probs, _, target = make_data(task)
    probs, target = with_saturated(probs, target, task)
    conf, correct = ref_top_label(probs.numpy(), target.numpy(), task)
    if task == "binary":
        assert (conf == 0).any()
        assert (conf == 1).any()
    assert (conf == 1).any()
    count, conf_sum, correct_sum = ref_bins(conf, correct, B)
    assert (count == 0).any() or task != "multiclass"  # top label >= 1/4: low bins are empty
    expected = ref_error(count, conf_sum, correct_sum, norm)

    ours = cal.calibration_error(probs, target, norm=norm)
    assert ours.dtype == torch.float64
    assert ours.item() == pytest.approx(expected, abs=1e-12)
    metric = cal.CalibrationError(norm=norm)
    metric.update(probs, target)
    assert metric.compute().item() == pytest.approx(expected, abs=1e-12)
    for state, ref in zip(metric.bins(), (count, conf_sum, correct_sum), strict=True):
        np.testing.assert_allclose(state.numpy(), ref, atol=1e-9)
    if norm in NETCAL:
        x, y = netcal_inputs(probs, target, task)
        assert NETCAL[norm](bins=B).measure(x, y) == pytest.approx(ours.item(), abs=1e-6)


@pytest.mark.parametrize("task", TASKS)
def test_float32_inputs_match_netcal_and_torchmetrics(task):
    probs, _, target = make_data(task, n=2000, seed=1)
    probs32 = probs.float()
    x, y = netcal_inputs(probs32.double(), target, task)
    for norm in ("l1", "max", "l2"):
        ours = cal.calibration_error(probs32, target, norm=norm).item()
        if norm in NETCAL:
            assert NETCAL[norm](bins=B).measure(x, y) == pytest.approx(ours, abs=1e-6)
        if task == "multiclass":
            peer = multiclass_calibration_error(probs32, target, num_classes=4, norm=norm)
        else:
            peer = binary_calibration_error(probs32, target, norm=norm)
        assert peer.item() == pytest.approx(ours, abs=1e-6)


def test_bin_edges_belong_to_the_lower_bin():
    n_bins = 10
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        edges = torch.arange(n_bins + 1, dtype=torch.float64).div(n_bins).to(dtype)
        count, _, _ = cal.binned_statistics(edges, torch.ones(n_bins + 1), n_bins)
        # 0 and 1/B in bin 0, k/B in bin k-1, 1 in the last bin
        expected = torch.ones(n_bins, dtype=torch.float64)
        expected[0] = 2
        assert torch.equal(count, expected), dtype
        if dtype in (torch.float32, torch.float64):  # one ulp above k/B: bin k
            above = torch.nextafter(edges[1:-1], torch.tensor(2.0, dtype=dtype))
            count, _, _ = cal.binned_statistics(above, torch.ones(n_bins - 1), n_bins)
            assert torch.equal(count[1:], torch.ones(n_bins - 1, dtype=torch.float64)), dtype
    # netcal's bins are [k/B, (k+1)/B): an inner edge goes up, the only place the two differ
    conf, y = np.array([0.5, 0.9, 0.1]), np.array([1, 1, 0])
    ours = cal.calibration_error(torch.tensor(conf), torch.tensor(y), n_bins=2).item()
    assert ours == pytest.approx((0.4 + 0.1) / 3)  # bins {0.1, 0.5}, {0.9}
    assert ECE(bins=2).measure(conf, y) == pytest.approx((0.1 + 0.6) / 3)  # {0.1}, {0.5, 0.9}


def _all_values_in_unit_interval(dtype: torch.dtype) -> torch.Tensor:
    """Every float16 / bfloat16 value in [0, 1], from their bit patterns."""
    bits = torch.arange(0, 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(dtype)
    return values[(values >= 0) & (values <= 1)]


@pytest.mark.parametrize("n_bins", [1, 2, 3, 7, 10, 15, 100, 1000])
def test_bin_index_is_exact_for_every_half_value_and_near_float32_edges(n_bins):
    """The fast float32/half binning equals counting the dtype-rounded edges below each value."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        if dtype == torch.float32:
            edges = torch.arange(n_bins + 1, dtype=torch.float64).div(n_bins).float()
            steps = [edges]
            for _ in range(3):  # up to three ulps either side of every edge
                steps.append(torch.nextafter(steps[-1], torch.tensor(2.0)))
                steps.insert(0, torch.nextafter(steps[0], torch.tensor(-1.0)))
            values = torch.cat(steps).clamp(0, 1)
        else:
            values = _all_values_in_unit_interval(dtype)
        edges = np.array(ref_edges(n_bins, dtype)[1:-1])
        expected = torch.from_numpy((values.double().numpy()[:, None] > edges[None, :]).sum(1))
        count, _, _ = cal.binned_statistics(values, torch.zeros_like(values), n_bins)
        assert torch.equal(count, torch.bincount(expected, minlength=n_bins).double())
        assert torch.equal(CF._bin_index(values, n_bins).long(), expected), dtype


def test_single_sample_and_empty_input():
    probs = torch.tensor([[0.2, 0.7, 0.1]], dtype=torch.float64)
    for target, gap in ((1, 0.3), (0, 0.7)):
        for norm in NORMS:
            value = cal.calibration_error(probs, torch.tensor([target]), norm=norm)
            assert value.item() == pytest.approx(gap)
    binary = cal.calibration_error(torch.tensor([0.8], dtype=torch.float64), torch.tensor([1]))
    assert binary.item() == pytest.approx(0.2)
    assert ECE(bins=B).measure(np.array([0.8]), np.array([1])) == pytest.approx(0.2)
    adaptive = cal.adaptive_calibration_error(probs, torch.tensor([1]))
    assert adaptive.item() == pytest.approx(0.3)
    empty = cal.calibration_error(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    assert torch.isnan(empty)
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert torch.isnan(cal.CalibrationError(norm="max").compute())


# --- adaptive and classwise -----------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("n", [B * 40, B * 40 + 1, 613])
def test_adaptive_matches_reference_and_netcal(task, n):
    probs, _, target = make_data(task, n=n, seed=2)
    conf, correct = ref_top_label(probs.numpy(), target.numpy(), task)
    x, y = netcal_inputs(probs, target, task)
    for norm in ("l1", "mean"):
        ours = cal.adaptive_calibration_error(probs, target, norm=norm).item()
        assert ours == pytest.approx(ref_adaptive(conf, correct, B, norm), abs=1e-12)
        if len(conf) % B in (0, 1):
            # netcal's quantile edges split the sorted confidences where we do only when
            # N = 0 or 1 (mod B) (distinct confidences); otherwise some bins differ by a sample
            peer = (ECE if norm == "l1" else ACE)(bins=B, equal_intervals=False).measure(x, y)
            assert peer == pytest.approx(ours, abs=1e-6)


def test_adaptive_is_order_independent_with_ties():
    conf = torch.tensor([0.7] * 6 + [0.9] * 4, dtype=torch.float64)
    correct = torch.tensor([1, 0, 1, 0, 1, 0, 1, 1, 0, 1])
    base = cal.adaptive_calibration_error(conf, correct, n_bins=3)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    assert cal.adaptive_calibration_error(conf[perm], correct[perm], n_bins=3) == base
    assert base.item() == pytest.approx(ref_adaptive(conf.numpy(), correct.numpy(), 3))


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("norm", ["l1", "max"])
def test_classwise_matches_reference(task, norm):
    probs, _, target = make_data(task, seed=3)
    probs, target = with_saturated(probs, target, task)
    expected = ref_classwise(probs.numpy(), target.numpy(), task, B, norm)
    assert cal.classwise_calibration_error(probs, target, norm=norm).item() == pytest.approx(
        expected, abs=1e-12
    )
    metric = cal.ClasswiseCalibrationError(2 if task == "binary" else 4, norm=norm)
    metric.update(probs, target)
    assert metric.compute().item() == pytest.approx(expected, abs=1e-12)
    assert metric.bins()[0].shape == (metric.num_classes, B)


# --- proper scores and summaries ------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_brier_nll_accuracy_confidence_match_reference(task):
    probs, logits, target = make_data(task, seed=4)
    p, y = probs.numpy(), target.numpy()
    acc, conf = ref_accuracy_confidence(p, y, task)
    expected = {
        cal.brier_score: ref_brier(p, y, task),
        cal.negative_log_likelihood: ref_nll(p, y, task),
        cal.accuracy: acc,
        cal.mean_confidence: conf,
    }
    for fn, value in expected.items():
        assert fn(probs, target).item() == pytest.approx(value, abs=1e-12), fn.__name__
        from_logits = fn(logits, target, input_format="logits").item()
        assert from_logits == pytest.approx(value, abs=1e-12), fn.__name__
    if task == "multiclass":
        ce = torch.nn.functional.cross_entropy(logits, target).item()
        assert cal.negative_log_likelihood(logits, target, input_format="logits").item() == (
            pytest.approx(ce, abs=1e-12)
        )


def test_nll_of_probabilities_at_zero_and_one():
    p = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    assert cal.negative_log_likelihood(p, torch.tensor([0, 1, 0, 1])).item() == 0.0
    assert torch.isinf(cal.negative_log_likelihood(p, torch.tensor([1, 1, 0, 1])))


@pytest.mark.parametrize("task", TASKS)
def test_logits_and_probs_give_the_same_value(task):
    probs, logits, target = make_data(task, seed=5)
    for fn in (
        cal.calibration_error,
        cal.adaptive_calibration_error,
        cal.classwise_calibration_error,
    ):
        for norm in NORMS:
            a = fn(probs, target, norm=norm)
            b = fn(logits, target, norm=norm, input_format="logits")
            assert a.item() == pytest.approx(b.item(), abs=1e-12), (fn.__name__, norm)


# --- half precision and large bins ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_with_more_than_65504_samples_in_a_bin(dtype):
    n = 70_000
    gen = torch.Generator().manual_seed(6)
    top = torch.tensor([0.75, 0.78, 0.8])[torch.randint(0, 3, (n,), generator=gen)]
    probs = torch.stack([top, (1 - top) / 2, (1 - top) / 2], dim=1).to(dtype)
    u = torch.rand(n, generator=gen)
    target = (u > 0.8).long() + (u > 0.9).long()  # 80% class 0, the top label
    conf, correct = ref_top_label(probs.double().numpy(), target.numpy(), "multiclass")
    count, conf_sum, correct_sum = ref_bins(conf, correct, B, dtype)
    assert count.max() == n  # 0.8 = 12/15 is an edge: it stays in the bin of 0.75 and 0.78

    metric = cal.CalibrationError(num_classes=3)
    for chunk in range(0, n, 30_000):
        metric.update(probs[chunk : chunk + 30_000], target[chunk : chunk + 30_000])
    bins = metric.bins()
    assert bins[0].max().item() == n
    for state, ref in zip(bins, (count, conf_sum, correct_sum), strict=True):
        np.testing.assert_allclose(state.numpy(), ref, rtol=1e-12)
    for norm in NORMS:
        expected = ref_error(count, conf_sum, correct_sum, norm)
        assert cal.calibration_error(probs, target, norm=norm).item() == pytest.approx(
            expected, abs=1e-9
        )
    assert metric.compute().item() == pytest.approx(ref_error(*bins, "l1"), abs=1e-12)
    if dtype == torch.float16:  # netcal on the same (float16-exact) values, in float64
        peer = ECE(bins=B).measure(probs.double().numpy(), target.numpy())
        assert peer == pytest.approx(metric.compute().item(), abs=1e-6)
    logits = probs.float().log().to(dtype)  # half logits: computed in float64 from here on
    expected = ref_brier(torch.softmax(logits.double(), 1).numpy(), target.numpy(), "multiclass")
    assert cal.brier_score(logits, target, input_format="logits").item() == pytest.approx(
        expected, abs=1e-12
    )


# --- batches and metric classes -------------------------------------------------------------


def all_metrics(task: str, num_classes: int = 4, input_format: str = "probs"):
    opts = {"input_format": input_format}
    metrics = {f"ce_{norm}": cal.CalibrationError(norm=norm, **opts) for norm in NORMS}
    metrics["adaptive"] = cal.AdaptiveCalibrationError(**opts)
    metrics["classwise"] = cal.ClasswiseCalibrationError(
        2 if task == "binary" else num_classes, **opts
    )
    metrics["brier"] = cal.BrierScore(**opts)
    metrics["nll"] = cal.NegativeLogLikelihood(**opts)
    metrics["accuracy"] = cal.Accuracy(**opts)
    metrics["confidence"] = cal.MeanConfidence(**opts)
    return metrics


def functional_values(preds, target, input_format="probs"):
    opts = {"input_format": input_format}
    values = {f"ce_{n}": cal.calibration_error(preds, target, norm=n, **opts) for n in NORMS}
    values["adaptive"] = cal.adaptive_calibration_error(preds, target, **opts)
    values["classwise"] = cal.classwise_calibration_error(preds, target, **opts)
    values["brier"] = cal.brier_score(preds, target, **opts)
    values["nll"] = cal.negative_log_likelihood(preds, target, **opts)
    values["accuracy"] = cal.accuracy(preds, target, **opts)
    values["confidence"] = cal.mean_confidence(preds, target, **opts)
    return {k: v.item() for k, v in values.items()}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("input_format", ["probs", "logits"])
def test_batches_of_any_size_give_the_one_call_value(task, input_format):
    probs, logits, target = make_data(task, n=700, seed=7)
    preds = probs if input_format == "probs" else logits.float()
    expected = functional_values(preds, target, input_format)
    one_call, batched = (
        all_metrics(task, input_format=input_format),
        all_metrics(task, input_format=input_format),
    )
    sizes = [1, 0, 17, 300, 2, 380]
    assert sum(sizes) == len(target)
    for name in one_call:
        one_call[name].update(preds, target)
        start = 0
        for size in sizes:
            batched[name].update(preds[start : start + size], target[start : start + size])
            start += size
        for metric in (one_call[name], batched[name]):
            assert metric.compute().item() == pytest.approx(expected[name], abs=1e-12), name


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("input_format", ["probs", "logits"])
def test_summary_gives_every_number_of_the_references_in_one_metric(task, input_format):
    probs, logits, target = make_data(task, n=700, seed=11)
    if input_format == "probs":
        probs, target = with_saturated(probs, target, task)
    preds = probs if input_format == "probs" else logits
    p, y = probs.numpy(), target.numpy()
    bins = ref_bins(*ref_top_label(p, y, task), B)
    acc, conf = ref_accuracy_confidence(p, y, task)
    expected = {
        "ece": ref_error(*bins, "l1"),
        "mce": ref_error(*bins, "max"),
        "rmsce": ref_error(*bins, "l2"),
        "brier": ref_brier(p, y, task),
        "accuracy": acc,
        "confidence": conf,
    }
    with np.errstate(divide="ignore"):  # saturated probabilities: an infinite NLL, both sides
        expected["nll"] = ref_nll(p, y, task)
    summary = cal.CalibrationSummary(n_bins=B, input_format=input_format)
    start = 0
    for size in (1, 0, 17, 300, 2, 380):  # batches of any size
        summary.update(preds[start : start + size], target[start : start + size])
        start += size
    values = summary.compute()
    assert sorted(values) == sorted(expected)
    for name, value in expected.items():
        assert values[name].item() == pytest.approx(value, abs=1e-9), name
    for got, want in zip(summary.bins(), bins, strict=True):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-9)
    # the same numbers as the single-purpose metrics on the same stream
    ece = cal.CalibrationError(n_bins=B, input_format=input_format)
    ece.update(preds, target)
    assert values["ece"].item() == pytest.approx(ece.compute().item(), abs=1e-12)


def test_states_are_float64_sums_of_fixed_size():
    metric = cal.CalibrationError(n_bins=7)
    metric.update(torch.rand(50, 3).softmax(1), torch.randint(0, 3, (50,)))
    for name in ("count", "conf_sum", "correct_sum"):
        state = getattr(metric, name)
        assert state.dtype == torch.float64
        assert state.shape == (7,)
        assert metric._reductions[name].__name__ == "dim_zero_sum"
    adaptive = cal.AdaptiveCalibrationError()
    assert adaptive._reductions["confidence"].__name__ == "dim_zero_cat"
    classwise = cal.ClasswiseCalibrationError(3, n_bins=7)
    assert classwise.count.shape == (3, 7)
    metric.reset()
    assert metric.count.sum() == 0


# --- DDP: two CPU processes, gloo -----------------------------------------------------------


DDP_ROWS, DDP_SPLIT = 1001, 600


def _ddp_data():
    return make_data("multiclass", n=DDP_ROWS, classes=5, seed=8)


def _ddp_worker(rank: int, out_dir: str) -> None:
    probs, _, target = _ddp_data()
    part = slice(0, DDP_SPLIT) if rank == 0 else slice(DDP_SPLIT, DDP_ROWS)
    metrics = all_metrics("multiclass", num_classes=5)
    for metric in metrics.values():
        preds, labels = probs[part], target[part]
        half = len(labels) // 3  # two updates of different sizes per rank
        metric.update(preds[:half], labels[:half])
        metric.update(preds[half:], labels[half:])
    values = {name: metric.compute().item() for name, metric in metrics.items()}
    summary = cal.CalibrationSummary(num_classes=5, n_bins=B)
    summary.update(probs[part][:7], target[part][:7])
    summary.update(probs[part][7:], target[part][7:])
    summary_values = {name: value.item() for name, value in summary.compute().items()}
    bins = [b.tolist() for b in metrics["ce_l1"].bins()]
    local = metrics["ce_l1"].count.sum().item()  # state restored after the sync
    result = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "values": values,
        "summary": summary_values,
        "bins": bins,
        "local_count": local,
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.slow
def test_ddp_two_processes_match_single_process(tmp_path):
    spawn_gloo(_ddp_worker, str(tmp_path))
    probs, _, target = _ddp_data()
    expected = functional_values(probs, target)
    count, conf_sum, correct_sum = cal.binned_statistics(
        *cal.confidence_and_correct(probs, target), B
    )
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 for r in results)
    assert [r["local_count"] for r in results] == [DDP_SPLIT, DDP_ROWS - DDP_SPLIT]
    p, y = probs.numpy(), target.numpy()
    acc, conf = ref_accuracy_confidence(p, y, "multiclass")
    summary_expected = {
        "ece": expected["ce_l1"],
        "mce": expected["ce_max"],
        "brier": ref_brier(p, y, "multiclass"),
        "nll": ref_nll(p, y, "multiclass"),
        "accuracy": acc,
        "confidence": conf,
    }
    for result in results:
        for name, value in expected.items():
            assert result["values"][name] == pytest.approx(value, abs=1e-6), name
        for name, value in summary_expected.items():
            assert result["summary"][name] == pytest.approx(value, abs=1e-6), name
        np.testing.assert_allclose(result["bins"][0], count.numpy())
        np.testing.assert_allclose(result["bins"][1], conf_sum.numpy(), atol=1e-9)
        np.testing.assert_allclose(result["bins"][2], correct_sum.numpy())


# --- argument errors ------------------------------------------------------------------------


P3 = torch.full((4, 3), 1 / 3)
T3 = torch.tensor([0, 1, 2, 0])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: cal.calibration_error(P3, T3, norm="l3"), ValueError, "norm"),
        (lambda: cal.calibration_error(P3, T3, input_format="prob"), ValueError, "input_format"),
        (lambda: cal.calibration_error(P3, T3, n_bins=0), ValueError, "n_bins"),
        (lambda: cal.calibration_error(P3, T3, n_bins=2.0), TypeError, "n_bins"),
        (lambda: cal.calibration_error(P3, T3, task="multi"), ValueError, "task"),
        (lambda: cal.calibration_error(P3, T3[:3]), ValueError, "shape|preds"),
        (lambda: cal.calibration_error(P3, T3, task="multilabel"), ValueError, "task"),
        (lambda: cal.calibration_error(P3, T3.float()), TypeError, "target"),
        (lambda: cal.calibration_error(P3.long(), T3), TypeError, "preds"),
        (lambda: cal.calibration_error(P3, T3 + 1), ValueError, "target values"),
        (lambda: cal.calibration_error(P3, T3 - 1), ValueError, "target values"),
        (lambda: cal.brier_score(P3 * 4, T3), ValueError, "preds must be probabilities"),
        (lambda: cal.calibration_error(P3 - 0.5, T3), ValueError, "preds must be probabilities"),
        (lambda: cal.negative_log_likelihood(P3 * float("nan"), T3), ValueError, "nan"),
        (lambda: cal.accuracy(torch.rand(4), torch.tensor([0, 2, 1, 0])), ValueError, "0 or 1"),
        (lambda: cal.brier_score(torch.rand(4, 2), torch.rand(4, 2)), ValueError, "0 or 1"),
        (lambda: cal.CalibrationError(norm="L1"), ValueError, "norm"),
        (lambda: cal.CalibrationError(input_format="logit"), ValueError, "input_format"),
        (lambda: cal.AdaptiveCalibrationError(n_bins=-1), ValueError, "n_bins"),
        (lambda: cal.ClasswiseCalibrationError(None), ValueError, "num_classes"),
        (lambda: cal.CalibrationError(num_classes=4).update(P3, T3), ValueError, "num_classes"),
        (lambda: cal.ClasswiseCalibrationError(3).update(torch.rand(4), T3 % 2), ValueError, "2"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_validate_args_false_skips_value_checks_only():
    value = cal.calibration_error(P3 * 4, T3, validate_args=False)
    assert torch.isfinite(value)
    with pytest.raises(ValueError, match="norm"):
        cal.calibration_error(P3, T3, norm="l3", validate_args=False)


# --- probabilities that are not distributions, non-finite logits, devices ------------------------

PREDS_TARGET_FUNCTIONS = [
    pytest.param(lambda p, t, **kw: cal.calibration_error(p, t, **kw), id="calibration_error"),
    pytest.param(lambda p, t, **kw: cal.adaptive_calibration_error(p, t, **kw), id="adaptive"),
    pytest.param(lambda p, t, **kw: cal.classwise_calibration_error(p, t, **kw), id="classwise"),
    pytest.param(lambda p, t, **kw: cal.brier_score(p, t, **kw), id="brier_score"),
    pytest.param(lambda p, t, **kw: cal.negative_log_likelihood(p, t, **kw), id="nll"),
    pytest.param(lambda p, t, **kw: cal.accuracy(p, t, **kw), id="accuracy"),
    pytest.param(lambda p, t, **kw: cal.mean_confidence(p, t, **kw), id="mean_confidence"),
    pytest.param(lambda p, t, **kw: cal.confidence_and_correct(p, t, **kw), id="conf_correct"),
]


def metric_update(cls):
    def update(preds, target, **kw):
        if cls is cal.ClasswiseCalibrationError:
            kw["num_classes"] = preds.shape[1] if preds.dim() == 2 else 2
        metric = cls(**kw)
        metric.update(preds, target)
        return metric.compute()

    return pytest.param(update, id=cls.__name__)


METRIC_UPDATES = [
    metric_update(cls)
    for cls in (
        cal.CalibrationError,
        cal.AdaptiveCalibrationError,
        cal.ClasswiseCalibrationError,
        cal.BrierScore,
        cal.NegativeLogLikelihood,
        cal.Accuracy,
        cal.MeanConfidence,
        cal.CalibrationSummary,
    )
]


def unnormalised_rows():
    """Multiclass probabilities in [0, 1] whose row 2 sums to 0.5, the others to 1."""
    preds = torch.tensor(
        [[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.25, 0.2, 0.05], [0.3, 0.3, 0.4]],
    )
    return preds, torch.tensor([0, 1, 0, 2])


@pytest.mark.parametrize("call", PREDS_TARGET_FUNCTIONS + METRIC_UPDATES)
def test_multiclass_rows_must_sum_to_one(call):
    preds, target = unnormalised_rows()
    with pytest.raises(ValueError, match="preds must hold probabilities that sum to 1") as info:
        call(preds, target)
    message = str(info.value)
    assert "a sum of 0.5" in message
    assert "at [2]" in message
    assert "logits" in message
    preds[2, 2] = 0.55  # now a distribution
    call(preds, target)
    # validate_args=False skips the value checks (the formulas are applied as given)
    preds[2, 2] = 0.05
    call(preds, target, validate_args=False)


def test_unnormalised_rows_example_from_the_issue():
    # Rows that are not distributions used to give an ECE of 0.5 without a word.
    preds = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.5, 0.0]])
    target = torch.tensor([0, 1])
    assert cal.calibration_error(preds, target, validate_args=False).item() == 0.5
    with pytest.raises(ValueError, match="preds"):
        cal.calibration_error(preds, target)


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [(torch.float64, 1e-3), (torch.float32, 1e-3), (torch.float16, 4 * 2**-10)],
)
def test_row_sum_tolerance_follows_the_dtype(dtype, tolerance):
    target = torch.tensor([0, 1])
    inside = torch.tensor([[0.5, 0.5 - 0.8 * tolerance], [0.25, 0.75]], dtype=torch.float64)
    outside = torch.tensor([[0.5, 0.5 - 1.5 * tolerance], [0.25, 0.75]], dtype=torch.float64)
    cal.calibration_error(inside.to(dtype), target)
    with pytest.raises(ValueError, match="preds"):
        cal.calibration_error(outside.to(dtype), target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("classes", [2, 10, 1000])
def test_softmax_outputs_pass_the_row_sum_check(dtype, classes):
    # softmax of logits in the dtype itself (float32 inside, one rounding per probability)
    logits = 4 * torch.randn(64, classes, generator=torch.Generator().manual_seed(classes))
    target = torch.randint(0, classes, (64,), generator=torch.Generator().manual_seed(1))
    probs = torch.softmax(logits.to(dtype), dim=1)
    assert torch.isfinite(cal.calibration_error(probs, target))
    assert torch.isfinite(cal.brier_score(probs, target))


def test_binary_and_multilabel_probabilities_need_not_sum_to_one():
    preds = torch.tensor([[0.9, 0.9, 0.8], [0.1, 0.0, 0.2]])
    labels = torch.tensor([[1, 1, 0], [0, 0, 1]])
    assert torch.isfinite(cal.calibration_error(preds, labels))
    assert torch.isfinite(cal.brier_score(preds[0], labels[0]))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("task", ["multiclass", "binary", "multilabel"])
@pytest.mark.parametrize("call", PREDS_TARGET_FUNCTIONS + METRIC_UPDATES)
def test_non_finite_logits_raise_naming_preds(call, task, bad):
    _, logits, target = make_data(task, n=6, classes=3, seed=3)
    logits.view(-1)[4] = bad
    with pytest.raises(ValueError, match="preds must be finite logits") as info:
        call(logits, target, input_format="logits")
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("call", PREDS_TARGET_FUNCTIONS + METRIC_UPDATES)
def test_preds_and_target_on_two_devices(call):
    preds, target = unnormalised_rows()
    preds[2, 2] = 0.55
    message = "target is on meta but preds is on cpu; move them to one device"
    with pytest.raises(ValueError, match=re.escape(message)):
        call(preds, target.to("meta"))


# --- imports --------------------------------------------------------------------------------


@pytest.mark.slow
def test_imports_stay_light():
    package = Path(cal.__file__).parent
    for name in ("__init__.py", "functional.py", "metrics.py"):
        tree = ast.parse((package / name).read_text())
        for node in tree.body:  # module level only
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] in ("netcal", "matplotlib") for n in names), name
    code = (
        "import sys, lightning_losses; "
        "assert 'lightning_losses.calibration' not in sys.modules; "
        "import lightning_losses.calibration; assert 'netcal' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_functional_namespace():
    assert cal.calibration_error is CF.calibration_error
    assert set(CF.__all__) <= set(cal.__all__)


@pytest.mark.parametrize("input_format", ["logits", "probs"])
def test_one_column_preds_are_told_to_pass_n_for_binary(input_format):
    preds = torch.rand(8, 1) if input_format == "probs" else torch.randn(8, 1)
    target = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    with pytest.raises(
        ValueError, match=r"preds \[N, 1\].*for a binary problem pass preds as \[N\]"
    ):
        cal.calibration_error(preds, target, input_format=input_format)
    # what the message recommends is accepted
    cal.calibration_error(preds.squeeze(1), target, input_format=input_format)
