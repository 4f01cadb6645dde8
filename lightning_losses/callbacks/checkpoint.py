"""``LastCheckpoint``: ``last.ckpt``, the latest finished epoch, beside any ``ModelCheckpoint``."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint


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
