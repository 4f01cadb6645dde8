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

from typing import TYPE_CHECKING

from lightning_losses._lazy import lazy_exports

__all__ = ["main", "reproduce", "reproduce_all", "reproduce_claim"]

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports these
    from lightning_losses.reproduce.cli import build_parser, main, parse_args  # noqa: F401
    from lightning_losses.reproduce.pipeline import (  # noqa: F401
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


#: Each lazily imported name and its submodule: the light command line, or the pipeline.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("build_parser", "main", "parse_args"), "cli"),
    **dict.fromkeys(
        (
            "DEFAULT_URI",
            "display_uri",
            "figures",
            "quiet_libraries",
            "reproduce",
            "reproduce_all",
            "reproduce_claim",
            "run_claim",
            "run_command",
            "run_or_reuse",
            "threshold_run",
        ),
        "pipeline",
    ),
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
