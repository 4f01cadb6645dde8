"""The reliability bins that ``reproduce`` stores with a run, for the report's diagrams."""

from __future__ import annotations

import torch

#: Bins of the test reliability diagram.
N_BINS = 15
#: Artifact holding the test reliability bins.
BINS_ARTIFACT = "reproduce/test_bins.json"
#: Artifact holding the test reliability bins after temperature scaling (multiclass).
SCALED_BINS_ARTIFACT = "reproduce/test_bins_scaled.json"


def reliability_bins(logits: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]]:
    """Equal-width reliability bins of the top label: count, confidence sum, correct sum.

    Confidence 0.881 falls in bin 13 of 15, ``(13/15, 14/15]``, and 0.731 in bin 10.

    Example:
        >>> bins = reliability_bins(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
        >>> bins["count"][13], bins["correct"][13], bins["count"][10], bins["correct"][10]
        (1.0, 1.0, 1.0, 0.0)
    """
    from lightning_losses.calibration.functional import binned_statistics, confidence_and_correct

    confidence, correct = confidence_and_correct(logits, target, input_format="logits")
    count, conf_sum, correct_sum = binned_statistics(confidence, correct, N_BINS)
    return {"count": count.tolist(), "conf_sum": conf_sum.tolist(), "correct": correct_sum.tolist()}
