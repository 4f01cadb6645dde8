"""MDCA, DCA and MMCE against the authors' released formulas, written plainly in float64.

The references transcribe, without our code:

- MDCA: ``MDCA`` and ``ClassficationAndMDCA`` of mdca-loss/MDCA-Calibration
  (``solvers/loss.py``): a loop over the classes of ``|mean_i softmax_ic - mean_i [t_i = c]|``,
  divided by ``C``; the base loss ``nn.CrossEntropyLoss()`` ("NLL+MDCA") or that repository's
  ``FocalLoss``, ``-(1 - p_t)^gamma log p_t`` averaged ("FL+MDCA"); ``base + beta * MDCA``.
- DCA: ``cross_entropy_with_dca_loss`` of the authors' FOURM-LAB/DCA (``loss_fn.py``, also the
  ``DCA`` class of mdca-loss/MDCA-Calibration): ``ce + beta * |mean conf - mean accuracy|``
  with ``conf, pred = max(softmax)``.
- MMCE: ``MMCE`` (MMCE_m) of torrvision/focal_calibration (``Losses/mmce.py``) with its
  ``mmce`` loss (``Losses/loss.py``: ``cross_entropy + lamda * mmce``), itself the PyTorch form
  of ``calibration_unbiased_loss`` of aviralkumar2907/MMCE (``20ng_mmce.py``): the full
  ``N x N`` matrix ``(c - r)(c - r)^T * exp(-|r_i - r_j| / 0.4)`` summed and divided by
  ``N^2``, no square root.

The authors' losses know no ignored elements: ``ignore_index`` is checked against the
reference on the kept rows; ``[N, C, d]`` logits against the reference on the positions
flattened to rows (what the MMCE code does for ``dim > 2``). Values and gradients agree at
``rtol = 1e-10``; on float32 and half inputs (computed in float32) the hypothesis tests compare
with the reference of the same values at float32 precision.
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.callbacks import LinearSchedule, LossScheduler
from lightning_losses.functional.calibration_penalties import (
    dca_loss,
    dca_penalty,
    mdca_loss,
    mdca_penalty,
    mmce_loss,
    mmce_penalty,
)
from lightning_losses.losses import DCALoss, MDCALoss, MMCELoss

RTOL = 1e-10

# --- the references ----------------------------------------------------------------------------


def ref_mdca_penalty(logits, target):
    output = torch.softmax(logits, dim=1)
    loss = torch.zeros((), dtype=logits.dtype)
    classes = output.shape[1]
    for c in range(classes):
        avg_count = (target == c).to(logits.dtype).mean()
        avg_conf = torch.mean(output[:, c])
        loss = loss + torch.abs(avg_conf - avg_count)
    return loss / classes


def ref_focal(logits, target, gamma):
    logpt = F.log_softmax(logits, dim=1).gather(1, target.view(-1, 1)).view(-1)
    pt = logpt.exp()
    return (-1 * (1 - pt) ** gamma * logpt).mean()


def ref_mdca_loss(logits, target, beta, gamma):
    base = F.cross_entropy(logits, target) if gamma == 0 else ref_focal(logits, target, gamma)
    return base + beta * ref_mdca_penalty(logits, target)


def ref_dca_penalty(logits, target):
    softmaxes = F.softmax(logits, dim=1)
    confidences, predictions = torch.max(softmaxes, 1)
    accuracies = predictions.eq(target)
    return torch.abs(confidences.mean() - accuracies.to(logits.dtype).sum() / len(accuracies))


def ref_dca_loss(logits, target, beta):
    return F.cross_entropy(logits, target) + beta * ref_dca_penalty(logits, target)


def ref_mmce_penalty(logits, target):
    predicted_probs, pred_labels = torch.max(F.softmax(logits, dim=1), 1)
    correct_mask = torch.where(
        torch.eq(pred_labels, target),
        torch.ones(pred_labels.shape, dtype=logits.dtype),
        torch.zeros(pred_labels.shape, dtype=logits.dtype),
    )
    c_minus_r = correct_mask - predicted_probs
    dot_product = torch.mm(c_minus_r.unsqueeze(1), c_minus_r.unsqueeze(0))
    prob_tiled = predicted_probs.unsqueeze(1).repeat(1, predicted_probs.shape[0]).unsqueeze(2)
    prob_pairs = torch.cat([prob_tiled, prob_tiled.permute(1, 0, 2)], dim=2)
    kernel = torch.exp(-1.0 * torch.abs(prob_pairs[:, :, 0] - prob_pairs[:, :, 1]) / 0.4)
    return torch.sum(dot_product * kernel) / correct_mask.shape[0] ** 2


def ref_mmce_loss(logits, target, lambda_):
    return F.cross_entropy(logits, target) + lambda_ * ref_mmce_penalty(logits, target)


def rows(logits, target, ignore_index=-100):
    """``[N, C, *]`` logits as rows ``[M, C]`` and the kept rows only (the references' input)."""
    classes = logits.shape[1]
    flat = logits.movedim(1, -1).reshape(-1, classes)
    flat_target = target.reshape(-1)
    keep = flat_target != ignore_index
    return flat[keep], flat_target[keep]


# (our function, its reference on kept rows, hyper-parameters)
LOSSES = [
    (mdca_loss, ref_mdca_loss, {"beta": 1.0, "gamma": 0.0}),
    (mdca_loss, ref_mdca_loss, {"beta": 3.5, "gamma": 2.0}),
    (mdca_loss, ref_mdca_loss, {"beta": 0.7, "gamma": 0.5}),
    (dca_loss, ref_dca_loss, {"beta": 10.0}),
    (mmce_loss, ref_mmce_loss, {"lambda_": 1.0}),
    (mmce_loss, ref_mmce_loss, {"lambda_": 4.0}),
]
PENALTIES = [
    (mdca_penalty, ref_mdca_penalty),
    (dca_penalty, ref_dca_penalty),
    (mmce_penalty, ref_mmce_penalty),
]
LOSS_IDS = ["nll+mdca", "fl+mdca", "fl0.5+mdca", "dca", "mmce", "mmce4"]
SHAPES = [(40, 7), (13, 5, 3), (6, 4, 2, 3)]


def draw(shape, scale=3.0, seed=0, ignored=3):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(shape, generator=generator, dtype=torch.float64) * scale
    target_shape = (shape[0], *shape[2:])
    target = torch.randint(0, shape[1], target_shape, generator=generator)
    # a share of correct predictions, so that c = 1 occurs
    correct = torch.rand(target_shape, generator=generator) < 0.4
    target = torch.where(correct, logits.argmax(1), target)
    flat = target.view(-1)
    flat[torch.randperm(flat.numel(), generator=generator)[:ignored]] = -100
    return logits, target


def value_and_grad(function, logits, target, **kwargs):
    leaf = logits.detach().clone().requires_grad_()
    value = function(leaf, target, **kwargs)
    (grad,) = torch.autograd.grad(value.sum(), leaf)
    return value.detach(), grad


# --- values and gradients against the authors' formulas ----------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("function", "reference", "hparams"), LOSSES, ids=LOSS_IDS)
def test_loss_values_and_gradients_equal_the_authors_formulas(function, reference, hparams, shape):
    logits, target = draw(shape)
    value, grad = value_and_grad(function, logits, target, **hparams)
    _kept_logits, kept_target = rows(logits, target)
    leaf = logits.detach().clone().requires_grad_()
    expected = reference(*rows(leaf, target), **hparams)
    (expected_grad,) = torch.autograd.grad(expected, leaf)
    assert kept_target.numel() == target.numel() - 3
    torch.testing.assert_close(value, expected.detach(), rtol=RTOL, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=RTOL, atol=1e-15)
    # "none": base_i + weight * penalty per element, 0 where ignored; "sum" = n * "mean"
    per_element = function(logits, target, reduction="none", **hparams)
    assert per_element.shape == target.shape
    assert bool((per_element[target == -100] == 0).all())
    n = kept_target.numel()
    torch.testing.assert_close(per_element.sum() / n, expected.detach(), rtol=RTOL, atol=0)
    total = function(logits, target, reduction="sum", **hparams)
    torch.testing.assert_close(total, n * expected.detach(), rtol=RTOL, atol=0)
    _, sum_grad = value_and_grad(function, logits, target, reduction="sum", **hparams)
    torch.testing.assert_close(sum_grad, n * expected_grad, rtol=RTOL, atol=1e-14)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("function", "reference"), PENALTIES, ids=["mdca", "dca", "mmce"])
