"""Dense inputs: ``[N, C, *]`` preds with ``[N, *]`` class indices, as ``[M, C]`` rows.

Segmentation outputs (``[N, C, H, W]`` with ``[N, H, W]`` masks), token sequences in the
class-second layout (``[N, C, L]`` with ``[N, L]``) and any other trailing dimensions are one
multiclass problem per position. :func:`flatten_dense` moves the class dimension last and
flattens the rest, so every calibration function and ``Metric`` sees ``[M, C]`` rows with
``[M]`` targets, ``M = N * prod(*)``, before its checks; this is the one place where it
happens. Binary ``[N]`` and multi-label ``[N, K]`` inputs keep their shapes.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["flatten_dense", "is_dense"]


def is_dense(preds: object, target: object) -> bool:
    """Whether ``preds [N, C, *]`` and ``target [N, *]`` have the dense multiclass shapes.

    At least one trailing dimension (``preds.dim() >= 3``), and ``target.shape`` equal to
    ``preds.shape`` without its class dimension 1. Dtypes are checked elsewhere.

    Example:
        >>> import torch
        >>> is_dense(torch.rand(2, 3, 4, 5), torch.zeros(2, 4, 5, dtype=torch.long))
        True
        >>> is_dense(torch.rand(2, 3), torch.zeros(2, dtype=torch.long))
        False
    """
    if not isinstance(preds, Tensor) or not isinstance(target, Tensor) or preds.dim() < 3:
        return False
    return target.shape == preds.shape[:1] + preds.shape[2:]


def flatten_dense(
    preds: Tensor, target: Tensor, keep: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``[N, C, *]`` preds and ``[N, *]`` targets as ``[M, C]`` rows and ``[M]`` targets.

    Anything that is not dense (see :func:`is_dense`) comes back unchanged. Row ``m`` is the
    position ``m`` of ``target`` in C (row-major) order: ``preds.movedim(1, -1).reshape(-1,
    C)``, a view when the class dimension is already last in memory (a channels-last tensor),
    else one copy. With ``keep`` (a bool mask of ``target``'s shape), only the kept positions
    come back, in the same order, from a single indexing copy (no full flat copy first).

    Example:
        >>> import torch
        >>> preds = torch.arange(12.0).reshape(1, 3, 2, 2)  # [N=1, C=3, H=2, W=2]
        >>> rows, labels = flatten_dense(preds, torch.tensor([[[0, 1], [2, 0]]]))
        >>> rows[1], labels
        (tensor([1., 5., 9.]), tensor([0, 1, 2, 0]))
    """
    if not is_dense(preds, target):
        return preds, target
    rows = preds.movedim(1, -1)
    if keep is not None:
        return rows[keep], target[keep]
    return rows.reshape(-1, preds.shape[1]), target.reshape(-1)
