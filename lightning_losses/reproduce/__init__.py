"""``lightning-losses reproduce``: test the sources' claims with tracked runs, write a report.

``lightning-losses reproduce [--claims 1 3] [--seeds 3] [--out reports/] [--tracking-uri URI]
[--epochs-scale F] [--jobs J] [--fresh]`` runs (or reuses, by MLflow tags, runs of the same code
version: :mod:`~lightning_losses.reproduce.version`) every variant of each claim for each seed,
one MLflow experiment per claim (``claim-3-gamma-ce``...), reads the numbers back from MLflow
and writes ``<out>/REPORT.md`` with a table (mean ± std over seeds), a verdict decided by
:func:`lightning_losses.compare.decide.decide` with the numbers it rests on, the run ids, the
figures and an appendix of every per-seed value.

Importing this package is light (the standard library only): :func:`main` and
:func:`parse_args` come from :mod:`~lightning_losses.reproduce.cli`, and every other name
(:func:`reproduce`, :func:`reproduce_all`, :func:`reproduce_claim`, :func:`run_claim`,
:func:`run_or_reuse`...) from :mod:`~lightning_losses.reproduce.pipeline`, imported on first
access (PEP 562), which imports torch and MLflow.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__all__ = ["main", "reproduce", "reproduce_all", "reproduce_claim"]

#: Names served by the light command-line module; every other name comes from the pipeline.
_CLI_NAMES = frozenset({"build_parser", "main", "parse_args"})

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports these
    from .cli import build_parser, main, parse_args  # noqa: F401
    from .pipeline import (  # noqa: F401
        DEFAULT_URI,
        display_uri,
        figures,
        quiet_libraries,
        reproduce,
        reproduce_all,
        reproduce_claim,
        run_claim,
        run_command,
        run_or_reuse,
        threshold_run,
    )


def __getattr__(name: str) -> Any:
    """Import ``name`` from the command-line module or the pipeline on first access."""
    if name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        # A submodule (``from . import version``) is imported by the import system, not here:
        # importing the pipeline for it would import the submodule's importers first (a cycle).
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(".cli" if name in _CLI_NAMES else ".pipeline", __name__)
    try:
        value = getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The package's attributes, the lazily imported names of ``__all__`` included."""
    return sorted(set(globals()) | set(__all__))
