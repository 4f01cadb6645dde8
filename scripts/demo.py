"""Train a small MLP on scikit-learn's digits with each loss and print one table.

Plain PyTorch, full-batch Adam, the same budget and seed for every loss; the held-out split is
fixed. Columns: accuracy, negative log-likelihood, top-label ECE (15 equal-width bins) and
training time.
"""

from __future__ import annotations

import time

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from lightning_losses import NormFaceHead, get_loss

EPOCHS = 150


def load(seed: int = 0):
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.3, random_state=seed, stratify=y)
    return x_tr, y_tr, x_te, y_te


def expected_calibration_error(probs: torch.Tensor, target: torch.Tensor, bins: int = 15) -> float:
    confidence, prediction = probs.max(dim=1)
    correct = (prediction == target).double()
    index = torch.clamp(torch.ceil(confidence.double() * bins).long() - 1, 0, bins - 1)
    conf_sum = torch.bincount(index, weights=confidence.double(), minlength=bins)
    correct_sum = torch.bincount(index, weights=correct, minlength=bins)
    return float((conf_sum - correct_sum).abs().sum() / len(target))


def train(name: str, hyperparameters: dict, normface: bool = False) -> dict:
    torch.manual_seed(0)
    x_tr, y_tr, x_te, y_te = load()
    backbone = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU())
    head = NormFaceHead(64, 10, scale=None) if normface else nn.Linear(64, 10)
    criterion = get_loss(name, **hyperparameters)
    params = [*backbone.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    start = time.perf_counter()
    for _ in range(EPOCHS):
        optimizer.zero_grad()
        features = backbone(x_tr)
        logits = head(features, y_tr) if normface else head(features)
        criterion(logits, y_tr).backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        logits = head(backbone(x_te))
        log_probs = torch.log_softmax(logits, dim=1)
    return {
        "accuracy": float((logits.argmax(1) == y_te).float().mean()),
        "nll": float(-log_probs.gather(1, y_te[:, None]).mean()),
        "ece": expected_calibration_error(log_probs.exp(), y_te),
        "seconds": seconds,
    }


RUNS = [
    ("ce", "ce", {}, False),
    ("gamma_ce(gamma=0.5)", "gamma_ce", {"gamma": 0.5}, False),
    ("gamma_ce(gamma=0.5, b=0.2)", "gamma_ce", {"gamma": 0.5, "threshold": 0.2}, False),
    ("soft_accuracy", "soft_accuracy", {}, False),
    ("focal(gamma=2)", "focal", {"gamma": 2.0}, False),
    ("adaptive_focal (FLSD-53)", "adaptive_focal", {}, False),
    ("hard_truncated(margin=0.5)", "hard_truncated", {"margin": 0.5}, False),
    ("soft_truncated(k=1)", "soft_truncated", {"k": 1.0}, False),
    ("exact(sigma=1)", "exact", {"sigma": 1.0}, False),
    ("ce + NormFace head (learnable scale)", "ce", {}, True),
]


def main() -> None:
    print(f"digits (1,257 train / 540 test), MLP 64-128-64, full-batch Adam, {EPOCHS} epochs")
    header = f"{'loss':38s} {'accuracy':>9s} {'NLL':>7s} {'ECE':>7s} {'time s':>7s}"
    print(header)
    print("-" * len(header))
    for label, name, hyperparameters, normface in RUNS:
        r = train(name, hyperparameters, normface)
        print(
            f"{label:38s} {r['accuracy']:9.4f} {r['nll']:7.4f} {r['ece']:7.4f} {r['seconds']:7.2f}"
        )


if __name__ == "__main__":
    main()
