"""The small path of the family (``_small.py``): one autograd node for small CPU logits.

Every loss of the family but plain cross-entropy, on small ``[N, C]`` CPU logits of 3 to 15
classes, goes through ``_small._SmallRows``; other sizes keep the ``[N, C, *]`` path. Here
both sides of that boundary (C = 2, 3, 15, 16, 40) are tested against the loss written out in
float64, with ``ignore_index`` inside ``[0, C)``, a non-uniform upstream gradient for
``reduction="none"``, int32 targets and half-precision logits, a second backward through a
kept graph, and the one-line errors of the checks it keeps.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_losses import functional as LF
from lightning_losses.functional import _core, _small

N = 11


def _focal(gamma):
    return lambda lp, p: -((1 - p) ** gamma) * lp


# (name, function, options, phi(log p_t, p_t) in float64, weight keyword, "mean" by weights)
CASES = [
    ("ce", LF.cross_entropy, {}, lambda lp, p: -lp, "weight", True),
    (
        "gamma_ce",
        LF.gamma_cross_entropy,
        {"gamma": 0.3},
        lambda lp, p: -torch.log(0.3 + 0.7 * p) / 0.7,
        "weight",
        True,
    ),
    ("soft_accuracy", LF.soft_accuracy_loss, {}, lambda lp, p: 1 - p, "weight", True),
    ("focal", LF.focal_loss, {"gamma": 2.0}, _focal(2.0), "alpha", False),
    ("poly1", LF.poly1_loss, {"epsilon": 2.0}, lambda lp, p: -lp + 2.0 * (1 - p), "weight", True),
    (
        "hard_truncated",
        LF.hard_truncated_loss,
        {"margin": 0.4},
        lambda lp, p: torch.where(p.detach() <= 0.4, -lp, torch.zeros_like(lp)),
        "weight",
        True,
    ),
]
IDS = [case[0] for case in CASES]


def inputs(classes, ignore_index=-100, seed=3):
    generator = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(N, classes, generator=generator)
    t = torch.randint(0, classes, (N,), generator=generator)
    t[[1, 7]] = ignore_index
    w = torch.rand(classes, generator=generator) + 0.5
    return x, t, w


def reference(x, t, phi, weight, weighted_mean, eps, reduction, ignore_index, upstream):
    """The loss in float64 by autograd: its value and ``d (upstream . loss) / d x``."""
    z = x.detach().double().requires_grad_()
    log_p = torch.log_softmax(z, dim=1)
    valid = t != ignore_index
    safe = torch.where(valid, t, 0).long()
    lp = log_p.gather(1, safe[:, None])[:, 0]
    w = torch.ones(x.shape[1], dtype=torch.float64) if weight is None else weight.double()
    w_t = w[safe] * valid
    loss = w_t * torch.where(valid, phi(lp, lp.exp()), torch.zeros_like(lp))
    if eps:
        loss = (1 - eps) * loss + eps / x.shape[1] * (-(log_p * w).sum(dim=1) * valid)
    if reduction == "none":
        value = loss
    elif reduction == "sum":
        value = loss.sum()
    else:
        denominator = w_t.sum() if weighted_mean else valid.sum().double()
        value = loss.sum() / (denominator if denominator > 0 else 1.0)
    (grad,) = torch.autograd.grad((value * upstream).sum(), z)
    return value, grad


@pytest.mark.parametrize("classes", [2, 3, 15, 16, 40])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_values_and_gradients_match_the_float64_formula(case, reduction, classes):
    _, fn, options, phi, weight_name, weighted_mean = case
    for ignore_index, weighted, eps in ((-100, False, 0.0), (0, True, 0.0), (-100, True, 0.25)):
        if eps and fn not in (LF.cross_entropy, LF.gamma_cross_entropy):
            eps = 0.0
        x, t, w = inputs(classes, ignore_index)
        z = x.clone().requires_grad_()
        kwargs = dict(options, reduction=reduction, ignore_index=ignore_index)
        if weighted:
            kwargs[weight_name] = w
        if eps:
            kwargs["label_smoothing"] = eps
        value = fn(z, t, **kwargs)
        upstream = torch.linspace(0.5, 2.0, N) if reduction == "none" else torch.tensor(1.5)
        (grad,) = torch.autograd.grad(value, z, upstream)
        expected, expected_grad = reference(
            x,
            t,
            phi,
            w if weighted else None,
            weighted_mean,
            eps,
            reduction,
            ignore_index,
            upstream.double(),
        )
        torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-5, atol=1e-6)
        ignored = t == ignore_index
        assert torch.all(grad[ignored] == 0)
        if reduction == "none":
            assert torch.all(value[ignored] == 0)


@pytest.mark.parametrize("case", CASES[1:], ids=IDS[1:])
def test_the_family_takes_one_autograd_node(case, monkeypatch):
    # cross-entropy without smoothing is F.cross_entropy itself; the others are one node
    _, fn, options, *_ = case
    calls = []
    apply = _small._SmallRows.apply
    monkeypatch.setattr(_small._SmallRows, "apply", lambda *a: calls.append(1) or apply(*a))
    x, t, _ = inputs(10)
    loss = fn(x.requires_grad_(), t.clamp_min(0), **options)
    assert calls == [1]
    calls.clear()  # an ignored target makes the first try's gather fail: then with the mask
    fn(x, t, **options)
    assert calls == [1, 1]
    assert type(loss.grad_fn).__name__ == "_SmallRowsBackward"


def test_cross_entropy_without_smoothing_is_f_cross_entropy():
    x, t, w = inputs(10)
    for kwargs in ({}, {"weight": w}, {"reduction": "none"}, {"reduction": "sum"}):
        z = x.clone().requires_grad_()
        value = LF.cross_entropy(z, t, **kwargs)
        assert (
            type(value.grad_fn).__name__
            == F.cross_entropy(z, t, **kwargs).grad_fn.__class__.__name__
        )
        assert torch.equal(value, F.cross_entropy(x, t, **kwargs))


@pytest.mark.parametrize("classes", [1, 2, 3, 9, 15, 16, 17, 100])
def test_log_softmax_rows_is_the_log_softmax(classes):
    x = 3 * torch.randn(7, classes, dtype=torch.float64)
    torch.testing.assert_close(
        _small.log_softmax_rows(x), torch.log_softmax(x, dim=1), rtol=0, atol=1e-14
    )


def test_int32_targets_and_half_logits_give_the_float32_numbers():
    x, t, w = inputs(10, seed=5)
    expected = LF.focal_loss(x.bfloat16().float(), t, alpha=w, reduction="none")
    for dtype in (torch.float16, torch.bfloat16):
        z = x.to(dtype).requires_grad_()
        value = LF.focal_loss(z, t.int(), alpha=w, reduction="none")
        value.sum().backward()
        assert value.dtype == torch.float32
        assert z.grad.dtype == dtype
    torch.testing.assert_close(
        LF.focal_loss(x.bfloat16(), t.int(), alpha=w, reduction="none"), expected
    )


def test_a_kept_graph_gives_the_same_gradient_twice_and_no_second_order():
    x, t, _ = inputs(10)
    z = x.clone().requires_grad_()
    loss = LF.focal_loss(z, t)
    (first,) = torch.autograd.grad(loss, z, retain_graph=True)
    (second,) = torch.autograd.grad(loss, z, retain_graph=True)
    assert torch.equal(first, second)
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(z.grad, 2 * first)
    (grad,) = torch.autograd.grad(LF.focal_loss(z, t), z, create_graph=True)
    with pytest.raises(RuntimeError, match=r"differentiate twice|does not require grad"):
        grad.sum().backward()


@pytest.mark.parametrize("validate_args", [True, False])
@pytest.mark.parametrize("bad", [10, -1, -100])
def test_a_target_out_of_range_is_the_package_error(bad, validate_args):
    # -100 is out of range when ignore_index is 3 (a class): then it is no ignored target
    x, t, _ = inputs(10, ignore_index=3)
    t[4] = bad
    with pytest.raises(ValueError, match=r"target values must lie in \[0, 9\]") as info:
        LF.poly1_loss(x, t, ignore_index=3, validate_args=validate_args)
    assert f"found {bad}" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_logits_are_found_and_unchecked_ignored_rows_stay_zero(bad):
    x, t, _ = inputs(10)
    x[2, 4] = bad
    with pytest.raises(ValueError, match=r"logits must be finite .* at logits\[2, 4\]"):
        LF.focal_loss(x, t)
    x, t, _ = inputs(10)
    x[1, 4] = bad  # row 1 is ignored
    z = x.requires_grad_()
    value = LF.hard_truncated_loss(z, t, reduction="none", validate_args=False)
    assert value[1] == 0
    assert torch.isfinite(value).all()


def test_only_small_two_dimensional_cpu_logits_of_short_rows_take_it():
    focal = _core.phi_cross_entropy, LF.target_probability.phi_focal

    def takes(logits, phi=focal[1], eps=0.0, weighted_mean=True):
        return _core.takes_small_rows(logits, phi, eps, weighted_mean)

    assert takes(torch.zeros(4, 10))
    assert takes(torch.zeros(4, 3))
    assert takes(torch.zeros(4, 15))
    assert not takes(torch.zeros(4, 2))
    assert not takes(torch.zeros(4, 16))
    assert not takes(torch.zeros(0, 10))
    assert not takes(torch.zeros(4, 10, 2))
    assert not takes(torch.zeros(_core.SMALL_ELEMENTS // 10 + 1, 10))
    assert not takes(torch.zeros(4, 10), phi=focal[0])  # plain cross-entropy: F.cross_entropy
    assert takes(torch.zeros(4, 10), phi=focal[0], eps=0.1)
    assert takes(torch.zeros(4, 10), phi=focal[0], weighted_mean=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not takes(torch.zeros(4, 10))


def test_the_gradient_is_written_only_for_a_recorded_call(monkeypatch):
    calls = []
    gradient = _small._gradient
    monkeypatch.setattr(_small, "_gradient", lambda *a: calls.append(1) or gradient(*a))
    x, t, _ = inputs(10)
    t = t.clamp_min(0)
    LF.focal_loss(x, t)  # logits without grad
    with torch.no_grad():
        LF.focal_loss(x.requires_grad_(), t)
    assert calls == []
    LF.focal_loss(x, t).backward()
    assert calls == [1]
    assert x.grad is not None
