"""One helper for the packages whose names are imported on first access (PEP 562).

``import lightning_losses`` (and the console script's ``--help``) must not import torch,
MLflow or matplotlib; a package that re-exports names from heavy submodules therefore
imports each submodule when one of its names is first read, and keeps the value.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], public: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` serving ``exports`` lazily.

    Args:
        package: the package's ``__name__``.
        exports: each exported name and the submodule (relative to ``package``) defining it.
        public: further names ``dir()`` lists (the package's ``__all__``).

    Returns:
        ``(__getattr__, __dir__)``: the first imports a name's submodule on first access and
        stores the value in the package (later reads skip it); an unknown name raises
        ``AttributeError`` as a plain module does.

    Example:
        >>> getattr_, dir_ = lazy_exports("json", {"JSONDecodeError": "decoder"})
        >>> getattr_("JSONDecodeError").__name__
        'JSONDecodeError'
        >>> getattr_("nothing")
        Traceback (most recent call last):
        ...
        AttributeError: module 'json' has no attribute 'nothing'
    """
    names = dict(exports)
    listed = set(public) | set(names)

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | listed)

    return __getattr__, __dir__
