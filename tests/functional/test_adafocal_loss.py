"""AdaFocal against the reference formulas, written plainly here in float64.

Source: Ghosh, Schaaf, Gormley, "AdaFocal: Calibration-aware Adaptive Focal Loss" (NeurIPS
2022), and the authors' reference implementation. What the reference does, restated:

- Bin ``k`` has ``lower_k = e_k`` and ``upper_k = e_{k+1}``. A sample's gamma is that of the
  first bin, in order, for which: ``k == 0`` and ``p < upper_0``; or ``k == B - 1`` and
  ``p >= lower_{B-1}``; or ``lower_k <= p < upper_k``. The initial bins are ``lower_k = k (1/B)``,
  ``upper_k = (k + 1)(1/B)``, every gamma ``gamma_initial``.
- Per sample, with ``s = sign(g)`` (``torch.sign``: 0 for ``g = 0``) and ``a = |g|``:
  ``loss = -((1 - s p_t + 1e-20) ** a) log p_t``, ``log p_t = log_softmax(logits)[t]``. The
  reference sums; the library also has ``"none"`` and ``"mean"`` (sum over the non-ignored
  elements divided by their number). The reference turns the gammas into a float32 tensor
  before the power; the references here keep them in float64 (the library's choice).
- The update, per bin, in Python floats: ``g' = g exp(lambda E)`` if ``g > 0`` else
  ``g exp(-lambda E)``; if ``|g'| < switch`` then ``g' = -switch`` if ``g' > 0`` else ``switch``;
  ``g' = max(min(g', gamma_max), gamma_min)``.
- Equal-mass edges (Mukhoti et al.'s adaECE): ``numpy.interp(numpy.linspace(0, n, B + 1),
  numpy.arange(n), numpy.sort(conf))``. The library's bins over these edges are ``[e_0, e_1]``,
  ``(e_1, e_2]``, ..., ``(e_{B-1}, e_B]`` (the adaECE code uses ``(lower, upper]`` for every bin
  and so leaves the smallest confidence out; the library keeps it in the first bin).

Logits of the value tests are drawn in ``[-2, 2]`` so that ``p_t <= 0.99``: the reference's
``1 - p`` then loses at most ``eps / 0.01`` relatively against the library's ``-expm1(log p)``
(times ``|g| <= 20``: ``2e-13``), inside the ``1e-12`` tolerance.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import lightning_losses
from lightning_losses import AdaFocalLoss
from lightning_losses.calibration.functional import edge_binned_statistics, equal_mass_edges
from lightning_losses.functional import focal_loss
from lightning_losses.functional.adafocal import (
    adafocal_loss,
    adafocal_update,
    bin_gammas,
    check_adafocal_update,
)

F64 = torch.float64
TIGHT = 1e-12

# --- the reference, written plainly ----------------------------------------------------------


def reference_bin(p: float, edges: list[float]) -> int:
    """The reference's bin lookup: the first bin whose condition holds (else the last one)."""
    n_bins = len(edges) - 1
    k = 0
    for k in range(n_bins):
        lower, upper = edges[k], edges[k + 1]
        if k == 0 and p < upper:
            break
        if k == n_bins - 1 and p >= lower:
            break
        if lower <= p < upper:
            break
    return k


def reference_log_pt(logits: Tensor, target: Tensor, ignore_index: int) -> Tensor:
    """``log_softmax(logits)[t]`` per element, ``[N, C, *]`` flattened as the reference does."""
    n, c = logits.shape[:2]
    flat = logits.reshape(n, c, -1).transpose(1, 2).reshape(-1, c)
    t = target.reshape(-1)
    safe = torch.where(t == ignore_index, torch.zeros_like(t), t)
    return F.log_softmax(flat, dim=1).gather(1, safe[:, None]).view(-1)


