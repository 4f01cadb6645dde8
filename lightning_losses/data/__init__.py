"""LightningDataModules on data that ships with scikit-learn, and on the user's own arrays.

Every module here splits its data into fixed train / val / test parts chosen by ``seed``
(stratified where the task allows it), loads its arrays eagerly in ``__init__`` (so that
LightningCLI can link ``num_features``, ``num_classes``, ``num_tasks`` and ``task`` into the
model before ``setup``), and yields batches ``(features [B, D] float32, target)``:

- :class:`DigitsDataModule`: ``"multiclass"``, int64 ``[B]``, 10 classes;
- :class:`LongTailedDigitsDataModule`: the same with a long-tailed training split;
- :class:`RareDigitDataModule`: ``"binary"`` one digit against the rest, float32 ``[B]``;
- :class:`MultiLabelDigitsDataModule`: ``"multilabel"``, five attributes, float32 ``[B, 5]``;
- :class:`NMDigitsDataModule`: ``"nm"``, three base-3 digits of the label, int64 ``[B, 3]``;
- :class:`TensorDataModule`: any task, from the user's ``.npz`` or ``.csv`` file.

The digits are scikit-learn's ``load_digits`` (1797 images of 8x8 pixels, 10 classes), scaled
to [0, 1]; nothing is downloaded. The predict loader yields the test features alone, as plain
``[B, D]`` tensors.

The training loader is a :class:`ResumableDataLoader`: its shuffled order depends only on
``(seed, epoch)``, and it saves and restores its position, so a run resumed from a Lightning
checkpoint, even one taken in the middle of an epoch, sees exactly the batches that the
uninterrupted run would have seen.

The validation, test and predict loaders draw from an :class:`UnpaddedDistributedSampler`:
under DDP every sample of the split is evaluated by exactly one process (no padding, no
repeats), so metrics reduced across processes are those of the split itself.

This module imports scikit-learn lazily; ``import lightning_losses`` does not import it.
"""

from __future__ import annotations

from lightning_losses.data.digits import (
    DigitsDataModule,
    LongTailedDigitsDataModule,
    MultiLabelDigitsDataModule,
    NMDigitsDataModule,
    RareDigitDataModule,
)
from lightning_losses.data.mnist1d import MNIST1DDataModule
from lightning_losses.data.samplers import (
    ResumableDataLoader,
    ResumableSampler,
    UnpaddedDistributedSampler,
)
from lightning_losses.data.tensor import TensorDataModule

__all__ = [
    "DigitsDataModule",
    "LongTailedDigitsDataModule",
    "MNIST1DDataModule",
    "MultiLabelDigitsDataModule",
    "NMDigitsDataModule",
    "RareDigitDataModule",
    "ResumableDataLoader",
    "ResumableSampler",
    "TensorDataModule",
    "UnpaddedDistributedSampler",
]
