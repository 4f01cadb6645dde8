"""Hyper-parameter text of a run: the loss's arguments and its schedules, in one short line.

:func:`hparams_text` reads a run's flattened params: the init args of
``model.criterion`` (leaving out arguments that are not hyper-parameters, such as
``reduction``) and, for each loss-schedule callback in ``trainer.callbacks``
(``GammaAnnealing``, ``LossScheduler``, ``LossSwitch``), a summary of what it changes and when.
:func:`split_hparams` takes such a line apart again (the table moves the items that all runs
share into one "common" line) and :func:`join_hparams` puts it back together.

Imports only the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_losses.compare.params import class_name, unflatten

__all__ = ["NON_HPARAMS", "SCHEDULE_CALLBACKS", "hparams_text", "join_hparams", "split_hparams"]

#: Loss constructor arguments that are not hyper-parameters of the loss.
NON_HPARAMS = frozenset({"reduction", "ignore_index", "validate_args"})
#: Callbacks whose configuration is summarised next to the hyper-parameters.
SCHEDULE_CALLBACKS = ("GammaAnnealing", "LossScheduler", "LossSwitch")


def _text(value: Any) -> str:
    """A short rendering of a param value: ``0.5``, ``2``, ``[5, 3]``, ``ce``."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def _kwargs_text(init_args: Any) -> str:
    """``gamma=0.5, threshold=0.2`` from init args; ``None`` values and non-hparams left out."""
    if not isinstance(init_args, dict):
        return ""
    items = sorted((k, v) for k, v in init_args.items() if k not in NON_HPARAMS and v is not None)
    return ", ".join(f"{key}={_text(value)}" for key, value in items)


def _criterion_text(spec: Any) -> str:
    """A criterion spec of LossSwitch: ``ce``, ``FocalLoss(gamma=2)`` or ``focal(gamma=2)``."""
    if isinstance(spec, dict) and "class_path" in spec:
        name, kwargs = class_name(spec["class_path"]), spec.get("init_args")
    elif isinstance(spec, dict) and "name" in spec:
        name, kwargs = str(spec["name"]), {k: v for k, v in spec.items() if k != "name"}
    else:
        return _text(spec)
    args = _kwargs_text(kwargs)
    return f"{name}({args})" if args else name


def _schedule_text(spec: Any) -> str:
    """A schedule spec: ``CosineSchedule 0->0.2, 2..8``, ``ConstantSchedule =0.5``, ..."""
    if not isinstance(spec, dict) or "class_path" not in spec:
        return _text(spec)
    name = class_name(spec["class_path"])
    init_args = spec.get("init_args")
    args: dict[str, Any] = init_args if isinstance(init_args, dict) else {}
    if "start_value" in args or "end_value" in args:
        text = f"{name} {_text(args.get('start_value'))}->{_text(args.get('end_value'))}"
        if "start" in args or "end" in args:
            text += f", {_text(args.get('start', 0))}..{_text(args.get('end', 1.0))}"
        return text
    if "value" in args:
        return f"{name} ={_text(args['value'])}"
    if "values" in args:
        return f"{name} {_text(args['values'])} @ {_text(args.get('milestones'))}"
    return f"{name}({_kwargs_text(args)})" if _kwargs_text(args) else name


def _gamma_annealing_text(args: dict[str, Any]) -> str:
    """``GammaAnnealing(gamma 0->1, 0..0.8)`` (class defaults where an argument is absent)."""
    text = f"gamma {_text(args.get('start', 0.0))}->{_text(args.get('end', 1.0))}"
    if "begin" in args or "until" in args:
        text += f", {_text(args.get('begin', 0))}..{_text(args.get('until', 1.0))}"
    if args.get("shape", "linear") != "linear":
        text += f", {args['shape']}"
    return f"GammaAnnealing({text})"


def _loss_scheduler_text(args: dict[str, Any]) -> str:
    """``LossScheduler(threshold: CosineSchedule 0->0.2, 2..8)``."""
    name = args.get("hyperparameter", args.get("attribute"))  # 'attribute' in runs before #36
    return f"LossScheduler({_text(name)}: {_schedule_text(args.get('schedule'))})"


