"""Texts and light argument parsers of the ``lightning-losses`` commands (standard library only).

Both :mod:`lightning_losses.cli.console` (the dispatcher) and the heavy modules it dispatches to
(:mod:`lightning_losses.cli`, :mod:`lightning_losses.tracking`) import from here, so that
``lightning-losses --help`` and ``lightning-losses sync-tracking --help`` answer without
importing torch or Lightning, and that the dispatcher never imports a module that imports it
back.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

from lightning_losses.cli.config_files import config_names
from lightning_losses.loss_names import BUILTIN_LOSSES

__all__ = [
    "COMMANDS",
    "DESCRIPTION",
    "LIGHTNING_COMMANDS",
    "LM_COMMANDS",
    "LM_DESCRIPTION",
    "PROG",
    "SUMMARY",
    "build_parser",
    "language_model_epilog",
    "language_model_parser",
    "language_model_usage",
    "lightning_epilog",
    "sync_tracking_parser",
    "version",
]

#: Name of the console script.
PROG = "lightning-losses"
#: The LightningCLI subcommands (``lightning_losses.cli``).
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
#: Every command with its one-line summary, in the order ``--help`` lists them.
COMMANDS: dict[str, str] = {
    "fit": "train a ClassifierModule (LightningCLI; without --config: the packaged default)",
    "validate": "evaluate a checkpoint on the validation split (needs --ckpt_path)",
    "test": "evaluate a checkpoint on the test split (needs --ckpt_path)",
    "predict": "predict with a checkpoint (needs --ckpt_path)",
    "lm": "train or evaluate the tiny language model: lm fit|validate|test (default config lm_ce)",
    "compare": "the runs of an MLflow experiment side by side (table, CSV, diagrams)",
    "sync-tracking": "replay the tracking calls a dead MLflow server missed (a spool)",
    "reproduce": "test the source documents' claims with tracked runs, write a report with figures",
}
#: What ``lightning-losses --help`` says above the list of commands.
SUMMARY = (
    "Classification losses against overconfidence and class imbalance, with calibration and "
    "MLflow tracking."
)
#: The description of the LightningCLI parser (``lightning_losses.cli``).
DESCRIPTION = (
    "Classification losses against overconfidence and imbalance, with calibration and MLflow "
    "tracking. fit/validate/test/predict: LightningCLI over ClassifierModule (default config: "
    "digits, gamma-CE annealed 0 -> 1). Also: `lightning-losses compare` (runs of an MLflow "
    "experiment side by side), `lightning-losses lm fit --config lm_ce` (the tiny language "
    "model), `lightning-losses sync-tracking SPOOL` (replay what a dead "
    "tracking server missed), `lightning-losses reproduce` (test the source documents' "
    "claims, write a report: reports/REPORT.md for the full run, reproduce_runs/ for a "
    "partial one); each takes --help."
)


def version() -> str:
    """The installed version of lightning-losses (the package's own when it is not installed).

    Example:
        >>> import lightning_losses
        >>> version() == lightning_losses.__version__
        True
    """
    try:
        return metadata.version(PROG)
    except metadata.PackageNotFoundError:  # pragma: no cover (a source tree on sys.path)
        from lightning_losses import __version__

        return __version__


def lightning_epilog() -> str:
    """What ``fit --help`` (and ``validate``/``test``/``predict``) says below the options.

    Example:
        >>> text = lightning_epilog()
        >>> "digits_focal" in text and "gamma_ce" in text
        True
    """
    return (
        f"Shipped configs (--config NAME, or the path of a file): {', '.join(config_names())} "
        f"(the language model's: `{PROG} lm fit --help`). "
        f"Losses by registry name (--model.criterion NAME): {', '.join(BUILTIN_LOSSES)}; "
        "--model.criterion.help CLASS lists a loss's hyper-parameters. The package's callbacks "
        "and DataModules are listed under --trainer.callbacks and --data. The defaults shown "
        "are those of the packaged default config (digits, gamma-CE annealed 0 -> 1), or of "
        "the --config given. --verbose (anywhere on the command line) shows Lightning's and "
        "MLflow's own output, which is hidden by default."
    )


#: The subcommands of ``lightning-losses lm``, with their one-line summaries.
LM_COMMANDS: dict[str, str] = {
    "fit": "train the tiny language model (without --config: lm_ce)",
    "validate": "perplexity and token ECE of a checkpoint on the validation split (--ckpt_path)",
    "test": "the same on the test split (--ckpt_path; needs --data.init_args.test_fraction > 0)",
}
#: What ``lightning-losses lm --help`` and ``lm fit --help`` say above the options.
LM_DESCRIPTION = (
    "A tiny causal Transformer language model on Python's own documentation (pydoc_data.topics), "
    "trained through the chunked linear-head losses and tracked in MLflow like `lightning-losses "
    "fit`. A fit ends with the validation perplexity and token ECE, the token reliability "
    "diagram, the checkpoint folder and the MLflow run."
)


def language_model_epilog() -> str:
    """What ``lightning-losses lm fit --help`` (and ``validate``/``test``) says below the options.

    Example:
        >>> "lm_ce" in language_model_epilog() and "digits_ce" not in language_model_epilog()
        True
    """
    return (
        f"Shipped configs (--config NAME, or the path of a file): {', '.join(config_names('lm'))}. "
        "--verbose (anywhere on the command line) shows Lightning's and MLflow's own output, "
        "which is hidden by default."
    )


def language_model_parser() -> argparse.ArgumentParser:
    """The light parser of ``lightning-losses lm``: its ``--help`` lists the subcommands.

    Each subcommand parses its own arguments (a LightningCLI); this parser answers only
    ``lightning-losses lm --help`` and a missing or unknown subcommand, without torch.

    Example:
        >>> text = language_model_parser().format_help()
        >>> text.startswith("usage: lightning-losses lm"), "lm_ce" in text
        (True, True)
    """
    parser = argparse.ArgumentParser(
        prog=f"{PROG} lm",
        description=LM_DESCRIPTION,
        epilog=f"`{PROG} lm COMMAND --help` describes a command's options. "
        + language_model_epilog(),
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for name, summary in LM_COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    return parser


def language_model_usage(args: list[str]) -> int | None:
    """Answer ``lightning-losses lm`` without a subcommand to run; ``None`` when there is one.

    ``--help`` (or ``-h``) alone prints :func:`language_model_parser`'s help (exit status 0);
    no subcommand, or an unknown one, is a usage error (exit status 2) naming the subcommands.

    Example:
        >>> language_model_usage(["fit", "--config", "lm_ce"]) is None
        True
        >>> language_model_usage(["--help"])  # doctest: +ELLIPSIS
        usage: lightning-losses lm [-h] COMMAND ...
        ...
        0
    """
    command = args[0] if args else ""
    if command in LM_COMMANDS:
        return None
    parser = language_model_parser()
    if command in ("-h", "--help"):
        parser.print_help()
        return 0
    if not command or command.startswith("-"):
        parser.print_usage(sys.stderr)
        print(
            f"{parser.prog}: error: a command is required: {', '.join(LM_COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    parser.parse_args(args)  # an unknown command: argparse's error (exit status 2) names them
    return 2  # pragma: no cover (parse_args exits)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser of ``lightning-losses``: its ``--help`` lists the commands.

    Only the help and the errors for a missing or unknown command come from it; each command
    parses its own arguments.

    Example:
        >>> help_text = build_parser().format_help()
        >>> all(name in help_text for name in ("fit", "compare", "sync-tracking", "reproduce"))
        True
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=SUMMARY,
        epilog=f"`{PROG} COMMAND --help` describes a command's options.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for name, summary in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    return parser


def sync_tracking_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lightning-losses sync-tracking PATH [PATH ...]``.

    Example:
        >>> args = sync_tracking_parser().parse_args(["runs/", "--tracking-uri", "sqlite:///a.db"])
        >>> args.paths, args.tracking_uri
        (['runs/'], 'sqlite:///a.db')
    """
    parser = argparse.ArgumentParser(
        prog=f"{PROG} sync-tracking",
        description="Replay tracking calls kept while the MLflow server was unreachable.",
    )
    parser.add_argument("paths", nargs="+", help="spool files (tracking-spool.jsonl) or folders")
    parser.add_argument("--tracking-uri", default=None, help="override the recorded URI")
    return parser
