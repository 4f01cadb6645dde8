"""``LossMixin``: a swappable, schedulable criterion for any LightningModule."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from lightning_losses.lightning.class_path import instantiate
from lightning_losses.registry import get_loss

if TYPE_CHECKING:
    import lightning as L

#: Lightning precisions that keep the weights and optimizer state in half precision too (no
#: float32 copy), with the float32 precision to suggest instead (weights in float32).
TRUE_HALF_PRECISIONS = {"16-true": "16-mixed", "bf16-true": "bf16-mixed"}


def non_finite_message(what: str, precision: str, step: int) -> str:
    """The one-line stop of a training step that gave non-finite values under ``precision``.

    Example:
        >>> non_finite_message("loss", "16-true", 3)  # doctest: +ELLIPSIS
        'non-finite loss (nan or inf) at global_step 3 under trainer.precision=16-true: ...'
    """
    dtype = "bfloat16" if precision.startswith("bf16") else "float16"
    suggested = TRUE_HALF_PRECISIONS[precision]
    other = "bf16-mixed" if suggested == "16-mixed" else "16-mixed"
    return (
        f"non-finite {what} (nan or inf) at global_step {step} under "
        f"trainer.precision={precision}: the weights and the optimizer state are {dtype}, too "
        f"coarse for the updates; use --trainer.precision={suggested} (or {other}), which "
        f"keeps float32 weights and computes in {dtype}"
    )


#: What a criterion may be given as: a registry name, a ``class_path`` mapping, or the loss.
CriterionSpec = str | Mapping[str, Any] | nn.Module | Callable[[Tensor, Tensor], Tensor]


def build_criterion(
    spec: CriterionSpec, **hyperparameters: Any
) -> Callable[[Tensor, Tensor], Tensor]:
    """Turn a criterion specification into a callable ``criterion(logits, target)``.

    Args:
        spec: a registry name (``"focal"``), a mapping ``{"class_path": ..., "init_args":
            {...}}`` as written in YAML (``class_path`` may also be a registry name), a mapping
            ``{"name": "focal", "gamma": 2.0}``, or a loss module / callable used as it is.
        **hyperparameters: keyword arguments for a name or ``class_path`` spec.

    Example:
        >>> build_criterion({"class_path": "lightning_losses.FocalLoss", "init_args": {"gamma": 1.0}})
        FocalLoss(gamma=1.0, reduction='mean')
        >>> build_criterion("gamma_ce", gamma=0.0)
        GammaCrossEntropyLoss(gamma=0.0, threshold=0.0, reduction='mean')
    """  # noqa: E501
    if isinstance(spec, str):
        return get_loss(spec, **hyperparameters)
    if isinstance(spec, Mapping):
        spec = dict(spec)
        if "class_path" in spec:
            class_path = spec["class_path"]
            if not (isinstance(class_path, str) and "." not in class_path):
                return instantiate(spec, argument="criterion", init_args=hyperparameters)
            unknown = sorted(set(spec) - {"class_path", "init_args"})  # a registry name
            if unknown:
                raise ValueError(
                    f"criterion mapping has unknown keys {unknown}; expected 'class_path' and "
                    "'init_args'"
                )
            return get_loss(class_path, **{**dict(spec.get("init_args") or {}), **hyperparameters})
        if "name" in spec:
            name = spec.pop("name")
            return get_loss(name, **{**spec, **hyperparameters})
        raise ValueError(
            "criterion mapping needs 'class_path' (with optional 'init_args') or 'name'; "
            f"got keys {sorted(spec)}"
        )
    if callable(spec):
        if hyperparameters:
            raise ValueError("hyper-parameters can only be given with a name or class_path spec")
        return spec
    raise TypeError(
        "criterion must be a registry name, a class_path mapping, or a callable "
        f"criterion(logits, target); got {type(spec).__name__}"
    )


def describe_criterion(criterion: Any) -> str | dict[str, Any]:
    """A plain ``class_path``/``init_args`` description of a criterion (for configs, logs).

    Constructor arguments are read back from the attributes of the same name; tensors become
    lists. A registry name is returned as it is.

    Example:
        >>> from lightning_losses import FocalLoss
        >>> describe_criterion(FocalLoss(gamma=1.5))["init_args"]["gamma"]
        1.5
    """
    if isinstance(criterion, str):
        return criterion
    if isinstance(criterion, Mapping):
        return dict(criterion)
    cls = type(criterion)
    init_args: dict[str, Any] = {}
    for name in inspect.signature(cls).parameters:
        if hasattr(criterion, name):
            value = getattr(criterion, name)
            if isinstance(value, Tensor):
                value = value.tolist()
            elif isinstance(value, tuple):
                value = list(value)
            if value is None or isinstance(value, (str, int, float, bool, list)):
                init_args[name] = value
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": init_args}


def criterion_hyperparameters(criterion: Any) -> dict[str, float]:
    """The criterion's current numeric hyper-parameters, for logging (empty if it has none)."""
    values = getattr(criterion, "hyperparameters", None)
    if not callable(values):
        return {}
    return {
        name: float(value)
        for name, value in values().items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def scheduled_hyperparameters(callbacks: Iterable[Any]) -> set[str]:
    """The criterion hyper-parameters that the callbacks change during training.

    Each callback with a ``changed_hyperparameters()`` method names the attributes it sets
    (:class:`~lightning_losses.callbacks.LossScheduler` and ``GammaAnnealing``: their
    ``hyperparameter``; :class:`~lightning_losses.callbacks.LossSwitch`: the names whose values
    differ between its criteria); other callbacks name none.

    Example:
        >>> from lightning_losses.callbacks import GammaAnnealing, LossSwitch
        >>> switch = LossSwitch([{"name": "focal", "gamma": 1.0}, "focal"], milestones=[2])
        >>> sorted(scheduled_hyperparameters([GammaAnnealing(), switch, object()]))
        ['gamma']
    """
    names: set[str] = set()
    for callback in callbacks:
        changed = getattr(callback, "changed_hyperparameters", None)
        if callable(changed):
            names.update(changed())
    return names


@dataclass
class _CriterionLog:
    """Which criterion values a fit logs: what schedules set, and what changed since its start.

    Attributes:
        trainer: ``id()`` of the fit's trainer: another trainer starts a new record (as does
            :meth:`LossMixin.on_fit_start`).
        first: each hyper-parameter's first value in the fit, by name.
        changed: the names whose value has differed from its first value.
    """

    trainer: int
    first: dict[str, float] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)

    def update(self, values: Mapping[str, float]) -> set[str]:
        """Record the current values; the names that have changed since their first value."""
        for name, value in values.items():
            if self.first.setdefault(name, value) != value:
                self.changed.add(name)
        return self.changed


