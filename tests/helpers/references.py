"""The references of the DDP tests: every metric of a digits run, in one process, in float64.

The model of a run's checkpoint is evaluated on the whole split in one batch, and each metric
that the module and the ``CalibrationMonitor`` log is written out plainly (the log-softmax,
equal-width bins as a loop), independently of the package's metrics.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.classifier import ClassifierModule

__all__ = ["last_values", "single_process_metrics", "split_logits", "top_label_ece_mce_rmsce"]


def last_values(client, run, prefix: str) -> dict[str, float]:
    """The last logged value of every metric of ``run`` whose name starts with ``prefix``."""
    names = [name for name in run.data.metrics if name.startswith(prefix)]
    return {name: client.get_metric_history(run.info.run_id, name)[-1].value for name in names}


def split_logits(model: ClassifierModule, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's float64 logits on the whole split, in one process, in one batch."""
    features, target = DigitsDataModule().dataset(split).tensors
    model.eval()
    with torch.no_grad():
        return model(features).double(), target


def top_label_ece_mce_rmsce(probs: torch.Tensor, target: torch.Tensor, n_bins: int = 15):
    """Equal-width bins (k/B, (k+1)/B] of the top-label confidence, as a plain loop."""
    confidence, prediction = probs.max(dim=1)
    correct = (prediction == target).double()
    ece, mce, squared = 0.0, 0.0, 0.0
    for k in range(n_bins):
        members = (confidence > k / n_bins) & (confidence <= (k + 1) / n_bins)
        if k == 0:
            members |= confidence == 0
        if members.any():
            gap = abs(float(confidence[members].mean() - correct[members].mean()))
            weight = float(members.double().mean())
            ece += weight * gap
            squared += weight * gap**2
            mce = max(mce, gap)
    return ece, mce, math.sqrt(squared)


def single_process_metrics(model: ClassifierModule, split: str) -> dict[str, float]:
    """Every metric that the module and the CalibrationMonitor log, computed independently."""
    logits, target = split_logits(model, split)
    log_probs = torch.log_softmax(logits, dim=1)
    probs = log_probs.exp()
    nll = float(-log_probs.gather(1, target[:, None]).mean())
    accuracy = float((probs.argmax(dim=1) == target).double().mean())
    ece, mce, rmsce = top_label_ece_mce_rmsce(probs, target)
    return {
        "loss": float(model.criterion(logits, target)),  # reduction="mean" over the split
        "acc": accuracy,
        "nll": nll,
        "ece": ece,
        "mce": mce,
        "rmsce": rmsce,
        "brier": float(((probs - F.one_hot(target, 10)) ** 2).sum(dim=1).mean()),
        # (the monitor's accuracy is left to the module's acc: one metric per quantity)
        "confidence": float(probs.max(dim=1).values.mean()),
    }
