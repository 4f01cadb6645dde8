"""A Griffe extension for the API pages: ``Example:`` sections read as ``Examples:``.

Google style allows both titles, and the package's docstrings use ``Example:`` before their
doctests; Griffe parses only ``Examples:`` as an examples section (rendered as code) and the
singular as an admonition, whose ``>>>`` lines Markdown would read as nested quotes and whose
``[...]`` outputs as links. The docstrings themselves stay as they are (pytest runs them).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename each ``Example:`` section title to ``Examples:`` before the docstring is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the docstring of every object Griffe loads (modules, classes, functions)."""
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
