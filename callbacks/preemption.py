"""``Preemption``: when a scheduler stops a fit, a checkpoint, a KILLED run and exit status 143.

A cluster scheduler ends a job with SIGTERM (SLURM may send SIGUSR1 first, with ``--signal``),
then SIGKILL after a grace period. Lightning's own handler stops training at the next batch
and raises :class:`~lightning.pytorch.utilities.exceptions.SIGTERMException`, a ``SystemExit``
whose status is 0, without a checkpoint. :class:`Preemption` builds on it:

- the signal is noted; the first training batch that ends after it (agreed by every process
  under DDP) writes a checkpoint where ``last.ckpt`` goes, then hands the signal to
  Lightning's handler, which stops the loop after that batch's logging;
- a batch after which validation or the epoch's end follows is not a stopping point: the
  epoch's end (validation, ``last.ckpt``, the best checkpoint) runs first, and the next batch
  stops (a fit whose last epoch ends meanwhile finishes as usual);
- the MLflow run is ended ``KILLED`` and tagged :data:`RESUME_COMMAND_TAG` with the command that
  resumes it; the command exits with :data:`PREEMPTED_EXIT_STATUS` (143, as for SIGTERM)
  through :func:`preempted_exit`.

The checkpoint is taken at the end of a training batch, as Lightning's ``ModelCheckpoint(
every_n_train_steps=...)`` takes its own, and the training loaders restore their position
(:class:`~lightning_losses.data.samplers.ResumableDataLoader`), so resuming from it continues
exactly.
The epoch sums of the module's ``torchmetrics`` metrics (``train/loss_epoch``, ...) are part of
this checkpoint and put back on resume, so the epoch's means count the batches before the stop.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_losses.warning import LightningLossesWarning

__all__ = [
    "PREEMPTED_EXIT_STATUS",
    "RESUME_COMMAND_TAG",
    "Preemption",
    "preempted_exit",
    "resume_command",
    "with_preemption",
]

#: Exit status of a fit stopped by a signal: 128 + 15, as a shell reports a SIGTERM'd process.
PREEMPTED_EXIT_STATUS = 128 + int(signal.SIGTERM)
#: The MLflow tag of a stopped run that holds the command resuming it.
RESUME_COMMAND_TAG = "resume_command"
#: Where the module's metric states go in the checkpoint.
_CHECKPOINT_KEY = "preemption"
_CONFIG_OPTIONS = ("-c", "--config")
_CKPT_OPTION = "--ckpt_path"


def resume_command(args: Sequence[str], checkpoint: str | Path) -> str:
    """The ``lightning-losses`` command resuming a fit started with ``args`` from ``checkpoint``.

    ``args`` are the fit's own (``fit --config x.yaml --trainer.max_epochs=5``): any
    ``--ckpt_path`` in them is replaced by ``checkpoint``, config files that exist are made
    absolute (so that the command works from any directory), and the password of a URI is
    shown as ``***`` (give it again, as when the fit started).

    Example:
        >>> resume_command(["fit", "--config", "digits_focal", "--ckpt_path=a.ckpt"], "/r/l.ckpt")
        'lightning-losses fit --config digits_focal --ckpt_path /r/l.ckpt'
    """
    from lightning_losses.tracking.uri import without_password

    words: list[str] = []
    items = iter(args)
    for word in items:
        if word == _CKPT_OPTION:
            next(items, None)
            continue
        if word.startswith(_CKPT_OPTION + "="):
            continue
        if word in _CONFIG_OPTIONS:
            words += [word, _absolute_if_file(next(items, ""))]
            continue
        key, equals, value = word.partition("=")
        if equals and key == "--config":
            words.append(f"{key}={_absolute_if_file(value)}")
        elif equals:
            words.append(f"{key}={without_password(value)}")
        else:
            words.append(without_password(word))
    return shlex.join(["lightning-losses", *words, _CKPT_OPTION, str(checkpoint)])


def _absolute_if_file(path: str) -> str:
    return os.path.abspath(path) if path and Path(path).is_file() else path


@contextmanager
def preempted_exit() -> Iterator[None]:
    """Turn Lightning's ``SIGTERMException`` (exit status 0) into ``SystemExit(143)``.

    A scheduler reads status 0 as success and would not requeue the job.
    """
    try:
        yield
    except SIGTERMException:
        raise SystemExit(PREEMPTED_EXIT_STATUS) from None


def with_preemption(trainer_defaults: Any, command: Sequence[str]) -> dict[str, Any]:
    """``trainer_defaults`` (LightningCLI's) with a :class:`Preemption` added to its callbacks.

    A callback in ``trainer_defaults`` is added to the config's and kept out of the saved
    config; a :class:`Preemption` already there is kept instead.

    Example:
        >>> defaults = with_preemption({"max_epochs": 2}, ["fit"])
        >>> defaults["max_epochs"], [type(c).__name__ for c in defaults["callbacks"]]
        (2, ['Preemption'])
    """
    defaults = dict(trainer_defaults or {})
    callbacks = defaults.get("callbacks") or []
    callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    if not any(isinstance(callback, Preemption) for callback in callbacks):
        callbacks.append(Preemption(command=command))
    defaults["callbacks"] = callbacks
    return defaults


class Preemption(Callback):
    """Checkpoint, end the MLflow run ``KILLED`` and exit 143 when SIGTERM (or SIGUSR1) arrives.

    The CLI adds one to every command (it is not part of the config): see the module's text.

    Args:
        command: the arguments of the command that runs the fit (``fit --config ...``), for
            the resume command of :data:`RESUME_COMMAND_TAG`; ``None``: ``sys.argv[1:]``.

    Example:
        >>> Preemption(command=["fit", "--config", "digits_focal"]).command
        ['fit', '--config', 'digits_focal']
    """

    def __init__(self, *, command: Sequence[str] | None = None) -> None:
        if isinstance(command, str):
            raise TypeError(f"command must be a sequence of strings, not the string {command!r}")
        self.command = list(command) if command is not None else None
        #: The signal received (``None`` before any).
        self.received: int | None = None
        #: The checkpoint written at the signal (``None`` until then).
        self.checkpoint_path: Path | None = None
        self._lightning_handler: Any = None
        self._saving = False
        self._metric_states: list[dict[str, Any]] | None = None

    # --- the signal ---------------------------------------------------------------------------

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Take over SIGTERM (and an unhandled SIGUSR1) from here on; put back the epoch sums.

        Lightning has installed its handlers by now and puts back the process's own when the
        fit ends; its SIGTERM handler is called at the stopping point.
        """
        self._restore_metric_states(trainer, pl_module)
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set there (Lightning sets none either)
        self._lightning_handler = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._on_signal)
        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR1, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """After the first batch that ends after the signal: the checkpoint, then the stop."""
        if self.checkpoint_path is not None:
            return
        requested = trainer.strategy.reduce_boolean_decision(self.received is not None, all=False)
        if not requested or not _can_stop_after(trainer, batch_idx):
            return
        path = checkpoint_path(trainer)
        self._saving = True
        try:
            trainer.save_checkpoint(path)
        finally:
            self._saving = False
        self.checkpoint_path = path
        handler = self._lightning_handler
        if not callable(handler):  # none installed here (a DDP rank outside the main thread)
            raise SIGTERMException
        # Lightning's: under DDP it passes the signal to the processes it started; the loop
        # stops once this batch is logged (Trainer.received_sigterm).
        handler(self.received or signal.SIGTERM, None)

    # --- the end of the fit -------------------------------------------------------------------

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """A fit stopped by the signal: the run ends KILLED with the command that resumes it."""
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        name = signal.Signals(self.received or signal.SIGTERM).name
        step = trainer.global_step
        if self.checkpoint_path is not None:
            hint = resume_command(self._command(), self.checkpoint_path)
            text = f"stopped by {name} at step {step}; checkpoint {self.checkpoint_path}"
        else:
            hint = ""
            text = f"stopped by {name} at step {step}, before the first training step ended"
        from lightning_losses.tracking import TrackingLogger

        runs = []
        for logger in trainer.loggers:
            if isinstance(logger, TrackingLogger) and logger._initialized:
                if hint:
                    logger.set_tags({RESUME_COMMAND_TAG: hint})
                logger.finalize("killed")
                runs.append(str(logger.run_id))
        if trainer.is_global_zero:
            marked = f"; MLflow run {', '.join(runs)} ended KILLED" if runs else ""
            resume = f"; resume with: {hint}" if hint else ""
            print(f"lightning-losses fit: {text}{marked}{resume}", file=sys.stderr, flush=True)

    def _command(self) -> list[str]:
        return self.command if self.command is not None else sys.argv[1:]

    # --- the epoch sums of the module's metrics -------------------------------------------------

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """The checkpoint at the signal keeps the states of the module's ``torchmetrics``.

        One entry per process (gathered under DDP: each process holds its own part of an
        epoch's sums), restored to the same rank on resume.
        """
        if not self._saving:
            return
        states = _metric_states(pl_module)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, states)
        else:
            gathered = [states]
        checkpoint[_CHECKPOINT_KEY] = {"metrics_by_rank": gathered}

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Keep the metric states of a checkpoint taken at a signal, for ``on_train_start``."""
        saved = checkpoint.get(_CHECKPOINT_KEY) or {}
        self._metric_states = saved.get("metrics_by_rank")

    def _restore_metric_states(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        by_rank, self._metric_states = self._metric_states, None
        if not by_rank:
            return
        if len(by_rank) != trainer.world_size:
            rank_zero_warn(
                f"The checkpoint was taken at a signal with {len(by_rank)} processes and this "
                f"fit has {trainer.world_size}: the means of the interrupted epoch count only "
                "the batches from here on.",
                category=LightningLossesWarning,
            )
            return
        from torchmetrics import Metric

        states = by_rank[trainer.global_rank]
        for name, module in pl_module.named_modules():
            if isinstance(module, Metric) and name in states:
                saved = states[name]
                for key, value in saved["state"].items():
                    current = getattr(module, key)
                    if isinstance(value, list):
                        setattr(module, key, [v.to(pl_module.device) for v in value])
                    else:
                        setattr(module, key, value.to(device=current.device, dtype=current.dtype))
                module._update_count = int(saved["update_count"])
                module._computed = None


def _metric_states(pl_module: pl.LightningModule) -> dict[str, dict[str, Any]]:
    """``{module name: {"state": {name: tensor(s)}, "update_count": n}}`` of each metric."""
    from torchmetrics import Metric

    states = {}
    for name, module in pl_module.named_modules():
        if isinstance(module, Metric) and module.update_count:
            state = {
                key: [v.detach().cpu() for v in value]
                if isinstance(value, list)
                else value.detach().cpu()
                for key, value in module.metric_state.items()
            }
            states[name] = {"state": state, "update_count": int(module.update_count)}
    return states


def _can_stop_after(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Whether the fit may stop after the batch ``batch_idx``: it stepped, and nothing follows.

    Not inside a gradient accumulation (the gradients are not in a checkpoint), not before
    the epoch's end (validation, the epoch-end checkpoints and metrics) and not before a
    validation inside the epoch (``val_check_interval``).
    """
    if (batch_idx + 1) % trainer.accumulate_grad_batches != 0:
        return False
    return not _epoch_work_follows(trainer, batch_idx)