def test_penalty_values_and_gradients_equal_the_authors_formulas(function, reference, shape):
    for seed, scale in ((1, 0.5), (2, 4.0), (3, 30.0)):
        logits, target = draw(shape, scale=scale, seed=seed)
        value, grad = value_and_grad(function, logits, target)
        leaf = logits.detach().clone().requires_grad_()
        expected = reference(*rows(leaf, target))
        (expected_grad,) = torch.autograd.grad(expected, leaf)
        torch.testing.assert_close(value, expected.detach(), rtol=RTOL, atol=1e-16)
        torch.testing.assert_close(grad, expected_grad, rtol=RTOL, atol=1e-16)


def test_mmce_n_log_n_sum_equals_the_n_squared_sum_on_a_large_batch():
    logits, target = draw((3000, 10), scale=2.0, seed=4, ignored=100)
    value, grad = value_and_grad(mmce_penalty, logits, target)
    leaf = logits.detach().clone().requires_grad_()
    expected = ref_mmce_penalty(*rows(leaf, target))
    (expected_grad,) = torch.autograd.grad(expected, leaf)
    torch.testing.assert_close(value, expected.detach(), rtol=RTOL, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=RTOL, atol=1e-18)


def test_mmce_ties_are_exact():
    """Equal confidences (equal rows, saturated rows, uniform rows) form one kernel group."""
    logits = torch.zeros(24, 4, dtype=torch.float64)
    logits[:6, 0] = 1.0  # six equal rows, confidence e / (e + 3)
    logits[6:12, 2] = 1.0  # six more with the same confidence, another class
    logits[12:16, 1] = 800.0  # confidence exactly 1
    logits[16:18, 3] = 1e4
    target = torch.tensor([0, 1, 0, 1, 0, 0, 2, 2, 3, 2, 1, 2, 1, 1, 0, 1, 3, 2, 0, 1, 2, 3, 0, 0])
    for function, reference in PENALTIES:
        value, grad = value_and_grad(function, logits, target)
        leaf = logits.clone().requires_grad_()
        expected = reference(leaf, target)
        (expected_grad,) = torch.autograd.grad(expected, leaf)
        torch.testing.assert_close(value, expected.detach(), rtol=RTOL, atol=1e-17)
        torch.testing.assert_close(grad, expected_grad, rtol=RTOL, atol=1e-17)


