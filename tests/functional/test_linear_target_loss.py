"""The chunked linear-head losses against the plain-logits losses of the library.

Every reference builds ``logits = hidden @ weight.T + bias`` and calls the family function
(``lightning_losses.functional.focal_loss`` ...); values and the gradients of ``hidden``,
``weight`` and ``bias`` must match for every loss, chunk size, reduction and ignore pattern.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from lightning_losses import LinearTargetLoss
from lightning_losses import functional as LF
from lightning_losses.callbacks.loss_scheduler import hyperparameter_names
from lightning_losses.functional.linear import (
    LINEAR_TARGET_LOSSES,
    default_chunk_size,
    linear_target_loss,
)

N, H, V = 37, 8, 50

#: (id, loss name, hyper-parameters, plain-logits reference)
CASES = [
    ("ce", "ce", {}, LF.cross_entropy),
    ("gamma_ce", "gamma_ce", {"gamma": 0.3}, LF.gamma_cross_entropy),
    ("gamma_ce_1", "gamma_ce", {"gamma": 1.0}, LF.gamma_cross_entropy),
    ("gamma_ce_b", "gamma_ce", {"gamma": 0.5, "threshold": 0.2}, LF.gamma_cross_entropy),
    ("soft_accuracy", "soft_accuracy", {}, LF.soft_accuracy_loss),
    ("focal", "focal", {"gamma": 2.0}, LF.focal_loss),
    ("focal_half_gamma", "focal", {"gamma": 0.5}, LF.focal_loss),
    ("adaptive_focal", "adaptive_focal", {}, LF.adaptive_focal_loss),
    ("hard_truncated", "hard_truncated", {"margin": 0.2}, LF.hard_truncated_loss),
]
CASE_IDS = [case[0] for case in CASES]


def make_inputs(n=N, *, dtype=torch.float32, bias=True, seed=0, ignore_every=None):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=generator, dtype=torch.float64)
    weight = torch.randn(V, H, generator=generator, dtype=torch.float64) * 0.7
    b = torch.randn(V, generator=generator, dtype=torch.float64) if bias else None
    target = torch.randint(0, V, (n,), generator=generator)
    if ignore_every:
        target[::ignore_every] = -100
    tensors = [hidden, weight] + ([b] if bias else [])
    tensors = [t.to(dtype).requires_grad_() for t in tensors]
    return tensors, target


def run(function, tensors, target, reduction, seed=1):
    """Value and gradients for a fixed random upstream gradient."""
    out = function(*tensors)
    generator = torch.Generator().manual_seed(seed)
    upstream = torch.rand(out.shape, generator=generator, dtype=out.dtype) + 0.5
    grads = torch.autograd.grad(out, tensors, upstream)
    return out.detach(), grads


def _class_weight_keyword(reference) -> str:
    """The plain-logits loss's name for a per-class weight: focal's ``alpha``, else ``weight``."""
    return "alpha" if "alpha" in inspect.signature(reference).parameters else "weight"


def both(
    name,
    hyper,
    reference,
    tensors,
    target,
    reduction,
    chunk_size,
    ignore_index=-100,
    class_weight=None,
):
    def ours(hidden, weight, bias=None):
        return linear_target_loss(
            hidden,
            weight,
            target,
            loss=name,
            bias=bias,
            class_weight=class_weight,
            chunk_size=chunk_size,
            ignore_index=ignore_index,
            reduction=reduction,
            **hyper,
        )

    weighted = {} if class_weight is None else {_class_weight_keyword(reference): class_weight}

    def plain(hidden, weight, bias=None):
        logits = hidden @ weight.T
        if bias is not None:
            logits = logits + bias
        shape = logits.shape
        logits = logits.reshape(-1, shape[-1])
        flat_target = target.reshape(-1)
        if class_weight is not None:
            # per row w[t] * phi (alpha and weight agree there); "mean" divides by the sum of
            # the weights of the counted rows, as F.cross_entropy(weight=...) does
            rows = reference(
                logits,
                flat_target,
                ignore_index=ignore_index,
                reduction="none",
                **weighted,
                **hyper,
            )
            counted = flat_target[flat_target != ignore_index]
            total = {"none": rows, "sum": rows.sum(), "mean": rows.sum()}[reduction]
            value = total / class_weight[counted].sum() if reduction == "mean" else total
            return value.reshape(target.shape) if reduction == "none" else value
        value = reference(
            logits,
            flat_target,
            ignore_index=ignore_index,
            reduction=reduction,
            **hyper,
        )
        return value.reshape(target.shape) if reduction == "none" else value

    return run(ours, tensors, target, reduction), run(plain, tensors, target, reduction)


def assert_all_close(actual, expected, tol):
    (value, grads), (ref_value, ref_grads) = actual, expected
    torch.testing.assert_close(value, ref_value, rtol=tol, atol=tol)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert grad.dtype == ref_grad.dtype
        torch.testing.assert_close(grad, ref_grad, rtol=tol, atol=tol)


# --- equality with the plain-logits losses ------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("chunk_size", [None, 1, 7, 16, N])  # 7 and 16: a smaller last chunk
@pytest.mark.parametrize("bias", [True, False])
def test_matches_plain_logits_float32(case, reduction, chunk_size, bias):
    _, name, hyper, reference = case
    tensors, target = make_inputs(bias=bias, ignore_every=5)
    ours, plain = both(name, hyper, reference, tensors, target, reduction, chunk_size)
    assert_all_close(ours, plain, 1e-5)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_matches_plain_logits_float64(case, reduction):
    _, name, hyper, reference = case
    tensors, target = make_inputs(dtype=torch.float64, ignore_every=4)
    ours, plain = both(name, hyper, reference, tensors, target, reduction, 6)
    assert_all_close(ours, plain, 1e-12)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("chunk_size", [None, 7])
def test_class_weight_matches_the_weighted_plain_logits_loss(case, reduction, chunk_size):
    _, name, hyper, reference = case
    tensors, target = make_inputs(dtype=torch.float64, ignore_every=4)
    class_weight = torch.rand(V, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    class_weight[target[1]] = 0.0  # a class that counts for nothing
    ours, plain = both(
        name, hyper, reference, tensors, target, reduction, chunk_size, class_weight=class_weight
    )
    assert_all_close(ours, plain, 1e-12)


def test_class_weight_of_cross_entropy_matches_pytorch():
    (hidden, weight, bias), target = make_inputs(dtype=torch.float64, ignore_every=3)
    class_weight = torch.linspace(0.1, 2.0, V, dtype=torch.float64)
    ours = linear_target_loss(
        hidden, weight, target, loss="ce", bias=bias, class_weight=class_weight.tolist()
    )
    logits = hidden @ weight.T + bias
    expected = F.cross_entropy(logits, target, weight=class_weight, ignore_index=-100)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(ours, (hidden, weight, bias))
    expected_grads = torch.autograd.grad(expected, (hidden, weight, bias))
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


def test_class_weight_errors_name_the_argument():
    (hidden, weight, _), target = make_inputs()
    for bad in (torch.ones(V - 1), torch.ones(V, 2), torch.ones(V, dtype=torch.long)):
        with pytest.raises(ValueError, match=rf"class_weight must be .* \[{V}\]"):
            linear_target_loss(hidden, weight, target, loss="ce", class_weight=bad)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_sequence_inputs_are_flattened(case):
    _, name, hyper, reference = case
    tensors, target = make_inputs(n=24, ignore_every=7)
    tensors = [tensors[0].detach().reshape(4, 6, H).requires_grad_(), *tensors[1:]]
    target = target.reshape(4, 6)
    for reduction in ("none", "mean"):
        ours, plain = both(name, hyper, reference, tensors, target, reduction, 5)
        assert ours[0].shape == target.shape or reduction != "none"
        assert ours[1][0].shape == (4, 6, H)
        assert_all_close(ours, plain, 1e-5)


def test_matches_pytorch_linear_cross_entropy():
    (hidden, weight, bias), target = make_inputs(ignore_every=3)
    ours = linear_target_loss(hidden, weight, target, loss="ce", bias=bias, chunk_size=8)
    theirs = F.linear_cross_entropy(hidden, weight, target, linear_bias=bias)
    torch.testing.assert_close(ours, theirs)


def test_other_ignore_index():
    (hidden, weight, bias), target = make_inputs()
    target[::3] = 7  # a valid class used as ignore_index
    ours, plain = both("focal", {"gamma": 2.0}, LF.focal_loss, [hidden, weight, bias], target,
                       "mean", 4, ignore_index=7)  # fmt: skip
    assert_all_close(ours, plain, 1e-5)


# --- ignored rows -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LINEAR_TARGET_LOSSES))
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_all_ignored_gives_zero_and_zero_gradient(name, reduction):
    (hidden, weight, bias), target = make_inputs()
    target.fill_(-100)
    out = linear_target_loss(
        hidden, weight, target, loss=name, bias=bias, reduction=reduction, chunk_size=4
    )
    assert torch.equal(out, torch.zeros_like(out))
    grads = torch.autograd.grad(out.sum(), (hidden, weight, bias))
    for grad in grads:
        assert torch.equal(grad, torch.zeros_like(grad))


def test_ignored_rows_get_no_gradient():
    (hidden, weight, bias), target = make_inputs(ignore_every=2)
    out = linear_target_loss(hidden, weight, target, loss="gamma_ce", bias=bias, chunk_size=3)
    (grad_hidden,) = torch.autograd.grad(out, hidden)
    assert torch.equal(grad_hidden[::2], torch.zeros_like(grad_hidden[::2]))
    assert grad_hidden[1::2].abs().sum() > 0


# --- precision ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_widely_spread_logits(case):
    """Logits hundreds apart: the exp floor that keeps subnormals out changes nothing."""
    _, name, hyper, reference = case
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-4)):
        (hidden, weight, bias), target = make_inputs(dtype=dtype, ignore_every=5)
        weight = (weight.detach() * 40).requires_grad_()  # logits of standard deviation ~80
        ours, plain = both(name, hyper, reference, [hidden, weight, bias], target, "none", 8)
        assert float(ours[0].max()) > 100 or name in ("soft_accuracy", "gamma_ce")
        assert_all_close(ours, plain, tol)  # gradients ~1e2: float32 rounding is ~1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_half_inputs(dtype, case):
    _, name, hyper, _ = case
    (hidden, weight, bias), target = make_inputs(dtype=dtype, ignore_every=6)
    upcast = [t.detach().float().requires_grad_() for t in (hidden, weight, bias)]

    def loss(hidden, weight, bias):
        return linear_target_loss(
            hidden, weight, target, loss=name, bias=bias, chunk_size=9, **hyper
        )

    value, grads = run(loss, [hidden, weight, bias], target, "mean")
    ref_value, ref_grads = run(loss, upcast, target, "mean")
    assert value.dtype == torch.float32  # computed and returned in float32
    torch.testing.assert_close(value, ref_value, rtol=1e-5, atol=1e-5)  # same float32 sums
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert grad.dtype == dtype
        assert bool(grad.isfinite().all())
        scale = ref_grad.abs().max()
        torch.testing.assert_close(grad.float() / scale, ref_grad / scale, rtol=0, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_half_matmul(dtype, reduction):
    (hidden, weight, bias), target = make_inputs(dtype=dtype, ignore_every=6)
    upcast = [t.detach().float().requires_grad_() for t in (hidden, weight, bias)]

    def loss(hidden, weight, bias, half_matmul=True):
        return linear_target_loss(
            hidden, weight, target, loss="focal", bias=bias, chunk_size=9,
            reduction=reduction, half_matmul=half_matmul,
        )  # fmt: skip

    value, grads = run(loss, [hidden, weight, bias], target, reduction)
    ref_value, ref_grads = run(loss, upcast, target, reduction)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, ref_value, rtol=2e-2, atol=2e-2)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert grad.dtype == dtype
        assert bool(grad.isfinite().all())
        scale = ref_grad.abs().max()
        torch.testing.assert_close(grad.float() / scale, ref_grad / scale, rtol=0, atol=2e-2)
    # float32 inputs: no effect
    exact, _ = run(lambda *t: loss(*t, half_matmul=False), upcast, target, reduction)
    assert torch.equal(run(loss, upcast, target, reduction)[0], exact)


def test_half_hidden_with_float32_weight():
    (hidden, weight, bias), target = make_inputs(ignore_every=6)
    half = hidden.detach().bfloat16().requires_grad_()
    out = linear_target_loss(half, weight, target, loss="focal", bias=bias)
    grads = torch.autograd.grad(out, (half, weight, bias))
    assert [g.dtype for g in grads] == [torch.bfloat16, torch.float32, torch.float32]


def test_autocast_is_disabled_inside():
    (hidden, weight, bias), target = make_inputs()
    expected = linear_target_loss(hidden, weight, target, loss="focal", bias=bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        actual = linear_target_loss(hidden, weight, target, loss="focal", bias=bias)
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual, expected)


# TaiLr's thresholded gamma-CE holds w constant: its gradient is not that of its value.
SMOOTH = [case for case in CASES if case[0] != "gamma_ce_b"]


@pytest.mark.parametrize("case", SMOOTH, ids=[case[0] for case in SMOOTH])
def test_gradcheck_float64(case):
    _, name, hyper, _ = case
    (hidden, weight, bias), target = make_inputs(n=6, dtype=torch.float64, ignore_every=4)
    hidden, weight, bias = (t.detach()[:, :3] if t.dim() == 2 else t.detach()
                            for t in (hidden, weight, bias))  # fmt: skip
    hidden, weight, bias = (t.clone().requires_grad_() for t in (hidden, weight, bias))

    def loss(hidden, weight, bias):
        return linear_target_loss(
            hidden, weight, target, loss=name, bias=bias, chunk_size=4, reduction="none", **hyper
        )

    assert torch.autograd.gradcheck(loss, (hidden, weight, bias))


# --- autograd behaviour -------------------------------------------------------------------------


def test_no_gradient_work_without_requires_grad():
    (hidden, weight, bias), target = make_inputs()
    expected = linear_target_loss(hidden, weight, target, loss="focal", bias=bias)
    with torch.no_grad():
        value = linear_target_loss(hidden, weight, target, loss="focal", bias=bias)
    assert not value.requires_grad
    detached = [t.detach() for t in (hidden, weight, bias)]
    value2 = linear_target_loss(*detached[:2], target, loss="focal", bias=detached[2])
    assert not value2.requires_grad
    torch.testing.assert_close(value, expected.detach())
    torch.testing.assert_close(value2, expected.detach())


def test_frozen_weight_gets_no_gradient():
    (hidden, weight, bias), target = make_inputs()
    weight = weight.detach()
    out = linear_target_loss(hidden, weight, target, loss="ce", bias=bias)
    out.backward()
    assert hidden.grad is not None
    assert bias.grad is not None
    assert weight.grad is None


def test_upstream_gradient_scales_mean_and_sum():
    (hidden, weight, _), target = make_inputs(ignore_every=3)
    for reduction in ("mean", "sum"):
        out = linear_target_loss(hidden, weight, target, loss="soft_accuracy", reduction=reduction)
        (g1,) = torch.autograd.grad(out, weight)
        out = linear_target_loss(hidden, weight, target, loss="soft_accuracy", reduction=reduction)
        (g3,) = torch.autograd.grad(3.0 * out, weight)
        torch.testing.assert_close(g3, 3.0 * g1)


def test_second_backward_of_mean_raises_but_none_retains():
    (hidden, weight, _), target = make_inputs()
    out = linear_target_loss(hidden, weight, target, loss="focal")
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward twice"):
        out.backward()
    out = linear_target_loss(hidden, weight, target, loss="focal", reduction="none").mean()
    first = torch.autograd.grad(out, weight, retain_graph=True)[0]
    second = torch.autograd.grad(out, weight)[0]
    torch.testing.assert_close(first, second)


# --- arguments ----------------------------------------------------------------------------------


def test_unknown_loss_lists_the_names():
    (hidden, weight, _), target = make_inputs()
    with pytest.raises(ValueError, match="ce, gamma_ce, soft_accuracy, focal"):
        linear_target_loss(hidden, weight, target, loss="soft_truncated")


@pytest.mark.parametrize(
    ("loss", "hyper", "match"),
    [
        ("gamma_ce", {"gamma": 1.5}, "gamma must lie in"),
        ("gamma_ce", {"threshold": -0.1}, "threshold must lie in"),
        ("focal", {"gamma": -1.0}, "gamma must lie in"),
        ("adaptive_focal", {"thresholds": (0.5, 0.2), "gammas": (1, 2, 3)}, "increasing"),
        ("adaptive_focal", {"gammas": (1.0,)}, "one more value"),
        ("hard_truncated", {"margin": 2.0}, "margin must lie in"),
        ("ce", {"gamma": 1.0}, "no hyper-parameter 'gamma'"),
        ("focal", {"alpha": [1.0]}, "it accepts: gamma"),
    ],
)
def test_hyperparameters_are_checked(loss, hyper, match):
    (hidden, weight, _), target = make_inputs()
    with pytest.raises(ValueError, match=match):
        linear_target_loss(hidden, weight, target, loss=loss, **hyper)


def test_bad_arguments():
    (hidden, weight, bias), target = make_inputs()
    with pytest.raises(ValueError, match="reduction"):
        linear_target_loss(hidden, weight, target, reduction="avg")
    with pytest.raises(ValueError, match="weight must have shape"):
        linear_target_loss(hidden, weight.T, target)
    with pytest.raises(ValueError, match="bias must have shape"):
        linear_target_loss(hidden, weight, target, bias=bias[:3])
    with pytest.raises(ValueError, match="target must have shape"):
        linear_target_loss(hidden, weight, target[:5])
    with pytest.raises(TypeError, match="class indices"):
        linear_target_loss(hidden, weight, target.float())
    with pytest.raises(ValueError, match="found 50"):
        linear_target_loss(hidden, weight, torch.full_like(target, V))
    with pytest.raises(ValueError, match="chunk_size"):
        linear_target_loss(hidden, weight, target, chunk_size=0)
    with pytest.raises(ValueError, match="hidden must have shape"):
        linear_target_loss(hidden[0], weight, target[0])


def test_default_chunk_size():
    assert default_chunk_size(8192, 32000, 512) * 32000 * 4 <= 64 * 2**20
    assert default_chunk_size(8192, 128000, 512) == 256  # the floor of rows
    assert default_chunk_size(8192, 10**9, 64) == 32  # floor: H / 2
    assert default_chunk_size(8192, 1000, 128) == 128  # cap: the buffer <= the weight gradient
    assert default_chunk_size(3, 100) == 3
    assert default_chunk_size(8192, 10**9, 1) == 1
    sizes = [default_chunk_size(10**6, v, 4096) for v in (1000, 32000, 128000, 256000)]
    assert all(s & (s - 1) == 0 for s in sizes)  # powers of two
    assert sizes == sorted(sizes, reverse=True)


# --- the module ---------------------------------------------------------------------------------


def test_module_hyperparameters_are_schedulable():
    (hidden, weight, bias), target = make_inputs()
    criterion = LinearTargetLoss("gamma_ce", gamma=0.0)
    assert criterion.hyperparameters() == {"gamma": 0.0, "threshold": 0.0, "label_smoothing": 0.0}
    assert hyperparameter_names(criterion) == ["gamma", "threshold", "label_smoothing"]
    ce = criterion(hidden, weight, target, bias)
    torch.testing.assert_close(ce, F.cross_entropy(hidden @ weight.T + bias, target))
    criterion.gamma = 1.0
    expected = LF.gamma_cross_entropy(hidden @ weight.T + bias, target, gamma=1.0)
    torch.testing.assert_close(criterion(hidden, weight, target, bias), expected)
    assert "gamma=1.0" in repr(criterion)


def test_module_arguments():
    criterion = LinearTargetLoss("ce")
    assert not hasattr(criterion, "gamma")
    assert criterion.hyperparameters() == {"label_smoothing": 0.0}
    assert LinearTargetLoss("focal").gamma == 2.0
    assert LinearTargetLoss("adaptive_focal", gammas=(4, 2)).gammas == (4.0, 2.0)
    with pytest.raises(ValueError, match="no hyper-parameter 'margin'"):
        LinearTargetLoss("focal", margin=0.3)
    with pytest.raises(ValueError, match="available"):
        LinearTargetLoss("nope")
    with pytest.raises(ValueError, match="reduction"):
        LinearTargetLoss("ce", reduction="avg")


def test_module_class_weight_is_a_buffer_and_reaches_the_function():
    from lightning_losses.lightning.mixin import describe_criterion

    (hidden, weight, bias), target = make_inputs(ignore_every=6)
    class_weight = torch.linspace(0.5, 1.5, V)
    criterion = LinearTargetLoss("focal", gamma=1.0, class_weight=class_weight)
    assert "class_weight" in criterion.state_dict()
    expected = linear_target_loss(
        hidden, weight, target, loss="focal", gamma=1.0, bias=bias, class_weight=class_weight
    )
    torch.testing.assert_close(criterion(hidden, weight, target, bias), expected)
    assert criterion.double().class_weight.dtype == torch.float64  # follows the module
    described = describe_criterion(criterion)["init_args"]["class_weight"]
    torch.testing.assert_close(torch.tensor(described, dtype=torch.float64), class_weight.double())
    assert LinearTargetLoss("ce").class_weight is None
