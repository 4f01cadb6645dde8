"""The parser of ``lightning-losses fit|validate|test|predict``: one-line errors, short help.

:class:`LossesArgumentParser` is LightningCLI's parser with two changes:

- an error is one line on stderr, ``lightning-losses fit: error: MESSAGE``, with ``did you mean
  X?`` where a close name exists (an option, or an attribute of a ``class_path``'s module),
  and exit status 2, instead of the usage (about 60 lines) and a multi-line message;
- ``--help`` is short (:class:`LossesHelpFormatter`): the first sentence of each option's
  help, and in the lists of known subclasses only this package's classes.

``JSONARGPARSE_DEBUG=1`` keeps jsonargparse's own errors (with tracebacks).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from jsonargparse import DefaultHelpFormatter, add_instantiator
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser

from lightning_losses.cli.commands import LIGHTNING_COMMANDS, PROG
from lightning_losses.loss_names import BUILTIN_LOSSES

__all__ = [
    "UNRECOGNIZED",
    "LossesArgumentParser",
    "LossesHelpFormatter",
    "compact_default",
    "config_key",
    "constructor_errors_in_one_line",
    "first_sentence",
    "help_requested",
    "innermost_cause",
    "one_line",
    "subcommand_parser",
    "union_errors",
    "usage_error",
]

#: How argparse (and jsonargparse) begin the message for options no parser knows.
UNRECOGNIZED = "unrecognized arguments: "
#: Exit status of a usage error (as for argparse's errors).
USAGE_ERROR = 2
#: The known subclasses ``--help`` lists for an option: the classes of these modules only.
_LISTED = {"model.backbone": "lightning_losses.lightning.backbones."}
_PACKAGE = "lightning_losses."


def usage_error(command: str | None, message: str) -> NoReturn:
    """Print ``lightning-losses COMMAND: error: MESSAGE`` on stderr and exit with status 2."""
    from lightning_losses.cli.moved import moved_hint

    prog = f"{PROG} {command}" if command else PROG
    print(f"{prog}: error: {moved_hint(message)}", file=sys.stderr)
    raise SystemExit(USAGE_ERROR)


def innermost_cause(error: BaseException) -> BaseException:
    """The last exception of ``error``'s ``__cause__`` chain (``error`` itself if it has none)."""
    seen = {id(error)}
    while error.__cause__ is not None and id(error.__cause__) not in seen:
        error = error.__cause__
        seen.add(id(error))
    return error