def test_nothing_to_average_gives_zero_and_zero_gradient():
    logits = torch.randn(5, 3, dtype=torch.float64)
    target = torch.full((5,), -100)
    for function, hparams in ((mdca_loss, {"gamma": 1.0}), (dca_loss, {}), (mmce_loss, {})):
        for reduction in ("mean", "sum"):
            value, grad = value_and_grad(function, logits, target, reduction=reduction, **hparams)
            assert value.item() == 0.0
            assert bool((grad == 0).all())
    for function, _ in PENALTIES:
        value, grad = value_and_grad(function, logits, target)
        assert value.item() == 0.0
        assert bool((grad == 0).all())
        assert function(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)).item() == 0.0


def test_global_batch_without_a_process_group_is_the_batch_itself():
    logits, target = draw((30, 6), seed=5)
    for function, _ in PENALTIES:
        value, grad = value_and_grad(function, logits, target)
        global_value, global_grad = value_and_grad(function, logits, target, global_batch=True)
        assert torch.equal(value, global_value)
        assert torch.equal(grad, global_grad)


def test_half_inputs_are_computed_and_returned_in_float32():
    logits, target = draw((20, 5), seed=6)
    for function, hparams in ((mdca_loss, {"gamma": 1.0}), (dca_loss, {}), (mmce_loss, {})):
        for dtype in (torch.float16, torch.bfloat16):
            half = logits.to(dtype).requires_grad_()
            value = function(half, target, **hparams)
            value.backward()
            assert value.dtype == torch.float32
            assert half.grad is not None
            assert half.grad.dtype == dtype
            expected = function(half.detach().float(), target, **hparams)
            torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-6)


