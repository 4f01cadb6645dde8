"""Like with like: what sets two runs apart besides their seed, and the filters that pick runs.

Two runs are fits of the same thing when their configs agree in every param that can change a
result: :func:`canonical` is a run's params without its seed and without the params that only
name, log or checkpoint it (:data:`IGNORED_PARAMS`, :data:`IGNORED_PREFIXES`,
:data:`IGNORED_CALLBACKS`, :data:`IGNORED_CALLBACK_ARGS`), its callbacks keyed by class rather
than by their place in the list (one more callback does not shift the others). ``compare
--group-by`` pools only runs whose canonical params agree, and compares a group with the
baseline only when they differ in what ``--group-by`` varies (:func:`treatment`) and never in
the task (:data:`TASK_PARAM`).

:func:`parse_where` and :func:`matches` are the ``--where KEY=VALUE`` and ``--config NAME``
filters, on a run's params and tags.

Imports only the standard library.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_losses.compare.describe import SCHEDULE_CALLBACKS
from lightning_losses.compare.params import class_name, parse_param

__all__ = [
    "IGNORED_CALLBACKS",
    "IGNORED_CALLBACK_ARGS",
    "IGNORED_PARAMS",
    "IGNORED_PREFIXES",
    "TASK_PARAM",
    "canonical",
    "config_name",
    "differing",
    "key_named",
    "matches",
    "parse_where",
    "short_names",
    "treatment",
]

#: Params that cannot change a result: the seed (what a group varies), how a fit is shown and
#: logged, and where it writes.
IGNORED_PARAMS = frozenset(
    {
        "seed_everything",
        "ckpt_path",
        "trainer.enable_progress_bar",
        "trainer.enable_model_summary",
        "trainer.enable_autolog_hparams",
        "trainer.default_root_dir",
        "trainer.log_every_n_steps",
        "data.init_args.num_workers",
    }
)
#: Prefixes of params that only name or log a run (the logger: experiment, run name, store).
IGNORED_PREFIXES = ("trainer.logger.",)
#: Callbacks that only save or show a fit.
IGNORED_CALLBACKS = frozenset(
    {
        "ModelCheckpoint",
        "LastCheckpoint",
        "TQDMProgressBar",
        "RichProgressBar",
        "ModelSummary",
        "RichModelSummary",
        "LearningRateMonitor",
        "Timer",
    }
)
#: Callback arguments that only decide which pictures are drawn.
IGNORED_CALLBACK_ARGS = frozenset({"diagram_every_n_epochs", "final_diagram"})
#: The param that holds a run's task (multiclass, binary, multilabel, nm): runs of different
#: tasks are never compared.
TASK_PARAM = "model.task"
#: The criterion's param, and the run fields that stand for it in ``--group-by``.
CRITERION = "model.criterion"
_CALLBACKS = "trainer.callbacks."


def _callback_entries(params: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The params of each ``trainer.callbacks.<i>`` entry, by index (in index order)."""
    entries: dict[str, dict[str, str]] = {}
    for key, value in params.items():
        if key.startswith(_CALLBACKS):
            index, _, rest = key[len(_CALLBACKS) :].partition(".")
            entries.setdefault(index, {})[rest] = value
    return dict(sorted(entries.items(), key=lambda item: (not item[0].isdigit(), item[0].zfill(9))))


