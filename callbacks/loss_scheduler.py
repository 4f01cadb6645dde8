"""``LossScheduler``: set a criterion hyper-parameter from a schedule of training progress."""

from __future__ import annotations

import copy
import math
from typing import Any, NamedTuple

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_losses.callbacks.criterion import DEFAULT_ATTRIBUTE, attribute_name, module_criterion
from lightning_losses.callbacks.loss_switch import LossSwitch
from lightning_losses.callbacks.schedules import (
    Boundary,
    CosineSchedule,
    Extreme,
    LinearSchedule,
    Schedule,
    check_boundary,
    check_order,
)
from lightning_losses.functional.checks import check_choice, check_int, check_real
from lightning_losses.loss_ranges import CALLBACK_COUNTS
from lightning_losses.warning import LightningLossesWarning

#: The bound of ``total`` (its one home: :mod:`lightning_losses.loss_ranges`).
_TOTAL = CALLBACK_COUNTS["GammaAnnealing"]["total"]

_INTERVALS = ("step", "epoch")
_SHAPES = {"linear": LinearSchedule, "cosine": CosineSchedule}


def hyperparameter_names(criterion: Any) -> list[str]:
    """The names a schedule may set on ``criterion``, for error messages.

    The keys of ``criterion.hyperparameters()`` when it has that method (the loss modules of
    this package do), otherwise its public numeric attributes.

    Example:
        >>> from lightning_losses import GammaCrossEntropyLoss
        >>> hyperparameter_names(GammaCrossEntropyLoss())
        ['gamma', 'threshold', 'label_smoothing']
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


def criterion_names(criterion: Any) -> set[str]:
    """The names a ``losses=[...]`` scope matches ``criterion`` by.

    Its class name and every registry name of its class.

    Example:
        >>> from lightning_losses import FocalLoss
        >>> sorted(criterion_names(FocalLoss()))
        ['FocalLoss', 'focal']
    """
    from lightning_losses.registry import available_losses, loss_class

    cls = type(criterion)
    return {cls.__name__} | {name for name in available_losses() if loss_class(name) is cls}


def _trainer_callbacks(trainer: pl.Trainer) -> list[Callback]:
    """``trainer.callbacks``."""
    # Lightning's callback connector sets the attribute, out of mypy's sight.
    return trainer.callbacks  # type: ignore[attr-defined]


def _check_scope(name: str, values: Any, kind: type) -> list | None:
    """``values`` as a list of ``kind`` (``None`` stays ``None``); ``ValueError`` otherwise."""
    if values is None:
        return None
    if isinstance(values, (str, int)) or not isinstance(values, (list, tuple)) or not values:
        raise ValueError(
            f"{name} must be a non-empty list of {kind.__name__}s or None; got {values!r}"
        )
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(f"{name}[{i}] must be a {kind.__name__}; got {value!r}")
        if kind is int and isinstance(value, int) and value < 0:
            raise ValueError(
                f"{name}[{i}] must be a LossSwitch criteria index (>= 0); got {value!r}"
            )
    return list(values)


def _accumulation_scheduler(trainer: pl.Trainer) -> GradientAccumulationScheduler | None:
    """The trainer's ``GradientAccumulationScheduler`` callback, if it has one."""
    for callback in _trainer_callbacks(trainer):
        if isinstance(callback, GradientAccumulationScheduler):
            return callback
    return None


def _accumulation(trainer: pl.Trainer, epoch: int) -> int:
    """The batches accumulated per optimizer step in ``epoch``."""
    scheduler = _accumulation_scheduler(trainer)
    if scheduler is None:
        return trainer.accumulate_grad_batches
    return scheduler.get_accumulate_grad_batches(epoch)


