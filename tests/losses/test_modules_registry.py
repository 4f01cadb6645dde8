"""The nn.Module wrappers and the registry.

Modules must equal their functions (values and gradients), read their hyper-parameters at call
time (a schedule mutates ``criterion.gamma`` between steps), and keep per-class tensors in the
state dict. The registry maps every documented name to its module.
"""

from __future__ import annotations

import copy

import pytest
import torch

import lightning_losses as LL
from lightning_losses import available_losses, get_loss
from lightning_losses import functional as LF

CLASSES = 4


def gen(seed):
    return torch.Generator().manual_seed(seed)


def assert_close(actual, expected, tol=1e-6):
    torch.testing.assert_close(
        actual.double(), expected.double(), rtol=tol, atol=tol, check_dtype=False
    )


def inputs(kind, seed=0):
    g = gen(seed)
    if kind == "index":
        x = 2 * torch.randn(8, CLASSES, generator=g, dtype=torch.float64)
        t = torch.randint(0, CLASSES, (8,), generator=g)
        t[3] = -100
        return x, t
    if kind == "soft":
        x = 2 * torch.randn(8, CLASSES, generator=g, dtype=torch.float64)
        return x, torch.rand(8, CLASSES, generator=g, dtype=torch.float64)
    if kind == "exact":
        x = 2 * torch.randn(8, CLASSES, generator=g, dtype=torch.float64)
        return x, torch.randint(0, CLASSES, (8,), generator=g)
    assert kind == "nm"
    s = torch.randn(8, 2, 3, generator=g, dtype=torch.float64)
    return s, torch.randint(0, 3, (8, 2), generator=g)


WEIGHT = torch.tensor([0.5, 1.0, 2.0, 0.25], dtype=torch.float64)  # exact in float32
OTHER_WEIGHT = torch.tensor([2.0, 0.25, 1.0, 4.0], dtype=torch.float64)

# registry name -> (module class, function, input kind, constructor kwargs, mutations)
# Each mutation is (attribute, new value); after setting it the module must equal the function
# called with the new value.
SPECS = {
    "ce": (
        "CrossEntropyLoss",
        LF.cross_entropy,
        "index",
        {"weight": WEIGHT},
        [("weight", OTHER_WEIGHT), ("reduction", "sum")],
    ),
    "gamma_ce": (
        "GammaCrossEntropyLoss",
        LF.gamma_cross_entropy,
        "index",
        {"gamma": 0.2},
        [("gamma", 0.9), ("gamma", 1.0), ("threshold", 0.3), ("weight", WEIGHT)],
    ),
    "soft_accuracy": (
        "SoftAccuracyLoss",
        LF.soft_accuracy_loss,
        "index",
        {},
        [("reduction", "none"), ("weight", WEIGHT)],
    ),
    "focal": (
        "FocalLoss",
        LF.focal_loss,
        "index",
        {"gamma": 2.0, "alpha": WEIGHT},
        [("gamma", 0.5), ("gamma", 0.0), ("alpha", OTHER_WEIGHT), ("reduction", "sum")],
    ),
    "adaptive_focal": (
        "AdaptiveFocalLoss",
        LF.adaptive_focal_loss,
        "index",
        {},
        [("gammas", (1.0, 0.5)), ("thresholds", (0.6,)), ("alpha", WEIGHT)],
    ),
    "hard_truncated": (
        "HardTruncatedLoss",
        LF.hard_truncated_loss,
        "index",
        {"margin": 0.5},
        [("margin", 0.999), ("margin", 0.05), ("weight", WEIGHT)],
    ),
    "soft_truncated": (
        "SoftTruncatedLoss",
        LF.soft_truncated_loss,
        "index",
        {"k": 1.0},
        [("k", 2.5), ("weight", WEIGHT), ("reduction", "none")],
    ),
    "binary_focal": (
        "BinaryFocalLoss",
        LF.binary_focal_loss,
        "soft",
        {"gamma": 2.0},
        [("gamma", 0.5), ("alpha", 0.25), ("reduction", "sum")],
    ),
    "binary_soft_truncated": (
        "BinarySoftTruncatedLoss",
        LF.binary_soft_truncated_loss,
        "soft",
        {"k": 1.0},
        [("k", 3.0), ("reduction", "none")],
    ),
    "binary_hard_truncated": (
        "BinaryHardTruncatedLoss",
        LF.binary_hard_truncated_loss,
        "soft",
        {"margin": 0.5},
        [("margin", 0.9), ("margin", 0.2)],
    ),
    "exact": (
        "EXACTLoss",
        LF.exact_loss,
        "exact",
        {"sigma": 1.0},
        [("sigma", 2.5), ("log", True), ("reduction", "none")],
    ),
    "multilabel_ce": (
        "MultilabelCategoricalCrossEntropyLoss",
        LF.multilabel_categorical_crossentropy,
        "soft",
        {},
        [("reduction", "sum")],
    ),
    "nm_ce": (
        "NMCategoricalCrossEntropyLoss",
        LF.nm_categorical_crossentropy,
        "nm",
        {"variant": "pairwise"},
        [("variant", "centered"), ("reduction", "none")],
    ),
}
NAMES = list(SPECS)


