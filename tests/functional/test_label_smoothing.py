"""Label smoothing of cross-entropy: PyTorch's meaning, a plain formula, the module, errors."""

from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import lightning_losses as LL
from lightning_losses import CrossEntropyLoss, get_loss
from lightning_losses.functional import cross_entropy
from lightning_losses.functional._core import target_probability_loss
from lightning_losses.functional.target_probability import phi_cross_entropy
from lightning_losses.lightning.mixin import describe_criterion

C = 5


def inputs(shape, seed, ignore_index=-100, n_ignored=2, dtype=torch.float64):
    """Logits ``shape`` (class dimension 1) and targets with ``n_ignored`` ignored entries."""
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(shape, generator=g, dtype=dtype)
    t = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
    flat = t.view(-1)
    flat[torch.randperm(flat.numel(), generator=g)[:n_ignored]] = ignore_index
    return x, t


def weights(seed=7):
    g = torch.Generator().manual_seed(seed)
    return 0.25 + 2 * torch.rand(C, generator=g, dtype=torch.float64)


def value_and_grad(fn, x, t, **kwargs):
    x = x.clone().requires_grad_()
    out = fn(x, t, **kwargs)
    # a random cotangent: the whole Jacobian of "none", not only the gradient of its sum
    g = torch.Generator().manual_seed(99)
    cotangent = torch.randn(out.shape, generator=g, dtype=out.dtype)
    (grad,) = torch.autograd.grad((out * cotangent).sum(), x)
    return out.detach(), grad


# --- against torch.nn.functional.cross_entropy in float64 ---------------------------------------