def first_sentence(text: str) -> str:
    r"""The first sentence of a help text, on one line, with RST's double backquotes single.

    Example:
        >>> first_sentence("Stop after N epochs. Disabled by default (``None``).")
        'Stop after N epochs.'
        >>> first_sentence("Set it, e.g. to 2.\nMore here.")
        'Set it, e.g. to 2.'
    """
    words = " ".join(text.split()).replace("``", "`")
    end = 0
    while True:
        end = words.find(". ", end)
        if end < 0:
            return words
        if not words[:end].endswith(("e.g", "i.e", "etc", "vs")):
            return words[: end + 1]
        end += 2


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> Any:
    """The parser of subcommand ``name`` of ``parser`` (``None`` if it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [option for action in parser._actions for option in action.option_strings]


class LossesArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, with one-line errors and a short ``--help``.

    Example:
        >>> import contextlib
        >>> parser = LossesArgumentParser(prog="lightning-losses fit", allow_abbrev=False)
        >>> _ = parser.add_argument("--epochs", type=int)
        >>> with contextlib.redirect_stderr(sys.stdout):
        ...     try:
        ...         parser.parse_args(["--epoch=2"])
        ...     except SystemExit as stop:
        ...         print("exit status", stop.code)
        lightning-losses fit: error: unrecognized arguments: --epoch=2; did you mean --epochs?
        exit status 2
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", LossesHelpFormatter)
        super().__init__(*args, **kwargs)

    def _command(self) -> str | None:
        """The subcommand being parsed, from the program name or the arguments."""
        words = [*reversed(self.prog.split()), *(getattr(self, "args", None) or [])]
        return next((word for word in words if word in LIGHTNING_COMMANDS), None)

    def _suggestion(self, message: str, cause: BaseException | None, command: str | None) -> str:
        """``"; did you mean X?"`` for a misspelled option or class name, else ``""``."""
        if message.startswith(UNRECOGNIZED):
            unknown = [arg for arg in message[len(UNRECOGNIZED) :].split() if arg.startswith("-")]
            parser = (subcommand_parser(self, command) if command else None) or self
            options = _option_strings(parser)
            for arg in unknown:
                close = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1)
                if close:
                    return f"; did you mean {close[0]}?"
            return ""
        name, owner = getattr(cause, "name", None), getattr(cause, "obj", None)
        if isinstance(cause, AttributeError) and isinstance(name, str) and owner is not None:
            public = [attribute for attribute in dir(owner) if not attribute.startswith("_")]
            close = difflib.get_close_matches(name, public, n=1)
            if close:
                return f"; did you mean {getattr(owner, '__name__', owner)}.{close[0]}?"
        return ""

    def _unknown_key_suggestion(self, message: str) -> str:
        """``"; did you mean gamma?"`` for jsonargparse's ``Option 'gama' is not accepted``.

        Raised by the parser of a class's arguments (e.g. the criterion's ``init_args``): its
        own options are the names the class accepts.
        """
        names = [option.lstrip("-") for option in _option_strings(self) if option != "--help"]
        for quoted in message.split("'")[1::2]:
            close = difflib.get_close_matches(quoted, names, n=1)
            if quoted not in names and close:
                return f"; did you mean {close[0]}?"
        return ""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """One line on stderr, ``lightning-losses COMMAND: error: ...``, and exit status 2.

        The line is :func:`one_line` of jsonargparse's message, with ``did you mean X?`` for a
        misspelled option (among the command's options, or a class's arguments) or a
        misspelled class of a ``class_path``. Parsers that do not exit on errors (those of a
        class's arguments, inside the command's parser) raise as jsonargparse's do, with the
        suggestion added to the message.
        """
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            if isinstance(ex, KeyError):  # an unknown key among a class's arguments
                message = str(message) + self._unknown_key_suggestion(str(message))
            super().error(message, ex)
        cause = innermost_cause(ex) if ex is not None else None
        text = one_line(str(message), cause)
        command = self._command()
        usage_error(command, text + self._suggestion(text, cause, command))


def union_errors(message: str) -> list[str]:
    """The errors listed under ``Errors:`` in jsonargparse's message for a Union type.

    Each error is one line (its continuation lines joined).

    Example:
        >>> message = [
        ...     'Parser key "model.criterion":',
        ...     "  Errors:",
        ...     "    - Expected a <class 'str'>",
        ...     "    - Problem with given class_path 'a.B':",
        ...     "        Option 'gama' is not accepted",
        ...     "  Given value type: <class 'str'>",
        ... ]
        >>> for error in union_errors(chr(10).join(message)):
        ...     print(error)
        Expected a <class 'str'>
        Problem with given class_path 'a.B': Option 'gama' is not accepted
    """
    lines = message.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Errors:"), None)
    if start is None:
        return []
    errors: list[str] = []
    indent = None
    for line in lines[start + 1 :]:
        text = line.strip()
        if not text:
            continue
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        if depth < indent:
            break
        if depth == indent and text.startswith("- "):
            errors.append(text[2:])
        elif errors:
            errors[-1] += " " + text
    return errors


def one_line(message: str, cause: BaseException | None = None) -> str:
    """A (often multi-line) error message of jsonargparse as one line that names the key.

    The first line (``Parser key "trainer.max_epochs":``), then for a Union type the first
    error that is not a plain type mismatch (``Expected a <class 'str'>``) among the types
    tried, else the first line of the innermost cause.

    Example:
        >>> message = ['Parser key "trainer.max_epochs":', "  Errors:", "    - Expected an int"]
        >>> one_line(chr(10).join(message))
        'Parser key "trainer.max_epochs": Expected an int'
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "invalid arguments"
    if len(lines) == 1:
        return lines[0]
    errors = union_errors(message)
    if errors:
        detail = next((e for e in errors if not e.startswith("Expected a ")), errors[0])
    elif cause is not None:
        detail = next((line.strip() for line in str(cause).splitlines() if line.strip()), "")
    else:
        detail = lines[1]
    return f"{lines[0].rstrip(':')}: {detail}" if detail else lines[0]