def _epoch_work_follows(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Whether validation or the epoch's end may follow the batch ``batch_idx``.

    The epoch's last batch is followed by the epoch's end (and its validation); with
    ``val_check_interval``, every ``val_check_batch``-th batch by a validation.
    """
    if batch_idx + 1 >= trainer.num_training_batches:
        return True
    every = trainer.val_check_batch
    if not trainer.enable_validation or not isinstance(every, int) or every <= 0:
        return False
    loop = trainer.fit_loop.epoch_loop
    index = loop.total_batch_idx if trainer.check_val_every_n_epoch is None else batch_idx
    return (index + 1) % every == 0


def checkpoint_path(trainer: pl.Trainer) -> Path:
    """Where ``last.ckpt`` goes: ``LastCheckpoint``'s file, else ``save_last``'s, else beside.

    The first checkpoint callback that writes a "last" file names it (``LastCheckpoint``:
    ``<dirpath>/<filename>.ckpt``; a ``ModelCheckpoint(save_last=True)``:
    ``<dirpath>/last.ckpt``); without one, ``last.ckpt`` in the first checkpoint callback's
    folder, else in ``<log dir>/checkpoints``.
    """
    from lightning_losses.callbacks.checkpoint import LastCheckpoint

    # Any checkpoint callback with a folder, by its attributes (ModelCheckpoint's names).
    folders: list[tuple[Any, Path]] = []
    for callback in trainer.checkpoint_callbacks:
        dirpath = getattr(callback, "dirpath", None)
        if dirpath:
            folders.append((callback, Path(dirpath)))
    for callback, folder in folders:
        if isinstance(callback, LastCheckpoint):
            return folder / f"{callback.filename}{callback.FILE_EXTENSION}"
    for callback, folder in folders:
        if getattr(callback, "save_last", None):
            return folder / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
    if folders:
        return folders[0][1] / "last.ckpt"
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints" / "last.ckpt"
