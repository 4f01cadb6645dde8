"""Checks of a ``fit|validate|test|predict`` command line that need neither torch nor Lightning.

The console script runs :func:`check_command_line` before it imports Lightning, so that the
commonest start-up errors answer at once, in one line:

- ``--config NAME`` that is neither a file nor a shipped config (and a shipped config's name
  is replaced by its file, :mod:`lightning_losses.config_files`);
- ``--model.criterion NAME`` that is not a built-in loss name;
- an option whose group is not one of ``--trainer.``, ``--model.``, ``--data.``
  (``--traner.max_epochs``).

What needs the classes' signatures (``--model.hiden``, ``--trainer.max_epoch``, values out of
range) is left to the parser, whose errors are one line too
(:mod:`lightning_losses.cli_parser`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence

from .config_files import resolve_config_args
from .loss_names import BUILTIN_LOSSES, unknown_loss_message

__all__ = ["CRITERION_OPTION", "OPTION_GROUPS", "UsageError", "check_command_line"]

#: The groups of the dotted options of the LightningCLI subcommands (``--trainer.max_epochs``).
OPTION_GROUPS = ("trainer", "model", "data")
#: The option that chooses the loss.
CRITERION_OPTION = "--model.criterion"


class UsageError(ValueError):
    """A command line the CLI would reject; the message is one line."""


def _options(args: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    """Each ``--option`` of ``args`` with its value (``--a=b``, ``--a b``; ``None`` if none)."""
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        option, equals, value = arg.partition("=")
        if equals:
            yield option, value
        elif index + 1 < len(args) and not args[index + 1].startswith("-"):
            yield option, args[index + 1]
        else:
            yield option, None


def _check_group(option: str) -> None:
    key = option[2:]
    group, dot, rest = key.partition(".")
    if not dot or group in OPTION_GROUPS:
        return
    close = difflib.get_close_matches(group, OPTION_GROUPS, n=1)
    hint = f"did you mean --{close[0]}.{rest}?" if close else ""
    if not hint:
        hint = f"options with a dot start with {', '.join(f'--{g}.' for g in OPTION_GROUPS)}"
    raise UsageError(f"unrecognized argument {option}; {hint}")


def _check_criterion(value: str) -> None:
    if any(mark in value for mark in ("{", ":", "\n")) or value in BUILTIN_LOSSES:
        return  # an inline YAML/JSON mapping is the parser's to check
    if "." in value:
        raise UsageError(
            f"{CRITERION_OPTION}={value}: {CRITERION_OPTION} takes a registry name "
            f"({', '.join(BUILTIN_LOSSES)}); for a class, give "
            f"{CRITERION_OPTION}.class_path={value}"
        )
    raise UsageError(f"{CRITERION_OPTION}={value}: {unknown_loss_message(value, BUILTIN_LOSSES)}")


def check_command_line(args: Sequence[str]) -> list[str]:
    """Check a LightningCLI command line (from the subcommand on); return it, configs resolved.

    A bare ``--model.criterion`` name must be one of the built-in names here (a loss of your
    own: ``--model.criterion.class_path=my_package.MyLoss``; from Python,
    :func:`lightning_losses.cli.main` takes the names :func:`~lightning_losses.register_loss`
    added).

    Raises:
        UsageError: one line naming the argument and, where there is one, the closest name.

    Example:
        >>> check_command_line(["fit", "--model.criterion=focal", "--trainer.max_epochs=2"])
        ['fit', '--model.criterion=focal', '--trainer.max_epochs=2']
        >>> check_command_line(["fit", "--model.criterion", "focall"])
        Traceback (most recent call last):
        ...
        lightning_losses.cli_checks.UsageError: --model.criterion=focall: unknown loss name \
'focall'; did you mean 'focal'? (available: adafocal, adaptive_focal, binary_focal, \
binary_hard_truncated, binary_soft_truncated, ce, exact, focal, gamma_ce, hard_truncated, \
multilabel_ce, nm_ce, soft_accuracy, soft_truncated)
        >>> check_command_line(["fit", "--traner.max_epochs=2"])
        Traceback (most recent call last):
        ...
        lightning_losses.cli_checks.UsageError: unrecognized argument --traner.max_epochs; \
did you mean --trainer.max_epochs?
    """
    try:
        args = resolve_config_args(list(args))
    except ValueError as error:
        raise UsageError(str(error)) from None
    for option, value in _options(args):
        _check_group(option)
        if option == CRITERION_OPTION and value is not None:
            _check_criterion(value)
    return args
