"""Command line of ``lightning-losses reproduce``; light: the standard library at import.

:func:`build_parser` and :func:`parse_args` need only the claims' specifications
(:mod:`~lightning_losses.reproduce.claims`, plain data); :func:`main` imports the pipeline
(torch, Lightning, MLflow) once the arguments are parsed, so ``--help`` and usage errors
answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from lightning_losses.cli.quiet import VERBOSE_ENV
from lightning_losses.reproduce.claims import CLAIMS

__all__ = ["build_parser", "main", "output_folder", "parse_args"]

PROG = "lightning-losses reproduce"
DESCRIPTION = (
    "Test the source documents' claims with tracked runs and write a report. Runs (or reuses, "
    "by MLflow tags, runs of the same code version) every variant of each claim for each seed, "
    "one MLflow experiment per claim (claim-3-gamma-ce...), reads the numbers back from MLflow "
    "and writes <out>/REPORT.md with a table (mean ± std over seeds), a verdict with the "
    "numbers it rests on, the run ids, the figures and the per-seed values."
)
#: Where the committed report lives; a run of :func:`is_committed_run` writes there by default.
COMMITTED_OUT = Path("reports")
#: Seeds of the committed report.
COMMITTED_SEEDS = 3
#: Where any other run writes by default: a new ``<date>-<time>`` folder per invocation.
RUNS_FOLDER = Path("reproduce_runs")


def is_committed_run(args: argparse.Namespace) -> bool:
    """Whether ``args`` ask for the committed report's run: every claim, 3 seeds, scale 1.

    Example:
        >>> is_committed_run(build_parser().parse_args(["--jobs", "2"]))
        True
        >>> is_committed_run(build_parser().parse_args(["--claims", "1", "3", "--seeds", "1"]))
        False
    """
    return (
        set(args.claims) == set(CLAIMS)
        and args.seeds == COMMITTED_SEEDS
        and args.epochs_scale == 1.0
    )


def output_folder(args: argparse.Namespace, now: datetime | None = None) -> Path:
    """The report folder: ``--out``, else ``reports`` for the committed run, else a new one.

    Any run but :func:`is_committed_run` (a quick look, a claim or two, fewer seeds, shorter
    budgets) writes into a new ``reproduce_runs/<YYYYmmdd-HHMMSS>`` folder, so that it never
    overwrites the committed ``reports/REPORT.md`` and its figures; ``--out reports`` does.

    Example:
        >>> args = build_parser().parse_args(["--claims", "1", "--seeds", "1"])
        >>> output_folder(args, datetime(2025, 1, 2, 3, 4, 5)).as_posix()
        'reproduce_runs/20250102-030405'
    """
    if args.out is not None:
        return args.out
    if is_committed_run(args):
        return COMMITTED_OUT
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    folder, number = RUNS_FOLDER / stamp, 1
    while folder.exists():
        number += 1
        folder = RUNS_FOLDER / f"{stamp}-{number}"
    return folder


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lightning-losses reproduce``.

    Example:
        >>> args = build_parser().parse_args(["--claims", "3", "--seeds", "1"])
        >>> args.claims, args.seeds, args.jobs, args.out, args.fresh, args.verbose
        ([3], 1, 1, None, False, False)
        >>> args.post_fit_only
        False
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
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=(
            "report folder (default: reports/ for the committed run, every claim with 3 "
            "seeds at epochs scale 1; any other run: a new reproduce_runs/<date>-<time>/)"
        ),
    )
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
    parser.add_argument(
        "--fresh",
        action="store_true",
        help=(
            "train every run again, reusing none made before this invocation (runs of another "
            "code version are never reused anyway)"
        ),
    )
    parser.add_argument(
        "--post-fit-only",
        action="store_true",
        help=(
            "train nothing: reuse complete runs of other code versions (same config, "
            "overrides, seed and epochs) and compute the post-fit metrics they lack (the "
            "post-hoc calibrators' arms) from their last checkpoints"
        ),
    )
    parser.add_argument(
        "--reuse-trained",
        action="store_true",
        help=(
            "as --post-fit-only, but train the runs that have no complete run of any code "
            "version (e.g. a variant added to a claim)"
        ),
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Lightning's and MLflow's output and each fit's own summary lines",
    )
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Options of ``lightning-losses reproduce``; a bad value exits with status 2.

    ``out`` is the report folder (:func:`output_folder`); ``out_given`` says whether
    ``--out`` chose it.

    Example:
        >>> parse_args(["--epochs-scale", "0.5"]).epochs_scale
        0.5
        >>> parse_args(["--out", "reports"]).out.as_posix()
        'reports'
    """
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.seeds < 1 or args.epochs_scale <= 0 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1 and --epochs-scale > 0")
    if args.fresh and (args.post_fit_only or args.reuse_trained):
        parser.error(
            "--fresh trains every run again and --post-fit-only / --reuse-trained reuse runs "
            "of other code versions: pick one"
        )
    if args.post_fit_only and args.reuse_trained:
        parser.error(
            "--post-fit-only trains nothing and --reuse-trained trains what is missing: pick one"
        )
    args.out_given = args.out is not None
    args.out = output_folder(args)
    return args


def output_note(args: argparse.Namespace) -> str:
    """The line printed first: where the report goes, and why when it is not ``reports/``.

    Example:
        >>> output_note(parse_args(["--claims", "1", "--out", "a"]))
        'lightning-losses reproduce: the report goes to a/REPORT.md'
    """
    line = f"{PROG}: the report goes to {(args.out / 'REPORT.md').as_posix()}"
    if args.out_given or args.out == COMMITTED_OUT:
        return line
    return (
        f"{line} (not the committed {COMMITTED_OUT.as_posix()}/: that is every claim with "
        f"{COMMITTED_SEEDS} seeds; --out {COMMITTED_OUT.as_posix()} writes there)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lightning-losses reproduce``: parse, then run the pipeline.

    Returns:
        0 when every run succeeded, 1 when a run failed (the report lists it).
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print(output_note(args), flush=True)
    kept = os.environ.get(VERBOSE_ENV)
    if args.verbose:  # read by the fits, in this process and in the --jobs workers
        os.environ[VERBOSE_ENV] = "1"
    try:
        from lightning_losses.reproduce.pipeline import run_command

        return run_command(args)
    finally:
        if kept is None:
            os.environ.pop(VERBOSE_ENV, None)
        else:
            os.environ[VERBOSE_ENV] = kept
