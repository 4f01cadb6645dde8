"""Class paths that moved between versions, named in the error of a config that uses them.

A ``config.yaml`` saved by an earlier version names the modules of its layout; LightningCLI
then fails to import them. The error line gets the new path and the version that moved it.
"""

from __future__ import annotations

import re

__all__ = ["MOVED", "moved_hint"]

#: Old module prefix -> (new module prefix, version that moved it). See CHANGELOG.md.
MOVED: dict[str, tuple[str, str]] = {
    "lightning_losses.models.": ("lightning_losses.lightning.", "0.2.0"),
    "lightning_losses.backbones.": ("lightning_losses.lightning.", "0.2.0"),
    "lightning_losses.mixins.": ("lightning_losses.", "0.2.0"),
    "lightning_losses.mnist1d.": ("lightning_losses.data.", "0.2.0"),
}


def moved_hint(message: str) -> str:
    """``message`` with a hint for each moved class path it names (unchanged otherwise).

    Example:
        >>> moved_hint("class_path 'lightning_losses.models.ClassifierModule': no module")
        "class_path 'lightning_losses.models.ClassifierModule': no module (lightning_losses.models.ClassifierModule moved to lightning_losses.lightning.ClassifierModule in 0.2.0: update the config)"
        >>> moved_hint("unrecognized arguments: --x")
        'unrecognized arguments: --x'
    """  # noqa: E501
    hints = []
    for old, (new, version) in MOVED.items():
        for name in dict.fromkeys(re.findall(re.escape(old) + r"(\w+)", message)):
            hints.append(f"{old}{name} moved to {new}{name} in {version}")
    return f"{message} ({'; '.join(hints)}: update the config)" if hints else message
