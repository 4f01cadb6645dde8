"""Top-label correctness is ``argmax == target`` with ``torch.argmax``'s first-index ties.

The calibration functions find the row maximum with ``amax`` and the target's entry with a
gather (much faster than ``torch.max(dim=1)`` on the CPU); rows that hold their maximum more
than once fall back to ``argmax``. The reference here is ``preds.argmax(1) == target`` on
inputs quantised so that ties are everywhere, in every chunk of the CPU walk.
"""

from __future__ import annotations

import pytest
import torch

from lightning_losses.calibration import (
    CalibrationSummary,
    accuracy,
    calibration_error,
    confidence_and_correct,
)
from lightning_losses.calibration import functional as CF


def tied_probs(rows: int, classes: int, levels: int, seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, levels, (rows, classes), generator=gen).to(torch.float64) + 1
    probs = (counts / counts.sum(1, keepdim=True)).to(dtype)
    target = torch.randint(0, classes, (rows,), generator=gen)
    return probs, target


def test_unchecked_negative_entries_still_break_ties_like_argmax():
    probs = torch.tensor([[0.5, 0.5, -0.5], [-1.0, 0.3, 0.3], [0.2, -3.0, 0.9]])
    target = torch.tensor([1, 1, 2])
    _, correct = confidence_and_correct(probs, target, validate_args=False)
    assert correct.tolist() == (probs.argmax(1) == target).double().tolist() == [0.0, 1.0, 1.0]


@pytest.mark.parametrize("levels", [1, 2, 3])
@pytest.mark.parametrize("classes", [2, 7, 3000])  # 3000: chunks of 87 rows
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_correct_is_first_argmax_with_ties(levels, classes, dtype):
    probs, target = tied_probs(400, classes, levels, seed=classes + levels, dtype=dtype)
    want = probs.argmax(1) == target
    assert (probs == probs.amax(1, keepdim=True)).sum(1).gt(1).any()  # ties are there
    top = CF._multiclass_top_label(probs, target, "probs")
    assert torch.equal(top.correct, want)
    assert torch.equal(top.maxima, probs.amax(1))
    assert torch.equal(top.confidence, top.maxima)
    assert top.minimum == probs.amin()
    torch.testing.assert_close(top.sums, probs.sum(1, dtype=top.sums.dtype), rtol=0, atol=0)
    logits = probs.double().log()  # the same ties, as logits (uniform rows included)
    top = CF._multiclass_top_label(logits, target, "logits")
    assert torch.equal(top.correct, logits.argmax(1) == target)
    torch.testing.assert_close(top.confidence, logits.softmax(1).amax(1), rtol=1e-12, atol=0)
    _, hit = confidence_and_correct(probs, target, validate_args=False)
    assert torch.equal(hit, want.to(torch.float64))
    assert float(accuracy(probs, target, validate_args=False)) == pytest.approx(
        want.double().mean().item(), abs=1e-15
    )


def test_uniform_rows_are_correct_only_for_class_zero():
    probs = torch.full((5, 4), 0.25)
    target = torch.tensor([0, 1, 2, 3, 0])
    _, correct = confidence_and_correct(probs, target)
    assert correct.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_out_of_range_targets_without_validation_are_never_correct():
    probs = torch.tensor([[0.6, 0.4], [0.3, 0.7]])
    _, correct = confidence_and_correct(probs, torch.tensor([5, -3]), validate_args=False)
    assert correct.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="target values must lie in"):
        confidence_and_correct(probs, torch.tensor([5, 1]))


def test_ece_and_summary_agree_with_a_max_based_reference_on_tied_data():
    probs, target = tied_probs(2000, 10, 3, seed=0, dtype=torch.float64)
    conf, idx = probs.max(1)  # torch.max: the first maximal index, the reference convention
    correct = (idx == target).double()
    edges = torch.linspace(0, 1, 16, dtype=torch.float64)
    bins = torch.bucketize(conf, edges[1:-1], right=False)
    ece = sum(
        (conf[bins == b] - correct[bins == b]).sum().abs() for b in range(15) if (bins == b).any()
    ) / len(conf)
    assert calibration_error(probs, target).item() == pytest.approx(ece.item(), abs=1e-14)
    summary = CalibrationSummary()
    summary.update(probs, target)
    assert summary.compute()["accuracy"].item() == pytest.approx(correct.mean().item(), abs=1e-15)
