"""Poly-1 against the authors' formula, written plainly in float64: values and gradients.

The reference transcribes Poly-1 cross-entropy of Leng et al., "PolyLoss: A Polynomial
Expansion Perspective of Classification Loss Functions" (ICLR 2022), from the listing the paper
gives as its released code (``poly1_cross_entropy``; no repository of the authors is in the
search tools' index)::

    pt = tf.reduce_sum(labels * tf.nn.softmax(logits), axis=-1)
    CE = tf.nn.softmax_cross_entropy_with_logits(labels, logits)
    Poly1 = CE + epsilon * (1 - pt)

with one-hot ``labels`` and ``softmax_cross_entropy_with_logits`` written as ``-sum(labels *
log_softmax(logits))``, all in float64, the class dimension moved last for ``[N, C, d]``. The
paper has no class weights: ours follow ``F.cross_entropy`` (each element times ``w_t``,
``"mean"`` divided by the sum of ``w_t`` over the non-ignored elements), and so does the
reference here. Values and gradients (``torch.autograd.grad``) must agree at ``rtol=1e-10``
(``atol=1e-13`` for entries that are zero up to rounding) on float64 inputs; the hypothesis
property compares at the precision each dtype is computed in.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.callbacks import LinearSchedule, LossScheduler
from lightning_losses.callbacks.loss_scheduler import hyperparameter_names
from lightning_losses.functional.linear import linear_target_loss
from lightning_losses.functional.target_probability import poly1_loss
from lightning_losses.losses import LinearTargetLoss, Poly1Loss

RTOL, ATOL = 1e-10, 1e-13
IGNORE = -100
EPSILONS = [-1.0, -0.5, 0.0, 1.0, 2.0, 7.5]
SHAPES = [(6, 5), (4, 5, 3)]
REDUCTIONS = ["none", "mean", "sum"]


# --- the reference ------------------------------------------------------------------------------


def reference(logits, target, epsilon, *, weight=None, ignore_index=IGNORE, reduction="mean"):
    """The paper's Poly-1 in float64, class weights and ``ignore_index`` as F.cross_entropy's."""
    classes = logits.shape[1]
    x = logits.double().movedim(1, -1)  # [N, *, C]
    valid = target != ignore_index
    safe = torch.where(valid, target, 0).long()
    labels = F.one_hot(safe, classes).double()
    pt = torch.sum(labels * torch.softmax(x, dim=-1), dim=-1)
    ce = -torch.sum(labels * torch.log_softmax(x, dim=-1), dim=-1)
    poly1 = ce + epsilon * (1 - pt)
    w = valid.double() if weight is None else weight.double()[safe] * valid
    poly1 = poly1 * w
    if reduction == "none":
        return poly1
    if reduction == "sum":
        return poly1.sum()
    total = w.sum()
    return poly1.sum() / total if total > 0 else poly1.sum() * 0  # nothing to average: 0


def make_inputs(shape, seed, *, scale=3.0, dtype=torch.float64, ignored=1):
    generator = torch.Generator().manual_seed(seed)
    x = (scale * torch.randn(shape, generator=generator, dtype=torch.float64)).to(dtype)
    t = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=generator)
    flat = t.view(-1)
    flat[torch.randperm(flat.numel(), generator=generator)[:ignored]] = IGNORE
    return x.requires_grad_(), t


def class_weight(classes, seed=7):
    generator = torch.Generator().manual_seed(seed)
    return 0.25 + torch.rand(classes, generator=generator, dtype=torch.float64)


def value_and_grad(out, x, seed=3):
    """The value and the gradient of ``x`` under a fixed random upstream gradient."""
    generator = torch.Generator().manual_seed(seed)
    upstream = 0.5 + torch.rand(out.shape, generator=generator, dtype=torch.float64)
    (grad,) = torch.autograd.grad(out, x, upstream.to(out.dtype))
    return out.detach(), grad


def assert_close(actual, expected, rtol=RTOL, atol=ATOL):
    torch.testing.assert_close(
        actual.double(), expected.double(), rtol=rtol, atol=atol, check_dtype=False
    )


# --- values and gradients against the reference ------------------------------------------------


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=["NC", "NCd"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weight"])
def test_values_and_gradients_equal_the_reference(epsilon, reduction, shape, weighted):
    x, t = make_inputs(shape, seed=len(shape) * 10 + int(weighted))
    w = class_weight(shape[1]) if weighted else None
    ours, ours_grad = value_and_grad(
        poly1_loss(x, t, epsilon=epsilon, weight=w, reduction=reduction), x
    )
    ref, ref_grad = value_and_grad(reference(x, t, epsilon, weight=w, reduction=reduction), x)
    assert ours.dtype == torch.float64
    assert_close(ours, ref)
    assert_close(ours_grad, ref_grad)
    if reduction == "none":  # ignored elements: zero loss, zero gradient
        ignored = t == IGNORE
        assert torch.equal(ours[ignored], torch.zeros_like(ours[ignored]))
        ignored_grad = ours_grad.movedim(1, -1)[ignored]
        assert torch.equal(ignored_grad, torch.zeros_like(ignored_grad))


@pytest.mark.parametrize("epsilon", [-1.0, 1.0, 4.0])
def test_other_ignore_index_and_all_ignored(epsilon):
    x, t = make_inputs((8, 4), seed=5, ignored=0)
    t[::3] = 2  # a valid class used as ignore_index
    ours, ours_grad = value_and_grad(poly1_loss(x, t, epsilon=epsilon, ignore_index=2), x)
    ref, ref_grad = value_and_grad(reference(x, t, epsilon, ignore_index=2), x)
    assert_close(ours, ref)
    assert_close(ours_grad, ref_grad)
    # nothing to average: 0 with a zero gradient, not NaN
    everything = torch.full_like(t, IGNORE)
    out = poly1_loss(x, everything, epsilon=epsilon)
    (grad,) = torch.autograd.grad(out, x)
    assert out.item() == 0.0
    assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=["NC", "NCd"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weight"])
def test_epsilon_zero_is_cross_entropy(reduction, shape, weighted):
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        x, t = make_inputs(shape, seed=11, dtype=dtype)
        w = class_weight(shape[1]).to(dtype) if weighted else None
        ours, ours_grad = value_and_grad(
            poly1_loss(x, t, epsilon=0.0, weight=w, reduction=reduction), x
        )
        torch_ce, torch_grad = value_and_grad(
            F.cross_entropy(x, t, weight=w, reduction=reduction), x
        )
        assert ours.dtype == dtype
        assert_close(ours, torch_ce, rtol=tol, atol=tol)
        assert_close(ours_grad, torch_grad, rtol=tol, atol=tol)


# --- the chunked linear head -------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [-1.0, 0.5, 2.0])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weight"])
def test_linear_head_equals_the_reference(epsilon, reduction, weighted):
    generator = torch.Generator().manual_seed(2)
    n, h, v = 23, 6, 17
    hidden = torch.randn(n, h, generator=generator, dtype=torch.float64).requires_grad_()
    weight = (0.7 * torch.randn(v, h, generator=generator, dtype=torch.float64)).requires_grad_()
    bias = torch.randn(v, generator=generator, dtype=torch.float64).requires_grad_()
    target = torch.randint(0, v, (n,), generator=generator)
    target[::4] = IGNORE
    w = class_weight(v) if weighted else None
    inputs = (hidden, weight, bias)
    ours = linear_target_loss(
        hidden,
        weight,
        target,
        loss="poly1",
        epsilon=epsilon,
        bias=bias,
        class_weight=w,
        chunk_size=5,
        reduction=reduction,
    )
    ref = reference(hidden @ weight.T + bias, target, epsilon, weight=w, reduction=reduction)
    upstream = 0.5 + torch.rand(ours.shape, generator=generator, dtype=torch.float64)
    ours_grads = torch.autograd.grad(ours, inputs, upstream)
    ref_grads = torch.autograd.grad(ref, inputs, upstream)
    assert_close(ours.detach(), ref.detach())
    for mine, theirs in zip(ours_grads, ref_grads, strict=True):
        assert_close(mine, theirs)


def test_linear_module_takes_and_schedules_epsilon():
    criterion = LinearTargetLoss("poly1", epsilon=0.25)
    assert hyperparameter_names(criterion) == ["epsilon"]
    assert criterion.epsilon == 0.25
    assert LinearTargetLoss("poly1").epsilon == 1.0  # the paper's default
    criterion.epsilon = -3.0
    with pytest.raises(ValueError, match="epsilon"):
        criterion.check_hyperparameters()


# --- bad epsilon -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1.5, -math.inf, math.inf, math.nan])
def test_bad_epsilon_is_an_error_naming_it(bad):
    x, t = make_inputs((3, 4), seed=0)
    hidden, weight = torch.randn(3, 2), torch.randn(4, 2)
    with pytest.raises(ValueError, match="epsilon"):
        poly1_loss(x, t, epsilon=bad)
    with pytest.raises(ValueError, match="epsilon"):
        Poly1Loss(epsilon=bad)
    with pytest.raises(ValueError, match="epsilon"):
        linear_target_loss(hidden, weight, t, loss="poly1", epsilon=bad)
    with pytest.raises(ValueError, match="epsilon"):
        LinearTargetLoss("poly1", epsilon=bad)
    criterion = Poly1Loss()
    criterion.epsilon = bad  # as a schedule would set it
    with pytest.raises(ValueError, match="epsilon"):
        criterion.check_hyperparameters()
    with pytest.raises(ValueError, match="epsilon"):
        criterion(x, t)


def test_epsilon_minus_one_is_accepted_and_wrong_types_are_not():
    x, t = make_inputs((3, 4), seed=0)
    assert poly1_loss(x, t, epsilon=-1).item() >= 0
    with pytest.raises(TypeError, match="epsilon"):
        poly1_loss(x, t, epsilon="1.0")
    with pytest.raises(TypeError, match="epsilon"):
        Poly1Loss(epsilon=True)


def test_label_smoothing_only_zero():
    x, t = make_inputs((3, 4), seed=0)
    assert Poly1Loss(label_smoothing=0.0).epsilon == 1.0
    with pytest.raises(TypeError, match="label_smoothing"):
        poly1_loss(x, t, label_smoothing=0.1)
    with pytest.raises(TypeError, match="label_smoothing"):
        Poly1Loss(label_smoothing=0.1)
    with pytest.raises(TypeError, match="label_smoothing"):
        linear_target_loss(torch.randn(3, 2), torch.randn(4, 2), t, loss="poly1",
                           label_smoothing=0.1)  # fmt: skip


# --- the module --------------------------------------------------------------------------------


def test_module_is_the_function_with_its_attributes():
    x, t = make_inputs((5, 4, 2), seed=4)
    w = class_weight(4).float()
    criterion = Poly1Loss(epsilon=2.0, weight=w, reduction="sum")
    assert criterion.hyperparameters() == {"epsilon": 2.0}
    assert repr(criterion) == "Poly1Loss(epsilon=2.0, reduction='sum')"
    criterion.epsilon = -0.5  # a plain attribute: the next call uses it
    expected = reference(x, t, -0.5, weight=criterion.weight, reduction="sum")
    assert_close(criterion(x, t), expected)
    assert "weight" in criterion.state_dict()


# --- property: every dtype, scale and shape ----------------------------------------------------

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def tolerances(dtype, shape):
    """(rtol, atol) of the value and of the gradient against the float64 reference.

    float64 is computed in float64; the other dtypes in float32, except that ``[N, C, d]``
    half logits get ``log p_t`` from PyTorch's half cross-entropy kernel (rounded to half), and
    half inputs get their gradient back in half.
    """
    if dtype == torch.float64:
        return (RTOL, 1e-12), (RTOL, 1e-12)
    half = dtype.itemsize == 2
    value = (1e-2, 1e-2) if half and len(shape) > 2 else (1e-4, 1e-5)
    gradient = (2e-2, 2e-2) if half else (1e-4, 1e-5)
    return value, gradient


@settings(max_examples=120)
@given(
    data=st.data(),
    dtype=st.sampled_from(DTYPES),
    scale=st.sampled_from([1.0, 10.0, 100.0, 1e4]),
    extra=st.sampled_from([(), (3,)]),
    epsilon=st.sampled_from([-1.0, 0.0, 1.0, 2.0]) | st.floats(-1.0, 10.0),
    reduction=st.sampled_from(REDUCTIONS),
)
def test_property_finite_non_negative_and_equal_to_the_reference(
    data, dtype, scale, extra, epsilon, reduction
):
    n = data.draw(st.integers(1, 4), label="n")
    classes = data.draw(st.integers(2, 6), label="classes")
    shape = (n, classes, *extra)
    count = math.prod(shape)
    values = data.draw(
        st.lists(st.floats(-scale, scale), min_size=count, max_size=count), label="logits"
    )
    x = torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype).requires_grad_()
    targets = data.draw(
        st.lists(st.integers(0, classes - 1), min_size=count // classes, max_size=count // classes)
    )
    t = torch.tensor(targets).reshape(n, *extra)
    if data.draw(st.booleans(), label="ignore one?"):
        t.view(-1)[0] = IGNORE
    weighted = data.draw(st.booleans(), label="weighted?")
    w = class_weight(classes, seed=n) if weighted else None

    out = poly1_loss(x, t, epsilon=epsilon, weight=w, reduction=reduction)
    upstream = torch.full(out.shape, 0.75, dtype=out.dtype)
    (grad,) = torch.autograd.grad(out, x, upstream)
    # as the whole family: half inputs are computed and returned in float32 (compute_dtype)
    assert out.dtype == torch.promote_types(dtype, torch.float32)
    assert grad.dtype == dtype
    assert torch.isfinite(out).all()
    assert torch.isfinite(grad).all()
    assert (out >= 0).all()  # -log p >= 1 - p: non-negative for every epsilon >= -1

    # the reference sees the very numbers the loss saw (half inputs rounded to half already)
    xr = x.detach().double().requires_grad_()
    wr = None if w is None else w.to(torch.promote_types(dtype, torch.float32))
    ref = reference(xr, t, epsilon, weight=wr, reduction=reduction)
    (ref_grad,) = torch.autograd.grad(ref, xr, upstream.double())
    (value_rtol, value_atol), (grad_rtol, grad_atol) = tolerances(dtype, shape)
    scale_of_value = 1.0 + abs(epsilon)
    assert_close(out.detach(), ref.detach(), rtol=value_rtol, atol=value_atol * scale_of_value)
    assert_close(grad, ref_grad, rtol=grad_rtol, atol=grad_atol * scale_of_value)


# --- a schedule over epsilon in a real (tiny) fit ----------------------------------------------


class PlainModule(L.LightningModule):
    """A plain LightningModule with a Poly-1 criterion; records what each step used."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.criterion = Poly1Loss(epsilon=1.0)
        self.seen: list[tuple[int, float, float, float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.layer(x)
        loss = self.criterion(logits, y)
        epsilon = self.criterion.epsilon
        expected = reference(logits.detach(), y, epsilon).item()
        self.seen.append((self.trainer.global_step, epsilon, loss.item(), expected))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(8, 4, generator=generator)
        y = torch.randint(0, 3, (8,), generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=4)


def tiny_fit(callbacks: list) -> tuple[PlainModule, L.Trainer]:
    model = PlainModule()
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
    )
    trainer.fit(model)
    return model, trainer


def test_loss_scheduler_over_epsilon_drives_poly1():
    # LinearSchedule(1, -1, start=0, end=1): epsilon = 1 at step 0 (the value given, so no
    # warning that it is replaced) and -1 at step 1.
    model, trainer = tiny_fit([LossScheduler("epsilon", LinearSchedule(1.0, -1.0, end=1))])
    assert [(step, epsilon) for step, epsilon, _, _ in model.seen] == [(0, 1.0), (1, -1.0)]
    for _, _, loss, expected in model.seen:
        assert math.isclose(loss, expected, rel_tol=1e-6)
    assert model.criterion.epsilon == -1.0
    assert float(trainer.callback_metrics["schedule/epsilon"]) == -1.0


def test_loss_scheduler_reaching_a_bad_epsilon_fails_before_training():
    model = PlainModule()
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[LossScheduler("epsilon", LinearSchedule(1.0, -2.0, end=1))],
    )
    with pytest.raises(ValueError, match="epsilon"):
        trainer.fit(model)
    assert model.seen == []
