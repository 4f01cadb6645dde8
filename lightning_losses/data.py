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

import csv
import functools
import math
from collections.abc import Iterator, Sequence, Sized
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

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

TASKS = ("multiclass", "binary", "multilabel", "nm")
SPLITS = ("train", "val", "test")


# ----------------------------------------------------------------------------------------------
# Resumable, deterministic training loader
# ----------------------------------------------------------------------------------------------


class ResumableSampler(DistributedSampler):
    """An index sampler whose order depends only on ``(seed, epoch)`` and that can start mid-epoch.

    The order of an epoch is ``torch.randperm`` drawn from a private generator seeded with
    ``seed * 1_000_003 + epoch`` (no global random state is read or changed), padded and split
    between replicas as :class:`~torch.utils.data.DistributedSampler` does. ``position`` is the
    number of this replica's samples of the current epoch already consumed; iteration yields the
    rest of the epoch's order from there. :meth:`set_epoch` with a new epoch starts that epoch at
    position 0; with the current epoch it keeps the position (Lightning calls it again after
    restoring a mid-epoch checkpoint).

    It subclasses ``DistributedSampler`` so that Lightning leaves it in place under DDP instead of
    wrapping it; the number of replicas and the rank default to the process group's, if any.

    Args:
        dataset: anything with a length; only its length is used.
        seed: seed of the per-epoch orders.
        shuffle: shuffle each epoch; otherwise the order is ``0, 1, ..., n - 1``.
        num_replicas: number of processes sharing the data (default: the world size, or 1).
        rank: this process's rank (default: the global rank, or 0).

    Example:
        >>> sampler = ResumableSampler(range(6), seed=0)
        >>> first = list(sampler)
        >>> sorted(first)
        [0, 1, 2, 3, 4, 5]
        >>> sampler.position = 4  # four samples of epoch 0 were consumed
        >>> list(sampler) == first[4:]
        True
        >>> sampler.set_epoch(1)
        >>> sampler.position, list(sampler) == first
        (0, False)
    """

    def __init__(
        self,
        dataset: Sized,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if distributed else 1
        if rank is None:
            rank = dist.get_rank() if distributed else 0
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.position = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order is drawn; a new epoch starts at position 0."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    def epoch_order(self) -> list[int]:
        """This replica's whole order for the current epoch (ignoring ``position``)."""
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            indices = torch.randperm(n, generator=generator).tolist()
        else:
            indices = list(range(n))
        padding = self.total_size - n
        indices += (indices * math.ceil(padding / max(n, 1)))[:padding]
        return indices[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_order()[self.position :])


class ResumableDataLoader(DataLoader):
    """A shuffling DataLoader that Lightning can checkpoint and resume mid-epoch.

    It draws its order from a :class:`ResumableSampler` and counts the batches it has handed
    out (not the indices its sampler or workers have prefetched) in ``sampler.position``.
    ``state_dict()`` returns ``{"epoch": int, "position": int}``, plain ints, which Lightning
    stores in the checkpoint (``loops.fit_loop.state_dict.combined_loader``) and gives back to
    ``load_state_dict`` when it restarts an unfinished epoch; iteration then resumes at the next
    unseen batch of the same order. Lightning's ``set_epoch`` call at each epoch start selects
    the epoch. Outside Lightning, iterating again after a complete pass moves to the next epoch
    by itself. Only one iterator should be active at a time.

    Every keyword of :class:`~torch.utils.data.DataLoader` except ``shuffle``, ``sampler``,
    ``batch_sampler`` and ``generator`` is accepted. The loader's own ``generator`` is seeded
    with ``seed``, so iterating never consumes the global random state.

    Args:
        dataset: a map-style dataset.
        batch_size: samples per batch.
        seed: seed of the per-epoch orders.
        shuffle: shuffle each epoch (otherwise the natural order).
        **kwargs: passed to :class:`~torch.utils.data.DataLoader`.

    Example:
        >>> loader = ResumableDataLoader(torch.arange(10), batch_size=4, seed=0)
        >>> batches = iter(loader)
        >>> first = next(batches)
        >>> state = loader.state_dict()
        >>> state
        {'epoch': 0, 'position': 4}
        >>> resumed = ResumableDataLoader(torch.arange(10), batch_size=4, seed=0)
        >>> resumed.load_state_dict(state)
        >>> [b.tolist() for b in resumed] == [b.tolist() for b in batches]
        True
    """

    sampler: ResumableSampler

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        *,
        seed: int = 0,
        shuffle: bool = True,
        **kwargs: Any,
    ) -> None:
        sampler = ResumableSampler(dataset, seed=seed, shuffle=shuffle)
        generator = torch.Generator().manual_seed(seed)
        super().__init__(
            dataset, batch_size=batch_size, sampler=sampler, generator=generator, **kwargs
        )

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # A generator: nothing happens until the first batch is requested, which Lightning does
        # after it has restored the state and called ``set_epoch``.
        return self._iterate()

    def _iterate(self) -> Iterator[Any]:
        sampler = self.sampler
        if sampler.position >= self._samples_per_epoch():
            sampler.set_epoch(sampler.epoch + 1)  # the last pass finished this epoch
        for batch in super().__iter__():
            sampler.position = min(sampler.position + self.batch_size, len(sampler))
            yield batch

    def _samples_per_epoch(self) -> int:
        return min(len(self) * self.batch_size, len(self.sampler))  # type: ignore[operator]

    def state_dict(self) -> dict[str, int]:
        """The epoch and the number of this replica's samples of it already handed out."""
        return {"epoch": int(self.sampler.epoch), "position": int(self.sampler.position)}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Continue from a :meth:`state_dict`: the next batch is the first one not handed out."""
        self.sampler.epoch = int(state_dict["epoch"])
        self.sampler.position = int(state_dict["position"])


# ----------------------------------------------------------------------------------------------
# Exact evaluation under DDP
# ----------------------------------------------------------------------------------------------


def _checked_count(name: str, value: int | None, minimum: int) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name} must be an int or None; got {type(value).__name__}")
    if value is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return value


class UnpaddedDistributedSampler(DistributedSampler):
    """One process's share of an evaluation set: every sample once, no padding, no repeats.

    With ``W`` processes, rank ``r`` takes the indices ``r, r + W, r + 2W, ...`` below the
    dataset's length ``N``, in that order: the ranks' shares are disjoint and together are
    exactly ``range(N)``. Ranks then hold ``ceil(N / W)`` or ``floor(N / W)`` samples (zero when
    ``N < W``), so they may run different numbers of batches. Metrics that reduce sums across
    processes (torchmetrics ``Metric`` s with ``dist_reduce_fx="sum"``) then give the values of
    the whole set; torch's :class:`~torch.utils.data.DistributedSampler` instead pads the set
    to a multiple of ``W`` by repeating samples, which biases them.

    The number of replicas and the rank, unless given, are read from ``torch.distributed`` each
    time the sampler is iterated or measured (the world size and global rank once the process
    group is initialised; 1 and 0 before that), so a loader built before the process group
    exists still splits correctly. Lightning keeps any ``DistributedSampler`` instance it finds
    in a loader instead of replacing it with a padded one, so returning a
    ``DataLoader(dataset, batch_size, sampler=UnpaddedDistributedSampler(dataset))`` from
    ``val_dataloader`` / ``test_dataloader`` / ``predict_dataloader`` of any DataModule makes
    its evaluation exact under DDP. There is nothing to shuffle; :meth:`set_epoch` has no effect.

    Under DDP Lightning needs every process to get at least one batch (it raises otherwise),
    so use at most ``N`` processes; no step of evaluation needs the ranks in step (collectives
    happen at epoch end), so unequal numbers of batches are fine.

    Args:
        dataset: anything with a length; only its length is used.
        num_replicas: number of processes sharing the data (default: the world size, or 1).
        rank: this process's rank in ``[0, num_replicas)`` (default: the global rank, or 0).

    Raises:
        TypeError: ``num_replicas`` or ``rank`` is not an int.
        ValueError: ``num_replicas < 1``, ``rank < 0``, or ``rank >= num_replicas`` when the
            sampler is used.

    Example:
        >>> [list(UnpaddedDistributedSampler(range(5), num_replicas=2, rank=r)) for r in (0, 1)]
        [[0, 2, 4], [1, 3]]
        >>> [len(UnpaddedDistributedSampler(range(2), num_replicas=3, rank=r)) for r in (0, 1, 2)]
        [1, 1, 0]
        >>> list(UnpaddedDistributedSampler(range(4)))  # no process group: the whole set, in order
        [0, 1, 2, 3]
        >>> sampler = UnpaddedDistributedSampler(range(10), num_replicas=3, rank=0)
        >>> loader = DataLoader(torch.arange(10), batch_size=4, sampler=sampler)
        >>> [batch.tolist() for batch in loader]
        [[0, 3, 6, 9]]
    """

    def __init__(
        self, dataset: Sized, *, num_replicas: int | None = None, rank: int | None = None
    ) -> None:
        # DistributedSampler.__init__ is not called: it reads the process group now and pads.
        # Subclassing it only tells Lightning to leave this sampler in place.
        self.dataset = dataset
        self._num_replicas = _checked_count("num_replicas", num_replicas, 1)
        self._rank = _checked_count("rank", rank, 0)
        self.epoch = 0
        self.seed = 0
        self.shuffle = False
        self.drop_last = False

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        """The given number of replicas, else the world size of the process group, else 1."""
        if self._num_replicas is not None:
            return self._num_replicas
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    @property
    def rank(self) -> int:  # type: ignore[override]
        """The given rank, else the global rank in the process group, else 0."""
        if self._rank is not None:
            return self._rank
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    @property
    def total_size(self) -> int:  # type: ignore[override]
        """Samples over all ranks: the dataset's length (nothing is added)."""
        return len(self.dataset)  # type: ignore[arg-type]

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        """Samples of this rank: ``len(range(rank, N, num_replicas))``."""
        return len(self._indices())

    def _indices(self) -> range:
        num_replicas, rank = self.num_replicas, self.rank
        if not rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}); got rank={rank}")
        return range(rank, self.total_size, num_replicas)

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices())

    def __len__(self) -> int:
        return self.num_samples


