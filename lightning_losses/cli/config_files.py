"""The configs shipped with the package, found by name (standard library and PyYAML only).

The repository's top-level ``configs/`` folder is installed as ``lightning_losses/configs``
(in a clone, ``lightning_losses/configs`` is a link to it), so that ``lightning-losses fit
--config digits_focal`` works after ``pip install`` as in a clone: a ``--config`` value that
names no file is looked up among the shipped configs of its command.

Each command runs its own configs: ``lightning-losses fit`` those of ``configs/`` (a
``ClassifierModule``), ``lightning-losses lm fit`` those of ``configs/lm/`` (the tiny language
model); ``configs/experiments/`` holds the specs of ``lightning-losses reproduce``. A config of
the other command, by name or by file, is one ``error:`` line naming the command that runs it
(:func:`check_config_programs`).
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

__all__ = [
    "CONFIG_OPTIONS",
    "PROGRAMS",
    "ConfigNotFoundError",
    "check_config_programs",
    "config_names",
    "config_program",
    "configs_folder",
    "language_model_args",
    "resolve_config",
    "resolve_config_args",
]

#: The options that take a config file.
CONFIG_OPTIONS = ("-c", "--config")
#: Each program with configs, its folder below ``configs/`` and the command that runs them.
PROGRAMS = {
    "fit": ("", "lightning-losses fit"),
    "lm": ("lm", "lightning-losses lm fit"),
}
#: The language model's config when ``lightning-losses lm fit`` is given none.
DEFAULT_LM_CONFIG = "lm_ce"
#: The module paths of the language models' classes (a config whose model is one is ``lm``'s):
#: the package's own and the Hugging Face integration's.
_LM_MODULES = ("lightning_losses.lm.", "lightning_losses.integrations.huggingface.")
_SUFFIXES = (".yaml", ".yml")
_WHAT = {"fit": "a classifier config", "lm": "a language-model config"}


class ConfigNotFoundError(ValueError):
    """A ``--config`` value that is neither a file nor the name of a shipped config."""


def configs_folder() -> Path:
    """The folder of the shipped configs (``lightning_losses/configs``)."""
    return Path(str(resources.files("lightning_losses") / "configs"))


def _check_program(program: str) -> str:
    if program not in PROGRAMS:
        raise ValueError(f"program must be one of {', '.join(PROGRAMS)}; got {program!r}")
    return program


def config_names(program: str = "fit") -> list[str]:
    """The names of the shipped configs of ``program``, sorted.

    Args:
        program: ``"fit"`` (``lightning-losses fit``: ``digits_focal``...) or ``"lm"``
            (``lightning-losses lm fit``: ``lm_ce``...).

    Example:
        >>> {"digits_focal", "digits_gamma_ce_annealed"} <= set(config_names())
        True
        >>> [name for name in config_names() if name.startswith("lm")]
        []
        >>> [name for name in config_names("lm") if name.startswith("lm_")][:2]
        ['lm_ce', 'lm_focal']
    """
    folder = configs_folder() / PROGRAMS[_check_program(program)][0]
    return sorted(
        path.stem for path in folder.glob("*") if path.suffix in _SUFFIXES and path.is_file()
    )


def _bare_name(value: str, program: str) -> str:
    """``value`` without ``./``, ``configs/``, the program's folder and the ``.yaml`` suffix."""
    name = value.replace("\\", "/").removeprefix("./").removeprefix("configs/")
    folder = PROGRAMS[program][0]
    if folder:
        name = name.removeprefix(f"{folder}/")
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def _other_program_message(value: str, program: str, other: str, name: str) -> str:
    """One line: ``value`` is a config of ``other``, run it with ``other``'s command."""
    message = f"--config {value} is {_WHAT[other]}: run `{PROGRAMS[other][1]} --config {name}`"
    if program == "lm":
        message += f" (language-model configs: {', '.join(config_names('lm'))})"
    return message


def resolve_config(value: str, program: str = "fit") -> str:
    """The file a ``--config`` value names: the path itself if it is a file, else a shipped config.

    A shipped config is named as ``digits_focal``, ``digits_focal.yaml`` or as the clone's
    path ``configs/digits_focal.yaml`` (for ``program="lm"``: ``lm_ce``, ``lm/lm_ce``,
    ``lm_ce.yaml``, ``configs/lm/lm_ce.yaml``); a file of that name in the working directory
    comes first. A value that looks like an inline YAML or JSON config (it holds ``:``, ``{``
    or a line break) is returned unchanged.

    Args:
        value: the value of ``--config``.
        program: whose configs to look among: ``"fit"`` or ``"lm"``.

    Raises:
        ConfigNotFoundError: naming the value and the closest shipped names, or, for the
            name of the other program's config, the command that runs it.

    Example:
        >>> Path(resolve_config("digits_focal")).name
        'digits_focal.yaml'
        >>> Path(resolve_config("lm/lm_ce", "lm")).as_posix().endswith("configs/lm/lm_ce.yaml")
        True
        >>> try:
        ...     resolve_config("digits_focall")
        ... except ConfigNotFoundError as error:
        ...     print(str(error).split("; ")[1])
        did you mean digits_focal? (also close: digits_adafocal, digits_ce)
        >>> try:
        ...     resolve_config("lm_ce")
        ... except ConfigNotFoundError as error:
        ...     print(error)
        --config lm_ce is a language-model config: run `lightning-losses lm fit --config lm_ce`
    """
    _check_program(program)
    if Path(value).is_file() or any(mark in value for mark in (":", "{", "\n")):
        return value
    name = _bare_name(value, program)
    names = config_names(program)
    if name in names:
        return str(configs_folder() / PROGRAMS[program][0] / f"{name}.yaml")
    for other in PROGRAMS:
        if other != program and _bare_name(value, other) in config_names(other):
            message = _other_program_message(value, program, other, _bare_name(value, other))
            raise ConfigNotFoundError(message)
    close = difflib.get_close_matches(name, names, n=3)
    hint = f"; did you mean {close[0]}?" if close else ""
    if len(close) > 1:
        hint += f" (also close: {', '.join(close[1:])})"
    raise ConfigNotFoundError(
        f"--config {value}: no such file, and no shipped config of that name{hint}; "
        f"`{PROGRAMS[program][1]} --help` lists the shipped configs"
    )


