"""The built-in loss names and their classes, without importing torch (standard library only).

:mod:`lightning_losses.registry` builds its registry from :data:`BUILTIN_LOSSES`; the console
script checks ``--model.criterion=NAME`` against it before Lightning is imported, and
``fit --help`` lists it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["BUILTIN_LOSSES", "closest_loss_name", "unknown_loss_message"]

#: Each built-in registry name and the name of its class in :mod:`lightning_losses.losses`.
BUILTIN_LOSSES: dict[str, str] = {
    "ce": "CrossEntropyLoss",
    "gamma_ce": "GammaCrossEntropyLoss",
    "soft_accuracy": "SoftAccuracyLoss",
    "focal": "FocalLoss",
    "adaptive_focal": "AdaptiveFocalLoss",
    "adafocal": "AdaFocalLoss",
    "hard_truncated": "HardTruncatedLoss",
    "soft_truncated": "SoftTruncatedLoss",
    "binary_focal": "BinaryFocalLoss",
    "binary_soft_truncated": "BinarySoftTruncatedLoss",
    "binary_hard_truncated": "BinaryHardTruncatedLoss",
    "exact": "EXACTLoss",
    "multilabel_ce": "MultilabelCategoricalCrossEntropyLoss",
    "nm_ce": "NMCategoricalCrossEntropyLoss",
    "poly1": "Poly1Loss",
    "mbls": "MbLSLoss",
    "dual_focal": "DualFocalLoss",
    "mdca": "MDCALoss",
    "dca": "DCALoss",
    "mmce": "MMCELoss",
}


def closest_loss_name(word: str, names: Iterable[str]) -> str | None:
    """The registry name among ``names`` closest to ``word`` (difflib), or ``None``.

    A class name such as ``FocalLoss`` is matched to its registry name.

    Example:
        >>> closest_loss_name("focall", BUILTIN_LOSSES)
        'focal'
        >>> closest_loss_name("FocalLoss", BUILTIN_LOSSES)
        'focal'
        >>> closest_loss_name("xyz", BUILTIN_LOSSES) is None
        True
    """
    names = list(names)
    by_class = {BUILTIN_LOSSES[name]: name for name in names if name in BUILTIN_LOSSES}
    if word in by_class:
        return by_class[word]
    close = difflib.get_close_matches(word, names, n=1)
    return close[0] if close else None


def unknown_loss_message(word: str, names: Iterable[str]) -> str:
    """The message for an unknown loss name: the names, and the closest one if any.

    Example:
        >>> unknown_loss_message("focall", ["ce", "focal"])
        "unknown loss name 'focall'; did you mean 'focal'? (available: ce, focal)"
    """
    names = sorted(names)
    close = closest_loss_name(word, names)
    hint = f"; did you mean {close!r}?" if close else ""
    return f"unknown loss name {word!r}{hint} (available: {', '.join(names)})"
