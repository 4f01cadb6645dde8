"""Checkpoints written whole: ``LastCheckpoint`` (``last.ckpt``) and ``AtomicCheckpointIO``.

``LastCheckpoint`` keeps ``last.ckpt``, the latest finished epoch, beside any
``ModelCheckpoint``; :class:`AtomicCheckpointIO` makes every save of a trainer whole or absent
(:func:`use_atomic_saves`); :func:`log_at_checkpoint_step` makes ``validate``/``test`` log at
the step of the checkpoint they evaluate.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves leave the whole checkpoint or nothing.

    The checkpoint is written to a hidden temporary file in the target's own folder
    (``.<name>.<random>.tmp``, created with the process's umask) and renamed over the target
    with ``os.replace`` once it is complete. A save that fails (a full disk, a file-size
    limit, an interrupt) removes the temporary file and leaves an existing checkpoint of that
    name as it was: never a 0-byte or partial ``.ckpt``. The error names the checkpoint and the
    cause. Lightning's own save stages the file in the system's temporary folder and moves it;
    across file systems the move is a copy, which a full disk leaves half-written. Remote paths
    (``s3://...``) are left to Lightning.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> AtomicCheckpointIO().save_checkpoint({"global_step": 3}, folder / "a.ckpt")
        >>> sorted(p.name for p in folder.iterdir())
        ['a.ckpt']
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Save ``checkpoint`` to ``path`` atomically (a remote path: Lightning's save)."""
        text = os.fspath(path)
        if "://" in text and not text.startswith("file://"):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(
                f"storage_options is not supported by {type(self).__name__}; got "
                f"{storage_options!r} (leave it out)"
            )
        target = Path(text.removeprefix("file://"))
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            # O_EXCL: a new file of our own; mode 0o666 less the umask, as open() would make it.
            descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(descriptor, "wb") as handle:
                torch.save(checkpoint, handle)
            os.replace(staged, target)
        except BaseException as error:
            staged.unlink(missing_ok=True)
            cause = _os_error(error)  # torch's zip writer reports a failed write as its own
            if cause is None:
                raise
            raise OSError(
                cause.errno,
                f"could not save the checkpoint {target} ({cause.strerror or cause}); nothing "
                "was written: free space there or choose another folder (ModelCheckpoint's "
                "dirpath, TrackingLogger's save_dir)",
            ) from error


def _os_error(error: BaseException) -> OSError | None:
    """The first ``OSError`` among ``error`` and its causes and contexts (``None`` if none)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def use_atomic_saves(trainer: Any) -> None:
    """Make ``trainer`` save checkpoints with :class:`AtomicCheckpointIO`.

    Only Lightning's default ``TorchCheckpointIO`` is replaced: a ``CheckpointIO`` the user
    chose (``trainer.plugins``) and a strategy's own are kept.
    """
    strategy = trainer.strategy
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()


def checkpoint_step(path: str | os.PathLike[str]) -> int | None:
    """The ``global_step`` a Lightning checkpoint file records (``None`` if it records none).

    The file is memory-mapped where its format allows, so its tensors are not read.
    """
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # a legacy (non-zip) file cannot be memory-mapped
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
    return None if step is None else int(step)


def log_at_checkpoint_step(trainer: Any, path: str | os.PathLike[str] | None) -> None:
    """Make an evaluation of the checkpoint ``path`` log its metrics at the checkpoint's step.

    ``validate`` and ``test`` do not restore the training loops, so Lightning would log their
    metrics at step 0 of the run; this sets the step Lightning logs evaluation metrics at to
    the checkpoint's ``global_step``. A ``path`` that is not a file (``None``, Lightning's
    ``"best"``/``"last"``) changes nothing.
    """
    if path is None or not Path(path).is_file():
        return
    step = checkpoint_step(path)
    if step is not None:
        # The counter Lightning's logger connector logs at when a metric gives no step.
        trainer.fit_loop.epoch_loop._batches_that_stepped = step


class LastCheckpoint(ModelCheckpoint):
    """Rewrite ``<dirpath>/last.ckpt`` after every epoch: it always holds the latest epoch.

    A monitor-less ``ModelCheckpoint`` that keeps one file (``save_top_k=1``, no version
    counter), so ``fit --ckpt_path .../last.ckpt`` resumes from the last finished epoch
    whichever epoch was best. Lightning's own ``save_last`` cannot do this beside a callback
    that monitors a metric: it writes ``last.ckpt`` only at the steps where that callback
    saved a best checkpoint.

    Being its own class, it has its own ``state_key`` (``LastCheckpoint{...}``): any
    ``ModelCheckpoint`` may be added beside it (e.g. ``every_n_epochs=1, save_top_k=-1``, one
    file per epoch), which Lightning refuses for two ``ModelCheckpoint`` instances of the same
    settings ("Found more than one stateful callback of type ModelCheckpoint").

    Args:
        dirpath: the folder; ``None``: the logger's (the MLflow run's ``checkpoints/``).
        filename: the file's name without ``.ckpt``.

    Example:
        >>> last = LastCheckpoint()
        >>> last.monitor, last.save_top_k, last.filename
        (None, 1, 'last')
        >>> last.state_key.split("{")[0], ModelCheckpoint().state_key.split("{")[0]
        ('LastCheckpoint', 'ModelCheckpoint')
    """

    def __init__(self, dirpath: str | None = None, *, filename: str = "last") -> None:
        if not isinstance(filename, str) or not filename or "/" in filename:
            raise ValueError(
                f"filename must be a file name without folders (e.g. 'last'); got {filename!r}"
            )
        super().__init__(
            dirpath=dirpath, filename=filename, save_top_k=1, enable_version_counter=False
        )

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Make the trainer's saves whole or absent (:func:`use_atomic_saves`), then set up."""
        use_atomic_saves(trainer)
        super().setup(trainer, pl_module, stage)