def test_registry_lists_every_documented_name():
    assert set(NAMES) <= set(available_losses())


@pytest.mark.parametrize("name", NAMES)
def test_get_loss_builds_the_module(name):
    class_name, _, _, kwargs, _ = SPECS[name]
    module = get_loss(name, **kwargs)
    assert type(module) is getattr(LL, class_name)
    assert isinstance(module, torch.nn.Module)
    for key, value in kwargs.items():
        current = getattr(module, key)
        if isinstance(value, torch.Tensor):
            assert_close(current, value)
        else:
            assert current == value


def test_get_loss_focal_gamma():
    module = get_loss("focal", gamma=2.0)
    assert isinstance(module, LL.FocalLoss)
    assert module.gamma == 2.0


def test_get_loss_unknown_hyperparameter():
    with pytest.raises((ValueError, TypeError), match="gama"):
        get_loss("focal", gama=2.0)


@pytest.mark.parametrize("name", NAMES)
def test_module_equals_function(name):
    class_name, fn, kind, kwargs, _ = SPECS[name]
    module = getattr(LL, class_name)(**kwargs)
    x, t = inputs(kind)
    xm, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    actual = module(xm, t)
    expected = fn(xf, t, **kwargs)
    assert_close(actual, expected)
    (gm,) = torch.autograd.grad(actual.sum(), xm)
    (gf,) = torch.autograd.grad(expected.sum(), xf)
    assert_close(gm, gf)


@pytest.mark.parametrize("name", NAMES)
def test_module_defaults_equal_function_defaults(name):
    class_name, fn, kind, _, _ = SPECS[name]
    x, t = inputs(kind, seed=1)
    assert_close(getattr(LL, class_name)()(x, t), fn(x, t))


@pytest.mark.parametrize("name", NAMES)
def test_mutating_attributes_changes_the_result(name):
    class_name, fn, kind, kwargs, mutations = SPECS[name]
    module = getattr(LL, class_name)(**kwargs)
    x, t = inputs(kind, seed=2)
    current = dict(kwargs)
    before = module(x, t)
    for attribute, value in mutations:
        setattr(module, attribute, value)
        current[attribute] = value
        after = module(x, t)
        expected = fn(x, t, **current)
        assert_close(after, expected)
        # the new value is used: the result moved
        if after.shape == before.shape:
            assert not torch.allclose(after, before, rtol=1e-9, atol=1e-12), attribute
        before = after


def test_focal_gamma_mutation_example():
    x, t = inputs("index", seed=3)
    module = LL.FocalLoss(gamma=2.0)
    module.gamma = 0.5
    assert_close(module(x, t), LF.focal_loss(x, t, gamma=0.5))
    # focal_loss itself against its formula, so this is not a self-comparison only
    valid = t != -100
    p = torch.softmax(x, 1).gather(1, t.clamp(min=0)[:, None])[:, 0]
    assert_close(module(x, t), (-((1 - p) ** 0.5) * torch.log(p))[valid].mean())


