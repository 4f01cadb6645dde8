"""Claim 1: the one-parameter threshold model on three points.

From Su Jianlin, "How to train your accuracy?".

Data ``(-0.25, -1), (0, -1), (0.25, +1)``, model ``f(x) = k (x - b)`` with ``k = 1`` (no
temperature) or ``k`` learnable. Sigmoid cross-entropy ``sum log(1 + exp(-l f(x)))`` and hinge
``sum max(0, 1 - l f(x))`` are functions of ``(k, b)``; every point is classified correctly
by ``sign f`` exactly when ``b`` is in ``(0, 0.25)``. Pure numpy / torch, float64.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

#: The three points and their labels.
X = (-0.25, 0.0, 0.25)
LABELS = (-1.0, -1.0, 1.0)
#: The interval of ``b`` that classifies every point correctly.
PERFECT = (0.0, 0.25)
#: Grid of ``b`` and its step.
GRID = (-1.0, 2.0)
GRID_STEP = 1e-4
#: Starting points of gradient descent.
STARTS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5)
#: Gradient descent (Adam): steps and learning rate.
STEPS = 3000
LR = 0.01

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def margins(b: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``l * k * (x - b)`` for each point; ``b``, ``k`` broadcast (last dim: the points)."""
    x = torch.tensor(X, dtype=torch.float64)
    labels = torch.tensor(LABELS, dtype=torch.float64)
    return labels * k[..., None] * (x - b[..., None])


def sigmoid_ce(b: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Sigmoid cross-entropy summed over the points: ``sum softplus(-margin)``."""
    return torch.nn.functional.softplus(-margins(b, k)).sum(-1)


def hinge(b: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Hinge loss summed over the points: ``sum max(0, 1 - margin)``."""
    return torch.relu(1 - margins(b, k)).sum(-1)


LOSSES: dict[str, Loss] = {"sigmoid_ce": sigmoid_ce, "hinge": hinge}


def grid_minimum(loss: Loss, tol: float = 1e-9) -> tuple[float, float, float]:
    """Fixed ``k = 1``: ``(argmin b, lowest b, highest b)`` of the minimum on the grid.

    The lowest and highest ``b`` bound the set where the loss is within ``tol`` of its minimum
    (a flat minimum has lowest < highest).
    """
    b = torch.arange(GRID[0], GRID[1] + GRID_STEP / 2, GRID_STEP, dtype=torch.float64)
    values = loss(b, torch.ones_like(b))
    flat = b[values <= values.min() + tol]
    return float(b[values.argmin()]), float(flat.min()), float(flat.max())


def descend(loss: Loss, learn_k: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Adam from every start in :data:`STARTS` at once (``k`` from 1 when learned).

    Returns:
        Final ``b``, ``k`` and loss of each start.
    """
    b = torch.tensor(STARTS, dtype=torch.float64, requires_grad=True)
    log_k = torch.zeros_like(b, requires_grad=learn_k)
    optimizer = torch.optim.Adam([b, log_k] if learn_k else [b], lr=LR)
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss(b, log_k.exp()).sum().backward()  # the starts are independent
        optimizer.step()
    with torch.no_grad():
        final = loss(b, log_k.exp())
        return b.numpy().copy(), log_k.exp().numpy().copy(), final.numpy().copy()


def inside(values: np.ndarray) -> float:
    """Fraction of ``values`` strictly inside the perfect interval."""
    return float(np.mean((values > PERFECT[0]) & (values < PERFECT[1])))


def analysis() -> dict[str, float]:
    """Every number of claim 1, as flat MLflow metric names and values."""
    numbers: dict[str, float] = {}
    for name, loss in LOSSES.items():
        argmin, low, high = grid_minimum(loss)
        fixed, _, _ = descend(loss, learn_k=False)
        learned, k, final = descend(loss, learn_k=True)
        numbers |= {
            f"{name}/grid_argmin_b": argmin,
            f"{name}/grid_flat_low": low,
            f"{name}/grid_flat_high": high,
            f"{name}/gd_b_min": float(fixed.min()),
            f"{name}/gd_b_max": float(fixed.max()),
            f"{name}/gd_inside": inside(fixed),
            f"{name}/temp_gd_b_min": float(learned.min()),
            f"{name}/temp_gd_b_max": float(learned.max()),
            f"{name}/temp_gd_inside": inside(learned),
            f"{name}/temp_gd_k_min": float(k.min()),
            f"{name}/temp_gd_loss_max": float(final.max()),
        }
    return numbers


def figure(path: str) -> None:
    """Loss against ``b`` (``k = 1``) for both losses, the perfect interval shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = torch.linspace(-0.5, 1.5, 801, dtype=torch.float64)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, loss in LOSSES.items():
        ax.plot(b.numpy(), loss(b, torch.ones_like(b)).numpy(), label=name)
    ax.axvspan(*PERFECT, color="green", alpha=0.2, label="every point correct")
    ax.set_xlabel("b (k = 1)")
    ax.set_ylabel("loss summed over the 3 points")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
