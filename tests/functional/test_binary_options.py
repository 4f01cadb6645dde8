"""``pos_weight`` and ``ignore_index`` of the binary (sigmoid) losses and their modules.

References: :func:`torch.nn.functional.binary_cross_entropy_with_logits` with its own
``pos_weight`` (focal loss at ``gamma = 0`` without ``alpha``), plain float64 formulas written
here (``sigmoid`` as ``1 / (1 + exp(-x))``, ``log`` of it), and the loss of the non-ignored
elements computed by hand.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lightning_losses as LL
from lightning_losses import BinaryFocalLoss, BinaryHardTruncatedLoss, BinarySoftTruncatedLoss
from lightning_losses.functional import (
    binary_focal_loss,
    binary_hard_truncated_loss,
    binary_soft_truncated_loss,
)
from lightning_losses.lightning.mixin import LossMixin, build_criterion, describe_criterion

IGNORE = -100


def assert_close(actual, expected, tol=1e-12):
    torch.testing.assert_close(
        actual.double(), expected.double(), rtol=tol, atol=tol, check_dtype=False
    )


def gen(seed):
    return torch.Generator().manual_seed(seed)


def leaf(x):
    return x.detach().clone().requires_grad_()


def reduce(values, reduction):
    if reduction == "none":
        return values
    return values.sum() if reduction == "sum" else values.mean()


def inputs(shape, seed, *, soft=True, avoid=()):
    """float64 logits and targets; logits keep 1e-3 away from the margins in ``avoid``."""
    g = gen(seed)
    for _ in range(100):
        x = 3 * torch.randn(shape, generator=g, dtype=torch.float64)
        s = 1 / (1 + torch.exp(-x))
        if all(((s - m).abs().min() > 1e-3 and (1 - s - m).abs().min() > 1e-3) for m in avoid):
            break
    if soft:
        y = torch.rand(shape, generator=g, dtype=torch.float64)
    else:
        y = torch.randint(0, 2, shape, generator=g).double()
    return x, y


def weights(shape, seed):
    return 0.25 + 2 * torch.rand(shape, generator=gen(seed), dtype=torch.float64)


# --- plain float64 references ---------------------------------------------------------------


def ref_focal(x, y, w, *, gamma, alpha=None):
    s = 1 / (1 + torch.exp(-x))
    a = 1.0 if alpha is None else alpha
    b = 1.0 if alpha is None else 1 - alpha
    positive = -a * w * (1 - s) ** gamma * torch.log(s)
    negative = -b * s**gamma * torch.log(1 - s)
    return y * positive + (1 - y) * negative


def ref_soft_truncated(x, y, w, *, k):
    s = 1 / (1 + torch.exp(-x))
    positive = -w * (1 / (1 + torch.exp(k * x))) * torch.log(s)
    negative = -(1 / (1 + torch.exp(-k * x))) * torch.log(1 - s)
    return y * positive + (1 - y) * negative


def ref_hard_truncated(x, y, w, *, margin):
    s = 1 / (1 + torch.exp(-x))
    zero = torch.zeros_like(s)
    positive = torch.where(s <= margin, -w * torch.log(s), zero)
    negative = torch.where(1 - s <= margin, -torch.log(1 - s), zero)
    return y * positive + (1 - y) * negative


LOSSES = [
    pytest.param(binary_focal_loss, ref_focal, {"gamma": 2.0, "alpha": 0.25}, id="focal-2-a"),
    pytest.param(binary_focal_loss, ref_focal, {"gamma": 0.5}, id="focal-0.5"),
    pytest.param(binary_soft_truncated_loss, ref_soft_truncated, {"k": 1.5}, id="soft"),
    pytest.param(binary_hard_truncated_loss, ref_hard_truncated, {"margin": 0.7}, id="hard"),
]


# --- pos_weight ------------------------------------------------------------------------------

#: (target shape, pos_weight shape): every form binary_cross_entropy_with_logits accepts
POS_WEIGHT_SHAPES = [
    ((7,), ()),
    ((7,), (1,)),
    ((7,), (7,)),
    ((6, 5), (5,)),
    ((6, 5), (1, 5)),
    ((6, 5), (6, 5)),
    ((3, 4, 5, 2), (4, 1, 1)),
    ((3, 4, 5, 2), (5, 2)),
    ((3, 4, 5, 2), (3, 4, 5, 2)),
]


@pytest.mark.parametrize(("shape", "pw_shape"), POS_WEIGHT_SHAPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
def test_focal_at_gamma_zero_is_bce_with_pos_weight(shape, pw_shape, reduction, soft):
    x, y = inputs(shape, seed=1, soft=soft)
    pw = weights(pw_shape, seed=2)
    xa, xr, pwa, pwr = leaf(x), leaf(x), leaf(pw), leaf(pw)
    actual = binary_focal_loss(xa, y, gamma=0.0, pos_weight=pwa, reduction=reduction)
    expected = F.binary_cross_entropy_with_logits(xr, y, pos_weight=pw, reduction=reduction)
    assert actual.shape == expected.shape
    assert actual.dtype == torch.float64
    assert_close(actual, expected)
    upstream = torch.randn(expected.shape, generator=gen(3), dtype=torch.float64)
    grad_x, grad_pw = torch.autograd.grad((actual * upstream).sum(), (xa, pwa))
    assert_close(grad_x, torch.autograd.grad((expected * upstream).sum(), xr)[0])
    # BCE is not differentiable in pos_weight: its gradient against the plain formula
    formula = reduce(-pwr * y * F.logsigmoid(x) - (1 - y) * F.logsigmoid(-x), reduction)
    assert_close(grad_pw, torch.autograd.grad((formula * upstream).sum(), pwr)[0])


@pytest.mark.parametrize(("fn", "ref", "hp"), LOSSES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(("shape", "pw_shape"), [((6, 5), (5,)), ((2, 3, 4, 4), (3, 1, 1))])
def test_pos_weight_against_formula(fn, ref, hp, reduction, shape, pw_shape):
    # gamma > 0 with alpha: alpha * pos_weight on the positive term, 1 - alpha on the negative
    x, y = inputs(shape, seed=4, avoid=(hp.get("margin", 2.0),))
    pw = weights(pw_shape, seed=5)
    xa, xr = leaf(x), leaf(x)
    actual = fn(xa, y, **hp, pos_weight=pw, reduction=reduction)
    expected = reduce(ref(xr, y, pw, **hp), reduction)
    assert_close(actual, expected)
    upstream = torch.randn(expected.shape, generator=gen(6), dtype=torch.float64)
    grad = torch.autograd.grad((actual * upstream).sum(), xa)[0]
    assert_close(grad, torch.autograd.grad((expected * upstream).sum(), xr)[0])


def test_pos_weight_one_changes_nothing_and_two_doubles_the_positive_term():
    x, y = inputs((4, 3), seed=7, soft=False)
    plain = binary_focal_loss(x, y, reduction="none")
    ones = binary_focal_loss(x, y, pos_weight=torch.ones(3, dtype=torch.float64), reduction="none")
    twos = binary_focal_loss(x, y, pos_weight=torch.full((3,), 2.0), reduction="none")
    assert torch.equal(plain, ones)
    assert_close(twos, torch.where(y == 1, 2 * plain, plain))


def test_pos_weight_with_half_logits_is_computed_in_float32():
    x, y = inputs((8, 4), seed=8)
    pw = weights((4,), seed=9)
    actual = binary_focal_loss(x.half(), y.half(), gamma=2.0, pos_weight=pw.float())
    assert actual.dtype == torch.float32
    expected = ref_focal(x.half().double(), y.half().double(), pw.float().double(), gamma=2.0)
    assert_close(actual, expected.mean(), tol=1e-5)


# --- ignore_index ----------------------------------------------------------------------------


def ignored(shape, seed, fraction=0.4):
    return torch.rand(shape, generator=gen(seed)) < fraction


@pytest.mark.parametrize(("fn", "ref", "hp"), LOSSES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("with_pos_weight", [False, True], ids=["plain", "pos_weight"])
@pytest.mark.parametrize("ignore_index", [IGNORE, -1, 255])
def test_ignore_index_is_the_loss_of_the_other_elements(
    fn, ref, hp, reduction, with_pos_weight, ignore_index
):
    x, y = inputs((6, 5), seed=10, avoid=(hp.get("margin", 2.0),))
    mask = ignored(y.shape, seed=11)
    assert 0 < int(mask.sum()) < mask.numel()
    target = torch.where(mask, float(ignore_index), y)
    pw = weights((5,), seed=12) if with_pos_weight else None
    xa, xr = leaf(x), leaf(x)
    kwargs = {**hp, "pos_weight": pw, "reduction": reduction}
    if ignore_index != IGNORE:
        kwargs["ignore_index"] = ignore_index
    actual = fn(xa, target, **kwargs)
    # by hand: the per-element loss of the kept elements only
    values = ref(xr, y, 1.0 if pw is None else pw, **hp)
    if reduction == "none":
        expected = torch.where(mask, torch.zeros_like(values), values)
    else:
        expected = reduce(values[~mask], reduction)
    assert actual.shape == expected.shape
    assert_close(actual, expected)
    if reduction == "none":
        assert bool((actual[mask] == 0).all())
    upstream = torch.randn(expected.shape, generator=gen(13), dtype=torch.float64)
    grad = torch.autograd.grad((actual * upstream).sum(), xa)[0]
    assert bool((grad[mask] == 0).all())
    assert_close(grad, torch.autograd.grad((expected * upstream).sum(), xr)[0])


@pytest.mark.parametrize(("fn", "ref", "hp"), LOSSES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_all_ignored_gives_zero_and_zero_gradient(fn, ref, hp, reduction):
    x = leaf(inputs((3, 4), seed=14)[0])
    target = torch.full((3, 4), float(IGNORE), dtype=torch.float64)
    loss = fn(x, target, **hp, pos_weight=weights((4,), seed=15), reduction=reduction)
    expected_shape = (3, 4) if reduction == "none" else ()
    assert loss.shape == expected_shape
    assert bool((loss == 0).all())
    (grad,) = torch.autograd.grad(loss.sum(), x)
    assert torch.equal(grad, torch.zeros_like(grad))


def test_ignore_index_none_ignores_nothing():
    x, y = inputs((5, 3), seed=16)
    assert torch.equal(
        binary_focal_loss(x, y, ignore_index=None), binary_focal_loss(x, y, ignore_index=IGNORE)
    )
    with pytest.raises(ValueError, match=r"target values must lie in \[0, 1\]; found -100"):
        binary_focal_loss(x, torch.where(y > 0.5, -100.0, y), ignore_index=None)


def test_ignore_index_is_only_skipped_by_the_target_check():
    x, y = inputs((5, 3), seed=17)
    with pytest.raises(ValueError, match=r"target .*\(or ignore_index=-100\); found -1"):
        binary_soft_truncated_loss(x, torch.where(y > 0.5, -1.0, y))
    # with validate_args=False the ignored elements still contribute nothing
    target = torch.where(y > 0.5, float(IGNORE), y)
    assert_close(
        binary_hard_truncated_loss(x, target, reduction="sum", validate_args=False),
        binary_hard_truncated_loss(x[y <= 0.5], y[y <= 0.5], reduction="sum"),
    )


# --- the modules -----------------------------------------------------------------------------

MODULES = [
    pytest.param(BinaryFocalLoss, binary_focal_loss, {"gamma": 1.5, "alpha": 0.3}, id="focal"),
    pytest.param(BinarySoftTruncatedLoss, binary_soft_truncated_loss, {"k": 2.0}, id="soft"),
    pytest.param(BinaryHardTruncatedLoss, binary_hard_truncated_loss, {"margin": 0.6}, id="hard"),
]


@pytest.mark.parametrize(("cls", "fn", "hp"), MODULES)
def test_module_calls_the_function_with_pos_weight_and_ignore_index(cls, fn, hp):
    x, y = inputs((6, 4), seed=18, avoid=(hp.get("margin", 2.0),))
    target = torch.where(ignored(y.shape, seed=19), -1.0, y)
    pw = weights((4,), seed=20)
    criterion = cls(**hp, pos_weight=pw, ignore_index=-1).double()
    assert criterion.pos_weight.dtype == torch.float64
    expected = fn(x, target, **hp, pos_weight=pw.float().double(), ignore_index=-1)
    assert_close(criterion(x, target), expected)
    # pos_weight and ignore_index are options, not scheduled or logged hyper-parameters
    assert set(criterion.hyperparameters()) == set(hp) | ({"alpha"} if "gamma" in hp else set())
    assert criterion.options()["ignore_index"] == -1


@pytest.mark.parametrize(("cls", "fn", "hp"), MODULES)
def test_module_pos_weight_is_a_buffer(cls, fn, hp):
    criterion = cls(**hp, pos_weight=[1.0, 2.0, 3.0])
    state = criterion.state_dict()
    assert list(state) == ["pos_weight"]
    assert torch.equal(state["pos_weight"], torch.tensor([1.0, 2.0, 3.0]))
    assert "pos_weight" not in cls(**hp).state_dict()  # unset: nothing saved
    moved = criterion.to(torch.float64)
    assert moved.pos_weight.dtype == torch.float64
    twin = copy.deepcopy(criterion)
    assert torch.equal(twin.pos_weight, criterion.pos_weight)
    twin.pos_weight.mul_(2)
    assert torch.equal(criterion.pos_weight, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    loaded = cls(**hp, pos_weight=[0.0, 0.0, 0.0])
    loaded.load_state_dict(state)
    assert torch.equal(loaded.pos_weight, torch.tensor([1.0, 2.0, 3.0]))


def test_module_description_rebuilds_the_same_loss():
    criterion = LL.get_loss("binary_focal", gamma=1.0, pos_weight=[2.0, 0.5], ignore_index=-1)
    description = describe_criterion(criterion)
    assert description["init_args"]["pos_weight"] == [2.0, 0.5]
    assert description["init_args"]["ignore_index"] == -1
    rebuilt = build_criterion(description)
    x, y = inputs((5, 2), seed=21)
    target = torch.where(ignored(y.shape, seed=22), -1.0, y)
    assert torch.equal(rebuilt(x, target), criterion(x, target))
    assert describe_criterion(BinaryHardTruncatedLoss(ignore_index=None))["init_args"] == {
        "margin": 0.5,
        "pos_weight": None,
        "ignore_index": None,
        "reduction": "mean",
        "validate_args": True,
    }


class _Model(LossMixin, nn.Module):
    def __init__(self, criterion: nn.Module) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 3)
        self.set_criterion(criterion)


def test_checkpoint_without_pos_weight_loads_into_a_loss_with_it_and_back():
    # a checkpoint saved before pos_weight existed (or without one) has no criterion entries
    old = _Model(BinaryFocalLoss())
    checkpoint = {"state_dict": old.state_dict()}
    assert not any(key.startswith("criterion.") for key in checkpoint["state_dict"])
    new = _Model(BinaryFocalLoss(pos_weight=[1.0, 2.0, 4.0]))
    new.on_load_checkpoint(checkpoint)
    new.load_state_dict(checkpoint["state_dict"], strict=True)
    assert torch.equal(new.criterion.pos_weight, torch.tensor([1.0, 2.0, 4.0]))
    assert torch.equal(new.layer.weight, old.layer.weight)
    # and a checkpoint with a pos_weight loads into a criterion without one
    checkpoint = {"state_dict": new.state_dict()}
    plain = _Model(BinaryFocalLoss())
    plain.on_load_checkpoint(checkpoint)
    plain.load_state_dict(checkpoint["state_dict"], strict=True)
    assert plain.criterion.pos_weight is None


# --- errors ----------------------------------------------------------------------------------


def test_pos_weight_shape_error_names_the_expected_form():
    x, y = inputs((8, 5), seed=23)
    message = (
        "pos_weight must broadcast to the target's shape [8, 5] (for [N, C] targets: one weight "
        "per class, shape [5]); got shape [4]"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        binary_focal_loss(x, y, pos_weight=torch.ones(4))
    x, y = inputs((2, 3, 4, 4), seed=24)
    with pytest.raises(ValueError, match=re.escape("shape [3, 1, 1]); got shape [3]")):
        binary_soft_truncated_loss(x, y, pos_weight=torch.ones(3))
    x, y = inputs((6,), seed=25)
    with pytest.raises(ValueError, match=r"pos_weight .* \[6\] \(for \[N\] targets"):
        binary_hard_truncated_loss(x, y, pos_weight=torch.ones(2))


@pytest.mark.parametrize(
    ("pos_weight", "error", "match"),
    [
        (torch.ones(2, 1, 5), ValueError, r"pos_weight must broadcast .* got shape \[2, 1, 5\]"),
        ([1.0] * 5, TypeError, "pos_weight must be a floating-point tensor .* got list"),
        (torch.ones(5, dtype=torch.long), TypeError, "pos_weight .* got dtype torch.int64"),
        (torch.tensor([1.0, float("nan"), 1.0, 1.0, 1.0]), ValueError, "pos_weight must be finite"),
        (torch.tensor([1.0, 1.0, 1.0, float("inf"), 1.0]), ValueError, "pos_weight must be finite"),
        (
            torch.tensor([1.0, 1.0, -0.5, 1.0, 1.0]),
            ValueError,
            r"pos_weight .*>= 0.*pos_weight\[2\]",
        ),
        (torch.ones(5, device="meta"), ValueError, "pos_weight is on meta but logits is on cpu"),
    ],
    ids=["enlarges", "list", "integer", "nan", "inf", "negative", "device"],
)
@pytest.mark.parametrize("fn", [binary_focal_loss, binary_soft_truncated_loss])
def test_bad_pos_weight(fn, pos_weight, error, match):
    x, y = inputs((8, 5), seed=26)
    with pytest.raises(error, match=match):
        fn(x, y, pos_weight=pos_weight)


def test_pos_weight_values_are_checked_only_with_validate_args():
    x, y = inputs((4, 2), seed=27, soft=False)
    pw = torch.tensor([-1.0, 2.0], dtype=torch.float64)
    actual = binary_focal_loss(x, y, gamma=0.0, pos_weight=pw, validate_args=False)
    assert_close(actual, F.binary_cross_entropy_with_logits(x, y, pos_weight=pw))


@pytest.mark.parametrize(
    ("ignore_index", "error", "match"),
    [
        (0, ValueError, r"ignore_index must lie outside \[0, 1\].*or be None.*; got 0"),
        (1, ValueError, r"ignore_index must lie outside \[0, 1\].*or be None.*; got 1"),
        (-1.0, TypeError, "ignore_index must be an int; got -1.0"),
        (True, TypeError, "ignore_index must be an int; got True"),
    ],
)
@pytest.mark.parametrize(
    "fn", [binary_focal_loss, binary_soft_truncated_loss, binary_hard_truncated_loss]
)
def test_bad_ignore_index(fn, ignore_index, error, match):
    x, y = inputs((4, 3), seed=28)
    with pytest.raises(error, match=match):
        fn(x, y, ignore_index=ignore_index)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"pos_weight": [1.0, -1.0]}, ValueError, "pos_weight must hold weights >= 0"),
        ({"pos_weight": [1.0, float("nan")]}, ValueError, "pos_weight must be finite"),
        ({"ignore_index": 1}, ValueError, r"ignore_index must lie outside \[0, 1\]"),
        ({"ignore_index": "none"}, TypeError, "ignore_index must be an int"),
    ],
)
@pytest.mark.parametrize("cls", [BinaryFocalLoss, BinarySoftTruncatedLoss, BinaryHardTruncatedLoss])
def test_module_rejects_bad_options_at_construction(cls, kwargs, error, match):
    with pytest.raises(error, match=match):
        cls(**kwargs)


def test_module_checks_assigned_options_and_the_shape_at_the_call():
    criterion = BinaryFocalLoss(pos_weight=[1.0, 2.0])
    criterion.pos_weight = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="pos_weight must be a floating-point tensor"):
        criterion.check_hyperparameters()
    criterion.pos_weight = torch.tensor([1.0, 2.0])
    criterion.ignore_index = 0
    with pytest.raises(ValueError, match="ignore_index must lie outside"):
        criterion.check_hyperparameters()
    criterion.ignore_index = None
    criterion.check_hyperparameters()
    x, y = inputs((4, 3), seed=29)
    with pytest.raises(ValueError, match=re.escape("for [N, C] targets: one weight per class")):
        criterion(x, y)
