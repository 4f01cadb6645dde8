"""Samplers and loaders: a resumable training order and unpadded DDP evaluation.

The training loader is a :class:`ResumableDataLoader`: its shuffled order depends only on
``(seed, epoch)``, and it saves and restores its position, so a run resumed from a Lightning
checkpoint, even one taken in the middle of an epoch, sees exactly the batches that the
uninterrupted run would have seen.

The validation, test and predict loaders draw from an :class:`UnpaddedDistributedSampler`:
under DDP every sample of the split is evaluated by exactly one process (no padding, no
repeats), so metrics reduced across processes are those of the split itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import (
    Any,
)

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from lightning_losses.functional.checks import check_int

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
        super().__init__(
            dataset,  # type: ignore[arg-type]  # typed Dataset, but only its len() is used
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
        )
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
    batch_size: int  # always given (DataLoader's is None only with a batch_sampler)

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
        return min(len(self) * self.batch_size, len(self.sampler))

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
        self.dataset = dataset  # type: ignore[assignment]  # typed Dataset; only len() is used
        self._num_replicas = check_int("num_replicas", num_replicas, low=1, optional=True)
        self._rank = check_int("rank", rank, low=0, optional=True)
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
