"""Checks of a ``fit|validate|test|predict`` command line that need neither torch nor Lightning.

The console script runs :func:`check_command_line` before it imports Lightning, so that the
commonest start-up errors answer at once, in one line:

- ``--config NAME`` that is neither a file nor a shipped config (and a shipped config's name
  is replaced by its file, :mod:`lightning_losses.cli.config_files`);
- ``--model.criterion NAME`` that is not a built-in loss name;
- an option whose group is not one of ``--trainer.``, ``--model.``, ``--data.``
  (``--traner.max_epochs``).

What needs the classes' signatures (``--model.hiden``, ``--trainer.max_epoch``, values out of
range) is left to the parser, whose errors are one line too
(:mod:`lightning_losses.cli.parser`).

Two checks of what the command line names, also without torch, serve the CLI later on:
:func:`checkpoint_problem` (is ``--ckpt_path`` a file ``torch.load`` can read, or a truncated
or empty one?) and :func:`store_errors_in_one_line` (a SQLite store that is locked or broken
while the logger is built, in one line naming the file).
"""

from __future__ import annotations

import difflib
import os
import sqlite3
import sys
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from lightning_losses.cli.commands import PROG
from lightning_losses.cli.config_files import resolve_config_args
from lightning_losses.loss_names import BUILTIN_LOSSES, unknown_loss_message

__all__ = [
    "CRITERION_OPTION",
    "OPTION_GROUPS",
    "UsageError",
    "check_command_line",
    "checkpoint_problem",
    "store_error_message",
    "store_errors_in_one_line",
]

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
    :func:`lightning_losses.cli.fit.main` takes the names :func:`~lightning_losses.register_loss`
    added).

    Raises:
        UsageError: one line naming the argument and, where there is one, the closest name.

    Example:
        >>> check_command_line(["fit", "--model.criterion=focal", "--trainer.max_epochs=2"])
        ['fit', '--model.criterion=focal', '--trainer.max_epochs=2']
        >>> check_command_line(["fit", "--model.criterion", "focall"])
        Traceback (most recent call last):
        ...
        lightning_losses.cli.checks.UsageError: --model.criterion=focall: unknown loss name \
'focall'; did you mean 'focal'? (available: adafocal, adaptive_focal, binary_focal, \
binary_hard_truncated, binary_soft_truncated, ce, dca, dual_focal, exact, focal, gamma_ce, \
hard_truncated, mbls, mdca, mmce, multilabel_ce, nm_ce, poly1, soft_accuracy, soft_truncated)
        >>> check_command_line(["fit", "--traner.max_epochs=2"])
        Traceback (most recent call last):
        ...
        lightning_losses.cli.checks.UsageError: unrecognized argument --traner.max_epochs; \
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


# --- a checkpoint file torch.load can read -------------------------------------------------

#: The first bytes of a zip archive's first entry: ``torch.save``'s format since PyTorch 1.6.
_ZIP_MAGIC = b"PK\x03\x04"
#: The first byte of a pickle of protocol 2 or more: ``torch.save``'s legacy format.
_PICKLE_MAGIC = b"\x80"


def checkpoint_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the file ``path`` is not a checkpoint ``torch.load`` can read; ``None`` if it may be.

    Reads the first bytes and, for a zip archive (what ``torch.save`` writes), its central
    directory at the end of the file, which a truncated copy or an interrupted save lacks; the
    tensors themselves are not read. An empty file, a zip archive without its end or without
    ``data.pkl``, and a file that is neither a zip archive nor a pickle are problems; a legacy
    (pickle) checkpoint is left to ``torch.load``.

    Example:
        >>> import tempfile
        >>> empty = tempfile.NamedTemporaryFile(suffix=".ckpt")
        >>> checkpoint_problem(empty.name)
        'empty: 0 bytes, as a save that failed on a full disk leaves'
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(len(_ZIP_MAGIC))
    except OSError as error:
        return f"cannot be read: {error.strerror or error}"
    if size == 0:
        return "empty: 0 bytes, as a save that failed on a full disk leaves"
    if head.startswith(_PICKLE_MAGIC):
        return None
    if head != _ZIP_MAGIC:
        return (
            f"neither a zip archive nor a pickle, the formats torch.save writes: {size} bytes "
            f"starting with {head!r}"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return (
            f"truncated or damaged: {size} bytes of a zip archive, the format torch.save "
            "writes, without the central directory that ends one"
        )
    if not any(name == "data.pkl" or name.endswith("/data.pkl") for name in names):
        return "a zip archive without data.pkl: not a file torch.save wrote"
    return None


# --- a SQLite store that cannot be used ------------------------------------------------------


def _sqlite_error(error: BaseException) -> sqlite3.Error | None:
    """The first ``sqlite3.Error`` in ``error``'s chain of causes and contexts."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, sqlite3.Error):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def store_error_message(
    error: BaseException, stores: Sequence[str | os.PathLike[str]]
) -> str | None:
    """One line for a SQLite error in ``error``'s chain, naming the store file; else ``None``.

    Args:
        error: what building the logger raised (jsonargparse wraps the logger's own error).
        stores: the database files of the SQLite stores the command uses.

    Example:
        >>> import sqlite3
        >>> try:
        ...     raise ValueError("Does not validate") from sqlite3.OperationalError("database is locked")
        ... except ValueError as error:
        ...     print(store_error_message(error, ["/runs/mlflow.db"]))  # doctest: +ELLIPSIS
        the MLflow store /runs/mlflow.db is locked by another process (sqlite3.OperationalError: database is locked): ...
    """  # noqa: E501
    cause = _sqlite_error(error)
    if cause is None:
        return None
    files = ", ".join(str(store) for store in stores) or "of the tracking URI"
    detail = f"sqlite3.{type(cause).__name__}: {str(cause).strip().splitlines()[0]}"
    option = "--trainer.logger.init_args.tracking_uri=sqlite:///OTHER.db"
    if "locked" in str(cause):
        return (
            f"the MLflow store {files} is locked by another process ({detail}): wait for that "
            f"process to end or stop it, or choose another store with {option}"
        )
    return (
        f"the MLflow store {files} cannot be used ({detail}): check the file, its folder's "
        f"free space and permissions, or choose another store with {option}"
    )


@contextmanager
def store_errors_in_one_line(
    stores: Sequence[str | os.PathLike[str]], command: str | None
) -> Iterator[None]:
    """Around the building of a command's logger: a SQLite error becomes one ``error:`` line.

    A store locked by another process (``database is locked``) or otherwise unusable ends the
    command with ``lightning-losses COMMAND: error: the MLflow store FILE ...`` naming the
    cause and the fix (:func:`store_error_message`), exit status 2, instead of jsonargparse's
    "Does not validate against any of the Union subtypes". Other errors pass unchanged, as
    does everything when ``JSONARGPARSE_DEBUG`` is set.
    """
    try:
        yield
    except Exception as error:
        message = store_error_message(error, [Path(store) for store in stores])
        if message is None or os.environ.get("JSONARGPARSE_DEBUG"):
            raise
        prog = f"{PROG} {command}" if command else PROG
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