# --- properties over dtypes, scales and shapes -------------------------------------------------

PROPERTY_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@st.composite
def batches(draw_):
    dtype = draw_(st.sampled_from(PROPERTY_DTYPES), label="dtype")
    n = draw_(st.integers(1, 8), label="N")
    classes = draw_(st.integers(2, 5), label="C")
    extra = draw_(st.sampled_from([(), (2,), (3, 1)]), label="positions")
    scale = draw_(st.sampled_from([0.0, 1e-3, 1.0, 10.0, 1e3, 1e4]), label="scale")
    shape = (n, classes, *extra)
    size = math.prod(shape)
    values = draw_(st.lists(st.floats(-1, 1), min_size=size, max_size=size), label="logits")
    logits = (torch.tensor(values, dtype=torch.float64).reshape(shape) * scale).to(dtype)
    target_shape = (n, *extra)
    count = math.prod(target_shape)
    labels = draw_(
        st.lists(st.integers(-1, classes - 1), min_size=count, max_size=count), label="target"
    )
    target = torch.tensor(labels).reshape(target_shape)
    target = torch.where(target < 0, -100, target)  # -1 stands for an ignored element
    return logits, target


def decisions_are_clear(logits64, target):
    """The top two classes of every kept row differ at float32 precision (no flip on rounding)."""
    kept, _ = rows(logits64, target)
    if kept.shape[0] == 0:
        return True
    top = kept.topk(2, dim=1).values
    gap = top[:, 0] - top[:, 1]
    return bool(((gap == 0) | (gap > 1e-3 * (1 + top[:, 0].abs()))).all())


def kinks_are_clear(function, logits64, target, tolerance):
    """No ``|.|`` of the penalty sits at its kink, where float32 rounding would flip its sign.

    MDCA: every ``|mean p_c - freq_c|`` and DCA: ``|mean r - accuracy|`` more than
    ``tolerance`` from 0; MMCE: every pair of confidences either equal (identical rows: equal in
    every precision), more than ``tolerance`` apart, or near 1 (where ``dr/dx = r (onehot - p)``
    vanishes). At a kink (a difference that is 0 up to rounding, e.g. uniform rows whose mean
    equals a class frequency) the sign, hence the gradient, depends on the order of summation.
    """
    kept, kept_target = rows(logits64, target)
    if kept.shape[0] == 0:
        return True
    p = kept.softmax(1)
    r, predicted = p.max(1)
    if function is mdca_loss:
        classes = kept.shape[1]
        frequency = torch.stack([(kept_target == c).double().mean() for c in range(classes)])
        return bool(((p.mean(0) - frequency).abs() > tolerance).all())
    if function is dca_loss:
        return abs(r.mean().item() - (predicted == kept_target).double().mean().item()) > tolerance
    close = (r[:, None] - r[None, :]).abs() <= tolerance
    same = (kept[:, None, :] == kept[None, :, :]).all(-1)
    saturated = (r[:, None] > 1 - 1e-6) & (r[None, :] > 1 - 1e-6)
    return bool((~close | same | saturated).all())


