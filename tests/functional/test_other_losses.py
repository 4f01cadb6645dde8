"""Soft truncation, the binary losses, EXACT, the multi-label and n-by-m losses, NormFace.

Each test compares against a plain float64 formula written here (DESIGN.md, "The losses"), a
closed form, a high-accuracy numerical integral, or a Monte-Carlo estimate whose tolerance is
computed from its binomial standard error. Gradients are compared with the autograd gradient of
the reference formula.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from lightning_losses.functional import (
    binary_focal_loss,
    binary_hard_truncated_loss,
    binary_soft_truncated_loss,
    exact_loss,
    feature_incay,
    multilabel_categorical_crossentropy,
    nm_categorical_crossentropy,
    normface_min_scale,
    soft_truncated_loss,
)

TOL = 1e-6
SQRT2 = math.sqrt(2.0)


def assert_close(actual, expected, tol=TOL):
    torch.testing.assert_close(
        actual.double(), expected.double(), rtol=tol, atol=tol, check_dtype=False
    )


def gen(seed):
    return torch.Generator().manual_seed(seed)


def grad_of(value, *inputs, upstream=None):
    if upstream is not None:
        value = (value * upstream).sum()
    grads = torch.autograd.grad(value, inputs)
    return grads if len(grads) > 1 else grads[0]


def reduce(element, reduction):
    if reduction == "none":
        return element
    return element.sum() if reduction == "sum" else element.mean()


def leaf(x):
    return x.detach().clone().requires_grad_()


# =============================================================================================
# soft truncation (softmax)
# =============================================================================================


def ref_soft_truncated(x, t, k, weight=None, ignore_index=-100, reduction="none"):
    """``-softmax(-k x)_t * log softmax(x)_t`` along dim 1, naive float64 formula."""
    x = x.double()
    valid = t != ignore_index
    safe = torch.where(valid, t, torch.zeros_like(t))
    p = torch.exp(x) / torch.exp(x).sum(1, keepdim=True)
    r = torch.exp(-k * x) / torch.exp(-k * x).sum(1, keepdim=True)
    p_t = p.gather(1, safe.unsqueeze(1)).squeeze(1)
    r_t = r.gather(1, safe.unsqueeze(1)).squeeze(1)
    element = -r_t * torch.log(p_t)
    w = valid.double() if weight is None else weight.double()[safe] * valid
    element = torch.where(valid, element * w, torch.zeros_like(element))
    if reduction == "none":
        return element
    if reduction == "sum":
        return element.sum()
    return element.sum() / w.sum()


def index_inputs(shape, seed, ignore_index=-100, n_ignored=1, scale=3.0):
    g = gen(seed)
    x = scale * torch.randn(shape, generator=g, dtype=torch.float64)
    t = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
    flat = t.view(-1)
    flat[torch.randperm(flat.numel(), generator=g)[:n_ignored]] = ignore_index
    return x, t


@pytest.mark.parametrize("k", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 5), (2, 3, 2, 3)], ids=["NC", "NCL", "NCHW"])
@pytest.mark.parametrize("with_weight", [False, True], ids=["plain", "weight"])
def test_soft_truncated_values_and_gradients(k, reduction, shape, with_weight):
    x, t = index_inputs(shape, seed=1, n_ignored=2)
    weight = 0.25 + torch.rand(shape[1], generator=gen(2), dtype=torch.float64)
    weight = weight if with_weight else None
    xa, xr = leaf(x), leaf(x)
    actual = soft_truncated_loss(xa, t, k=k, weight=weight, reduction=reduction)
    expected = ref_soft_truncated(xr, t, k, weight, reduction=reduction)
    if reduction == "none":
        assert actual.shape == t.shape
    assert_close(actual, expected)
    upstream = torch.randn(expected.shape, generator=gen(3), dtype=torch.float64)
    assert_close(grad_of(actual, xa, upstream=upstream), grad_of(expected, xr, upstream=upstream))


def test_soft_truncated_custom_ignore_index_and_default_reduction():
    x, t = index_inputs((9, 4), seed=4, ignore_index=1, n_ignored=3)
    expected = ref_soft_truncated(x, t, 1.0, ignore_index=1, reduction="mean")
    assert_close(soft_truncated_loss(x, t, ignore_index=1), expected)


def test_soft_truncated_k_zero_is_cross_entropy_over_c():
    # softmax(0 * x) is uniform: the loss is CE / C, gradient included.
    x, t = index_inputs((8, 5), seed=5, n_ignored=0)
    xa, xr = leaf(x), leaf(x)
    actual = soft_truncated_loss(xa, t, k=0.0, reduction="sum")
    expected = F.cross_entropy(xr, t, reduction="sum") / 5
    assert_close(actual, expected)
    assert_close(grad_of(actual, xa), grad_of(expected, xr))


def test_soft_truncated_differentiates_both_factors():
    # The gradient is not the CE gradient scaled by the (detached) first factor.
    x, t = index_inputs((6, 4), seed=6, n_ignored=0)
    xa = leaf(x)
    g = grad_of(soft_truncated_loss(xa, t, k=1.0, reduction="sum"), xa)
    r_t = torch.softmax(-x, 1).gather(1, t[:, None])
    detached = r_t * (torch.softmax(x, 1) - F.one_hot(t, 4).double())
    assert (g - detached).abs().max() > 1e-3


@given(
    n=st.integers(1, 6),
    c=st.integers(2, 6),
    extra=st.lists(st.integers(1, 3), max_size=2),
    k=st.floats(0.0, 4.0),
    seed=st.integers(0, 2**16),
)
def test_soft_truncated_property(n, c, extra, k, seed):
    x, t = index_inputs((n, c, *extra), seed=seed, n_ignored=0)
    xa, xr = leaf(x), leaf(x)
    actual = soft_truncated_loss(xa, t, k=k, reduction="mean")
    expected = ref_soft_truncated(xr, t, k, reduction="mean")
    assert_close(actual, expected)
    assert_close(grad_of(actual, xa), grad_of(expected, xr))


@pytest.mark.parametrize("k", [0.5, 1.0, 3.0])
def test_soft_truncated_gradcheck(k):
    x, t = index_inputs((4, 5), seed=7, n_ignored=1)
    w = 0.5 + torch.rand(5, generator=gen(8), dtype=torch.float64)
    for reduction in ("none", "mean", "sum"):
        for weight in (None, w):
            assert torch.autograd.gradcheck(
                lambda z, r=reduction, wt=weight: soft_truncated_loss(
                    z, t, k=k, weight=wt, reduction=r
                ),
                (leaf(x),),
            )


# =============================================================================================
# binary losses
# =============================================================================================


def sig(x):
    return 1 / (1 + torch.exp(-x))


def ref_binary_focal(x, y, gamma, alpha=None):
    s = sig(x.double())
    a = 1.0 if alpha is None else alpha
    b = 1.0 if alpha is None else 1 - alpha
    pos = -a * (1 - s) ** gamma * torch.log(s)
    neg = -b * s**gamma * torch.log(1 - s)
    return y * pos + (1 - y) * neg


def ref_binary_soft_truncated(x, y, k):
    x = x.double()
    pos = -sig(-k * x) * torch.log(sig(x))
    neg = -sig(k * x) * torch.log(sig(-x))
    return y * pos + (1 - y) * neg


def ref_binary_hard_truncated(x, y, margin):
    s = sig(x.double())
    zero = torch.zeros_like(s)
    pos = torch.where(s <= margin, -torch.log(s), zero)
    neg = torch.where(1 - s <= margin, -torch.log(1 - s), zero)
    return y * pos + (1 - y) * neg


def binary_inputs(shape, seed, soft=True, scale=3.0, avoid=()):
    g = gen(seed)
    for _ in range(100):
        x = scale * torch.randn(shape, generator=g, dtype=torch.float64)
        s = sig(x)
        if all(((s - m).abs().min() > 1e-3 and (1 - s - m).abs().min() > 1e-3) for m in avoid):
            break
    if soft:
        y = torch.rand(shape, generator=g, dtype=torch.float64)
    else:
        y = torch.randint(0, 2, shape, generator=g).double()
    return x, y


BINARY = (
    [
        pytest.param(
            binary_focal_loss, ref_binary_focal, {"gamma": g, "alpha": a}, id=f"bf-{g}-{a}"
        )
        for g in (0.0, 0.5, 2.0)
        for a in (None, 0.25)
    ]
    + [
        pytest.param(binary_soft_truncated_loss, ref_binary_soft_truncated, {"k": k}, id=f"bst-{k}")
        for k in (0.5, 1.0, 2.0)
    ]
    + [
        pytest.param(
            binary_hard_truncated_loss, ref_binary_hard_truncated, {"margin": m}, id=f"bht-{m}"
        )
        for m in (0.3, 0.5, 0.8)
    ]
)


def binary_ref(ref, x, y, hp):
    if ref is ref_binary_focal:
        return ref(x, y, hp["gamma"], hp["alpha"])
    if ref is ref_binary_soft_truncated:
        return ref(x, y, hp["k"])
    return ref(x, y, hp["margin"])


@pytest.mark.parametrize(("fn", "ref", "hp"), BINARY)
@pytest.mark.parametrize("shape", [(11,), (4, 3), (2, 3, 4)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
def test_binary_values_and_gradients(fn, ref, hp, shape, reduction, soft):
    x, y = binary_inputs(shape, seed=10, soft=soft, avoid=(hp.get("margin", 2.0),))
    xa, xr = leaf(x), leaf(x)
    actual = fn(xa, y, reduction=reduction, **hp)
    expected = reduce(binary_ref(ref, xr, y, hp), reduction)
    assert actual.shape == expected.shape
    assert actual.dtype == torch.float64
    assert_close(actual, expected)
    upstream = torch.randn(expected.shape, generator=gen(11), dtype=torch.float64)
    assert_close(grad_of(actual, xa, upstream=upstream), grad_of(expected, xr, upstream=upstream))


@pytest.mark.parametrize(("fn", "ref", "hp"), BINARY)
def test_binary_default_reduction_is_mean(fn, ref, hp):
    x, y = binary_inputs((5, 4), seed=12, avoid=(hp.get("margin", 2.0),))
    assert_close(fn(x, y, **hp), binary_ref(ref, x, y, hp).mean())


@pytest.mark.parametrize(("fn", "ref", "hp"), BINARY)
def test_binary_gradcheck(fn, ref, hp):
    x, y = binary_inputs((4, 5), seed=13, avoid=(hp.get("margin", 2.0),))
    for reduction in ("none", "mean", "sum"):
        assert torch.autograd.gradcheck(
            lambda z, r=reduction: fn(z, y, reduction=r, **hp), (leaf(x),)
        )


@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    gamma=st.floats(0.0, 5.0),
    alpha=st.one_of(st.none(), st.floats(0.0, 1.0)),
    seed=st.integers(0, 2**16),
)
def test_binary_focal_property(shape, gamma, alpha, seed):
    x, y = binary_inputs(shape, seed=seed)
    xa, xr = leaf(x), leaf(x)
    actual = binary_focal_loss(xa, y, gamma=gamma, alpha=alpha, reduction="sum")
    expected = ref_binary_focal(xr, y, gamma, alpha).sum()
    assert_close(actual, expected)
    assert_close(grad_of(actual, xa), grad_of(expected, xr))


def test_binary_focal_gamma_zero_is_bce():
    x, y = binary_inputs((6, 5), seed=14)
    xa, xr = leaf(x), leaf(x)
    actual = binary_focal_loss(xa, y, gamma=0.0, reduction="mean")
    expected = F.binary_cross_entropy_with_logits(xr, y)
    assert_close(actual, expected)
    assert_close(grad_of(actual, xa), grad_of(expected, xr))


def test_binary_focal_alpha_weights_the_two_terms():
    # gamma = 0: alpha * BCE on positives, (1 - alpha) * BCE on negatives.
    x, y = binary_inputs((6, 5), seed=15)
    alpha = 0.3
    y = (y > 0.5).double()
    pos_weight = alpha * y + (1 - alpha) * (1 - y)
    expected = F.binary_cross_entropy_with_logits(x, y, weight=pos_weight, reduction="sum")
    assert_close(binary_focal_loss(x, y, gamma=0.0, alpha=alpha, reduction="sum"), expected)


def test_binary_focal_gamma_one_is_binary_soft_truncation():
    x, y = binary_inputs((5, 6), seed=16)
    xa, xb = leaf(x), leaf(x)
    focal = binary_focal_loss(xa, y, gamma=1.0, reduction="none")
    truncated = binary_soft_truncated_loss(xb, y, k=1.0, reduction="none")
    assert_close(focal, truncated)
    assert_close(grad_of(focal.sum(), xa), grad_of(truncated.sum(), xb))


def test_binary_hard_truncated_margin_one_is_bce():
    x, y = binary_inputs((5, 6), seed=17, soft=False)
    assert_close(
        binary_hard_truncated_loss(x, y, margin=1.0, reduction="sum"),
        F.binary_cross_entropy_with_logits(x, y, reduction="sum"),
    )


def test_binary_soft_truncated_k_zero_is_half_bce():
    # sigmoid(0) = 1/2 on both terms.
    x, y = binary_inputs((5, 6), seed=18)
    assert_close(
        binary_soft_truncated_loss(x, y, k=0.0, reduction="mean"),
        0.5 * F.binary_cross_entropy_with_logits(x, y),
    )


# =============================================================================================
# EXACT
# =============================================================================================


def std_normal_cdf(z):
    return 0.5 * torch.erfc(-z / SQRT2)


def ref_exact_probability(x, t, sigma):
    """``P(t wins)`` by a dense trapezoid of ``∫ phi(u) prod_{j≠t} Phi(d_j + u) du``.

    ``d_j = (x_t - x_j) / sigma``; [-12, 12] with 6001 points. The integrand is smooth and
    decays like a Gaussian, so the trapezoid rule converges geometrically: the quadrature error
    is far below 1e-12 (checked against scipy's adaptive quadrature in a test below).
    """
    x = x.double()
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    sigma = sigma.reshape(-1, 1) if sigma.dim() else sigma
    d = (x.gather(1, t[:, None]) - x) / sigma  # [N, C]; column t is 0, masked below
    u = torch.linspace(-12.0, 12.0, 6001, dtype=torch.float64)
    cdf = std_normal_cdf(d[:, :, None] + u)  # [N, C, U]
    mask = F.one_hot(t, x.shape[1]).bool()[:, :, None]
    cdf = torch.where(mask, torch.ones_like(cdf), cdf)
    # log of the product: exact for tiny probabilities too
    log_integrand = torch.log(cdf).sum(1) - u**2 / 2 - 0.5 * math.log(2 * math.pi)
    h = u[1] - u[0]
    weights = torch.full_like(u, h)
    weights[0] = weights[-1] = h / 2
    return torch.logsumexp(log_integrand + torch.log(weights), dim=1).exp()


def ref_exact_log_probability(x, t, sigma):
    x = x.double()
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    sigma = sigma.reshape(-1, 1) if sigma.dim() else sigma
    d = (x.gather(1, t[:, None]) - x) / sigma
    u = torch.linspace(-12.0, 12.0, 6001, dtype=torch.float64)
    log_cdf = torch.special.log_ndtr(d[:, :, None] + u)
    mask = F.one_hot(t, x.shape[1]).bool()[:, :, None]
    log_cdf = torch.where(mask, torch.zeros_like(log_cdf), log_cdf)
    log_integrand = log_cdf.sum(1) - u**2 / 2 - 0.5 * math.log(2 * math.pi)
    h = u[1] - u[0]
    weights = torch.full_like(u, h)
    weights[0] = weights[-1] = h / 2
    return torch.logsumexp(log_integrand + torch.log(weights), dim=1)


def exact_inputs(n, c, seed, bound=5.0):
    g = gen(seed)
    x = (2 * torch.rand(n, c, generator=g, dtype=torch.float64) - 1) * bound
    t = torch.randint(0, c, (n,), generator=g)
    return x, t


def test_exact_reference_agrees_with_scipy_quad():
    # Checks the test's own references against an independent adaptive quadrature: P for
    # moderate margins, and log P where P is as small as 1e-13 (10 classes, logits in [-5, 5]).
    integrate = pytest.importorskip("scipy.integrate", reason="scipy cross-check of the reference")
    from scipy.special import log_ndtr

    for c, bound, sigma, seed in [(5, 3.0, 1.3, 20), (10, 5.0, 1.0, 34)]:
        x, t = exact_inputs(12 if c == 10 else 3, c, seed=seed, bound=bound)
        ref = ref_exact_probability(x, t, sigma)
        ref_log = ref_exact_log_probability(x, t, sigma)
        for row in range(x.shape[0]):
            d = ((x[row, t[row]] - x[row]) / sigma).tolist()
            others = [dj for j, dj in enumerate(d) if j != int(t[row])]

            def integrand(u, others=others):
                log_value = -u * u / 2 - 0.5 * math.log(2 * math.pi)
                return math.exp(log_value + sum(log_ndtr(dj + u) for dj in others))

            value, _ = integrate.quad(
                integrand, -math.inf, math.inf, epsabs=0.0, epsrel=1e-12, limit=200
            )
            assert abs(value - float(ref[row])) < 1e-10
            assert abs(math.log(value) - float(ref_log[row])) < 1e-10


@pytest.mark.parametrize("sigma", [1.0, 0.7, 2.5])
@pytest.mark.parametrize("log", [False, True])
def test_exact_two_classes_closed_form(sigma, log):
    x, t = exact_inputs(16, 2, seed=21)
    xa, xr = leaf(x), leaf(x)
    actual = exact_loss(xa, t, sigma=sigma, log=log, reduction="none")
    z = (xr.gather(1, t[:, None])[:, 0] - xr.gather(1, (1 - t)[:, None])[:, 0]) / (sigma * SQRT2)
    expected = -torch.special.log_ndtr(z) if log else 1 - std_normal_cdf(z)
    assert actual.shape == (16,)
    assert_close(actual, expected)
    assert_close(grad_of(actual.sum(), xa), grad_of(expected.sum(), xr))


def test_exact_two_classes_per_sample_sigma_closed_form():
    x, t = exact_inputs(10, 2, seed=22)
    sigma = 0.5 + 2 * torch.rand(10, generator=gen(23), dtype=torch.float64)
    xa, xr, sa, sr = leaf(x), leaf(x), leaf(sigma), leaf(sigma)
    actual = exact_loss(xa, t, sigma=sa, reduction="sum")
    diff = xr.gather(1, t[:, None])[:, 0] - xr.gather(1, (1 - t)[:, None])[:, 0]
    expected = (1 - std_normal_cdf(diff / (sr * SQRT2))).sum()
    assert_close(actual, expected)
    ga_x, ga_s = grad_of(actual, xa, sa)
    gr_x, gr_s = grad_of(expected, xr, sr)
    assert_close(ga_x, gr_x)
    assert_close(ga_s, gr_s)


@pytest.mark.parametrize("c", [3, 5, 10])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("sigma", [1.0, 2.0, "per-sample"])
def test_exact_many_classes_against_numerical_integral(c, log, sigma):
    x, t = exact_inputs(12, c, seed=24 + c)
    if sigma == "per-sample":
        sigma = 0.8 + torch.rand(12, generator=gen(25), dtype=torch.float64)
    xa, xr = leaf(x), leaf(x)
    sa = leaf(sigma) if isinstance(sigma, torch.Tensor) else sigma
    sr = leaf(sigma) if isinstance(sigma, torch.Tensor) else sigma
    actual = exact_loss(xa, t, sigma=sa, log=log, reduction="none")
    if log:
        expected = -ref_exact_log_probability(xr, t, sr)
    else:
        expected = 1 - ref_exact_probability(xr, t, sr)
    assert_close(actual, expected)
    upstream = torch.rand(12, generator=gen(26), dtype=torch.float64)
    if isinstance(sigma, torch.Tensor):
        ga_x, ga_s = grad_of(actual, xa, sa, upstream=upstream)
        gr_x, gr_s = grad_of(expected, xr, sr, upstream=upstream)
        assert_close(ga_s, gr_s)
    else:
        ga_x = grad_of(actual, xa, upstream=upstream)
        gr_x = grad_of(expected, xr, upstream=upstream)
    assert_close(ga_x, gr_x)


def test_exact_many_classes_against_monte_carlo():
    # P(argmax_j(x_j / sigma + e_j) = t) estimated with 1,000,000 seeded Gaussian draws per
    # row; tolerance 5 binomial standard errors (about 2.5e-3 at most).
    draws = 1_000_000
    x = torch.tensor(
        [[0.5, 0.0, -0.3, 1.2, 0.1], [2.0, -1.0, 0.0, 0.5, 1.5], [-1.0, 0.3, 0.2, 0.0, -0.4]],
        dtype=torch.float64,
    )
    t = torch.tensor([3, 4, 0])
    sigma = torch.tensor([1.0, 0.7, 1.5], dtype=torch.float64)
    g = gen(27)
    p_lib = 1 - exact_loss(x, t, sigma=sigma, reduction="none")
    for row in range(3):
        noise = torch.randn(draws, 5, generator=g, dtype=torch.float64)
        wins = ((x[row] / sigma[row] + noise).argmax(1) == t[row]).double().mean()
        se = math.sqrt(float(wins * (1 - wins)) / draws)
        assert abs(float(p_lib[row]) - float(wins)) <= 5 * se, (row, float(p_lib[row]), wins)


def test_exact_probabilities_sum_to_one_over_targets():
    # The events "class t wins" partition the sample space.
    x, _ = exact_inputs(6, 7, seed=28, bound=3.0)
    total = torch.zeros(6, dtype=torch.float64)
    for cls in range(7):
        t = torch.full((6,), cls)
        total += 1 - exact_loss(x, t, reduction="none")
    assert_close(total, torch.ones(6, dtype=torch.float64))


def test_exact_default_mean_and_ignore_index():
    x, t = exact_inputs(8, 4, seed=29)
    t[2] = -100
    t[5] = -100
    valid = t != -100
    xa, xr = leaf(x), leaf(x)
    actual = exact_loss(xa, t)
    per = 1 - ref_exact_probability(xr[valid], t[valid], 1.0)
    expected = per.mean()
    assert_close(actual, expected)
    g = grad_of(actual, xa)
    assert torch.all(g[~valid] == 0)
    assert_close(g[valid], grad_of(expected, xr)[valid])
    none = exact_loss(x, t, reduction="none")
    assert torch.all(none[~valid] == 0)
    assert_close(exact_loss(x, t, reduction="sum"), per.sum())


@pytest.mark.parametrize("log", [False, True])
def test_exact_gradcheck(log):
    x, t = exact_inputs(4, 5, seed=30, bound=2.0)
    sigma = 0.8 + torch.rand(4, generator=gen(31), dtype=torch.float64)
    for reduction in ("none", "mean", "sum"):
        assert torch.autograd.gradcheck(
            lambda z, s, r=reduction: exact_loss(z, t, sigma=s, log=log, reduction=r),
            (leaf(x), leaf(sigma)),
        )
        assert torch.autograd.gradcheck(
            lambda z, r=reduction: exact_loss(z, t, sigma=1.3, log=log, reduction=r), (leaf(x),)
        )


def test_exact_scaling_invariance():
    # P depends on x / sigma only.
    x, t = exact_inputs(6, 4, seed=32)
    assert_close(exact_loss(2 * x, t, sigma=2.0), exact_loss(x, t, sigma=1.0))


# =============================================================================================
# multi-label categorical cross-entropy
# =============================================================================================


def ref_multilabel(x, y, ignore_index=-100):
    x = x.double()
    keep = y != ignore_index
    y = torch.where(keep, y, torch.zeros_like(y))
    pos = (keep * y * torch.exp(-x)).sum(-1)
    neg = (keep * (1 - y) * torch.exp(x)).sum(-1)
    return torch.log(1 + pos) + torch.log(1 + neg)


def multilabel_inputs(n, k, seed, soft=True, scale=3.0):
    g = gen(seed)
    x = scale * torch.randn(n, k, generator=g, dtype=torch.float64)
    if soft:
        y = torch.rand(n, k, generator=g, dtype=torch.float64)
    else:
        y = torch.randint(0, 2, (n, k), generator=g).double()
    return x, y


@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_values_and_gradients(soft, reduction):
    x, y = multilabel_inputs(9, 6, seed=40, soft=soft)
    xa, xr = leaf(x), leaf(x)
    actual = multilabel_categorical_crossentropy(xa, y, reduction=reduction)
    expected = reduce(ref_multilabel(xr, y), reduction)
    assert actual.shape == expected.shape
    assert_close(actual, expected)
    upstream = torch.randn(expected.shape, generator=gen(41), dtype=torch.float64)
    assert_close(grad_of(actual, xa, upstream=upstream), grad_of(expected, xr, upstream=upstream))


def test_multilabel_hard_labels_are_softmax_ce_for_multilabel():
    # log(1 + sum_pos e^{-x}) + log(1 + sum_neg e^{x}) via logsumexp over a zero column.
    x, y = multilabel_inputs(5, 7, seed=42, soft=False)
    neg_inf = torch.full_like(x, -math.inf)
    pos = torch.where(y == 1, -x, neg_inf)
    neg = torch.where(y == 0, x, neg_inf)
    zero = torch.zeros(5, 1, dtype=torch.float64)
    expected = torch.logsumexp(torch.cat([zero, pos], 1), 1) + torch.logsumexp(
        torch.cat([zero, neg], 1), 1
    )
    assert_close(multilabel_categorical_crossentropy(x, y, reduction="none"), expected)


def test_multilabel_single_label_is_bce():
    x, y = multilabel_inputs(10, 1, seed=43, soft=False)
    assert_close(
        multilabel_categorical_crossentropy(x, y, reduction="mean"),
        F.binary_cross_entropy_with_logits(x, y),
    )


@pytest.mark.parametrize("ignore_index", [-100, -1])
def test_multilabel_ignore_index(ignore_index):
    x, y = multilabel_inputs(6, 5, seed=44)
    y[0, 1] = y[2, 0] = y[2, 4] = y[5, 3] = ignore_index
    xa, xr = leaf(x), leaf(x)
    actual = multilabel_categorical_crossentropy(xa, y, ignore_index=ignore_index, reduction="sum")
    expected = ref_multilabel(xr, y, ignore_index).sum()
    assert_close(actual, expected)
    g = grad_of(actual, xa)
    assert_close(g, grad_of(expected, xr))
    assert torch.all(g[y == ignore_index] == 0)
    # ignoring an entry is the same as removing its column
    keep = [0, 2, 3, 4]
    assert_close(
        multilabel_categorical_crossentropy(
            x[:1], y[:1], ignore_index=ignore_index, reduction="sum"
        ),
        multilabel_categorical_crossentropy(x[:1, keep], y[:1, keep], reduction="sum"),
    )


def test_multilabel_gradcheck():
    x, y = multilabel_inputs(4, 5, seed=45)
    y[1, 2] = -100
    for reduction in ("none", "mean", "sum"):
        assert torch.autograd.gradcheck(
            lambda z, r=reduction: multilabel_categorical_crossentropy(z, y, reduction=r),
            (leaf(x),),
        )


@given(n=st.integers(1, 6), k=st.integers(1, 8), seed=st.integers(0, 2**16), soft=st.booleans())
def test_multilabel_property(n, k, seed, soft):
    x, y = multilabel_inputs(n, k, seed=seed, soft=soft)
    xa, xr = leaf(x), leaf(x)
    actual = multilabel_categorical_crossentropy(xa, y, reduction="mean")
    expected = ref_multilabel(xr, y).mean()
    assert_close(actual, expected)
    assert_close(grad_of(actual, xa), grad_of(expected, xr))


# =============================================================================================
# n-by-m categorical cross-entropy
# =============================================================================================


def ref_nm(s, t, variant):
    s = s.double()
    if not t.is_floating_point():
        t = F.one_hot(t, s.shape[-1]).double()
    if variant == "pairwise":
        # diff[b, i, j, k] = s_ik - s_ij
        diff = s[:, :, None, :] - s[:, :, :, None]
        m = s.shape[-1]
        off = 1 - torch.eye(m, dtype=torch.float64)
        inner = (t[:, :, :, None] * torch.exp(diff) * off).sum(dim=(1, 3))  # [N, m]
    else:
        centered = -s + s.mean(-1, keepdim=True)
        inner = (t * torch.exp(centered)).sum(1)  # [N, m]
    return torch.log(1 + inner).sum(-1)


def nm_inputs(batch, n, m, seed, soft=True, scale=2.0):
    g = gen(seed)
    s = scale * torch.randn(batch, n, m, generator=g, dtype=torch.float64)
    if soft:
        t = torch.softmax(2 * torch.randn(batch, n, m, generator=g, dtype=torch.float64), -1)
    else:
        t = torch.randint(0, m, (batch, n), generator=g)
    return s, t


@pytest.mark.parametrize("variant", ["pairwise", "centered"])
@pytest.mark.parametrize("soft", [False, True], ids=["index", "soft"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nm_values_and_gradients(variant, soft, reduction):
    s, t = nm_inputs(7, 3, 4, seed=50, soft=soft)
    sa, sr = leaf(s), leaf(s)
    actual = nm_categorical_crossentropy(sa, t, variant=variant, reduction=reduction)
    expected = reduce(ref_nm(sr, t, variant), reduction)
    assert actual.shape == expected.shape
    assert_close(actual, expected)
    upstream = torch.randn(expected.shape, generator=gen(51), dtype=torch.float64)
    assert_close(grad_of(actual, sa, upstream=upstream), grad_of(expected, sr, upstream=upstream))


def test_nm_default_variant_is_pairwise_and_reduction_mean():
    s, t = nm_inputs(5, 2, 3, seed=52)
    assert_close(nm_categorical_crossentropy(s, t), ref_nm(s, t, "pairwise").mean())


def test_nm_index_targets_equal_one_hot():
    s, t = nm_inputs(6, 3, 5, seed=53, soft=False)
    one_hot = F.one_hot(t, 5).double()
    for variant in ("pairwise", "centered"):
        assert_close(
            nm_categorical_crossentropy(s, t, variant=variant, reduction="none"),
            nm_categorical_crossentropy(s, one_hot, variant=variant, reduction="none"),
        )


@pytest.mark.parametrize("soft", [False, True], ids=["index", "soft"])
def test_nm_pairwise_two_classes_is_multilabel(soft):
    s, t = nm_inputs(8, 5, 2, seed=54, soft=soft)
    y = t[..., 1] if soft else t.double()
    sa, sb = leaf(s), leaf(s)
    nm = nm_categorical_crossentropy(sa, t, variant="pairwise", reduction="none")
    ml = multilabel_categorical_crossentropy(sb[..., 1] - sb[..., 0], y, reduction="none")
    assert_close(nm, ml)
    assert_close(grad_of(nm.sum(), sa), grad_of(ml.sum(), sb))


@pytest.mark.parametrize("soft", [False, True], ids=["index", "soft"])
def test_nm_centered_two_classes_is_multilabel_at_half_logits(soft):
    s, t = nm_inputs(8, 5, 2, seed=55, soft=soft)
    y = t[..., 1] if soft else t.double()
    sa, sb = leaf(s), leaf(s)
    nm = nm_categorical_crossentropy(sa, t, variant="centered", reduction="none")
    ml = multilabel_categorical_crossentropy((sb[..., 1] - sb[..., 0]) / 2, y, reduction="none")
    assert_close(nm, ml)
    assert_close(grad_of(nm.sum(), sa), grad_of(ml.sum(), sb))


@pytest.mark.parametrize("shift", [0.0, 3.0])
def test_nm_centered_zero_gradient_at_log_t(shift):
    # For strictly positive soft labels the centered loss is stationary at s = log t (and at
    # s = log t + c_i: it is invariant to a constant per task).
    _, t = nm_inputs(4, 3, 5, seed=56)
    s = torch.log(t) + shift * torch.arange(3, dtype=torch.float64)[None, :, None]
    sa = leaf(s)
    g = grad_of(nm_categorical_crossentropy(sa, t, variant="centered", reduction="sum"), sa)
    assert_close(g, torch.zeros_like(g), tol=1e-12)
    # ... while a perturbation away from it has a non-zero gradient
    sb = leaf(s + 0.3 * torch.randn(s.shape, generator=gen(57), dtype=torch.float64))
    g = grad_of(nm_categorical_crossentropy(sb, t, variant="centered", reduction="sum"), sb)
    assert g.abs().max() > 1e-3


def test_nm_gradcheck():
    for soft in (False, True):
        s, t = nm_inputs(3, 2, 4, seed=58, soft=soft)
        for variant in ("pairwise", "centered"):
            for reduction in ("none", "mean", "sum"):
                assert torch.autograd.gradcheck(
                    lambda z, v=variant, r=reduction, tt=t: nm_categorical_crossentropy(
                        z, tt, variant=v, reduction=r
                    ),
                    (leaf(s),),
                )


@given(
    batch=st.integers(1, 4),
    n=st.integers(1, 4),
    m=st.integers(2, 5),
    variant=st.sampled_from(["pairwise", "centered"]),
    soft=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_nm_property(batch, n, m, variant, soft, seed):
    s, t = nm_inputs(batch, n, m, seed=seed, soft=soft)
    sa, sr = leaf(s), leaf(s)
    actual = nm_categorical_crossentropy(sa, t, variant=variant, reduction="sum")
    expected = ref_nm(sr, t, variant).sum()
    assert_close(actual, expected)
    assert_close(grad_of(actual, sa), grad_of(expected, sr))


# =============================================================================================
# NormFace: minimum scale, feature incay, the head
# =============================================================================================


def simplex(c):
    """``c`` unit vectors in R^c with pairwise cosine ``-1/(c-1)`` (the optimal arrangement)."""
    v = torch.eye(c, dtype=torch.float64) - 1.0 / c
    return v / v.norm(dim=1, keepdim=True)


@pytest.mark.parametrize("c", [2, 3, 10, 1000])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.99, 0.999])
def test_normface_min_scale_reaches_p_on_the_simplex(c, p):
    scale = normface_min_scale(c, p)
    assert isinstance(scale, float)
    assert scale == pytest.approx((c - 1) / c * math.log((c - 1) * p / (1 - p)), rel=1e-12)
    cos = torch.full((c,), -1.0 / (c - 1), dtype=torch.float64)
    cos[0] = 1.0
    p_t = torch.softmax(scale * cos, 0)[0]
    assert abs(float(p_t) - p) < 1e-9
    # a smaller scale cannot reach p (p_t increases with the scale)
    if scale > 0:
        assert float(torch.softmax(0.99 * scale * cos, 0)[0]) < p


@pytest.mark.parametrize("c", [3, 7])
def test_normface_min_scale_through_the_head(c):
    from lightning_losses import NormFaceHead

    p = 0.95
    head = NormFaceHead(c, c, scale=normface_min_scale(c, p)).double()
    with torch.no_grad():
        head.weight.copy_(simplex(c) * 2.5)  # the norm of the weights does not matter
    features = 0.7 * simplex(c)  # feature i points at class i
    probs = torch.softmax(head(features), 1)
    assert_close(probs.diagonal(), torch.full((c,), p, dtype=torch.float64), tol=1e-9)


def ref_incay(f):
    return 1.0 / (f.double() ** 2).sum(1)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_feature_incay(reduction):
    f = torch.randn(7, 5, generator=gen(60), dtype=torch.float64)
    fa, fr = leaf(f), leaf(f)
    actual = feature_incay(fa, reduction=reduction)
    expected = reduce(ref_incay(fr), reduction)
    assert actual.shape == expected.shape
    assert_close(actual, expected)
    assert_close(grad_of(actual.sum(), fa), grad_of(expected.sum(), fr))
    assert torch.autograd.gradcheck(lambda z: feature_incay(z, reduction=reduction), (leaf(f[:4]),))


def test_feature_incay_default_is_mean():
    f = torch.randn(6, 3, generator=gen(61), dtype=torch.float64)
    assert_close(feature_incay(f), ref_incay(f).mean())


def ref_head(features, weight, scale, target, margin, kind):
    fn = features / torch.sqrt((features**2).sum(1, keepdim=True))
    wn = weight / torch.sqrt((weight**2).sum(1, keepdim=True))
    cos = fn @ wn.T
    if target is None or kind == "normface":
        return scale * cos
    onehot = F.one_hot(target, weight.shape[0]).bool()
    if kind == "cosface":
        adjusted = cos - margin
    else:
        adjusted = torch.cos(torch.acos(cos) + margin)
    return scale * torch.where(onehot, adjusted, cos)


def make_head(kind, scale, margin, d=6, c=5, seed=62):
    from lightning_losses import NormFaceHead

    head = NormFaceHead(d, c, scale=scale, margin=margin, kind=kind).double()
    assert head.weight.shape == (c, d)
    with torch.no_grad():
        head.weight.copy_(torch.randn(c, d, generator=gen(seed), dtype=torch.float64))
    return head


HEADS = [
    pytest.param("normface", 0.0, id="normface"),
    pytest.param("cosface", 0.35, id="cosface"),
    pytest.param("arcface", 0.5, id="arcface"),
]


@pytest.mark.parametrize(("kind", "margin"), HEADS)
@pytest.mark.parametrize("scale", [None, 16.0], ids=["learnable", "fixed"])
@pytest.mark.parametrize("with_target", [False, True], ids=["no-target", "target"])
def test_head_values_and_gradients(kind, margin, scale, with_target):
    head = make_head(kind, scale, margin)
    features = torch.randn(8, 6, generator=gen(63), dtype=torch.float64)
    target = torch.randint(0, 5, (8,), generator=gen(64)) if with_target else None
    fa, fr = leaf(features), leaf(features)
    wr = leaf(head.weight)
    if scale is None:
        assert isinstance(head.scale, torch.Tensor)
        assert head.scale.requires_grad
        sr = leaf(head.scale)
    else:
        sr = scale
    actual = head(fa, target)
    expected = ref_head(fr, wr, sr, target, margin, kind)
    assert actual.shape == (8, 5)
    assert_close(actual, expected)

    upstream = torch.randn(8, 5, generator=gen(65), dtype=torch.float64)
    lib_inputs = [fa, head.weight] + ([head.scale] if scale is None else [])
    ref_inputs = [fr, wr] + ([sr] if scale is None else [])
    for ga, gr in zip(
        grad_of(actual, *lib_inputs, upstream=upstream),
        grad_of(expected, *ref_inputs, upstream=upstream),
        strict=True,
    ):
        assert_close(ga, gr)


@pytest.mark.parametrize(("kind", "margin"), HEADS)
def test_head_without_target_has_no_margin(kind, margin):
    head = make_head(kind, 10.0, margin)
    features = torch.randn(4, 6, generator=gen(66), dtype=torch.float64)
    expected = ref_head(features, head.weight.detach(), 10.0, None, 0.0, "normface")
    assert_close(head(features), expected)


def test_head_fixed_scale_is_not_a_parameter():
    head = make_head("normface", 12.0, 0.0)
    assert all(p is head.weight for p in head.parameters())
    learnable = make_head("normface", None, 0.0)
    assert any(p is learnable.scale for p in learnable.parameters())


@pytest.mark.parametrize(("kind", "margin"), HEADS)
@pytest.mark.parametrize("scale", [None, 8.0], ids=["learnable", "fixed"])
def test_head_gradcheck(kind, margin, scale):
    head = make_head(kind, scale, margin, d=4, c=3)
    features = torch.randn(4, 4, generator=gen(67), dtype=torch.float64)
    target = torch.randint(0, 3, (4,), generator=gen(68))
    params = [p for p in head.parameters()]

    def fn(f, *ps):
        # functional_call lets gradcheck perturb the parameters as inputs
        state = {name: value for (name, _), value in zip(head.named_parameters(), ps, strict=True)}
        return torch.func.functional_call(head, state, (f, target))

    inputs = (leaf(features), *(leaf(p) for p in params))
    assert torch.autograd.gradcheck(fn, inputs)
