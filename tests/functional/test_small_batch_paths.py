"""The two paths of the target-probability family's core give the float64 formula's numbers.

Small ``[N, C]`` logits (``_core.SMALL_ELEMENTS`` or fewer) take PyTorch's kernels (cross-entropy
is ``F.cross_entropy`` itself, another loss ``phi`` of its ``-log p_t`` in one autograd node);
larger ones the fused chunks. The suite's other tests use small inputs, so here every loss of
the family runs both ways (the threshold moved so that the same inputs take either path),
values and gradients against the loss written out in float64, with class weights, ignored
targets, label smoothing and the three reductions; and the argument checks that the small
path leaves to PyTorch's kernel (target values) or to one sum (finite logits) raise the
package's one-line errors on both.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_losses import functional as LF
from lightning_losses.functional import _core

N, C = 9, 5
IGNORED = (2, 6)  # rows whose target is ignore_index


@pytest.fixture(params=["unfused", "fused"])
def path(request, monkeypatch):
    """Route [N, C] logits of this module's size through one path of the core."""
    monkeypatch.setattr(_core, "SMALL_ELEMENTS", 1 << 40 if request.param == "unfused" else 0)
    return request.param


def inputs(dtype=torch.float32, ignore=True):
    generator = torch.Generator().manual_seed(7)
    x = (3 * torch.randn(N, C, generator=generator)).to(dtype)
    t = torch.randint(0, C, (N,), generator=generator)
    if ignore:
        t[list(IGNORED)] = -100
    w = torch.rand(C, generator=generator) + 0.25
    return x, t, w


def _focal_ref(gamma):
    return lambda lp, p: -((1 - p) ** gamma) * lp


def _adaptive_ref(lp, p):
    gamma = torch.where(p.detach() < 0.2, 5.0, 3.0).to(lp.dtype)
    return -((1 - p) ** gamma) * lp


def _tailr_ref(gamma, threshold):
    def phi(lp, p):
        w = (p / (gamma + (1 - gamma) * p)).detach()
        return -torch.clamp(w, min=threshold) * lp

    return phi


# (name, call(x, t, weight, **options), phi reference of (log p_t, p_t), weight keyword,
#  "mean" divides by the weights (True) or counts (False), takes label smoothing)
CASES = [
    ("ce", LF.cross_entropy, {}, lambda lp, p: -lp, "weight", True, True),
    (
        "gamma_ce",
        LF.gamma_cross_entropy,
        {"gamma": 0.5},
        lambda lp, p: -torch.log(0.5 + 0.5 * p) / 0.5,
        "weight",
        True,
        True,
    ),
    (
        "tailr",
        LF.gamma_cross_entropy,
        {"gamma": 0.5, "threshold": 0.2},
        _tailr_ref(0.5, 0.2),
        "weight",
        True,
        True,
    ),
    ("soft_accuracy", LF.soft_accuracy_loss, {}, lambda lp, p: 1 - p, "weight", True, False),
    ("focal", LF.focal_loss, {"gamma": 2.0}, _focal_ref(2.0), "alpha", False, False),
    ("focal_half", LF.focal_loss, {"gamma": 0.5}, _focal_ref(0.5), "alpha", False, False),
    ("adaptive_focal", LF.adaptive_focal_loss, {}, _adaptive_ref, "alpha", False, False),
    (
        "hard_truncated",
        LF.hard_truncated_loss,
        {"margin": 0.5},
        lambda lp, p: torch.where(p.detach() <= 0.5, -lp, torch.zeros_like(lp)),
        "weight",
        True,
        False,
    ),
    (
        "poly1",
        LF.poly1_loss,
        {"epsilon": 1.0},
        lambda lp, p: -lp + 1.0 * (1 - p),
        "weight",
        True,
        False,
    ),
]
IDS = [case[0] for case in CASES]


