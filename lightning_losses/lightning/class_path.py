"""Objects named by an import path: the one place that turns a ``class_path`` into an object.

YAML files, checkpoints and callbacks name a criterion, a backbone, an optimizer or an output
adapter as LightningCLI does: ``{"class_path": "package.module.Class", "init_args": {...}}``,
or an import path alone. The path is imported by jsonargparse, the importer behind
LightningCLI's ``class_path`` (so the same rules hold, such as its list of import paths a value
may not name), and the object is built by Lightning's
:func:`~lightning.pytorch.cli.instantiate_class`, the function LightningCLI builds its
optimizers with. Every error is a ``ValueError`` whose message starts with the argument that
held the path (``backbone``, ``criterion``, ``optimizer``, ``CalibrationMonitor(outputs=...)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["import_path", "instantiate"]

#: The keys of a ``class_path`` mapping.
KEYS = ("class_path", "init_args")


def import_path(path: str, *, argument: str) -> Any:
    """The object at the dotted import path ``path`` (``"package.module.Name"``).

    Args:
        path: the import path, as written in YAML or a checkpoint.
        argument: the argument that held it, for the messages.

    Returns:
        The class, function or other object the path names.

    Raises:
        ValueError: ``path`` is not a dotted path or does not import; the message starts with
            ``argument`` and quotes the path and the cause.

    Example:
        >>> import_path("lightning_losses.lightning.backbones.CNN1D", argument="backbone")
        <class 'lightning_losses.lightning.backbones.CNN1D'>
        >>> import_path("lightning_losses.lightning.backbones.CNN2D", argument="backbone")
        Traceback (most recent call last):
        ...
        ValueError: backbone: cannot import 'lightning_losses.lightning.backbones.CNN2D' \
(module 'lightning_losses.lightning.backbones' has no attribute 'CNN2D')
    """
    from jsonargparse._util import import_object

    if not isinstance(path, str) or "." not in path:
        raise ValueError(
            f"{argument}: class_path must be a dotted import path 'package.module.Name'; "
            f"got {path!r}"
        )
    try:
        return import_object(path)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"{argument}: cannot import {path!r} ({error})") from None


def instantiate(
    spec: Mapping[str, Any],
    *args: Any,
    argument: str,
    base: type | None = None,
    init_args: Mapping[str, Any] | None = None,
) -> Any:
    """Build ``Class(*args, **init_args)`` from a ``{"class_path", "init_args"}`` mapping.

    The class is imported with :func:`import_path`, checked, and built by Lightning's
    ``instantiate_class(args, init)``.

    Args:
        spec: ``{"class_path": "package.module.Class", "init_args": {...}}``; ``init_args`` may
            be left out.
        *args: positional arguments of the class (an optimizer's parameters).
        argument: the argument that held ``spec``, for the messages.
        base: a class the named class must derive from, or ``None`` for any callable.
        init_args: keyword arguments that override those of ``spec``.

    Returns:
        The object built.

    Raises:
        ValueError: a mapping with other keys or values of the wrong type, a path that does
            not import, or one that names no subclass of ``base`` (no callable).

    Example:
        >>> from torch import nn
        >>> spec = {"class_path": "lightning_losses.FocalLoss", "init_args": {"gamma": 1.0}}
        >>> instantiate(spec, argument="criterion", init_args={"reduction": "sum"})
        FocalLoss(gamma=1.0, reduction='sum')
        >>> instantiate(spec, argument="backbone", base=nn.Linear)
        Traceback (most recent call last):
        ...
        ValueError: backbone: class_path 'lightning_losses.FocalLoss' does not name a subclass \
of torch.nn.Linear
    """
    from jsonargparse._util import get_import_path
    from lightning.pytorch.cli import instantiate_class

    class_path = spec.get("class_path")
    given = spec.get("init_args") or {}
    if set(spec) - set(KEYS) or not isinstance(class_path, str) or not isinstance(given, Mapping):
        raise ValueError(
            f"{argument} mapping must be {{'class_path': 'package.module.Class', 'init_args': "
            f"{{...}}}}; got {dict(spec)!r}"
        )
    found = import_path(class_path, argument=argument)
    if base is None and not callable(found):
        raise ValueError(f"{argument}: class_path {class_path!r} does not name a class")
    if base is not None and not (isinstance(found, type) and issubclass(found, base)):
        raise ValueError(
            f"{argument}: class_path {class_path!r} does not name a subclass of "
            f"{get_import_path(base)}"
        )
    init = {"class_path": class_path, "init_args": {**given, **(init_args or {})}}
    return instantiate_class(args, init)
