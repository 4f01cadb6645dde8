"""A Griffe extension for the API pages: Sphinx roles become cross-references.

The package's docstrings name other objects with Sphinx roles (``:class:`~pkg.mod.Name```,
``:func:``, ``:meth:``, ``:mod:``, ``:data:``, ``:attr:``, ...), which Markdown would print as
text. Once the whole package is loaded, each role is rewritten into a cross-reference that
mkdocs-autorefs resolves when the site is built:

- the target is looked up in the loaded package, as written and then relative to the
  docstring's own class, module and their parents (``:meth:`compute``` in a class docstring
  names that class's method), and the reference points at the object's canonical path, which
  mkdocstrings registers for every object it renders, whichever page renders it;
- ``~`` shows the last component only (``:class:`~pkg.Name``` reads ``Name``), an explicit
  title (``:func:`the loss <pkg.loss>```) is kept, and ``!`` makes a plain code span;
- the reference is marked optional: a target that no page renders (a private helper, a
  torch or matplotlib object) renders as a code span with the target as its tooltip instead of
  failing ``mkdocs build --strict``.

The docstrings themselves stay as they are (Sphinx-style, read by ``help()`` and pytest).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import griffe

#: A Sphinx cross-reference role of the Python domain: ``:class:`target```, ``:py:func:`~t```,
#: ``:meth:`title <target>```.
ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|data|attr|obj|exc|const|type|attribute|function|method"
    r"|module):`(?P<body>[^`]+)`"
)
_TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)


def _lookup(obj: griffe.Object, path: str) -> griffe.Object | griffe.Alias | None:
    """The object at dotted ``path`` among the modules loaded with ``obj``, else ``None``."""
    root = obj
    while root.parent is not None:
        root = root.parent
    head, _, rest = path.partition(".")
    try:
        if head != root.name:  # another loaded package, if any
            return obj.modules_collection.get_member(path)
        return root.get_member(rest) if rest else root
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _scopes(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` (when a class or module), then each of its parents up to the package."""
    scope: griffe.Object | None = obj if (obj.is_class or obj.is_module) else obj.parent
    while scope is not None:
        yield scope
        scope = scope.parent


def _inherited(scope: griffe.Object, target: str) -> griffe.Object | griffe.Alias | None:
    """``target`` as a member of class ``scope``, inherited members included, else ``None``."""
    head, _, rest = target.partition(".")
    try:
        member = scope.all_members.get(head)
        return member.get_member(rest) if (member is not None and rest) else member
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def resolve(target: str, obj: griffe.Object) -> str:
    """The canonical path ``target`` names from ``obj``'s docstring, else ``target`` itself."""
    candidates = [_lookup(obj, target)]
    for scope in _scopes(obj):
        candidates.append(_lookup(obj, f"{scope.path}.{target}"))
        if scope.is_class:
            candidates.append(_inherited(scope, target))
    for found in candidates:
        if found is not None:
            try:
                return found.canonical_path
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                return found.path
    return target


def cross_reference(body: str, obj: griffe.Object) -> str:
    """The Markdown/HTML that replaces one role, given the text between its backticks."""
    body = body.strip()
    titled = _TITLED.match(body)
    if titled:
        title, target = titled.group("title"), titled.group("target").strip()
    else:
        target = body.lstrip("~!")
        title = target.rsplit(".", 1)[-1] if body.startswith("~") else target
    if body.startswith("!"):
        return f"`{title}`"
    identifier = html.escape(resolve(target.lstrip("~!."), obj), quote=True)
    # The element autorefs itself writes for ``[title][identifier]``, with ``optional``: an
    # identifier no page renders leaves the code span, not a warning.
    return f'<autoref identifier="{identifier}" optional>`{title}`</autoref>'


def rewrite(text: str, obj: griffe.Object) -> str:
    """``text`` with every Sphinx role replaced by a cross-reference (see the module docs).

    Example:
        >>> module = griffe.Module("pkg")
        >>> module.set_member("Loss", griffe.Class("Loss"))
        >>> rewrite("See :class:`~pkg.Loss` and :func:`torch.exp`.", module)
        'See <autoref identifier="pkg.Loss" optional>`Loss`</autoref> and <autoref identifier="torch.exp" optional>`torch.exp`</autoref>.'
    """  # noqa: E501
    return ROLE.sub(lambda match: cross_reference(match.group("body"), obj), text)


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined under it (imported names, aliases, are skipped)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Rewrite each docstring of ``pkg`` (all modules are loaded, so targets resolve)."""
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj)
