"""``ignore_index`` of the calibration functions, metrics and CalibrationMonitor.

Every result with ``ignore_index`` must equal the same computation on the inputs masked by
hand (``preds[target != ignore_index]``); multi-label masks single (sample, label) entries, whose
pooled decisions are then a binary problem, and the classwise error of a multi-label input is the
mean over labels of each label's binary error on its own kept samples. The token-level case is
also checked against a top-label ECE written plainly in float64.
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.calibration import (
    Accuracy,
    AdaptiveCalibrationError,
    BrierScore,
    CalibrationError,
    CalibrationSummary,
    ClasswiseCalibrationError,
    MeanConfidence,
    NegativeLogLikelihood,
    accuracy,
    adaptive_calibration_error,
    brier_score,
    calibration_error,
    classwise_binned_statistics,
    classwise_calibration_error,
    confidence_and_correct,
    mean_confidence,
    negative_log_likelihood,
)
from lightning_losses.callbacks import CalibrationMonitor

IGNORE = -100
TASKS = ("multiclass", "binary", "multilabel")
FORMATS = ("probs", "logits")


def make(task: str, input_format: str, n: int = 90, classes: int = 4, seed: int = 0):
    """Inputs with about a quarter of the targets set to IGNORE (and garbage preds there)."""
    gen = torch.Generator().manual_seed(seed)
    shape = {"multiclass": (n, classes), "binary": (n,), "multilabel": (n, classes)}[task]
    logits = torch.randn(shape, generator=gen) * 3
    if task == "multiclass":
        target = torch.randint(0, classes, (n,), generator=gen)
        probs = logits.softmax(dim=-1)
    else:
        target = torch.randint(0, 2, shape, generator=gen)
        probs = logits.sigmoid()
    ignored = torch.rand(target.shape, generator=gen) < 0.25
    target = torch.where(ignored, torch.full_like(target, IGNORE), target)
    preds = (probs if input_format == "probs" else logits).clone()
    # Ignored entries may hold anything: they are neither used nor checked.
    if task == "multiclass":
        preds[ignored] = 5.0 if input_format == "probs" else float("nan")
    else:
        preds[ignored] = -7.0 if input_format == "probs" else float("inf")
    return preds, target


def masked(preds, target):
    keep = target != IGNORE
    return preds[keep], target[keep]


SCALAR_FUNCTIONS = {
    "ece": lambda p, t, **kw: calibration_error(p, t, n_bins=10, **kw),
    "mce": lambda p, t, **kw: calibration_error(p, t, n_bins=10, norm="max", **kw),
    "rmsce": lambda p, t, **kw: calibration_error(p, t, n_bins=10, norm="l2", **kw),
    "mean": lambda p, t, **kw: calibration_error(p, t, n_bins=10, norm="mean", **kw),
    "adaptive": lambda p, t, **kw: adaptive_calibration_error(p, t, n_bins=7, **kw),
    "brier": brier_score,
    "nll": negative_log_likelihood,
    "accuracy": accuracy,
    "confidence": mean_confidence,
}


def close(actual, expected):
    actual, expected = float(actual), float(expected)
    if math.isnan(expected):
        return math.isnan(actual)
    return abs(actual - expected) <= 1e-12


# ----------------------------------------------------------------------------------------------
# functions
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("input_format", FORMATS)
def test_functions_equal_the_function_on_masked_inputs(task, input_format):
    preds, target = make(task, input_format)
    kept_preds, kept_target = masked(preds, target)
    for name, function in SCALAR_FUNCTIONS.items():
        got = function(preds, target, input_format=input_format, ignore_index=IGNORE)
        want = function(kept_preds, kept_target, input_format=input_format)
        assert close(got, want), (name, float(got), float(want))
        assert not math.isnan(float(got)), name
    confidence, correct = confidence_and_correct(
        preds, target, input_format=input_format, ignore_index=IGNORE
    )
    want_confidence, want_correct = confidence_and_correct(
        kept_preds, kept_target, input_format=input_format
    )
    assert torch.equal(confidence, want_confidence)
    assert torch.equal(correct, want_correct)
    assert confidence.numel() == int((target != IGNORE).sum())  # ignored entries not in N


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("input_format", FORMATS)
def test_classwise_error_equals_per_class_errors_on_masked_inputs(task, input_format):
    preds, target = make(task, input_format)
    got = classwise_calibration_error(
        preds, target, n_bins=6, input_format=input_format, ignore_index=IGNORE
    )
    if task == "multilabel":  # each label on its own kept samples, as a binary problem
        per_label = []
        for k in range(preds.shape[1]):
            keep = target[:, k] != IGNORE
            per_label.append(
                calibration_error(
                    preds[keep, k], target[keep, k], n_bins=6, input_format=input_format
                )
            )
        want = torch.stack(per_label).mean()
    else:
        want = classwise_calibration_error(
            *masked(preds, target), n_bins=6, input_format=input_format
        )
    assert close(got, want), (float(got), float(want))


def test_classwise_binned_statistics_drops_single_entries():
    gen = torch.Generator().manual_seed(1)
    probs = torch.rand(30, 3, generator=gen)
    labels = torch.randint(0, 2, (30, 3), generator=gen)
    labels[::4, 1] = IGNORE
    labels[::5, 2] = IGNORE
    got = classwise_binned_statistics(probs, labels, 5, ignore_index=IGNORE)
    for k in range(3):
        keep = labels[:, k] != IGNORE
        one = classwise_binned_statistics(probs[keep, k : k + 1], labels[keep, k : k + 1], 5)
        for a, b in zip(got, one, strict=True):
            assert torch.equal(a[k], b[0])
    assert float(got[0].sum()) == float((labels != IGNORE).sum())


def test_token_level_ece_of_padded_sequences_matches_a_plain_formula():
    """[B, L, C] logits with padded [B, L] targets, flattened as the module doc says."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 11, 6, generator=gen, dtype=torch.float64) * 2
    target = torch.randint(0, 6, (3, 11), generator=gen)
    target[0, 8:] = IGNORE
    target[2, 5:] = IGNORE
    got = calibration_error(
        logits.flatten(0, -2),
        target.flatten(),
        n_bins=5,
        input_format="logits",
        ignore_index=IGNORE,
    )
    # Plain float64: top-label confidence of the real tokens, bins (k/5, (k+1)/5].
    rows = [(b, i) for b in range(3) for i in range(11) if int(target[b, i]) != IGNORE]
    total = 0.0
    for k in range(5):
        conf_sum = correct_sum = 0.0
        for b, i in rows:
            p = torch.softmax(logits[b, i].double(), dim=0)
            c = float(p.max())
            if k / 5 < c <= (k + 1) / 5:
                conf_sum += c
                correct_sum += float(int(p.argmax()) == int(target[b, i]))
        total += abs(conf_sum - correct_sum)
    assert float(got) == pytest.approx(total / len(rows), abs=1e-12)


