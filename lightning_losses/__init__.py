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
    >>> from importlib import metadata
    >>> lightning_losses.__version__ == metadata.version("lightning-losses")  # one version
    True
    >>> from lightning_losses import FocalLoss
    >>> FocalLoss.__module__
    'lightning_losses.losses'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_losses._lazy import lazy_exports

__version__ = "0.2.0"

__all__ = [
    "AdaFocalLoss",
    "AdaptiveFocalLoss",
    "BinaryFocalLoss",
    "BinaryHardTruncatedLoss",
    "BinarySoftTruncatedLoss",
    "CrossEntropyLoss",
    "DCALoss",
    "DualFocalLoss",
    "EXACTLoss",
    "FocalLoss",
    "FunctionalLoss",
    "GammaCrossEntropyLoss",
    "HardTruncatedLoss",
    "LinearTargetLoss",
    "LossMixin",
    "MDCALoss",
    "MMCELoss",
    "MbLSLoss",
    "MultilabelCategoricalCrossEntropyLoss",
    "NMCategoricalCrossEntropyLoss",
    "NormFaceHead",
    "Poly1Loss",
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
    "LossMixin": "lightning.mixin",
    "NormFaceHead": "heads",
    "available_losses": "registry",
    "build_criterion": "lightning.mixin",
    "get_loss": "registry",
    "loss_class": "registry",
    "register_loss": "registry",
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports these
    from lightning_losses.heads import NormFaceHead
    from lightning_losses.lightning.mixin import LossMixin, build_criterion
    from lightning_losses.losses import (
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
    from lightning_losses.registry import available_losses, get_loss, loss_class, register_loss


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
