"""Nested configs flattened into MLflow params (``model.criterion.init_args.gamma``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def flatten(
    config: Mapping[Any, Any] | Sequence[Any], prefix: str = "", *, drop_none: bool = False
) -> dict[str, str]:
    """Flatten nested mappings and lists to dotted keys with string values.

    Args:
        config: nested mappings and lists (a list's items are keyed by their index).
        prefix: put before every key.
        drop_none: leave out the keys whose value is ``None`` (an unset option says nothing a
            missing param does not; MLflow params are for values).

    Example:
        >>> flatten({"model": {"criterion": {"init_args": {"gamma": 2.0}}}, "xs": [1, {"a": 2}]})
        {'model.criterion.init_args.gamma': '2.0', 'xs.0': '1', 'xs.1.a': '2'}
        >>> flatten({"ckpt_path": None, "model": {"scale": None, "margin": 0.0}}, drop_none=True)
        {'model.margin': '0.0'}
    """
    flat: dict[str, str] = {}
    items: Iterable[tuple[Any, Any]] = (
        config.items() if isinstance(config, Mapping) else enumerate(config)
    )
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) or (isinstance(value, (list, tuple)) and value):
            flat.update(flatten(value, name + ".", drop_none=drop_none))
        elif value is not None or not drop_none:
            flat[name] = str(value)
    return flat