@pytest.mark.parametrize("class_name", ["CrossEntropyLoss", "FocalLoss", "SoftTruncatedLoss"])
def test_ignore_index_attribute_is_mutable(class_name):
    x, t = inputs("exact", seed=11)  # no ignored targets
    module = getattr(LL, class_name)()
    everything = module(x, t)
    module.ignore_index = int(t[0])
    keep = t != t[0]
    expected = getattr(LL, class_name)()(x[keep], t[keep])
    assert_close(module(x, t), expected)
    assert not torch.allclose(module(x, t), everything)


def test_gamma_ce_annealing_reaches_one_minus_p():
    x, t = inputs("exact", seed=4)
    module = LL.GammaCrossEntropyLoss(gamma=0.0)
    p = torch.softmax(x, 1).gather(1, t[:, None])[:, 0]
    assert_close(module(x, t), (-torch.log(p)).mean())
    module.gamma = 1.0
    assert_close(module(x, t), (1 - p).mean())


@pytest.mark.parametrize(
    ("class_name", "attribute"),
    [
        ("CrossEntropyLoss", "weight"),
        ("GammaCrossEntropyLoss", "weight"),
        ("SoftAccuracyLoss", "weight"),
        ("HardTruncatedLoss", "weight"),
        ("SoftTruncatedLoss", "weight"),
        ("FocalLoss", "alpha"),
        ("AdaptiveFocalLoss", "alpha"),
    ],
)
def test_state_dict_round_trip(class_name, attribute):
    cls = getattr(LL, class_name)
    module = cls(**{attribute: WEIGHT})
    state = module.state_dict()
    assert attribute in state
    assert_close(state[attribute], WEIGHT)
    fresh = cls(**{attribute: torch.ones(CLASSES)})
    fresh.load_state_dict(state)
    assert_close(getattr(fresh, attribute), WEIGHT)
    x, t = inputs("index", seed=5)
    assert_close(fresh(x, t), module(x, t))
    # deep copies (e.g. a checkpoint of the LightningModule) behave the same
    assert_close(copy.deepcopy(module)(x, t), module(x, t))


@pytest.mark.parametrize("class_name", ["CrossEntropyLoss", "FocalLoss"])
def test_module_follows_dtype_conversion(class_name):
    attribute = "alpha" if class_name == "FocalLoss" else "weight"
    module = getattr(LL, class_name)(**{attribute: WEIGHT}).double()
    assert getattr(module, attribute).dtype == torch.float64
    x, t = inputs("index", seed=6)
    fn = LF.focal_loss if class_name == "FocalLoss" else LF.cross_entropy
    assert_close(module(x, t), fn(x, t, **{attribute: WEIGHT}))


def test_float32_module_with_float64_logits_and_float16_logits():
    module = LL.CrossEntropyLoss(weight=WEIGHT)
    x, t = inputs("index", seed=7)
    assert module(x, t).dtype == torch.float64
    assert module(x.half(), t).dtype == torch.float32


def test_module_is_keyword_only():
    with pytest.raises(TypeError):
        LL.FocalLoss(2.0)
    with pytest.raises(TypeError):
        LL.GammaCrossEntropyLoss(0.5)


def test_functions_are_keyword_only():
    x, t = inputs("index")
    with pytest.raises(TypeError):
        LF.focal_loss(x, t, 2.0)
    with pytest.raises(TypeError):
        LF.gamma_cross_entropy(x, t, 0.5)


# --- NormFaceHead ----------------------------------------------------------------------------


def test_head_scale_attribute_is_mutable():
    head = LL.NormFaceHead(5, 3, scale=10.0).double()
    f = torch.randn(4, 5, generator=gen(8), dtype=torch.float64)
    w = head.weight.detach()
    cos = (f / f.norm(dim=1, keepdim=True)) @ (w / w.norm(dim=1, keepdim=True)).T
    assert_close(head(f), 10.0 * cos)
    head.scale = 4.0
    assert_close(head(f), 4.0 * cos)


