"""Checks of a ``fit|validate|test|predict`` command line that need neither torch nor Lightning.

The console script runs :func:`check_command_line` before it imports Lightning, so that the
commonest start-up errors answer at once, in one line:

- ``--config NAME`` that is neither a file nor a shipped config (and a shipped config's name
  is replaced by its file, :mod:`lightning_losses.cli.config_files`);
- ``--model.criterion NAME`` that is not a built-in loss name;
- an option whose group is not one of ``--trainer.``, ``--model.``, ``--data.``
  (``--traner.max_epochs``);
- a misspelled ``--trainer.KEY``, ``--model.KEY`` or argument of a built-in loss
  (``--trainer.max_epoch``, ``--model.hiden``, ``--model.criterion.init_args.gama``), by the
  names of the classes' source (:func:`spelling_problem`);
- a built-in loss's hyper-parameter out of its range, a ``GammaAnnealing`` whose ``start`` or
  ``end`` the loss's ``gamma`` rejects, a package callback's bounded argument out of its
  bounds, on the command line or in its configs (:func:`value_problem`), against the bounds
  the losses and callbacks check with (:mod:`lightning_losses.loss_ranges`).

What these cannot tell (a class of your own, a value that is not a number, an argument far
from every name) is left to the parser, whose errors are one line too
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
from importlib import resources
from pathlib import Path
from typing import Any

from lightning_losses.cli.commands import PROG
from lightning_losses.cli.config_files import resolve_config_args
from lightning_losses.cli.option_names import (
    callback_arguments,
    classifier_arguments,
    data_arguments,
    loss_arguments,
    misspelled,
    trainer_arguments,
)
from lightning_losses.loss_names import BUILTIN_LOSSES, unknown_loss_message
from lightning_losses.loss_ranges import (
    CALLBACK_COUNTS,
    CALLBACK_RANGES,
    LOSS_RANGES,
    count_message,
    range_message,
)

__all__ = [
    "CRITERION_OPTION",
    "OPTION_GROUPS",
    "UsageError",
    "check_command_line",
    "checkpoint_problem",
    "spelling_problem",
    "store_error_message",
    "store_errors_in_one_line",
    "value_problem",
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
        elif index + 1 < len(args) and (
            not args[index + 1].startswith("-") or _number(args[index + 1]) is not None
        ):
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
    configs = _configs(args)
    problem = spelling_problem(args, configs) or value_problem(args, configs)
    if problem is not None:
        raise UsageError(problem)
    return args


# --- values out of the losses' ranges (lightning_losses.loss_ranges) -----------------------

#: The packaged config a command without ``--config`` runs (as lightning_losses.cli.fit's).
_DEFAULT_CONFIG = "default_config.yaml"
#: The registry name of each built-in loss class (``FocalLoss`` -> ``focal``).
_REGISTRY_NAMES = {class_name: name for name, class_name in BUILTIN_LOSSES.items()}
_CRITERION_KEYS = (f"{CRITERION_OPTION}.init_args.", f"{CRITERION_OPTION}.")
_CALLBACKS_OPTION = "--trainer.callbacks"
_CALLBACK_KEYS = (f"{_CALLBACKS_OPTION}.init_args.", f"{_CALLBACKS_OPTION}.")
#: The schedule of a loss's ``gamma``, and its arguments that are values of that ``gamma``.
_GAMMA_SCHEDULE = "lightning_losses.callbacks.GammaAnnealing"


def _yaml(text: str) -> Any:
    """``text`` as YAML (what jsonargparse reads a value or a config file as); ``None`` if not."""
    import yaml  # jsonargparse's own dependency, light (no torch)

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def _configs(args: Sequence[str]) -> list[dict[str, Any]]:
    """The config files ``args`` name (shipped names resolved), else the packaged default."""
    try:
        args = resolve_config_args(list(args))
    except ValueError:  # an unknown name: check_command_line's error
        return []
    paths = [
        args[index + 1]
        for index, arg in enumerate(args[:-1])
        if arg in ("-c", "--config") and args[index + 1] != "-"
    ] + [arg.removeprefix("--config=") for arg in args if arg.startswith("--config=")]
    if not paths and not any(arg in ("-h", "--help") for arg in args):
        paths = [str(resources.files("lightning_losses") / _DEFAULT_CONFIG)]
    configs = []
    for path in paths:
        try:
            config = _yaml(Path(path).read_text())
        except OSError:
            continue
        if isinstance(config, dict):
            configs.append(config)
    return configs


def _number(value: Any) -> float | None:
    """A real number given as one (YAML's ``1e12`` is a string): ``float``; else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _loss_name(spec: Any) -> str | None:
    """The registry name of a criterion given by name or ``class_path`` (built-ins only)."""
    path = spec.get("class_path") if isinstance(spec, dict) else spec
    if not isinstance(path, str):
        return None
    if path in BUILTIN_LOSSES:
        return path
    module, _, name = path.rpartition(".")
    if module.split(".")[0] != "lightning_losses":
        return None
    return _REGISTRY_NAMES.get(name)


def _criterion(configs: list[dict[str, Any]], args: Sequence[str]) -> tuple[str | None, dict]:
    """The built-in loss the command would build and the ``init_args`` it would be given."""
    name, init_args = None, {}
    for config in configs:
        spec = (config.get("model") or {}).get("criterion") if config.get("model") else None
        if spec is not None:
            name = _loss_name(spec)
            given = spec.get("init_args") if isinstance(spec, dict) else None
            init_args = dict(given) if isinstance(given, dict) else {}
    for option, value in _options(args):
        if option in (CRITERION_OPTION, f"{CRITERION_OPTION}.class_path"):
            chosen = _loss_name(value)
            if chosen != name:  # another class: the config's arguments are not checked
                name, init_args = chosen, {}
        elif option.startswith(_CRITERION_KEYS) and value is not None:
            key = option.removeprefix(_CRITERION_KEYS[0]).removeprefix(_CRITERION_KEYS[1])
            init_args[key] = _yaml(value)
    return name, init_args


def _callbacks(configs: list[dict[str, Any]], args: Sequence[str]) -> list[dict] | None:
    """The callbacks of the configs and of ``--trainer.callbacks+=``; ``None`` if replaced."""
    callbacks: list[dict] = []
    for config in configs:
        given = (config.get("trainer") or {}).get("callbacks") if config.get("trainer") else None
        if isinstance(given, list):
            callbacks = [dict(c) if isinstance(c, dict) else {} for c in given]
    for option, value in _options(args):
        if option == f"{_CALLBACKS_OPTION}+" and value is not None:
            callbacks.append({"class_path": value, "init_args": {}})
        elif option == _CALLBACKS_OPTION:
            return None  # a new list: the parser's to read
        elif option.startswith(_CALLBACK_KEYS) and value is not None and callbacks:
            key = option.removeprefix(_CALLBACK_KEYS[0]).removeprefix(_CALLBACK_KEYS[1])
            last = callbacks[-1]
            last["init_args"] = {**(last.get("init_args") or {}), key: _yaml(value)}
    return callbacks


def _group_spelling(option: str, classifier: bool, data: str | None) -> str | None:
    """The option meant by a misspelled ``--trainer.KEY``, ``--model.KEY`` or ``--data.KEY``."""
    group, _, rest = option.removeprefix("--").partition(".")
    if group == "trainer":
        accepted = trainer_arguments()
    elif group == "model" and classifier:
        accepted = classifier_arguments()
    elif group == "data" and data is not None:
        if rest.startswith("init_args."):
            group, rest = "data.init_args", rest.removeprefix("init_args.")
        accepted = data_arguments(data)
    else:
        return None
    close = misspelled(rest.split(".")[0], accepted)
    return None if close is None else f"--{group}.{close}"


def _callback_spelling(option: str, callback: str | None) -> str | None:
    """The error of ``--trainer.callbacks.KEY`` naming no argument of ``callback``, if close."""
    key = option.removeprefix(_CALLBACK_KEYS[0]).removeprefix(_CALLBACK_KEYS[1])
    accepted = callback_arguments(callback) if callback else None
    close = misspelled(key, accepted) if "." not in key else None
    if close is None:
        return None
    name = str(callback).rpartition(".")[2]
    return f"{option}: {name} has no argument {key!r}; did you mean {close}?"


def _last_callback(configs: list[dict[str, Any]]) -> str | None:
    """The class path of the configs' last callback (what ``--trainer.callbacks.KEY`` sets)."""
    callbacks = _callbacks(configs, [])
    return str(callbacks[-1].get("class_path") or "") or None if callbacks else None


def _out_of_range(name: str, values: Any, loss: str) -> str | None:
    """The loss's message for a value (or a sequence's first value) of ``name`` out of range."""
    bounds = LOSS_RANGES.get(loss, {}).get(name)
    if bounds is None:
        return None
    for value in values if isinstance(values, list) else [values]:
        number = _number(value)
        message = None if number is None else range_message(name, number, **bounds)
        if message is not None:
            return message
    return None


def _schedule_problem(index: int, callback: dict, loss: str) -> str | None:
    """A ``GammaAnnealing`` whose ``start`` or ``end`` is a ``gamma`` the loss rejects."""
    path = str(callback.get("class_path", ""))
    init_args = callback.get("init_args") or {}
    if path.rpartition(".")[2] != _GAMMA_SCHEDULE.rpartition(".")[2]:
        return None
    if not path.startswith("lightning_losses.") or init_args.get("losses"):
        return None
    if init_args.get("attribute", "criterion") != "criterion":
        return None
    until = init_args.get("until", 1.0)
    reached = {  # the values the schedule surely takes: at its first and its last step
        "start": init_args.get("begin", 0) in (0, 0.0),
        "end": isinstance(until, float) and until <= 1.0,  # a fraction of the training
    }
    for argument, surely in reached.items():
        if not surely or argument not in init_args:
            continue
        message = _out_of_range("gamma", init_args[argument], loss)
        if message is not None:
            return (
                f"trainer.callbacks[{index}]: GammaAnnealing: {argument}={init_args[argument]!r} "
                f"is a value of the criterion's gamma, which {BUILTIN_LOSSES[loss]} rejects: "
                f"{message}"
            )
    return None


def _classifier(configs: list[dict[str, Any]]) -> bool:
    """Whether the model is ``ClassifierModule`` (no config names a model ``class_path``)."""
    return not any(
        isinstance(config.get("model"), dict) and "class_path" in config["model"]
        for config in configs
    )


def _data_class(configs: list[dict[str, Any]], args: Sequence[str]) -> str | None:
    """The class name of a DataModule of the package the command would build, if one is."""
    path = None
    for config in configs:
        data = config.get("data")
        if isinstance(data, dict) and isinstance(data.get("class_path"), str):
            path = data["class_path"]
    for option, value in _options(args):
        if option in ("--data", "--data.class_path") and value is not None:
            path = value
    if not path or not path.startswith("lightning_losses.data."):
        return None
    return path.rpartition(".")[2]


def spelling_problem(
    args: Sequence[str], configs: list[dict[str, Any]] | None = None
) -> str | None:
    """A misspelled ``--trainer.KEY``, ``--model.KEY``, ``--data.KEY`` or loss argument.

    The names are read from the classes' source (:mod:`lightning_losses.cli.option_names`);
    only a name close to an argument (``max_epoch``) is refused, with that argument.

    Example:
        >>> spelling_problem(["fit", "--trainer.max_epoch=2"])
        'unrecognized argument --trainer.max_epoch=2; did you mean --trainer.max_epochs?'
    """
    configs = _configs(args) if configs is None else configs
    classifier = _classifier(configs)
    loss, _ = _criterion(configs, args) if classifier else (None, {})
    loss_names = loss_arguments(BUILTIN_LOSSES[loss]) if loss else None
    data = _data_class(configs, args)
    callback = _last_callback(configs)  # the class that --trainer.callbacks.KEY sets
    for index, arg in enumerate(args):
        option, _, value = arg.partition("=")
        given = arg if "=" in arg or index + 1 >= len(args) else f"{arg} {args[index + 1]}"
        if option in (_CALLBACKS_OPTION, f"{_CALLBACKS_OPTION}+"):
            value = value if "=" in arg else (args[index + 1] if index + 1 < len(args) else "")
            callback = value if option.endswith("+") else None
            continue
        if option.startswith(_CALLBACK_KEYS):
            message = _callback_spelling(option, callback)
            if message is not None:
                return message
            continue
        if option.startswith(_CRITERION_KEYS) and loss_names is not None:
            key = option.removeprefix(_CRITERION_KEYS[0]).removeprefix(_CRITERION_KEYS[1])
            close = misspelled(key, loss_names)
            if close is not None and "." not in key:
                return (
                    f"{option}: {BUILTIN_LOSSES[loss or '']} has no argument {key!r}; did you "
                    f"mean {close}?"
                )
            continue
        suggestion = _group_spelling(option, classifier, data)
        if suggestion is not None:
            return f"unrecognized argument {given}; did you mean {suggestion}?"
    return None


def value_problem(args: Sequence[str], configs: list[dict[str, Any]] | None = None) -> str | None:
    """A loss or callback argument out of its range, in the command line or its configs.

    Reads the configs (``--config``, else the packaged default) and the command line's
    ``--model.criterion...`` and ``--trainer.callbacks...`` options as the parser would,
    without importing torch, and checks the built-in loss's real-valued hyper-parameters, the
    ``start``/``end`` of a ``GammaAnnealing`` of its ``gamma`` and the package callbacks'
    bounded arguments against :mod:`lightning_losses.loss_ranges`: the bounds the losses' and
    callbacks' own checks use, so the message is the one they would give; ``None`` if none.
    What it cannot tell (a loss of your own, a value that is not a number, a schedule that may
    end before its ``end``) is left to the parser and the constructors.

    Example:
        >>> value_problem(["fit", "--config=digits_focal", "--model.criterion.init_args.gamma=-1"])
        'model.criterion: FocalLoss: gamma must lie in [0, inf); got -1.0'
        >>> value_problem(["fit", "--model.criterion=focal", "--model.criterion.gamma=2"]) is None
        True
    """
    configs = _configs(args) if configs is None else configs
    # a language model's config has its loss under model.init_args: not read here
    loss, init_args = _criterion(configs, args) if _classifier(configs) else (None, {})
    for name, value in init_args.items() if loss is not None else ():
        message = _out_of_range(name, value, loss or "")
        if message is not None:
            return f"model.criterion: {BUILTIN_LOSSES[loss or '']}: {message}"
    for index, callback in enumerate(_callbacks(configs, args) or []):
        message = _callback_problem(callback)
        if message is not None:
            return f"trainer.callbacks[{index}]: {message}"
        message = _schedule_problem(index, callback, loss) if loss is not None else None
        if message is not None:
            return message
    return None


def _callback_problem(callback: dict) -> str | None:
    """``CLASS: MESSAGE`` for a package callback's argument out of its bounds; else ``None``."""
    path = str(callback.get("class_path", ""))
    name = path.rpartition(".")[2]
    if not path.startswith("lightning_losses."):
        return None
    init_args = callback.get("init_args") or {}
    for argument, bounds in CALLBACK_RANGES.get(name, {}).items():
        number = _number(init_args.get(argument))
        message = None if number is None else range_message(argument, number, **bounds)
        if message is not None:
            return f"{name}: {message}"
    for argument, counts in CALLBACK_COUNTS.get(name, {}).items():
        value = init_args.get(argument)
        if isinstance(value, int) and not isinstance(value, bool):
            message = count_message(argument, value, **counts)
            if message is not None:
                return f"{name}: {message}"
    return None


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
