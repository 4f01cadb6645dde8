"""One home for per-task NLL and accuracy: its formulas, and every caller giving its values.

The references are written here in float64 numpy (log-sum-exp, the sigmoid's logs, argmax),
independently of torch's losses and of the package. Then each place that reports an NLL or an
accuracy of logits (the calibration functions and the monitor's summary, ``SplitCurves``, the
reproduction runner, the language model's token metric, ``ClassifierModule``) is shown to use
the one home and to give its values.
"""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchmetrics.aggregation import MeanMetric

from lightning_losses import LossMixin
from lightning_losses.calibration import accuracy, negative_log_likelihood
from lightning_losses.calibration import functional as CF
from lightning_losses.calibration.functional import confidence_and_correct
from lightning_losses.calibration.metrics import CalibrationSummary
from lightning_losses.callbacks import CalibrationMonitor, curves
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.functional import evaluation as FE
from lightning_losses.functional.linear import linear_prediction_statistics
from lightning_losses.lightning import classifier
from lightning_losses.lightning.classifier import ClassifierModule
from lightning_losses.lightning.evaluation import MeanOfTerms
from lightning_losses.lm.model import TokenCalibration
from lightning_losses.reproduce import runner

# ----------------------------------------------------------------------------------------------
# Inputs and float64 references
# ----------------------------------------------------------------------------------------------