def reference(x, t, phi, weight, weighted_mean, eps, reduction):
    """The loss written out in float64: values and the gradient of the logits."""
    z = x.detach().double().requires_grad_()
    log_p = torch.log_softmax(z, dim=1)
    valid = t != -100
    safe = torch.where(valid, t, 0)
    lp = log_p.gather(1, safe[:, None])[:, 0]
    w = torch.ones(C, dtype=torch.float64) if weight is None else weight.double()
    w_t = w[safe] * valid
    loss = w_t * torch.where(valid, phi(lp, lp.exp()), torch.zeros_like(lp))
    if eps:
        smooth = -(log_p * w).sum(dim=1) * valid
        loss = (1 - eps) * loss + eps / C * smooth
    if reduction == "none":
        value = loss
    elif reduction == "sum":
        value = loss.sum()
    else:
        denominator = w_t.sum() if weighted_mean else valid.sum().double()
        value = loss.sum() / (denominator if denominator > 0 else 1.0)
    (grad,) = torch.autograd.grad(value.sum(), z)
    return value, grad


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_both_paths_match_the_float64_formula(path, case, weighted, reduction):
    _, fn, options, phi, weight_name, weighted_mean, smoothable = case
    x, t, w = inputs()
    for eps in (0.0, 0.2) if smoothable else (0.0,):
        z = x.clone().requires_grad_()
        kwargs = dict(options, reduction=reduction)
        if weighted:
            kwargs[weight_name] = w
        if eps:
            kwargs["label_smoothing"] = eps
        value = fn(z, t, **kwargs)
        (grad,) = torch.autograd.grad(value.sum(), z)
        ref_value, ref_grad = reference(
            x, t, phi, w if weighted else None, weighted_mean, eps, reduction
        )
        assert value.dtype == torch.float32
        torch.testing.assert_close(value.double(), ref_value, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-5, atol=1e-6)
        assert torch.all(grad[list(IGNORED)] == 0)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_extra_dimensions_agree_with_the_two_dimensional_paths(path, case):
    # [N, C, 1] logits always take the unfused path: the same numbers as [N, C] on either path
    _, fn, options, *_ = case
    x, t, _ = inputs()
    flat = fn(x, t, **options, reduction="none")
    extra = fn(x[:, :, None], t[:, None], **options, reduction="none")[:, 0]
    torch.testing.assert_close(flat, extra, rtol=1e-6, atol=1e-7)


def test_adafocal_on_both_paths(path):
    # AdaFocal's bins: focal above 0, inverse focal below 0, against its formula in float64
    x, t, _ = inputs()
    edges = torch.tensor([0.0, 0.3, 0.6, 1.0], dtype=torch.float64)
    gammas = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    z = x.clone().requires_grad_()
    value = LF.adafocal_loss(z, t, edges=edges, gammas=gammas)
    value.backward()

    def phi(lp, p):
        g = gammas[torch.bucketize(p.detach(), edges[1:-1], right=True)]
        return -torch.where(g >= 0, (1 - p) ** g.abs(), (1 + p) ** g.abs()) * lp

    ref_value, ref_grad = reference(x, t, phi, None, False, 0.0, "mean")
    torch.testing.assert_close(value.double(), ref_value, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z.grad.double(), ref_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("bad", [5, 9, -1, -7])
def test_out_of_range_target_names_the_value_on_both_paths(path, case, bad):
    _, fn, options, *_ = case
    x, t, _ = inputs()
    t[4] = bad
    with pytest.raises(ValueError, match=r"target values must lie in \[0, 4\]") as info:
        fn(x, t, **options)
    assert f"found {bad}" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_logits_are_found_on_both_paths(path, case, bad):
    # -inf in a non-target entry leaves cross-entropy finite: the check must still find it
    _, fn, options, *_ = case
    x, t, _ = inputs(ignore=False)
    x[3, (int(t[3]) + 1) % C] = bad
    with pytest.raises(ValueError, match=r"logits must be finite .* at logits\[3, "):
        fn(x, t, **options)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("validate_args", [True, False])
def test_nothing_to_average_gives_zero_with_zero_gradient(path, case, validate_args):
    # every target ignored, or every present class weighted 0: PyTorch's mean would be NaN
    _, fn, options, _, weight_name, *_ = case
    x, t, _ = inputs()
    z = x.clone().requires_grad_()
    value = fn(z, torch.full_like(t, -100), **options, validate_args=validate_args)
    (grad,) = torch.autograd.grad(value, z)
    assert value.item() == 0.0
    assert torch.all(grad == 0)
    if weight_name == "weight":  # focal's alpha is a factor, not the mean's denominator
        weight = torch.ones(C)
        weight[t[t != -100]] = 0.0
        value = fn(z, t, **options, weight=weight, validate_args=validate_args)
        (grad,) = torch.autograd.grad(value, z)
        assert value.item() == 0.0
        assert torch.all(grad == 0)


def test_large_finite_logits_whose_sum_overflows_are_accepted(path):
    # the one-sum check of finite logits falls back to the exact check when the sum overflows
    x = torch.full((N, C), 3e38)
    x[:, 0] = 0.0
    t = torch.zeros(N, dtype=torch.long)
    value = LF.cross_entropy(x, t, reduction="sum")
    assert math.isinf(value.item())  # log p_0 = -3e38 each: the sum overflows, no error


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_half_logits_and_int32_targets(path, case):
    # half precision is computed and returned in float32; any integer dtype of target works
    _, fn, options, *_ = case
    x, t, _ = inputs(dtype=torch.bfloat16, ignore=False)
    value = fn(x, t.int(), **options)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, fn(x.float(), t, **options))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_autocast_does_not_change_the_numbers(path, case):
    _, fn, options, *_ = case
    x, t, _ = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = fn(x, t, **options)
    assert inside.dtype == torch.float32
    torch.testing.assert_close(inside, fn(x, t, **options))