def _loss_switch_text(args: dict[str, Any]) -> str:
    """``LossSwitch(ce, FocalLoss(gamma=2)@10)``: each later criterion with its first epoch."""
    criteria = args.get("criteria")
    milestones = args.get("milestones")
    criteria = criteria if isinstance(criteria, list) else [criteria]
    milestones = milestones if isinstance(milestones, list) else [milestones]
    parts = [_criterion_text(criteria[0])]
    for i, spec in enumerate(criteria[1:]):
        epoch = milestones[i] if i < len(milestones) else "?"
        parts.append(f"{_criterion_text(spec)}@{_text(epoch)}")
    return f"LossSwitch({', '.join(parts)})"


def _callback_text(callback: Any) -> str | None:
    """The summary of one callback entry when it is a loss schedule, else ``None``."""
    if not isinstance(callback, dict) or "class_path" not in callback:
        return None
    name = class_name(callback["class_path"])
    if name not in SCHEDULE_CALLBACKS:
        return None
    args = callback.get("init_args")
    args = args if isinstance(args, dict) else {}
    if name == "GammaAnnealing":
        return _gamma_annealing_text(args)
    if name == "LossScheduler":
        return _loss_scheduler_text(args)
    return _loss_switch_text(args)


def hparams_text(params: Mapping[str, str]) -> str:
    """The key hyper-parameters of a run: the loss's init args, then its schedules.

    Args:
        params: the run's flattened params.

    Returns:
        e.g. ``"gamma=0.5, threshold=0.2"``, or with a schedule callback
        ``"gamma=0; GammaAnnealing(gamma 0->1, 0..0.8)"``; ``""`` when there is nothing to say.

    Example:
        >>> hparams_text({
        ...     "model.criterion.init_args.gamma": "0.5",
        ...     "model.criterion.init_args.reduction": "mean",
        ...     "trainer.callbacks.0.class_path": "lightning_losses.callbacks.LossScheduler",
        ...     "trainer.callbacks.0.init_args.attribute": "threshold",
        ...     "trainer.callbacks.0.init_args.schedule.class_path": "x.LinearSchedule",
        ...     "trainer.callbacks.0.init_args.schedule.init_args.start_value": "0.0",
        ...     "trainer.callbacks.0.init_args.schedule.init_args.end_value": "0.2",
        ... })
        'gamma=0.5; LossScheduler(threshold: LinearSchedule 0->0.2)'
    """
    parts = [_kwargs_text(unflatten(params, "model.criterion.init_args"))]
    callbacks = unflatten(params, "trainer.callbacks")
    if isinstance(callbacks, dict):  # a single callback, or indices with gaps
        callbacks = [callbacks] if "class_path" in callbacks else list(callbacks.values())
    for callback in callbacks if isinstance(callbacks, list) else []:
        parts.append(_callback_text(callback) or "")
    return "; ".join(part for part in parts if part)


#: Separators of :func:`hparams_text`: between the groups (the loss, each schedule), and between
#: the loss's arguments.
GROUP_SEPARATOR = "; "
ITEM_SEPARATOR = ", "
_OPENING, _CLOSING = "([{", ")]}"


def _split_top(text: str, separator: str) -> list[str]:
    """``text`` split at each ``separator`` outside brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        char = text[i]
        if char in _OPENING:
            depth += 1
        elif char in _CLOSING:
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            i += len(separator)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return [part for part in parts if part]


def split_hparams(text: str | None) -> list[list[str]]:
    """The groups and items of an :func:`hparams_text` line.

    Args:
        text: a line of :func:`hparams_text` (``None`` or ``""``: nothing).

    Returns:
        One list per group (the loss's arguments, then each schedule), each with its items;
        separators inside brackets (a schedule's own arguments, a list) do not split.

    Example:
        >>> split_hparams("gamma=0, threshold=0; GammaAnnealing(gamma 0->1, 0..0.8)")
        [['gamma=0', 'threshold=0'], ['GammaAnnealing(gamma 0->1, 0..0.8)']]
    """
    return [_split_top(group, ITEM_SEPARATOR) for group in _split_top(text or "", GROUP_SEPARATOR)]


def join_hparams(groups: list[list[str]]) -> str:
    """The line :func:`split_hparams` took apart (empty groups left out).

    Example:
        >>> join_hparams([["gamma=2"], [], ["LossSwitch(ce, focal@3)"]])
        'gamma=2; LossSwitch(ce, focal@3)'
    """
    return GROUP_SEPARATOR.join(ITEM_SEPARATOR.join(items) for items in groups if items)
