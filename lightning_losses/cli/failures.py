"""A fit that fails at run time ends in one line naming the cause and the fix.

:class:`~lightning_losses.cli.fit.TrackingCLI` (``lightning-losses fit|validate|test|predict``
and the language model's command) adds a :class:`DivergenceCheck` to every trainer and runs
each command within :func:`failures_in_one_line`:

- **Divergence.** A training loss that becomes NaN or infinite stops the fit at once on the
  CPU (one ``isfinite`` of a scalar per step, no cost to speak of). On an accelerator, where
  reading a value back costs a host synchronisation, the check stays on the device: each step
  records, without reading anything back, the first non-finite loss since the last look, and the
  record is read every ``log_every_n_steps`` steps (when Lightning reads the logged values
  anyway), before each validation and checkpoint, and at the end of each epoch. The step and
  epoch reported are the first bad step's either way. A loss whose own check found non-finite
  logits (``validate_args=True``, the default) is a divergence too.
- **Half precision.** ``16-true``/``bf16-true`` keep the weights and the optimizer state in half
  precision; :class:`~lightning_losses.lightning.mixin.LossMixin` stops the first step that
  makes them non-finite, with a message naming the precision to use instead.

Either way the command prints ``lightning-losses fit: error: CAUSE: FIX`` and exits with status
1; the traceback only with ``--verbose``. The MLflow run ends FAILED with the cause in its tag
``lightning_losses.failure`` (:data:`~lightning_losses.tracking.FAILURE_TAG`); every other
failure of a fit tags the run too (``TYPE: first line of the message``) and keeps its
traceback. Nothing is saved from a diverged step: checkpoints are written at epoch ends and
the check runs before each save, so the last checkpoint holds finite weights.
"""

from __future__ import annotations

import math
import re
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from torch import Tensor

from lightning_losses.cli.quiet import verbose_requested
from lightning_losses.lightning.mixin import TRUE_HALF_PRECISIONS

__all__ = [
    "FAILED_STATUS",
    "Divergence",
    "DivergenceCheck",
    "divergence_fix",
    "failure_cause",
    "failures_in_one_line",
    "learning_rate_option",
    "missing_requirement",
]

#: Exit status of a command whose fit failed (a usage error is 2).
FAILED_STATUS = 1
#: The option of gradient clipping, suggested beside a lower learning rate.
CLIP_OPTION = "--trainer.gradient_clip_val=1.0"
#: Names of a learning rate among the keys of a config.
_LEARNING_RATE_KEYS = ("lr", "learning_rate")
#: The message of the losses' check of finite inputs
#: (:func:`lightning_losses.functional.checks.check_finite`).
_NOT_FINITE = re.compile(
    r"^(?P<name>[\w.]+) must be finite \(no NaN or inf\b.*?; found (?P<value>\S+) at (?P<where>.+)$"
)


#: The values a loss checks that the model computes (a non-finite one is a divergence), and
#: how the message names them; a non-finite option (``pos_weight``) is no divergence.
_MODEL_VALUES = {
    "logits": "logits",
    "hidden": "hidden states",
    "weight": "head's weight",
    "bias": "head's bias",
    "features": "features",
}


class Divergence(FloatingPointError):
    """A fit whose training loss (or logits) became NaN or infinite; the message is one line."""


def learning_rate_option(config: Any) -> str | None:
    """The dotted key of the model's learning rate in a command's parsed config, if it has one.

    Example:
        >>> learning_rate_option({"model": {"optimizer": {"init_args": {"lr": 0.003}}}})
        'model.optimizer.init_args.lr'
        >>> learning_rate_option({"model": {"hidden": [64]}}) is None
        True
    """
    if hasattr(config, "as_dict"):
        config = config.as_dict()

    def search(node: Any, prefix: str) -> str | None:
        if not isinstance(node, Mapping):
            return None
        for key, value in node.items():
            if key in _LEARNING_RATE_KEYS and isinstance(value, (int, float)):
                return f"{prefix}{key}"
        for key, value in node.items():
            found = search(value, f"{prefix}{key}.")
            if found is not None:
                return found
        return None

    return search((config or {}).get("model"), "model.") if isinstance(config, Mapping) else None