def canonical(params: Mapping[str, str]) -> dict[str, str]:
    """A run's params that can change its result, its callbacks keyed by class.

    Args:
        params: the run's flattened params, as the package's MLflow logger logs them.

    Returns:
        The params without the seed and the ignored ones; ``trainer.callbacks.<i>.<rest>``
        becomes ``trainer.callbacks.<Class>.<rest>`` (``<Class>#2`` for a second callback of
        one class), and the callbacks that only save or show a fit are left out.

    Example:
        >>> canonical({
        ...     "seed_everything": "3",
        ...     "model.head": "linear",
        ...     "trainer.logger.init_args.run_name": "digits_ce",
        ...     "trainer.callbacks.0.class_path": "x.GammaAnnealing",
        ...     "trainer.callbacks.0.init_args.end": "1.0",
        ...     "trainer.callbacks.1.class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        ...     "trainer.callbacks.1.init_args.monitor": "val/nll",
        ... })
        {'model.head': 'linear', 'trainer.callbacks.GammaAnnealing.class_path': 'x.GammaAnnealing', 'trainer.callbacks.GammaAnnealing.init_args.end': '1.0'}
    """  # noqa: E501
    kept = {
        key: value
        for key, value in params.items()
        if key not in IGNORED_PARAMS
        and not key.startswith(IGNORED_PREFIXES)
        and not key.startswith(_CALLBACKS)
    }
    seen: dict[str, int] = {}
    for entry in _callback_entries(params).values():
        name = class_name(entry.get("class_path", "?"))
        if name in IGNORED_CALLBACKS:
            continue
        seen[name] = seen.get(name, 0) + 1
        label = name if seen[name] == 1 else f"{name}#{seen[name]}"
        for rest, value in entry.items():
            if rest.rsplit(".", 1)[-1] not in IGNORED_CALLBACK_ARGS:
                kept[f"{_CALLBACKS}{label}.{rest}"] = value
    return dict(sorted(kept.items()))


def treatment(group_by: str) -> Callable[[str], bool]:
    """Which canonical params ``--group-by group_by`` varies, besides ``group_by`` itself.

    Grouping by a ``class_path`` (or by ``loss``) varies that component: its ``init_args``
    too, and for the criterion the callbacks that schedule it (:data:`SCHEDULE_CALLBACKS`).
    Grouping by ``config`` or ``run_name`` varies everything a config sets but the task.
    Any other param varies only itself.

    Returns:
        A predicate on canonical param names.

    Example:
        >>> varies = treatment("model.criterion.class_path")
        >>> varies("model.criterion.init_args.gamma"), varies("model.head")
        (True, False)
        >>> varies("trainer.callbacks.GammaAnnealing.init_args.end")
        True
        >>> treatment("config")("model.head"), treatment("config")("model.task")
        (True, False)
    """
    if group_by in ("config", "run_name"):
        return lambda key: key != TASK_PARAM
    if group_by == "loss":
        group_by = f"{CRITERION}.class_path"
    if group_by.endswith(".class_path"):
        component = group_by[: -len("class_path")]
        schedules = tuple(f"{_CALLBACKS}{name}" for name in SCHEDULE_CALLBACKS)
        criterion = component == f"{CRITERION}."

        def varies(key: str) -> bool:
            if key.startswith(component) or key == component[:-1]:
                return True
            return criterion and key.startswith(schedules)

        return varies
    return lambda key: key == group_by


def differing(runs: Sequence[Mapping[str, str]]) -> list[str]:
    """The keys whose value (or absence) is not the same in every mapping, sorted.

    Example:
        >>> differing([{"a": "1", "b": "x"}, {"a": "1", "b": "y"}, {"a": "1"}])
        ['b']
    """
    keys = sorted(set().union(*runs)) if runs else []
    return [key for key in keys if len({run.get(key) for run in runs}) > 1]


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """Each dotted key by its last parts, as few as tell it from the others.

    ``init_args`` is left out, callbacks are named by their class, and a ``class_path`` by
    what it is the class of (``data.class_path``).

    Example:
        >>> short_names(["model.criterion.init_args.gamma", "model.head", "x.gamma"])
        {'model.criterion.init_args.gamma': 'criterion.gamma', 'model.head': 'head', 'x.gamma': 'x.gamma'}
        >>> short_names(["data.class_path", "model.task"])
        {'data.class_path': 'data.class_path', 'model.task': 'task'}
    """  # noqa: E501
    parts = {key: [p for p in key.split(".") if p != "init_args"] for key in keys}
    depth = {key: 2 if parts[key][-1] == "class_path" else 1 for key in keys}
    while True:
        names = {key: ".".join(parts[key][-depth[key] :]) for key in keys}
        clash = [k for k in keys if list(names.values()).count(names[k]) > 1]
        grow = [k for k in clash if depth[k] < len(parts[k])]
        if not grow:
            return names
        for key in grow:
            depth[key] += 1


