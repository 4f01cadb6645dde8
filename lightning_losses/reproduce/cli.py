"""Command line of ``lightning-losses reproduce``; light: the standard library at import.

:func:`build_parser` and :func:`parse_args` need only the claims' specifications
(:mod:`~lightning_losses.reproduce.claims`, plain data); :func:`main` imports the pipeline
(torch, Lightning, MLflow) once the arguments are parsed, so ``--help`` and usage errors
answer at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .claims import CLAIMS

__all__ = ["build_parser", "main", "parse_args"]

PROG = "lightning-losses reproduce"
DESCRIPTION = (
    "Test the source documents' claims with tracked runs and write a report. Runs (or reuses, "
    "by MLflow tags) every variant of each claim for each seed, one MLflow experiment per "
    "claim (claim-3-gamma-ce...), reads the numbers back from MLflow and writes "
    "<out>/REPORT.md with a table (mean ± std over seeds), a verdict with the numbers it rests "
    "on, the run ids and the figures."
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lightning-losses reproduce``.

    Example:
        >>> args = build_parser().parse_args(["--claims", "3", "--seeds", "1"])
        >>> args.claims, args.seeds, args.jobs, str(args.out)
        ([3], 1, 1, 'reports')
    """
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    parser.add_argument(
        "--claims",
        type=int,
        nargs="+",
        default=sorted(CLAIMS),
        choices=sorted(CLAIMS),
        help="claims to test (default: all)",
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds per variant (0, 1, ...)")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="report folder")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)",
    )
    parser.add_argument(
        "--epochs-scale",
        type=float,
        default=1.0,
        help="multiply every epoch budget (at least one epoch)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="fits run at a time, each in its own process (e.g. the number of cores)",
    )
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Options of ``lightning-losses reproduce``; a bad value exits with status 2.

    Example:
        >>> parse_args(["--epochs-scale", "0.5"]).epochs_scale
        0.5
    """
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.seeds < 1 or args.epochs_scale <= 0 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1 and --epochs-scale > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightning-losses reproduce``: parse, then run the pipeline.

    Returns:
        0 when every run succeeded, 1 when a run failed (the report lists it).
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from .pipeline import run_command

    return run_command(args)