# ----------------------------------------------------------------------------------------------
# Shared machinery
# ----------------------------------------------------------------------------------------------


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")


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


@functools.cache
def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: features ``[1797, 64]`` float32 in [0, 1], labels int64."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    features.flags.writeable = False
    labels.flags.writeable = False
    return features, labels


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
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
        _check_fraction("val_fraction", val_fraction)
        _check_fraction("test_fraction", test_fraction)
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(
                f"val_fraction + test_fraction must be < 1, got {val_fraction} + {test_fraction}"
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
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
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
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


class DigitsDataModule(_SplitDataModule):
    """scikit-learn's handwritten digits: 10 classes, 64 features in [0, 1].

    Splits are stratified by digit. Targets are int64 class indices.

    Args:
        batch_size: samples per batch.
        seed: chooses the splits and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = DigitsDataModule(batch_size=32)
        >>> dm.num_features, dm.num_classes, dm.num_tasks, dm.task
        (64, 10, 1, 'multiclass')
        >>> x, y = next(iter(dm.train_dataloader()))
        >>> x.shape, x.dtype, y.shape, y.dtype
        (torch.Size([32, 64]), torch.float32, torch.Size([32]), torch.int64)
    """

    def __init__(
        self,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        features, labels = _load_digits()
        splits = self._split(np.arange(len(labels)), labels)
        self._set_data(features, labels, splits, task="multiclass", num_classes=10)


class LongTailedDigitsDataModule(_SplitDataModule):
    """Digits whose training split is long-tailed; validation and test stay balanced.

    The data is first split exactly as :class:`DigitsDataModule` splits it (same ``seed``, same
    fractions). Then the training split keeps ``int(n_max * imbalance_ratio ** (-c / 9))``
    samples of class ``c``, drawn at random by ``seed``, where ``n_max`` is the size of the
    smallest class in the training split: class 0 is the most frequent, class 9 the rarest, and
    their ratio is ``imbalance_ratio`` up to rounding. Validation and test keep their balanced
    classes, so that they measure accuracy on every class alike (the usual long-tailed protocol).

    Args:
        imbalance_ratio: largest over smallest class count in training, ``>= 1``.
        batch_size: samples per batch.
        seed: chooses the splits, the kept samples and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = LongTailedDigitsDataModule(imbalance_ratio=10.0)
        >>> counts = np.bincount(dm.dataset("train").tensors[1].numpy())
        >>> bool(counts[0] >= 10 * counts[9] > 0), bool(np.all(np.diff(counts) <= 0))
        (True, True)
    """

    def __init__(
        self,
        imbalance_ratio: float = 10.0,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        if not imbalance_ratio >= 1.0:
            raise ValueError(f"imbalance_ratio must be >= 1, got {imbalance_ratio!r}")
        self.imbalance_ratio = imbalance_ratio
        features, labels = _load_digits()
        splits = self._split(np.arange(len(labels)), labels)
        train = splits["train"]
        n_classes = 10
        n_max = int(np.bincount(labels[train], minlength=n_classes).min())
        if imbalance_ratio > n_max:
            raise ValueError(
                f"imbalance_ratio must be <= {n_max} (the smallest class count in the training "
                f"split), got {imbalance_ratio!r}"
            )
        rng = np.random.default_rng(seed)
        kept = []
        for c in range(n_classes):
            count = int(n_max * imbalance_ratio ** (-c / (n_classes - 1)))
            kept.append(rng.choice(train[labels[train] == c], size=count, replace=False))
        splits["train"] = np.sort(np.concatenate(kept))
        self._set_data(features, labels, splits, task="multiclass", num_classes=n_classes)


class RareDigitDataModule(_SplitDataModule):
    """Binary one-vs-rest digits: is it ``positive_digit``? Positives are a chosen fraction.

    Before splitting, one side is subsampled (by ``seed``) so that positives make up
    ``positive_fraction`` of the data: the positives when the fraction is below the natural one
    (about 0.1), the negatives when it is above. The splits are then stratified by the binary
    label, so that every split has the same positive fraction. Targets are float32 0. or 1.

    Args:
        positive_digit: the digit labelled 1.0, in 0..9.
        positive_fraction: fraction of positives in the data, in (0, 1).
        batch_size: samples per batch.
        seed: chooses the kept samples, the splits and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = RareDigitDataModule(positive_digit=3, positive_fraction=0.05)
        >>> dm.task, dm.num_classes
        ('binary', 1)
        >>> y = dm.dataset("train").tensors[1]
        >>> y.dtype, round(y.mean().item(), 2)
        (torch.float32, 0.05)
    """

    def __init__(
        self,
        positive_digit: int = 0,
        positive_fraction: float = 0.05,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        if positive_digit not in range(10):
            raise ValueError(f"positive_digit must be an integer in 0..9, got {positive_digit!r}")
        _check_fraction("positive_fraction", positive_fraction)
        self.positive_digit = positive_digit
        self.positive_fraction = positive_fraction
        features, labels = _load_digits()
        positives = np.flatnonzero(labels == positive_digit)
        negatives = np.flatnonzero(labels != positive_digit)
        f = positive_fraction
        if f * len(negatives) / (1.0 - f) <= len(positives):  # keep every negative
            n_pos, n_neg = round(f * len(negatives) / (1.0 - f)), len(negatives)
        else:  # keep every positive
            n_pos, n_neg = len(positives), round(len(positives) * (1.0 - f) / f)
        if min(n_pos, n_neg) < 3:
            raise ValueError(
                f"positive_fraction={f} leaves {n_pos} positives and {n_neg} negatives; "
                "each split needs at least one of each"
            )
        rng = np.random.default_rng(seed)
        kept = np.sort(
            np.concatenate(
                [
                    rng.choice(positives, size=n_pos, replace=False),
                    rng.choice(negatives, size=n_neg, replace=False),
                ]
            )
        )
        targets = (labels == positive_digit).astype(np.float32)
        splits = self._split(kept, targets[kept])
        self._set_data(features, targets, splits, task="binary", num_classes=1)


class MultiLabelDigitsDataModule(_SplitDataModule):
    """Five binary attributes of each digit, named in :attr:`label_names`.

    ``is_even`` (0 2 4 6 8), ``is_prime`` (2 3 5 7), ``greater_than_4`` (5..9),
    ``has_closed_loop`` (0 4 6 8 9) and ``is_square`` (0 1 4 9). Splits are stratified by digit
    and equal those of :class:`DigitsDataModule` with the same arguments. Targets are float32
    ``[B, 5]`` of 0. and 1.

    Args:
        batch_size: samples per batch.
        seed: chooses the splits and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = MultiLabelDigitsDataModule()
        >>> dm.task, dm.num_classes, dm.label_names[0]
        ('multilabel', 5, 'is_even')
        >>> MultiLabelDigitsDataModule.attributes(np.array([7])).tolist()
        [[0.0, 1.0, 1.0, 0.0, 0.0]]
    """

    label_names: tuple[str, ...] = (
        "is_even",
        "is_prime",
        "greater_than_4",
        "has_closed_loop",
        "is_square",
    )
    _label_digits: tuple[tuple[int, ...], ...] = (
        (0, 2, 4, 6, 8),
        (2, 3, 5, 7),
        (5, 6, 7, 8, 9),
        (0, 4, 6, 8, 9),
        (0, 1, 4, 9),
    )

    def __init__(
        self,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        features, labels = _load_digits()
        splits = self._split(np.arange(len(labels)), labels)
        targets = self.attributes(labels)
        self._set_data(features, targets, splits, task="multilabel", num_classes=len(targets[0]))

    @classmethod
    def attributes(cls, digits: np.ndarray) -> np.ndarray:
        """The ``[N, 5]`` float32 attribute matrix of an array of digits."""
        return np.stack([np.isin(digits, members) for members in cls._label_digits], axis=1).astype(
            np.float32
        )


class NMDigitsDataModule(_SplitDataModule):
    """Three 3-way tasks per digit: the base-3 digits of its label, least significant first.

    Label ``d`` gives the targets ``[d % 3, (d // 3) % 3, (d // 9) % 3]`` (int64 ``[B, 3]``);
    ``num_tasks`` is 3 and ``num_classes`` (per task) is 3. Splits are stratified by digit and
    equal those of :class:`DigitsDataModule` with the same arguments.

    Args:
        batch_size: samples per batch.
        seed: chooses the splits and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = NMDigitsDataModule()
        >>> dm.task, dm.num_tasks, dm.num_classes
        ('nm', 3, 3)
        >>> NMDigitsDataModule.base3(np.array([5])).tolist()
        [[2, 1, 0]]
    """

    def __init__(
        self,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        features, labels = _load_digits()
        splits = self._split(np.arange(len(labels)), labels)
        targets = self.base3(labels)
        self._set_data(features, targets, splits, task="nm", num_classes=3, num_tasks=3)

    @staticmethod
    def base3(digits: np.ndarray) -> np.ndarray:
        """The ``[N, 3]`` int64 base-3 digits of labels 0..26, least significant first."""
        digits = np.asarray(digits, dtype=np.int64)
        return np.stack([digits % 3, (digits // 3) % 3, (digits // 9) % 3], axis=1)


# ----------------------------------------------------------------------------------------------
# The user's own arrays
# ----------------------------------------------------------------------------------------------


def _read_csv(path: Path) -> tuple[list[str] | None, np.ndarray]:
    """Rows of numbers, with an optional header row of column names."""
    with path.open(newline="") as file:
        rows = [row for row in csv.reader(file) if row]
    header = None
    if rows:
        try:
            [float(cell) for cell in rows[0]]
        except ValueError:
            header = [cell.strip() for cell in rows.pop(0)]
    if not rows:
        raise ValueError(f"{path} has no data rows")
    widths = {len(row) for row in rows}
    if len(widths) != 1 or (header is not None and widths != {len(header)}):
        raise ValueError(f"{path}: every row (and the header) must have the same number of cells")
    try:
        return header, np.array(rows, dtype=np.float64)
    except ValueError as error:
        raise ValueError(f"{path}: non-numeric value in a data row ({error})") from None


def _column_index(column: str | int, header: list[str] | None, width: int) -> int:
    if isinstance(column, str):
        if header is None:
            raise ValueError(f"label_column={column!r} names a column, but the CSV has no header")
        if column not in header:
            raise ValueError(f"label_column={column!r} is not a column; the columns are {header}")
        return header.index(column)
    if not -width <= column < width:
        raise ValueError(f"label_column={column} is out of range for {width} columns")
    return column % width


def _check_labels(labels: np.ndarray, task: str) -> np.ndarray:
    """Validate labels for ``task`` and cast them: int64 or float32, 1-D or 2-D as the task."""
    if task in ("multiclass", "binary"):
        if labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.ndim != 1:
            raise ValueError(f"task={task!r} needs one label per sample, got shape {labels.shape}")
    else:
        labels = labels.reshape(len(labels), -1)
    if task in ("multiclass", "nm"):
        if not np.all(np.isfinite(labels)) or np.any(labels < 0) or np.any(labels != labels // 1):
            raise ValueError(f"task={task!r} needs labels that are integers >= 0")
        return labels.astype(np.int64)
    if task == "binary" and not np.all(np.isin(labels, (0, 1))):
        raise ValueError("task='binary' needs labels 0 or 1")
    if task == "multilabel" and not np.all((labels >= 0) & (labels <= 1)):
        raise ValueError("task='multilabel' needs labels in [0, 1]")
    return labels.astype(np.float32)


class TensorDataModule(_SplitDataModule):
    """The user's own features and labels, from a ``.npz`` or ``.csv`` file.

    ``.npz``: the features are the array ``features_key`` (``[N, D]``, or ``[N, ...]``, which is
    flattened) and the labels the array ``labels_key``. ``.csv``: numeric cells, an optional
    header row of column names; the labels are ``label_column`` (a name or an index, negative
    counting from the end; for ``"multilabel"`` and ``"nm"`` also a list of them) and the
    features are all other columns. Features are used as they are (float32, not rescaled).

    Labels per ``task``: ``"multiclass"``: integers >= 0, ``num_classes = max + 1``;
    ``"binary"``: 0 or 1, ``num_classes = 1``; ``"multilabel"``: ``[N, K]`` in [0, 1],
    ``num_classes = K``; ``"nm"``: ``[N, n]`` integers >= 0, ``num_tasks = n`` and
    ``num_classes = max + 1``. Splits are stratified by label for multiclass and binary when
    every class has enough samples, and random otherwise.

    Args:
        path: the ``.npz`` or ``.csv`` file.
        task: ``"multiclass"``, ``"binary"``, ``"multilabel"`` or ``"nm"``.
        label_column: CSV only: the label column(s), by name or index.
        features_key: NPZ only: name of the features array.
        labels_key: NPZ only: name of the labels array.
        batch_size: samples per batch.
        seed: chooses the splits and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unknown extension or task, missing array or column, labels of the wrong
            kind for the task, or features and labels of different lengths.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "data.csv"
        >>> rows = [f"{i},{i % 4},{i % 3}" for i in range(60)]
        >>> _ = path.write_text("a,b,label\\n" + "\\n".join(rows))
        >>> dm = TensorDataModule(str(path), label_column="label")
        >>> dm.num_features, dm.num_classes, len(dm.dataset("test"))
        (2, 3, 12)
    """

    def __init__(
        self,
        path: str,
        task: str = "multiclass",
        label_column: str | int | list[str | int] = -1,
        features_key: str = "x",
        labels_key: str = "y",
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        self.path = path
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"path={path!r}: no such file")
        suffix = file.suffix.lower()
        if suffix == ".npz":
            features, labels = self._load_npz(file, features_key, labels_key)
        elif suffix == ".csv":
            features, labels = self._load_csv(file, task, label_column)
        else:
            raise ValueError(f"path={path!r}: unknown extension {suffix!r}; use .npz or .csv")
        if len(features) != len(labels):
            raise ValueError(
                f"features and labels have different lengths: {len(features)} and {len(labels)}"
            )
        features = features.reshape(len(features), -1).astype(np.float32)
        labels = _check_labels(labels, task)
        num_tasks = labels.shape[1] if task == "nm" else 1
        if task == "multiclass" or task == "nm":
            num_classes = int(labels.max()) + 1
        else:
            num_classes = labels.shape[1] if task == "multilabel" else 1
        indices = np.arange(len(labels))
        try:
            splits = self._split(indices, labels if task in ("multiclass", "binary") else None)
        except ValueError:  # a class too rare to stratify (or too few samples: raised again)
            splits = self._split(indices, None)
        self._set_data(
            features, labels, splits, task=task, num_classes=num_classes, num_tasks=num_tasks
        )

    @staticmethod
    def _load_npz(file: Path, features_key: str, labels_key: str) -> tuple[np.ndarray, np.ndarray]:
        with np.load(file, allow_pickle=False) as arrays:
            for argument, key in (("features_key", features_key), ("labels_key", labels_key)):
                if key not in arrays:
                    raise ValueError(
                        f"{argument}={key!r} is not an array in {file}; it has {list(arrays)}"
                    )
            return arrays[features_key], arrays[labels_key]

    @staticmethod
    def _load_csv(
        file: Path, task: str, label_column: str | int | Sequence[str | int]
    ) -> tuple[np.ndarray, np.ndarray]:
        header, data = _read_csv(file)
        width = data.shape[1]
        if isinstance(label_column, (str, int)):
            columns = [_column_index(label_column, header, width)]
        elif task in ("multilabel", "nm"):
            columns = [_column_index(column, header, width) for column in label_column]
        else:
            raise ValueError(f"label_column may be a list only for multilabel or nm, not {task!r}")
        if not columns or len(set(columns)) != len(columns) or len(columns) >= width:
            raise ValueError(
                f"label_column={label_column!r} must name distinct columns and leave features"
            )
        features = np.delete(data, columns, axis=1)
        labels = data[:, columns]
        return features, labels[:, 0] if len(columns) == 1 and task != "multilabel" else labels


# MNIST1DDataModule lives in .mnist1d, which imports this module: an eager re-export here would
# fail when .mnist1d is imported first (circular import), so the name is resolved on first use.
from typing import TYPE_CHECKING  # noqa: E402

if TYPE_CHECKING:
    from .mnist1d import MNIST1DDataModule


def __getattr__(name: str) -> Any:
    if name == "MNIST1DDataModule":
        from .mnist1d import MNIST1DDataModule

        return MNIST1DDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
