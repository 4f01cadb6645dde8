"""Callbacks that act at a given optimizer step of a test fit: save a checkpoint, stop."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

__all__ = ["SaveAtStep", "StopAtStep"]


class SaveAtStep(Callback):
    """Saves a checkpoint to ``path`` when the global step reaches ``step`` (mid-epoch too)."""

    def __init__(self, path: Any, step: int) -> None:
        self.path = path
        self.step = step

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


class StopAtStep(Callback):
    """Stops training once the global step reaches ``step`` (for a fit without an end)."""

    def __init__(self, step: int) -> None:
        self.step = step

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True