def test_float_hard_labels_with_ignore_index_equal_integer_labels():
    for task in ("binary", "multilabel"):
        preds, target = make(task, "probs")
        as_float = target.to(torch.float32)
        for name, function in SCALAR_FUNCTIONS.items():
            got = function(preds, as_float, ignore_index=IGNORE)
            want = function(preds, target, ignore_index=IGNORE)
            assert close(got, want), (task, name)


def test_validation_sees_only_kept_entries():
    preds, target = make("multiclass", "probs")  # ignored rows hold 5.0: not probabilities
    with pytest.raises(ValueError, match="target values"):
        calibration_error(preds.softmax(dim=1), target)  # -100 without ignore_index
    with pytest.raises(ValueError, match="probabilities"):
        calibration_error(preds, target.clamp(min=0))
    calibration_error(preds, target, ignore_index=IGNORE)  # no error
    target[0] = 7  # a kept target out of range is still an error
    with pytest.raises(ValueError, match="target values"):
        calibration_error(preds, target, ignore_index=IGNORE)


EMPTY = {
    "multiclass": (torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)),
    "binary": (torch.zeros(0), torch.zeros(0, dtype=torch.long)),
    "multilabel": (torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.long)),
}


@pytest.mark.parametrize("task", TASKS)
def test_everything_ignored_gives_what_an_empty_input_gives(task):
    preds, target = make(task, "probs")
    target = torch.full_like(target, IGNORE)
    functions = {
        **SCALAR_FUNCTIONS,
        "classwise": lambda p, t, **kw: classwise_calibration_error(p, t, **kw),
    }
    for name, function in functions.items():
        got = function(preds, target, ignore_index=IGNORE)
        want = function(*EMPTY[task])
        assert math.isnan(float(want)), name  # what the functions give for no sample
        assert math.isnan(float(got)), name
    confidence, correct = confidence_and_correct(preds, target, ignore_index=IGNORE)
    assert confidence.numel() == correct.numel() == 0


