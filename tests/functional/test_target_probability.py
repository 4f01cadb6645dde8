"""The target-probability family against plain float64 formulas: values, gradients, reductions.

Every reference below is written from the formula in DESIGN.md ("The losses") in float64 with
``log p_t = x_t - log(sum_j exp(x_j))`` computed naively, on moderate logits where the naive
formula is exact to rounding. Gradients are compared with the autograd gradient of that
reference formula.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from lightning_losses.functional import (
    adaptive_focal_loss,
    cross_entropy,
    focal_loss,
    gamma_cross_entropy,
    hard_truncated_loss,
    soft_accuracy_loss,
)

TOL = 1e-6


def assert_close(actual, expected, tol=TOL):
    torch.testing.assert_close(
        actual.double(), expected.double(), rtol=tol, atol=tol, check_dtype=False
    )


# --- plain float64 references --------------------------------------------------------------


def ref_log_p(x, t, ignore_index=-100):
    """``x_t - log(sum_j exp x_j)`` along dim 1, float64, written naively; 0 where ignored."""
    x = x.double()
    log_z = torch.log(torch.exp(x).sum(dim=1))
    safe = torch.where(t == ignore_index, torch.zeros_like(t), t)
    x_t = x.gather(1, safe.unsqueeze(1)).squeeze(1)
    return x_t - log_z


def ref_ce(p):
    return -torch.log(p)


def ref_gamma_ce(p, gamma=0.5, threshold=0.0):
    if threshold > 0:
        w = (p / (gamma + (1 - gamma) * p)).detach()
        return -torch.clamp(w, min=threshold) * torch.log(p)
    if gamma == 1.0:
        return 1 - p
    return -torch.log(gamma + (1 - gamma) * p) / (1 - gamma)


def ref_soft_accuracy(p):
    return 1 - p


def ref_focal(p, gamma=2.0):
    return -((1 - p) ** gamma) * torch.log(p)


def ref_adaptive_focal(p, thresholds=(0.2,), gammas=(5.0, 3.0)):
    k = (p.detach().unsqueeze(-1) >= torch.tensor(thresholds, dtype=p.dtype)).sum(-1)
    gamma = torch.tensor(gammas, dtype=p.dtype)[k]
    return -((1 - p) ** gamma) * torch.log(p)


def ref_hard_truncated(p, margin=0.5):
    return torch.where(p <= margin, -torch.log(p), torch.zeros_like(p))


# name -> (function, reference phi(p, **hp), name of the per-class factor, hyper-parameter sets)
FAMILY = {
    "cross_entropy": (cross_entropy, ref_ce, "weight", [{}]),
    "gamma_cross_entropy": (
        gamma_cross_entropy,
        ref_gamma_ce,
        "weight",
        [
            {"gamma": 0.0},
            {"gamma": 0.2},
            {"gamma": 0.5},
            {"gamma": 0.9},
            {"gamma": 1.0},
            {"gamma": 0.5, "threshold": 0.3},
            {"gamma": 0.0, "threshold": 0.1},
            {"gamma": 1.0, "threshold": 0.4},
        ],
    ),
    "soft_accuracy_loss": (soft_accuracy_loss, ref_soft_accuracy, "weight", [{}]),
    "focal_loss": (
        focal_loss,
        ref_focal,
        "alpha",
        [{"gamma": 0.0}, {"gamma": 0.2}, {"gamma": 0.5}, {"gamma": 1.0}, {"gamma": 2.0}],
    ),
    "adaptive_focal_loss": (
        adaptive_focal_loss,
        ref_adaptive_focal,
        "alpha",
        [{}, {"thresholds": (0.2, 0.5), "gammas": (5.0, 3.0, 1.0)}],
    ),
    "hard_truncated_loss": (
        hard_truncated_loss,
        ref_hard_truncated,
        "weight",
        [{}, {"margin": 0.3}, {"margin": 0.8}],
    ),
}

CASES = [
    pytest.param(name, hp, id=f"{name}-{hp}")
    for name, (_, _, _, hps) in FAMILY.items()
    for hp in hps
]
NAMES = list(FAMILY)

# Probability values at which a loss switches branch (tests keep p_t away from them so that
# float rounding cannot pick different branches in the library and in the reference).
BOUNDARIES = {
    "adaptive_focal_loss": lambda hp: hp.get("thresholds", (0.2,)),
    "hard_truncated_loss": lambda hp: (hp.get("margin", 0.5),),
}


def ref_loss(name, x, t, hp, factor=None, ignore_index=-100, reduction="none"):
    """The reference loss: ``factor_t * phi(p_t)`` zeroed where ignored, then reduced."""
    _, phi, factor_kind, _ = FAMILY[name]
    valid = t != ignore_index
    p = torch.exp(ref_log_p(x, t, ignore_index))
    element = phi(p, **hp)
    if factor is not None:
        safe = torch.where(valid, t, torch.zeros_like(t))
        element = element * factor.double()[safe]
    element = torch.where(valid, element, torch.zeros_like(element))
    if reduction == "none":
        return element
    if reduction == "sum":
        return element.sum()
    if factor is not None and factor_kind == "weight":
        safe = torch.where(valid, t, torch.zeros_like(t))
        return element.sum() / (factor.double()[safe] * valid).sum()
    return element.sum() / valid.sum()


def call(name, x, t, hp, factor=None, **kwargs):
    fn, _, factor_kind, _ = FAMILY[name]
    if factor is not None:
        kwargs[factor_kind] = factor
    return fn(x, t, **hp, **kwargs)


def make_inputs(shape, seed, scale=3.0, ignore_index=-100, n_ignored=1, boundaries=()):
    """float64 logits ``shape = [N, C, *]`` and targets, some ignored, p_t away from boundaries."""
    g = torch.Generator().manual_seed(seed)
    num_classes = shape[1]
    target_shape = (shape[0], *shape[2:])
    for _ in range(100):
        x = scale * torch.randn(shape, generator=g, dtype=torch.float64)
        t = torch.randint(0, num_classes, target_shape, generator=g)
        p = torch.exp(ref_log_p(x, t))
        if all((p - b).abs().min() > 1e-3 for b in boundaries):
            break
    else:  # pragma: no cover - the generator would have to be very unlucky
        raise AssertionError("could not draw inputs away from the branch boundaries")
    flat = t.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)[:n_ignored]
    flat[idx] = ignore_index
    return x, t


def boundaries_of(name, hp):
    return tuple(BOUNDARIES.get(name, lambda hp: ())(hp))


def grad_of(value, x, upstream=None):
    if upstream is not None:
        value = (value * upstream).sum()
    (g,) = torch.autograd.grad(value, x)
    return g


def positive_vector(n, seed):
    g = torch.Generator().manual_seed(seed)
    return 0.25 + torch.rand(n, generator=g, dtype=torch.float64)


# --- values and gradients --------------------------------------------------------------------


@pytest.mark.parametrize(("name", "hp"), CASES)
@pytest.mark.parametrize("with_factor", [False, True], ids=["plain", "factor"])
def test_per_element_values_and_gradients(name, hp, with_factor):
    x, t = make_inputs((7, 5), seed=1, boundaries=boundaries_of(name, hp), n_ignored=2)
    factor = positive_vector(5, seed=2) if with_factor else None
    upstream = torch.randn(7, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    xa = x.clone().requires_grad_()
    actual = call(name, xa, t, hp, factor, reduction="none")
    xr = x.clone().requires_grad_()
    expected = ref_loss(name, xr, t, hp, factor, reduction="none")

    assert actual.shape == t.shape
    assert actual.dtype == torch.float64
    assert_close(actual, expected)
    assert_close(grad_of(actual, xa, upstream), grad_of(expected, xr, upstream))


@pytest.mark.parametrize(("name", "hp"), CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("with_factor", [False, True], ids=["plain", "factor"])
def test_reductions_values_and_gradients(name, hp, reduction, with_factor):
    x, t = make_inputs((9, 4), seed=4, boundaries=boundaries_of(name, hp), n_ignored=3)
    factor = positive_vector(4, seed=5) if with_factor else None

    xa = x.clone().requires_grad_()
    actual = call(name, xa, t, hp, factor, reduction=reduction)
    xr = x.clone().requires_grad_()
    expected = ref_loss(name, xr, t, hp, factor, reduction=reduction)

    assert actual.shape == ()
    assert_close(actual, expected)
    assert_close(grad_of(actual, xa), grad_of(expected, xr))


@pytest.mark.parametrize("name", NAMES)
def test_default_reduction_is_mean(name):
    x, t = make_inputs((6, 3), seed=6, boundaries=boundaries_of(name, {}))
    fn = FAMILY[name][0]
    assert_close(fn(x, t), ref_loss(name, x, t, {}, reduction="mean"))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("ignore_index", [-1, 2])
def test_custom_ignore_index(name, ignore_index):
    # ignore_index=2 is also a valid class: targets equal to 2 are ignored, not class 2.
    x, t = make_inputs(
        (10, 5), seed=7, ignore_index=ignore_index, n_ignored=3, boundaries=boundaries_of(name, {})
    )
    xa = x.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    for reduction in ("none", "mean", "sum"):
        actual = call(name, xa, t, {}, ignore_index=ignore_index, reduction=reduction)
        expected = ref_loss(name, xr, t, {}, ignore_index=ignore_index, reduction=reduction)
        assert_close(actual, expected)
        assert_close(grad_of(actual.sum(), xa), grad_of(expected.sum(), xr))
    # ignored rows get no gradient at all
    g = grad_of(call(name, xa, t, {}, ignore_index=ignore_index, reduction="sum"), xa)
    assert torch.all(g[t == ignore_index] == 0)


@pytest.mark.parametrize(("name", "hp"), CASES)
@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 2, 3)], ids=["NCL", "NCHW"])
def test_extra_dimensions(name, hp, shape):
    x, t = make_inputs(shape, seed=8, boundaries=boundaries_of(name, hp), n_ignored=2)
    factor = positive_vector(shape[1], seed=9)
    upstream = torch.randn(t.shape, generator=torch.Generator().manual_seed(10)).double()
    for fac in (None, factor):
        xa = x.clone().requires_grad_()
        xr = x.clone().requires_grad_()
        actual = call(name, xa, t, hp, fac, reduction="none")
        expected = ref_loss(name, xr, t, hp, fac, reduction="none")
        assert actual.shape == t.shape
        assert_close(actual, expected)
        assert_close(grad_of(actual, xa, upstream), grad_of(expected, xr, upstream))
        for reduction in ("mean", "sum"):
            xa = x.clone().requires_grad_()
            xr = x.clone().requires_grad_()
            actual = call(name, xa, t, hp, fac, reduction=reduction)
            expected = ref_loss(name, xr, t, hp, fac, reduction=reduction)
            assert_close(actual, expected)
            assert_close(grad_of(actual, xa), grad_of(expected, xr))


@pytest.mark.parametrize("name", NAMES)
def test_extra_dimensions_match_flattened_rows(name):
    # [N, C, L] is the same loss as the [N*L, C] rows it contains.
    x, t = make_inputs((3, 4, 5), seed=11, boundaries=boundaries_of(name, {}), n_ignored=2)
    flat_x = x.movedim(1, -1).reshape(-1, 4)
    flat_t = t.reshape(-1)
    for reduction in ("mean", "sum"):
        assert_close(
            call(name, x, t, {}, reduction=reduction),
            ref_loss(name, flat_x, flat_t, {}, reduction=reduction),
        )


# With a threshold, gamma-CE's gradient is by definition not the derivative of its value (w is
# held constant), so gradcheck does not apply; its gradient is tested against the formula above
# and in test_threshold_gradient_is_max_b_w_times_cross_entropy_gradient.
GRADCHECK_CASES = [case for case in CASES if "threshold" not in case.values[1]]


@pytest.mark.parametrize(("name", "hp"), GRADCHECK_CASES)
def test_gradcheck(name, hp):
    x, t = make_inputs((4, 5), seed=12, boundaries=boundaries_of(name, hp), n_ignored=1)
    alpha = positive_vector(5, seed=13)
    x = x.clone().requires_grad_()
    for reduction in ("none", "mean", "sum"):
        for fac in (None, alpha):
            assert torch.autograd.gradcheck(
                lambda z, r=reduction, f=fac: call(name, z, t, hp, f, reduction=r), (x,)
            )


# --- property tests over random shapes and hyper-parameters --------------------------------


shapes = st.tuples(
    st.integers(1, 6), st.integers(2, 7), st.lists(st.integers(1, 3), max_size=2)
).map(lambda s: (s[0], s[1], *s[2]))


@given(shape=shapes, gamma=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_gamma_cross_entropy_property(shape, gamma, seed):
    x, t = make_inputs(shape, seed=seed, n_ignored=0)
    xa = x.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    actual = gamma_cross_entropy(xa, t, gamma=gamma, reduction="none")
    if gamma < 1.0:
        # log1p form of the same formula: exact in float64 for every gamma < 1.
        p = torch.exp(ref_log_p(xr, t))
        expected = -torch.log1p(-(1 - gamma) * (1 - p)) / (1 - gamma)
    else:
        expected = 1 - torch.exp(ref_log_p(xr, t))
    assert_close(actual, expected)
    upstream = torch.rand(t.shape, generator=torch.Generator().manual_seed(seed)).double()
    assert_close(grad_of(actual, xa, upstream), grad_of(expected, xr, upstream))


@given(shape=shapes, gamma=st.floats(0.0, 5.0), seed=st.integers(0, 2**16))
def test_focal_property(shape, gamma, seed):
    x, t = make_inputs(shape, seed=seed, n_ignored=0)
    alpha = positive_vector(shape[1], seed=seed + 1)
    xa = x.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    actual = focal_loss(xa, t, gamma=gamma, alpha=alpha, reduction="mean")
    expected = ref_loss("focal_loss", xr, t, {"gamma": gamma}, alpha, reduction="mean")
    assert_close(actual, expected)
    assert_close(grad_of(actual, xa), grad_of(expected, xr))


@given(
    shape=shapes,
    gammas=st.lists(st.floats(0.0, 6.0), min_size=3, max_size=3),
    cut=st.floats(0.05, 0.45),
    seed=st.integers(0, 2**16),
)
def test_adaptive_focal_property(shape, gammas, cut, seed):
    thresholds = (cut, cut + 0.4)
    hp = {"thresholds": thresholds, "gammas": tuple(gammas)}
    x, t = make_inputs(shape, seed=seed, n_ignored=0, boundaries=thresholds)
    xa = x.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    actual = adaptive_focal_loss(xa, t, reduction="sum", **hp)
    expected = ref_loss("adaptive_focal_loss", xr, t, hp, reduction="sum")
    assert_close(actual, expected)
    assert_close(grad_of(actual, xa), grad_of(expected, xr))


# --- identities and limits -------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_matches_torch(reduction):
    x, t = make_inputs((8, 6), seed=14, n_ignored=2)
    weight = positive_vector(6, seed=15)
    for kwargs in ({}, {"weight": weight}):
        xa = x.clone().requires_grad_()
        xr = x.clone().requires_grad_()
        actual = cross_entropy(xa, t, reduction=reduction, **kwargs)
        expected = F.cross_entropy(xr, t, reduction=reduction, **kwargs)
        assert_close(actual, expected)
        assert_close(grad_of(actual.sum(), xa), grad_of(expected.sum(), xr))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_gamma_zero_is_cross_entropy(reduction):
    x, t = make_inputs((8, 6), seed=16, n_ignored=2)
    weight = positive_vector(6, seed=17)
    for kwargs in ({}, {"weight": weight}):
        xa = x.clone().requires_grad_()
        xr = x.clone().requires_grad_()
        actual = gamma_cross_entropy(xa, t, gamma=0.0, reduction=reduction, **kwargs)
        expected = F.cross_entropy(xr, t, reduction=reduction, **kwargs)
        assert_close(actual, expected)
        assert_close(grad_of(actual.sum(), xa), grad_of(expected.sum(), xr))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_focal_gamma_zero_is_cross_entropy(reduction):
    x, t = make_inputs((8, 6, 3), seed=18, n_ignored=4)
    xa = x.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    actual = focal_loss(xa, t, gamma=0.0, reduction=reduction)
    expected = F.cross_entropy(xr, t, reduction=reduction)
    assert_close(actual, expected)
    assert_close(grad_of(actual.sum(), xa), grad_of(expected.sum(), xr))


def test_gamma_one_is_one_minus_p_and_soft_accuracy():
    x, t = make_inputs((8, 6), seed=19, n_ignored=0)
    xa = x.clone().requires_grad_()
    xb = x.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    at_one = gamma_cross_entropy(xa, t, gamma=1.0, reduction="none")
    soft = soft_accuracy_loss(xb, t, reduction="none")
    expected = 1 - torch.softmax(xr, dim=1).gather(1, t[:, None])[:, 0]
    assert_close(at_one, expected)
    assert_close(soft, expected)
    expected_grad = grad_of(expected.sum(), xr)
    assert_close(grad_of(at_one.sum(), xa), expected_grad)
    assert_close(grad_of(soft.sum(), xb), expected_grad)


@pytest.mark.parametrize("gamma", [1 - 1e-7, 1 - 1e-9, 1 - 1e-12])
def test_gamma_near_one_tends_to_one_minus_p(gamma):
    # -log(1 - a q)/a = q + a q^2/2 + ...: within a/2 <= 5e-8 of q = 1 - p_t.
    x, t = make_inputs((8, 6), seed=20, n_ignored=0)
    xa = x.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    near = gamma_cross_entropy(xa, t, gamma=gamma, reduction="none")
    limit = 1 - torch.exp(ref_log_p(xr, t))
    assert_close(near, limit)
    assert_close(grad_of(near.sum(), xa), grad_of(limit.sum(), xr))


def test_gamma_near_one_closed_form_is_continuous():
    # At gamma = 0.999999 the closed form differs from 1 - p_t by a q^2 / 2 <= 5e-7.
    x, t = make_inputs((16, 6), seed=21, n_ignored=0, scale=2.0)
    gamma = 0.999999
    near = gamma_cross_entropy(x, t, gamma=gamma, reduction="none")
    at_one = gamma_cross_entropy(x, t, gamma=1.0, reduction="none")
    assert_close(near, at_one)
    q = 1 - torch.exp(ref_log_p(x, t))
    # the second-order term is there: the function does not just switch to 1 - p
    second_order = (1 - gamma) * q**2 / 2 + (1 - gamma) ** 2 * q**3 / 3
    assert_close(near - at_one, second_order, tol=1e-10)


def test_gamma_cross_entropy_monotone_in_gamma():
    # d/dgamma of -log(gamma + (1-gamma) p)/(1-gamma) is <= 0: the loss interpolates CE -> 1-p.
    x, t = make_inputs((8, 5), seed=22, n_ignored=0)
    gammas = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0]
    values = torch.stack([gamma_cross_entropy(x, t, gamma=g, reduction="none") for g in gammas])
    assert torch.all(values[1:] <= values[:-1] + 1e-12)


def test_gamma_cross_entropy_gradient_is_scaled_cross_entropy_gradient():
    # d loss / dx = w * d CE / dx with w = p / (gamma + (1-gamma) p).
    x, t = make_inputs((8, 5), seed=23, n_ignored=0)
    gamma = 0.4
    xa = x.clone().requires_grad_()
    g = grad_of(gamma_cross_entropy(xa, t, gamma=gamma, reduction="sum"), xa)
    p = torch.softmax(x, 1).gather(1, t[:, None])
    w = p / (gamma + (1 - gamma) * p)
    ce_grad = torch.softmax(x, 1) - F.one_hot(t, 5).double()
    assert_close(g, w * ce_grad)


def test_threshold_gradient_is_max_b_w_times_cross_entropy_gradient():
    x, t = make_inputs((12, 5), seed=24, n_ignored=0)
    gamma, b = 0.5, 0.35
    xa = x.clone().requires_grad_()
    value = gamma_cross_entropy(xa, t, gamma=gamma, threshold=b, reduction="none")
    p = torch.softmax(x, 1).gather(1, t[:, None])[:, 0]
    w = torch.maximum(p / (gamma + (1 - gamma) * p), torch.full_like(p, b))
    assert_close(value, -w * torch.log(p))
    ce_grad = torch.softmax(x, 1) - F.one_hot(t, 5).double()
    assert_close(grad_of(value.sum(), xa), w[:, None] * ce_grad)
    # the inputs exercise both sides of the max
    assert (w == b).any()
    assert (w > b).any()


def test_hard_truncation_margin_one_is_cross_entropy_and_zero_margin_is_zero():
    x, t = make_inputs((8, 5), seed=25, n_ignored=1)
    xa = x.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    full = hard_truncated_loss(xa, t, margin=1.0, reduction="mean")
    expected = F.cross_entropy(xr, t)
    assert_close(full, expected)
    assert_close(grad_of(full, xa), grad_of(expected, xr))
    xz = x.clone().requires_grad_()
    none_kept = hard_truncated_loss(xz, t, margin=0.0, reduction="sum")
    assert_close(none_kept, torch.zeros((), dtype=torch.float64))
    assert torch.all(grad_of(none_kept, xz) == 0)


def test_hard_truncation_mean_counts_truncated_elements():
    # two rows: one confident (p_t > margin, loss 0), one not: mean = CE(second) / 2
    x = torch.tensor([[4.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    t = torch.tensor([0, 1])
    value = hard_truncated_loss(x, t, margin=0.5, reduction="mean")
    assert_close(value, torch.tensor(math.log(3.0) / 2, dtype=torch.float64))


def test_focal_alpha_does_not_normalise_mean():
    x, t = make_inputs((10, 4), seed=26, n_ignored=2)
    alpha = torch.tensor([0.1, 0.2, 0.3, 4.0], dtype=torch.float64)
    p = torch.softmax(x, 1).gather(1, t.clamp(min=0)[:, None])[:, 0]
    valid = t != -100
    element = -alpha[t.clamp(min=0)] * (1 - p) ** 2 * torch.log(p)
    expected = (element * valid).sum() / valid.sum()
    assert_close(focal_loss(x, t, gamma=2.0, alpha=alpha), expected)


@pytest.mark.parametrize("name", ["cross_entropy", "soft_accuracy_loss", "hard_truncated_loss"])
def test_weighted_mean_divides_by_weight_sum(name):
    x, t = make_inputs((10, 4), seed=27, n_ignored=2, boundaries=boundaries_of(name, {}))
    weight = torch.tensor([0.1, 0.2, 0.3, 4.0], dtype=torch.float64)
    per = call(name, x, t, {}, reduction="none")
    valid = t != -100
    w_t = weight[t.clamp(min=0)] * valid
    assert_close(call(name, x, t, {}, weight, reduction="mean"), (per * w_t).sum() / w_t.sum())
    assert_close(call(name, x, t, {}, weight, reduction="sum"), (per * w_t).sum())


@pytest.mark.parametrize("name", ["focal_loss", "adaptive_focal_loss"])
def test_alpha_as_sequence_equals_tensor(name):
    x, t = make_inputs((6, 3), seed=28, boundaries=boundaries_of(name, {}))
    as_tensor = call(name, x, t, {}, torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64))
    as_list = call(name, x, t, {}, [0.2, 0.3, 0.5])
    assert_close(as_list, as_tensor)


def test_adaptive_focal_picks_gamma_per_sample():
    # p_t far below / above the 0.2 threshold: gamma 5 and 3 respectively.
    x = torch.tensor([[-2.0, 1.0, 1.0], [3.0, 0.0, 0.0]], dtype=torch.float64)
    t = torch.tensor([0, 0])
    p = torch.softmax(x, 1)[:, 0]
    assert p[0] < 0.2 < p[1]
    expected = torch.stack(
        [-((1 - p[0]) ** 5) * torch.log(p[0]), -((1 - p[1]) ** 3) * torch.log(p[1])]
    )
    assert_close(adaptive_focal_loss(x, t, reduction="none"), expected)


# --- dtypes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "hp"), CASES)
@pytest.mark.parametrize(
    ("dtype", "out_dtype"),
    [
        (torch.float64, torch.float64),
        (torch.float32, torch.float32),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
    ],
)
def test_output_dtype(name, hp, dtype, out_dtype):
    x, t = make_inputs((5, 4), seed=29, scale=1.0, boundaries=boundaries_of(name, hp))
    x = x.to(dtype)
    for reduction in ("none", "mean", "sum"):
        assert call(name, x, t, hp, reduction=reduction).dtype == out_dtype


@pytest.mark.parametrize(("name", "hp"), CASES)
def test_float32_values_match_reference(name, hp):
    # float32 inputs: the reference is evaluated in float64 on the same (exact) float32 values;
    # the float32 result must still be within 1e-6 (relative and absolute) of it.
    x, t = make_inputs((16, 6), seed=30, boundaries=boundaries_of(name, hp), n_ignored=2)
    x32 = x.float()
    for reduction in ("none", "mean", "sum"):
        actual = call(name, x32, t, hp, reduction=reduction)
        expected = ref_loss(name, x32.double(), t, hp, reduction=reduction)
        assert_close(actual, expected, tol=1e-6)