def test_head_margin_attribute_is_mutable():
    head = LL.NormFaceHead(5, 3, scale=2.0, margin=0.2, kind="cosface").double()
    f = torch.randn(4, 5, generator=gen(9), dtype=torch.float64)
    t = torch.tensor([0, 1, 2, 0])
    w = head.weight.detach()
    cos = (f / f.norm(dim=1, keepdim=True)) @ (w / w.norm(dim=1, keepdim=True)).T
    onehot = torch.nn.functional.one_hot(t, 3).double()
    assert_close(head(f, t), 2.0 * (cos - 0.2 * onehot))
    head.margin = 0.5
    assert_close(head(f, t), 2.0 * (cos - 0.5 * onehot))


def test_head_learnable_scale_state_dict_round_trip():
    head = LL.NormFaceHead(5, 3)
    assert isinstance(head.scale, torch.nn.Parameter)
    with torch.no_grad():
        head.scale.fill_(7.5)
    state = head.state_dict()
    fresh = LL.NormFaceHead(5, 3)
    fresh.load_state_dict(state)
    f = torch.randn(4, 5, generator=gen(10))
    torch.testing.assert_close(fresh(f), head(f))
    assert float(fresh.scale.detach()) == 7.5


def test_head_learnable_scale_trains():
    # one optimiser step on cross-entropy of confidently-right logits raises the scale
    head = LL.NormFaceHead(3, 3)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    start = float(head.scale.detach())
    f = torch.eye(3) + 0.01
    loss = LF.cross_entropy(head(f), torch.tensor([0, 1, 2]))
    loss.backward()
    assert head.scale.grad is not None
    assert float(head.scale.grad) < 0
    torch.optim.SGD(head.parameters(), lr=1.0).step()
    assert float(head.scale.detach()) > start


# --- hyper-parameters are checked at construction and by check_hyperparameters -----------------

NEGATIVE = torch.tensor([1.0, -1.0, 1.0, 1.0])
# registry name -> [(attribute, bad value, name expected in the message)]
BAD_VALUES = {
    "ce": [("weight", NEGATIVE, "weight"), ("reduction", "Mean", "reduction")],
    "gamma_ce": [("gamma", 2.0, "gamma"), ("threshold", -0.1, "threshold")],
    "soft_accuracy": [("ignore_index", 1.5, "ignore_index"), ("weight", NEGATIVE, "weight")],
    "focal": [("gamma", -1.0, "gamma"), ("alpha", NEGATIVE, "alpha"), ("reduction", "Mean", "")],
    "adaptive_focal": [("gammas", (5.0, -3.0), "gammas"), ("thresholds", (1.5,), "thresholds")],
    "hard_truncated": [("margin", 1.5, "margin"), ("margin", float("nan"), "margin")],
    "soft_truncated": [("k", -1.0, "k"), ("k", float("inf"), "k")],
    "binary_focal": [("alpha", 1.5, "alpha"), ("gamma", float("nan"), "gamma")],
    "binary_soft_truncated": [("k", -0.5, "k"), ("reduction", None, "reduction")],
    "binary_hard_truncated": [("margin", -0.1, "margin")],
    "exact": [("sigma", 0.0, "sigma"), ("n_nodes", 1, "n_nodes"), ("log", "yes", "log")],
    "multilabel_ce": [("reduction", "avg", "reduction"), ("ignore_index", None, "ignore_index")],
    "nm_ce": [("variant", "symmetric", "variant")],
}
BAD_CASES = [
    pytest.param(name, attribute, value, match, id=f"{name}-{attribute}-{value!r}")
    for name, cases in BAD_VALUES.items()
    for attribute, value, match in cases
]


def test_every_registered_loss_has_bad_values():
    assert set(BAD_VALUES) == set(NAMES)


