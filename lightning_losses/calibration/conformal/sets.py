"""Prediction sets as boolean masks: every label whose score is at most the threshold."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_losses.calibration.conformal.scores import all_label_scores

__all__ = ["prediction_sets"]


def prediction_sets(
    probs: Tensor,
    threshold: float | Tensor,
    *,
    method: str = "lac",
    randomized: bool = True,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
    k_reg: int = 1,
    lam: float = 0.01,
    weight: float = 0.2,
) -> Tensor:
    """The conformal prediction sets ``{y : s(x, y) <= q}`` as a boolean mask.

    ``s`` is the score ``method`` of :func:`~.conformal_scores` (same hyper-parameters, same
    kind of draw ``U``: one per row, fresh from ``generator`` unless ``noise`` gives them);
    ``q`` the threshold of :func:`~.conformal_threshold` (one number) or of
    :func:`~.class_conditional_thresholds` (``[C]``: label ``y`` is compared with ``q_y``).
    A set may be empty (LAC with a small ``q``) and holds every label when ``q = +inf``.

    Args:
        probs: ``[N, C]`` or ``[N, C, *]`` probabilities (class dimension 1).
        threshold: a number, a 0-d tensor, or ``[C]`` class-conditional thresholds.
        method: ``"lac"``, ``"aps"``, ``"raps"``, ``"saps"`` or ``"top_k"``.
        randomized: draw ``U`` per row (else ``U = 0``).
        generator: the source of the draws.
        noise: the draws themselves, one per row (``N`` or ``N * prod(*)``).
        k_reg: RAPS's rank from which the penalty applies.
        lam: RAPS's penalty per rank.
        weight: SAPS's weight per rank.

    Returns:
        Booleans of the shape of ``probs``: ``True`` where the label is in the set.

    Raises:
        ValueError: a threshold of another shape, or the errors of the scores.

    Example:
        >>> probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]])
        >>> prediction_sets(probs, 0.85, method="aps", randomized=False)
        tensor([[ True, False, False],
                [False,  True,  True]])
    """
    scores = all_label_scores(
        probs,
        method=method,
        randomized=randomized,
        generator=generator,
        noise=noise,
        k_reg=k_reg,
        lam=lam,
        weight=weight,
    )
    # a Python float stays a float64 number (as_tensor would round it to float32 first)
    q = torch.as_tensor(threshold, dtype=None if isinstance(threshold, Tensor) else torch.float64)
    q = q.to(device=scores.device)
    if q.dim() == 1 and q.shape[0] == probs.shape[1]:
        q = q.reshape(1, -1, *([1] * (probs.dim() - 2)))
    elif q.numel() != 1:
        raise ValueError(
            f"threshold must be one number or [C]={probs.shape[1]} class-conditional "
            f"thresholds; got shape {list(q.shape)}"
        )
    else:
        q = q.reshape(())
    return scores <= q.to(scores.dtype)