# ----------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------


def metric_cases(task: str):
    classes = 2 if task == "binary" else 4
    return {
        "ece": (lambda **kw: CalibrationError(n_bins=10, **kw), SCALAR_FUNCTIONS["ece"]),
        "mce": (
            lambda **kw: CalibrationError(n_bins=10, norm="max", **kw),
            SCALAR_FUNCTIONS["mce"],
        ),
        "adaptive": (
            lambda **kw: AdaptiveCalibrationError(n_bins=7, **kw),
            SCALAR_FUNCTIONS["adaptive"],
        ),
        "classwise": (
            lambda **kw: ClasswiseCalibrationError(num_classes=classes, n_bins=6, **kw),
            lambda p, t, **kw: classwise_calibration_error(p, t, n_bins=6, **kw),
        ),
        "brier": (BrierScore, brier_score),
        "nll": (NegativeLogLikelihood, negative_log_likelihood),
        "accuracy": (Accuracy, accuracy),
        "confidence": (MeanConfidence, mean_confidence),
    }


BATCHINGS = ([90], [30, 30, 30], [7, 41, 1, 41])


def batches(preds, target, sizes):
    start = 0
    for size in sizes:
        yield preds[start : start + size], target[start : start + size]
        start += size


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("input_format", FORMATS)
def test_metrics_equal_the_functions_with_ignore_index_in_any_batching(task, input_format):
    preds, target = make(task, input_format)
    target[30:60] = IGNORE  # the middle batch of [30, 30, 30] is all padding
    for name, (build, function) in metric_cases(task).items():
        want = function(preds, target, input_format=input_format, ignore_index=IGNORE)
        for sizes in BATCHINGS:
            metric = build(input_format=input_format, ignore_index=IGNORE)
            assert metric.ignore_index == IGNORE
            for batch in batches(preds, target, sizes):
                metric.update(*batch)
            got = metric.compute()
            assert float(got) == pytest.approx(float(want), abs=1e-12), (name, sizes)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("input_format", FORMATS)
def test_calibration_summary_equals_the_functions_with_ignore_index(task, input_format):
    preds, target = make(task, input_format)
    functions = {
        "ece": lambda p, t, **kw: calibration_error(p, t, n_bins=10, **kw),
        "mce": lambda p, t, **kw: calibration_error(p, t, n_bins=10, norm="max", **kw),
        "rmsce": lambda p, t, **kw: calibration_error(p, t, n_bins=10, norm="l2", **kw),
        "brier": brier_score,
        "nll": negative_log_likelihood,
        "accuracy": accuracy,
        "confidence": mean_confidence,
    }
    kept = masked(preds, target)
    for sizes in BATCHINGS:
        summary = CalibrationSummary(n_bins=10, input_format=input_format, ignore_index=IGNORE)
        for batch in batches(preds, target, sizes):
            summary.update(*batch)
        values = summary.compute()
        for name, function in functions.items():
            want = function(*kept, input_format=input_format)
            assert float(values[name]) == pytest.approx(float(want), abs=1e-12), (name, sizes)
        assert float(summary.bins()[0].sum()) == float((target != IGNORE).sum())


def test_metrics_that_saw_only_ignored_samples_compute_nan():
    preds, target = make("multiclass", "probs")
    target = torch.full_like(target, IGNORE)
    for build, _ in metric_cases("multiclass").values():
        metric = build(ignore_index=IGNORE)
        metric.update(preds, target)
        assert math.isnan(float(metric.compute()))
    summary = CalibrationSummary(ignore_index=IGNORE)
    summary.update(preds, target)
    assert all(math.isnan(float(v)) for v in summary.compute().values())