@given(batch=batches(), which=st.integers(0, len(LOSSES) - 1))
def test_property_losses_match_the_reference_at_their_precision(batch, which):
    """Finite values and gradients, equal to the float64 reference of the same values."""
    logits, target = batch
    function, reference, hparams = LOSSES[which]
    logits64 = logits.double()
    exact = logits.dtype == torch.float64
    if not exact:
        assume(decisions_are_clear(logits64, target))
    assume(kinks_are_clear(function, logits64, target, 1e-12 if exact else 1e-5))
    value, grad = value_and_grad(function, logits, target, **hparams)
    assert value.dtype == (torch.float64 if exact else torch.float32)
    assert grad.dtype == logits.dtype
    assert bool(torch.isfinite(value))
    assert bool(torch.isfinite(grad).all())
    kept = int((target != -100).sum())
    leaf = logits64.clone().requires_grad_()
    if kept == 0:
        assert value.item() == 0.0
        assert bool((grad == 0).all())
        return
    expected = reference(*rows(leaf, target), **hparams)
    (expected_grad,) = torch.autograd.grad(expected, leaf)
    if 0 < hparams.get("gamma", 0.0) < 1:
        # The authors' focal term's autograd gives 0 * inf = NaN where p_t = 1 exactly; the
        # gradient there is 0 (the row's softmax is one-hot, so every term of it vanishes).
        expected_grad = torch.nan_to_num(expected_grad, nan=0.0)
    # float64: the authors' formula to 1e-10. Float32 computation: log-softmax of logits of
    # magnitude m is exact to about m * 1.2e-7, so values and gradients to 1e-6 * m (times the
    # penalty's weight); gradients of half inputs are rounded to their dtype (its eps, relative)
    if exact:
        rtol, atol, grad_rtol, grad_atol = RTOL, 1e-12, RTOL, 1e-12
    else:
        magnitude = max(1.0, logits64.abs().max().item())
        weight = 1.0 + max(hparams.get("beta", 0.0), hparams.get("lambda_", 0.0))
        rtol, atol = 1e-5, 1e-6 * magnitude * weight
        grad_rtol, grad_atol = max(1e-5, torch.finfo(logits.dtype).eps), atol
    torch.testing.assert_close(value.double(), expected.detach(), rtol=rtol, atol=atol)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=grad_rtol, atol=grad_atol)


