"""Label smoothing across the family: TaiLr's criterion, the fused path, the chunked head, errors.

References are written plainly here in float64: TaiLr's released criterion (Ji et al.,
"Tailoring Language Generation Models under Total Variation Distance", ICLR 2023; its fairseq
``tailr_loss``) and :func:`torch.nn.functional.cross_entropy` with ``label_smoothing``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import lightning_losses as LL
import lightning_losses.functional as LF
from lightning_losses import GammaCrossEntropyLoss, LinearTargetLoss, get_loss
from lightning_losses.lightning.mixin import criterion_hyperparameters, describe_criterion

C = 6


def inputs(shape, seed, ignore_index=-100, n_ignored=2, dtype=torch.float64, scale=2.0):
    """Logits ``shape`` (class dimension 1) and targets with ``n_ignored`` ignored entries."""
    g = torch.Generator().manual_seed(seed)
    x = (scale * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)
    t = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
    flat = t.view(-1)
    flat[torch.randperm(flat.numel(), generator=g)[:n_ignored]] = ignore_index
    return x, t


def class_weights(seed=7):
    g = torch.Generator().manual_seed(seed)
    return 0.25 + 2 * torch.rand(C, generator=g, dtype=torch.float64)


def value_and_grad(fn, x, t, **kwargs):
    """The output and the gradient of ``(output * random cotangent).sum()`` (the Jacobian)."""
    x = x.clone().requires_grad_()
    out = fn(x, t, **kwargs)
    g = torch.Generator().manual_seed(99)
    cotangent = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    (grad,) = torch.autograd.grad((out * cotangent).sum(), x)
    return out.detach(), grad


def reduce(per_element, reduction, denominator):
    if reduction == "none":
        return per_element
    total = per_element.sum()
    return total if reduction == "sum" else total / denominator


# --- TaiLr's criterion, as released, in float64 --------------------------------------------------


def tailr(logits, target, *, gamma, eps, min_weight, ignore_index=-100, reduction="none"):
    """TaiLr's ``tailr_loss``: ``(1 - eps) * w * nll + eps / C * smooth``, ``w`` detached.

    ``nll = -log p_t``, ``smooth = -sum_c log p_c``, ``w = exp(log p_t - log(gamma + (1-gamma)
    p_t))`` clamped to ``[min_weight, 1]``; ignored positions are zeroed. TaiLr sums; "mean"
    here divides that sum by the number of counted positions.
    """
    classes = logits.shape[1]
    lprobs = torch.log_softmax(logits.movedim(1, -1), dim=-1)  # [N, *, C]
    pad = target == ignore_index
    safe = torch.where(pad, 0, target)
    nll = -lprobs.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.sum(-1)
    with torch.no_grad():
        p = torch.softmax(logits.movedim(1, -1), dim=-1).gather(-1, safe.unsqueeze(-1))
        p = p.squeeze(-1)
        w = (p.log() - (gamma + (1 - gamma) * p).log()).exp().clamp(min=min_weight, max=1.0)
    loss = (1.0 - eps) * w * nll + eps / classes * smooth
    loss = loss.masked_fill(pad, 0.0)
    return reduce(loss, reduction, (~pad).sum())


def closed_form(logits, target, *, gamma, eps, weight=None, ignore_index=-100, reduction="none"):
    """``(1 - eps) * w_t * gamma_ce + eps / C * sum_c w_c (-log p_c)``, gamma_ce in closed form."""
    classes = logits.shape[1]
    weight = torch.ones(classes, dtype=torch.float64) if weight is None else weight
    log_p = torch.log_softmax(logits.movedim(1, -1), dim=-1)
    pad = target == ignore_index
    safe = torch.where(pad, 0, target)
    p_t = log_p.gather(-1, safe.unsqueeze(-1)).squeeze(-1).exp()
    if gamma == 1.0:
        gamma_ce = 1 - p_t
    else:
        gamma_ce = -torch.log(gamma + (1 - gamma) * p_t) / (1 - gamma)
    w_t = weight[safe] * ~pad
    loss = (1 - eps) * w_t * gamma_ce + eps / classes * -(log_p * weight).sum(-1)
    loss = loss.masked_fill(pad, 0.0)
    return reduce(loss, reduction, w_t.sum())


SHAPES = [(9, C), (4, C, 3)]  # fused [N, C] and the [N, C, *] path


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(("gamma", "threshold"), [(0.5, 0.2), (0.3, 0.6), (1.0, 0.1), (0.8, 1.0)])
@pytest.mark.parametrize("eps", [0.1, 0.6])
def test_threshold_equals_tailr_in_value_and_gradient(shape, reduction, gamma, threshold, eps):
    x, t = inputs(shape, seed=3 + len(shape))
    actual, actual_grad = value_and_grad(
        LF.gamma_cross_entropy,
        x,
        t,
        gamma=gamma,
        threshold=threshold,
        label_smoothing=eps,
        reduction=reduction,
    )
    expected, expected_grad = value_and_grad(
        tailr, x, t, gamma=gamma, eps=eps, min_weight=threshold, reduction=reduction
    )
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(actual_grad, expected_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("gamma", [0.0, 0.4, 0.9, 1.0])
@pytest.mark.parametrize("eps", [0.1, 0.6])
def test_closed_form_has_tailr_gradient_and_its_own_value(shape, reduction, gamma, eps):
    x, t = inputs(shape, seed=5 + len(shape))
    kwargs = {"gamma": gamma, "label_smoothing": eps, "reduction": reduction}
    actual, actual_grad = value_and_grad(LF.gamma_cross_entropy, x, t, **kwargs)
    _, tailr_grad = value_and_grad(
        tailr, x, t, gamma=gamma, eps=eps, min_weight=0.0, reduction=reduction
    )
    torch.testing.assert_close(actual_grad, tailr_grad, rtol=1e-12, atol=1e-12)
    expected = closed_form(x, t, gamma=gamma, eps=eps, reduction=reduction)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    if 0 < gamma < 1 and reduction == "sum":  # the value is not TaiLr's (w * nll)
        tailr_value = tailr(x, t, gamma=gamma, eps=eps, min_weight=0.0, reduction="sum")
        assert not torch.isclose(actual, tailr_value, rtol=1e-3)


# --- gamma = 0 is PyTorch's smoothed cross-entropy; class weights as PyTorch --------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("ignore_index", [-100, 1])
@pytest.mark.parametrize("fn", ["cross_entropy", "gamma_cross_entropy"])
def test_gamma_zero_and_cross_entropy_equal_torch(shape, reduction, weighted, ignore_index, fn):
    x, t = inputs(shape, seed=11, ignore_index=ignore_index)
    kwargs = {
        "weight": class_weights() if weighted else None,
        "ignore_index": ignore_index,
        "reduction": reduction,
        "label_smoothing": 0.3,
    }
    extra = {"gamma": 0.0} if fn == "gamma_cross_entropy" else {}
    actual, actual_grad = value_and_grad(getattr(LF, fn), x, t, **kwargs, **extra)
    expected, expected_grad = value_and_grad(F.cross_entropy, x, t, **kwargs)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(actual_grad, expected_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_weighted_gamma_ce_follows_pytorch_convention(shape, reduction, ignore_index):
    x, t = inputs(shape, seed=13, ignore_index=ignore_index)
    w = class_weights()
    for gamma in (0.5, 1.0):
        actual = LF.gamma_cross_entropy(
            x,
            t,
            gamma=gamma,
            label_smoothing=0.2,
            weight=w,
            ignore_index=ignore_index,
            reduction=reduction,
        )
        expected = closed_form(
            x, t, gamma=gamma, eps=0.2, weight=w, ignore_index=ignore_index, reduction=reduction
        )
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_fused_and_nd_paths_agree(weighted):
    x, t = inputs((17, C), seed=17)
    w = class_weights() if weighted else None
    kwargs = {"gamma": 0.6, "threshold": 0.0, "label_smoothing": 0.25, "weight": w}
    flat, flat_grad = value_and_grad(LF.gamma_cross_entropy, x, t, reduction="none", **kwargs)
    nd, nd_grad = value_and_grad(
        LF.gamma_cross_entropy, x.unsqueeze(-1), t.unsqueeze(-1), reduction="none", **kwargs
    )
    torch.testing.assert_close(flat, nd.squeeze(-1), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(flat_grad, nd_grad.squeeze(-1), rtol=1e-14, atol=1e-14)


def test_fused_path_across_chunks(monkeypatch):
    """Chunks of a few rows (the defaults are MiBs): the numbers of one chunk, to rounding."""
    from lightning_losses.functional import _core

    x, t = inputs((20, C), seed=19, n_ignored=4)
    w = class_weights()
    kwargs = {"gamma": 0.3, "label_smoothing": 0.4, "weight": w, "reduction": "none"}
    whole, whole_grad = value_and_grad(LF.gamma_cross_entropy, x, t, **kwargs)
    monkeypatch.setattr(_core, "CHUNK_ELEMENTS", 3 * C)  # backward: 3 rows
    monkeypatch.setattr(_core, "CPU_SMOOTHING_ELEMENTS", 4 * C)  # forward on a CPU: 4 rows
    assert len(_core.row_chunks(20, C)) == 7
    chunked, chunked_grad = value_and_grad(LF.gamma_cross_entropy, x, t, **kwargs)
    torch.testing.assert_close(chunked, whole, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(chunked_grad, whole_grad, rtol=1e-15, atol=1e-15)


def test_gradcheck_fused():
    x, t = inputs((5, C), seed=23)
    x.requires_grad_()
    w = class_weights()
    for weight in (None, w):
        assert torch.autograd.gradcheck(
            lambda z, weight=weight: LF.gamma_cross_entropy(
                z, t, gamma=0.4, label_smoothing=0.3, weight=weight, reduction="none"
            ),
            (x,),
        )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_half_inputs_are_computed_in_float32(dtype, shape):
    x, t = inputs(shape, seed=29, dtype=dtype)
    for fn, extra in ((LF.cross_entropy, {}), (LF.gamma_cross_entropy, {"gamma": 0.5})):
        actual, actual_grad = value_and_grad(fn, x, t, label_smoothing=0.1, **extra)
        assert actual.dtype == torch.float32
        assert actual_grad.dtype == dtype
        expected, expected_grad = value_and_grad(fn, x.double(), t, label_smoothing=0.1, **extra)
        torch.testing.assert_close(actual.double(), expected, rtol=1e-6, atol=1e-6)
        tol = 2 * torch.finfo(dtype).eps
        torch.testing.assert_close(actual_grad.double(), expected_grad, rtol=tol, atol=tol)


# --- memory: the fused smoothed path keeps no [N, C] tensor for backward ------------------------


def saved_bytes(fn):
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return total


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_fused_smoothing_saves_no_extra_rows_by_classes(weighted, reduction):
    n, classes = 512, 300
    g = torch.Generator().manual_seed(31)
    x = torch.randn(n, classes, generator=g).requires_grad_()
    t = torch.randint(0, classes, (n,), generator=g)
    w = torch.rand(classes, generator=g) + 0.5 if weighted else None
    kwargs = {"weight": w, "reduction": reduction}
    for fn, extra in ((LF.cross_entropy, {}), (LF.gamma_cross_entropy, {"gamma": 0.5})):
        plain = saved_bytes(lambda fn=fn, extra=extra: fn(x, t, **kwargs, **extra))
        smoothed = saved_bytes(
            lambda fn=fn, extra=extra: fn(x, t, label_smoothing=0.1, **kwargs, **extra)
        )
        # the ignore mask (n bytes) and the class weights: within a few n-sized vectors
        assert 0 <= smoothed - plain <= 4 * 8 * n + 4 * classes
    torch_bytes = saved_bytes(lambda: F.cross_entropy(x, t, label_smoothing=0.1, **kwargs))
    ours = saved_bytes(lambda: LF.cross_entropy(x, t, label_smoothing=0.1, **kwargs))
    # PyTorch keeps an [n, classes] log-softmax besides the logits; the fused path does not
    assert torch_bytes - ours >= 4 * n * classes - 4 * 8 * n


# --- the chunked linear head ----------------------------------------------------------------------


def head_inputs(seed=37, n=26, h=5, v=C, ignore_every=4):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(v, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, v, (n,), generator=g)
    target[::ignore_every] = -100
    return hidden, weight, bias, target


LINEAR_CASES = [
    ("ce", {}, LF.cross_entropy),
    ("gamma_ce", {"gamma": 0.5}, LF.gamma_cross_entropy),
    ("gamma_ce", {"gamma": 0.7, "threshold": 0.3}, LF.gamma_cross_entropy),
]


@pytest.mark.parametrize(("loss", "hyper", "plain"), LINEAR_CASES, ids=lambda c: str(c)[:24])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_linear_head_equals_plain_logits(loss, hyper, plain, reduction, weighted):
    hidden, weight, bias, target = head_inputs()
    cw = class_weights() if weighted else None
    params = (hidden, weight, bias)
    ours = LF.linear_target_loss(
        hidden,
        weight,
        target,
        loss=loss,
        bias=bias,
        class_weight=cw,
        chunk_size=4,
        reduction=reduction,
        label_smoothing=0.35,
        **hyper,
    )
    logits = hidden @ weight.T + bias
    reference = plain(logits, target, weight=cw, reduction=reduction, label_smoothing=0.35, **hyper)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    g = torch.Generator().manual_seed(41)
    cotangent = torch.randn(ours.shape, generator=g, dtype=torch.float64)
    ours_grads = torch.autograd.grad((ours * cotangent).sum(), params)
    reference_grads = torch.autograd.grad((reference * cotangent).sum(), params)
    for a, b in zip(ours_grads, reference_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_linear_head_custom_ignore_index_and_no_grad():
    hidden, weight, bias, target = head_inputs(ignore_every=3)
    target = torch.where(target == -100, 7, target)
    kwargs = {"loss": "gamma_ce", "gamma": 0.2, "label_smoothing": 0.5, "ignore_index": 7}
    logits = hidden @ weight.T + bias
    expected = LF.gamma_cross_entropy(
        logits, target, gamma=0.2, label_smoothing=0.5, ignore_index=7
    )
    with torch.no_grad():
        actual = LF.linear_target_loss(hidden, weight, target, bias=bias, chunk_size=5, **kwargs)
    torch.testing.assert_close(actual, expected.detach(), rtol=1e-12, atol=1e-12)


def test_linear_head_smoothing_saves_what_the_unsmoothed_head_saves():
    hidden, weight, bias, target = head_inputs(n=64, v=200)
    for loss in ("ce", "gamma_ce"):
        plain = saved_bytes(
            lambda loss=loss: LF.linear_target_loss(
                hidden, weight, target, loss=loss, bias=bias, reduction="none"
            )
        )
        smoothed = saved_bytes(
            lambda loss=loss: LF.linear_target_loss(
                hidden, weight, target, loss=loss, bias=bias, reduction="none", label_smoothing=0.1
            )
        )
        assert smoothed == plain


def test_linear_module_label_smoothing_is_a_schedulable_attribute():
    hidden, weight, bias, target = head_inputs()
    criterion = LinearTargetLoss("gamma_ce", gamma=0.5, label_smoothing=0.2)
    assert criterion.hyperparameters()["label_smoothing"] == 0.2
    logits = hidden @ weight.T + bias
    torch.testing.assert_close(
        criterion(hidden, weight, target, bias),
        LF.gamma_cross_entropy(logits, target, gamma=0.5, label_smoothing=0.2),
    )
    criterion.label_smoothing = 0.4
    torch.testing.assert_close(
        criterion(hidden, weight, target, bias),
        LF.gamma_cross_entropy(logits, target, gamma=0.5, label_smoothing=0.4),
    )
    assert "label_smoothing=0.4" in repr(criterion)
    assert "label_smoothing" not in repr(LinearTargetLoss("ce"))
    criterion.label_smoothing = 1.0
    with pytest.raises(ValueError, match="label_smoothing"):
        criterion.check_hyperparameters()


# --- the module -----------------------------------------------------------------------------------


def test_gamma_module_label_smoothing_attribute():
    x, t = inputs((10, C), seed=43)
    w = class_weights().float()
    criterion = GammaCrossEntropyLoss(gamma=0.5, label_smoothing=0.1, weight=w)
    expected = LF.gamma_cross_entropy(
        x, t, gamma=0.5, label_smoothing=0.1, weight=w.to(torch.float64)
    )
    torch.testing.assert_close(criterion(x, t), expected)
    criterion.label_smoothing = 0.3  # what a schedule does
    expected = LF.gamma_cross_entropy(
        x, t, gamma=0.5, label_smoothing=0.3, weight=w.to(torch.float64)
    )
    torch.testing.assert_close(criterion(x, t), expected)
    assert criterion.hyperparameters() == {"gamma": 0.5, "threshold": 0.0, "label_smoothing": 0.3}
    assert criterion_hyperparameters(criterion)["label_smoothing"] == 0.3  # criterion/...
    described = describe_criterion(criterion)
    assert described["init_args"]["label_smoothing"] == 0.3
    rebuilt = LL.build_criterion(described)
    assert isinstance(rebuilt, GammaCrossEntropyLoss)
    assert rebuilt.label_smoothing == 0.3
    assert get_loss("gamma_ce", label_smoothing=0.2).label_smoothing == 0.2
    assert repr(GammaCrossEntropyLoss()) == (
        "GammaCrossEntropyLoss(gamma=0.5, threshold=0.0, reduction='mean')"
    )
    assert "label_smoothing=0.3" in repr(criterion)


# --- errors -------------------------------------------------------------------------------------

BAD = [
    (-0.1, ValueError),
    (1.0, ValueError),
    (float("nan"), ValueError),
    ("0.1", TypeError),
    (None, TypeError),
    (True, TypeError),
]


@pytest.mark.parametrize(("value", "error"), BAD, ids=repr)
def test_bad_label_smoothing_names_it(value, error):
    x, t = inputs((4, C), seed=47)
    hidden, weight, _, target = head_inputs()
    calls = [
        lambda: LF.gamma_cross_entropy(x, t, label_smoothing=value),
        lambda: GammaCrossEntropyLoss(label_smoothing=value),
        lambda: LF.linear_target_loss(hidden, weight, target, loss="ce", label_smoothing=value),
        lambda: LF.linear_target_loss(
            hidden, weight, target, loss="gamma_ce", label_smoothing=value
        ),
    ]
    if value is not None:  # None is the module's "not given" (the loss's default)
        calls.append(lambda: LinearTargetLoss("ce", label_smoothing=value))
    for call in calls:
        with pytest.raises(error, match="label_smoothing"):
            call()
    criterion = GammaCrossEntropyLoss(label_smoothing=0.1)
    criterion.label_smoothing = value
    with pytest.raises(error, match="label_smoothing"):
        criterion.check_hyperparameters()


def _edges_and_gammas():
    return torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64), torch.tensor(
        [1.0, 2.0], dtype=torch.float64
    )


REJECTING_FUNCTIONS = {
    "focal_loss": {},
    "adaptive_focal_loss": {},
    "soft_accuracy_loss": {},
    "hard_truncated_loss": {},
    "soft_truncated_loss": {},
    "adafocal_loss": "bins",
    "exact_loss": {},
}
REJECTING_MODULES = [
    "focal",
    "adaptive_focal",
    "soft_accuracy",
    "hard_truncated",
    "soft_truncated",
    "adafocal",
    "exact",
]
MESSAGE = r"does not take label_smoothing.*cross_entropy.*gamma_cross_entropy"


@pytest.mark.parametrize("name", sorted(REJECTING_FUNCTIONS))
def test_losses_without_smoothing_reject_it_and_accept_zero(name):
    fn = getattr(LF, name)
    x, t = inputs((6, C), seed=53)
    kwargs = {}
    if REJECTING_FUNCTIONS[name] == "bins":
        kwargs["edges"], kwargs["gammas"] = _edges_and_gammas()
    with pytest.raises(TypeError, match=MESSAGE) as info:
        fn(x, t, label_smoothing=0.1, **kwargs)
    assert "no single definition of label smoothing" in str(info.value)
    for bad in (float("nan"), "0", True):
        with pytest.raises(TypeError, match="label_smoothing"):
            fn(x, t, label_smoothing=bad, **kwargs)
    for zero in (0, 0.0):
        assert torch.equal(fn(x, t, label_smoothing=zero, **kwargs), fn(x, t, **kwargs))


@pytest.mark.parametrize("name", REJECTING_MODULES)
def test_modules_and_registry_reject_it_and_accept_zero(name):
    cls = LL.loss_class(name) if hasattr(LL, "loss_class") else type(get_loss(name))
    with pytest.raises(TypeError, match=MESSAGE):
        get_loss(name, label_smoothing=0.1)
    with pytest.raises(TypeError, match=MESSAGE):
        cls(label_smoothing=0.1)
    module = get_loss(name, label_smoothing=0.0)
    assert not hasattr(module, "label_smoothing")
    assert "label_smoothing" not in describe_criterion(module)["init_args"]
    x, t = inputs((6, C), seed=59)
    torch.testing.assert_close(module(x, t), get_loss(name)(x, t), rtol=0, atol=0)


@pytest.mark.parametrize("loss", ["soft_accuracy", "focal", "adaptive_focal", "hard_truncated"])
def test_linear_head_rejects_it_for_other_losses(loss):
    hidden, weight, _, target = head_inputs()
    with pytest.raises(TypeError, match=MESSAGE):
        LF.linear_target_loss(hidden, weight, target, loss=loss, label_smoothing=0.1)
    with pytest.raises(TypeError, match=MESSAGE):
        LinearTargetLoss(loss, label_smoothing=0.1)
    zero = LF.linear_target_loss(hidden, weight, target, loss=loss, label_smoothing=0.0)
    assert torch.equal(zero, LF.linear_target_loss(hidden, weight, target, loss=loss))
    criterion = LinearTargetLoss(loss, label_smoothing=0.0)
    assert "label_smoothing" not in criterion.hyperparameters()
    assert math.isfinite(criterion(hidden, weight, target).item())