def inputs(task: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 logits and targets of ``task``; multiclass rows 0-2 hold ties of the maximum."""
    g = torch.Generator().manual_seed(seed)
    if task == "multiclass":
        logits = 3 * torch.randn(64, 7, generator=g)
        logits[0, :] = 1.0  # every class ties: argmax is column 0
        logits[1, 2] = logits[1, 5] = logits[1].max() + 1  # columns 2 and 5 tie
        logits[2, 3] = logits[2, 4] = logits[2].max() + 1
        target = torch.randint(0, 7, (64,), generator=g)
        target[:3] = torch.tensor([3, 5, 4])  # a tied column that argmax does not pick
        return logits, target
    if task == "nm":
        return 3 * torch.randn(32, 4, 5, generator=g), torch.randint(0, 5, (32, 4), generator=g)
    shape = (64,) if task == "binary" else (32, 6)
    logits = 3 * torch.randn(shape, generator=g)
    target = torch.randint(0, 2, shape, generator=g).float()
    target.view(-1)[:4] = torch.tensor([0.3, 0.7, 0.5, 0.9])  # soft labels
    return logits, target


def reference_terms(logits: torch.Tensor, target: torch.Tensor, task: str):
    """Per-term NLL and hits in float64 numpy, written out from the definitions."""
    x, t = logits.double().numpy(), target.numpy()
    if task in ("multiclass", "nm"):
        x = x.reshape(-1, x.shape[-1])
        t = t.reshape(-1).astype(int)
        top = x.max(axis=1)
        log_sum_exp = top + np.log(np.exp(x - top[:, None]).sum(axis=1))
        nll = log_sum_exp - x[np.arange(len(t)), t]
        hits = np.argmax(x, axis=1) == t  # numpy: the first maximum
        return nll, hits.reshape(target.shape)
    y = t.astype(np.float64)
    # -(y log s + (1 - y) log(1 - s)), s = sigmoid(x), as max(x, 0) - x y + log(1 + e^-|x|)
    nll = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))
    return nll, (x > 0) == (y > 0.5)


TASKS = ("multiclass", "nm", "binary", "multilabel")


# ----------------------------------------------------------------------------------------------
# The home
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_the_home_gives_the_float64_formulas(task):
    logits, target = inputs(task)
    nll, hits = reference_terms(logits, target, task)
    exact = FE.nll_terms(logits, target, task, dtype=torch.float64)
    assert exact.dtype == torch.float64
    np.testing.assert_allclose(exact.reshape(-1).numpy(), nll.reshape(-1), rtol=1e-12, atol=0)
    single = FE.nll_terms(logits, target, task)  # float32: what ClassifierModule logs
    assert single.dtype == torch.float32
    np.testing.assert_allclose(single.reshape(-1).numpy(), nll.reshape(-1), rtol=2e-6, atol=1e-6)
    found = FE.correct_terms(logits, target, task)
    assert found.dtype == torch.bool
    np.testing.assert_array_equal(found.numpy(), hits)
    assert float(FE.task_nll(logits, target, task)) == pytest.approx(nll.mean(), rel=1e-6)
    assert float(FE.task_accuracy(logits, target, task)) == pytest.approx(hits.mean(), abs=1e-7)


def test_the_ties_rows_pick_the_first_maximum():
    logits, target = inputs("multiclass")
    assert FE.correct_terms(logits[:3], target[:3], "multiclass").tolist() == [False] * 3
    assert (
        FE.correct_terms(logits[:3], torch.tensor([0, 2, 3]), "multiclass").tolist() == [True] * 3
    )


def test_float32_terms_are_torch_s_cross_entropy_to_the_bit():
    """ClassifierModule's logged terms did not change: torch's losses, ``ignore_index`` -100."""
    logits, target = inputs("multiclass")
    target[5] = -100  # torch's default ignore_index: a 0 term, as F.cross_entropy gives
    expected = F.cross_entropy(logits, target, reduction="none")
    assert torch.equal(FE.nll_terms(logits, target, "multiclass"), expected)
    assert float(FE.nll_terms(logits, target, "multiclass")[5]) == 0.0
    nm_logits, nm_target = inputs("nm")
    expected = F.cross_entropy(nm_logits.flatten(0, 1), nm_target.flatten(), reduction="none")
    assert torch.equal(FE.nll_terms(nm_logits, nm_target, "nm"), expected)
    for task in ("binary", "multilabel"):
        x, y = inputs(task)
        expected = F.binary_cross_entropy_with_logits(x, y, reduction="none")
        assert torch.equal(FE.nll_terms(x, y, task), expected)


def test_log_softmax_nll_gives_the_log_probabilities_of_its_terms():
    logits, target = inputs("multiclass")
    log_probs, nll = FE.log_softmax_nll(logits, target, dtype=torch.float64)
    assert torch.equal(nll, -log_probs.gather(1, target[:, None])[:, 0])
    np.testing.assert_allclose(log_probs.exp().sum(dim=1).numpy(), 1.0, rtol=1e-12)


def test_an_unknown_task_is_named():
    logits, target = inputs("multiclass")
    with pytest.raises(ValueError, match="task must be one of 'multiclass', 'binary', "):
        FE.nll_terms(logits, target, "multi-class")
    with pytest.raises(ValueError, match="got 'ranking'"):
        FE.correct_terms(logits, target, "ranking")


# ----------------------------------------------------------------------------------------------
# Every caller uses the home and gives its values
# ----------------------------------------------------------------------------------------------


def test_the_callers_import_the_home():
    assert classifier.nll_terms is FE.nll_terms
    assert classifier.correct_terms is FE.correct_terms
    assert curves.nll_terms is FE.nll_terms
    assert curves.correct_terms is FE.correct_terms
    assert runner.task_nll is FE.task_nll
    assert CF.FE is FE


@pytest.mark.parametrize("task", ["multiclass", "binary", "multilabel"])
def test_calibration_nll_and_accuracy_of_logits_are_the_home_s(task):
    logits, target = inputs(task)
    if task != "multiclass":
        target = target.round()  # the calibration functions check for hard labels
    options = {"input_format": "logits", "task": task}
    terms = FE.nll_terms(logits, target, task, dtype=torch.float64).reshape(-1)
    hits = FE.correct_terms(logits, target, task).reshape(-1).double()
    assert torch.equal(negative_log_likelihood(logits, target, **options), terms.sum() / len(terms))
    assert torch.equal(accuracy(logits, target, **options), hits.sum() / len(hits))
    # The monitor's one pass per batch: its NLL and accuracy are the same terms.
    summary = CalibrationSummary(**options)
    summary.update(logits, target)
    values = summary.compute()
    assert float(values["nll"]) == pytest.approx(float(terms.mean()), rel=1e-14)
    assert float(values["accuracy"]) == float(hits.mean())


def test_the_top_label_walk_hits_are_the_home_s_also_on_ties():
    logits, target = inputs("multiclass")
    for preds, input_format in ((logits, "logits"), (torch.softmax(logits, dim=1), "probs")):
        _, correct = confidence_and_correct(preds, target, input_format=input_format)
        expected = FE.correct_terms(logits, target, "multiclass").double()
        assert torch.equal(correct, expected), input_format


@pytest.mark.parametrize("task", ["multiclass", "binary"])
def test_split_curves_terms_are_the_home_s(task):
    logits, target = inputs(task)
    if task == "binary":
        target = target.round()
    nll, hit, _, _ = curves.curve_terms(logits, target)
    assert torch.equal(nll, FE.nll_terms(logits.double(), target, task, dtype=torch.float64))
    assert torch.equal(hit, FE.correct_terms(logits, target, task).double())


def test_the_runner_s_nll_and_accuracy_are_the_home_s():
    logits, target = inputs("multiclass")
    reference_nll, reference_hits = reference_terms(logits, target, "multiclass")
    found = runner.multiclass_metrics(logits, target)
    assert found["acc"] == float(FE.task_accuracy(logits, target, "multiclass"))
    assert found["nll"] == pytest.approx(reference_nll.mean(), rel=1e-12)
    assert found["acc"] == pytest.approx(reference_hits.mean(), abs=1e-7)
    x, y = inputs("binary")
    y = y.round().long()
    found = runner.binary_metrics(x, y)
    nll, hits = reference_terms(x, y, "binary")
    assert found["nll"] == float(FE.task_nll(x, y, "binary"))
    assert found["nll"] == pytest.approx(nll.mean(), rel=1e-6)
    assert found["acc"] == hits.mean()
    x, y = inputs("nm")
    nll, hits = reference_terms(x, y, "nm")
    found = runner.nm_metrics(x, y)
    assert found == {
        "acc": float(FE.task_accuracy(x, y, "nm")),
        "nll": float(FE.task_nll(x, y, "nm")),
    }
    assert found["nll"] == pytest.approx(nll.mean(), rel=1e-6)
    assert found["acc"] == pytest.approx(hits.mean(), abs=1e-7)


def test_the_token_metric_is_the_home_s_nll_and_accuracy_chunk_by_chunk():
    g = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(40, 8, generator=g), torch.randn(30, 8, generator=g)
    bias, target = torch.randn(30, generator=g), torch.randint(0, 30, (40,), generator=g)
    target[::7] = -100  # padding: left out of both
    metric = TokenCalibration(n_bins=5)
    metric.update(*linear_prediction_statistics(hidden, weight, target, bias=bias, chunk_size=8))
    values = metric.compute()
    keep = target != -100
    logits = (hidden @ weight.T + bias)[keep]
    nll = FE.nll_terms(logits, target[keep], "multiclass", dtype=torch.float64)
    hits = FE.correct_terms(logits, target[keep], "multiclass").double()
    assert float(values["nll"]) == pytest.approx(float(nll.mean()), rel=1e-6)
    assert float(values["acc"]) == float(hits.mean())


# ----------------------------------------------------------------------------------------------
# The logged values: ClassifierModule (float32 terms) and the monitor (float64 terms)
# ----------------------------------------------------------------------------------------------


class PlainModule(LossMixin, L.LightningModule):
    """A plain module that logs no NLL or accuracy: the monitor logs them."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 10)
        self.set_criterion("ce")

    def forward(self, x):
        return self.layer(x)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return self.validation_output(self(x), y)


def validate(tmp_path, model) -> dict[str, float]:
    """One validation over the whole digits split in one batch of 359, with the monitor."""
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[CalibrationMonitor(final_diagram=False)],
    )
    trainer.validate(model, DigitsDataModule(batch_size=359), verbose=False)
    return {name: float(value) for name, value in trainer.callback_metrics.items()}


