"""Batch statistics over every rank of the default process group, with gradients.

The batch-level calibration penalties (:mod:`lightning_losses.functional.calibration_penalties`)
can be computed over the global batch of a data-parallel fit instead of each rank's own batch.
Two collectives do it, both autograd-aware (``torch.distributed.nn.functional.all_reduce``) and
both no-ops without an initialised process group of more than one rank:

- :func:`sum_over_ranks`: the sum of a tensor over the ranks (class sums, counts).
- :func:`concat_over_ranks`: the rows of every rank, in rank order, ranks of uneven sizes
  included: each rank writes its rows at its offset into a zero buffer of the global size and
  the buffers are summed (adding zeros is exact, so the gathered rows are the ranks' rows bit
  for bit).

The gradient. Every rank computes the same global value ``P`` from the gathered statistics, and
the backward of an autograd ``all_reduce`` sums the upstream gradients of all ranks: rank ``k``
receives ``W * dP/dx_k`` for its own inputs ``x_k`` (``W`` the world size), ``W`` identical
contributions. DDP then averages the parameters' gradients over the ranks (divides their sum by
``W``), so the averaged gradient is exactly ``dP/dtheta``, the gradient of the global-batch
penalty: the two factors cancel and no rescaling is needed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


def process_group_active() -> bool:
    """Whether the default process group is initialised and has more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_reduce(tensor: Tensor) -> Tensor:
    """The autograd-aware sum over the ranks (its backward sums the ranks' gradients)."""
    from torch.distributed.nn.functional import all_reduce  # only with a process group

    return all_reduce(tensor, op=dist.ReduceOp.SUM)


def sum_over_ranks(tensor: Tensor) -> Tensor:
    """``tensor`` summed over the ranks of the default process group; itself without one.

    Example:
        >>> sum_over_ranks(torch.tensor([1.0, 2.0]))  # no process group: unchanged
        tensor([1., 2.])
    """
    if not process_group_active():
        return tensor
    return _all_reduce(tensor)


def concat_over_ranks(tensor: Tensor) -> Tensor:
    """The rows (dimension 0) of ``tensor`` of every rank, concatenated in rank order.

    The ranks may hold different numbers of rows; one ``all_reduce`` of the row counts (a host
    synchronisation) gives each rank its offset. Without a process group: ``tensor`` itself.

    Example:
        >>> concat_over_ranks(torch.tensor([[1.0, 2.0]]))
        tensor([[1., 2.]])
    """
    if not process_group_active():
        return tensor
    world, rank = dist.get_world_size(), dist.get_rank()
    counts = torch.zeros(world, dtype=torch.long, device=tensor.device)
    counts[rank] = tensor.shape[0]
    dist.all_reduce(counts)
    sizes = counts.tolist()
    before, total = sum(sizes[:rank]), sum(sizes)
    padding = [0, 0] * (tensor.dim() - 1) + [before, total - before - tensor.shape[0]]
    return _all_reduce(F.pad(tensor, padding))
