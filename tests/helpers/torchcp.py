"""TorchCP 1.2's score functions, quantile and set measures, loaded without its package __init__.

``import torchcp`` imports torchsort and torch_geometric (absent here: torchsort's build needs
CUDA), so the modules the tests use are loaded from their files under empty stand-in parent
packages: the score classes (``lac``, ``aps``, ``raps``, ``saps``, ``topk``, ``base``),
``utils.common.calculate_conformal_value`` and ``classification.utils.metrics`` (``SSCV``,
``CovGap``). Nothing else of TorchCP runs. Tests call :func:`load` after
``pytest.importorskip("torchcp")``'s cheaper equivalent :func:`available`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

__all__ = ["available", "load"]


def _root() -> Path | None:
    spec = importlib.util.find_spec("torchcp")  # finds the package without importing it
    if spec is None or spec.submodule_search_locations is None:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def available() -> bool:
    """Whether TorchCP's files are installed."""
    return _root() is not None


def load() -> types.SimpleNamespace:
    """The TorchCP modules used as references.

    Returns:
        A namespace of modules: ``lac``, ``aps``, ``raps``, ``saps``, ``topk``, ``common``,
        ``metrics``.
    """
    root = _root()
    if root is None:
        raise ModuleNotFoundError("torchcp is not installed")
    saved = {
        name: sys.modules.get(name) for name in list(sys.modules) if name.startswith("torchcp")
    }
    try:
        for package in (
            "torchcp",
            "torchcp.utils",
            "torchcp.classification",
            "torchcp.classification.score",
            "torchcp.classification.utils",
        ):
            stub = types.ModuleType(package)
            stub.__path__ = [str(root.joinpath(*package.split(".")[1:]))]
            sys.modules[package] = stub
        names = {
            "lac": "torchcp.classification.score.lac",
            "aps": "torchcp.classification.score.aps",
            "raps": "torchcp.classification.score.raps",
            "saps": "torchcp.classification.score.saps",
            "topk": "torchcp.classification.score.topk",
            "common": "torchcp.utils.common",
            "metrics": "torchcp.classification.utils.metrics",
        }
        return types.SimpleNamespace(
            **{key: importlib.import_module(name) for key, name in names.items()}
        )
    finally:  # leave sys.modules as it was: nothing else sees the stand-ins
        for name in [n for n in sys.modules if n.startswith("torchcp")]:
            del sys.modules[name]
        sys.modules.update({k: v for k, v in saved.items() if v is not None})
