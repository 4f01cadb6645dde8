"""Bad input raises ValueError / TypeError naming the offending argument; edge cases behave.

Also: a batch whose targets are all ignored gives 0 with a zero (not NaN) gradient under
"mean", and ``validate_args=False`` skips the value checks (the formula is then applied as is).
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_losses import NormFaceHead, available_losses, get_loss
from lightning_losses.functional import (
    adaptive_focal_loss,
    binary_focal_loss,
    binary_hard_truncated_loss,
    binary_soft_truncated_loss,
    cross_entropy,
    exact_loss,
    feature_incay,
    focal_loss,
    gamma_cross_entropy,
    hard_truncated_loss,
    linear_target_loss,
    multilabel_categorical_crossentropy,
    nm_categorical_crossentropy,
    normface_min_scale,
    soft_accuracy_loss,
    soft_truncated_loss,
)


def gen(seed):
    return torch.Generator().manual_seed(seed)


INDEX_LOSSES = [
    pytest.param(cross_entropy, id="cross_entropy"),
    pytest.param(gamma_cross_entropy, id="gamma_cross_entropy"),
    pytest.param(soft_accuracy_loss, id="soft_accuracy_loss"),
    pytest.param(focal_loss, id="focal_loss"),
    pytest.param(adaptive_focal_loss, id="adaptive_focal_loss"),
    pytest.param(hard_truncated_loss, id="hard_truncated_loss"),
    pytest.param(soft_truncated_loss, id="soft_truncated_loss"),
    pytest.param(exact_loss, id="exact_loss"),
]
# the losses that take logits [N, C, *] (EXACT takes [N, C] only)
INDEX_LOSSES_ND = [case for case in INDEX_LOSSES if case.id != "exact_loss"]
BINARY_LOSSES = [
    pytest.param(binary_focal_loss, id="binary_focal_loss"),
    pytest.param(binary_soft_truncated_loss, id="binary_soft_truncated_loss"),
    pytest.param(binary_hard_truncated_loss, id="binary_hard_truncated_loss"),
]
FLOAT_TARGET_LOSSES = [*BINARY_LOSSES, pytest.param(multilabel_categorical_crossentropy, id="ml")]


def index_inputs(n=6, c=4):
    x = torch.randn(n, c, generator=gen(0), dtype=torch.float64)
    t = torch.randint(0, c, (n,), generator=gen(1))
    return x, t


def soft_inputs(shape=(5, 3)):
    x = torch.randn(shape, generator=gen(2), dtype=torch.float64)
    y = torch.rand(shape, generator=gen(3), dtype=torch.float64)
    return x, y


# --- class-index targets ---------------------------------------------------------------------


@pytest.mark.parametrize("fn", INDEX_LOSSES)
@pytest.mark.parametrize("bad", [4, 7, -1, -5])
def test_target_out_of_range(fn, bad):
    # C = 4: 4 and 7 are too large, -1 and -5 are negative (and not ignore_index); on CPU our
    # check must fire before any indexing does.
    x, t = index_inputs()
    t[3] = bad
    with pytest.raises(ValueError, match="target") as info:
        fn(x, t)
    assert str(bad) in str(info.value)


@pytest.mark.parametrize("fn", INDEX_LOSSES_ND)
def test_target_out_of_range_with_extra_dims(fn):
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    t = torch.zeros(2, 4, dtype=torch.long)
    t[1, 2] = 3
    with pytest.raises(ValueError, match="target"):
        fn(x, t)


@pytest.mark.parametrize("fn", INDEX_LOSSES)
def test_ignore_index_is_not_out_of_range(fn):
    x, t = index_inputs()
    t[1] = 7
    assert torch.isfinite(fn(x, t, ignore_index=7))
    t[0] = -100  # the default ignore_index is an ordinary out-of-range value once it is changed
    with pytest.raises(ValueError, match="target"):
        fn(x, t, ignore_index=7)


@pytest.mark.parametrize("fn", INDEX_LOSSES)
@pytest.mark.parametrize(
    "target_shape",
    [(5,), (7,), (6, 1), (6, 4)],
    ids=["short", "long", "extra-dim", "one-hot-like"],
)
def test_target_shape_mismatch(fn, target_shape):
    x, _ = index_inputs()
    t = torch.zeros(target_shape, dtype=torch.long)
    with pytest.raises(ValueError, match="target"):
        fn(x, t)


@pytest.mark.parametrize("fn", INDEX_LOSSES)
def test_extra_dims_shape_mismatch(fn):
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    t = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"target|logits"):
        fn(x, t)


@pytest.mark.parametrize("fn", INDEX_LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_float_target_where_indices_expected(fn, dtype):
    x, t = index_inputs()
    with pytest.raises(TypeError, match="target"):
        fn(x, t.to(dtype))


@pytest.mark.parametrize("fn", INDEX_LOSSES)
def test_soft_target_same_shape_as_logits_is_type_error(fn):
    x, _ = index_inputs()
    with pytest.raises(TypeError, match="target"):
        fn(x, torch.softmax(x, 1))


@pytest.mark.parametrize("fn", INDEX_LOSSES)
def test_integer_logits(fn):
    _, t = index_inputs()
    with pytest.raises(TypeError, match="logits"):
        fn(torch.ones(6, 4, dtype=torch.long), t)


@pytest.mark.parametrize("fn", INDEX_LOSSES)
def test_one_dimensional_logits(fn):
    with pytest.raises(ValueError, match="logits"):
        fn(torch.randn(4), torch.tensor(1))


def test_exact_needs_two_dimensional_logits():
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    t = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="logits"):
        exact_loss(x, t)


@pytest.mark.parametrize("fn", [*INDEX_LOSSES, *FLOAT_TARGET_LOSSES])
@pytest.mark.parametrize("reduction", ["avg", "MEAN", "", None, "batchmean"])
def test_unknown_reduction(fn, reduction):
    float_target = fn in (
        binary_focal_loss,
        binary_soft_truncated_loss,
        binary_hard_truncated_loss,
        multilabel_categorical_crossentropy,
    )
    x, t = soft_inputs() if float_target else index_inputs()
    with pytest.raises(ValueError, match="reduction"):
        fn(x, t, reduction=reduction)


def test_unknown_reduction_other_functions():
    s = torch.randn(3, 2, 4)
    with pytest.raises(ValueError, match="reduction"):
        nm_categorical_crossentropy(s, torch.zeros(3, 2, dtype=torch.long), reduction="avg")
    with pytest.raises(ValueError, match="reduction"):
        feature_incay(torch.randn(3, 4), reduction="avg")


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (cross_entropy, "weight"),
        (gamma_cross_entropy, "weight"),
        (soft_accuracy_loss, "weight"),
        (hard_truncated_loss, "weight"),
        (soft_truncated_loss, "weight"),
        (focal_loss, "alpha"),
        (adaptive_focal_loss, "alpha"),
    ],
)
def test_class_vector_shape(fn, name):
    # the message names the argument the caller passed (weight or alpha)
    x, t = index_inputs()
    for shape in [(3,), (5,), (4, 1)]:
        with pytest.raises(ValueError, match=name):
            fn(x, t, **{name: torch.ones(shape, dtype=torch.float64)})


# --- hyper-parameters ------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [-0.1, -1.0, -1e-9, math.nan])
def test_negative_gamma_focal(gamma):
    x, t = index_inputs()
    with pytest.raises(ValueError, match="gamma"):
        focal_loss(x, t, gamma=gamma)
    xb, yb = soft_inputs()
    with pytest.raises(ValueError, match="gamma"):
        binary_focal_loss(xb, yb, gamma=gamma)


@pytest.mark.parametrize("gamma", [-0.1, -1e-9, 1.0 + 1e-9, 1.5, 2.0, math.nan])
def test_gamma_cross_entropy_gamma_outside_unit_interval(gamma):
    x, t = index_inputs()
    with pytest.raises(ValueError, match="gamma"):
        gamma_cross_entropy(x, t, gamma=gamma)


@pytest.mark.parametrize("gamma", [0.0, 1.0])
def test_gamma_cross_entropy_closed_interval_endpoints_are_allowed(gamma):
    x, t = index_inputs()
    p = torch.softmax(x, 1).gather(1, t[:, None])[:, 0]
    expected = -torch.log(p) if gamma == 0.0 else 1 - p
    torch.testing.assert_close(gamma_cross_entropy(x, t, gamma=gamma), expected.mean())


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_gamma_cross_entropy_threshold_range(threshold):
    x, t = index_inputs()
    with pytest.raises(ValueError, match="threshold"):
        gamma_cross_entropy(x, t, threshold=threshold)


def test_adaptive_focal_bad_hyperparameters():
    x, t = index_inputs()
    with pytest.raises(ValueError, match="gammas"):
        adaptive_focal_loss(x, t, thresholds=(0.2,), gammas=(5.0, -3.0))
    with pytest.raises(ValueError, match=r"gammas|thresholds"):
        adaptive_focal_loss(x, t, thresholds=(0.2, 0.5), gammas=(5.0, 3.0))
    with pytest.raises(ValueError, match="thresholds"):
        adaptive_focal_loss(x, t, thresholds=(0.5, 0.2), gammas=(5.0, 3.0, 1.0))


@pytest.mark.parametrize("margin", [-0.1, 1.5])
def test_hard_truncation_margin_range(margin):
    x, t = index_inputs()
    with pytest.raises(ValueError, match="margin"):
        hard_truncated_loss(x, t, margin=margin)
    xb, yb = soft_inputs()
    with pytest.raises(ValueError, match="margin"):
        binary_hard_truncated_loss(xb, yb, margin=margin)


@pytest.mark.parametrize("alpha", [-0.1, 1.5])
def test_binary_focal_alpha_range(alpha):
    x, y = soft_inputs()
    with pytest.raises(ValueError, match="alpha"):
        binary_focal_loss(x, y, alpha=alpha)


@pytest.mark.parametrize("sigma", [0.0, -1.0])
def test_exact_sigma_must_be_positive(sigma):
    x, t = index_inputs()
    with pytest.raises(ValueError, match="sigma"):
        exact_loss(x, t, sigma=sigma)
    tensor_sigma = torch.ones(6, dtype=torch.float64)
    tensor_sigma[2] = sigma
    with pytest.raises(ValueError, match="sigma"):
        exact_loss(x, t, sigma=tensor_sigma)


def test_exact_sigma_shape():
    x, t = index_inputs()
    with pytest.raises(ValueError, match="sigma"):
        exact_loss(x, t, sigma=torch.ones(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="sigma"):
        exact_loss(x, t, sigma=torch.ones(6, 1, dtype=torch.float64))


def test_nm_unknown_variant():
    with pytest.raises(ValueError, match="variant"):
        nm_categorical_crossentropy(
            torch.randn(3, 2, 4), torch.zeros(3, 2, dtype=torch.long), variant="symmetric"
        )


# --- float targets ---------------------------------------------------------------------------


@pytest.mark.parametrize("fn", FLOAT_TARGET_LOSSES)
def test_integer_target_where_floats_expected(fn):
    x, y = soft_inputs()
    with pytest.raises(TypeError, match="target"):
        fn(x, (y > 0.5).long())


@pytest.mark.parametrize("fn", FLOAT_TARGET_LOSSES)
def test_float_target_shape_mismatch(fn):
    x, _ = soft_inputs((5, 3))
    with pytest.raises(ValueError, match="target"):
        fn(x, torch.rand(5, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="target"):
        fn(x, torch.rand(5, dtype=torch.float64))


@pytest.mark.parametrize("fn", FLOAT_TARGET_LOSSES)
@pytest.mark.parametrize("bad", [1.5, -0.25, math.nan])
def test_soft_target_outside_unit_interval(fn, bad):
    x, y = soft_inputs()
    y[1, 2] = bad
    with pytest.raises(ValueError, match="target"):
        fn(x, y)


def ref_binary_focal(x, y, gamma):
    s = torch.sigmoid(x)
    return y * (-((1 - s) ** gamma) * torch.log(s)) + (1 - y) * (-(s**gamma) * torch.log(1 - s))


def test_validate_args_false_skips_soft_target_range():
    # y = 1.5 and -0.25: the (linear in y) formula is applied as written, without raising.
    x, y = soft_inputs()
    y[0, 0], y[2, 1] = 1.5, -0.25
    value = binary_focal_loss(x, y, gamma=2.0, reduction="none", validate_args=False)
    torch.testing.assert_close(value, ref_binary_focal(x, y, 2.0), rtol=1e-6, atol=1e-6)
    sig = torch.sigmoid
    soft = binary_soft_truncated_loss(x, y, k=1.0, reduction="none", validate_args=False)
    expected = y * (-sig(-x) * torch.log(sig(x))) + (1 - y) * (-sig(x) * torch.log(sig(-x)))
    torch.testing.assert_close(soft, expected, rtol=1e-6, atol=1e-6)
    # multi-label: no check of ours raises (weights outside [0, 1] have no log-space meaning,
    # so only rows with labels inside [0, 1] are compared with the formula)
    ml = multilabel_categorical_crossentropy(x, y, reduction="none", validate_args=False)
    assert ml.shape == (5,)
    ml_expected = torch.log(1 + (y * torch.exp(-x)).sum(1)) + torch.log(
        1 + ((1 - y) * torch.exp(x)).sum(1)
    )
    rows = [1, 3, 4]
    torch.testing.assert_close(ml[rows], ml_expected[rows], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fn", INDEX_LOSSES)
def test_validate_args_false_valid_targets_same_result(fn):
    x, t = index_inputs()
    t[2] = -100
    torch.testing.assert_close(fn(x, t, validate_args=False), fn(x, t))


# --- all targets ignored ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "shape"),
    [pytest.param(case.values[0], (5, 4), id=f"{case.id}-NC") for case in INDEX_LOSSES]
    + [pytest.param(case.values[0], (2, 4, 3), id=f"{case.id}-NCL") for case in INDEX_LOSSES_ND],
)
def test_all_ignored_mean_is_zero_with_zero_gradient(fn, shape):
    x = torch.randn(shape, generator=gen(4), dtype=torch.float64).requires_grad_()
    t = torch.full((shape[0], *shape[2:]), -100)
    for reduction in ("mean", "sum"):
        value = fn(x, t, reduction=reduction)
        (grad,) = torch.autograd.grad(value, x)
        assert value.item() == 0.0
        assert torch.all(grad == 0), grad
    none = fn(x, t, reduction="none")
    assert none.shape == t.shape
    assert torch.all(none == 0)


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (cross_entropy, "weight"),
        (gamma_cross_entropy, "weight"),
        (soft_accuracy_loss, "weight"),
        (hard_truncated_loss, "weight"),
        (soft_truncated_loss, "weight"),
        (focal_loss, "alpha"),
        (adaptive_focal_loss, "alpha"),
    ],
)
def test_all_ignored_weighted_mean_is_zero(fn, name):
    x = torch.randn(5, 4, generator=gen(5), dtype=torch.float64).requires_grad_()
    t = torch.full((5,), -100)
    value = fn(x, t, **{name: torch.rand(4, dtype=torch.float64) + 0.5})
    (grad,) = torch.autograd.grad(value, x)
    assert value.item() == 0.0
    assert torch.all(grad == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_all_ignored_half_and_float(dtype):
    x = torch.randn(5, 4, generator=gen(6)).to(dtype).requires_grad_()
    t = torch.full((5,), -100)
    value = focal_loss(x, t, gamma=0.5)
    (grad,) = torch.autograd.grad(value, x)
    assert value.item() == 0.0
    assert torch.all(grad == 0)


def test_multilabel_row_all_ignored():
    x, y = soft_inputs((4, 3))
    y[2] = -100
    with pytest.raises(ValueError, match="target"):
        multilabel_categorical_crossentropy(x, y)
    # a partly ignored row is fine
    y[2, 0] = 1.0
    assert torch.isfinite(multilabel_categorical_crossentropy(x, y))


# --- n-by-m targets --------------------------------------------------------------------------


def test_nm_target_checks():
    s = torch.randn(3, 2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="target"):
        nm_categorical_crossentropy(s, torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="target"):
        nm_categorical_crossentropy(s, torch.full((3, 2), 4))
    with pytest.raises(ValueError, match="target"):
        nm_categorical_crossentropy(s, torch.full((3, 2), -1))
    with pytest.raises(ValueError, match="target"):
        nm_categorical_crossentropy(s, torch.rand(3, 2, 5, dtype=torch.float64))
    bad = torch.full((3, 2, 4), 0.25, dtype=torch.float64)
    bad[0, 0] = torch.tensor([1.5, -0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="target"):
        nm_categorical_crossentropy(s, bad)
    with pytest.raises(ValueError, match="logits"):
        nm_categorical_crossentropy(torch.randn(3, 4), torch.zeros(3, dtype=torch.long))


# --- NormFace --------------------------------------------------------------------------------


def test_feature_incay_zero_norm_row():
    f = torch.randn(4, 3, dtype=torch.float64)
    f[1] = 0
    with pytest.raises(ValueError, match="features"):
        feature_incay(f)


@pytest.mark.parametrize("kind", ["normface", "cosface", "arcface"])
def test_head_zero_norm_features_give_zero_cosines(kind):
    # A ReLU backbone can output an all-zero feature row; training must not stop on it.
    margin = 0.2 if kind != "normface" else 0.0
    # Seeded: unseeded, the draw depended on the tests run before in the same process, and one
    # draw failed the arcface case in CI (not investigated further this session).
    torch.manual_seed(0)
    head = NormFaceHead(3, 4, scale=10.0, margin=margin, kind=kind).double()
    f = torch.randn(4, 3, dtype=torch.float64)
    f[2] = 0
    f.requires_grad_(True)
    target = torch.tensor([0, 1, 2, 3])
    w = head.weight.detach()
    unit_w = w / w.norm(dim=1, keepdim=True)
    # reference: plain cosines, zero for the zero row
    cos = torch.zeros(4, 4, dtype=torch.float64)
    for i in (0, 1, 3):
        cos[i] = unit_w @ (f[i].detach() / f[i].detach().norm())
    torch.testing.assert_close(head(f), 10.0 * cos)
    logits = head(f, target)
    expected = cos.clone()
    if kind == "cosface":
        expected[torch.arange(4), target] -= margin
    elif kind == "arcface":
        expected[torch.arange(4), target] = torch.cos(
            torch.arccos(cos[torch.arange(4), target]) + margin
        )
    torch.testing.assert_close(logits, 10.0 * expected)
    upstream = torch.randn(4, 4, dtype=torch.float64)
    (grad,) = torch.autograd.grad((logits * upstream).sum(), f)
    assert torch.isfinite(grad).all()
    if kind == "normface":
        # the zero row is divided by 1: its gradient is scale * upstream @ unit_weight
        torch.testing.assert_close(grad[2], 10.0 * upstream[2] @ unit_w)


def test_head_bad_arguments():
    with pytest.raises(ValueError, match="kind"):
        NormFaceHead(3, 4, kind="sphereface")
    with pytest.raises(ValueError, match="margin"):
        NormFaceHead(3, 4, margin=-0.1, kind="cosface")
    with pytest.raises(ValueError, match="scale"):
        NormFaceHead(3, 4, scale=0.0)
    with pytest.raises(ValueError, match="scale"):
        NormFaceHead(3, 4, scale=-2.0)


@pytest.mark.parametrize(("c", "p"), [(1, 0.9), (0, 0.5), (10, 0.0), (10, 1.0), (10, 1.5)])
def test_normface_min_scale_bad_arguments(c, p):
    name = "num_classes" if c < 2 else "p"
    with pytest.raises(ValueError, match=name):
        normface_min_scale(c, p)


# --- registry --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Focal", "focal_loss", "", "cross_entropy", "xent"])
def test_unknown_loss_name(name):
    with pytest.raises(ValueError, match="unknown loss name") as info:
        get_loss(name)
    message = str(info.value)
    assert repr(name) in message or f'"{name}"' in message
    for available in available_losses():
        assert available in message


# --- class weights and alpha: finite and >= 0 ---------------------------------------------------

WEIGHTED_LOSSES = [
    pytest.param(cross_entropy, "weight", id="cross_entropy"),
    pytest.param(gamma_cross_entropy, "weight", id="gamma_cross_entropy"),
    pytest.param(soft_accuracy_loss, "weight", id="soft_accuracy_loss"),
    pytest.param(hard_truncated_loss, "weight", id="hard_truncated_loss"),
    pytest.param(soft_truncated_loss, "weight", id="soft_truncated_loss"),
    pytest.param(focal_loss, "alpha", id="focal_loss"),
    pytest.param(adaptive_focal_loss, "alpha", id="adaptive_focal_loss"),
]


@pytest.mark.parametrize(("fn", "name"), WEIGHTED_LOSSES)
@pytest.mark.parametrize("bad", [-1.0, -(2.0**-40), math.nan, math.inf])
@pytest.mark.parametrize("as_tensor", [True, False], ids=["tensor", "list"])
def test_negative_or_non_finite_class_weight(fn, name, bad, as_tensor):
    x, t = index_inputs()
    vector = [1.0, bad, 0.5, 2.0]
    with pytest.raises(ValueError, match=rf"{name} must hold finite weights >= 0") as info:
        fn(x, t, **{name: torch.tensor(vector) if as_tensor else vector})
    assert "class 1" in str(info.value)
    assert repr(bad) in str(info.value)


def test_negative_weight_example_from_the_issue():
    # A negative weight used to give a negative cross-entropy (-19.3 here, where the weights'
    # intent is unclear and F.cross_entropy gives 2.42); it is an error now.
    x = torch.tensor([[0.0, 3.0, 0.0], [2.0, 0.0, 0.0]])
    t = torch.tensor([0, 1])
    weight = torch.tensor([1.0, -0.9, 1.0])
    with pytest.raises(ValueError, match="weight"):
        cross_entropy(x, t, weight=weight)
    with pytest.raises(ValueError, match="alpha"):
        focal_loss(x, t, alpha=weight)


@pytest.mark.parametrize(("fn", "name"), WEIGHTED_LOSSES)
def test_validate_args_false_skips_the_weight_values(fn, name):
    # The value check reads the tensor (a device synchronisation); validate_args=False skips
    # it like the other value checks, and the formula is applied with the weights as given.
    x, t = index_inputs()
    t[:] = torch.tensor([0, 1, 2, 3, 0, 1])
    vector = torch.tensor([1.0, -1.0, 0.5, 2.0], dtype=torch.float64)
    value = fn(x, t, **{name: vector}, reduction="none", validate_args=False)
    plain = fn(x, t, reduction="none")
    torch.testing.assert_close(value, plain * vector[t])


@pytest.mark.parametrize(("fn", "name"), WEIGHTED_LOSSES)
def test_weights_of_the_present_classes_summing_to_zero_give_zero(fn, name):
    # "mean" divides by the sum of the weights of the non-ignored targets (focal: by their
    # number); with every present class weighted 0 the mean is 0 with a zero gradient, as for a
    # batch whose targets are all ignored.
    x = torch.randn(6, 4, generator=gen(7), dtype=torch.float64).requires_grad_()
    t = torch.tensor([0, 2, 2, 0, -100, 2])
    vector = torch.tensor([0.0, 1.0, 0.0, 3.0], dtype=torch.float64)
    for reduction in ("mean", "sum"):
        value = fn(x, t, **{name: vector}, reduction=reduction)
        (grad,) = torch.autograd.grad(value, x)
        assert value.item() == 0.0
        assert torch.all(grad == 0)


# --- NaN and infinite logits --------------------------------------------------------------------


def all_loss_calls(x_index, t_index, x_soft, y_soft):
    """(name, call) for every loss of lightning_losses.functional, on the given inputs."""
    s = x_index.reshape(x_index.shape[0], 2, -1)
    return [
        *[(case.id, lambda fn=case.values[0]: fn(x_index, t_index)) for case in INDEX_LOSSES],
        *[(case.id, lambda fn=case.values[0]: fn(x_soft, y_soft)) for case in FLOAT_TARGET_LOSSES],
        ("nm", lambda: nm_categorical_crossentropy(s, t_index[:, None].repeat(1, 2) % 2)),
    ]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_finite_logits_raise_naming_logits(bad, dtype):
    x, t = index_inputs()
    x, t = x.to(dtype), t % 2  # every loss gets its own valid target
    xs, ys = soft_inputs((6, 4))
    x[4, 1] = bad
    xs = xs.to(dtype)
    xs[4, 1] = bad
    for name, call in all_loss_calls(x, t, xs, ys.to(dtype)):
        with pytest.raises(ValueError, match="logits must be finite") as info:
            call()
        assert "logits[4, 1]" in str(info.value) or "logits[4, 0, 1]" in str(info.value), name


def test_non_finite_logits_pass_through_without_validation():
    # validate_args=False skips the check (it reads every logit): the NaN reaches the result.
    x, t = index_inputs()
    x[2, 0] = math.nan
    assert torch.isnan(cross_entropy(x, t, validate_args=False))
    assert torch.isnan(focal_loss(x, t, reduction="none", validate_args=False)[2])


def test_non_finite_features_raise_naming_features():
    f = torch.randn(4, 3, dtype=torch.float64)
    f[1, 2] = math.inf
    with pytest.raises(ValueError, match="features must be finite"):
        feature_incay(f)
    # a row so small that 1/||f||^2 overflows float32 is an error too, not a silent inf
    tiny = torch.randn(4, 3)
    tiny[2] = 1e-20  # norm 1.7e-20: 1/||f||^2 = 3e39 > float32's largest, 3.4e38
    with pytest.raises(ValueError, match="features") as info:
        feature_incay(tiny)
    assert "row [2]" in str(info.value)


# --- n-by-m soft labels sum to 1 per task --------------------------------------------------------


@pytest.mark.parametrize("variant", ["pairwise", "centered"])
def test_nm_soft_labels_must_sum_to_one_per_task(variant):
    s = torch.randn(3, 2, 4, dtype=torch.float64)
    t = torch.softmax(torch.randn(3, 2, 4, generator=gen(8), dtype=torch.float64), -1)
    nm_categorical_crossentropy(s, t, variant=variant)  # a distribution per task: fine
    bad = t.clone()
    bad[1, 0] = torch.tensor([0.2, 0.2, 0.2, 0.2], dtype=torch.float64)  # sums to 0.8
    with pytest.raises(ValueError, match="target must hold probabilities that sum to 1") as info:
        nm_categorical_crossentropy(s, bad, variant=variant)
    assert "0.8" in str(info.value)
    assert "[1, 0]" in str(info.value)
    # skipped with validate_args=False (the formula is then applied to the labels as given)
    assert torch.isfinite(nm_categorical_crossentropy(s, bad, variant=variant, validate_args=False))


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [(torch.float64, 1e-3), (torch.float32, 1e-3), (torch.float16, 4 * 2**-10)],
)
def test_nm_soft_label_sum_tolerance(dtype, tolerance):
    s = torch.zeros(1, 1, 2, dtype=torch.float64)
    inside = torch.tensor([[[0.5, 0.5 + 0.9 * tolerance]]], dtype=torch.float64).to(dtype)
    outside = torch.tensor([[[0.5, 0.5 + 1.5 * tolerance]]], dtype=torch.float64).to(dtype)
    assert torch.isfinite(nm_categorical_crossentropy(s.to(dtype), inside))
    with pytest.raises(ValueError, match="target"):
        nm_categorical_crossentropy(s.to(dtype), outside)


# --- tensors on two devices -----------------------------------------------------------------------


def assert_device_error(call, name, other):
    """The call raises ValueError naming both tensors and both devices.

    Meta stands in for an accelerator: no GPU is needed to put a tensor on another device.
    """
    with pytest.raises(ValueError, match="one device") as info:
        call()
    message = str(info.value)
    assert f"{name} is on meta" in message, message
    assert f"{other} is on cpu" in message, message


@pytest.mark.parametrize("fn", INDEX_LOSSES)
def test_index_target_on_another_device(fn):
    x, t = index_inputs()
    assert_device_error(lambda: fn(x, t.to("meta")), "target", "logits")


@pytest.mark.parametrize(("fn", "name"), WEIGHTED_LOSSES)
def test_class_weight_on_another_device(fn, name):
    x, t = index_inputs()
    vector = torch.ones(4, dtype=torch.float64, device="meta")
    assert_device_error(lambda: fn(x, t, **{name: vector}), name, "logits")


@pytest.mark.parametrize("fn", FLOAT_TARGET_LOSSES)
def test_soft_target_on_another_device(fn):
    x, y = soft_inputs()
    assert_device_error(lambda: fn(x, y.to("meta")), "target", "logits")


def test_nm_and_exact_tensors_on_another_device():
    s = torch.randn(3, 2, 4, dtype=torch.float64)
    index = torch.zeros(3, 2, dtype=torch.long)
    assert_device_error(
        lambda: nm_categorical_crossentropy(s, index.to("meta")), "target", "logits"
    )
    soft = torch.full((3, 2, 4), 0.25, dtype=torch.float64, device="meta")
    assert_device_error(lambda: nm_categorical_crossentropy(s, soft), "target", "logits")
    x, t = index_inputs()
    sigma = torch.ones(6, dtype=torch.float64, device="meta")
    assert_device_error(lambda: exact_loss(x, t, sigma=sigma), "sigma", "logits")


def linear_inputs():
    hidden = torch.randn(5, 3, generator=gen(9), dtype=torch.float64)
    weight = torch.randn(4, 3, generator=gen(10), dtype=torch.float64)
    return hidden, weight, torch.tensor([0, 3, -100, 1, 2])


@pytest.mark.parametrize(
    ("name", "other"),
    [("weight", "hidden"), ("bias", "hidden"), ("target", "hidden"), ("class_weight", "weight")],
)
def test_linear_target_loss_tensors_on_another_device(name, other):
    # hidden sets the device of the call; the class weights must be on the output weight's
    hidden, weight, target = linear_inputs()
    tensors = {"weight": weight, "target": target}
    tensors["bias"] = torch.zeros(4, dtype=torch.float64)
    tensors["class_weight"] = torch.ones(4, dtype=torch.float64)
    tensors[name] = tensors[name].to("meta")
    assert_device_error(lambda: linear_target_loss(hidden, loss="ce", **tensors), name, other)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_linear_target_loss_class_weight_values(bad):
    hidden, weight, target = linear_inputs()
    class_weight = [1.0, 1.0, bad, 0.5]
    with pytest.raises(ValueError, match="class_weight must hold finite weights >= 0"):
        linear_target_loss(hidden, weight, target, loss="ce", class_weight=class_weight)
    # skipped with validate_args=False, as the other value checks
    linear_target_loss(
        hidden, weight, target, loss="ce", class_weight=class_weight, validate_args=False
    )


@pytest.mark.parametrize("name", ["hidden", "weight", "bias"])
def test_linear_target_loss_non_finite_inputs(name):
    hidden, weight, target = linear_inputs()
    tensors = {"hidden": hidden, "weight": weight, "bias": torch.zeros(4, dtype=torch.float64)}
    tensors[name][1] = math.nan
    with pytest.raises(ValueError, match=rf"{name} must be finite"):
        linear_target_loss(
            tensors["hidden"], tensors["weight"], target, bias=tensors["bias"], loss="focal"
        )
