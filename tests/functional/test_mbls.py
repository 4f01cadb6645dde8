"""MbLS against the authors' formula, in float64: values, gradients, reductions, dtypes.

The reference transcribes ``LogitMarginL1.forward`` of the authors' repository by-liu/MbLS
(``calibrate/losses/logit_margin_l1.py``) plainly in float64: ``[N, C, *]`` logits viewed as
``[N, C, -1]``, transposed and flattened to rows; ignored rows dropped (their
``ignore_index >= 0`` branch; see below for ``-100``); ``CE + alpha * relu(max - x - margin)``
averaged over the rows *and* the classes. Gradients are autograd's gradients of that
transcription (``max(dim=1).values`` sends the maximum's gradient to one column, as theirs).
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from hypothesis import event, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.callbacks import LinearSchedule, LossScheduler
from lightning_losses.functional import margin
from lightning_losses.functional.margin import mbls_loss
from lightning_losses.losses import MbLSLoss

RTOL = 1e-10
IGNORE = -100
SHAPES = [(7, 5), (3, 4, 6), (2, 3, 2, 3)]
HYPER = [(10.0, 0.1), (2.0, 0.5), (0.0, 1.0)]  # (margin, alpha): the defaults and harder hinges


@pytest.fixture(autouse=True, params=["small-rows", "fused"])
def path(request, monkeypatch):
    """Every test on both CPU paths: PyTorch's ops for small logits, the fused function."""
    if request.param == "fused":  # no batch is small enough for the composite path
        monkeypatch.setattr(margin, "SMALL_ROWS_ELEMENTS", -1)
    return request.param


# --- the authors' formula, transcribed -----------------------------------------------------------


def rows_of(x, t):
    """``[N, C, *]`` logits and ``[N, *]`` targets as ``[M, C]`` rows and ``[M]``, as theirs."""
    if x.dim() > 2:
        x = x.reshape(x.size(0), x.size(1), -1).transpose(1, 2).reshape(-1, x.size(1))
    return x, t.reshape(-1)


def margin_terms(x, margin):
    """``relu(max_j x_j - x_k - margin)`` per row and class, as their ``get_diff``."""
    max_values = x.max(dim=1).values.unsqueeze(dim=1).repeat(1, x.shape[1])
    return F.relu((max_values - x) - margin)


def reference(x, t, margin=10.0, alpha=0.1, ignore_index=IGNORE):
    """The authors' value: ``CE + alpha * mean over rows and classes`` of the non-ignored rows."""
    x, t = rows_of(x.double(), t)
    keep = t != ignore_index
    x, t = x[keep], t[keep]
    loss_ce = F.cross_entropy(x, t)
    return loss_ce + alpha * margin_terms(x, margin).mean()


def reference_elements(x, t, margin=10.0, alpha=0.1, ignore_index=IGNORE):
    """Per element ``CE_i + alpha * mean_k relu(...)``, ``[N, *]``, 0 where ignored."""
    rows, flat = rows_of(x.double(), t)
    keep = flat != ignore_index
    safe = torch.where(keep, flat, 0)
    ce = F.cross_entropy(rows, safe, reduction="none")
    values = ce + alpha * margin_terms(rows, margin).mean(dim=1)
    return torch.where(keep, values, torch.zeros_like(values)).reshape(t.shape)


def reduce(values, t, reduction, ignore_index=IGNORE):
    if reduction == "none":
        return values
    if reduction == "sum":
        return values.sum()
    return values.sum() / (t != ignore_index).sum()


def draw(shape, *, scale, ignore, seed):
    generator = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(shape, dtype=torch.float64, generator=generator)
    target_shape = (shape[0], *shape[2:])
    t = torch.randint(0, shape[1], target_shape, generator=generator)
    if ignore:
        t.view(-1)[::3] = IGNORE
    return x, t


# --- values and gradients at rtol 1e-10 ----------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("ignore", [False, True], ids=["all", "ignored"])
@pytest.mark.parametrize(("margin", "alpha"), HYPER)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_values_and_gradients_equal_the_authors_formula(shape, margin, alpha, ignore, reduction):
    x, t = draw(shape, scale=6.0, ignore=ignore, seed=sum(shape))
    x.requires_grad_(True)
    hyper = {"margin": margin, "alpha": alpha}
    actual = mbls_loss(x, t, **hyper, reduction=reduction)
    expected = reduce(reference_elements(x, t, **hyper), t, reduction)
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=1e-13)
    # a random cotangent: every element's gradient is weighted differently
    cotangent = torch.rand(actual.shape, dtype=torch.float64, generator=torch.Generator())
    (grad,) = torch.autograd.grad(actual, x, cotangent)
    (expected_grad,) = torch.autograd.grad(expected, x, cotangent)
    torch.testing.assert_close(grad, expected_grad, rtol=RTOL, atol=1e-13)