@pytest.mark.parametrize("phi", list(LF.target_probability.FAMILY.values()))
def test_every_phi_is_zero_at_certainty(phi):
    # the small path relies on it for ignored elements (PyTorch's nll is 0 there: log p = 0)
    hyperparameters = {
        "gamma_ce": {"gamma": 0.5, "threshold": 0.2},
        "focal": {"gamma": 0.5},
        "adaptive_focal": {"thresholds": (0.2,), "gammas": (5.0, 3.0)},
        "hard_truncated": {"margin": 1.0},
        "poly1": {"epsilon": 1.0},
    }
    name = next(k for k, v in LF.target_probability.FAMILY.items() if v is phi)
    value, derivative = phi(torch.tensor([0.0, -0.0]), **hyperparameters.get(name, {}))
    assert torch.all(value == 0)
    assert torch.all(torch.isfinite(derivative))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_plain_cross_entropy_of_small_cpu_logits_is_pytorchs_kernel_bit_for_bit(reduction):
    # the quick path: no weight, no smoothing, float32 [N, C] CPU logits, int64 targets
    x, t, _ = inputs()
    z, zq = x.clone().requires_grad_(), x.clone().requires_grad_()
    quick = _core.quick_cross_entropy(zq, t, -100, reduction, 0.0, True)
    assert quick is not None
    loss = LF.cross_entropy(z, t, reduction=reduction)
    expected = torch.nn.functional.cross_entropy(x.double(), t, reduction=reduction)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-7)
    reference = torch.nn.functional.cross_entropy(x, t, reduction=reduction)
    assert torch.equal(loss, reference)
    assert torch.equal(quick, reference)
    loss.sum().backward()
    quick.sum().backward()
    assert torch.equal(z.grad, zq.grad)


def _quick(x, t, *, ignore_index=-100, reduction="mean", smoothing=0.0, validate_args=True):
    return _core.quick_cross_entropy(x, t, ignore_index, reduction, smoothing, validate_args)


def test_the_quick_cross_entropy_leaves_every_other_case_to_the_general_path():
    x, t, _ = inputs()
    assert _quick(x, t) is not None
    bad = x.clone()
    bad[0, 1] = -math.inf  # finite loss, non-finite logits: the general path names them
    assert torch.isfinite(torch.nn.functional.cross_entropy(bad, t.clamp_min(0) * 0))
    others = {
        "bfloat16 logits": _quick(x.bfloat16(), t),
        "int32 targets": _quick(x, t.int()),
        "[N, C, 1] logits": _quick(x[..., None], t[:, None]),
        "smoothing": _quick(x, t, smoothing=0.1),
        "int smoothing": _quick(x, t, smoothing=0),
        "a reduction of its own": _quick(x, t, reduction="avg"),
        "a target out of range": _quick(x, torch.full_like(t, C)),
        "a wrong target shape": _quick(x, t[:-1]),
        "-inf logits": _quick(bad, t),
        "NaN logits": _quick(torch.full_like(x, math.nan), t),
        "a mean of nothing": _quick(x, torch.full_like(t, -100)),
        "a mean of nothing, unchecked": _quick(x, torch.full_like(t, -100), validate_args=False),
    }
    assert {name: value for name, value in others.items() if value is not None} == {}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _quick(x, t) is None
    with pytest.raises(ValueError, match=r"logits must be finite"):
        LF.cross_entropy(bad, t)
