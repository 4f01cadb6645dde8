"""Gathering tensors of different lengths from every process (DDP's uneven splits)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import Tensor

__all__ = ["all_gather_uneven", "sample_positions"]


def all_gather_uneven(strategy: pl.strategies.Strategy, tensor: Tensor) -> Tensor:
    """Every process's ``tensor`` concatenated along dim 0, whatever its length on each process.

    ``strategy.all_gather`` needs the same shape everywhere; here the lengths are gathered
    first, each process pads its tensor to the longest with zeros, the padded tensors are
    gathered, and each process's padding is cut off again: the result is the rank-0 rows, then
    the rank-1 rows, and so on, on every process. The trailing dimensions and the dtype must be
    the same on every process. With one process the tensor is returned as it is.
    """
    if getattr(strategy, "world_size", 1) == 1:  # as Trainer.world_size reads it
        return tensor
    length = torch.tensor(tensor.shape[0], device=tensor.device)
    lengths = strategy.all_gather(length).flatten().tolist()
    padded = tensor.new_zeros((max(lengths), *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    gathered = strategy.all_gather(padded)  # [world_size, longest, ...]
    return torch.cat([rows[:n] for rows, n in zip(gathered, lengths, strict=True)])


def sample_positions(counts: list[int]) -> Tensor:
    """The loader positions of rows gathered by :func:`all_gather_uneven` from ``counts``.

    Process ``r`` of ``W`` holds ``counts[r]`` samples; its ``k``-th is at position
    ``r + W * k``: the dataset position under
    :class:`~lightning_losses.data.samplers.UnpaddedDistributedSampler` (and an unshuffled
    loader in one process), so a choice of samples by position is the same on any number of
    processes.

    Example:
        >>> sample_positions([3, 2]).tolist()  # rank 0: 0, 2, 4; rank 1: 1, 3
        [0, 2, 4, 1, 3]
    """
    world = len(counts)
    return torch.cat([r + world * torch.arange(n) for r, n in enumerate(counts)])