def _training_batches(trainer: pl.Trainer) -> float:
    """The training batches of an epoch, loading the training data if it is not loaded yet.

    As ``trainer.estimated_stepping_batches`` does; called once Lightning has restored a
    resumed run's loops (see :meth:`LossScheduler.on_fit_start`).
    """
    if trainer.train_dataloader is None:
        trainer.fit_loop.setup_data()
    return trainer.num_training_batches


def _known(total: float) -> bool:
    """Whether the trainer's estimate is a number of steps (not ``inf``, nor ``-1``)."""
    return math.isfinite(total) and total >= 0


class _Target(NamedTuple):
    """A criterion a schedule acts on, and the progress window where it is used."""

    criterion: Any
    first: float
    last: float
    label: str  # "" for the model's own criterion, else the LossSwitch phase


class LossScheduler(Callback):
    """Set ``pl_module.<attribute>.<hyperparameter>`` from a schedule of training progress.

    ``attribute`` is the module's attribute that holds the loss, ``"criterion"`` by default
    (:class:`~lightning_losses.lightning.mixin.LossMixin`'s); a module whose loss is
    ``self.loss_fn`` takes ``attribute="loss_fn"``. With ``interval="step"``, before each
    training batch::

        criterion.<hyperparameter> = schedule(trainer.global_step, total)

    where ``total`` is the number of optimizer steps of the run,
    ``trainer.estimated_stepping_batches`` (``max_steps``, or ``max_epochs`` times the
    optimizer steps per epoch: batches, after ``limit_train_batches``, over
    ``accumulate_grad_batches``, rounded up). The batches accumulated into one optimizer step
    share its ``global_step``, so they use the same value. With ``interval="epoch"``, at each
    epoch start and again before each batch (Lightning does not start an epoch that a resumed
    run continues, and a :class:`~lightning_losses.callbacks.LossSwitch` may have swapped the
    criterion)::

        criterion.<hyperparameter> = schedule(trainer.current_epoch, total)

    where ``total`` is ``trainer.max_epochs``, or fewer when ``max_steps`` ends training
    earlier. Progress runs over ``0, ..., total - 1``, and a boundary given as a fraction is
    the step (or epoch) ``round(fraction * (total - 1))``: ``1.0`` is the last one, so a
    schedule that ends at ``1.0`` (as :class:`GammaAnnealing` does by default) sets its end
    value for the last optimizer step (the last epoch) of training. A run stopped earlier
    (``max_time``, early stopping) never reaches it.

    Under a ``GradientAccumulationScheduler`` whose accumulation changes between epochs, each
    epoch's optimizer steps are counted with its own accumulation (Lightning's estimate takes
    one for all epochs). When the trainer cannot tell the total (``max_epochs=-1`` without
    ``max_steps``, or an iterable training set without a length and without ``max_steps``), a
    schedule with fraction boundaries stops before the first step with a ``ValueError`` that
    names ``total``: pass ``total=`` (the number of optimizer steps, or of epochs), or give the
    boundaries as ``int`` steps. A given ``total`` is used instead of the trainer's.

    The value is logged as ``schedule/<hyperparameter>``, per step or per epoch, unless the
    module logs ``criterion/<hyperparameter>`` itself (as
    :meth:`~lightning_losses.lightning.mixin.LossMixin.compute_loss` does in training for the
    hyper-parameters that a schedule names in :meth:`changed_hyperparameters`): one metric per
    quantity. It is recomputed from the trainer's progress each time, like Lightning's
    ``GradientAccumulationScheduler``, so a run resumed from a checkpoint continues the schedule
    exactly; no value is taken from the checkpoint.

    The total the schedule was timed with is saved in checkpoints (``total``): a run resumed
    with another length of training (another ``max_epochs`` or ``max_steps``) warns once,
    naming both totals, because its fraction boundaries then fall on other steps. Boundaries
    given as ``int`` (absolute steps or epochs) do not depend on the total and keep their
    timing without a warning.

    Checked before any training step: in ``setup("fit")``, that the LightningModule has the
    loss ``attribute`` (a ``ValueError`` naming it, this callback and the module's attributes
    that do hold a loss) with the ``hyperparameter``; then that every value bounding the
    schedule over training
    (:meth:`~lightning_losses.callbacks.schedules.Schedule.extremes`: the start and end values,
    each value of a step schedule, up to the last step inclusive) passes the criterion's
    ``check_hyperparameters()`` when it has one. With a
    :class:`~lightning_losses.callbacks.LossSwitch` of the same ``attribute``, each of its
    criteria is checked, with the values of the epochs where it is used. A failure is a
    ``ValueError`` naming this callback, the hyper-parameter, the value and where the schedule
    reaches it. The values are checked in ``on_fit_start`` (before the sanity check) for an
    epoch schedule without ``max_steps``, or when the training data is loaded already;
    otherwise when the sanity check starts, or without one when training starts: reading
    ``estimated_stepping_batches`` earlier would load the training data before Lightning
    restores a resumed run's loader position.

    The schedule replaces whatever value the criterion was given. When that value differs
    from the schedule's where it takes over (e.g. ``FocalLoss(gamma=2.0)`` under
    ``GammaAnnealing(start=0.0)``, or a :class:`~lightning_losses.callbacks.LossSwitch` stage
    ``{"name": "focal", "gamma": 2.0}``), a warning says so once, before the first training
    step, naming this callback, the criterion, the value given and the value set. To leave a
    criterion alone, scope the schedule: ``stages=[1]`` acts only on ``LossSwitch`` criteria
    ``[1]``, ``losses=["gamma_ce"]`` only on criteria of those losses (registry or class
    names). Out of its scope the schedule sets and logs nothing; a scope that matches no
    criterion of the run is an error at set-up.

    Args:
        hyperparameter: the criterion's hyper-parameter to set, e.g. ``"gamma"``.
        schedule: a :class:`~lightning_losses.callbacks.schedules.Schedule` (or any callable
            ``schedule(progress, total) -> float``).
        interval: ``"step"`` (progress is the global step) or ``"epoch"``.
        stages: act only on these :class:`~lightning_losses.callbacks.LossSwitch` criteria
            (indices into its ``criteria``); needs a ``LossSwitch``. ``None``: every stage.
        losses: act only on criteria of these losses (registry names such as ``"focal"`` or
            class names such as ``"FocalLoss"``). ``None``: any criterion.
        attribute: the LightningModule's attribute that holds the loss.
        total: the number of optimizer steps (``interval="step"``) or epochs of training that
            fractions are taken of; ``None``: the trainer's (see above).

    Example:
        >>> from lightning_losses.callbacks import LinearSchedule
        >>> scheduler = LossScheduler("gamma", LinearSchedule(0.0, 1.0, end=0.5))
        >>> scheduler.state_key
        "LossScheduler{'attribute': 'gamma'}"
        >>> scheduler.schedule(250, 1001), scheduler.schedule(500, 1001)
        (0.5, 1.0)
    """

    def __init__(
        self,
        hyperparameter: str | None = None,
        schedule: Schedule | None = None,
        interval: str = "step",
        stages: list[int] | None = None,
        losses: list[str] | None = None,
        attribute: str = DEFAULT_ATTRIBUTE,
        total: int | None = None,
    ) -> None:
        name = type(self).__name__
        if hyperparameter is None:
            raise ValueError(
                f"{name} needs hyperparameter=, the criterion's hyper-parameter to set (e.g. "
                f"'gamma'); attribute= names the LightningModule's attribute that holds the "
                f"loss (default 'criterion'; got attribute={attribute!r})"
            )
        if not isinstance(hyperparameter, str) or not hyperparameter.isidentifier():
            raise ValueError(
                f"hyperparameter must be an attribute name of the criterion; got {hyperparameter!r}"
            )
        if not callable(schedule):
            raise ValueError(
                f"schedule must be callable as schedule(progress, total); got {schedule!r}"
            )
        check_choice("interval", interval, _INTERVALS)
        self.hyperparameter = hyperparameter
        self.schedule = schedule
        self.interval = interval
        self.stages = _check_scope("stages", stages, int)
        self.losses = _check_scope("losses", losses, str)
        self.attribute = attribute_name(attribute, name)
        self.given_total = None if total is None else check_int("total", total, **_TOTAL)
        #: The value set last; saved in checkpoints for information only (resuming recomputes it).
        self.last_value: float | None = None
        #: The total the schedule is timed with (set when fitting starts; saved in checkpoints).
        self.total: float | None = None
        self._saved_total: float | None = None
        self._checked = False
        self._value: float | None = None  # set for the current batch, logged at its end

    @property
    @override
    def state_key(self) -> str:
        # 'attribute' names the hyper-parameter, as in the checkpoints saved before the loss's
        # own attribute could be chosen; a loss attribute other than the default is added.
        if self.attribute == DEFAULT_ATTRIBUTE:
            return self._generate_state_key(attribute=self.hyperparameter)
        return self._generate_state_key(attribute=self.hyperparameter, loss=self.attribute)

    @property
    def target_name(self) -> str:
        """``"criterion.gamma"``: the loss attribute and the hyper-parameter, for messages."""
        return f"{self.attribute}.{self.hyperparameter}"

    def changed_hyperparameters(self) -> set[str]:
        """``{hyperparameter}``: the criterion hyper-parameter this schedule changes.

        :class:`~lightning_losses.lightning.mixin.LossMixin` logs the hyper-parameters that some
        callback names here as ``criterion/<name>`` metrics; the constant ones stay params.

        Example:
            >>> GammaAnnealing().changed_hyperparameters()
            {'gamma'}
        """
        return {self.hyperparameter}

    def _criterion(self, pl_module: pl.LightningModule) -> Any:
        """The module's loss, checked to have ``hyperparameter``; ``ValueError`` otherwise."""
        criterion = module_criterion(pl_module, self.attribute, type(self).__name__)
        self._check_attribute(criterion, "")
        return criterion

    def _check_attribute(self, criterion: Any, label: str) -> None:
        """``ValueError`` unless ``criterion`` has the (non-method) ``hyperparameter``."""
        name = self.hyperparameter
        if hasattr(criterion, name) and not callable(getattr(criterion, name)):
            return
        names = hyperparameter_names(criterion)
        listed = ", ".join(names) if names else "(none)"
        where = f" of {label}" if label else ""
        raise ValueError(
            f"{type(self).__name__} cannot schedule {name!r}: the criterion "
            f"{type(criterion).__name__}{where} has no hyper-parameter {name!r}; "
            f"its hyper-parameters are: {listed}"
        )

    def _trainer_total(self, trainer: pl.Trainer) -> tuple[float | None, str]:
        """The trainer's number of steps (or epochs), ``None`` if unknown; and its source."""
        max_epochs, max_steps = trainer.max_epochs, trainer.max_steps
        source = f"max_epochs={max_epochs!r}, max_steps={max_steps!r}"
        if self.interval == "step":
            scheduler = _accumulation_scheduler(trainer)
            if scheduler is None or max_epochs is None or max_epochs < 0:
                steps = trainer.estimated_stepping_batches
                source = f"trainer.estimated_stepping_batches={steps!r} ({source})"
                return (steps if _known(steps) else None), source
            # Lightning's estimate takes one accumulation for every epoch: count each epoch's.
            ends = self._epoch_starts(trainer, max(max_epochs, 1))
            source = f"the optimizer steps of each epoch under {scheduler.scheduling}, {source}"
            if ends is None:
                return (max_steps if max_steps >= 0 else None), source
            return (ends[-1] if max_steps < 0 else min(ends[-1], max_steps)), source
        epochs = max_epochs if max_epochs is not None and max_epochs >= 0 else None
        source = f"trainer.{source}"
        if max_steps is not None and max_steps >= 0:
            by_steps = self._epochs_of_steps(trainer, max_steps, epochs)
            if by_steps is not None:
                epochs = by_steps
                source += f", the epochs that {max_steps} optimizer steps take"
        return epochs, source

    def _epoch_starts(self, trainer: pl.Trainer, epochs: int) -> list[int] | None:
        """The global step at which each epoch ``0..epochs`` starts (``None``: epochs unknown).

        An epoch takes its batches (after ``limit_train_batches``) over its accumulation,
        rounded up: Lightning steps the optimizer on an epoch's last batch too.
        """
        batches = _training_batches(trainer)
        if not math.isfinite(batches):
            return None
        starts = [0]
        for epoch in range(epochs):
            starts.append(starts[-1] + math.ceil(batches / _accumulation(trainer, epoch)))
        return starts

    def _epochs_of_steps(self, trainer: pl.Trainer, steps: int, cap: int | None) -> int | None:
        """How many epochs ``steps`` optimizer steps take (at most ``cap``); ``None``: unknown."""
        batches = _training_batches(trainer)
        if not math.isfinite(batches) or batches <= 0:
            return None
        epochs, start = 0, 0
        while start < steps and (cap is None or epochs < cap):
            start += math.ceil(batches / _accumulation(trainer, epochs))
            epochs += 1
        return epochs

    def _total(self, trainer: pl.Trainer) -> float | None:
        """The total the schedule is timed with: ``total=`` if given, else the trainer's."""
        if self.given_total is not None:
            return self.given_total
        return self._trainer_total(trainer)[0]

    def _unknown_total(self, trainer: pl.Trainer) -> ValueError:
        """The error of a schedule with fraction boundaries in a run of unknown length."""
        unit = "optimizer steps" if self.interval == "step" else "epochs"
        name = type(self).__name__
        return ValueError(
            f"{name}({self.target_name}): the schedule {self.schedule!r} has boundaries "
            f"given as fractions of training, but the number of {unit} of this run is unknown "
            f"({self._trainer_total(trainer)[1]}): pass total=<the number of {unit}> to "
            f"{name}, or give the boundaries as ints (absolute {self.interval}s)"
        )

    def _progress(self, trainer: pl.Trainer) -> tuple[float, float | None]:
        """``(progress, total)`` for the interval."""
        progress = trainer.global_step if self.interval == "step" else trainer.current_epoch
        return progress, self.total

    def _schedule_error(self, error: ValueError, trainer: pl.Trainer, total: Any) -> ValueError:
        """``error`` of the schedule, prefixed with this callback and where its total came from."""
        source = (
            f"trainer.global_step, total={total!r} optimizer steps"
            if self.interval == "step"
            else f"trainer.current_epoch, total={total!r} epochs"
        )
        return ValueError(
            f"{type(self).__name__}({self.hyperparameter!r}, interval={self.interval!r}): "
            f"{error} (progress is {source})"
        )

    def _switches(self, trainer: pl.Trainer) -> list[LossSwitch]:
        """The trainer's :class:`LossSwitch` callbacks that set this schedule's loss attribute."""
        return [
            c
            for c in _trainer_callbacks(trainer)
            if isinstance(c, LossSwitch) and c.attribute == self.attribute
        ]

    def _stage(self, trainer: pl.Trainer) -> int | None:
        """The current :class:`LossSwitch` criteria index; ``None`` without a switch."""
        switches = self._switches(trainer)
        return switches[0].index(trainer.current_epoch) if switches else None

    def _in_scope(self, criterion: Any, stage: int | None) -> bool:
        """Whether ``criterion`` (of LossSwitch stage ``stage``) is in ``stages``/``losses``."""
        if self.stages is not None and stage not in self.stages:
            return False
        return self.losses is None or bool(criterion_names(criterion) & set(self.losses))

    def _scope_text(self) -> str:
        """``" (only LossSwitch criteria [1])"``, ``" (only losses ['focal'])"`` or ``""``."""
        parts = []
        if self.stages is not None:
            parts.append(f"only LossSwitch criteria {self.stages}")
        if self.losses is not None:
            parts.append(f"only losses {self.losses}")
        return f" ({'; '.join(parts)})" if parts else ""

    def _set(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> float | None:
        """Compute the value for the current progress and set it on the criterion.

        Returns ``None`` (and sets nothing) when the current criterion is out of scope.
        """
        if not self._checked:
            self._check(trainer, pl_module)
        criterion = getattr(pl_module, self.attribute, None)
        if criterion is not None and not self._in_scope(criterion, self._stage(trainer)):
            return None
        criterion = self._criterion(pl_module)
        progress, total = self._progress(trainer)
        try:
            value = float(self.schedule(progress, total))
        except ValueError as error:
            raise self._schedule_error(error, trainer, total) from error
        setattr(criterion, self.hyperparameter, value)
        self.last_value = value
        return value

    def _targets(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, total: float | None
    ) -> list[_Target]:
        """The criteria the schedule will act on, each with its window of progress.

        The model's criterion over ``[0, total - 1]``; with a :class:`LossSwitch`, instead, each
        of its criteria over the steps (or epochs) of its phase that lie in training.
        """
        end = math.inf if total is None else max(total - 1, 0)
        switches = self._switches(trainer)
        if not switches:
            criterion = self._criterion(pl_module)
            return [_Target(criterion, 0, end, "")] if self._in_scope(criterion, None) else []
        targets = []
        for switch in switches:
            for index, criterion in enumerate(switch.modules):
                first_epoch, stop_epoch = switch.epochs(index)
                first, last = 0, end
                horizon = first_epoch if stop_epoch is None else stop_epoch
                starts = (
                    list(range(horizon + 1))
                    if self.interval == "epoch"
                    else self._epoch_starts(trainer, horizon)
                )
                if starts is not None:
                    first = starts[first_epoch]
                    if stop_epoch is not None:
                        last = min(starts[stop_epoch] - 1, end)
                if not self._in_scope(criterion, index):
                    continue
                if first == 0 or first <= end:
                    targets.append(_Target(criterion, first, last, switch.describe(index)))
        return targets

    def _extremes(self, first: float, last: float, total: float | None) -> list[Extreme]:
        """The values bounding the schedule over ``[first, last]`` (a plain callable: its ends)."""
        if isinstance(self.schedule, Schedule):
            return self.schedule.extremes(first, last, total)
        ends = [first] if not math.isfinite(last) else [first, last]
        return [(p, float(self.schedule(p, total))) for p in ends]

    def _where(self, progress: float, total: float | None) -> str:
        """``"step 12"``, ``"epoch 19 (the last epoch)"``, ..."""
        if not math.isfinite(progress):
            return "the end of training"
        text = f"{self.interval} {int(progress)}"
        return f"{text} (the last {self.interval})" if total and progress == total - 1 else text

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
            setattr(probe, self.hyperparameter, float(value))
            try:
                probe.check_hyperparameters()
            except (ValueError, TypeError) as error:
                where = f" of {target.label}" if target.label else ""
                raise ValueError(
                    f"{type(self).__name__} ({self.target_name}): the schedule reaches "
                    f"{self.hyperparameter}={float(value)!r} at {self._where(progress, total)}, "
                    f"but {type(target.criterion).__name__}{where} rejects it: {error}"
                ) from error

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        switched = bool(self._switches(trainer))
        if self.stages is not None and not switched:
            raise ValueError(
                f"{type(self).__name__}(stages={self.stages}) scopes the schedule to LossSwitch "
                "criteria, but the trainer has no LossSwitch callback; use losses=[...] to "
                "scope it to a loss, or leave stages=None"
            )
        if switched:  # the switch's criteria are checked in _check, once they are built
            module_criterion(pl_module, self.attribute, type(self).__name__)
            return
        criterion = module_criterion(pl_module, self.attribute, type(self).__name__)
        if not self._in_scope(criterion, None):
            raise ValueError(
                f"{type(self).__name__}(losses={self.losses}) acts on no criterion of this run: "
                f"{type(pl_module).__name__}.{self.attribute} is {type(criterion).__name__} "
                f"(names {sorted(criterion_names(criterion))}); add one of those names to losses"
            )
        self._criterion(pl_module)

    def _check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Record the total and check the schedule against every criterion it will act on.

        Also warns, once, about each criterion whose given value the schedule replaces.
        """
        if self._checked:
            return
        self._checked = True
        total = self._total(trainer)
        if total is None and getattr(self.schedule, "uses_fractions", False):
            raise self._unknown_total(trainer)
        self.total = total
        targets = self._targets(trainer, pl_module, total)
        if not targets:
            raise ValueError(
                f"{type(self).__name__}{self._scope_text()} acts on no criterion of this run: "
                "no LossSwitch criterion used in training is in its scope"
            )
        replaced = []
        for target in targets:
            self._check_attribute(target.criterion, target.label)
            self._check_values(trainer, target, total)
            given = getattr(target.criterion, self.hyperparameter)
            first = float(self.schedule(target.first, total))
            if isinstance(given, (int, float)) and float(given) != first:
                name = target.label or type(target.criterion).__name__
                replaced.append(
                    f"{name} was given {self.hyperparameter}={given!r}, the schedule sets "
                    f"{first!r} at {self._where(target.first, total)}"
                )
        if replaced:
            rank_zero_warn(
                f"{type(self).__name__} sets {self.target_name} from its schedule, "
                f"replacing the value given: {'; '.join(replaced)}. To leave a criterion's "
                "value alone, scope the schedule with stages=[...] (LossSwitch criteria "
                "indices) or losses=[...] (loss names).",
                category=LightningLossesWarning,
            )

    def describe(self) -> str:
        """One line for the fit summary: the hyper-parameter, the schedule, the interval, the scope.

        Example:
            >>> from lightning_losses.callbacks import ConstantSchedule
            >>> LossScheduler("gamma", ConstantSchedule(2.0), losses=["focal"]).describe()[-32:]
            "per step (only losses ['focal'])"
        """
        return (
            f"{type(self).__name__}: {self.target_name} = {self.schedule!r} per "
            f"{self.interval}{self._scope_text()}"
        )

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Check now if the total is known without loading the training data early.

        A step schedule's total, ``trainer.estimated_stepping_batches``, loads the training
        data when it is not loaded yet (as does an epoch schedule's under ``max_steps``, which
        needs the steps per epoch); here, before Lightning restores the loops of a resumed run,
        that would lose the restored position of a resumable loader. Such a check waits for
        the sanity check or, without one, for the start of training: still before the first
        training step.
        """
        self._checked = False
        max_steps = trainer.max_steps
        needs_data = self.interval == "step" or (max_steps is not None and max_steps >= 0)
        if not needs_data or trainer.train_dataloader is not None:
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
        source = "total=" if self.given_total is not None else "trainer.max_epochs"
        if self.interval == "step" and self.given_total is None:
            source = "trainer.estimated_stepping_batches"
        rank_zero_warn(
            f"{type(self).__name__} ({self.target_name}): the checkpoint's schedule "
            f"was timed for a total of {saved!r} {unit} ({source}), this run's total is "
            f"{self.total!r}; the schedule {self.schedule!r} has boundaries given as fractions "
            "of training, so from the resumed step on they fall on other steps and its values "
            "change. To keep its timing when the length of training changes, give the "
            f"boundaries as ints (absolute {unit}): int boundaries do not depend on the total.",
            category=LightningLossesWarning,
        )

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.interval == "epoch":
            self._set(trainer, pl_module)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._value = self._set(trainer, pl_module)

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Log the value set for this batch, unless the module logs it itself.

        A module that logs ``criterion/<hyperparameter>`` in its training step (as
        :meth:`~lightning_losses.lightning.mixin.LossMixin.compute_loss` does) already records
        the value: one metric per quantity.
        """
        value, self._value = self._value, None
        if value is None or f"criterion/{self.hyperparameter}" in trainer.callback_metrics:
            return
        per_step = self.interval == "step"
        pl_module.log(
            f"schedule/{self.hyperparameter}",
            value,
            on_step=per_step,
            on_epoch=not per_step,
            batch_size=1,
            # The same value on every process: an epoch value reduced with max is exact (and
            # Lightning does not warn about an unsynchronized epoch metric).
            sync_dist=not per_step,
            reduce_fx="max",
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "attribute": self.hyperparameter,
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

    ``p`` is the optimizer step ``0, ..., T - 1`` of a run of ``T`` steps (the epoch with
    ``interval="epoch"``), and a fraction boundary ``b`` is the step ``round(b * (T - 1))``: with
    the defaults ``begin=0, until=1.0`` the first step uses ``start`` and the last one ``end``
    exactly, ``gamma = start + (end - start) * p / (T - 1)``.

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
        stages: act only on these :class:`~lightning_losses.callbacks.LossSwitch` criteria
            (see :class:`LossScheduler`); ``None``: every stage.
        losses: act only on criteria of these losses, e.g. ``["gamma_ce"]``; ``None``: any.
        attribute: the LightningModule's attribute that holds the loss (``"loss_fn"`` for a
            module that computes ``self.loss_fn(logits, target)``).
        total: the number of optimizer steps (or epochs, with ``interval="epoch"``) that the
            fractions are taken of; ``None``: the trainer's. Needed when the trainer cannot
            tell (``max_epochs=-1``), see :class:`LossScheduler`.

    Example:
        >>> annealing = GammaAnnealing(start=0.0, end=1.0, begin=0, until=0.5)
        >>> annealing.schedule
        LinearSchedule(start_value=0.0, end_value=1.0, start=0, end=0.5)
        >>> annealing.schedule(100, total=1001), annealing.schedule(600, total=1001)
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
        stages: list[int] | None = None,
        losses: list[str] | None = None,
        attribute: str = DEFAULT_ATTRIBUTE,
        total: int | None = None,
    ) -> None:
        check_choice("shape", shape, tuple(_SHAPES))
        check_real("start", start)
        check_real("end", end)
        check_boundary("begin", begin)
        check_boundary("until", until)
        check_order("begin", begin, "until", until)
        schedule = _SHAPES[shape](start, end, start=begin, end=until)
        super().__init__(
            "gamma", schedule, interval, stages, losses, attribute=attribute, total=total
        )
        self.start = start
        self.end = end
        self.begin = begin
        self.until = until
        self.shape = shape

    def _boundary_text(self, boundary: Boundary) -> str:
        """``"step 0"`` for an int boundary, ``"50% of training"`` for a fraction."""
        if isinstance(boundary, int):
            return f"{self.interval} {boundary}"
        return f"{boundary:.0%} of training"

    @override
    def describe(self) -> str:
        """One line for the fit summary.

        Example:
            >>> GammaAnnealing(0.0, 1.0, begin=0, until=0.5).describe()
            'GammaAnnealing: gamma 0.0 -> 1.0, linear, from step 0 to 50% of training'
        """
        where = "" if self.attribute == DEFAULT_ATTRIBUTE else f"{self.attribute}."
        return (
            f"GammaAnnealing: {where}gamma {self.start!r} -> {self.end!r}, {self.shape}, from "
            f"{self._boundary_text(self.begin)} to {self._boundary_text(self.until)}"
            f"{self._scope_text()}"
        )
