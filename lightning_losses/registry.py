"""Short names for the loss modules, for configs and the command line."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from . import losses

_REGISTRY: dict[str, type[nn.Module]] = {
    "ce": losses.CrossEntropyLoss,
    "gamma_ce": losses.GammaCrossEntropyLoss,
    "soft_accuracy": losses.SoftAccuracyLoss,
    "focal": losses.FocalLoss,
    "adaptive_focal": losses.AdaptiveFocalLoss,
    "adafocal": losses.AdaFocalLoss,
    "hard_truncated": losses.HardTruncatedLoss,
    "soft_truncated": losses.SoftTruncatedLoss,
    "binary_focal": losses.BinaryFocalLoss,
    "binary_soft_truncated": losses.BinarySoftTruncatedLoss,
    "binary_hard_truncated": losses.BinaryHardTruncatedLoss,
    "exact": losses.EXACTLoss,
    "multilabel_ce": losses.MultilabelCategoricalCrossEntropyLoss,
    "nm_ce": losses.NMCategoricalCrossEntropyLoss,
}


def available_losses() -> list[str]:
    """The registered names, sorted.

    Example:
        >>> "focal" in available_losses()
        True
    """
    return sorted(_REGISTRY)


def register_loss(name: str, loss_class: type[nn.Module]) -> None:
    """Register ``loss_class`` (any module called as ``criterion(logits, target)``) as ``name``."""
    if name in _REGISTRY and _REGISTRY[name] is not loss_class:
        raise ValueError(f"loss name {name!r} is already registered to {_REGISTRY[name]!r}")
    _REGISTRY[name] = loss_class


def loss_class(name: str) -> type[nn.Module]:
    """The class registered as ``name``; ``ValueError`` listing the names if there is none."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown loss name {name!r}; available: {', '.join(available_losses())}"
        ) from None


def get_loss(name: str, **hyperparameters: Any) -> nn.Module:
    """Build the loss registered as ``name`` with the given hyper-parameters.

    Example:
        >>> get_loss("focal", gamma=2.0)
        FocalLoss(gamma=2.0, reduction='mean')
    """
    cls = loss_class(name)
    accepted = inspect.signature(cls).parameters
    unknown = [key for key in hyperparameters if key not in accepted]
    if unknown:
        raise ValueError(
            f"loss {name!r} ({cls.__name__}) has no hyper-parameter {unknown[0]!r}; "
            f"it accepts: {', '.join(accepted)}"
        )
    return cls(**hyperparameters)
