"""Short names for the loss modules, for configs and the command line."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from lightning_losses import losses
from lightning_losses.loss_names import BUILTIN_LOSSES, unknown_loss_message

# The built-in names are listed, without torch, in loss_names (the console script reads them).
_REGISTRY: dict[str, type[nn.Module]] = {
    name: getattr(losses, class_name) for name, class_name in BUILTIN_LOSSES.items()
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
    """The class registered as ``name``; ``ValueError`` listing the names if there is none.

    Example:
        >>> loss_class("focall")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: unknown loss name 'focall'; did you mean 'focal'? (available: adafocal, ...)
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(unknown_loss_message(str(name), _REGISTRY)) from None


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