class LossMixin:
    """Give any LightningModule a swappable ``self.criterion``.

    Mix it in before ``LightningModule`` and set the criterion in ``__init__``::

        class MyModel(LossMixin, L.LightningModule):
            def __init__(self):
                super().__init__()
                self.set_criterion("gamma_ce", gamma=0.0)

            def training_step(self, batch, batch_idx):
                x, y = batch
                return self.compute_loss(self(x), y)  # logs criterion/gamma if scheduled

            def validation_step(self, batch, batch_idx):
                x, y = batch
                logits = self(x)
                return self.validation_output(logits, y)  # {"loss", "logits", "target"}

    The criterion is a submodule (its buffers move with the model). A checkpoint restores the
    model's weights whatever criterion it was saved with, also through Lightning's strict
    ``MyModel.load_from_checkpoint(path)``: the saved criterion entries that fit the current
    criterion (same name, same shape) are loaded, the others are dropped (see
    :meth:`on_load_checkpoint`). Schedules and switches recompute the criterion from training
    progress.
    """

    criterion: Any
    _criterion_log: _CriterionLog | None

    if TYPE_CHECKING:  # provided by the LightningModule this class is mixed into
        training: bool
        trainer: L.Trainer

        def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
            """``LightningModule.log``."""

    def set_criterion(self, spec: CriterionSpec, **hyperparameters: Any) -> Any:
        """Replace the criterion (see :func:`build_criterion` for the forms ``spec`` takes)."""
        criterion = build_criterion(spec, **hyperparameters)
        if hasattr(self, "criterion"):
            del self.criterion  # a module criterion may be replaced by a plain callable
        self.criterion = criterion
        return criterion

    def compute_loss(self, logits: Tensor, target: Tensor, *, log: bool = True) -> Tensor:
        """``self.criterion(logits, target)``; in training also logs ``criterion/<name>``.

        Only the hyper-parameters that change in the fit are logged (see
        :meth:`log_criterion_hyperparameters`).
        """
        if getattr(self, "criterion", None) is None:
            raise AttributeError(
                f"{type(self).__name__} has no criterion: call self.set_criterion(...) in __init__"
            )
        if log and self.training and self._attached_to_trainer():
            self.log_criterion_hyperparameters()
        precision = self._true_half_precision()
        if precision is None:
            return self.criterion(logits, target)
        self._stop_if_not_finite("logits", logits, precision)
        loss = self.criterion(logits, target)
        self._stop_if_not_finite("loss", loss, precision)
        return loss

    def _true_half_precision(self) -> str | None:
        """The trainer's precision when training in ``16-true``/``bf16-true``, else ``None``."""
        if not (self.training and self._attached_to_trainer()):
            return None
        precision = str(getattr(self.trainer, "precision", ""))
        return precision if precision in TRUE_HALF_PRECISIONS else None

    def _stop_if_not_finite(self, what: str, value: Tensor, precision: str) -> None:
        """Raise ``FloatingPointError`` (:func:`non_finite_message`) if ``value`` is not finite."""
        if not bool(torch.isfinite(value.detach()).all()):
            raise FloatingPointError(non_finite_message(what, precision, self.trainer.global_step))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Under ``16-true``/``bf16-true``: stop when the step left non-finite weights.

        Half-precision weights and optimizer state (no float32 copy) can turn NaN in one
        update (Adam's ``eps=1e-8`` is 0 in float16); the fit stops with a
        ``FloatingPointError`` that names the precision and suggests ``16-mixed`` /
        ``bf16-mixed`` (:func:`non_finite_message`). Other precisions check nothing.
        """
        precision = self._true_half_precision()
        if precision is not None:
            # nn.Module.named_parameters of the LightningModule this class is mixed into
            named = list(self.named_parameters())  # type: ignore[attr-defined]
            finite = [torch.isfinite(p.detach()).all() for _, p in named]
            if finite and not bool(torch.stack(finite).all()):  # one sync for all weights
                name = next(n for (n, _), ok in zip(named, finite, strict=True) if not ok)
                raise FloatingPointError(
                    non_finite_message(f"weight {name}", precision, self.trainer.global_step)
                )
        parent = getattr(super(), "on_train_batch_end", None)
        if parent is not None:
            parent(outputs, batch, batch_idx)

    def _attached_to_trainer(self) -> bool:
        try:
            return self.trainer is not None
        except RuntimeError:  # LightningModule.trainer raises when no trainer is attached
            return False

    def log_criterion_hyperparameters(self) -> None:
        """Log the criterion's hyper-parameters that change in this fit as ``criterion/<name>``.

        A value changes when a callback sets it (:func:`scheduled_hyperparameters`: a
        ``LossScheduler``, ``GammaAnnealing`` or ``LossSwitch`` of the trainer; logged from the
        first step) or when it differs from its first value in this fit (anything else that
        sets it; logged from that step on). The constants are the run's params (the config),
        not metrics.
        """
        values = criterion_hyperparameters(self.criterion)
        if not values:
            return
        trainer = self.trainer
        record = getattr(self, "_criterion_log", None)
        if record is None or record.trainer != id(trainer):
            record = _CriterionLog(id(trainer))
            self._criterion_log = record
        # Lightning's callback connector sets Trainer.callbacks, unseen by mypy
        callbacks = trainer.callbacks  # type: ignore[attr-defined]
        logged = record.update(values) | scheduled_hyperparameters(callbacks)
        for name, value in values.items():
            if name in logged:
                self.log(f"criterion/{name}", value, on_step=True, on_epoch=False)

    def on_fit_start(self) -> None:
        """Start this fit's record of criterion values (:meth:`log_criterion_hyperparameters`)."""
        self._criterion_log = None
        parent = getattr(super(), "on_fit_start", None)
        if parent is not None:
            parent()

    @staticmethod
    def validation_output(
        logits: Tensor, target: Tensor, loss: Tensor | None = None
    ) -> dict[str, Tensor]:
        """The ``validation_step`` output the calibration callback reads."""
        output = {"logits": logits.detach(), "target": target.detach()}
        if loss is not None:
            output["loss"] = loss
        return output

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Load the saved criterion state where it fits the current criterion, else keep it.

        A saved entry is loaded when the current criterion has the same name with the same
        shape (a resumed fit gets back state such as AdaFocal's per-bin gammas); entries of
        another loss (a checkpoint saved with a different criterion, or in a later LossSwitch
        stage) are dropped and the current criterion keeps its own. A criterion that is a plain
        function holds no state: every saved entry is dropped. Strict loading
        (``load_from_checkpoint``, ``fit --ckpt_path``) then finds exactly the keys it expects.
        """
        state = checkpoint.get("state_dict")
        if state is not None:
            saved = {
                k[len("criterion.") :]: state.pop(k)
                for k in list(state)
                if k.startswith("criterion.")
            }
            criterion = getattr(self, "criterion", None)
            current = criterion.state_dict() if isinstance(criterion, nn.Module) else {}
            for name, value in current.items():
                kept = saved.get(name)
                fits = isinstance(kept, Tensor) and kept.shape == value.shape
                state[f"criterion.{name}"] = kept if fits else value
        parent = getattr(super(), "on_load_checkpoint", None)
        if parent is not None:
            parent(checkpoint)