def resolve_config_args(args: list[str], program: str = "fit") -> list[str]:
    """``args`` with the value of each ``--config``/``-c`` resolved by :func:`resolve_config`.

    Example:
        >>> args = resolve_config_args(["fit", "--config=digits_ce", "--trainer.max_epochs=1"])
        >>> args[1].startswith("--config="), args[1].endswith("digits_ce.yaml"), args[2]
        (True, True, '--trainer.max_epochs=1')
    """
    resolved = list(args)
    for index, arg in enumerate(resolved):
        if arg in CONFIG_OPTIONS and index + 1 < len(resolved):
            resolved[index + 1] = resolve_config(resolved[index + 1], program)
        elif arg.startswith("--config="):
            value = arg.removeprefix("--config=")
            resolved[index] = "--config=" + resolve_config(value, program)
    return resolved


def _config_values(args: list[str]) -> list[str]:
    """The values of ``--config``/``-c`` in ``args``, in order."""
    values = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg in CONFIG_OPTIONS]
    values += [arg.removeprefix("--config=") for arg in args if arg.startswith("--config=")]
    return values


def config_program(path: str | Path) -> str | None:
    """Which program runs the config file ``path``: ``"lm"``, ``"fit"`` or ``None`` (unknown).

    ``"lm"`` when its ``model`` is a ``class_path`` of :mod:`lightning_losses.lm` (the
    language model) or of the Hugging Face integration (``HFCausalLM``), ``"fit"`` when its
    ``model`` is a mapping of ``ClassifierModule``'s
    arguments (no ``class_path``, or ``ClassifierModule``'s); ``None`` for a file that is
    not YAML or names no model (the parser has the last word on those).

    Example:
        >>> config_program(configs_folder() / "lm" / "lm_ce.yaml")
        'lm'
        >>> config_program(configs_folder() / "digits_ce.yaml")
        'fit'
    """
    import yaml

    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict):
        return None
    class_path = str(model.get("class_path") or "")
    if class_path.startswith(_LM_MODULES):
        return "lm"
    if not class_path or class_path.endswith("ClassifierModule"):
        return "fit"
    return None


def check_config_programs(args: list[str], program: str) -> None:
    """Refuse a ``--config`` file that the other program runs (see :func:`config_program`).

    Raises:
        ConfigNotFoundError: one line naming the file and the command that runs it.

    Example:
        >>> lm_file = str(configs_folder() / "lm" / "lm_ce.yaml")
        >>> check_config_programs(["fit", "--config", lm_file], "lm")
        >>> try:
        ...     check_config_programs(["fit", "--config", lm_file], "fit")
        ... except ConfigNotFoundError as error:
        ...     print(str(error).split(": ")[-1].replace(lm_file, "FILE"))
        run `lightning-losses lm fit --config FILE`
    """
    _check_program(program)
    for value in _config_values(args):
        found = config_program(value) if Path(value).is_file() else None
        if found is not None and found != program:
            raise ConfigNotFoundError(_other_program_message(value, program, found, value))


def language_model_args(args: list[str]) -> list[str]:
    """A ``lightning-losses lm COMMAND ...`` command line (from ``COMMAND`` on), configs resolved.

    Each ``--config`` names a language-model config (:func:`resolve_config` with
    ``program="lm"``, then :func:`check_config_programs`); without one, the shipped
    ``lm_ce`` comes first (also for ``--help``, whose defaults are then ``lm_ce``'s).

    Raises:
        ConfigNotFoundError: one line naming the ``--config`` value.

    Example:
        >>> args = language_model_args(["fit", "--trainer.max_epochs=1"])
        >>> args[0], args[1], Path(args[2]).name, args[3]
        ('fit', '--config', 'lm_ce.yaml', '--trainer.max_epochs=1')
    """
    resolved = resolve_config_args(list(args), "lm")
    check_config_programs(resolved, "lm")
    if resolved and not _config_values(resolved[1:]):
        default = resolve_config(DEFAULT_LM_CONFIG, "lm")
        resolved = [resolved[0], "--config", default, *resolved[1:]]
    return resolved