def divergence_fix(precision: str, option: str | None = None, lr: float | None = None) -> str:
    """What to change after a divergence: the learning rate, gradient clipping, the precision.

    Args:
        precision: the trainer's precision (``"32-true"``, ``"16-mixed"``, ...).
        option: the config key of the learning rate (:func:`learning_rate_option`).
        lr: the learning rate when the fit diverged.

    Example:
        >>> divergence_fix("32-true", "model.optimizer.init_args.lr", 1e12)
        'lower the learning rate (--model.optimizer.init_args.lr, 1e+12 now) or clip the \
gradients (--trainer.gradient_clip_val=1.0)'
        >>> divergence_fix("16-mixed")  # doctest: +ELLIPSIS
        'lower the learning rate ... or train in --trainer.precision=32-true'
    """
    where = [f"--{option}" if option else "", f"{lr:g} now" if lr is not None else ""]
    detail = ", ".join(part for part in where if part)
    fix = "lower the learning rate" + (f" ({detail})" if detail else "")
    fix += f" or clip the gradients ({CLIP_OPTION})"
    if precision in TRUE_HALF_PRECISIONS:
        fix += f", or use --trainer.precision={TRUE_HALF_PRECISIONS[precision]}"
    elif not precision.startswith(("32", "64")):
        fix += ", or train in --trainer.precision=32-true"
    return fix


def _learning_rate(trainer: L.Trainer) -> float | None:
    """The first optimizer's learning rate now (after any scheduler), if there is one."""
    optimizers = getattr(trainer, "optimizers", None) or []
    try:
        return float(optimizers[0].param_groups[0]["lr"])
    except (IndexError, KeyError, TypeError, ValueError):
        return None


def _precision(trainer: L.Trainer) -> str:
    return str(getattr(trainer, "precision", ""))