@given(batch=batches(), which=st.integers(0, len(PENALTIES) - 1))
def test_property_penalties_are_bounded_and_flatten_positions(batch, which):
    """MDCA in [0, 2/C], DCA in [0, 1], MMCE in [0, 1] (up to rounding); [N, C, *] is rows."""
    logits, target = batch
    function, _ = PENALTIES[which]
    value, grad = value_and_grad(function, logits, target)
    assert bool(torch.isfinite(value))
    assert bool(torch.isfinite(grad).all())
    upper = 2.0 / logits.shape[1] if function is mdca_penalty else 1.0
    assert -1e-6 <= value.item() <= upper + 1e-6
    flat = logits.movedim(1, -1).reshape(-1, logits.shape[1])
    flat_value, flat_grad = value_and_grad(function, flat, target.reshape(-1))
    torch.testing.assert_close(value, flat_value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(
        grad.movedim(1, -1).reshape(flat.shape).float(), flat_grad.float(), rtol=1e-5, atol=1e-6
    )


# --- hyper-parameters and options --------------------------------------------------------------


@pytest.mark.parametrize(
    ("function", "name", "good"),
    [
        (mdca_loss, "beta", {"gamma": 0.0}),
        (mdca_loss, "gamma", {"beta": 1.0}),
        (dca_loss, "beta", {}),
        (mmce_loss, "lambda_", {}),
    ],
)
@pytest.mark.parametrize("bad", [-1.0, -1e-9, math.nan, math.inf])
def test_bad_hyperparameters_raise_naming_them(function, name, good, bad):
    logits, target = torch.zeros(2, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match=rf"^{name} must lie in \[0, inf\); got"):
        function(logits, target, **good, **{name: bad})


@pytest.mark.parametrize(
    ("module", "name"),
    [(MDCALoss, "beta"), (MDCALoss, "gamma"), (DCALoss, "beta"), (MMCELoss, "lambda_")],
)
def test_modules_check_their_hyperparameters_when_built_and_on_request(module, name):
    with pytest.raises(ValueError, match=rf"^{name} must lie in \[0, inf\); got -2.0"):
        module(**{name: -2.0})
    criterion = module()
    setattr(criterion, name, -2.0)
    with pytest.raises(ValueError, match=rf"^{name} must lie in \[0, inf\)"):
        criterion.check_hyperparameters()


def test_bad_options_raise_naming_them():
    logits, target = torch.zeros(2, 3), torch.tensor([0, 1])
    for function, _ in PENALTIES:
        with pytest.raises(TypeError, match=r"^global_batch must be True or False"):
            function(logits, target, global_batch=1)
    with pytest.raises(ValueError, match=r"^reduction must be one of"):
        mmce_loss(logits, target, reduction="avg")
    with pytest.raises(ValueError, match=r"^target values must lie in"):
        dca_penalty(logits, torch.tensor([0, 3]))
    with pytest.raises(TypeError, match="does not take label_smoothing"):
        MDCALoss(label_smoothing=0.1)


def test_modules_call_their_functions_with_the_current_attributes():
    logits, target = draw((12, 4), seed=7)
    cases = [
        (MDCALoss(beta=2.0, gamma=1.0, reduction="sum"), mdca_loss, {"beta": 2.0, "gamma": 1.0}),
        (DCALoss(beta=3.0, reduction="none"), dca_loss, {"beta": 3.0}),
        (MMCELoss(lambda_=5.0, global_batch=True), mmce_loss, {"lambda_": 5.0}),
    ]
    for criterion, function, hparams in cases:
        options = {"reduction": criterion.reduction}
        assert criterion.hyperparameters() == hparams
        torch.testing.assert_close(
            criterion(logits, target), function(logits, target, **hparams, **options)
        )
    criterion = MDCALoss()
    assert criterion.hyperparameters() == {"beta": 1.0, "gamma": 0.0}
    assert DCALoss().beta == 10.0
    assert MMCELoss().lambda_ == 1.0
    criterion.beta = 0.0  # plain attributes: the next call uses the new value
    torch.testing.assert_close(criterion(logits, target), F.cross_entropy(*rows(logits, target)))
    assert repr(criterion) == "MDCALoss(beta=0.0, gamma=0.0, reduction='mean')"


# --- a schedule over beta in a plain LightningModule --------------------------------------------


class Plain(L.LightningModule):
    """A user's LightningModule: nothing of ours but the criterion attribute."""

    def __init__(self, criterion: nn.Module) -> None:
        super().__init__()
        self.net = nn.Linear(6, 3)
        self.criterion = criterion

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.criterion(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RecordLoss(Callback):
    """Each step's beta and loss, and the loss recomputed with mdca_loss at that beta."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, float, float]] = []

    def on_before_backward(self, trainer, pl_module, loss):
        x, y = self.batch
        with torch.no_grad():
            expected = mdca_loss(pl_module.net(x), y, beta=pl_module.criterion.beta)
        self.seen.append((pl_module.criterion.beta, loss.item(), expected.item()))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch = batch


def test_loss_scheduler_drives_the_mdca_weight(tmp_path):
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 6, generator=generator), torch.randint(0, 3, (32,), generator=generator)
    record = RecordLoss()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[LossScheduler("beta", LinearSchedule(0.0, 4.0, end=2)), record],
    )
    trainer.fit(Plain(MDCALoss(beta=0.0)), DataLoader(TensorDataset(x, y), batch_size=16))
    assert [beta for beta, _, _ in record.seen] == [0.0, 2.0]
    for _, loss, expected in record.seen:
        assert loss == pytest.approx(expected, rel=1e-6)
