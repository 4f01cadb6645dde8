"""Numerical stability: extreme logits in float32, and half precision (true and autocast).

Rows with the target logit at +1e4 and the others at -1e4 have ``p_t == 1`` exactly in floating
point; the reverse has ``p_t == 0`` (``log p_t = -2e4 - log(C-1)``). At those rows every loss has
a closed form written out below, for values and gradients, with
``d log p_t / dx = onehot(t) - softmax(x)``. Elsewhere (random logits up to +-1e4) values are
compared with a float64 reference written in log space, with a tolerance set by the input's
precision. Every hyper-parameter range the losses allow is covered, including
``0 < gamma < 1`` and ``gamma`` within 1e-7 of 1.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_losses.functional import (
    adaptive_focal_loss,
    binary_focal_loss,
    binary_hard_truncated_loss,
    binary_soft_truncated_loss,
    cross_entropy,
    exact_loss,
    focal_loss,
    gamma_cross_entropy,
    hard_truncated_loss,
    multilabel_categorical_crossentropy,
    nm_categorical_crossentropy,
    soft_accuracy_loss,
    soft_truncated_loss,
)

BIG = 1e4
C = 4
NEAR_ONE = 1 - 1e-7


def gen(seed):
    return torch.Generator().manual_seed(seed)


def eps(dtype):
    return torch.finfo(dtype).eps


def assert_close(actual, expected, rtol, atol):
    torch.testing.assert_close(
        actual.double(), expected.double(), rtol=rtol, atol=atol, check_dtype=False
    )


def assert_finite(*tensors):
    for tensor in tensors:
        assert torch.isfinite(tensor).all(), tensor


# --- the index-target losses and their closed forms at p_t = 1 and p_t = 0 -----------------

# (id, call(x, t, reduction), value at log p_t = lp with p_t = 0, factor f such that the
#  gradient at p_t = 0 is f * (onehot - softmax); value and gradient are 0 at p_t = 1)
INDEX_LOSSES = []


def _add(name, fn, value_at_zero, grad_factor_at_zero):
    INDEX_LOSSES.append(pytest.param(fn, value_at_zero, grad_factor_at_zero, id=name))


_add("ce", lambda x, t, r: cross_entropy(x, t, reduction=r), lambda lp: -lp, -1.0)
for _g in (0.0, 0.2, 0.5, 0.9, 1 - 1e-6, NEAR_ONE, 1.0):
    # -log(g + (1-g) p)/(1-g) at p = 0 is -log(g)/(1-g) (CE at g = 0, 1 at g = 1); the gradient
    # -w (onehot - softmax) vanishes there (w = p / (g + (1-g) p) = 0) except at g = 0.
    if _g == 0.0:
        value, factor = (lambda lp: -lp), -1.0
    elif _g == 1.0:
        value, factor = (lambda lp: torch.ones_like(lp)), 0.0
    else:
        value, factor = (lambda lp, g=_g: torch.full_like(lp, -math.log(g) / (1 - g))), 0.0
    _add(
        f"gamma_ce-{_g}",
        lambda x, t, r, g=_g: gamma_cross_entropy(x, t, gamma=g, reduction=r),
        value,
        factor,
    )
for _g in (0.0, 0.5, 1.0):
    # with a threshold b: -max(b, w) log p with w = 0 at p = 0 (w = 1 at g = 0)
    _factor = max(0.3, 1.0 if _g == 0.0 else 0.0)
    _add(
        f"gamma_ce-{_g}-threshold",
        lambda x, t, r, g=_g: gamma_cross_entropy(x, t, gamma=g, threshold=0.3, reduction=r),
        lambda lp, m=_factor: -m * lp,
        -_factor,
    )
_add(
    "soft_accuracy",
    lambda x, t, r: soft_accuracy_loss(x, t, reduction=r),
    lambda lp: torch.ones_like(lp),
    0.0,
)
for _g in (0.0, 0.2, 0.5, 1.0, 2.0, 5.0):
    # (1-p)^g = 1 at p = 0: the value is CE and the derivative in log p is -1.
    _add(
        f"focal-{_g}",
        lambda x, t, r, g=_g: focal_loss(x, t, gamma=g, reduction=r),
        lambda lp: -lp,
        -1.0,
    )
_add("adaptive_focal", lambda x, t, r: adaptive_focal_loss(x, t, reduction=r), lambda lp: -lp, -1.0)
for _m in (0.3, 0.5, 1.0):
    _add(
        f"hard_truncated-{_m}",
        lambda x, t, r, m=_m: hard_truncated_loss(x, t, margin=m, reduction=r),
        lambda lp: -lp,
        -1.0,
    )
for _k in (0.5, 1.0, 2.0):
    # softmax(-k x)_t = 1 at the p_t = 0 row and its derivative vanishes: CE value and gradient.
    _add(
        f"soft_truncated-{_k}",
        lambda x, t, r, k=_k: soft_truncated_loss(x, t, k=k, reduction=r),
        lambda lp: -lp,
        -1.0,
    )
for _s in (1.0, 0.5):
    # 1 - P is 1 at P = 0 with a zero gradient (Phi' underflows)
    _add(
        f"exact-{_s}",
        lambda x, t, r, s=_s: exact_loss(x, t, sigma=s, reduction=r),
        lambda lp: torch.ones_like(lp),
        0.0,
    )
_add(
    "exact-log",
    lambda x, t, r: exact_loss(x, t, log=True, reduction=r),
    None,  # -log P at P ~ exp(-1e8): checked for two classes in its own test
    None,
)


def extreme_rows(dtype=torch.float32):
    """Row 0: p_t == 1; row 1: p_t == 0; row 2: ties at +BIG; row 3: a +-BIG mix."""
    x = torch.tensor(
        [
            [BIG, -BIG, -BIG, -BIG],
            [BIG, BIG, -BIG, BIG],
            [BIG, BIG, BIG, BIG],
            [-BIG, BIG, BIG, -BIG],
        ]
    )
    t = torch.tensor([0, 2, 1, 3])
    return x.to(dtype), t


@pytest.mark.parametrize(("fn", "value_at_zero", "grad_factor"), INDEX_LOSSES)
def test_extreme_logits_float32_closed_forms(fn, value_at_zero, grad_factor):
    x, t = extreme_rows()
    xa = x.clone().requires_grad_()
    loss = fn(xa, t, "none")
    (grad,) = torch.autograd.grad(loss.sum(), xa)
    assert loss.dtype == torch.float32
    assert_finite(loss, grad)
    for reduction in ("mean", "sum"):
        xr = x.clone().requires_grad_()
        reduced = fn(xr, t, reduction)
        assert_finite(reduced, *torch.autograd.grad(reduced, xr))

    # p_t == 1: value 0 and gradient 0
    assert abs(float(loss.detach()[0])) <= 1e-6
    assert torch.all(grad[0].abs() <= 1e-6)
    if value_at_zero is None:
        return
    # p_t == 0: closed forms
    lp = torch.tensor(-2 * BIG - math.log(C - 1), dtype=torch.float64)
    assert_close(loss[1], value_at_zero(lp), rtol=1e-6, atol=1e-6)
    softmax = torch.tensor([1 / 3, 1 / 3, 0.0, 1 / 3], dtype=torch.float64)
    onehot = F.one_hot(t[1], C).double()
    assert_close(grad[1], grad_factor * (onehot - softmax), rtol=1e-6, atol=1e-6)


def stable_log_p(x, t):
    x = x.double()
    return x.gather(1, t[:, None])[:, 0] - torch.logsumexp(x, 1)


def stable_reference(kind, x, t, hp):
    """float64 reference in log space, for logits where the naive formula overflows."""
    lp = stable_log_p(x, t)
    q = -torch.expm1(lp)  # 1 - p_t without cancellation
    if kind == "gamma_ce":
        g = hp["gamma"]
        if g == 0.0:
            return -lp
        return -torch.log1p(-(1 - g) * q) / (1 - g) if g < 1 else q
    if kind == "focal":
        return -(q ** hp["gamma"]) * lp
    if kind == "ce":
        return -lp
    if kind == "soft_accuracy":
        return q
    if kind == "soft_truncated":
        r = torch.softmax(-hp["k"] * x.double(), 1).gather(1, t[:, None])[:, 0]
        return -r * lp
    raise AssertionError(kind)


STABLE_CASES = (
    [pytest.param("ce", cross_entropy, {}, id="ce")]
    + [pytest.param("soft_accuracy", soft_accuracy_loss, {}, id="soft_accuracy")]
    + [
        pytest.param("gamma_ce", gamma_cross_entropy, {"gamma": g}, id=f"gamma_ce-{g}")
        for g in (0.0, 0.2, 0.5, 0.9, NEAR_ONE, 1.0)
    ]
    + [
        pytest.param("focal", focal_loss, {"gamma": g}, id=f"focal-{g}")
        for g in (0.0, 0.2, 0.5, 2.0)
    ]
    + [
        pytest.param("soft_truncated", soft_truncated_loss, {"k": k}, id=f"soft_truncated-{k}")
        for k in (0.5, 1.0)
    ]
)


def random_large_logits(n, seed, dtype=torch.float32, bound=BIG):
    g = gen(seed)
    x = (2 * torch.rand(n, C, generator=g) - 1) * bound
    # a few rows with near-ties at large magnitude (p_t strictly between 0 and 1)
    x[: n // 4] = bound * 0.9 + torch.randn(n // 4, C, generator=g)
    t = torch.randint(0, C, (n,), generator=g)
    return x.to(dtype), t


@pytest.mark.parametrize(("kind", "fn", "hp"), STABLE_CASES)
def test_large_random_logits_float32(kind, fn, hp):
    x, t = random_large_logits(32, seed=1)
    xa = x.clone().requires_grad_()
    loss = fn(xa, t, reduction="none", **hp)
    (grad,) = torch.autograd.grad(loss.sum(), xa)
    assert_finite(loss, grad)
    # float32 logits of size 1e4 carry an absolute rounding of 1e4 * eps32 ~ 1e-3 into log p_t;
    # the loss is compared with that precision (relative 4 eps, absolute 4 eps * 1e4).
    expected = stable_reference(kind, x, t, hp)
    assert_close(loss, expected, rtol=4 * eps(torch.float32), atol=4 * eps(torch.float32) * BIG)


@pytest.mark.parametrize("gamma", [0.2, 0.5, 0.9])
def test_focal_gradient_at_p_one_is_zero_for_small_gamma(gamma):
    # d/dx of -(1-p)^g log p at p = 1 is 0 for every g >= 0, even where (1-p)^g has an infinite
    # derivative (0 < g < 1): autograd of the naive formula would give 0 * inf = NaN.
    x = torch.tensor([[BIG, -BIG, -BIG], [50.0, 0.0, 0.0], [20.0, 0.0, 0.0]])
    t = torch.tensor([0, 0, 0])
    # near p = 1 the gradient is (1-p)^g (g p log p / (1-p) - 1) (onehot - softmax)
    xd = x.double()
    p = torch.softmax(xd, 1)
    q = p[:, 1:].sum(1)  # 1 - p_t without cancellation
    deriv = q**gamma * (gamma * p[:, 0] * torch.log(p[:, 0]) / q - 1)
    expected = deriv[:, None] * (F.one_hot(t, 3).double() - p)
    for dtype in (torch.float32, torch.float64):
        xa = x.to(dtype).requires_grad_()
        loss = focal_loss(xa, t, gamma=gamma, reduction="none")
        (grad,) = torch.autograd.grad(loss.sum(), xa)
        assert_finite(loss, grad)
        assert torch.all(loss >= 0)
        assert torch.all(grad[0] == 0)
        # log p_t = x_t - logsumexp(x) carries an absolute rounding of eps * |x|, so only an
        # absolute accuracy is available where 1 - p_t is below it (it is 1e-22 at x_t = 50)
        assert_close(grad[1:], expected[1:], rtol=1e-6, atol=1e-6)
    # in float64, 1 - p_t = 4e-9 at x_t = 20 is resolved: the tiny gradient is right relatively
    xa = x.double().requires_grad_()
    (grad,) = torch.autograd.grad(focal_loss(xa, t, gamma=gamma, reduction="sum"), xa)
    assert_close(grad[2], expected[2], rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("target_logit", [BIG, -BIG, 30.0, -30.0])
def test_gamma_ce_near_one_float32(target_logit):
    # gamma = 1 - 1e-7 in float32 at p_t = 1 (value 0) and p_t ~ 0 (value -log(g)/(1-g) ~ 1),
    # and at p_t = 1 - 2e-13 / 2e-13: within float32 rounding of the float64 log1p form.
    g = NEAR_ONE
    x = torch.tensor([[target_logit, -target_logit, -target_logit]])
    t = torch.tensor([0])
    xa = x.clone().requires_grad_()
    loss = gamma_cross_entropy(xa, t, gamma=g, reduction="sum")
    (grad,) = torch.autograd.grad(loss, xa)
    assert_finite(loss, grad)
    lp = stable_log_p(x, t)
    expected = -torch.log1p(-(1 - g) * -torch.expm1(lp)) / (1 - g)
    assert_close(loss, expected.sum(), rtol=4 * eps(torch.float32), atol=1e-6)
    # gradient: -w (onehot - softmax) with w = p / (g + (1-g) p)
    p = torch.softmax(x.double(), 1)
    w = p[:, 0] / (g + (1 - g) * p[:, 0])
    expected_grad = -w[:, None] * (F.one_hot(t, 3).double() - p)
    assert_close(grad, expected_grad, rtol=1e-6, atol=1e-6)


def test_exact_log_extreme_two_classes_float32():
    # -log Phi(z) for z = (x_t - x_o) / sqrt 2 = -1.41e4: about 1e8, and its gradient ~ |z|/sqrt 2.
    x = torch.tensor([[-BIG, BIG], [BIG, -BIG], [-5.0, 5.0]])
    t = torch.tensor([0, 0, 0])
    xa = x.clone().requires_grad_()
    loss = exact_loss(xa, t, log=True, reduction="none")
    (grad,) = torch.autograd.grad(loss.sum(), xa)
    assert_finite(loss, grad)
    assert float(loss.detach()[0]) > 1e7
    assert float(grad[0, 0]) < 0 < float(grad[0, 1])
    assert abs(float(loss.detach()[1])) <= 1e-6
    assert torch.all(grad[1].abs() <= 1e-6)


def test_exact_log_two_classes_large_margins():
    # -log P for two classes is -log Phi((x_t - x_o) / (sigma sqrt 2)) at every margin, not only
    # where the quadrature nodes cover the integrand's mass; float64, margins 5 ... 2e4.
    margins = torch.tensor([5.0, 10.0, 20.0, 30.0, 100.0, 1000.0, 2 * BIG], dtype=torch.float64)
    x = torch.stack([torch.zeros_like(margins), margins], 1)
    t = torch.zeros(len(margins), dtype=torch.long)
    xa = x.clone().requires_grad_()
    loss = exact_loss(xa, t, log=True, reduction="none")
    (grad,) = torch.autograd.grad(loss.sum(), xa)
    xr = x.clone().requires_grad_()
    expected = -torch.special.log_ndtr((xr[:, 0] - xr[:, 1]) / math.sqrt(2))
    (expected_grad,) = torch.autograd.grad(expected.sum(), xr)
    assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    assert_close(grad, expected_grad, rtol=1e-6, atol=1e-6)


# --- the float-target losses -----------------------------------------------------------------


def log_sigmoid(x):
    """``log sigmoid(x) = min(x, 0) - log1p(e^{-|x|})`` in float64: no overflow anywhere."""
    x = x.double()
    return torch.clamp(x, max=0.0) - torch.log1p(torch.exp(-x.abs()))


def ref_binary(kind, x, y, hp):
    x, y = x.double(), y.double()
    ls, lns = log_sigmoid(x), log_sigmoid(-x)
    if kind == "focal":
        g = hp["gamma"]
        pos = -torch.exp(g * lns) * ls
        neg = -torch.exp(g * ls) * lns
    elif kind == "soft_truncated":
        k = hp["k"]
        pos = -torch.exp(log_sigmoid(-k * x)) * ls
        neg = -torch.exp(log_sigmoid(k * x)) * lns
    else:
        m = hp["margin"]
        pos = torch.where(torch.exp(ls) <= m, -ls, torch.zeros_like(ls))
        neg = torch.where(torch.exp(lns) <= m, -lns, torch.zeros_like(lns))
    return y * pos + (1 - y) * neg


BINARY_CASES = (
    [
        pytest.param("focal", binary_focal_loss, {"gamma": g}, id=f"binary_focal-{g}")
        for g in (0.0, 0.2, 0.5, 1.0, 2.0, 5.0)
    ]
    + [
        pytest.param("soft_truncated", binary_soft_truncated_loss, {"k": k}, id=f"bst-{k}")
        for k in (0.5, 1.0, 2.0)
    ]
    + [pytest.param("hard", binary_hard_truncated_loss, {"margin": 0.5}, id="bht")]
)


def binary_extreme(dtype=torch.float32):
    x = torch.tensor([BIG, -BIG, BIG, -BIG, BIG, -BIG, 30.0, -30.0])
    y = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 1.0, 0.0])
    return x.to(dtype), y.to(dtype)


@pytest.mark.parametrize(("kind", "fn", "hp"), BINARY_CASES)
def test_binary_extreme_float32(kind, fn, hp):
    x, y = binary_extreme()
    xa = x.clone().requires_grad_()
    loss = fn(xa, y, reduction="none", **hp)
    (grad,) = torch.autograd.grad(loss.sum(), xa)
    assert loss.dtype == torch.float32
    assert_finite(loss, grad)
    assert_close(loss, ref_binary(kind, x, y, hp), rtol=1e-6, atol=1e-6)
    xr = x.double().requires_grad_()
    (expected_grad,) = torch.autograd.grad(ref_binary(kind, xr, y, hp).sum(), xr)
    assert_close(grad, expected_grad, rtol=1e-6, atol=1e-6)


def test_multilabel_extreme_float32():
    x = torch.tensor([[BIG, -BIG, BIG, -BIG], [-BIG, BIG, -BIG, BIG], [BIG, BIG, -BIG, 0.0]])
    y = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0], [1.0, 0.5, 0.0, -100.0]])
    xa = x.clone().requires_grad_()
    loss = multilabel_categorical_crossentropy(xa, y, reduction="none")
    (grad,) = torch.autograd.grad(loss.sum(), xa)
    assert_finite(loss, grad)
    # reference: log(1 + sum y e^{-x}) + log(1 + sum (1-y) e^{x}) as logsumexp with a zero term
    xd, yd = x.double(), y.double()
    keep = yd != -100
    yk = torch.where(keep, yd, torch.zeros_like(yd))
    neg_inf = torch.tensor(-math.inf, dtype=torch.float64)
    a = torch.where(keep & (yk > 0), torch.log(yk) - xd, neg_inf)
    b = torch.where(keep & (yk < 1), torch.log1p(-yk) + xd, neg_inf)
    zero = torch.zeros(3, 1, dtype=torch.float64)
    expected = torch.logsumexp(torch.cat([zero, a], 1), 1) + torch.logsumexp(
        torch.cat([zero, b], 1), 1
    )
    assert_close(loss, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("variant", ["pairwise", "centered"])
def test_nm_extreme_float32(variant):
    s = torch.tensor([[[BIG, -BIG, -BIG], [-BIG, BIG, 0.0]], [[BIG, BIG, -BIG], [0.0, 0.0, 0.0]]])
    for t in (
        torch.tensor([[0, 1], [2, 0]]),
        torch.softmax(torch.randn(2, 2, 3, generator=gen(6)), -1),
    ):
        sa = s.clone().requires_grad_()
        loss = nm_categorical_crossentropy(sa, t, variant=variant, reduction="none")
        (grad,) = torch.autograd.grad(loss.sum(), sa)
        assert_finite(loss, grad)
    # sample 0 (targets 0 and 1): each target beats the others by at least 1e4, so every term
    # e^{s_ik - s_ij} underflows and the loss is 0; sample 1, task 0: the target (-1e4) is 2e4
    # below the two others.
    t = torch.tensor([[0, 1], [2, 0]])
    loss = nm_categorical_crossentropy(s, t, variant="pairwise", reduction="none")
    # pairwise sample 1: j=2 term log(1 + e^{2e4} + e^{2e4}) ~ 2e4 + log 2, j=0 term
    # log(1 + e^0 + e^0) (task 1), other j: t_ij = 0 -> log(1 + 0)
    expected = torch.tensor([0.0, 2 * BIG + math.log(2) + math.log(3)], dtype=torch.float64)
    assert_close(loss, expected, rtol=1e-6, atol=1e-6)


# --- half precision --------------------------------------------------------------------------

HALF = [torch.float16, torch.bfloat16]


def half_tolerance(dtype, scale):
    """Tolerance of a quantity of size ``scale`` computed from ``dtype`` inputs: 4 ulps."""
    return 4 * eps(dtype), 4 * eps(dtype) * scale


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(("fn", "value_at_zero", "grad_factor"), INDEX_LOSSES)
def test_half_inputs_extreme(dtype, fn, value_at_zero, grad_factor):
    x, t = extreme_rows(dtype)
    xa = x.clone().requires_grad_()
    loss = fn(xa, t, "none")
    (grad,) = torch.autograd.grad(loss.sum(), xa)
    assert loss.dtype == torch.float32
    assert grad.dtype == dtype
    assert_finite(loss, grad)
    assert abs(float(loss.detach()[0])) <= 1e-6
    assert torch.all(grad[0].abs() <= 1e-6)
    if value_at_zero is not None:
        # x is exactly +-1e4 in float16; bfloat16 rounds 1e4 to a nearby value B
        b = float(x[0, 0])
        lp = torch.tensor(-2 * b - math.log(C - 1), dtype=torch.float64)
        rtol, atol = half_tolerance(dtype, 1.0)
        assert_close(loss[1], value_at_zero(lp), rtol=rtol, atol=atol)
        softmax = torch.tensor([1 / 3, 1 / 3, 0.0, 1 / 3], dtype=torch.float64)
        onehot = F.one_hot(t[1], C).double()
        assert_close(grad[1], grad_factor * (onehot - softmax), rtol=rtol, atol=atol)
    for reduction in ("mean", "sum"):
        xr = x.clone().requires_grad_()
        reduced = fn(xr, t, reduction)
        assert reduced.dtype == torch.float32
        assert_finite(reduced, *torch.autograd.grad(reduced, xr))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(("kind", "fn", "hp"), STABLE_CASES)
def test_half_inputs_random(dtype, kind, fn, hp):
    # moderate logits and large ones (+-1e4, which float16 holds); the reference is the float64
    # formula on the same half values; tolerance 4 ulps of the input dtype, relative to the
    # size of log p_t (a half computation of log p_t is only that accurate).
    for bound in (4.0, BIG):
        x, t = random_large_logits(32, seed=2, dtype=dtype, bound=bound)
        xa = x.clone().requires_grad_()
        loss = fn(xa, t, reduction="none", **hp)
        (grad,) = torch.autograd.grad(loss.sum(), xa)
        assert loss.dtype == torch.float32
        assert_finite(loss, grad)
        expected = stable_reference(kind, x, t, hp)
        rtol, atol = half_tolerance(dtype, 1.0)
        assert_close(loss, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(("kind", "fn", "hp"), BINARY_CASES)
def test_half_inputs_binary(dtype, kind, fn, hp):
    x, y = binary_extreme(dtype)
    xa = x.clone().requires_grad_()
    loss = fn(xa, y, reduction="none", **hp)
    (grad,) = torch.autograd.grad(loss.sum(), xa)
    assert loss.dtype == torch.float32
    assert_finite(loss, grad)
    rtol, atol = half_tolerance(dtype, 1.0)
    assert_close(loss, ref_binary(kind, x, y, hp), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", HALF)
def test_half_inputs_multilabel_nm_exact(dtype):
    x = torch.tensor([[BIG, -BIG, BIG, -BIG], [-BIG, BIG, -BIG, BIG], [1.0, 2.0, -3.0, 0.5]])
    y = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0], [1.0, 0.5, 0.0, 1.0]])
    tensors = []
    xa = x.to(dtype).requires_grad_()
    loss = multilabel_categorical_crossentropy(xa, y.to(dtype), reduction="none")
    tensors += [loss, *torch.autograd.grad(loss.sum(), xa)]
    assert loss.dtype == torch.float32
    for variant in ("pairwise", "centered"):
        sa = x.reshape(3, 2, 2).to(dtype).requires_grad_()
        loss = nm_categorical_crossentropy(
            sa, torch.tensor([[0, 1], [1, 0], [0, 0]]), variant=variant, reduction="none"
        )
        assert loss.dtype == torch.float32
        tensors += [loss, *torch.autograd.grad(loss.sum(), sa)]
    for log in (False, True):
        xe = x.to(dtype).requires_grad_()
        loss = exact_loss(xe, torch.tensor([0, 0, 1]), log=log, reduction="none")
        assert loss.dtype == torch.float32
        tensors += [loss, *torch.autograd.grad(loss.sum(), xe)]
    assert_finite(*tensors)


AUTOCAST_CASES = [
    pytest.param(fn, id=name)
    for name, fn in [
        ("ce", lambda z, t: cross_entropy(z, t, reduction="sum")),
        ("gamma_ce-0.2", lambda z, t: gamma_cross_entropy(z, t, gamma=0.2, reduction="sum")),
        ("gamma_ce-0.5", lambda z, t: gamma_cross_entropy(z, t, gamma=0.5, reduction="sum")),
        ("gamma_ce-near1", lambda z, t: gamma_cross_entropy(z, t, gamma=NEAR_ONE, reduction="sum")),
        ("gamma_ce-1", lambda z, t: gamma_cross_entropy(z, t, gamma=1.0, reduction="sum")),
        (
            "gamma_ce-threshold",
            lambda z, t: gamma_cross_entropy(z, t, gamma=0.5, threshold=0.3, reduction="sum"),
        ),
        ("soft_accuracy", lambda z, t: soft_accuracy_loss(z, t, reduction="sum")),
        ("focal-0.2", lambda z, t: focal_loss(z, t, gamma=0.2, reduction="sum")),
        ("focal-0.5", lambda z, t: focal_loss(z, t, gamma=0.5, reduction="sum")),
        ("focal-2", lambda z, t: focal_loss(z, t, gamma=2.0, reduction="sum")),
        ("adaptive_focal", lambda z, t: adaptive_focal_loss(z, t, reduction="sum")),
        ("hard_truncated", lambda z, t: hard_truncated_loss(z, t, reduction="sum")),
        ("soft_truncated", lambda z, t: soft_truncated_loss(z, t, reduction="sum")),
        ("exact", lambda z, t: exact_loss(z, t, reduction="sum")),
        ("exact-log", lambda z, t: exact_loss(z, t, log=True, reduction="sum")),
        (
            "multilabel",
            lambda z, t: multilabel_categorical_crossentropy(
                z, F.one_hot(t, C).float(), reduction="sum"
            ),
        ),
        ("binary_focal-0.5", lambda z, t: binary_focal_loss(z, F.one_hot(t, C).float(), gamma=0.5)),
        (
            "binary_soft_truncated",
            lambda z, t: binary_soft_truncated_loss(z, F.one_hot(t, C).float()),
        ),
        (
            "binary_hard_truncated",
            lambda z, t: binary_hard_truncated_loss(z, F.one_hot(t, C).float()),
        ),
        (
            "nm",
            lambda z, t: nm_categorical_crossentropy(
                z.reshape(-1, 2, 2), torch.stack([t % 2, t // 2], 1), reduction="sum"
            ),
        ),
    ]
]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("fn", AUTOCAST_CASES)
def test_autocast(dtype, fn):
    # logits produced by a linear layer under autocast (half precision), extreme and random rows
    x, t = extreme_rows()
    xr, tr = random_large_logits(8, seed=3)
    h = torch.cat([x, xr, 3 * torch.randn(4, C, generator=gen(4))])
    t = torch.cat([t, tr, torch.tensor([0, 1, 2, 3])])
    layer = torch.nn.Linear(C, C, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(C))
    with torch.autocast("cpu", dtype=dtype):
        logits = layer(h)
        assert logits.dtype == dtype
        logits.retain_grad()
        loss = fn(logits, t)
    assert loss.dtype == torch.float32
    loss.backward()
    # (the layer's own weight gradient is a half-precision matmul of 1e4-sized activations, whose
    # overflow is not the loss's business: the loss's output and input gradient are checked)
    assert_finite(loss, logits.grad)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(("kind", "fn", "hp"), STABLE_CASES)
def test_autocast_values(dtype, kind, fn, hp):
    x, t = random_large_logits(16, seed=5, bound=8.0)
    layer = torch.nn.Linear(C, C, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(C))
    with torch.autocast("cpu", dtype=dtype):
        logits = layer(x)
        loss = fn(logits, t, reduction="none", **hp)
    assert loss.dtype == torch.float32
    rtol, atol = half_tolerance(dtype, 1.0)
    assert_close(loss, stable_reference(kind, logits.detach(), t, hp), rtol=rtol, atol=atol)
