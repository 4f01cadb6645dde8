"""The code version of ``reproduce``'s runs: the package version and a hash of its source.

Every run ``reproduce`` makes is tagged :data:`CODE_VERSION_TAG` with :func:`code_version`,
and a run is reused only under the same code version: numbers made by other code are never
mixed into a report silently. The hash covers what can decide a run's numbers and works as
well in a wheel as in a checkout (no git needed): every ``lightning_losses/**/*.py`` file and
the shipped configs (``configs/*.yaml``, ``configs/*/*.yaml`` with the experiment files, and
``default_config.yaml``), by their paths relative to the package and their bytes, except
the code that only reads finished runs (:data:`READERS_ONLY`: ``compare`` and the report's
verdict rules and text), so that a corrected verdict rule re-decides the stored runs instead
of training them again. It is computed once per process (about 150 small files).

Standard library only.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

__all__ = ["CODE_VERSION_TAG", "code_version", "source_files", "source_hash"]

#: MLflow tag of every run ``reproduce`` makes: the :func:`code_version` that made it.
CODE_VERSION_TAG = "lightning_losses.code_version"
#: Hex digits of :func:`source_hash` kept in :func:`code_version`.
HASH_DIGITS = 12
#: The shipped configs, relative to the package (the package data of ``pyproject.toml``).
CONFIG_PATTERNS = ("default_config.yaml", "configs/*.yaml", "configs/*/*.yaml")
#: Code that reads finished runs and never makes one: left out of the hash.
READERS_ONLY = ("compare/", "reproduce/report.py", "reproduce/spec.py")


def package_root() -> Path:
    """The folder of the installed ``lightning_losses`` package."""
    return Path(__file__).resolve().parents[1]


def source_files(root: Path | None = None) -> list[Path]:
    """The files :func:`source_hash` reads, sorted by their path relative to ``root``.

    Every ``*.py`` below ``root`` (``__pycache__`` has none) but :data:`READERS_ONLY`, and the
    configs of
    :data:`CONFIG_PATTERNS`; ``configs`` may be a link to the repository's ``configs/``.
    """
    root = package_root() if root is None else root
    # os.walk with followlinks: ``callbacks`` is a link to the top-level callbacks/ folder in a
    # checkout (Path.rglob does not enter linked folders)
    found = (
        Path(folder) / name
        for folder, _, names in os.walk(root, followlinks=True)
        for name in names
        if name.endswith(".py")
    )
    files = {
        p
        for p in found
        if p.is_file() and not p.relative_to(root).as_posix().startswith(READERS_ONLY)
    }
    for pattern in CONFIG_PATTERNS:
        files.update(p for p in root.glob(pattern) if p.is_file())
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def source_hash(root: Path | None = None) -> str:
    """SHA-256 over the relative path and the bytes of each of :func:`source_files`.

    Example:
        >>> len(source_hash())
        64
    """
    root = package_root() if root is None else root
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@lru_cache(maxsize=1)
def code_version() -> str:
    """``<package version>+src.<12 hex digits of the source hash>``, computed once.

    Example:
        >>> import lightning_losses
        >>> code_version().startswith(lightning_losses.__version__ + "+src.")
        True
    """
    from lightning_losses import __version__

    return f"{__version__}+src.{source_hash()[:HASH_DIGITS]}"