def reference_adafocal(
    logits: Tensor,
    target: Tensor,
    edges: list[float],
    gammas: list[float],
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """The reference's loss in float64 (gammas too), with ``ignore_index`` and the reductions."""
    logpt = reference_log_pt(logits, target, ignore_index)
    pt = logpt.exp()
    gamma = torch.tensor([gammas[reference_bin(p, edges)] for p in pt.tolist()], dtype=F64)
    sign = torch.sign(gamma)
    loss = -((1 - sign * pt + 1e-20) ** gamma.abs()) * logpt
    valid = target.reshape(-1) != ignore_index
    loss = torch.where(valid, loss, torch.zeros((), dtype=loss.dtype))
    if reduction == "none":
        return loss.reshape(target.shape)
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum()


def reference_update(
    prev: float, gap: float, lam: float, switch_pt: float, gamma_min: float, gamma_max: float
) -> float:
    """The reference's update of one bin's gamma."""
    if prev > 0:
        nxt = prev * math.exp(lam * gap)
    else:
        nxt = prev * math.exp(-lam * gap)
    if abs(nxt) < switch_pt:
        nxt = -switch_pt if nxt > 0 else switch_pt
    return max(min(nxt, gamma_max), gamma_min)


def reference_equal_mass_edges(confidence: list[float], n_bins: int) -> list[float]:
    n = len(confidence)
    return np.interp(np.linspace(0, n, n_bins + 1), np.arange(n), np.sort(confidence)).tolist()


def reference_edge_bin(c: float, edges: list[float]) -> int:
    """Bins ``[e_0, e_1], (e_1, e_2], ..., (e_{B-1}, e_B]``: the first one that holds ``c``."""
    for k in range(len(edges) - 1):
        above_lower = c >= edges[k] if k == 0 else c > edges[k]
        if above_lower and c <= edges[k + 1]:
            return k
    raise AssertionError(f"{c} is in no bin of {edges}")


# --- helpers ---------------------------------------------------------------------------------


def midpoint_edges(p: Tensor, n_bins: int) -> tuple[list[float], float]:
    """Bin edges halfway between sorted ``p`` near the quantiles, and the margin of ``p``.

    The edges are ``[0, m_1 .. m_{B-1}, 1]``, ``m_k`` halfway between two sorted ``p`` near the
    ``k/B`` quantile (so every bin holds samples); the margin is the smallest distance of a ``p``
    to an inner edge (within it ``p`` may move without changing bin).
    """
    values = sorted(set(p.tolist()))
    inner = []
    for k in range(1, n_bins):
        j = max(1, min(len(values) - 1, round(k * len(values) / n_bins)))
        inner.append((values[j - 1] + values[j]) / 2)
    margin = min(abs(v - e) for v in values for e in inner) if inner else 1.0
    return [0.0, *inner, 1.0], margin


#: Bin gammas of both signs, exactly 0, and the clip values +-20 (cycled over the bins).
MIXED_GAMMAS = [20.0, -20.0, 0.0, 2.5, -0.7, 0.3, -3.0, 1.0, -1.0 / 3.0]


def mixed_gammas(n_bins: int) -> list[float]:
    return [MIXED_GAMMAS[k % len(MIXED_GAMMAS)] for k in range(n_bins)]


def make_case(
    shape: tuple[int, ...], seed: int, ignore: bool, n_bins: int = 9
) -> tuple[Tensor, Tensor, list[float], list[float]]:
    """Float64 logits in ``[-2, 2]``, targets (some ``-100``), midpoint edges, mixed gammas."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.rand(shape, generator=generator, dtype=F64) * 4 - 2
    target_shape = (shape[0], *shape[2:])
    target = torch.randint(0, shape[1], target_shape, generator=generator)
    if ignore:
        target = torch.where(torch.rand(target_shape, generator=generator) < 0.25, -100, target)
        target.view(-1)[0] = 0  # at least one element counts
    valid = target.reshape(-1) != -100
    pt = reference_log_pt(logits, target, -100).exp()[valid]
    edges, margin = midpoint_edges(pt, min(n_bins, max(1, pt.numel() // 2)))
    assert margin > 1e-9
    return logits, target, edges, mixed_gammas(len(edges) - 1)


def t64(values: list[float]) -> Tensor:
    return torch.tensor(values, dtype=F64)


SHAPES = [(37, 2), (29, 5), (23, 100), (4, 5, 7), (3, 2, 4, 5), (2, 100, 6)]


# --- values and gradients in float64 ---------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("ignore", [False, True])
def test_values_match_reference(shape: tuple[int, ...], ignore: bool) -> None:
    logits, target, edges, gammas = make_case(shape, seed=sum(shape) + ignore, ignore=ignore)
    for reduction in ("none", "mean", "sum"):
        expected = reference_adafocal(logits, target, edges, gammas, reduction=reduction)
        actual = adafocal_loss(
            logits, target, edges=t64(edges), gammas=t64(gammas), reduction=reduction
        )
        assert actual.dtype == F64
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, rtol=TIGHT, atol=1e-300)


def test_every_kind_of_gamma_is_exercised() -> None:
    """The value cases above do hit +-20, 0, and both signs (a check of the test itself)."""
    logits, target, edges, gammas = make_case((37, 2), seed=39, ignore=False)
    pt = reference_log_pt(logits, target, -100).exp().tolist()
    used = {gammas[reference_bin(p, edges)] for p in pt}
    assert {20.0, -20.0, 0.0, 2.5, -0.7} <= used


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gradients_match_autograd_of_reference(shape: tuple[int, ...]) -> None:
    logits, target, edges, gammas = make_case(shape, seed=7 * sum(shape), ignore=True)
    upstream = torch.rand(target.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    x_ref = logits.clone().requires_grad_()
    (reference_adafocal(x_ref, target, edges, gammas, reduction="none") * upstream).sum().backward()
    x = logits.clone().requires_grad_()
    loss = adafocal_loss(x, target, edges=t64(edges), gammas=t64(gammas), reduction="none")
    (loss * upstream).sum().backward()
    # The derivative is (slope - 1) times a weight up to 2^20: cancellation in that difference
    # costs a few digits against the reference's autograd, hence atol relative to the largest.
    scale = x_ref.grad.abs().max().item()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-11, atol=1e-13 * scale)
    ignored = (target == -100).unsqueeze(1).expand_as(logits)
    assert torch.all(x.grad[ignored] == 0)


@pytest.mark.parametrize("shape", [(6, 4), (2, 3, 4)], ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_gradcheck(shape: tuple[int, ...], reduction: str) -> None:
    logits, target, edges, gammas = make_case(shape, seed=11, ignore=True, n_bins=4)
    # gradcheck moves the logits by 1e-6, p_t by less: no sample may cross an edge.
    pt = reference_log_pt(logits, target, -100).exp()
    assert min(abs(p - e) for p in pt.tolist() for e in edges[1:-1]) > 1e-5

    def loss(x: Tensor) -> Tensor:
        return adafocal_loss(x, target, edges=t64(edges), gammas=t64(gammas), reduction=reduction)

    assert torch.autograd.gradcheck(loss, (logits.clone().requires_grad_(),))


def two_class_logits(p: list[float]) -> Tensor:
    """``[log p, log(1 - p)]`` per row: softmax gives ``p`` for class 0."""
    p_t = t64(p)
    return torch.stack([p_t.log(), torch.log1p(-p_t)], dim=1)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("gamma", [-1.0, -2.5, -20.0, 1.0, 2.5])
def test_inverse_focal_value_and_gradient(p: float, gamma: float) -> None:
    """A negative gamma is the inverse focal weight ``(1 + p)^|g|``, with its gradient."""
    x = two_class_logits([p]).requires_grad_()
    loss = adafocal_loss(
        x, torch.tensor([0]), edges=t64([0.0, 1.0]), gammas=t64([gamma]), reduction="sum"
    )
    loss.backward()
    a, s = abs(gamma), math.copysign(1.0, gamma)
    base = 1 - s * p
    assert loss.item() == pytest.approx(-(base**a) * math.log(p), rel=TIGHT)
    # d loss / d log p = b^a (s a p log p / b - 1); d log p / d x_0 = 1 - p, d/dx_1 = -(1 - p).
    dphi = base**a * (s * a * p * math.log(p) / base - 1)
    assert x.grad[0, 0].item() == pytest.approx(dphi * (1 - p), rel=1e-10)
    assert x.grad[0, 1].item() == pytest.approx(-dphi * (1 - p), rel=1e-10)
    if gamma > 0:  # focal: b^a (a p log p / b - 1) < 0, p_t is always pushed up
        assert x.grad[0, 0].item() < 0
    else:  # inverse focal pushes p_t up only while a p (-log p) < 1 + p, then down
        assert (x.grad[0, 0].item() < 0) == (a * p * -math.log(p) < 1 + p)


def test_inverse_focal_signs_at_half() -> None:
    """At p = 0.5 gamma -1 pushes p_t up harder than cross-entropy, +1 less, -20 pushes it down."""
    grads = {}
    for gamma in (-20.0, -1.0, 0.0, 1.0):
        x = two_class_logits([0.5]).requires_grad_()
        adafocal_loss(
            x, torch.tensor([0]), edges=t64([0.0, 1.0]), gammas=t64([gamma]), reduction="sum"
        ).backward()
        grads[gamma] = x.grad[0, 0].item()
    assert grads[0.0] == pytest.approx(-0.5, rel=TIGHT)  # gamma 0 is cross-entropy
    assert grads[-1.0] == pytest.approx(0.5 * 1.5 * (-0.5 * math.log(0.5) / 1.5 - 1), rel=1e-10)
    assert grads[1.0] == pytest.approx(0.5 * 0.5 * (0.5 * math.log(0.5) / 0.5 - 1), rel=1e-10)
    assert grads[-1.0] < grads[0.0] < grads[1.0] < 0 < grads[-20.0]


# --- bin boundaries --------------------------------------------------------------------------


def test_bin_lookup_at_exact_edges() -> None:
    """A p equal to an inner edge goes up; below e_1 is bin 0, at or above e_{B-1} the last."""
    probs = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.95]
    logits = two_class_logits(probs)
    target = torch.zeros(len(probs), dtype=torch.long)
    pt = reference_log_pt(logits, target, -100).exp().tolist()  # exactly as the loss sees them
    # e_0 above the smallest p, e_4 below the largest; inner edges at exact p values.
    edges = [pt[1], pt[2], pt[4], pt[6], pt[8]]
    expected_bins = [0, 0, 1, 1, 2, 2, 3, 3, 3, 3]
    assert [reference_bin(p, edges) for p in pt] == expected_bins
    index = bin_gammas(t64(pt), t64(edges), torch.arange(4, dtype=F64))
    assert index.tolist() == expected_bins
    gammas = [1.5, -2.0, 0.5, -4.0]
    actual = adafocal_loss(logits, target, edges=t64(edges), gammas=t64(gammas), reduction="none")
    expected = reference_adafocal(logits, target, edges, gammas, reduction="none")
    torch.testing.assert_close(actual, expected, rtol=TIGHT, atol=0.0)
    # one ulp below an inner edge stays in the lower bin
    below = [math.nextafter(e, -math.inf) for e in edges[1:-1]]
    assert bin_gammas(t64(below), t64(edges), torch.arange(4, dtype=F64)).tolist() == [0, 1, 2]


def test_bin_lookup_with_duplicate_edges() -> None:
    edges = [0.1, 0.3, 0.5, 0.5, 0.5, 0.8, 0.8]
    probs = [0.0, 0.1, 0.3, math.nextafter(0.5, 0), 0.5, 0.6, 0.8, 0.9, 1.0]
    expected = [reference_bin(p, edges) for p in probs]
    assert expected == [0, 0, 1, 1, 4, 4, 5, 5, 5]
    actual = bin_gammas(t64(probs), t64(edges), torch.arange(6, dtype=F64))
    assert actual.tolist() == expected


def test_bin_lookup_with_equal_mass_edges_with_ties() -> None:
    confidence = t64([0.2, 0.5, 0.5, 0.5, 0.5, 0.5, 0.9, 0.3])
    edges = equal_mass_edges(confidence, 4).tolist()
    assert len(set(edges)) < len(edges)  # ties make duplicate edges
    probs = sorted({*edges, *confidence.tolist(), 0.0, 0.45, 0.7, 1.0})
    expected = [reference_bin(p, edges) for p in probs]
    assert bin_gammas(t64(probs), t64(edges), torch.arange(4, dtype=F64)).tolist() == expected


def test_bin_lookup_random_against_loop() -> None:
    generator = torch.Generator().manual_seed(5)
    for n_bins in (1, 2, 3, 7, 15):
        edges = torch.rand(n_bins + 1, generator=generator, dtype=F64)
        edges = torch.where(torch.rand(n_bins + 1, generator=generator) < 0.3, 0.5, edges)
        edges = edges.sort().values.tolist()
        probs = [*edges, *torch.rand(200, generator=generator, dtype=F64).tolist(), 0.0, 1.0]
        expected = [reference_bin(p, edges) for p in probs]
        actual = bin_gammas(t64(probs), t64(edges), torch.arange(n_bins, dtype=F64))
        assert actual.tolist() == expected


@pytest.mark.parametrize("n_bins", [1, 3, 15])
def test_initial_bins_are_the_references(n_bins: int) -> None:
    criterion = AdaFocalLoss(num_bins=n_bins, gamma_initial=1.5)
    lower = [k * (1 / n_bins) for k in range(n_bins)]
    upper = [(k + 1) * (1 / n_bins) for k in range(n_bins)]
    assert criterion.edges[:-1].tolist() == lower
    assert criterion.edges[1:-1].tolist() == upper[:-1]
    assert criterion.edges[-1].item() == 1.0
    assert criterion.gammas.tolist() == [1.5] * n_bins
    probs = [*lower, *upper, *[math.nextafter(v, -math.inf) for v in lower[1:]], 0.0, 1.0]

    def loop(p: float) -> int:  # the reference's lookup with its own lower/upper lists
        k = 0
        for k in range(n_bins):
            if k == 0 and p < upper[k]:
                break
            if k == n_bins - 1 and p >= lower[k]:
                break
            if lower[k] <= p < upper[k]:
                break
        return k

    actual = bin_gammas(t64(probs), criterion.edges, torch.arange(n_bins, dtype=F64))
    assert actual.tolist() == [loop(p) for p in probs]


# --- float32 and the [N, C, *] path ----------------------------------------------------------


def test_float32_matches_float64_reference() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(96, 10, generator=generator) * 2
    target = torch.randint(0, 10, (96,), generator=generator)
    pt = reference_log_pt(logits.double(), target, -100).exp()
    edges, margin = midpoint_edges(pt, 9)
    assert margin > 1e-5  # far above float32's error in p_t: the same bins either way
    gammas = mixed_gammas(9)
    x = logits.clone().requires_grad_()
    loss = adafocal_loss(x, target, edges=t64(edges), gammas=t64(gammas), reduction="none")
    loss.sum().backward()
    x_ref = logits.double().requires_grad_()
    expected = reference_adafocal(x_ref, target, edges, gammas, reduction="none")
    expected.sum().backward()
    assert loss.dtype == torch.float32
    assert x.grad.dtype == torch.float32
    # float32 rounding of p_t, relative ~1e-7, is raised to the power |g| <= 20.
    torch.testing.assert_close(loss.double(), expected.detach(), rtol=1e-5, atol=1e-6)
    scale = x_ref.grad.abs().max().item()
    torch.testing.assert_close(x.grad.double(), x_ref.grad, rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_spatial_path_matches_flat_path(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 6, 4, 5, generator=generator, dtype=dtype) * 2
    target = torch.randint(0, 6, (3, 4, 5), generator=generator)
    target[0, 0, :2] = -100
    flat_logits = logits.permute(0, 2, 3, 1).reshape(-1, 6)
    pt = reference_log_pt(logits.double(), target, -100).exp()
    edges, margin = midpoint_edges(pt[target.reshape(-1) != -100], 7)
    assert margin > 1e-5
    options = {"edges": t64(edges), "gammas": t64(mixed_gammas(7))}
    x = logits.clone().requires_grad_()
    spatial = adafocal_loss(x, target, reduction="none", **options)
    spatial.sum().backward()
    x_flat = flat_logits.clone().requires_grad_()
    flat = adafocal_loss(x_flat, target.reshape(-1), reduction="none", **options)
    flat.sum().backward()
    tol = 1e-6 if dtype == torch.float32 else TIGHT
    torch.testing.assert_close(spatial.reshape(-1), flat, rtol=tol, atol=tol)
    grad_flat = x_flat.grad.reshape(3, 4, 5, 6).permute(0, 3, 1, 2)
    torch.testing.assert_close(x.grad, grad_flat, rtol=tol, atol=tol)
    for reduction in ("mean", "sum"):
        torch.testing.assert_close(
            adafocal_loss(logits, target, reduction=reduction, **options),
            adafocal_loss(flat_logits, target.reshape(-1), reduction=reduction, **options),
            rtol=tol,
            atol=tol,
        )


# --- against focal loss ----------------------------------------------------------------------


GAMMAS_NONNEGATIVE = [0.0, 0.1, 1.0 / 3.0, 1.0, 2.0, 5.0]


@pytest.mark.parametrize("gamma", GAMMAS_NONNEGATIVE)
def test_uniform_gammas_set_by_set_bins_equal_focal_loss(gamma: float) -> None:
    logits, target, _, _ = make_case((41, 5), seed=2, ignore=True)
    criterion = AdaFocalLoss(num_bins=6)
    criterion.set_bins(criterion.edges, [gamma] * 6)
    expected = focal_loss(logits, target, gamma=gamma)
    torch.testing.assert_close(criterion(logits, target), expected, rtol=TIGHT, atol=0.0)


@pytest.mark.parametrize("gamma", GAMMAS_NONNEGATIVE)
def test_gamma_initial_equals_focal_loss(gamma: float) -> None:
    """Without an update AdaFocalLoss(gamma_initial=g) is focal loss with gamma g."""
    logits, target, _, _ = make_case((41, 5), seed=2, ignore=True)
    criterion = AdaFocalLoss(num_bins=6, gamma_initial=gamma)
    expected = focal_loss(logits, target, gamma=gamma)
    torch.testing.assert_close(criterion(logits, target), expected, rtol=TIGHT, atol=0.0)


@pytest.mark.parametrize("gamma", [0.1, 1.0 / 3.0, -0.7, 2.0])
def test_gamma_initial_is_stored_exactly(gamma: float) -> None:
    """The reference keeps ``gamma_initial`` as the Python float the update rule starts from."""
    assert AdaFocalLoss(num_bins=3, gamma_initial=gamma).gammas.tolist() == [gamma] * 3


# --- the update rule -------------------------------------------------------------------------


UPDATE_GAPS = [  # 10 validation epochs x 6 bins
    [0.3, -0.5, 0.1, 0.0, -0.6, 0.05],
    [0.3, -0.5, 0.0, 0.0, -0.6, -0.02],
    [0.3, -0.3, 0.2, 0.0, -0.6, 0.1],
    [0.1, 0.4, -0.2, 0.0, 0.2, -0.3],
    [-0.5, 0.1, -0.4, 0.25, 0.3, -0.4],
    [-0.5, -0.2, -0.3, 0.0, 0.0, -0.5],
    [-0.4, 0.0, 0.6, -0.6, 0.1, 0.4],
    [0.0, -0.1, 0.0, -0.5, -0.3, -0.7],
    [0.2, 0.3, -0.1, 0.0, -0.2, 0.9],
    [-0.05, -0.35, 0.15, 0.3, 0.45, -0.9],
]


def test_update_sequence_equals_reference_exactly() -> None:
    options = {"lambda_": 2.0, "switch_point": 0.2, "gamma_min": -3.0, "gamma_max": 4.0}
    ours = [1.0, 1.0, 0.0, 0.5, -0.5, 2.0]
    ref = list(ours)
    events = set()
    for gaps in UPDATE_GAPS:
        new_ref = [
            reference_update(g, e, 2.0, 0.2, -3.0, 4.0) for g, e in zip(ref, gaps, strict=True)
        ]
        ours = adafocal_update(ours, gaps, **options)
        assert ours == new_ref  # the same Python floats, bit for bit
        for prev, nxt, gap in zip(ref, new_ref, gaps, strict=True):
            events.add("grow" if abs(nxt) > abs(prev) and prev * nxt > 0 else "")
            events.add("shrink" if abs(nxt) < abs(prev) and prev * nxt > 0 else "")
            events.add("to inverse" if prev > 0 > nxt else "")
            events.add("to focal" if prev < 0 < nxt else "")
            events.add("clip max" if nxt == 4.0 else "")
            events.add("clip min" if nxt == -3.0 else "")
            events.add("from zero" if prev == 0.0 else "")
            events.add("empty bin" if gap == 0.0 else "")
        ref = new_ref
    # the gaps were chosen so that every branch of the rule is taken
    assert events >= {"grow", "shrink", "to inverse", "to focal", "clip max", "clip min"}
    assert events >= {"from zero", "empty bin"}


def test_update_defaults_equal_reference() -> None:
    gammas = [15.0, -15.0, 1.0, 0.25, -0.21, 0.0, -0.0]
    gaps = [0.5, -0.5, 0.1, -0.3, 0.2, 0.0, 0.0]
    for _ in range(3):
        expected = [
            reference_update(g, e, 1.0, 0.2, -20.0, 20.0) for g, e in zip(gammas, gaps, strict=True)
        ]
        gammas = adafocal_update(gammas, gaps)
        assert gammas == expected
    assert gammas[0] == 20.0
    assert gammas[1] == -20.0


def test_update_accepts_tensors() -> None:
    gammas, gaps = [1.0, -0.5, 3.0], [0.125, -0.25, 0.0]
    expected = [
        reference_update(g, e, 1.0, 0.2, -20.0, 20.0) for g, e in zip(gammas, gaps, strict=True)
    ]
    assert adafocal_update(t64(gammas), t64(gaps)) == expected


# --- equal-mass edges and their bins ---------------------------------------------------------


def confidences(n: int, seed: int, ties: bool) -> Tensor:
    values = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return (values * 10).round() / 10 if ties else values


@pytest.mark.parametrize("n_bins", [1, 3, 15])
def test_equal_mass_edges_equal_numpy_interp(n_bins: int) -> None:
    for n in sorted({1, 2, max(n_bins - 1, 1), n_bins, n_bins + 1, 1000}):
        for ties in (False, True):
            conf = confidences(n, seed=n + n_bins, ties=ties)
            edges = equal_mass_edges(conf, n_bins)
            assert edges.dtype == F64
            assert edges.tolist() == reference_equal_mass_edges(conf.tolist(), n_bins)
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(n))
            assert equal_mass_edges(conf[perm], n_bins).tolist() == edges.tolist()


def test_equal_mass_edges_of_float32_input() -> None:
    conf = torch.rand(333, generator=torch.Generator().manual_seed(8))
    expected = reference_equal_mass_edges(conf.double().tolist(), 15)
    assert equal_mass_edges(conf, 15).tolist() == expected


@pytest.mark.parametrize("n_bins", [1, 3, 15])
@pytest.mark.parametrize("ties", [False, True])
def test_edge_binned_statistics_equal_a_loop(n_bins: int, ties: bool) -> None:
    n = 500
    conf = confidences(n, seed=n_bins, ties=ties)
    correct = (torch.rand(n, generator=torch.Generator().manual_seed(9)) < conf).double()
    edges = equal_mass_edges(conf, n_bins)
    count, conf_sum, correct_sum = edge_binned_statistics(conf, correct, edges)
    ref_count, ref_conf, ref_correct = [0.0] * n_bins, [0.0] * n_bins, [0.0] * n_bins
    edge_list = edges.tolist()
    for c, y in zip(conf.tolist(), correct.tolist(), strict=True):
        k = reference_edge_bin(c, edge_list)
        ref_count[k] += 1
        ref_conf[k] += c
        ref_correct[k] += y
    assert count.tolist() == ref_count
    assert sum(ref_count) == n  # the smallest confidence is in a bin too
    assert correct_sum.tolist() == ref_correct
    torch.testing.assert_close(conf_sum, t64(ref_conf), rtol=TIGHT, atol=0.0)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(10))
    permuted = edge_binned_statistics(conf[perm], correct[perm], edges)
    for a, b in zip(permuted, (count, conf_sum, correct_sum), strict=True):
        assert a.tolist() == b.tolist()


def test_edge_binned_statistics_duplicate_edges_and_minimum() -> None:
    conf = t64([0.2, 0.5, 0.5, 0.5, 0.5, 0.9])
    correct = t64([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    edges = equal_mass_edges(conf, 3)
    assert edges.tolist() == reference_equal_mass_edges(conf.tolist(), 3) == [0.2, 0.5, 0.5, 0.9]
    count, conf_sum, correct_sum = edge_binned_statistics(conf, correct, edges)
    # [0.2, 0.5] holds the minimum and all 0.5s; (0.5, 0.5] is empty; (0.5, 0.9] holds 0.9.
    assert count.tolist() == [5.0, 0.0, 1.0]
    assert correct_sum.tolist() == [3.0, 0.0, 1.0]
    assert conf_sum.tolist() == [0.2 + 0.5 + 0.5 + 0.5 + 0.5, 0.0, 0.9]


# --- the module ------------------------------------------------------------------------------


def custom_bins() -> tuple[list[float], list[float]]:
    return [0.0, 0.1, 1.0 / 3.0, 0.7, 1.0], [20.0, -1.0 / 3.0, 0.0, 0.1]


def test_module_buffers_are_float64_state() -> None:
    criterion = AdaFocalLoss(num_bins=4)
    edges, gammas = custom_bins()
    criterion.set_bins(edges, gammas)
    assert criterion.edges.dtype == F64
    assert criterion.gammas.dtype == F64
    assert criterion.edges.tolist() == edges
    assert criterion.gammas.tolist() == gammas
    state = criterion.state_dict()
    assert set(state) == {"edges", "gammas"}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = AdaFocalLoss(num_bins=4)
    restored.load_state_dict(torch.load(buffer))
    assert restored.edges.tolist() == edges
    assert restored.gammas.tolist() == gammas
    logits, target, _, _ = make_case((30, 3), seed=6, ignore=False)
    assert torch.equal(restored(logits, target), criterion(logits, target))


@pytest.mark.parametrize(
    "cast",
    [
        lambda m: m.half(),
        lambda m: m.float(),
        lambda m: m.bfloat16(),
        lambda m: m.double(),
        lambda m: m.to(torch.float16),
        lambda m: m.to("cpu", torch.float16),
    ],
)
def test_module_casts_keep_bins_float64(cast) -> None:
    edges, gammas = custom_bins()
    criterion = AdaFocalLoss(num_bins=4)
    criterion.set_bins(edges, gammas)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), criterion)
    cast(model)
    assert criterion.edges.dtype == F64
    assert criterion.gammas.dtype == F64
    assert criterion.edges.tolist() == edges
    assert criterion.gammas.tolist() == gammas
    state = model.state_dict()
    assert state["1.edges"].dtype == F64
    assert state["1.gammas"].tolist() == gammas


def test_module_half_logits_use_float32_p() -> None:
    """After .half(), half logits give the loss of the same values in float32."""
    edges, gammas = custom_bins()
    criterion = AdaFocalLoss(num_bins=4).half()
    criterion.set_bins(edges, gammas)
    logits = (torch.randn(40, 4, generator=torch.Generator().manual_seed(2)) * 2).half()
    target = torch.randint(0, 4, (40,), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(
        criterion(logits, target), criterion(logits.float(), target), rtol=0.0, atol=0.0
    )


def test_set_bins_rejects_bad_bins() -> None:
    criterion = AdaFocalLoss(num_bins=3)
    before = (criterion.edges.tolist(), criterion.gammas.tolist())
    with pytest.raises(ValueError, match="num_bins=3"):
        criterion.set_bins([0.0, 0.2, 0.4, 0.6, 1.0], [1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="edges must hold one more value than gammas"):
        criterion.set_bins([0.0, 0.5, 1.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="edges must be non-decreasing"):
        criterion.set_bins([0.0, 0.6, 0.5, 1.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="gammas must be finite"):
        criterion.set_bins([0.0, 0.5, 0.6, 1.0], [1.0, math.inf, 1.0])
    assert (criterion.edges.tolist(), criterion.gammas.tolist()) == before


@pytest.mark.parametrize("num_bins", [0, -1, 2.0, True])
def test_module_rejects_num_bins(num_bins) -> None:
    with pytest.raises(ValueError, match="num_bins"):
        AdaFocalLoss(num_bins=num_bins)


@pytest.mark.parametrize("gamma_initial", [math.nan, math.inf, -math.inf])
def test_module_rejects_gamma_initial(gamma_initial: float) -> None:
    with pytest.raises(ValueError, match="gamma_initial"):
        AdaFocalLoss(gamma_initial=gamma_initial)


def test_functional_rejects_bad_bins() -> None:
    logits, target = torch.zeros(2, 3, dtype=F64), torch.tensor([0, 1])
    good_edges, good_gammas = t64([0.0, 0.5, 1.0]), t64([1.0, -1.0])
    with pytest.raises(ValueError, match="edges must hold one more value than gammas"):
        adafocal_loss(logits, target, edges=t64([0.0, 1.0]), gammas=good_gammas)
    with pytest.raises(ValueError, match="edges must hold one more value than gammas"):
        adafocal_loss(logits, target, edges=good_edges, gammas=t64([1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="edges must be non-decreasing"):
        adafocal_loss(logits, target, edges=t64([0.0, 0.7, 0.6]), gammas=good_gammas)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="gammas must be finite"):
            adafocal_loss(logits, target, edges=good_edges, gammas=t64([1.0, bad]))
    with pytest.raises(TypeError, match="gammas"):
        adafocal_loss(logits, target, edges=good_edges, gammas=good_gammas[None])
    with pytest.raises(TypeError, match="edges"):
        adafocal_loss(logits, target, edges=torch.tensor([0, 1, 2]), gammas=good_gammas)
    with pytest.raises(ValueError, match="reduction"):
        adafocal_loss(logits, target, edges=good_edges, gammas=good_gammas, reduction="avg")


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"lambda_": 0.0}, "lambda_"),
        ({"lambda_": -1.0}, "lambda_"),
        ({"gamma_min": 1.0, "gamma_max": 1.0}, "gamma_min.*gamma_max"),
        ({"gamma_min": 2.0, "gamma_max": 1.0}, "gamma_min.*gamma_max"),
        ({"switch_point": -0.1}, "switch_point"),
        ({"gamma_max": math.inf}, "gamma_max"),
    ],
)
def test_update_rejects_bad_options(kwargs: dict[str, float], pattern: str) -> None:
    options = {"lambda_": 1.0, "switch_point": 0.2, "gamma_min": -20.0, "gamma_max": 20.0}
    options.update(kwargs)
    with pytest.raises(ValueError, match=pattern):
        check_adafocal_update(**options)
    with pytest.raises(ValueError, match=pattern):
        adafocal_update([1.0], [0.1], **options)


def test_update_rejects_gaps_of_wrong_length() -> None:
    with pytest.raises(ValueError, match="gaps"):
        adafocal_update([1.0, 1.0], [0.1])


def test_registry_builds_adafocal() -> None:
    criterion = lightning_losses.get_loss("adafocal", num_bins=3)
    assert isinstance(criterion, AdaFocalLoss)
    assert criterion.num_bins == 3
    assert criterion.edges.shape == (4,)
    logits, target, _, _ = make_case((20, 4), seed=12, ignore=False)
    expected = focal_loss(logits, target, gamma=1.0)
    torch.testing.assert_close(criterion(logits, target), expected, rtol=TIGHT, atol=0.0)
