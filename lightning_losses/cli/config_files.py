"""The configs shipped with the package, found by name (standard library only).

The repository's top-level ``configs/`` folder is installed as ``lightning_losses/configs``
(in a clone, ``lightning_losses/configs`` is a link to it), so that ``lightning-losses fit
--config digits_focal`` works after ``pip install`` as in a clone: a ``--config`` value that
names no file is looked up among the shipped configs.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

__all__ = [
    "CONFIG_OPTIONS",
    "ConfigNotFoundError",
    "config_names",
    "configs_folder",
    "resolve_config",
    "resolve_config_args",
]

#: The options that take a config file.
CONFIG_OPTIONS = ("-c", "--config")
#: The folders (below ``configs/``) that hold ``fit`` configs; ``experiments/`` holds the specs
#: of ``lightning-losses reproduce``, not configs of ``fit``.
FIT_FOLDERS = ("", "lm")
_SUFFIXES = (".yaml", ".yml")


class ConfigNotFoundError(ValueError):
    """A ``--config`` value that is neither a file nor the name of a shipped config."""


def configs_folder() -> Path:
    """The folder of the shipped configs (``lightning_losses/configs``)."""
    return Path(str(resources.files("lightning_losses") / "configs"))


def config_names() -> list[str]:
    """The names of the shipped ``fit`` configs, sorted: ``digits_focal``, ``lm/lm_ce``...

    Example:
        >>> {"digits_focal", "digits_gamma_ce_annealed", "lm/lm_ce"} <= set(config_names())
        True
    """
    root = configs_folder()
    names = []
    for folder in FIT_FOLDERS:
        for path in sorted((root / folder).glob("*")):
            if path.suffix in _SUFFIXES and path.is_file():
                names.append(str(Path(folder, path.stem).as_posix()))
    return sorted(names)


def resolve_config(value: str) -> str:
    """The file a ``--config`` value names: the path itself if it is a file, else a shipped config.

    A shipped config is named as ``digits_focal``, ``digits_focal.yaml``, ``lm/lm_ce`` or as
    the clone's path ``configs/digits_focal.yaml``; a file of that name in the working
    directory comes first. A value that looks like an inline YAML or JSON config (it holds
    ``:``, ``{`` or a line break) is returned unchanged.

    Raises:
        ConfigNotFoundError: naming the value and the closest shipped names.

    Example:
        >>> Path(resolve_config("digits_focal")).name
        'digits_focal.yaml'
        >>> try:
        ...     resolve_config("digits_focall")
        ... except ConfigNotFoundError as error:
        ...     print(str(error).split("; ")[1])
        did you mean digits_focal? (also close: digits_adafocal, digits_ce)
    """
    if Path(value).is_file() or any(mark in value for mark in (":", "{", "\n")):
        return value
    name = value.replace("\\", "/")
    name = name.removeprefix("./").removeprefix("configs/")
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    names = config_names()
    if name in names:
        return str(configs_folder() / f"{name}.yaml")
    close = difflib.get_close_matches(name, names, n=3)
    hint = f"; did you mean {close[0]}?" if close else ""
    if len(close) > 1:
        hint += f" (also close: {', '.join(close[1:])})"
    raise ConfigNotFoundError(
        f"--config {value}: no such file, and no shipped config of that name{hint}; "
        "`lightning-losses fit --help` lists the shipped configs"
    )


def resolve_config_args(args: list[str]) -> list[str]:
    """``args`` with the value of each ``--config``/``-c`` resolved by :func:`resolve_config`.

    Example:
        >>> args = resolve_config_args(["fit", "--config=digits_ce", "--trainer.max_epochs=1"])
        >>> args[1].startswith("--config="), args[1].endswith("digits_ce.yaml"), args[2]
        (True, True, '--trainer.max_epochs=1')
    """
    resolved = list(args)
    for index, arg in enumerate(resolved):
        if arg in CONFIG_OPTIONS and index + 1 < len(resolved):
            resolved[index + 1] = resolve_config(resolved[index + 1])
        elif arg.startswith("--config="):
            resolved[index] = "--config=" + resolve_config(arg.removeprefix("--config="))
    return resolved