# ----------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.5, "-100", True, torch.tensor(-100)])
def test_ignore_index_must_be_an_int(bad):
    preds, target = make("multiclass", "probs")
    for function in (*SCALAR_FUNCTIONS.values(), classwise_calibration_error):
        with pytest.raises(TypeError, match="ignore_index"):
            function(preds, target, ignore_index=bad)
    with pytest.raises(TypeError, match="ignore_index"):
        confidence_and_correct(preds, target, ignore_index=bad)
    with pytest.raises(TypeError, match="ignore_index"):
        classwise_binned_statistics(preds, F.one_hot(target.clamp(min=0), 4), ignore_index=bad)
    ml_preds, ml_target = make("multilabel", "probs")
    with pytest.raises(TypeError, match="ignore_index"):
        classwise_calibration_error(ml_preds, ml_target, ignore_index=bad)
    for build, _ in metric_cases("multiclass").values():
        with pytest.raises(TypeError, match="ignore_index"):
            build(ignore_index=bad)
    with pytest.raises(TypeError, match="ignore_index"):
        CalibrationSummary(ignore_index=bad)
    with pytest.raises(TypeError, match="ignore_index"):
        CalibrationMonitor(ignore_index=bad)


@pytest.mark.parametrize("task", ["binary", "multilabel"])
def test_soft_targets_with_ignore_index_are_an_error(task):
    preds, target = make(task, "probs")
    soft = target.to(torch.float32)
    soft[soft == 1] = 0.7  # frequencies, not labels
    for validate_args in (True, False):
        for function in (*SCALAR_FUNCTIONS.values(), classwise_calibration_error):
            with pytest.raises(ValueError, match="ignore_index"):
                function(preds, soft, ignore_index=IGNORE, validate_args=validate_args)
        metric = CalibrationSummary(ignore_index=IGNORE, validate_args=validate_args)
        with pytest.raises(ValueError, match="ignore_index"):
            metric.update(preds, soft)
    with pytest.raises(ValueError, match="ignore_index"):
        classwise_binned_statistics(preds.reshape(-1, 1), soft.reshape(-1, 1), ignore_index=-1)


# ----------------------------------------------------------------------------------------------
# CalibrationMonitor in a plain LightningModule
# ----------------------------------------------------------------------------------------------

VOCAB, LENGTH, FEATURES = 5, 6, 8


class PaddedTokens(pl.LightningModule):
    """Inherits nothing of lightning_losses: [B, L, V] logits, [B, L] targets padded by -100."""

    def __init__(self, criterion: nn.Module | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(FEATURES, VOCAB)
        if criterion is not None:
            self.criterion = criterion

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) * 3

    def validation_step(self, batch, batch_idx):
        x, target = batch
        return {"logits": self(x), "target": target}


def padded_data(batches_of: int = 8, count: int = 5):
    gen = torch.Generator().manual_seed(3)
    n = batches_of * count
    x = torch.randn(n, LENGTH, FEATURES, generator=gen)
    target = torch.randint(0, VOCAB, (n, LENGTH), generator=gen)
    lengths = torch.randint(1, LENGTH + 1, (n,), generator=gen)
    target[torch.arange(LENGTH)[None, :] >= lengths[:, None]] = IGNORE
    return x, target


def validate(module, monitor, x, target):
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[monitor],
    )
    loader = DataLoader(TensorDataset(x, target), batch_size=8)
    trainer.validate(module, loader, verbose=False)
    return trainer


def test_monitor_logs_the_functions_of_the_kept_tokens(tmp_path):
    torch.manual_seed(0)
    module = PaddedTokens()
    x, target = padded_data()
    monitor = CalibrationMonitor(n_bins=10, adaptive=True, classwise=True, ignore_index=IGNORE)
    trainer = validate(module, monitor, x, target)
    with torch.no_grad():
        logits = module(x).flatten(0, -2)
    kept = masked(logits, target.flatten())
    options = {"input_format": "logits"}
    want = {
        "ece": calibration_error(*kept, n_bins=10, **options),
        "mce": calibration_error(*kept, n_bins=10, norm="max", **options),
        "rmsce": calibration_error(*kept, n_bins=10, norm="l2", **options),
        "brier": brier_score(*kept, **options),
        "nll": negative_log_likelihood(*kept, **options),
        "accuracy": accuracy(*kept, **options),
        "confidence": mean_confidence(*kept, **options),
        "adaptive_ece": adaptive_calibration_error(*kept, n_bins=10, **options),
        "classwise_ece": classwise_calibration_error(*kept, n_bins=10, **options),
    }
    logged = trainer.callback_metrics
    assert sorted(logged) == sorted(f"val/{name}" for name in want)
    for name, value in want.items():
        # logged as float32
        assert float(logged[f"val/{name}"]) == pytest.approx(float(value), abs=1e-6), name
    # nll is the token-level cross-entropy over the real tokens
    token_nll = F.cross_entropy(logits.double(), target.flatten(), ignore_index=IGNORE)
    assert float(logged["val/nll"]) == pytest.approx(float(token_nll), abs=1e-6)