@pytest.mark.parametrize(("name", "attribute", "value", "match"), BAD_CASES)
def test_bad_value_fails_at_construction(name, attribute, value, match):
    # GammaCrossEntropyLoss(gamma=2.0) and FocalLoss(reduction="Mean") used to be accepted
    # and fail only at the first call.
    with pytest.raises((ValueError, TypeError), match=match or attribute):
        get_loss(name, **{attribute: value})


@pytest.mark.parametrize(("name", "attribute", "value", "match"), BAD_CASES)
def test_check_hyperparameters_reads_the_current_values(name, attribute, value, match):
    # What a schedule does: assign the attribute of a copy, then check it. The copy fails,
    # naming the attribute; the criterion itself is untouched; the call checks again.
    class_name, _, kind, kwargs, _ = SPECS[name]
    criterion = getattr(LL, class_name)(**kwargs)
    assert criterion.check_hyperparameters() is None
    trial = copy.deepcopy(criterion)
    setattr(trial, attribute, value)
    with pytest.raises((ValueError, TypeError), match=match or attribute):
        trial.check_hyperparameters()
    assert criterion.check_hyperparameters() is None
    x, t = inputs(kind)
    with pytest.raises((ValueError, TypeError), match=match or attribute):
        trial(x, t)


def test_check_runs_after_the_constructor_of_a_subclass():
    # The check runs once the constructor of the object's own class has returned, so a user
    # subclass may set attributes after calling super().__init__ and check them too.
    class ScaledFocal(LL.FocalLoss):
        def __init__(self, *, factor: float = 1.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def check_hyperparameters(self) -> None:
            super().check_hyperparameters()
            if self.factor <= 0:
                raise ValueError(f"factor must be > 0; got {self.factor}")

    assert ScaledFocal(factor=2.0, gamma=1.0).factor == 2.0
    with pytest.raises(ValueError, match="factor"):
        ScaledFocal(factor=0.0)
    with pytest.raises(ValueError, match="gamma"):
        ScaledFocal(gamma=-1.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loss": "gamma_ce", "gamma": 2.0}, "gamma"),
        ({"loss": "focal", "gamma": -1.0}, "gamma"),
        ({"loss": "hard_truncated", "margin": 1.5}, "margin"),
        ({"loss": "xent"}, "loss"),
        ({"loss": "ce", "reduction": "avg"}, "reduction"),
        ({"loss": "ce", "class_weight": [1.0, -1.0]}, "class_weight"),
        ({"loss": "ce", "chunk_size": 0}, "chunk_size"),
        ({"loss": "ce", "half_matmul": "yes"}, "half_matmul"),
        ({"loss": "ce", "ignore_index": 0.5}, "ignore_index"),
    ],
)
def test_linear_target_loss_module_checks_at_construction(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        LL.LinearTargetLoss(**kwargs)


def test_linear_target_loss_module_check_hyperparameters():
    criterion = LL.LinearTargetLoss("gamma_ce", gamma=0.5)
    assert criterion.check_hyperparameters() is None
    criterion.gamma = 1.5
    with pytest.raises(ValueError, match="gamma"):
        criterion.check_hyperparameters()
    hidden, weight = torch.randn(3, 2), torch.randn(4, 2)
    with pytest.raises(ValueError, match="gamma"):
        criterion(hidden, weight, torch.tensor([0, 1, 2]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"margin": float("nan"), "kind": "cosface"}, "margin"),
        ({"margin": -0.1, "kind": "arcface"}, "margin"),
        ({"scale": float("inf")}, "scale"),
        ({"kind": "sphereface"}, "kind"),
    ],
)
def test_head_checks_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LL.NormFaceHead(3, 4, **kwargs)


def test_head_checks_assigned_values_at_the_call():
    head = LL.NormFaceHead(3, 4, scale=2.0, margin=0.2, kind="cosface")
    head.margin = -0.5
    with pytest.raises(ValueError, match="margin"):
        head.check_hyperparameters()
    with pytest.raises(ValueError, match="margin"):
        head(torch.randn(2, 3), torch.tensor([0, 1]))
