"""lightning-losses: classification losses against overconfidence and class imbalance.

``import lightning_losses`` is light: it imports nothing but the standard library. The names
in ``__all__`` (the losses, :class:`NormFaceHead`, :class:`LossMixin`, the registry functions)
are imported on first access (PEP 562 module ``__getattr__``), which is when torch is imported;
``from lightning_losses import FocalLoss`` works as usual. MLflow, netcal, matplotlib and
scikit-learn are imported only by the functions that use them, so that
``lightning-losses --help`` and the ``--help`` of each command start without torch.

Example:
    >>> import sys
    >>> import lightning_losses
    >>> lightning_losses.__version__
    '0.1.0'
    >>> from lightning_losses import FocalLoss
    >>> FocalLoss.__module__
    'lightning_losses.losses'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "AdaFocalLoss",
    "AdaptiveFocalLoss",
    "BinaryFocalLoss",
    "BinaryHardTruncatedLoss",
    "BinarySoftTruncatedLoss",
    "CrossEntropyLoss",
    "EXACTLoss",
    "FocalLoss",
    "FunctionalLoss",
    "GammaCrossEntropyLoss",
    "HardTruncatedLoss",
    "LinearTargetLoss",
    "LossMixin",
    "MultilabelCategoricalCrossEntropyLoss",
    "NMCategoricalCrossEntropyLoss",
    "NormFaceHead",
    "SoftAccuracyLoss",
    "SoftTruncatedLoss",
    "available_losses",
    "build_criterion",
    "get_loss",
    "loss_class",
    "register_loss",
]

#: The submodule that defines each exported name: imported on the name's first access.
_EXPORTS: dict[str, str] = {
    **{name: "losses" for name in __all__ if name.endswith("Loss")},
    "LossMixin": "mixins",
    "NormFaceHead": "heads",
    "available_losses": "registry",
    "build_criterion": "mixins",
    "get_loss": "registry",
    "loss_class": "registry",
    "register_loss": "registry",
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports these
    from .heads import NormFaceHead
    from .losses import (
        AdaFocalLoss,
        AdaptiveFocalLoss,
        BinaryFocalLoss,
        BinaryHardTruncatedLoss,
        BinarySoftTruncatedLoss,
        CrossEntropyLoss,
        EXACTLoss,
        FocalLoss,
        FunctionalLoss,
        GammaCrossEntropyLoss,
        HardTruncatedLoss,
        LinearTargetLoss,
        MultilabelCategoricalCrossEntropyLoss,
        NMCategoricalCrossEntropyLoss,
        SoftAccuracyLoss,
        SoftTruncatedLoss,
    )
    from .mixins import LossMixin, build_criterion
    from .registry import available_losses, get_loss, loss_class, register_loss


def __getattr__(name: str) -> Any:
    """Import an exported name from its submodule on first access and keep it here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later accesses skip __getattr__
    return value


def __dir__() -> list[str]:
    """The module's attributes, the exported names not yet imported included."""
    return sorted(set(globals()) | set(__all__))