@pytest.mark.parametrize("shape", [(9, C), (4, C, 3), (2, C, 3, 2)], ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("ignore_index", [-100, 2])
@pytest.mark.parametrize("eps", [0.05, 0.3, 0.9])
def test_matches_torch_values_and_gradients(shape, reduction, weighted, ignore_index, eps):
    x, t = inputs(shape, seed=len(shape) + 10 * ignore_index, ignore_index=ignore_index)
    kwargs = {
        "weight": weights() if weighted else None,
        "ignore_index": ignore_index,
        "reduction": reduction,
        "label_smoothing": eps,
    }
    actual, actual_grad = value_and_grad(cross_entropy, x, t, **kwargs)
    expected, expected_grad = value_and_grad(F.cross_entropy, x, t, **kwargs)
    assert actual.dtype == torch.float64
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(actual_grad, expected_grad, rtol=1e-12, atol=1e-12)


def test_float32_matches_torch():
    x, t = inputs((64, C), seed=3, dtype=torch.float32)
    w = weights().float()
    for reduction in ("none", "mean", "sum"):
        kwargs = {"weight": w, "reduction": reduction, "label_smoothing": 0.2}
        actual, actual_grad = value_and_grad(cross_entropy, x, t, **kwargs)
        expected, expected_grad = value_and_grad(F.cross_entropy, x, t, **kwargs)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(actual_grad, expected_grad, rtol=1e-5, atol=1e-6)


def test_gradcheck():
    x, t = inputs((4, C, 2), seed=5)
    x.requires_grad_()
    w = weights()
    for reduction in ("none", "mean"):
        assert torch.autograd.gradcheck(
            lambda z, r=reduction: cross_entropy(z, t, weight=w, reduction=r, label_smoothing=0.4),
            (x,),
        )


# --- the formula, written plainly ---------------------------------------------------------------


def test_plain_formula_at_one_point():
    x = torch.tensor(
        [[1.0, -0.5, 2.0, 0.0, 0.3], [0.2, 0.1, -1.0, 3.0, -2.0], [0.0, 0.0, 0.0, 0.0, 0.0]],
        dtype=torch.float64,
    )
    t = torch.tensor([2, 0, -100])
    w = [0.5, 2.0, 1.0, 1.5, 0.25]
    eps = 0.2
    rows = []  # (nll_t, -log p per class) of the non-ignored rows
    for n in range(2):
        z = [float(v) for v in x[n]]
        log_z = math.log(sum(math.exp(v) for v in z))
        neg_log_p = [log_z - v for v in z]
        rows.append((int(t[n]), neg_log_p))

    plain = [(1 - eps) * nlp[k] + eps * sum(nlp) / C for k, nlp in rows]
    actual = cross_entropy(x, t, label_smoothing=eps, reduction="none")
    torch.testing.assert_close(actual, torch.tensor([*plain, 0.0], dtype=torch.float64))
    torch.testing.assert_close(
        cross_entropy(x, t, label_smoothing=eps), torch.tensor(sum(plain) / 2, dtype=x.dtype)
    )

    weighted = [
        (1 - eps) * w[k] * nlp[k] + eps / C * sum(wc * v for wc, v in zip(w, nlp, strict=True))
        for k, nlp in rows
    ]
    weight_sum = sum(w[k] for k, _ in rows)
    wt = torch.tensor(w, dtype=torch.float64)
    actual = cross_entropy(x, t, weight=wt, label_smoothing=eps, reduction="none")
    torch.testing.assert_close(actual, torch.tensor([*weighted, 0.0], dtype=torch.float64))
    torch.testing.assert_close(
        cross_entropy(x, t, weight=wt, label_smoothing=eps),
        torch.tensor(sum(weighted) / weight_sum, dtype=torch.float64),
    )
    torch.testing.assert_close(
        cross_entropy(x, t, weight=wt, label_smoothing=eps, reduction="sum"),
        torch.tensor(sum(weighted), dtype=torch.float64),
    )


# --- label_smoothing = 0 is the old path, bit for bit; edge cases --------------------------------


@pytest.mark.parametrize("shape", [(33, C), (6, C, 4)], ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_zero_is_the_unsmoothed_path_bit_for_bit(shape, reduction, dtype):
    x, t = inputs(shape, seed=11, dtype=dtype)
    w = weights().to(dtype)

    def old(z, target, **kwargs):
        return target_probability_loss(z, target, phi_cross_entropy, **kwargs)

    for eps in (0.0, 0):
        actual, actual_grad = value_and_grad(
            cross_entropy, x, t, weight=w, reduction=reduction, label_smoothing=eps
        )
        expected, expected_grad = value_and_grad(old, x, t, weight=w, reduction=reduction)
        assert torch.equal(actual, expected)
        assert actual.dtype == expected.dtype
        assert torch.equal(actual_grad, expected_grad)


@pytest.mark.parametrize("weighted", [False, True])
def test_mean_over_an_all_ignored_batch_is_zero(weighted):
    x = torch.randn(3, C, dtype=torch.float64, requires_grad=True)
    t = torch.full((3,), -100)
    w = weights() if weighted else None
    loss = cross_entropy(x, t, weight=w, label_smoothing=0.3)
    assert loss.item() == 0.0
    (grad,) = torch.autograd.grad(loss, x)
    assert torch.equal(grad, torch.zeros_like(x))
    # PyTorch gives NaN here: the documented difference
    assert torch.isnan(F.cross_entropy(x, t, weight=w, label_smoothing=0.3))


def test_half_precision_is_computed_in_float32():
    x, t = inputs((16, C), seed=13, dtype=torch.float16)
    actual = cross_entropy(x, t, label_smoothing=0.1, reduction="none")
    assert actual.dtype == torch.float32
    expected = F.cross_entropy(x.double(), t, label_smoothing=0.1, reduction="none")
    torch.testing.assert_close(actual.double(), expected, rtol=1e-6, atol=1e-6)


# --- the module --------------------------------------------------------------------------------


def test_module_equals_torch_and_reads_the_attribute_at_each_call():
    x, t = inputs((10, C), seed=17)
    w = weights()
    loss = CrossEntropyLoss(label_smoothing=0.1, weight=w)
    torch.testing.assert_close(
        loss(x, t), F.cross_entropy(x, t, weight=w.float().double(), label_smoothing=0.1)
    )
    loss.label_smoothing = 0.2
    torch.testing.assert_close(
        loss(x, t), F.cross_entropy(x, t, weight=w.float().double(), label_smoothing=0.2)
    )
    assert loss.hyperparameters() == {"label_smoothing": 0.2}
    loss.label_smoothing = 0.0
    torch.testing.assert_close(loss(x, t), F.cross_entropy(x, t, weight=w.float().double()))


def test_module_default_and_description():
    assert CrossEntropyLoss().label_smoothing == 0.0
    assert repr(CrossEntropyLoss(label_smoothing=0.25)) == (
        "CrossEntropyLoss(label_smoothing=0.25, reduction='mean')"
    )
    assert get_loss("ce", label_smoothing=0.25).label_smoothing == 0.25
    described = describe_criterion(CrossEntropyLoss(label_smoothing=0.25))
    assert described["init_args"]["label_smoothing"] == 0.25
    rebuilt = LL.build_criterion(described)
    assert isinstance(rebuilt, CrossEntropyLoss)
    assert rebuilt.label_smoothing == 0.25


@pytest.mark.parametrize("name", ["SoftAccuracyLoss", "HardTruncatedLoss", "SoftTruncatedLoss"])
def test_other_losses_of_the_family_do_not_gain_label_smoothing(name):
    cls = getattr(LL, name)
    assert issubclass(cls, CrossEntropyLoss)
    # accepted as 0 only (a config may keep the key when it switches losses)
    assert inspect.signature(cls).parameters["label_smoothing"].default == 0.0
    with pytest.raises(TypeError, match="label_smoothing"):
        cls(label_smoothing=0.1)
    module = cls(label_smoothing=0.0)
    assert not hasattr(module, "label_smoothing")
    assert "label_smoothing" not in module.hyperparameters()
    assert "label_smoothing" not in describe_criterion(module)["init_args"]
    x, t = inputs((6, C), seed=19)
    module(x, t)  # the function is called without label_smoothing


def test_gamma_cross_entropy_signature():
    parameters = list(inspect.signature(LL.GammaCrossEntropyLoss).parameters)
    assert parameters == [
        "gamma",
        "threshold",
        "label_smoothing",
        "weight",
        "ignore_index",
        "reduction",
        "validate_args",
        "backend",
    ]


# --- errors ------------------------------------------------------------------------------------

BAD = [
    (-0.1, ValueError),
    (1.0, ValueError),
    (1.5, ValueError),
    (float("nan"), ValueError),
    (float("inf"), ValueError),
    ("0.1", TypeError),
    (None, TypeError),
    (True, TypeError),
    (torch.tensor([0.1, 0.2]), TypeError),
]


@pytest.mark.parametrize(("value", "error"), BAD, ids=repr)
def test_bad_label_smoothing_is_an_error_naming_it(value, error):
    x, t = inputs((4, C), seed=23)
    with pytest.raises(error, match="label_smoothing"):
        cross_entropy(x, t, label_smoothing=value)
    with pytest.raises(error, match="label_smoothing"):
        CrossEntropyLoss(label_smoothing=value)
    criterion = CrossEntropyLoss(label_smoothing=0.1)
    trial = copy.deepcopy(criterion)
    trial.label_smoothing = value  # what a schedule does; the check reads the attribute
    with pytest.raises(error, match="label_smoothing"):
        trial.check_hyperparameters()
    with pytest.raises(error, match="label_smoothing"):
        trial(x, t)
    assert criterion.check_hyperparameters() is None


def test_range_message():
    with pytest.raises(ValueError, match=r"label_smoothing must lie in \[0, 1\); got 1.0"):
        cross_entropy(torch.zeros(2, C), torch.tensor([0, 1]), label_smoothing=1.0)


def test_scalar_tensor_is_accepted():
    x, t = inputs((6, C), seed=29)
    torch.testing.assert_close(
        cross_entropy(x, t, label_smoothing=torch.tensor(0.3)),
        F.cross_entropy(x, t, label_smoothing=0.3),
    )
