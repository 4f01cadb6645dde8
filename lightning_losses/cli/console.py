"""The ``lightning-losses`` console script: a light dispatcher over the commands.

``lightning-losses COMMAND ...`` imports the module of ``COMMAND`` only when it runs, so that
``lightning-losses --help``, ``lightning-losses lm --help`` and ``lightning-losses
compare|sync-tracking|reproduce --help`` answer without importing torch, Lightning or MLflow:

- ``fit``, ``validate``, ``test``, ``predict`` (and top-level options such as ``--config``):
  :func:`lightning_losses.cli.fit.main` (LightningCLI);
- ``lm fit|validate|test``: :func:`lightning_losses.lm.cli.main` (the language model's
  LightningCLI), after the light checks of its command line;
- ``compare``: :func:`lightning_losses.compare.cli.main`;
- ``sync-tracking``: :func:`lightning_losses.tracking.sync_paths`, after the light parser
  :func:`lightning_losses.cli.commands.sync_tracking_parser`;
- ``reproduce``: :func:`lightning_losses.reproduce.cli.main`.

This module sits above everything it dispatches to: no module of the package imports it.
``python -m lightning_losses.cli.console ...`` is the console script.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lightning_losses.cli.checks import check_command_line
from lightning_losses.cli.commands import (
    COMMANDS,
    LIGHTNING_COMMANDS,
    PROG,
    build_parser,
    language_model_usage,
    sync_tracking_parser,
    version,
)
from lightning_losses.cli.config_files import check_config_programs, language_model_args

__all__ = ["console_main"]


def _sync_tracking(args: list[str]) -> int:
    options = sync_tracking_parser().parse_args(args)
    from lightning_losses.cli.sync import sync_paths

    return sync_paths(options.paths, options.tracking_uri)


def _compare(args: list[str]) -> int:
    from lightning_losses.compare.cli import main

    return main(args)


def _reproduce(args: list[str]) -> int:
    from lightning_losses.reproduce.cli import main

    return main(args)


def _lightning(args: list[str], from_command_line: bool) -> int:
    """Run a LightningCLI command after the light checks (:mod:`lightning_losses.cli.checks`)."""
    try:
        args = check_command_line(args)
        check_config_programs(args, "fit")  # not a language model's config
    except ValueError as error:  # one line, before Lightning is imported
        command = f"{PROG} {args[0]}" if args[0] in LIGHTNING_COMMANDS else PROG
        print(f"{command}: error: {error}", file=sys.stderr)
        return 2
    from lightning_losses.cli.fit import main

    if from_command_line:  # LightningCLI reads sys.argv itself when run from the command line
        sys.argv[1:] = args
        main(None)
    else:
        main(args)
    return 0


def _language_model(args: list[str]) -> int:
    """``lightning-losses lm ...``: help without torch, light checks, then the LM's CLI."""
    answered = language_model_usage(args)
    if answered is not None:
        return answered
    try:
        args = check_command_line(language_model_args(args))
    except ValueError as error:  # one line, before Lightning is imported
        print(f"{PROG} lm {args[0]}: error: {error}", file=sys.stderr)
        return 2
    from lightning_losses.lm.cli import main

    main(args)
    return 0


def console_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lightning-losses`` console script; returns the exit status.

    Args:
        argv: the arguments after the program name; ``None``: the command line
            (``sys.argv[1:]``).

    Without a command, or with ``-h``/``--help`` alone, prints the list of commands;
    ``--version`` prints ``lightning-losses VERSION``; an unknown command is a usage error
    (exit status 2) naming the commands.

    Example:
        >>> console_main(["--help"])  # doctest: +ELLIPSIS
        usage: lightning-losses [-h] [--version] COMMAND ...
        ...
        0
    """
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0] if args else ""
    if command == "--version":
        print(f"{PROG} {version()}")
        return 0
    if command == "sync-tracking":
        return _sync_tracking(args[1:])
    if command == "compare":
        return _compare(args[1:])
    if command == "reproduce":
        return _reproduce(args[1:])
    if command == "lm":
        return _language_model(args[1:])
    if command in LIGHTNING_COMMANDS or (
        command.startswith("-") and command not in ("-h", "--help")
    ):
        return _lightning(args, from_command_line=argv is None)
    parser = build_parser()
    if command in ("-h", "--help"):
        parser.print_help()
        return 0
    if not command:
        parser.print_usage(sys.stderr)
        print(
            f"{parser.prog}: error: a command is required: {', '.join(COMMANDS)}", file=sys.stderr
        )
        return 2
    parser.parse_args(args)  # an unknown command: argparse's error (exit status 2) names them
    return 2  # pragma: no cover (parse_args exits)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console_main())
