"""The base of the DataModules: arrays held in memory, split by index, served as tensors."""

from __future__ import annotations

from typing import (
    Any,
)

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.data.samplers import ResumableDataLoader, UnpaddedDistributedSampler
from lightning_losses.functional.checks import check_choice, check_fraction, check_int

TASKS = ("multiclass", "binary", "multilabel", "nm")
SPLITS = ("train", "val", "test")

# ----------------------------------------------------------------------------------------------
# Shared machinery
# ----------------------------------------------------------------------------------------------


def _split_indices(
    indices: np.ndarray,
    stratify: np.ndarray | None,
    seed: int,
    val_fraction: float,
    test_fraction: float,
) -> dict[str, np.ndarray]:
    """Split ``indices`` into sorted train / val / test index arrays with ``train_test_split``."""
    from sklearn.model_selection import train_test_split

    n = len(indices)
    n_test, n_val = round(test_fraction * n), round(val_fraction * n)
    if min(n_test, n_val, n - n_test - n_val) < 1:
        raise ValueError(
            f"cannot split {n} samples with val_fraction={val_fraction} and "
            f"test_fraction={test_fraction}: every split needs at least one sample"
        )
    positions = np.arange(n)
    rest, test = train_test_split(positions, test_size=n_test, random_state=seed, stratify=stratify)
    train, val = train_test_split(
        rest,
        test_size=n_val,
        random_state=seed,
        stratify=None if stratify is None else stratify[rest],
    )
    return {
        name: np.sort(indices[part]) for name, part in zip(SPLITS, (train, val, test), strict=True)
    }


class _SplitDataModule(L.LightningDataModule):
    """Base of the modules: arrays held in memory, split by index, served as tensors.

    A subclass calls ``super().__init__`` with the common arguments, then :meth:`_set_data`.
    """

    def __init__(
        self,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        batch_size = check_int("batch_size", batch_size, low=1)
        seed = check_int("seed", seed, low=0, high=2**32 - 1)
        check_fraction("val_fraction", val_fraction)
        check_fraction("test_fraction", test_fraction)
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(
                f"val_fraction + test_fraction must be < 1, got {val_fraction} + {test_fraction}"
            )
        num_workers = check_int("num_workers", num_workers, low=0)
        self.batch_size = batch_size
        self.seed = seed
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.num_workers = num_workers

    def _set_data(
        self,
        features: np.ndarray,
        targets: np.ndarray,
        split_indices: dict[str, np.ndarray],
        *,
        task: str,
        num_classes: int,
        num_tasks: int = 1,
    ) -> None:
        self._features = features
        self._targets = targets
        self.split_indices = split_indices
        self._task = task
        self._num_classes = num_classes
        self._num_tasks = num_tasks

    def _split(self, indices: np.ndarray, stratify: np.ndarray | None) -> dict[str, np.ndarray]:
        return _split_indices(indices, stratify, self.seed, self.val_fraction, self.test_fraction)

    @property
    def num_features(self) -> int:
        """Number of input features ``D``."""
        return int(self._features.shape[1])

    @property
    def num_classes(self) -> int:
        """Classes ``C`` (multiclass), 1 (binary), labels ``K`` (multilabel), ``m`` (nm)."""
        return self._num_classes

    @property
    def num_tasks(self) -> int:
        """Number of tasks ``n`` of an nm problem; 1 otherwise."""
        return self._num_tasks

    @property
    def task(self) -> str:
        """One of ``"multiclass"``, ``"binary"``, ``"multilabel"``, ``"nm"``."""
        return self._task

    def dataset(self, split: str) -> TensorDataset:
        """The ``(features, target)`` dataset of ``split`` (``"train"``, ``"val"``, ``"test"``)."""
        check_choice("split", split, SPLITS)
        index = self.split_indices[split]
        return TensorDataset(
            torch.from_numpy(np.array(self._features[index], dtype=np.float32)),
            torch.from_numpy(np.array(self._targets[index])),
        )

    def train_dataloader(self) -> ResumableDataLoader:
        """Shuffled by ``(seed, epoch)``; resumable mid-epoch from a Lightning checkpoint."""
        return ResumableDataLoader(
            self.dataset("train"),
            batch_size=self.batch_size,
            seed=self.seed,
            num_workers=self.num_workers,
        )

    def _eval_loader(self, dataset: Any) -> DataLoader:
        """In index order; under DDP each sample goes to exactly one process, unpadded."""
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=UnpaddedDistributedSampler(dataset),
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        """The validation split, in index order (under DDP: this process's unpadded share)."""
        return self._eval_loader(self.dataset("val"))

    def test_dataloader(self) -> DataLoader:
        """The test split, in index order (under DDP: this process's unpadded share)."""
        return self._eval_loader(self.dataset("test"))

    def predict_dataloader(self) -> DataLoader:
        """The test features alone: batches are ``[B, D]`` float32 tensors."""
        return self._eval_loader(self.dataset("test").tensors[0])


# ----------------------------------------------------------------------------------------------
# Digits
# ----------------------------------------------------------------------------------------------