@pytest.mark.parametrize("ignore", [False, True], ids=["all", "ignored"])
@pytest.mark.parametrize(("margin", "alpha"), HYPER)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_mean_is_the_authors_value_over_samples_and_classes(shape, margin, alpha, ignore):
    x, t = draw(shape, scale=6.0, ignore=ignore, seed=1 + sum(shape))
    x.requires_grad_(True)
    actual = mbls_loss(x, t, margin=margin, alpha=alpha)
    expected = reference(x, t, margin=margin, alpha=alpha)
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=0.0)
    none = mbls_loss(x, t, margin=margin, alpha=alpha, reduction="none")
    torch.testing.assert_close(none.sum() / (t != IGNORE).sum(), expected, rtol=RTOL, atol=0.0)
    (grad,) = torch.autograd.grad(actual, x)
    (expected_grad,) = torch.autograd.grad(expected, x)
    torch.testing.assert_close(grad, expected_grad, rtol=RTOL, atol=1e-13)
    # the cases exercise the hinge: some logit lies farther than the margin below the maximum
    rows, _ = rows_of(x.detach(), t)
    assert (margin_terms(rows, margin) > 0).any()


def test_authors_default_ignore_index_counts_ignored_rows_in_the_hinge_and_ours_does_not():
    # Their code drops ignored rows only for ignore_index >= 0: with -100 the hinge of an
    # ignored row still counts. Ours drops it in both terms (the >= 0 branch, for any index).
    x = torch.tensor([[12.0, 0.0, 1.0], [30.0, 0.0, 0.0]], dtype=torch.float64)
    t = torch.tensor([0, IGNORE])
    kept = reference(x[:1], t[:1])
    torch.testing.assert_close(mbls_loss(x, t), kept, rtol=RTOL, atol=0.0)
    with_ignored_hinge = F.cross_entropy(x, t) + 0.1 * margin_terms(x, 10.0).mean()
    assert not torch.isclose(mbls_loss(x, t), with_ignored_hinge)


def test_all_ignored_gives_zero_and_a_zero_gradient():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    t = torch.full((4,), IGNORE)
    for reduction in ("mean", "sum"):
        loss = mbls_loss(x, t, reduction=reduction)
        assert loss.item() == 0.0
        (grad,) = torch.autograd.grad(loss, x)
        assert torch.count_nonzero(grad) == 0


def test_alpha_zero_is_cross_entropy_and_margin_beyond_every_distance_too():
    x, t = draw((9, 6, 2), scale=4.0, ignore=True, seed=5)
    expected = F.cross_entropy(x, t, ignore_index=IGNORE)
    torch.testing.assert_close(mbls_loss(x, t, alpha=0.0), expected, rtol=RTOL, atol=0.0)
    spread = float(x.max() - x.min())
    torch.testing.assert_close(
        mbls_loss(x, t, margin=spread + 1, alpha=5.0), expected, rtol=RTOL, atol=0.0
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(dtype):
    x, t = draw((16, 7), scale=8.0, ignore=True, seed=3)
    half = x.to(dtype).requires_grad_(True)
    loss = mbls_loss(half, t, margin=2.0)
    assert loss.dtype == torch.float32
    (grad,) = torch.autograd.grad(loss, half)
    assert grad.dtype == dtype
    exact = half.detach().double().requires_grad_(True)
    expected = reference(exact, t, margin=2.0)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
    (expected_grad,) = torch.autograd.grad(expected, exact)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-2, atol=1e-3)