def _named(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


class DivergenceCheck(L.Callback):
    """Stop a fit whose training loss becomes NaN or infinite, naming the step and the fix.

    Args:
        every_n_steps: read the check back every N training steps; ``None``: every step on
            the CPU, every ``trainer.log_every_n_steps`` elsewhere (see the module's notes).
            The first non-finite step is named either way.
        lr_option: the config key of the learning rate, for the message
            (:func:`learning_rate_option`).

    Raises:
        Divergence: ``the training loss became nan at step 12, epoch 0: FIX``
            (:func:`divergence_fix`).

    After a failure of the fit, :attr:`failure` holds its cause in one line when it is a
    divergence or a half-precision stop (:func:`failure_cause`), and a
    :class:`~lightning_losses.tracking.TrackingLogger` records the cause of any failure in the
    run's tag ``lightning_losses.failure``.
    """

    def __init__(self, every_n_steps: int | None = None, lr_option: str | None = None) -> None:
        self.every_n_steps = every_n_steps
        self.lr_option = lr_option
        self.failure: str | None = None
        self._at = (0, 0)
        self._pending: list[tuple[int, int]] = []
        self._first: Tensor | None = None
        self._value: Tensor | None = None

    def _every(self, trainer: L.Trainer, loss: Tensor) -> int:
        if self.every_n_steps is not None:
            return max(1, int(self.every_n_steps))
        if loss.device.type == "cpu":
            return 1
        return max(1, int(getattr(trainer, "log_every_n_steps", 50)))

    def _stop(self, trainer: L.Trainer, value: float, at: tuple[int, int]) -> None:
        step, epoch = at
        fix = divergence_fix(_precision(trainer), self.lr_option, _learning_rate(trainer))
        raise Divergence(
            f"the training loss became {_named(value)} at step {step}, epoch {epoch}: the fit "
            f"diverged; {fix}"
        )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Note the step and epoch of the batch (for the message)."""
        self._at = (int(trainer.global_step), int(trainer.current_epoch))

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Check the step's loss: at once on the CPU, recorded on the device elsewhere."""
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if not isinstance(loss, Tensor):
            return
        loss = loss.detach().float().reshape(-1)[:1]
        if loss.numel() == 0:
            return
        if self._every(trainer, loss) == 1:
            if not bool(torch.isfinite(loss).all()):
                self._stop(trainer, float(loss[0]), self._at)
            return
        index = len(self._pending)
        self._pending.append(self._at)
        if self._first is None or self._value is None:
            self._first = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._value = torch.zeros((), dtype=torch.float32, device=loss.device)
        new = ~torch.isfinite(loss[0]) & (self._first < 0)  # stays on the device
        self._first = torch.where(new, index, self._first)
        self._value = torch.where(new, loss[0], self._value)
        if len(self._pending) >= self._every(trainer, loss):
            self.read_back(trainer)

    def read_back(self, trainer: L.Trainer) -> None:
        """Read back the steps recorded since the last look; stop at the first non-finite."""
        first, value, pending = self._first, self._value, self._pending
        self._first, self._value, self._pending = None, None, []
        if first is None or value is None:
            return
        index = int(first)  # the one read-back
        if index >= 0:
            self._stop(trainer, float(value), pending[index])

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Look before the epoch's end (and its checkpoints)."""
        self.read_back(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Look before validating (and the checkpoint that may follow)."""
        self.read_back(trainer)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Look before any checkpoint is written: a diverged model is never saved."""
        self.read_back(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Look at the last steps."""
        self.read_back(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Keep the cause (:func:`failure_cause`) and tag the run with it (before it ends)."""
        self._pending, self._first, self._value = [], None, None
        if not isinstance(exception, Exception):  # SIGTERM's exit, Ctrl-C: not a failure
            return
        self.failure = failure_cause(exception, trainer, self.lr_option)
        recorded = self.failure or f"{type(exception).__name__}: {_first_line(exception)}"
        for logger in trainer.loggers:
            record = getattr(logger, "record_failure", None)
            if callable(record):
                record(recorded)


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and its causes and contexts, each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def failure_cause(
    error: BaseException, trainer: L.Trainer, lr_option: str | None = None
) -> str | None:
    """One line for a fit that diverged or whose half precision failed; ``None`` otherwise.

    - :class:`Divergence`, and the ``FloatingPointError`` of a ``16-true``/``bf16-true`` step
      (:func:`~lightning_losses.lightning.mixin.non_finite_message`): their message;
    - a loss's check of finite logits (``logits must be finite ...; found nan at
      logits[0, 0]``), or of a linear head's hidden states, weight or bias, while fitting:
      ``the training logits became nan at step 1, epoch 0 (logits[0, 0]): the fit diverged;
      FIX`` (:func:`divergence_fix`).
    """
    for cause in _chain(error):
        if isinstance(cause, Divergence):
            return _first_line(cause)
        if isinstance(cause, FloatingPointError) and _precision(trainer) in TRUE_HALF_PRECISIONS:
            return _first_line(cause)
        found = _NOT_FINITE.match(_first_line(cause)) if isinstance(cause, ValueError) else None
        if found is not None and found["name"] not in _MODEL_VALUES:
            found = None
        if found is not None and getattr(trainer.state, "fn", None) == "fit":
            stage = "training" if trainer.training else "validation"
            fix = divergence_fix(_precision(trainer), lr_option, _learning_rate(trainer))
            what = _MODEL_VALUES[found["name"]]
            return (
                f"the {stage} {what} became {found['value']} at step "
                f"{trainer.global_step}, epoch {trainer.current_epoch} ({found['where']}): the "
                f"fit diverged; {fix}"
            )
    return None


def missing_requirement(precision: object, error: BaseException) -> str:
    """The message for a trainer that could not be built for want of a package.

    Example:
        >>> error = ModuleNotFoundError("Requirement 'transformer_engine>=0.11.0' not met.")
        >>> missing_requirement("transformer-engine", error)  # doctest: +NORMALIZE_WHITESPACE
        "--trainer.precision=transformer-engine: Requirement 'transformer_engine>=0.11.0' not
        met.; choose another precision (32-true, 16-mixed, bf16-mixed) or install the package"
    """
    cause = _first_line(error) or type(error).__name__
    if precision is None or str(precision).startswith(("32", "64", "16", "bf16")):
        return f"the trainer could not be built: {cause}"
    return (
        f"--trainer.precision={precision}: {cause}; choose another precision (32-true, "
        "16-mixed, bf16-mixed) or install the package"
    )


@contextmanager
def failures_in_one_line(trainer: L.Trainer | None, prog: str) -> Iterator[None]:
    """Around a command's run: a diagnosed failure ends it with one ``error:`` line.

    When the trainer's :class:`DivergenceCheck` diagnosed the failure
    (:attr:`DivergenceCheck.failure`), the command prints ``PROG: error: CAUSE`` on stderr and
    exits with status 1 (:data:`FAILED_STATUS`); with ``--verbose``
    (:func:`~lightning_losses.cli.quiet.verbose_requested`) the traceback comes first. Other
    errors pass unchanged.
    """
    try:
        yield
    except Exception as error:
        callbacks = getattr(trainer, "callbacks", None) or []
        check = next((c for c in callbacks if isinstance(c, DivergenceCheck)), None)
        if check is None or check.failure is None:
            raise
        if verbose_requested():
            traceback.print_exception(error, file=sys.stderr)
        print(f"{prog}: error: {check.failure}", file=sys.stderr, flush=True)
        raise SystemExit(FAILED_STATUS) from None