def parse_where(texts: Iterable[str]) -> list[tuple[str, str]]:
    """The ``--where KEY=VALUE`` options as (key, value) pairs.

    Raises:
        ValueError: naming ``--where``, for an option without ``=`` or without a key.

    Example:
        >>> parse_where(["model.criterion.init_args.gamma=2.0", "config=digits_ce"])
        [('model.criterion.init_args.gamma', '2.0'), ('config', 'digits_ce')]
    """
    pairs = []
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"--where expects KEY=VALUE (a param or tag of the runs), e.g. --where "
                f"model.criterion.init_args.gamma=2.0; got {text!r}"
            )
        pairs.append((key.strip(), value.strip()))
    return pairs


def config_name(text: str) -> str:
    """A ``--config`` name as the ``config`` tag holds it: ``configs/digits_ce.yaml`` -> ``digits_ce``.

    Example:
        >>> config_name("configs/digits_ce.yaml"), config_name("digits_focal")
        ('digits_ce', 'digits_focal')
    """  # noqa: E501
    return Path(text).stem if text.endswith((".yaml", ".yml")) else Path(text).name


def _same(a: str | None, b: str) -> bool:
    """Whether a stored value is the value asked for: the same text, or the same number."""
    if a is None:
        return False
    if a == b:
        return True
    x, y = parse_param(a), parse_param(b)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
    return (numbers and x == y) or str(x) == str(y)


def key_named(name: str, keys: Sequence[str], option: str) -> str | None:
    """The key that ``name`` names: itself, or the one key whose last dotted parts it is.

    Returns:
        The key, or ``None`` when none is named.

    Raises:
        ValueError: naming ``option``, when ``name`` ends several keys.

    Example:
        >>> key_named("gamma", ["model.criterion.init_args.gamma", "model.head"], "--where")
        'model.criterion.init_args.gamma'
    """
    if name in keys:
        return name
    ends = [key for key in keys if key.endswith("." + name)]
    if len(ends) > 1:
        raise ValueError(
            f"{option} {name!r} names several params ({', '.join(ends)}); pass the full name"
        )
    return ends[0] if ends else None


def _resolve_key(key: str, fields: Sequence[Mapping[str, str]]) -> str:
    """The param or tag that a ``--where`` key names: itself, or the one it ends.

    Raises:
        ValueError: naming ``--where``: no run has such a key (with "did you mean"), or it ends
            several.
    """
    keys = sorted(set().union(*fields)) if fields else []
    found = key_named(key, keys, "--where")
    if found is not None:
        return found
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    hint = ("; did you mean " + " or ".join(repr(c) for c in close) + "?") if close else ""
    raise ValueError(f"--where: no param or tag {key!r} in the runs{hint}")


def matches(
    runs: Sequence[Any],
    fields: Callable[[Any], Mapping[str, str]],
    *,
    where: Sequence[tuple[str, str]] = (),
    configs: Sequence[str] | None = None,
) -> list[Any]:
    """The runs that every ``--where`` pair and the ``--config`` names select.

    Args:
        runs: the runs, of any type.
        fields: a run's params and tags in one mapping (params first; ``run_name``,
            ``config``, ``loss``, ``status`` too where known).
        where: (key, value) pairs (:func:`parse_where`); a key is a param or tag, or the last
            dotted parts of one; a value matches the same text or the same number (``2``
            matches ``2.0``).
        configs: config names (:func:`config_name`); a run matches one by its ``config`` tag.

    Returns:
        The runs selected, in order.

    Raises:
        ValueError: naming the option: a key no run has, or a config no run was fitted from
            (the message lists those that were).

    Example:
        >>> runs = [{"gamma": "1.0", "config": "f"}, {"gamma": "2.0", "config": "f"}]
        >>> matches(runs, dict, where=[("gamma", "2")])
        [{'gamma': '2.0', 'config': 'f'}]
    """
    all_fields = [fields(run) for run in runs]
    kept = list(range(len(runs)))
    for key, value in where:
        name = _resolve_key(key, all_fields)
        kept = [i for i in kept if _same(all_fields[i].get(name), value)]
    if configs:
        names = {config_name(c) for c in configs}
        present = sorted({f["config"] for f in all_fields if f.get("config")})
        unknown = sorted(names - set(present))
        if unknown:
            raise ValueError(
                f"--config {' '.join(unknown)}: no run was fitted from it; configs of the runs: "
                f"{', '.join(present) or 'none'}"
            )
        kept = [i for i in kept if all_fields[i].get("config") in names]
    return [runs[i] for i in kept]
