"""``LossScheduler``: set a criterion hyper-parameter from a schedule of training progress."""

from __future__ import annotations

import copy
import math
from typing import Any, NamedTuple

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from .loss_switch import LossSwitch
from .schedules import (
    Boundary,
    CosineSchedule,
    Extreme,
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


class _Target(NamedTuple):
    """A criterion a schedule acts on, and the progress window where it is used."""

    criterion: Any
    first: float
    last: float
    label: str  # "" for the model's own criterion, else the LossSwitch phase


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
    so a run resumed from a checkpoint continues the schedule exactly; no value is taken from
    the checkpoint.

    The total is ``trainer.estimated_stepping_batches`` (steps) or ``trainer.max_epochs``; it
    only matters for boundaries given as fractions. The total the schedule was timed with is
    saved in checkpoints (``total``): a run resumed with another length of training (another
    ``max_epochs`` or ``max_steps``) warns once, naming both totals, because its fraction
    boundaries then fall on other steps. Boundaries given as ``int`` (absolute steps or
    epochs) do not depend on the total and keep their timing without a warning.

    Checked before any training step: in ``setup("fit")``, that the LightningModule has a
    ``criterion`` (see :class:`lightning_losses.mixins.LossMixin`) with ``attribute``; then
    that every value bounding the schedule over training
    (:meth:`~lightning_losses.callbacks.schedules.Schedule.extremes`: the start and end values,
    each value of a step schedule, up to the end of training inclusive) passes the criterion's
    ``check_hyperparameters()`` when it has one. With a
    :class:`~lightning_losses.callbacks.LossSwitch`, each of its criteria is checked, with the
    values of the epochs where it is used. A failure is a ``ValueError`` naming this callback,
    the attribute, the value and where the schedule reaches it. The values are checked in
    ``on_fit_start`` (before the sanity check) for an epoch schedule, or a step schedule whose
    training data is loaded already; otherwise when the sanity check starts, or without one
    when training starts: reading ``estimated_stepping_batches`` earlier would load the
    training data before Lightning restores a resumed run's loader position.

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
        #: The total the schedule is timed with (set when fitting starts; saved in checkpoints).
        self.total: float | None = None
        self._saved_total: float | None = None
        self._checked = False

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(attribute=self.attribute)

    def _criterion(self, pl_module: pl.LightningModule) -> Any:
        """``pl_module.criterion``, checked to have ``attribute``; ``ValueError`` otherwise."""
        criterion = getattr(pl_module, "criterion", None)
        if criterion is None:
            raise ValueError(
                f"{type(self).__name__} sets criterion.{self.attribute}, but "
                f"{type(pl_module).__name__} has no criterion: mix in "
                "lightning_losses.mixins.LossMixin and call self.set_criterion(...), or set "
                "self.criterion in __init__"
            )
        self._check_attribute(criterion, "")
        return criterion

    def _check_attribute(self, criterion: Any, label: str) -> None:
        """``ValueError`` unless ``criterion`` has the (non-method) ``attribute``."""
        if hasattr(criterion, self.attribute) and not callable(getattr(criterion, self.attribute)):
            return
        names = hyperparameter_names(criterion)
        listed = ", ".join(names) if names else "(none)"
        where = f" of {label}" if label else ""
        raise ValueError(
            f"{type(self).__name__} cannot schedule {self.attribute!r}: the criterion "
            f"{type(criterion).__name__}{where} has no hyper-parameter {self.attribute!r}; "
            f"its hyper-parameters are: {listed}"
        )

    def _total(self, trainer: pl.Trainer) -> float | None:
        """The total of the interval: estimated stepping batches, or ``max_epochs`` if set."""
        if self.interval == "step":
            return trainer.estimated_stepping_batches
        max_epochs = trainer.max_epochs
        return max_epochs if max_epochs is not None and max_epochs >= 0 else None

    def _progress(self, trainer: pl.Trainer) -> tuple[float, float | None]:
        """``(progress, total)`` for the interval."""
        progress = trainer.global_step if self.interval == "step" else trainer.current_epoch
        return progress, self._total(trainer)

    def _schedule_error(self, error: ValueError, trainer: pl.Trainer, total: Any) -> ValueError:
        """``error`` of the schedule, prefixed with this callback and where its total came from."""
        source = (
            f"trainer.global_step, total is trainer.estimated_stepping_batches={total!r}"
            if self.interval == "step"
            else f"trainer.current_epoch, total is trainer.max_epochs={trainer.max_epochs!r}"
        )
        return ValueError(
            f"{type(self).__name__}({self.attribute!r}, interval={self.interval!r}): {error} "
            f"(progress is {source})"
        )

    def _set(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> float:
        """Compute the value for the current progress and set it on the criterion."""
        criterion = self._criterion(pl_module)
        progress, total = self._progress(trainer)
        try:
            value = float(self.schedule(progress, total))
        except ValueError as error:
            raise self._schedule_error(error, trainer, total) from error
        setattr(criterion, self.attribute, value)
        self.last_value = value
        return value

    def _steps_per_epoch(self, trainer: pl.Trainer) -> int | None:
        """Optimizer steps per epoch, or ``None`` when the epoch length is unknown."""
        batches = trainer.num_training_batches
        if not math.isfinite(batches):
            return None
        return math.ceil(batches / trainer.accumulate_grad_batches)

    def _targets(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, total: float | None
    ) -> list[_Target]:
        """The criteria the schedule will act on, each with its window of progress.

        The model's criterion over ``[0, total]``; with a :class:`LossSwitch`, instead, each of
        its criteria over the steps (or epochs) of its phase that lie in training.
        """
        end = math.inf if total is None else total
        switches = [c for c in trainer.callbacks if isinstance(c, LossSwitch)]
        if not switches:
            return [_Target(self._criterion(pl_module), 0, end, "")]
        per_epoch = 1 if self.interval == "epoch" else self._steps_per_epoch(trainer)
        targets = []
        for switch in switches:
            for index, criterion in enumerate(switch.modules):
                first_epoch, stop_epoch = switch.epochs(index)
                first, last = 0, end
                if per_epoch is not None:
                    first = first_epoch * per_epoch
                    if stop_epoch is not None:
                        last = min(stop_epoch * per_epoch - 1, end)
                if first == 0 or first < end:
                    targets.append(_Target(criterion, first, last, switch.describe(index)))
        return targets

    def _extremes(self, first: float, last: float, total: float | None) -> list[Extreme]:
        """The values bounding the schedule over ``[first, last]`` (a plain callable: its ends)."""
        if isinstance(self.schedule, Schedule):
            return self.schedule.extremes(first, last, total)
        ends = [first] if not math.isfinite(last) else [first, last]
        return [(p, float(self.schedule(p, total))) for p in ends]

    def _where(self, progress: float, total: float | None) -> str:
        """``"step 12"``, ``"epoch 20 (the end of training)"``, ..."""
        if not math.isfinite(progress):
            return "the end of training"
        text = f"{self.interval} {int(progress)}"
        return f"{text} (the end of training)" if progress == total else text

    def _check_values(self, trainer: pl.Trainer, target: _Target, total: float | None) -> None:
        """Each value bounding the schedule in ``target``'s window passes its criterion's check.

        The values are set on a copy of the criterion and checked with its
        ``check_hyperparameters()``; a criterion without that method is not checked (but the
        schedule's boundaries are still resolved, so a fraction without a total fails here).
        """
        try:
            extremes = self._extremes(target.first, target.last, total)
        except ValueError as error:
            raise self._schedule_error(error, trainer, total) from error
        if not callable(getattr(target.criterion, "check_hyperparameters", None)):
            return
        probe = copy.deepcopy(target.criterion)
        for progress, value in extremes:
            setattr(probe, self.attribute, float(value))
            try:
                probe.check_hyperparameters()
            except (ValueError, TypeError) as error:
                where = f" of {target.label}" if target.label else ""
                raise ValueError(
                    f"{type(self).__name__} (criterion.{self.attribute}): the schedule reaches "
                    f"{self.attribute}={float(value)!r} at {self._where(progress, total)}, but "
                    f"{type(target.criterion).__name__}{where} rejects it: {error}"
                ) from error

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._criterion(pl_module)

    def _check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Record the total and check the schedule against every criterion it will act on."""
        if self._checked:
            return
        self._checked = True
        total = self._total(trainer)
        self.total = total
        for target in self._targets(trainer, pl_module, total):
            self._check_attribute(target.criterion, target.label)
            self._check_values(trainer, target, total)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Check now if the total is known without loading the training data early.

        A step schedule's total, ``trainer.estimated_stepping_batches``, loads the training
        data when it is not loaded yet; here, before Lightning restores the loops of a
        resumed run, that would lose the restored position of a resumable loader. Such a
        check waits for the sanity check or, without one, for the start of training: still
        before the first training step.
        """
        self._checked = False
        if self.interval == "epoch" or trainer.train_dataloader is not None:
            self._check(trainer, pl_module)

    @override
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check(trainer, pl_module)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Check (if not done yet), then warn once if the schedule's total has changed."""
        self._check(trainer, pl_module)
        saved, self._saved_total = self._saved_total, None
        if saved is None or saved == self.total:
            return
        if not getattr(self.schedule, "uses_fractions", True):
            return
        unit = "steps" if self.interval == "step" else "epochs"
        source = "trainer.max_epochs"
        if self.interval == "step":
            source = "trainer.estimated_stepping_batches"
        rank_zero_warn(
            f"{type(self).__name__} (criterion.{self.attribute}): the checkpoint's schedule "
            f"was timed for a total of {saved!r} {unit} ({source}), this run's total is "
            f"{self.total!r}; the schedule {self.schedule!r} has boundaries given as fractions "
            "of training, so from the resumed step on they fall on other steps and its values "
            "change. To keep its timing when the length of training changes, give the "
            f"boundaries as ints (absolute {unit}): int boundaries do not depend on the total."
        )

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
            "total": self.total,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        last_value = state_dict.get("last_value")
        self.last_value = None if last_value is None else float(last_value)
        self._saved_total = state_dict.get("total")


class GammaAnnealing(LossScheduler):
    """Anneal ``criterion.gamma`` from ``start`` to ``end`` between ``begin`` and ``until``.

    TaiLr
    (Su Jianlin, "A simple remedy for the overconfidence of cross-entropy")
    anneals the gamma of its gamma cross-entropy
    (:class:`lightning_losses.GammaCrossEntropyLoss`) from 0 (cross-entropy) towards 1 (the
    expected error ``1 - p_t``). With ``f = clamp((p - begin) / (until - begin), 0, 1)``::

        linear:  gamma = start + (end - start) * f
        cosine:  gamma = end + (start - end) * (1 + cos(pi f)) / 2

    Args:
        start: gamma up to ``begin``.
        end: gamma from ``until`` on.
        begin: where annealing begins: an absolute step or epoch (``int``) or a fraction of
            training (``float`` in ``[0, 1]``). Ints keep their timing when a resumed run
            changes the length of training; fractions move (with a warning, see
            :class:`LossScheduler`).
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
