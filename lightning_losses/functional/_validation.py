"""Argument checks shared by every loss.

Checks of Python scalars (``reduction``, ``gamma``, ...) always run: they cost nothing.
Checks that read tensor *values* (targets in range, probabilities in [0, 1], ...) run only when
``validate_args=True`` (the default), because on an accelerator they synchronise with the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

REDUCTIONS = ("none", "mean", "sum")


def check_reduction(reduction: str) -> None:
    """Raise ``ValueError`` unless ``reduction`` is one of ``none|mean|sum``."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of 'none', 'mean' or 'sum'; got {reduction!r}")


def check_range(
    name: str,
    value: float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Raise ``ValueError`` unless ``low <= value <= high`` (``<`` where the side is open)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            return  # per-element hyper-parameters are checked by the loss that accepts them
        value = value.item()
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and (value >= high if high_open else value > high)
    if bad_low or bad_high or value != value:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise ValueError(f"{name} must lie in {left}{lo}, {hi}{right}; got {value!r}")


def check_logits(logits: Tensor, *, name: str = "logits", min_dim: int = 2) -> None:
    """Raise unless ``logits`` is a floating tensor with at least ``min_dim`` dimensions."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor; got dtype {logits.dtype}")
    if logits.dim() < min_dim:
        form = "[N, C, *]" if min_dim == 2 else f"a tensor with at least {min_dim} dimensions"
        raise ValueError(f"{name} must have shape {form}; got shape {tuple(logits.shape)}")


def check_index_target(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int,
    validate_args: bool,
) -> None:
    """Check class-index targets ``[N, *]`` against logits ``[N, C, *]``.

    Dtype and shape are always checked; values (``0 <= t < C`` or ``t == ignore_index``) only
    with ``validate_args``.
    """
    check_logits(logits)
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor; got {type(target).__name__}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(
            "target must hold class indices (an integer tensor of shape [N, *]); got dtype "
            f"{target.dtype}. Soft or binary targets belong to the binary_* or multi-label losses."
        )
    expected = (logits.shape[0], *logits.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(
            f"target must have shape {list(expected)} to match logits of shape "
            f"{list(logits.shape)} (class dimension 1); got {list(target.shape)}"
        )
    if validate_args and target.numel() > 0:
        num_classes = logits.shape[1]
        bad = (target != ignore_index) & ((target < 0) | (target >= num_classes))
        if bool(bad.any()):
            example = int(target[bad].flatten()[0])
            raise ValueError(
                f"target values must lie in [0, {num_classes - 1}] (C={num_classes} classes) or "
                f"equal ignore_index={ignore_index}; found {example}"
            )


def check_class_vector(name: str, vector: Tensor | Sequence[float] | None, logits: Tensor):
    """Return a per-class vector as a tensor on the logits' device, or ``None``."""
    if vector is None:
        return None
    vector = torch.as_tensor(vector, device=logits.device)
    num_classes = logits.shape[1]
    if vector.dim() != 1 or vector.shape[0] != num_classes:
        raise ValueError(
            f"{name} must be a vector of one value per class (shape [{num_classes}]); "
            f"got shape {list(vector.shape)}"
        )
    return vector


def check_soft_target(
    logits: Tensor,
    target: Tensor,
    *,
    validate_args: bool,
    ignore_index: int | None = None,
) -> None:
    """Check float targets in [0, 1] of the same shape as the logits."""
    check_logits(logits, min_dim=1)
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor; got {type(target).__name__}")
    if not target.is_floating_point():
        raise TypeError(
            "target must be a floating-point tensor of probabilities in [0, 1] with the shape "
            f"of the logits; got dtype {target.dtype} (class indices belong to the softmax losses)"
        )
    if tuple(target.shape) != tuple(logits.shape):
        raise ValueError(
            f"target must have the shape of the logits {list(logits.shape)}; "
            f"got {list(target.shape)}"
        )
    if validate_args and target.numel() > 0:
        bad = (target < 0) | (target > 1) | torch.isnan(target)
        if ignore_index is not None:
            bad &= target != ignore_index
        if bool(bad.any()):
            example = float(target[bad].flatten()[0])
            allowed = "" if ignore_index is None else f" (or ignore_index={ignore_index})"
            raise ValueError(f"target values must lie in [0, 1]{allowed}; found {example}")