def test_monitor_without_ignore_index_names_it_on_the_first_batch(tmp_path):
    x, target = padded_data(count=1)
    with pytest.raises(ValueError, match=r"ignore_index=<that value>"):
        validate(PaddedTokens(), CalibrationMonitor(), x, target)
    # A module whose criterion ignores -100: the message names that value.
    module = PaddedTokens(criterion=nn.CrossEntropyLoss(ignore_index=IGNORE))
    with pytest.raises(ValueError, match=r"CalibrationMonitor\(ignore_index=-100\)"):
        validate(module, CalibrationMonitor(), x, target)
    target[0, 0] = 9  # out of range and not the ignored value
    with pytest.raises(ValueError, match="ignore_index=-100"):
        validate(PaddedTokens(), CalibrationMonitor(ignore_index=IGNORE), x, target)


def test_monitor_probs_check_skips_ignored_rows(tmp_path):
    class PaddedProbs(PaddedTokens):
        def __init__(self, spoil_a_kept_row: bool) -> None:
            super().__init__()
            self.spoil_a_kept_row = spoil_a_kept_row

        def validation_step(self, batch, batch_idx):
            x, target = batch
            probs = self(x).softmax(dim=-1)
            probs[target == IGNORE] = 0.0  # padding rows are no distributions
            if self.spoil_a_kept_row:
                probs[0, 0] = 0.0  # position 0 is never padding
            return {"logits": probs, "target": target}

    x, target = padded_data(count=1)
    monitor = CalibrationMonitor(input_format="probs", ignore_index=IGNORE)
    trainer = validate(PaddedProbs(spoil_a_kept_row=False), monitor, x, target)
    assert "val/ece" in trainer.callback_metrics
    monitor = CalibrationMonitor(input_format="probs", ignore_index=IGNORE)
    with pytest.raises(ValueError, match="sum to 1"):
        validate(PaddedProbs(spoil_a_kept_row=True), monitor, x, target)


# ----------------------------------------------------------------------------------------------
# the netcal bridge
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["multiclass", "binary"])
@pytest.mark.parametrize("input_format", FORMATS)
def test_netcal_bridge_drops_ignored_samples(task, input_format, tmp_path):
    from lightning_losses.calibration.netcal_bridge import (
        netcal_metrics,
        netcal_reliability_diagram,
        to_netcal,
    )

    preds, target = make(task, input_format, n=200, classes=5)
    kept = target != IGNORE
    options = {"n_bins": 10, "input_format": input_format}
    got = netcal_metrics(preds, target, ignore_index=IGNORE, **options)
    assert got == netcal_metrics(preds[kept], target[kept], **options)
    probs, labels = to_netcal(preds, target, input_format=input_format, ignore_index=IGNORE)
    assert labels.tolist() == target[kept].tolist()
    assert probs.shape[0] == int(kept.sum())
    if task == "multiclass":  # and netcal's ECE is ours on the kept samples
        ours = calibration_error(preds, target, ignore_index=IGNORE, **options)
        # from float32 logits our log-sum-exp is float32, netcal's softmax float64
        tolerance = 1e-9 if input_format == "probs" else 1e-6
        assert got["ece"] == pytest.approx(ours.item(), abs=tolerance)
    netcal_reliability_diagram(
        preds, target, path=tmp_path / "n.png", ignore_index=IGNORE, **options
    )
    assert (tmp_path / "n.png").stat().st_size > 1000
    with pytest.raises(TypeError, match="ignore_index"):
        to_netcal(preds, target, input_format=input_format, ignore_index=1.5)
