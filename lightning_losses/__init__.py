"""lightning-losses: classification losses against overconfidence and class imbalance.

``import lightning_losses`` stays light: it imports torch only. MLflow, netcal and matplotlib
are imported by the modules that use them.
"""

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
