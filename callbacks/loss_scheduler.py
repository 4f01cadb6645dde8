"""``LossScheduler``: set a criterion hyper-parameter from a schedule of training progress."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from .schedules import (
    Boundary,
    CosineSchedule,
    LinearSchedule,
    Schedule,
    check_boundary,
    check_order,
    check_real,
)

_INTERVALS = ("step", "epoch")
_SHAPES = {"linear": LinearSchedule, "cosine": CosineSchedule}


def hyperparameter_names(criterion: Any) -> list[str]:
    """The names a schedule may set on ``criterion``, for error messages.

    The keys of ``criterion.hyperparameters()`` when it has that method (the loss modules of
    this package do), otherwise its public numeric attributes.

    Example:
        >>> from lightning_losses import GammaCrossEntropyLoss
        >>> hyperparameter_names(GammaCrossEntropyLoss())
        ['gamma', 'threshold']
    """
    method = getattr(criterion, "hyperparameters", None)
    if callable(method):
        return list(method())
    return sorted(
        name
        for name, value in getattr(criterion, "__dict__", {}).items()
        if not name.startswith("_")
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    )


class LossScheduler(Callback):
    """Set ``pl_module.criterion.<attribute>`` from a schedule of training progress.

    With ``interval="step"``, before each training batch::

        criterion.<attribute> = schedule(trainer.global_step, trainer.estimated_stepping_batches)

    With ``interval="epoch"``, at each epoch start and again before each batch (Lightning does
    not start an epoch that a resumed run continues, and a
    :class:`~lightning_losses.callbacks.LossSwitch` may have swapped the criterion)::

        criterion.<attribute> = schedule(trainer.current_epoch, trainer.max_epochs)

    The value is logged as ``schedule/<attribute>``, per step or per epoch. It is recomputed
    from the trainer's progress each time, like Lightning's ``GradientAccumulationScheduler``,
    so a run resumed from a checkpoint continues the schedule exactly; nothing is taken from
    the checkpoint.

    The LightningModule needs a ``criterion`` attribute (see
    :class:`lightning_losses.mixins.LossMixin`) that has ``attribute``; this is checked when
    fitting starts, before any training step, and again at each change.

    Args:
        attribute: the criterion's hyper-parameter to set, e.g. ``"gamma"``.
        schedule: a :class:`~lightning_losses.callbacks.schedules.Schedule` (or any callable
            ``schedule(progress, total) -> float``).
        interval: ``"step"`` (progress is the global step) or ``"epoch"``.

    Example:
        >>> from lightning_losses.callbacks import LinearSchedule
        >>> scheduler = LossScheduler("gamma", LinearSchedule(0.0, 1.0, end=0.5))
        >>> scheduler.state_key
        "LossScheduler{'attribute': 'gamma'}"
        >>> scheduler.schedule(250, 1000)
        0.5
    """

    def __init__(self, attribute: str, schedule: Schedule, interval: str = "step") -> None:
        if not isinstance(attribute, str) or not attribute.isidentifier():
            raise ValueError(f"attribute must be an attribute name; got {attribute!r}")
        if not callable(schedule):
            raise ValueError(
                f"schedule must be callable as schedule(progress, total); got {schedule!r}"
            )
        if interval not in _INTERVALS:
            raise ValueError(f"interval must be one of {_INTERVALS}; got {interval!r}")
        self.attribute = attribute
        self.schedule = schedule
        self.interval = interval
        #: The value set last; saved in checkpoints for information only (resuming recomputes it).
        self.last_value: float | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(attribute=self.attribute)

    def _criterion(self, pl_module: pl.LightningModule) -> Any:
        """``pl_module.criterion``, checked to have ``attribute``; ``ValueError`` otherwise."""
        name = type(self).__name__
        criterion = getattr(pl_module, "criterion", None)
        if criterion is None:
            raise ValueError(
                f"{name} sets criterion.{self.attribute}, but {type(pl_module).__name__} has no "
                "criterion: mix in lightning_losses.mixins.LossMixin and call "
                "self.set_criterion(...), or set self.criterion in __init__"
            )
        if not hasattr(criterion, self.attribute) or callable(getattr(criterion, self.attribute)):
            names = hyperparameter_names(criterion)
            listed = ", ".join(names) if names else "(none)"
            raise ValueError(
                f"{name} cannot schedule {self.attribute!r}: the criterion "
                f"{type(criterion).__name__} has no hyper-parameter {self.attribute!r}; "
                f"its hyper-parameters are: {listed}"
            )
        return criterion

    def _progress(self, trainer: pl.Trainer) -> tuple[float, float | None]:
        """``(progress, total)`` for the interval."""
        if self.interval == "step":
            return trainer.global_step, trainer.estimated_stepping_batches
        max_epochs = trainer.max_epochs
        return (
            trainer.current_epoch,
            max_epochs if max_epochs is not None and max_epochs >= 0 else None,
        )

    def _set(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> float:
        """Compute the value for the current progress and set it on the criterion."""
        criterion = self._criterion(pl_module)
        progress, total = self._progress(trainer)
        try:
            value = float(self.schedule(progress, total))
        except ValueError as error:
            source = (
                f"trainer.global_step, total is trainer.estimated_stepping_batches={total!r}"
                if self.interval == "step"
                else f"trainer.current_epoch, total is trainer.max_epochs={trainer.max_epochs!r}"
            )
            raise ValueError(
                f"{type(self).__name__}({self.attribute!r}, interval={self.interval!r}): {error} "
                f"(progress is {source})"
            ) from error
        setattr(criterion, self.attribute, value)
        self.last_value = value
        return value

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._criterion(pl_module)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.interval == "epoch":
            self._set(trainer, pl_module)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        value = self._set(trainer, pl_module)
        per_step = self.interval == "step"
        pl_module.log(
            f"schedule/{self.attribute}",
            value,
            on_step=per_step,
            on_epoch=not per_step,
            batch_size=1,
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "attribute": self.attribute,
            "interval": self.interval,
            "last_value": self.last_value,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        last_value = state_dict.get("last_value")
        self.last_value = None if last_value is None else float(last_value)


class GammaAnnealing(LossScheduler):
    """Anneal ``criterion.gamma`` from ``start`` to ``end`` between ``begin`` and ``until``.

    TaiLr (seed 001) anneals the gamma of its gamma cross-entropy
    (:class:`lightning_losses.GammaCrossEntropyLoss`) from 0 (cross-entropy) towards 1 (the
    expected error ``1 - p_t``). With ``f = clamp((p - begin) / (until - begin), 0, 1)``::

        linear:  gamma = start + (end - start) * f
        cosine:  gamma = end + (start - end) * (1 + cos(pi f)) / 2

    Args:
        start: gamma up to ``begin``.
        end: gamma from ``until`` on.
        begin: where annealing begins: an absolute step or epoch (``int``) or a fraction of
            training (``float`` in ``[0, 1]``).
        until: where it ends, after ``begin``; same forms.
        shape: ``"linear"`` or ``"cosine"``.
        interval: ``"step"`` or ``"epoch"`` (see :class:`LossScheduler`).

    Example:
        >>> annealing = GammaAnnealing(start=0.0, end=1.0, begin=0, until=0.5)
        >>> annealing.schedule
        LinearSchedule(start_value=0.0, end_value=1.0, start=0, end=0.5)
        >>> annealing.schedule(100, total=1000), annealing.schedule(600, total=1000)
        (0.2, 1.0)
    """

    def __init__(
        self,
        start: float = 0.0,
        end: float = 1.0,
        begin: Boundary = 0,
        until: Boundary = 1.0,
        shape: str = "linear",
        interval: str = "step",
    ) -> None:
        if shape not in _SHAPES:
            raise ValueError(f"shape must be one of {tuple(_SHAPES)}; got {shape!r}")
        check_real("start", start)
        check_real("end", end)
        check_boundary("begin", begin)
        check_boundary("until", until)
        check_order("begin", begin, "until", until)
        schedule = _SHAPES[shape](start, end, start=begin, end=until)
        super().__init__("gamma", schedule, interval)
        self.start = start
        self.end = end
        self.begin = begin
        self.until = until
        self.shape = shape
