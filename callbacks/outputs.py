"""Read ``(logits, target)`` from what ``validation_step`` returns: the callbacks' ``outputs=``.

:class:`~lightning_losses.callbacks.CalibrationMonitor`,
:class:`~lightning_losses.callbacks.TemperatureScalingCallback` and
:class:`~lightning_losses.callbacks.AdaFocalUpdate` read the logits and targets of every
validation batch from the output of the module's ``validation_step`` (and ``test_step``). By
default that output is a dict ``{"logits": ..., "target": ...}``
(:meth:`lightning_losses.LossMixin.validation_output` builds it). Their ``outputs`` argument
reads any other format:

- a mapping from ``"logits"`` and ``"target"`` to the keys of a dict output, e.g.
  ``{"logits": "y_hat", "target": "y"}``, or to the positions of a tuple or list output, e.g.
  ``{"logits": 0, "target": 1}``; a name left out keeps its default key. In a LightningCLI
  YAML file this is a plain mapping (``outputs: {logits: y_hat, target: y}``);
- a callable ``outputs -> (logits, target)``, or its import path ``"package.module.function"``
  (how a YAML file names one);
- ``None``: the default dict.

An adapter is checked when the callback is built, and what it reads is checked on the first
validation batch (the sanity check, before any training step); every error names the callback's
``outputs`` argument and says what ``validation_step`` returned (the keys of a dict).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
from torch import Tensor

from lightning_losses.lightning.class_path import import_path

#: The two names an adapter maps, and the default keys of both.
NAMES = ("logits", "target")

#: What a callback's ``outputs`` argument accepts (see the module doc).
OutputsSpec = Mapping[str, str | int] | Callable[[Any], Any] | str | None


def describe_output(outputs: Any) -> str:
    """What ``validation_step`` returned, in words, for error messages.

    Example:
        >>> import torch
        >>> describe_output({"y_hat": torch.zeros(2), "y": torch.zeros(2)})
        "a dict with keys ['y', 'y_hat']"
        >>> describe_output((torch.zeros(2, 3), torch.zeros(2)))
        'a tuple of 2 (Tensor [2, 3], Tensor [2])'
    """
    if isinstance(outputs, Mapping):
        return f"a dict with keys {sorted(map(str, outputs))}"
    if isinstance(outputs, Tensor):
        return f"a Tensor of shape {list(outputs.shape)}"
    if isinstance(outputs, (tuple, list)):
        items = ", ".join(
            f"Tensor {list(item.shape)}" if isinstance(item, Tensor) else type(item).__name__
            for item in outputs
        )
        return f"a {type(outputs).__name__} of {len(outputs)} ({items})"
    return "None" if outputs is None else f"a {type(outputs).__name__}"


def _import(path: str, where: str) -> Callable[[Any], Any]:
    """The callable at the import path ``"package.module.function"``."""
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(
            f"{where} must be a mapping such as {{'logits': 'y_hat', 'target': 'y'}}, a "
            f"callable outputs -> (logits, target), or the import path of one "
            f"('package.module.function'); got the string {path!r}"
        )
    found = import_path(path, argument=where)
    if not callable(found):
        raise ValueError(f"{where}: {path!r} is a {type(found).__name__}, not a callable")
    return found


class OutputAdapter:
    """Read ``(logits, target)`` from a ``validation_step`` output, as ``outputs`` says.

    Args:
        outputs: a mapping of ``"logits"`` / ``"target"`` to dict keys (``str``) or tuple
            positions (``int``), a callable ``outputs -> (logits, target)``, its import path, or
            ``None`` for the default ``{"logits", "target"}`` dict.
        owner: the callback's class name, for the messages.

    Raises:
        ValueError: for a mapping with other names than ``"logits"`` and ``"target"`` or with
            values that are neither ``str`` nor ``int``, a string that does not import, or any
            other type. The message starts with ``<owner>(outputs=...)``.

    Example:
        >>> import torch
        >>> read = OutputAdapter({"logits": "y_hat", "target": "y"}, owner="CalibrationMonitor")
        >>> read({"y_hat": torch.zeros(2, 3), "y": torch.tensor([0, 2])})[1]
        tensor([0, 2])
        >>> OutputAdapter({"logits": 0, "target": 1}, owner="CalibrationMonitor").keys
        {'logits': 0, 'target': 1}
    """

    def __init__(self, outputs: OutputsSpec = None, *, owner: str) -> None:
        self.spec = outputs
        self.owner = owner
        self.where = f"{owner}(outputs={outputs!r})"
        self.function: Callable[[Any], Any] | None = None
        self.keys: dict[str, str | int] = dict(zip(NAMES, NAMES, strict=True))
        if outputs is None:
            return
        if isinstance(outputs, Mapping):
            unknown = sorted(map(str, set(outputs) - set(NAMES)))
            if unknown:
                raise ValueError(
                    f"{self.where}: the mapping's keys must be 'logits' and/or 'target' (each "
                    f"mapped to the key or position of that value in what validation_step "
                    f"returns); got {unknown}"
                )
            for name, key in outputs.items():
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    raise ValueError(
                        f"{self.where}: {name!r} must map to a dict key (str) or a tuple "
                        f"position (int); got {key!r}"
                    )
            self.keys.update(outputs)
        elif isinstance(outputs, str):
            self.function = _import(outputs, f"{owner}(outputs=...)")
        elif callable(outputs):
            self.function = outputs
        else:
            raise ValueError(
                f"{owner}(outputs=...) must be a mapping such as {{'logits': 'y_hat', "
                f"'target': 'y'}}, a callable outputs -> (logits, target), or its import path; "
                f"got a {type(outputs).__name__}"
            )

    def __repr__(self) -> str:
        return f"OutputAdapter({self.spec!r})"

    def __call__(self, outputs: Any, module_name: str = "the module") -> tuple[Tensor, Tensor]:
        """``(logits, target)``, detached, from ``outputs`` of ``module_name.validation_step``."""
        if self.function is not None:
            pair = self.function(outputs)
            if not (
                isinstance(pair, (tuple, list))
                and len(pair) == 2
                and all(isinstance(item, Tensor) for item in pair)
            ):
                raise ValueError(
                    f"{self.where} must return (logits, target), two tensors; it returned "
                    f"{describe_output(pair)} for {describe_output(outputs)} from "
                    f"{module_name}.validation_step"
                )
            return pair[0].detach(), pair[1].detach()
        return self._pick(outputs, module_name)

    def _pick(self, outputs: Any, module_name: str) -> tuple[Tensor, Tensor]:
        """Look up both keys (dict) or positions (tuple, list) in ``outputs``."""
        picked = []
        for name in NAMES:
            key = self.keys[name]
            if isinstance(key, str) and isinstance(outputs, Mapping) and key in outputs:
                value = outputs[key]
            elif (
                isinstance(key, int)
                and isinstance(outputs, Sequence)
                and not isinstance(outputs, str)
                and -len(outputs) <= key < len(outputs)
            ):
                value = outputs[key]
            else:
                raise ValueError(self._missing(name, key, outputs, module_name))
            if not isinstance(value, Tensor):
                raise ValueError(
                    f"{self._prefix()}{name} ({key!r} of what {module_name}.validation_step "
                    f"returned) must be a Tensor; got a {type(value).__name__}"
                )
            picked.append(value.detach())
        return picked[0], picked[1]

    def _prefix(self) -> str:
        return "" if self.spec is None else f"{self.where}: "

    def _missing(self, name: str, key: str | int, outputs: Any, module_name: str) -> str:
        got = describe_output(outputs)
        if self.spec is None:
            return (
                f"the calibration callbacks need {module_name}.validation_step (and "
                "test_step) to return a dict with 'logits' and 'target' (LossMixin."
                f"validation_output(logits, target) builds it); got {got}. For another "
                f"format, pass {self.owner}(outputs=...): a mapping such as "
                "{'logits': 'y_hat', 'target': 'y'} (dict keys) or {'logits': 0, 'target': 1} "
                "(tuple positions), or a callable outputs -> (logits, target)"
            )
        kind = "key" if isinstance(key, str) else "position"
        return (
            f"{self.where}: {module_name}.validation_step returned {got}, which has no {kind} "
            f"{key!r} (where {name} should be)"
        )


__all__: Sequence[str] = ("OutputAdapter", "OutputsSpec", "calibration_inputs", "describe_output")


def calibration_inputs(
    outputs: Any, pl_module: pl.LightningModule, adapter: OutputAdapter | None = None
) -> tuple[Tensor, Tensor]:
    """``(logits, target)`` from a ``validation_step`` output, reshaped for the metrics.

    ``adapter`` reads them (:class:`~lightning_losses.callbacks.outputs.OutputAdapter`; ``None``
    reads the default ``{"logits", "target"}`` dict). ``[N, n, m]`` logits of n-by-m tasks
    become ``[N * n, m]`` with ``[N * n]`` targets (each task is a multiclass prediction);
    everything else is passed as it is.
    """
    read = adapter if adapter is not None else OutputAdapter(owner="CalibrationMonitor")
    logits, target = read(outputs, type(pl_module).__name__)
    if logits.dim() == 3 and target.dim() == 2:
        logits, target = logits.flatten(0, 1), target.flatten()
    return logits, target
