"""``LossSwitch``: change the criterion at given epochs (e.g. cross-entropy, then focal loss)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch import nn
from typing_extensions import override

from lightning_losses.callbacks.criterion import (
    DEFAULT_ATTRIBUTE,
    attribute_name,
    missing_message,
    set_module_criterion,
)
from lightning_losses.functional.checks import check_int
from lightning_losses.lightning.mixin import build_criterion, criterion_hyperparameters


class LossSwitch(Callback):
    """Use ``criteria[k]`` as ``pl_module.criterion`` in epoch ``p``, ``k`` = milestones ``<= p``.

    ``k = #{m in milestones : m <= trainer.current_epoch}``: ``criteria[0]`` before the first
    milestone, ``criteria[1]`` from it to the second, and so on. The criteria are built once
    in ``setup("fit")``, before any training step, with
    :func:`lightning_losses.lightning.mixin.build_criterion`, and each is checked with its
    ``check_hyperparameters()`` when it has one: a bad spec or value fails at start-up with a
    ``ValueError`` (or ``TypeError``) naming ``LossSwitch criteria[k]``, its spec and its first
    epoch. A :class:`~lightning_losses.callbacks.LossScheduler` checks the values it will set on
    each criterion in the epochs where that criterion is used (see there). The prebuilt module
    is swapped in with
    ``pl_module.criterion = module`` (``pl_module.<attribute>`` with ``attribute=``) when
    training starts and at each epoch start where the index changes (checked again before each
    batch). The index is recomputed from
    ``trainer.current_epoch``, so a resumed run, even one resumed mid-epoch, uses the right
    criterion from its first step; it is logged as ``switch/index``.

    The switched-in module becomes the model's ``criterion`` submodule; with
    :class:`~lightning_losses.lightning.mixin.LossMixin`, a checkpoint saved with one criterion
    loads into a model built with another. A
    :class:`~lightning_losses.callbacks.LossScheduler` keeps setting its attribute on whichever
    criterion is current.

    Args:
        criteria: one criterion per phase, each a registry name (``"ce"``), a mapping
            ``{"name": "focal", "gamma": 2.0}`` or a ``class_path``/``init_args`` mapping.
        milestones: the epochs where the next criterion takes over: increasing ints, one fewer
            than ``criteria``.
        attribute: the LightningModule's attribute that holds the loss and is replaced
            (``"loss_fn"`` for a module that computes ``self.loss_fn(logits, target)``).

    Example:
        >>> switch = LossSwitch(["ce", {"name": "focal", "gamma": 2.0}], milestones=[5])
        >>> switch.index(4), switch.index(5)
        (0, 1)
        >>> switch.state_key
        "LossSwitch{'criteria': ['ce', {'name': 'focal', 'gamma': 2.0}], 'milestones': [5]}"
    """

    def __init__(
        self,
        criteria: list[str | dict[str, Any]],
        milestones: list[int],
        attribute: str = DEFAULT_ATTRIBUTE,
    ) -> None:
        self.attribute = attribute_name(attribute, "LossSwitch")
        if isinstance(criteria, (str, Mapping)) or not isinstance(criteria, (list, tuple)):
            raise ValueError(f"criteria must be a list of criterion specs; got {criteria!r}")
        if isinstance(milestones, str) or not isinstance(milestones, (list, tuple)):
            raise ValueError(f"milestones must be a list of epochs; got {milestones!r}")
        for i, spec in enumerate(criteria):
            if not isinstance(spec, (str, Mapping)):
                raise ValueError(
                    f"criteria[{i}] must be a loss name or a mapping ({{'name': ...}} or "
                    f"{{'class_path': ..., 'init_args': ...}}); got {spec!r}"
                )
        if len(criteria) != len(milestones) + 1:
            raise ValueError(
                "criteria must have one more entry than milestones; got "
                f"{len(criteria)} criteria and {len(milestones)} milestones"
            )
        for i, milestone in enumerate(milestones):
            check_int(f"milestones[{i}]", milestone, low=0)  # an epoch
            if i and milestone <= milestones[i - 1]:
                raise ValueError(f"milestones must be increasing; got {list(milestones)!r}")
        self.criteria = [spec if isinstance(spec, str) else dict(spec) for spec in criteria]
        self.milestones = list(milestones)
        #: The index used last; saved in checkpoints for information only (resuming recomputes it).
        self.last_index: int | None = None
        self._modules: list[Any] = []
        self._active: int | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(criteria=self.criteria, milestones=self.milestones)

    def changed_hyperparameters(self) -> set[str]:
        """The hyper-parameters whose value differs between two criteria that have them.

        :class:`~lightning_losses.lightning.mixin.LossMixin` logs these as ``criterion/<name>``
        metrics (a value constant across the stages that have it is a param of the run, not a
        metric).
        The criteria are those built in ``setup("fit")`` (built here before it).

        Example:
            >>> switch = LossSwitch([{"name": "gamma_ce", "gamma": 0.0}, "focal"], milestones=[3])
            >>> switch.changed_hyperparameters()
            {'gamma'}
        """
        modules = self._modules or [build_criterion(spec) for spec in self.criteria]
        seen: dict[str, set[float]] = {}
        for module in modules:
            for name, value in criterion_hyperparameters(module).items():
                seen.setdefault(name, set()).add(value)
        return {name for name, values in seen.items() if len(values) > 1}

    def index(self, epoch: int) -> int:
        """The index of the criterion used in ``epoch``: the number of milestones ``<= epoch``."""
        return bisect_right(self.milestones, epoch)

    def epochs(self, index: int) -> tuple[int, int | None]:
        """``(first, stop)``: ``criteria[index]`` is used in epochs ``first <= epoch < stop``.

        ``stop`` is ``None`` for the last criterion, which is used to the end of training.

        Example:
            >>> LossSwitch(["ce", "focal", "ce"], milestones=[3, 5]).epochs(1)
            (3, 5)
        """
        first = 0 if index == 0 else self.milestones[index - 1]
        stop = self.milestones[index] if index < len(self.milestones) else None
        return first, stop

    def describe(self, index: int | None = None) -> str:
        """``criteria[index]`` with its spec and first epoch; all criteria when ``index=None``.

        With an index, for error messages; without, the line of the fit summary.

        Example:
            >>> switch = LossSwitch(["ce", "focal"], milestones=[3])
            >>> switch.describe(1)
            "LossSwitch criteria[1]='focal' (from epoch 3)"
            >>> switch.describe()
            "LossSwitch: 'ce' in epochs 0-2, 'focal' from epoch 3"
        """
        if index is not None:
            first = self.epochs(index)[0]
            return f"LossSwitch criteria[{index}]={self.criteria[index]!r} (from epoch {first})"
        phases = []
        for i, spec in enumerate(self.criteria):
            first, stop = self.epochs(i)
            when = f"from epoch {first}" if stop is None else f"in epochs {first}-{stop - 1}"
            phases.append(f"{spec!r} {when}")
        return "LossSwitch: " + ", ".join(phases)

    @property
    def modules(self) -> list[Any]:
        """The criteria built in ``setup("fit")``, one per phase; empty before it."""
        return list(self._modules)

    def _apply(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
        """Swap in the criterion for the current epoch if it is not the active one."""
        if not self._modules:
            raise RuntimeError("LossSwitch was not set up: its criteria are built in setup('fit')")
        index = self.index(trainer.current_epoch)
        if index != self._active:
            module = self._modules[index]
            if isinstance(module, nn.Module):
                module.to(pl_module.device)
            set_module_criterion(pl_module, self.attribute, module)
            self._active = index
        self.last_index = index
        return index

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if getattr(pl_module, self.attribute, None) is None:
            raise ValueError(
                f"{missing_message(pl_module, self.attribute, 'LossSwitch')}. LossSwitch "
                f"replaces {type(pl_module).__name__}.{self.attribute}, so the module must "
                f"compute its loss as self.{self.attribute}(logits, target) (e.g. through "
                "lightning_losses.LossMixin's set_criterion / compute_loss), or the switch "
                "would change nothing"
            )
        modules = []
        for i, spec in enumerate(self.criteria):
            try:
                module = build_criterion(spec)
                check = getattr(module, "check_hyperparameters", None)
                if callable(check):
                    check()
            except (ValueError, TypeError) as error:
                raise type(error)(f"{self.describe(i)}: {error}") from error
            modules.append(module)
        self._modules = modules
        self._active = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._apply(trainer, pl_module)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._apply(trainer, pl_module)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        index = self._apply(trainer, pl_module)
        pl_module.log(
            "switch/index",
            float(index),
            on_step=False,
            on_epoch=True,
            batch_size=1,
            sync_dist=True,  # the same index on every process: max is exact, and no warning
            reduce_fx="max",
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"milestones": list(self.milestones), "last_index": self.last_index}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        last_index = state_dict.get("last_index")
        self.last_index = None if last_index is None else int(last_index)
