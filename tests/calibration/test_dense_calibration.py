"""Dense ``[N, C, *]`` inputs: every calibration function and Metric matches flat pixels.

They give the values of the same pixels flattened by hand, ignored pixels dropped, over any
batching and over 2 gloo processes with uneven shares.

The reference for a dense ``[N, C, H, W]`` batch is the same function (or Metric) on
``preds.movedim(1, -1).reshape(-1, C)`` and ``target.reshape(-1)`` with the rows whose target
is ``ignore_index`` removed, as a user would have to write it without dense support. The one
2-process run (``torch.multiprocessing.spawn``, gloo on 127.0.0.1, 5 and 2 images in batches
of different sizes) covers every Metric, the new ``BrierDecomposition`` and ``AURC`` included.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.ddp import spawn_gloo

from lightning_losses.calibration import (
    AURC,
    Accuracy,
    AdaptiveCalibrationError,
    BrierDecomposition,
    BrierScore,
    CalibrationError,
    CalibrationSummary,
    ClasswiseCalibrationError,
    MeanConfidence,
    NegativeLogLikelihood,
    SmoothCalibrationError,
    accuracy,
    adaptive_calibration_error,
    aurc,
    brier_decomposition,
    brier_score,
    calibration_error,
    classwise_calibration_error,
    confidence_and_correct,
    mean_confidence,
    negative_log_likelihood,
    smooth_calibration_error,
)

IGNORE = -100
CLASSES = 5
SHARES = (5, 2)  # images per process in the DDP run
BATCHES = (2, 2)


def _images(n: int = 7, height: int = 6, width: int = 4, seed: int = 0):
    """float64 logits [n, C, H, W] and masks [n, H, W] with about 15% ignored pixels."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, CLASSES, height, width, generator=generator, dtype=torch.float64) * 3
    probs = (logits / 3).softmax(1).movedim(1, -1).reshape(-1, CLASSES)
    target = torch.multinomial(probs, 1, generator=generator).reshape(n, height, width)
    ignored = torch.rand(n, height, width, generator=generator) < 0.15
    return logits, target.masked_fill(ignored, IGNORE)


def _by_hand(preds: torch.Tensor, target: torch.Tensor):
    """The pixels as rows, ignored ones dropped: what a user would write."""
    rows = preds.movedim(1, -1).reshape(-1, preds.shape[1])
    labels = target.reshape(-1)
    kept = labels != IGNORE
    return rows[kept], labels[kept]


def _values(result) -> torch.Tensor:
    if isinstance(result, dict):
        return torch.stack([result[name] for name in sorted(result)])
    if isinstance(result, tuple):
        return torch.stack([torch.as_tensor(value).to(torch.float64) for value in result])
    return result.reshape(-1).to(torch.float64)


FUNCTIONS = {
    "ece": lambda p, t, **kw: calibration_error(p, t, **kw),
    "mce": lambda p, t, **kw: calibration_error(p, t, norm="max", **kw),
    "rmsce": lambda p, t, **kw: calibration_error(p, t, norm="l2", **kw),
    "ace": lambda p, t, **kw: calibration_error(p, t, norm="mean", n_bins=7, **kw),
    "adaptive": lambda p, t, **kw: adaptive_calibration_error(p, t, **kw),
    "classwise": lambda p, t, **kw: classwise_calibration_error(p, t, **kw),
    "brier": lambda p, t, **kw: brier_score(p, t, **kw),
    "nll": lambda p, t, **kw: negative_log_likelihood(p, t, **kw),
    "accuracy": lambda p, t, **kw: accuracy(p, t, **kw),
    "confidence": lambda p, t, **kw: mean_confidence(p, t, **kw),
    "smooth": lambda p, t, **kw: smooth_calibration_error(p, t, **kw),
    "brier_decomposition": lambda p, t, **kw: brier_decomposition(p, t, n_bins=10, **kw),
    "aurc": lambda p, t, **kw: aurc(p, t, **kw),
    "confidence_and_correct": lambda p, t, **kw: torch.cat(confidence_and_correct(p, t, **kw)),
}