class LossesHelpFormatter(DefaultHelpFormatter):
    """Help with the first sentence of each option's help and this package's subclasses only.

    LightningCLI's help is LightningCLI's parser's (every Trainer argument with its full
    docstring) and lists every known subclass, about a hundred ``torch.nn`` classes for
    ``--model.criterion`` alone: 1,483 lines. Here ``--model.criterion`` lists the registry's
    names and the package's losses, ``--trainer.callbacks`` and ``--data`` the package's
    callbacks and DataModules, and other options no subclasses (``--KEY.help CLASS`` describes
    any class).
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action)
        original = action.help or ""
        if not isinstance(original, str) or not text.startswith(original):
            return text
        rest = text[len(original) :]
        extra_help = getattr(action, "extra_help", None)
        extra = extra_help() if callable(extra_help) else ""
        if extra and extra in rest:
            rest = rest.replace(extra, self._subclasses(action.dest, extra))
        # jsonargparse sets action.default to the default shown (the config's) meanwhile.
        shown = compact_default(action.default)
        if shown is not None:
            rest = rest.replace("%(default)s", shown)
        return first_sentence(original) + rest

    @staticmethod
    def _subclasses(dest: str, extra: str) -> str:
        """The package's part of jsonargparse's ``", known subclasses: a, b, ..."``."""
        paths = [path.strip() for path in extra.split(":", 1)[-1].split(",")]
        if dest == "model.criterion":
            losses = set(BUILTIN_LOSSES.values())
            classes = [
                path
                for path in paths
                if path.startswith(_PACKAGE) and path.rsplit(".", 1)[-1] in losses
            ]
            return (
                f", a registry name: {', '.join(BUILTIN_LOSSES)}; or the class_path of any "
                f"torch.nn.Module, e.g. {', '.join(classes)}"
            )
        prefix = _LISTED.get(dest, _PACKAGE)
        ours = [path for path in paths if path.startswith(prefix)]
        return f", known subclasses of lightning-losses: {', '.join(ours)}" if ours else ""


def compact_default(value: Any) -> str | None:
    """A class default as ``Name(arg=value, ...)``, a list of them as ``[Name, ...]``.

    ``None`` for any other value (shown as jsonargparse shows it).

    Example:
        >>> compact_default({"class_path": "torch.optim.Adam", "init_args": {"lr": 0.003}})
        'Adam(lr=0.003)'
        >>> compact_default([{"class_path": "a.Annealing"}, {"class_path": "b.Checkpoint"}])
        '[Annealing, Checkpoint]'
        >>> compact_default(20) is None
        True
    """
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, list) and value:
        names = [compact_default(item) for item in value]
        if all(names):
            return "[" + ", ".join(str(name).split("(", 1)[0] for name in names) + "]"
        return None
    if not isinstance(value, dict) or not isinstance(value.get("class_path"), str):
        return None
    init_args = value.get("init_args") or {}
    arguments = ", ".join(f"{key}={argument!r}" for key, argument in init_args.items())
    return f"{value['class_path'].rsplit('.', 1)[-1]}({arguments})"


def help_requested(args: Sequence[str]) -> bool:
    """Whether ``args`` ask for a command's help (``-h`` or ``--help``)."""
    return any(arg in ("-h", "--help") for arg in args)


