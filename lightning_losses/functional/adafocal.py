"""AdaFocal: focal loss with one ``gamma`` per confidence bin, updated from validation calibration.

Source: Ghosh, Schaaf, Gormley, "AdaFocal: Calibration-aware Adaptive Focal Loss" (NeurIPS 2022).

Two pure pieces live here: the loss, given the current bins (edges and one ``gamma`` each), and
the update rule that turns a validation epoch's per-bin calibration gaps into the next gammas.
The state itself (the bins) belongs to :class:`~lightning_losses.losses.AdaFocalLoss`; the
callback :class:`~lightning_losses.callbacks.AdaFocalUpdate` measures the gaps and applies the
rule after every validation epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lightning_losses.functional._core import target_probability_loss
from lightning_losses.functional._kernel_checks import check_kernel_inputs
from lightning_losses.functional.checks import check_index_target, check_range
from lightning_losses.functional.target_probability import check_no_label_smoothing
from lightning_losses.kernels.availability import use_kernels
from lightning_losses.loss_ranges import CALLBACK_RANGES

__all__ = [
    "adafocal_loss",
    "adafocal_update",
    "bin_gammas",
    "check_adafocal_bins",
    "check_adafocal_update",
    "phi_adafocal",
]


def bin_gammas(p: Tensor, edges: Tensor, gammas: Tensor) -> Tensor:
    """Each sample's ``gamma``: that of the bin its probability ``p`` falls into.

    Bin ``k`` is ``[e_k, e_{k+1})``, except that everything below ``e_1`` is in the first bin
    and everything at or above ``e_{B-1}`` in the last (the reference's lookup): ``k`` is the
    number of inner edges ``e_1 .. e_{B-1}`` that are ``<= p``. ``p`` is compared in float64.
    """
    inner = edges[1:-1].to(device=p.device, dtype=torch.float64)
    index = torch.bucketize(p.detach().to(torch.float64), inner, right=True)
    return gammas.to(p.device)[index]


def phi_adafocal(log_p: Tensor, edges: Tensor, gammas: Tensor) -> tuple[Tensor, Tensor]:
    """``-(1 - s p)^|g| log p`` with ``g`` the gamma of ``p``'s bin and ``s = sign(g)``.

    ``g >= 0`` is focal, ``(1-p)^g`` computed as ``(-expm1(log p))^g``; ``g < 0`` is inverse
    focal, ``(1+p)^|g|``. The derivative with respect to ``log p`` is ``b^a (s a p log p / b -
    1)`` with ``b = 1 - s p``, ``a = |g|``; ``log p / b -> -1`` as ``p -> 1`` on the focal side,
    so it stays finite for every ``a >= 0``.
    """
    p = torch.exp(log_p)
    gamma = bin_gammas(p, edges, gammas).to(log_p.dtype)
    focal = gamma >= 0
    magnitude = gamma.abs()
    base = torch.where(focal, -torch.expm1(log_p), 1.0 + p)
    weight = base.pow(magnitude)
    ratio = torch.where(base > 0, log_p / torch.where(base > 0, base, 1.0), -1.0)
    slope = torch.where(focal, magnitude, -magnitude) * p * ratio
    return -weight * log_p, weight * (slope - 1.0)


def check_adafocal_bins(edges: Tensor, gammas: Tensor, *, validate_args: bool = True) -> None:
    """``edges``: 1-D, ``B + 1`` values, non-decreasing; ``gammas``: 1-D, ``B`` finite values.

    The shapes are always checked; the values (a device synchronisation) with
    ``validate_args``.
    """
    for name, value in (("edges", edges), ("gammas", gammas)):
        if not isinstance(value, Tensor) or not value.is_floating_point() or value.dim() != 1:
            raise TypeError(f"{name} must be a 1-D floating-point tensor; got {value!r}")
    if gammas.numel() < 1 or edges.numel() != gammas.numel() + 1:
        raise ValueError(
            "edges must hold one more value than gammas (B + 1 bin edges, B gammas); got "
            f"{edges.numel()} edges and {gammas.numel()} gammas"
        )
    if validate_args:
        if not bool(torch.isfinite(gammas).all()):
            raise ValueError(f"gammas must be finite; got {gammas.tolist()}")
        if edges.numel() > 1 and not bool((edges[1:] >= edges[:-1]).all()):
            raise ValueError(f"edges must be non-decreasing; got {edges.tolist()}")


def _bins(edges: Tensor, gammas: Tensor) -> list[tuple[Tensor, Callable[[], None]]]:
    """The value checks of :func:`check_adafocal_bins` as conditions read with the others."""
    ordered = (edges[1:] >= edges[:-1]).all() if edges.numel() > 1 else torch.tensor(True)
    bad = ~torch.isfinite(gammas).all() | ~ordered.to(gammas.device)
    return [(bad, lambda: check_adafocal_bins(edges, gammas))]


def adafocal_loss(
    logits: Tensor,
    target: Tensor,
    *,
    edges: Tensor,
    gammas: Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """AdaFocal: focal loss whose ``gamma`` is that of the confidence bin ``p_t`` falls into.

    Per element, with ``g`` the gamma of the bin of ``p_t`` (see :func:`bin_gammas`)::

        loss = -(1 - p_t)^g log p_t          if g >= 0   (focal)
        loss = -(1 + p_t)^|g| log p_t        if g < 0    (inverse focal)

    Focal lowers the weight of confident samples and so their confidence; inverse focal raises
    it, for bins where the model is under-confident. The bins and their gammas are state that
    :class:`~lightning_losses.callbacks.AdaFocalUpdate` moves after each validation epoch;
    the choice of ``g`` carries no gradient. The focal weight is computed in log space as
    :func:`~lightning_losses.functional.focal_loss` does, in the fused path of the family.

    Source: Ghosh, Schaaf, Gormley, "AdaFocal: Calibration-aware Adaptive Focal Loss"
    (NeurIPS 2022). The reference sums (``reduction="sum"``); the default here is the mean.

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1).
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        edges: ``[B + 1]`` non-decreasing bin edges in probability (only the inner ``B - 1``
            are used for the lookup).
        gammas: ``[B]`` one gamma per bin, any finite sign.
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        label_smoothing: only 0 is accepted (so that a config may keep the key); other
            values raise ``TypeError``: label smoothing belongs to cross-entropy and gamma
            cross-entropy.
        validate_args: check target values, finite logits, finite gammas and ordered edges
            (device synchronisations; one with ``backend="triton"``).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the fused kernels of
            :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error) or ``"torch"``. The per-sample
            gamma is looked up on the ``N``-vector ``log p_t`` between the two kernels.

    Example:
        >>> edges = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
        >>> gammas = torch.tensor([2.0, -1.0], dtype=torch.float64)
        >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> # p_t = 0.79 uses -(1 + p)^1 log p; p_t = 1/3 uses -(1 - p)^2 log p
        >>> adafocal_loss(logits, torch.tensor([0, 2]), edges=edges, gammas=gammas,
        ...               reduction="none")
        tensor([0.4281, 0.4883])
    """
    check_no_label_smoothing("AdaFocal", label_smoothing)
    if validate_args and backend == "triton":  # the bins' values join the one read
        check_adafocal_bins(edges, gammas, validate_args=False)
        check_index_target(logits, target, ignore_index=ignore_index, validate_args=False)
        if use_kernels(logits, backend):
            check_kernel_inputs(
                logits, target, ignore_index=ignore_index, extra=_bins(edges, gammas)
            )
            validate_args = False
    check_adafocal_bins(edges, gammas, validate_args=validate_args)
    return target_probability_loss(
        logits,
        target,
        phi_adafocal,
        ignore_index=ignore_index,
        reduction=reduction,
        validate_args=validate_args,
        backend=backend,
        edges=edges,
        gammas=gammas,
    )


def check_adafocal_update(
    lambda_: float, switch_point: float, gamma_min: float, gamma_max: float
) -> None:
    """``lambda_ > 0``, ``switch_point >= 0`` and ``gamma_min < gamma_max``, all finite."""
    bounds = CALLBACK_RANGES["AdaFocalUpdate"]
    check_range("lambda_", lambda_, **bounds["lambda_"])
    check_range("switch_point", switch_point, **bounds["switch_point"])
    check_range("gamma_min", gamma_min)
    check_range("gamma_max", gamma_max)
    if not gamma_min < gamma_max:
        raise ValueError(
            f"gamma_min must be below gamma_max; got gamma_min={gamma_min}, gamma_max={gamma_max}"
        )


def adafocal_update(
    gammas: Sequence[float],
    gaps: Sequence[float],
    *,
    lambda_: float = 1.0,
    switch_point: float = 0.2,
    gamma_min: float = -20.0,
    gamma_max: float = 20.0,
) -> list[float]:
    """The next gamma of each bin from its calibration gap ``E = confidence - accuracy``.

    The rule of the reference implementation, in Python floats, bin by bin::

        g' = g * exp(lambda * E)      if g > 0
        g' = g * exp(-lambda * E)     otherwise
        if |g'| < switch_point:  g' = -switch_point if g' > 0 else switch_point
        g' = min(max(g', gamma_min), gamma_max)

    An over-confident bin (``E > 0``) gets a larger focal gamma, an under-confident one a
    smaller one; once ``|g'|`` would drop below the switch point the bin changes sides (focal
    to inverse focal, which raises confidence, and back), restarting at ``switch_point`` in
    magnitude.

    Args:
        gammas: the current gamma of each bin.
        gaps: each bin's mean confidence minus its accuracy on the validation set (0 for an
            empty bin).
        lambda_: the paper's ``lambda``, ``> 0``.
        switch_point: ``|gamma|`` below which a bin switches between focal and inverse focal.
        gamma_min: lower clip (negative: the strongest inverse focal).
        gamma_max: upper clip.

    Example:
        >>> adafocal_update([1.0, 1.0, 0.25], [0.1, -0.05, -1.0])
        [1.1051709180756477, 0.951229424500714, -0.2]
    """
    check_adafocal_update(lambda_, switch_point, gamma_min, gamma_max)
    if len(gammas) != len(gaps):
        raise ValueError(
            f"gaps must hold one value per bin; got {len(gaps)} gaps for {len(gammas)} gammas"
        )
    updated = []
    for gamma, gap in zip(gammas, gaps, strict=True):
        gamma, gap = float(gamma), float(gap)
        if gamma > 0:
            new = gamma * math.exp(lambda_ * gap)
        else:
            new = gamma * math.exp(-lambda_ * gap)
        if abs(new) < switch_point:
            new = -switch_point if new > 0 else switch_point
        updated.append(max(min(new, gamma_max), gamma_min))
    return updated
