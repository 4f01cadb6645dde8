"""Dual focal loss against the authors' formula, in float64: values, gradients, reductions.

The reference transcribes ``DualFocalLoss.forward`` of the authors' repository
Linwei94/ICML2023-DualFocalLoss (``dual_focal_loss.py``, the same class as
``Losses/dual_focal_loss.py``) plainly in float64: ``[N, C, *]`` logits viewed as
``[N, C, -1]``, transposed and flattened to rows; ``p_j`` the top-1 of ``mask * softmax`` with
the strict mask ``softmax < p_t``; ``-(1 - p_t + p_j)^gamma log p_t`` per row, summed by
their default (``size_average=False``) or averaged. Their code has no ``ignore_index``: the
reference drops the ignored rows first. Gradients are autograd's gradients of that
transcription (through ``p_t``, ``log p_t`` and the selected ``p_j``).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from lightning_losses.functional.dual_focal import dual_focal_loss
from lightning_losses.losses import DualFocalLoss

RTOL = 1e-10
IGNORE = -100
SHAPES = [(7, 5), (3, 4, 6), (2, 3, 2, 3)]
GAMMAS = [0.0, 0.5, 1.0, 2.0, 5.0]


# --- the authors' formula, transcribed -----------------------------------------------------------


def rows_of(x, t):
    """``[N, C, *]`` logits and ``[N, *]`` targets as ``[M, C]`` rows and ``[M]``, as theirs."""
    if x.dim() > 2:
        x = x.reshape(x.size(0), x.size(1), -1).transpose(1, 2).contiguous()
        x = x.reshape(-1, x.size(2))
    return x, t.reshape(-1)


def authors_rows(x, target, gamma):
    """Their ``forward`` on ``[M, C]`` rows before the reduction: one loss per row."""
    target = target.view(-1, 1)
    logp_k = F.log_softmax(x, dim=1)
    softmax_logits = logp_k.exp()
    logp_k = logp_k.gather(1, target)
    logp_k = logp_k.view(-1)
    p_k = logp_k.exp()
    p_j_mask = torch.lt(softmax_logits, p_k.reshape(p_k.shape[0], 1)) * 1
    p_j = torch.topk(p_j_mask * softmax_logits, 1)[0].squeeze(1)
    return -1 * (1 - p_k + p_j) ** gamma * logp_k


def reference_elements(x, t, gamma, ignore_index=IGNORE):
    """Per element, ``[N, *]``, 0 where ignored (their rows with the ignored ones dropped)."""
    rows, flat = rows_of(x.double(), t)
    keep = flat != ignore_index
    values = torch.zeros(flat.shape, dtype=torch.float64)
    return values.index_put((keep,), authors_rows(rows[keep], flat[keep], gamma)).reshape(t.shape)


def reduce(values, t, reduction, ignore_index=IGNORE):
    if reduction == "none":
        return values
    if reduction == "sum":  # theirs: size_average=False
        return values.sum()
    return values.sum() / (t != ignore_index).sum()  # theirs: size_average=True


def draw(shape, *, scale, ignore, seed):
    generator = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(shape, dtype=torch.float64, generator=generator)
    t = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=generator)
    if ignore:
        t.view(-1)[::3] = IGNORE
    return x, t


def assert_values_and_gradients(x, t, gamma, reduction="none", *, rtol=RTOL, atol=1e-13):
    x = x.detach().double().requires_grad_(True)
    actual = dual_focal_loss(x, t, gamma=gamma, reduction=reduction)
    expected = reduce(reference_elements(x, t, gamma), t, reduction)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    cotangent = torch.rand(actual.shape, dtype=torch.float64, generator=torch.Generator())
    (grad,) = torch.autograd.grad(actual, x, cotangent)
    (expected_grad,) = torch.autograd.grad(expected, x, cotangent)
    torch.testing.assert_close(grad, expected_grad, rtol=rtol, atol=atol)


# --- values and gradients at rtol 1e-10 ----------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("ignore", [False, True], ids=["all", "ignored"])
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_values_and_gradients_equal_the_authors_formula(shape, gamma, ignore, reduction):
    x, t = draw(shape, scale=2.5, ignore=ignore, seed=sum(shape))
    assert_values_and_gradients(x, t, gamma, reduction)


def test_sum_is_the_authors_default_and_mean_their_size_average():
    x, t = draw((6, 5, 2), scale=2.5, ignore=False, seed=7)
    rows, flat = rows_of(x, t)
    per_row = authors_rows(rows, flat, 2.0)
    torch.testing.assert_close(
        dual_focal_loss(x, t, gamma=2.0, reduction="sum"), per_row.sum(), rtol=RTOL, atol=0.0
    )
    torch.testing.assert_close(dual_focal_loss(x, t, gamma=2.0), per_row.mean(), rtol=RTOL, atol=0)


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize(
    ("logits", "target", "p_j"),
    [
        # a class tied with the target is no candidate for p_j (the strict <): p_j = p_2
        ([1.0, 1.0, 0.0, -1.0], 0, "p2"),
        # no class below the target (it ties the others or is the smallest): p_j = 0
        ([0.5, 0.5, 0.5], 1, "zero"),
        ([-2.0, 1.0, 3.0], 0, "zero"),
        # the target below the maximum: p_j is the largest of the classes below p_t
        ([3.0, 1.0, 0.5, 2.0], 3, "p1"),
        # tied with the maximum, above the rest
        ([2.0, 0.0, 2.0, -1.0], 2, "p1"),
    ],
    ids=["tie-with-target", "all-equal", "smallest", "below-the-max", "tied-max"],
)
def test_ties_and_the_strict_mask_follow_the_authors(logits, target, p_j, gamma):
    x = torch.tensor([logits], dtype=torch.float64)
    t = torch.tensor([target])
    p = torch.softmax(x, dim=1)[0]
    expected_p_j = 0.0 if p_j == "zero" else float(p[int(p_j[1])])
    p_t = float(p[target])
    by_hand = -((1 - p_t + expected_p_j) ** gamma) * math.log(p_t)
    assert dual_focal_loss(x, t, gamma=gamma).item() == pytest.approx(by_hand, rel=1e-12)
    assert_values_and_gradients(x, t, gamma)


def test_gamma_zero_is_cross_entropy():
    x, t = draw((5, 6, 3), scale=3.0, ignore=True, seed=2)
    x.requires_grad_(True)
    actual = dual_focal_loss(x, t, gamma=0.0)
    expected = F.cross_entropy(x, t, ignore_index=IGNORE)
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=0.0)
    grads = [torch.autograd.grad(v, x)[0] for v in (actual, expected)]
    torch.testing.assert_close(*grads, rtol=RTOL, atol=1e-15)


@pytest.mark.parametrize("gamma", [0.25, 0.5])
def test_certain_target_has_a_finite_gradient_where_the_naive_pow_gives_nan(gamma):
    # p_t == 1 and p_j == 0 in float64: the base 1 - p_t + p_j is 0, and the gradient of
    # base ** gamma (gamma < 1) is inf, times log p_t = 0: NaN in the authors' autograd.
    x = torch.tensor([[800.0, 0.0, 0.0], [1.0, 0.0, 0.5]], dtype=torch.float64)
    t = torch.tensor([0, 2])
    x.requires_grad_(True)
    expected = reduce(reference_elements(x, t, gamma), t, "sum")
    (expected_grad,) = torch.autograd.grad(expected, x)
    assert torch.isnan(expected_grad[0]).all()
    actual = dual_focal_loss(x, t, gamma=gamma, reduction="sum")
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=0.0)
    (grad,) = torch.autograd.grad(actual, x)
    assert torch.count_nonzero(grad[0]) == 0  # the limit: loss ~ (1 - p_t)^(gamma + 1)
    torch.testing.assert_close(grad[1], expected_grad[1], rtol=RTOL, atol=0.0)


def test_all_ignored_gives_zero_and_a_zero_gradient():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    t = torch.full((4,), IGNORE)
    for reduction in ("mean", "sum"):
        loss = dual_focal_loss(x, t, reduction=reduction)
        assert loss.item() == 0.0
        assert torch.count_nonzero(torch.autograd.grad(loss, x)[0]) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(dtype):
    x, t = draw((16, 7), scale=2.0, ignore=True, seed=3)
    half = x.to(dtype).requires_grad_(True)
    loss = dual_focal_loss(half, t, gamma=2.0)
    assert loss.dtype == torch.float32
    (grad,) = torch.autograd.grad(loss, half)
    assert grad.dtype == dtype
    exact = half.detach().double().requires_grad_(True)
    expected = reduce(reference_elements(exact, t, 2.0), t, "mean")
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
    (expected_grad,) = torch.autograd.grad(expected, exact)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(grad.double(), expected_grad, rtol=2 * eps, atol=2 * eps)


def test_default_gamma_is_the_authors_training_default():
    x, t = draw((4, 5), scale=2.0, ignore=False, seed=9)
    torch.testing.assert_close(
        dual_focal_loss(x, t), reduce(reference_elements(x, t, 1.0), t, "mean"), rtol=RTOL, atol=0
    )
    assert DualFocalLoss().gamma == 1.0


# --- property: dtypes, scales to 1e4, shapes -----------------------------------------------------

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_property_finite_non_negative_and_equal_to_the_reference(data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    scale = data.draw(st.sampled_from([1.0, 10.0, 100.0, 1e3, 1e4]), label="scale")
    n = data.draw(st.integers(1, 5), label="n")
    classes = data.draw(st.integers(2, 6), label="classes")
    extra = data.draw(st.sampled_from([(), (3,), (2, 2)]), label="extra")
    gamma = data.draw(st.floats(0.0, 5.0), label="gamma")
    reduction = data.draw(st.sampled_from(["none", "mean", "sum"]), label="reduction")
    elements = n * math.prod(extra)
    values = data.draw(
        st.lists(st.floats(-1.0, 1.0), min_size=elements * classes, max_size=elements * classes),
        label="logits",
    )
    x = (scale * torch.tensor(values, dtype=torch.float64)).reshape(n, classes, *extra).to(dtype)
    targets = st.lists(st.integers(0, classes - 1), min_size=elements, max_size=elements)
    t = torch.tensor(data.draw(targets, label="target")).reshape(n, *extra)
    if data.draw(st.booleans(), label="ignore one"):
        t.view(-1)[0] = IGNORE

    # The same (rounded) logits in float64. Where rounding to the computation's precision could
    # flip the strict mask (a class within rounding of p_t, not tied with it), skip the example.
    exact = x.detach().double().requires_grad_(True)
    rows, flat = rows_of(exact.detach(), t)
    keep = flat != IGNORE
    log_p = torch.log_softmax(rows[keep], dim=1)
    log_p_t = log_p.gather(1, flat[keep, None])
    near = 1e-9 if dtype == torch.float64 else 1e-4
    gap = (log_p - log_p_t).abs()
    assume(not bool(((gap > 0) & (gap <= near)).any()))

    x = x.requires_grad_(True)
    actual = dual_focal_loss(x, t, gamma=gamma, reduction=reduction)
    assert torch.isfinite(actual).all()
    assert (actual >= 0).all()
    if not keep.any():
        event("all ignored")
        assert not actual.any()  # 0, where the reference divides 0 by 0
        return
    expected = reduce(reference_elements(exact, t, gamma), t, reduction)
    rtol, atol = (1e-10, 1e-12) if dtype == torch.float64 else (1e-4, 1e-5)
    torch.testing.assert_close(actual.double(), expected.detach(), rtol=rtol, atol=atol)

    # gradients, where the runner-up is one class (no other candidate within rounding of it)
    below = torch.where(log_p < log_p_t, log_p, -math.inf)
    top2 = below.topk(2, dim=1).values if classes > 2 else below.expand(-1, 2)
    runner_up_gap = (top2[:, 0] - top2[:, 1]).abs()
    if bool(((runner_up_gap <= near) & torch.isfinite(top2[:, 1])).any()):
        event("gradient not compared: two runners-up")
        return
    (grad,) = torch.autograd.grad(actual.sum(), x)
    (expected_grad,) = torch.autograd.grad(expected.sum(), exact)
    assert torch.isfinite(grad).all()
    if not torch.isfinite(expected_grad).all():
        event("gradient not compared: the naive pow's gradient is NaN (p_t = 1)")
        return
    if dtype.itemsize == 2:  # returned in the input's dtype
        rtol = atol = 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(grad.double(), expected_grad, rtol=rtol, atol=atol * (1 + gamma))


# --- hyper-parameters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [(-0.5, ValueError), (float("nan"), ValueError), (float("inf"), ValueError), ("2", TypeError)],
)
def test_bad_gamma_raises_naming_it(value, error):
    x, t = torch.zeros(2, 3), torch.tensor([0, 1])
    with pytest.raises(error, match="gamma"):
        dual_focal_loss(x, t, gamma=value)
    with pytest.raises(error, match="gamma"):
        DualFocalLoss(gamma=value)
    criterion = DualFocalLoss()
    criterion.gamma = value
    with pytest.raises(error, match="gamma"):
        criterion.check_hyperparameters()
    with pytest.raises(error, match="gamma"):
        criterion(x, t)


def test_module_calls_the_function_with_its_current_gamma():
    x, t = draw((5, 4, 3), scale=2.0, ignore=True, seed=11)
    criterion = DualFocalLoss(reduction="sum")
    criterion.gamma = 3.0
    expected = reduce(reference_elements(x, t, 3.0), t, "sum")
    torch.testing.assert_close(criterion(x, t), expected, rtol=RTOL, atol=0.0)
    assert repr(criterion) == "DualFocalLoss(gamma=3.0, reduction='sum')"