def _first_line(error: BaseException) -> str:
    """The first non-empty line of an error's message (its type's name if it has none)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _class_entries(config: Any, prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Each ``(key, {"class_path", "init_args"})`` entry of a config, depth first."""
    if hasattr(config, "as_dict"):
        config = config.as_dict()
    if isinstance(config, dict):
        if "class_path" in config:
            yield prefix, config
        items: Iterator[tuple[str, Any]] = iter(config.items())
        join = "{prefix}.{key}" if prefix else "{key}"
    elif isinstance(config, list):
        items = ((f"[{index}]", value) for index, value in enumerate(config))
        join = "{prefix}{key}"
    else:
        return
    for key, value in items:
        yield from _class_entries(value, join.format(prefix=prefix, key=key))


def _equal(first: Any, second: Any) -> bool:
    """``first == second`` as a plain bool; False where that is no bool (tensors, arrays)."""
    try:
        return bool(first == second)
    except Exception:
        return False


def config_key(config: Any, class_type: type, arguments: dict[str, Any]) -> str | None:
    """The key of the config entry of ``class_type`` built with ``arguments`` (or ``None``).

    Of several entries of the class (two ``CalibrationMonitor``), the one whose ``init_args``
    equal the arguments, else the first.

    Example:
        >>> config = {"trainer": {"callbacks": [
        ...     {"class_path": "a.Monitor", "init_args": {"n_bins": 15}},
        ...     {"class_path": "a.Monitor", "init_args": {"n_bins": 0}},
        ... ]}}
        >>> Monitor = type("Monitor", (), {})
        >>> config_key(config, Monitor, {"n_bins": 0})
        'trainer.callbacks[1]'
    """
    keys = [
        (key, entry.get("init_args") or {})
        for key, entry in _class_entries(config)
        if str(entry.get("class_path", "")).rsplit(".", 1)[-1] == class_type.__name__
    ]
    for key, init_args in keys:
        if all(_equal(arguments.get(arg), value) for arg, value in init_args.items()):
            return key or None
    return (keys[0][0] or None) if keys else None


@contextmanager
def constructor_errors_in_one_line(config: Any, command: str | None) -> Iterator[None]:
    """Turn a constructor's rejection of its arguments into a one-line usage error.

    Around LightningCLI's instantiation of ``config``'s classes: a ``ValueError`` or
    ``TypeError`` (``gamma`` out of range, an unknown loss name, ...), or Lightning's
    ``MisconfigurationException``, ends the command with ``lightning-losses COMMAND: error:
    KEY: CLASS: MESSAGE`` (:func:`usage_error`, exit status 2) instead of jsonargparse's
    traceback, whose last lines list every type it tried. ``JSONARGPARSE_DEBUG=1`` keeps the
    traceback.

    The constructor's own error is taken from an instantiator registered with jsonargparse
    for every class: globally, but after the parser's own instantiators (Lightning's, for the
    model and the DataModule) and re-registered last on every call, so that it builds only the
    classes nothing else builds, as jsonargparse's default does.
    """
    failures: list[tuple[type, dict[str, Any], Exception]] = []

    def instantiate(class_type: type, *args: Any, **kwargs: Any) -> Any:
        try:
            return class_type(*args, **kwargs)
        except (ValueError, TypeError) as error:
            failures.append((class_type, kwargs, error))
            raise

    add_instantiator(instantiate, object, subclasses=True)
    try:
        yield
    except (ValueError, TypeError, MisconfigurationException) as error:
        if os.environ.get("JSONARGPARSE_DEBUG"):
            raise
        if failures:
            class_type, arguments, cause = failures[-1]
            key = config_key(config, class_type, arguments)
            where = f"{key}: " if key else ""
            message = f"{where}{class_type.__name__}: {_first_line(cause)}"
        else:
            message = one_line(str(error), innermost_cause(error))
        usage_error(command, message)