METRICS = {
    "CalibrationError": lambda **kw: CalibrationError(**kw),
    "CalibrationError(max)": lambda **kw: CalibrationError(norm="max", **kw),
    "AdaptiveCalibrationError": lambda **kw: AdaptiveCalibrationError(**kw),
    "ClasswiseCalibrationError": lambda **kw: ClasswiseCalibrationError(CLASSES, **kw),
    "BrierScore": lambda **kw: BrierScore(**kw),
    "NegativeLogLikelihood": lambda **kw: NegativeLogLikelihood(**kw),
    "Accuracy": lambda **kw: Accuracy(**kw),
    "MeanConfidence": lambda **kw: MeanConfidence(**kw),
    "SmoothCalibrationError": lambda **kw: SmoothCalibrationError(**kw),
    "CalibrationSummary": lambda **kw: CalibrationSummary(smooth=True, **kw),
    "BrierDecomposition": lambda **kw: BrierDecomposition(CLASSES, **kw),
    "AURC": lambda **kw: AURC(**kw),
    "AURC(exact)": lambda **kw: AURC(exact=True, **kw),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("input_format", ["logits", "probs"])
def test_functions_take_dense_inputs(name, input_format):
    logits, target = _images()
    preds = logits if input_format == "logits" else logits.softmax(1)
    function = FUNCTIONS[name]
    options = {"input_format": input_format}
    expected = _values(function(*_by_hand(preds, target), **options))
    got = _values(function(preds, target, ignore_index=IGNORE, **options))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    # without ignore_index (no pixel ignored): the plain flattening
    full = target.clamp(min=0)
    rows = preds.movedim(1, -1).reshape(-1, CLASSES)
    expected = _values(function(rows, full.reshape(-1), **options))
    torch.testing.assert_close(
        _values(function(preds, full, **options)), expected, rtol=0, atol=1e-12
    )


def test_sequences_and_channels_last_tensors_are_dense_too():
    logits, target = _images()
    sequences, labels = logits.flatten(2), target.flatten(1)  # [N, C, L] and [N, L]
    expected = calibration_error(*_by_hand(logits, target), input_format="logits")
    got = calibration_error(sequences, labels, input_format="logits", ignore_index=IGNORE)
    assert abs(got.item() - expected.item()) < 1e-15
    channels_last = logits.contiguous(memory_format=torch.channels_last)
    got = calibration_error(channels_last, target, input_format="logits", ignore_index=IGNORE)
    assert abs(got.item() - expected.item()) < 1e-15


@pytest.mark.parametrize("name", sorted(METRICS))
def test_metrics_take_dense_batches_whatever_the_batching(name):
    logits, target = _images()
    options = {"input_format": "logits", "ignore_index": IGNORE}
    reference = METRICS[name](**options)
    reference.update(*_by_hand(logits, target))
    expected = _values(reference.compute())
    for sizes in [(7,), (1, 1, 5), (3, 4)]:
        metric = METRICS[name](**options)
        for images, labels in zip(logits.split(sizes), target.split(sizes), strict=True):
            metric.update(images, labels)
        torch.testing.assert_close(_values(metric.compute()), expected, rtol=0, atol=1e-12)
    # dense and hand-flattened batches mix in one metric
    mixed = METRICS[name](**options)
    mixed.update(logits[:3], target[:3])
    mixed.update(*_by_hand(logits[3:], target[3:]))
    torch.testing.assert_close(_values(mixed.compute()), expected, rtol=0, atol=1e-12)


def test_metric_values_are_the_functions_values_on_the_pixels():
    logits, target = _images()
    rows, labels = _by_hand(logits, target)
    options = {"input_format": "logits", "ignore_index": IGNORE}
    pairs = {
        "CalibrationError": "ece",
        "AdaptiveCalibrationError": "adaptive",
        "ClasswiseCalibrationError": "classwise",
        "BrierScore": "brier",
        "NegativeLogLikelihood": "nll",
        "Accuracy": "accuracy",
        "MeanConfidence": "confidence",
        "SmoothCalibrationError": "smooth",
        "AURC(exact)": "aurc",
    }
    for metric_name, function_name in pairs.items():
        metric = METRICS[metric_name](**options)
        metric.update(logits, target)
        expected = FUNCTIONS[function_name](rows, labels, input_format="logits")
        assert abs(metric.compute().item() - expected.item()) < 1e-12, metric_name
    decomposition = BrierDecomposition(CLASSES, n_bins=10, **options)
    decomposition.update(logits, target)
    expected = brier_decomposition(rows, labels, n_bins=10, input_format="logits")
    torch.testing.assert_close(
        _values(decomposition.compute()), _values(expected), rtol=0, atol=1e-12
    )


def test_state_does_not_grow_with_the_number_of_pixels():
    small, small_target = _images(n=1, height=2, width=2)
    large, large_target = _images(n=3, height=40, width=30)
    for name, factory in METRICS.items():
        if name in ("AdaptiveCalibrationError", "AURC(exact)"):  # documented O(N) states
            continue
        sizes = []
        for preds, target in [(small, small_target), (large, large_target)]:
            metric = factory(input_format="logits", ignore_index=IGNORE)
            metric.update(preds, target)
            sizes.append(sum(getattr(metric, state).numel() for state in metric._defaults))
        assert sizes[0] == sizes[1], name


def test_dense_shape_errors_name_the_shapes():
    logits, target = _images()
    with pytest.raises(ValueError, match=r"preds \[N, C, \*\] with target \[N, \*\]"):
        calibration_error(logits, target[:, :, :3])
    with pytest.raises(ValueError, match=r"class-last preds \[N, \*, C\]: pass preds.movedim"):
        calibration_error(logits.movedim(1, -1), target, input_format="logits")
    with pytest.raises(TypeError, match="class indices"):
        brier_score(logits.softmax(1), target.double())
    with pytest.raises(ValueError, match="num_classes=4"):
        CalibrationError(num_classes=4, input_format="logits").update(logits, target.clamp(0))
    with pytest.raises(ValueError, match=r"target values must lie in \[0, 4\]"):
        aurc(logits, target, input_format="logits")  # -100 not ignored


# --- two gloo processes -----------------------------------------------------------------------


def _worker(rank: int, out: str) -> None:
    logits, target = _images()
    start = sum(SHARES[:rank])
    mine = slice(start, start + SHARES[rank])
    results = {}
    for name, factory in METRICS.items():
        metric = factory(input_format="logits", ignore_index=IGNORE)
        for images, labels in zip(
            logits[mine].split(BATCHES[rank]), target[mine].split(BATCHES[rank]), strict=True
        ):
            metric.update(images, labels)
        results[name] = _values(metric.compute())
    torch.save(results, Path(out) / f"rank{rank}.pt")


@pytest.mark.slow
def test_two_gloo_processes_give_the_values_of_all_pixels(tmp_path):
    spawn_gloo(_worker, str(tmp_path), processes=len(SHARES))
    logits, target = _images()
    rows, labels = _by_hand(logits, target)
    for name, factory in METRICS.items():
        reference = factory(input_format="logits")
        reference.update(rows, labels)
        expected = _values(reference.compute())
        for rank in range(len(SHARES)):
            got = torch.load(tmp_path / f"rank{rank}.pt")[name]
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-12, msg=name)
    # and the references are the functions' values on the hand-flattened pixels
    results = torch.load(tmp_path / "rank1.pt")
    checks = {
        "CalibrationError": calibration_error(rows, labels, input_format="logits"),
        "ClasswiseCalibrationError": classwise_calibration_error(
            rows, labels, input_format="logits"
        ),
        "AURC(exact)": aurc(rows, labels, input_format="logits"),
        "SmoothCalibrationError": smooth_calibration_error(rows, labels, input_format="logits"),
    }
    for name, value in checks.items():
        assert abs(results[name].item() - value.item()) < 1e-12, name
    decomposition = brier_decomposition(rows, labels, input_format="logits")
    torch.testing.assert_close(
        results["BrierDecomposition"], _values(decomposition), rtol=0, atol=1e-12
    )
