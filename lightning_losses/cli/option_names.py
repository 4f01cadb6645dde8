"""The argument names behind a command's options, read from the classes' source with ``ast``.

The console script checks the spelling of ``--trainer.KEY``, ``--model.KEY``, ``--data.KEY``
and ``--model.criterion.init_args.KEY`` before torch or Lightning is imported
(:func:`lightning_losses.cli.checks.check_command_line`): the names are read from the source
files of Lightning's ``Trainer``, of ``ClassifierModule``, of the package's DataModules and of
the built-in losses, which are
never imported here, so the signatures stay their one home. Only a name close to one of them
(``max_epoch`` for ``max_epochs``) is refused; anything else, and any class whose constructor
takes ``**kwargs`` or is not found, is left to the parser.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
from importlib import resources
from pathlib import Path

__all__ = [
    "OPTION_WORDS",
    "callback_arguments",
    "classifier_arguments",
    "data_arguments",
    "init_arguments",
    "loss_arguments",
    "misspelled",
    "trainer_arguments",
]

#: Words of the parser after a dotted group that are no constructor argument.
OPTION_WORDS = frozenset({"help", "class_path", "init_args", "dict_kwargs"})


@functools.cache
def _classes(path: Path) -> dict[str, ast.ClassDef]:
    """The top-level classes of the Python file ``path`` by name (none if it cannot be read)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def init_arguments(path: Path, class_name: str) -> frozenset[str] | None:
    r"""The keyword names of ``class_name``'s constructor in the file ``path``, or ``None``.

    The constructor is the class's own ``__init__`` or the first base's of the same file that
    has one; ``None`` when it takes ``*args``/``**kwargs``, or when the class or the base
    that defines it is not in the file.

    Example:
        >>> import tempfile
        >>> source = "class A:\n    def __init__(self, *, x=1, y=2): ...\nclass B(A): pass\n"
        >>> with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        ...     _ = file.write(source)
        >>> sorted(init_arguments(Path(file.name), "B"))
        ['x', 'y']
    """
    classes = _classes(path)
    seen: set[str] = set()
    name: str | None = class_name
    while name in classes and name not in seen:
        seen.add(name)
        node = classes[name]
        init = next(
            (f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"),
            None,
        )
        if init is not None:
            arguments = init.args
            if arguments.vararg is not None or arguments.kwarg is not None:
                return None
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            return frozenset(a.arg for a in every[1:])  # without self
        name = _base_name(node.bases[0]) if node.bases else None
    return None


def trainer_arguments() -> frozenset[str] | None:
    """The arguments of the installed Lightning's ``Trainer`` (``--trainer.KEY``)."""
    spec = importlib.util.find_spec("lightning")  # finds the package without importing it
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "pytorch" / "trainer" / "trainer.py"
    return init_arguments(path, "Trainer")


def classifier_arguments() -> frozenset[str] | None:
    """The arguments of ``ClassifierModule`` (``--model.KEY`` of ``lightning-losses fit``)."""
    path = Path(str(resources.files("lightning_losses") / "lightning" / "classifier.py"))
    return init_arguments(path, "ClassifierModule")


def loss_arguments(class_name: str) -> frozenset[str] | None:
    """The arguments of a loss class of :mod:`lightning_losses.losses`."""
    return init_arguments(Path(str(resources.files("lightning_losses") / "losses.py")), class_name)


def data_arguments(class_name: str) -> frozenset[str] | None:
    """The arguments of a DataModule of :mod:`lightning_losses.data` (``--data.KEY``)."""
    folder = Path(str(resources.files("lightning_losses") / "data"))
    for path in sorted(folder.glob("*.py")):
        if class_name in _classes(path):
            return init_arguments(path, class_name)
    return None


def callback_arguments(class_path: str) -> frozenset[str] | None:
    """The arguments of a package callback, by its class path (``--trainer.callbacks.KEY``).

    ``None`` for a class of another package (the parser's to check) or one not found.

    Example:
        >>> sorted(callback_arguments("lightning_losses.callbacks.SplitCurves"))
        ['every_n_epochs', 'n_bins', 'split']
        >>> callback_arguments("my.Callback") is None
        True
    """
    package, _, class_name = class_path.rpartition(".")
    if package not in ("lightning_losses.callbacks", "lightning_losses"):
        if not package.startswith("lightning_losses.callbacks."):
            return None
    folder = Path(str(resources.files("lightning_losses") / "callbacks"))
    for path in sorted(folder.glob("*.py")):
        if class_name in _classes(path):
            return init_arguments(path, class_name)
    return None


def misspelled(name: str, accepted: frozenset[str] | None) -> str | None:
    """The accepted name closest to ``name`` when ``name`` is not accepted; else ``None``.

    Example:
        >>> misspelled("max_epoch", frozenset({"max_epochs", "min_epochs"}))
        'max_epochs'
        >>> misspelled("max_epochs", frozenset({"max_epochs"})) is None
        True
        >>> misspelled("zzz", frozenset({"max_epochs"})) is None  # no close name: the parser's
        True
    """
    if accepted is None or name in accepted or name in OPTION_WORDS or name.endswith("+"):
        return None
    close = difflib.get_close_matches(name, sorted(accepted), n=1)
    return close[0] if close else None