def validation_split(model) -> tuple[torch.Tensor, torch.Tensor]:
    features, target = DigitsDataModule().dataset("val").tensors
    model.eval()
    with torch.no_grad():
        return model(features), target


def test_the_module_and_the_monitor_log_the_home_s_values(tmp_path):
    torch.manual_seed(0)
    module = ClassifierModule("focal", hidden=[16])
    logged = validate(tmp_path / "module", module)
    logits, target = validation_split(module)
    nll, hits = reference_terms(logits, target, "multiclass")
    # The module's float32 terms, summed in float64 (the same batch: the same logits).
    own = FE.nll_terms(logits, target, "multiclass").sum(dtype=torch.float64) / len(target)
    assert logged["val/nll"] == pytest.approx(float(own), rel=1e-7)
    assert logged["val/nll"] == pytest.approx(nll.mean(), rel=1e-6)
    assert logged["val/acc"] == pytest.approx(hits.mean(), abs=1e-7)
    assert "val/accuracy" not in logged  # the monitor leaves the quantity to the module
    assert "val/brier" in logged

    plain = PlainModule()
    logged = validate(tmp_path / "plain", plain)
    logits, target = validation_split(plain)
    nll, hits = reference_terms(logits, target, "multiclass")
    home = FE.nll_terms(logits, target, "multiclass", dtype=torch.float64).mean()
    assert logged["val/nll"] == pytest.approx(float(home), rel=1e-7)  # logged as float32
    assert logged["val/nll"] == pytest.approx(nll.mean(), rel=1e-7)
    assert logged["val/accuracy"] == pytest.approx(hits.mean(), abs=1e-7)


# ----------------------------------------------------------------------------------------------
# MeanOfTerms: torchmetrics' float64 MeanMetric's values, with a cheaper per-step path
# ----------------------------------------------------------------------------------------------


def test_mean_of_terms_gives_torchmetrics_float64_mean_metric_values():
    """The same sums; ``nan_strategy="disable"`` would drop the weights (torchmetrics 1.9)."""
    g = torch.Generator().manual_seed(1)
    ours, reference = MeanOfTerms(), MeanMetric().set_dtype(torch.float64)
    for size in (5, 1, 17):
        terms = torch.rand(size, generator=g)
        batch = ours(terms)  # forward: this batch's mean, as Lightning logs it per step
        assert torch.equal(batch, reference(terms))
        loss = torch.rand((), generator=g)
        ours.update(loss, weight=size)  # a batch mean over `size` samples
        reference.update(loss, weight=size)
    assert ours.compute().dtype == torch.float64
    assert float(ours.compute()) == pytest.approx(float(reference.compute()), rel=1e-15)
