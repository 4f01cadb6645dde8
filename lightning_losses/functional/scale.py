"""The scale of the logits: how large scaled-cosine logits must be, and Feature Incay.

After Wang Feng, "Understanding softmax: controlling its smoothness".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_losses.functional._core import compute_dtype, reduce_loss
from lightning_losses.functional.checks import (
    check_finite,
    check_int,
    check_logits,
    check_range,
    check_reduction,
    first_non_finite,
)


def normface_min_scale(num_classes: int, p: float) -> float:
    """Smallest scale ``s`` at which scaled-cosine logits ``s * cos`` can give a class ``p``.

    ``s = (C-1)/C * log((C-1) p / (1-p))``: the best case puts the target at cosine 1 and the
    other ``C-1`` class weights at cosine ``-1/(C-1)`` (a regular simplex).

    Source: Wang et al., "NormFace: L2 Hypersphere Embedding for Face Verification" (2017);

    Args:
        num_classes: ``C >= 2``.
        p: target probability in ``(0, 1)``; ``p <= 1/C`` needs no scale and gives a value
            ``<= 0``.

    Example:
        >>> round(normface_min_scale(10, 0.9), 4)
        3.955
    """
    check_int("num_classes", num_classes, low=2)
    check_range("p", p, low=0.0, high=1.0, low_open=True, high_open=True)
    c = num_classes
    return (c - 1) / c * math.log((c - 1) * p / (1 - p))


def feature_norm(features: Tensor, *, validate_args: bool = True) -> Tensor:
    """Row norms ``||f||`` of ``[N, D]`` features.

    With ``validate_args``, zero rows and NaN or infinite features are errors.
    """
    check_logits(features, name="features")
    if validate_args:
        check_finite("features", features)
    norm = torch.linalg.vector_norm(features, dim=-1)
    if validate_args and bool((norm == 0).any()):
        raise ValueError(
            "features must have non-zero rows: a zero feature vector has no direction to "
            "normalise (NormFace / Feature Incay)"
        )
    return norm


def feature_incay(
    features: Tensor, *, reduction: str = "mean", validate_args: bool = True
) -> Tensor:
    """Feature Incay regulariser ``1 / ||f||^2`` per row (mean by default).

    Adding it to the loss pushes feature norms up, which sharpens the softmax of normalised
    heads; it is the remedy of Wang Feng's "Understanding softmax" for features whose norm is
    too small.

    Source: Yuan et al., "Feature Incay for Representation Regularization" (2017).

    Args:
        features: ``[N, D]`` features (``[N, *, D]`` works too); half precision is computed in
            float32.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        validate_args: raise on NaN or infinite features and on rows of zero norm (or so small
            that ``1 / ||f||^2`` overflows).

    Example:
        >>> feature_incay(torch.tensor([[3.0, 4.0], [1.0, 0.0]]))
        tensor(0.5200)
    """
    check_reduction(reduction)
    check_logits(features, name="features")
    norm = feature_norm(features.to(compute_dtype(features.dtype)), validate_args=validate_args)
    inverse_square = norm.pow(-2)
    if validate_args and not bool(torch.isfinite(inverse_square).all()):
        _, index = first_non_finite(inverse_square)
        raise ValueError(
            f"features must have rows whose norm is large enough for 1/||f||^2 to be finite in "
            f"{norm.dtype}; row {index} has norm {norm[tuple(index)].item()!r}"
        )
    return reduce_loss(inverse_square, reduction)
