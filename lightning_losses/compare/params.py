"""MLflow params back to values: the flattened config of a run, unflattened and parsed.

The package's MLflow logger logs the resolved config as dotted params
(``model.criterion.init_args.gamma``, ``trainer.callbacks.0.class_path``, ...), every value a
string. :func:`unflatten` rebuilds the nested value under a prefix, lists included.

Imports only the standard library.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["class_name", "parse_param", "unflatten"]


def parse_param(value: str) -> Any:
    """A param string as a Python value where it reads as one (JSON or a literal), else as is.

    Args:
        value: one MLflow param value.

    Returns:
        The parsed value, or ``value`` itself when it is neither JSON nor a Python literal.

    Example:
        >>> parse_param("[5, 3]"), parse_param("None"), parse_param("mean")
        ([5, 3], None, 'mean')
    """
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def _listify(node: Any) -> Any:
    """Turn dicts whose keys are ``0..n-1`` (flattened lists) back into lists, recursively."""
    if not isinstance(node, dict):
        return node
    node = {key: _listify(value) for key, value in node.items()}
    if node and all(key.isdigit() for key in node):
        indices = sorted(int(key) for key in node)
        if indices == list(range(len(indices))):
            return [node[str(i)] for i in indices]
    return node


def unflatten(params: Mapping[str, str], prefix: str) -> Any:
    """The nested value under ``prefix`` of dotted, flattened params.

    Args:
        params: MLflow params (``{"a.b.0": "1", ...}``).
        prefix: the dotted key to rebuild, e.g. ``"trainer.callbacks.0"``.

    Returns:
        ``None`` when nothing is logged under ``prefix``; the parsed value when ``prefix`` itself
        is a param; otherwise nested dicts, with integer-keyed levels turned into lists.

    Example:
        >>> unflatten({"c.0.name": "focal", "c.0.gamma": "2.0", "c.1": "ce"}, "c")
        [{'name': 'focal', 'gamma': 2.0}, 'ce']
    """
    if prefix in params:
        return parse_param(params[prefix])
    tree: dict[str, Any] = {}
    start = prefix + "."
    for key, value in params.items():
        if not key.startswith(start):
            continue
        *parents, leaf = key[len(start) :].split(".")
        node = tree
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # a leaf and a branch share a key: keep the leaf
                break
            node = child
        else:
            node[leaf] = parse_param(value)
    return _listify(tree) if tree else None


def class_name(class_path: Any) -> str:
    """The class name at the end of a dotted ``class_path``.

    Example:
        >>> class_name("lightning_losses.FocalLoss")
        'FocalLoss'
    """
    return str(class_path).rsplit(".", 1)[-1]
