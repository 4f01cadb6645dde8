"""The optional ``transformers`` and ``tokenizers`` imports, with one line when they are missing."""

from __future__ import annotations

import importlib
from types import ModuleType

#: What to install for the Hugging Face integration.
INSTALL_HINT = "pip install lightning-losses[hf]"


def require(name: str) -> ModuleType:
    """Import ``name`` (``"transformers"`` or ``"tokenizers"``), or raise a one-line error.

    Raises:
        ModuleNotFoundError: ``<name> is not installed: pip install lightning-losses[hf]``.

    Example:
        >>> require("tokenizers").__name__
        'tokenizers'
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
        raise ModuleNotFoundError(
            f"{name} is not installed: {INSTALL_HINT} (the Hugging Face integration needs "
            "transformers and tokenizers)",
            name=name,
        ) from None