# --- property: dtypes, scales to 1e4, shapes -----------------------------------------------------

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def tolerance(dtype):
    """(rtol, atol) at the precision of the computation (half dtypes: float32)."""
    return (1e-10, 1e-12) if dtype == torch.float64 else (1e-4, 1e-5)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_property_finite_non_negative_and_equal_to_the_reference(data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    scale = data.draw(st.sampled_from([1.0, 10.0, 100.0, 1e3, 1e4]), label="scale")
    n = data.draw(st.integers(1, 5), label="n")
    classes = data.draw(st.integers(2, 6), label="classes")
    extra = data.draw(st.sampled_from([(), (3,), (2, 2)]), label="extra")
    margin = data.draw(st.floats(0.0, 20.0), label="margin")
    alpha = data.draw(st.floats(0.0, 2.0), label="alpha")
    reduction = data.draw(st.sampled_from(["none", "mean", "sum"]), label="reduction")
    shape = (n, classes, *extra)
    count = n * classes * math.prod(extra)
    values = data.draw(
        st.lists(st.floats(-1.0, 1.0), min_size=count, max_size=count), label="logits"
    )
    x = (scale * torch.tensor(values, dtype=torch.float64)).reshape(shape).to(dtype)
    t = torch.tensor(
        data.draw(
            st.lists(
                st.integers(0, classes - 1), min_size=count // classes, max_size=count // classes
            ),
            label="target",
        )
    ).reshape(n, *extra)
    if data.draw(st.booleans(), label="ignore one"):
        t.view(-1)[0] = IGNORE

    x = x.requires_grad_(True)
    actual = mbls_loss(x, t, margin=margin, alpha=alpha, reduction=reduction)
    exact = x.detach().double().requires_grad_(True)  # the same (rounded) logits, in float64
    expected = reduce(reference_elements(exact, t, margin=margin, alpha=alpha), t, reduction)
    assert torch.isfinite(actual).all()
    assert (actual >= 0).all()
    if not (t != IGNORE).any():
        event("all ignored")
        assert not actual.any()  # 0, where the reference divides 0 by 0
        return
    rtol, atol = tolerance(dtype)
    torch.testing.assert_close(actual.double(), expected.detach(), rtol=rtol, atol=atol)

    # gradients, unless rounding can flip a hinge (a distance within rounding of the margin)
    rows, _ = rows_of(exact.detach(), t)
    gap = (rows.max(dim=1, keepdim=True).values - rows) - margin
    precision = 1e-12 if dtype == torch.float64 else 1e-5
    if bool((gap.abs() <= precision * (scale + margin)).any()):
        event("gradient not compared: a distance at the margin")
        return
    (grad,) = torch.autograd.grad(actual.sum(), x)
    (expected_grad,) = torch.autograd.grad(expected.sum(), exact)
    # the gradient is returned in the input's dtype: compared at that dtype's precision
    if dtype.itemsize == 2:
        rtol = atol = 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(grad.double(), expected_grad, rtol=rtol, atol=atol * (1 + alpha))


# --- hyper-parameters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("margin", -1.0, ValueError),
        ("margin", float("nan"), ValueError),
        ("margin", float("inf"), ValueError),
        ("alpha", -0.1, ValueError),
        ("alpha", float("inf"), ValueError),
        ("alpha", "0.1", TypeError),
    ],
)
def test_bad_hyperparameters_raise_naming_them(name, value, error):
    x, t = torch.zeros(2, 3), torch.tensor([0, 1])
    with pytest.raises(error, match=name):
        mbls_loss(x, t, **{name: value})
    with pytest.raises(error, match=name):
        MbLSLoss(**{name: value})
    criterion = MbLSLoss()
    setattr(criterion, name, value)
    with pytest.raises(error, match=name):
        criterion.check_hyperparameters()
    with pytest.raises(error, match=name):
        criterion(x, t)


def test_module_calls_the_function_with_its_current_attributes():
    x, t = draw((5, 4, 3), scale=6.0, ignore=True, seed=11)
    criterion = MbLSLoss(reduction="sum")
    assert criterion.hyperparameters() == {"margin": 10.0, "alpha": 0.1}
    criterion.margin, criterion.alpha = 1.5, 0.7
    expected = reduce(reference_elements(x, t, margin=1.5, alpha=0.7), t, "sum")
    torch.testing.assert_close(criterion(x, t), expected, rtol=RTOL, atol=0.0)
    assert repr(criterion) == "MbLSLoss(margin=1.5, alpha=0.7, reduction='sum')"


# --- a schedule over alpha in a real (tiny) fit --------------------------------------------------


class PlainModule(L.LightningModule):
    """A plain LightningModule (no mixin) that owns an MbLS criterion and records each step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.criterion = MbLSLoss(margin=0.5, alpha=0.0)
        self.seen: list[tuple[int, float, float, float]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.layer(x)
        loss = self.criterion(logits, y)
        alpha = self.criterion.alpha
        expected = reference(logits.detach(), y, margin=0.5, alpha=alpha)
        self.seen.append((self.trainer.global_step, alpha, loss.item(), expected.item()))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = 4 * torch.randn(8, 4, generator=generator)
        y = torch.randint(0, 3, (8,), generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=4)


def fit(callbacks):
    model = PlainModule()
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
    )
    trainer.fit(model)
    return model


def test_loss_scheduler_drives_alpha_of_mbls_in_a_plain_lightning_module():
    model = fit([LossScheduler("alpha", LinearSchedule(0.0, 0.8, start=0, end=2))])
    assert [(step, alpha) for step, alpha, _, _ in model.seen] == [(0, 0.0), (1, 0.4)]
    for _, _, loss, expected in model.seen:
        assert loss == pytest.approx(expected, rel=1e-5)


def test_loss_scheduler_rejects_a_negative_alpha_before_training():
    # 2 steps, 0 and 1: the last one reaches -0.5 * 1 / 2 (end=2 is never reached).
    with pytest.raises(ValueError, match=r"alpha=-0\.25 at step 1.*MbLSLoss rejects it: alpha"):
        fit([LossScheduler("alpha", LinearSchedule(0.0, -0.5, start=0, end=2))])
