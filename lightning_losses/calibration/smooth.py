r"""Smooth ECE (smECE): the calibration error of kernel-smoothed residuals, with its bandwidth.

Source: Błasiok and Nakkiran, "Smooth ECE: Principled Reliability Diagrams via Kernel
Smoothing" (ICLR 2024); the numbers follow the authors' reference implementation, the
``relplot`` package.

With confidences ``f_i`` and correctness ``y_i`` (see
:func:`~lightning_losses.calibration.functional.confidence_and_correct`), a kernel ``K_σ`` on
[0, 1] smooths the residuals ``f_i - y_i`` and the confidences themselves:

.. math::

    \hat r_σ(t) = \frac{\sum_i K_σ(t, f_i)\,(f_i - y_i)}{\sum_i K_σ(t, f_i)}, \qquad
    \hat δ_σ(t) = \frac{1}{N} \sum_i K_σ(t, f_i), \qquad
    \operatorname{smECE}_σ = \frac{\int_0^1 \lvert \hat r_σ(t) \rvert\, \hat δ_σ(t)\,dt}
    {\int_0^1 \hat δ_σ(t)\,dt} .

``K_σ`` is the reflected Gaussian kernel: a Gaussian of standard deviation ``σ`` with its mass
reflected back into [0, 1] at both ends. The smECE is ``smECE_σ*`` at the bandwidth ``σ*``
that solves ``smECE_σ = σ``, found by bisection on [0, 1] as ``relplot.smECE`` does: ten
halvings, keeping the upper end (where ``smECE_σ <= σ``), with bandwidths under ``0.001``
treated as too small.

Computation, O(grid) memory: each sample's mass 1 and residual ``f_i - y_i`` are split linearly
between the two nearest of ``G + 1`` equally spaced nodes of [0, 1] (``G =``
:data:`GRID_SIZE`), which keeps the sums of mass, residual and ``mass × position`` exact. The
kernel acts on these two float64 arrays alone, by one FFT of the grid reflected about its end
nodes (the Gaussian truncated at distance 1/2, as in ``relplot``), and the integrals are means
over ``T = max(200, round(10/σ))`` equally spaced points of [0, 1], ends included, as in
``relplot``. Also as there, a confidence of exactly 0 or 1 has one image in the reflection where
any other has two, blended linearly over the first ``1/(M-1)`` (about ``σ/10``, at most 0.001)
of each end, ``M = max(2000, round(20/σ)) // 2 + 1`` being ``relplot``'s number of nodes: this
matters for saturated confidences, e.g. of an over-confident network. The two arrays are the
whole state of :class:`~lightning_losses.calibration.metrics.SmoothCalibrationError`: they add
up over batches and over processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, Literal, NamedTuple, overload

import numpy as np
import torch
from torch import Tensor

from lightning_losses.calibration import functional as CF
from lightning_losses.calibration.functional import InputFormat, Task
from lightning_losses.functional.checks import check_flag, check_int, check_real

__all__ = [
    "GRID_SIZE",
    "SmoothReliabilityCurve",
    "smooth_calibration_error",
    "smooth_calibration_error_from_grid",
    "smooth_grid_statistics",
    "smooth_reliability_curve",
]

#: Intervals ``G`` of the grid: ``G + 1`` nodes ``k / G`` on [0, 1]. At the narrowest
#: bandwidth, :data:`MIN_BANDWIDTH`, a node spacing of ``1/G`` is ``σ / 16``.
GRID_SIZE = 1 << 14

#: The narrowest bandwidth: the floor of the automatic search (``relplot``'s ``eps``) and the
#: smallest fixed ``bandwidth`` accepted.
MIN_BANDWIDTH = 1e-3

#: Halvings of [0, 1] in the search for ``σ*`` (as ``relplot``): ``σ*`` to within ``2**-10``.
BISECTION_STEPS = 10

#: Fewest points on which the integrals are evaluated (``relplot.config.smECE_mesh_pts``);
#: ``round(10 / σ)`` when that is more.
MIN_MESH_POINTS = 200

#: The Gaussian is cut off at this distance (in confidence), as in ``relplot``.
KERNEL_RADIUS = 0.5


class SmoothReliabilityCurve(NamedTuple):
    """The smoothed reliability diagram on an equally spaced mesh of [0, 1] (float64 arrays).

    Attributes:
        mesh: ``T`` points ``t`` from 0 to 1.
        accuracy: kernel-smoothed correctness ``sum_i K(t, f_i) y_i / sum_i K(t, f_i)``; NaN
            where the density is negligible (below ``1e-9`` of its maximum).
        residual: kernel-smoothed residual ``r(t)`` (confidence minus correctness), NaN likewise.
        density: kernel density ``δ(t)`` of the confidences (integrates to about 1).
        value: the smECE at ``bandwidth``.
        bandwidth: the ``σ`` used.
    """

    mesh: np.ndarray
    accuracy: np.ndarray
    residual: np.ndarray
    density: np.ndarray
    value: float
    bandwidth: float


# --- arguments -------------------------------------------------------------------------------


#: ``bandwidth``: ``None`` (automatic) or a finite real ``>=`` :data:`MIN_BANDWIDTH` (the grid
#: resolves no narrower kernel), as a float; the checks module's check with this range.
check_bandwidth: Callable[[object], float | None] = partial(
    check_real, "bandwidth", low=MIN_BANDWIDTH, optional=True
)


def _grid_arrays(mass: Any, residual: Any) -> tuple[np.ndarray, np.ndarray]:
    """``mass`` and ``residual`` as checked float64 NumPy arrays of one length ``G + 1``."""
    arrays = []
    for name, x in (("mass", mass), ("residual", residual)):
        if isinstance(x, Tensor):
            x = x.detach().to("cpu", torch.float64).numpy()
        try:
            array = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{name} must be a 1-D tensor or array of floats") from error
        if array.ndim != 1 or array.shape[0] < 3:
            raise ValueError(
                f"{name} must be 1-D with G + 1 >= 3 values (one per grid node); got shape "
                f"{list(array.shape)}"
            )
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{name} must hold finite values")
        arrays.append(array)
    mass, residual = arrays
    if mass.shape != residual.shape:
        raise ValueError(
            f"mass and residual must have the same length (G + 1); got {mass.shape[0]} and "
            f"{residual.shape[0]}"
        )
    if np.any(mass < 0):
        raise ValueError("mass must be non-negative at every node")
    if np.any(np.abs(residual) > mass * (1 + 1e-9) + 1e-12):
        raise ValueError(
            "residual must satisfy |residual| <= mass at every node (each sample's residual, "
            "confidence minus correctness, lies in [-1, 1])"
        )
    return mass, residual


# --- the grid --------------------------------------------------------------------------------


def smooth_grid_statistics(
    confidence: Tensor, correct: Tensor, grid_size: int = GRID_SIZE
) -> tuple[Tensor, Tensor]:
    """Split each sample's mass and residual linearly onto a grid: ``(mass, residual)``.

    A confidence ``c`` between nodes ``k/G`` and ``(k+1)/G`` puts ``1 - w`` of its mass on
    node ``k`` and ``w = c·G - k`` on node ``k + 1``, and its residual ``c - correct`` in the
    same proportions. Both arrays are float64 ``[G + 1]`` on the device of ``confidence``; sums
    of them over batches or processes are the statistics of all the data. Confidences outside
    [0, 1] (possible with ``validate_args=False``) are placed at the nearest end.

    Args:
        confidence: 1-D confidences in [0, 1] (any floating dtype).
        correct: 1-D correctness (0/1, or a frequency), same length.
        grid_size: ``G``, the number of intervals (:data:`GRID_SIZE` by default).

    Example:
        >>> mass, residual = smooth_grid_statistics(
        ...     torch.tensor([0.0, 0.375, 1.0]), torch.tensor([0.0, 1.0, 1.0]), grid_size=4
        ... )
        >>> mass
        tensor([1.0000, 0.5000, 0.5000, 0.0000, 1.0000], dtype=torch.float64)
        >>> residual
        tensor([ 0.0000, -0.3125, -0.3125,  0.0000,  0.0000], dtype=torch.float64)
    """
    grid_size = check_int("grid_size", grid_size, low=2)
    if not isinstance(confidence, Tensor) or not confidence.is_floating_point():
        raise TypeError("confidence must be a floating-point tensor of values in [0, 1]")
    if not isinstance(correct, Tensor):
        raise TypeError(f"correct must be a torch.Tensor; got {type(correct).__name__}")
    confidence = confidence.detach().reshape(-1).to(torch.float64)
    correct = correct.detach().reshape(-1).to(confidence.device, torch.float64)
    if confidence.shape != correct.shape:
        raise ValueError(
            f"confidence and correct must have the same length; got {confidence.numel()} and "
            f"{correct.numel()}"
        )
    # Node k gets sum (1 - w) over the samples whose lower node is k, node k + 1 gets sum w;
    # the first is count_k - sum w: four O(N) passes and three O(G) sums make both arrays.
    position = (confidence * grid_size).clamp_(0, grid_size).nan_to_num_(nan=0.0)
    lower = position.floor().clamp_(max=grid_size - 1)
    weight = position.sub_(lower)
    index = lower.long()
    gap = confidence - correct

    def zeros(size: int) -> Tensor:
        return torch.zeros(size, dtype=torch.float64, device=confidence.device)

    count = torch.bincount(index, minlength=grid_size).to(torch.float64)
    upper_mass = zeros(grid_size).index_add_(0, index, weight)
    gap_sum = zeros(grid_size).index_add_(0, index, gap)
    upper_gap = zeros(grid_size).index_add_(0, index, weight.mul_(gap))
    mass = zeros(grid_size + 1)
    residual = zeros(grid_size + 1)
    mass[:-1] = count - upper_mass
    mass[1:] += upper_mass
    residual[:-1] = gap_sum - upper_gap
    residual[1:] += upper_gap
    return mass, residual


# --- kernel smoothing on the grid ------------------------------------------------------------


class _Smoother:
    """The reflected Gaussian smoothing of grid arrays, at any bandwidth, by FFT.

    The ``G + 1`` node values are extended to a sequence of period ``2G``, mirrored about the
    end nodes (which are not repeated), so that a circular convolution with the Gaussian is the
    smoothing with every reflection of it. Before that, the mass within ``relplot``'s first
    node spacing ``1/(M-1)`` of each end is moved as ``relplot`` moves it (see
    :meth:`_fold_ends`).
    """

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = np.stack(arrays)
        self.nodes = self.arrays.shape[1]
        self.grid_size = self.nodes - 1
        period = 2 * self.grid_size
        steps = np.arange(period)
        self.distance = np.minimum(steps, period - steps) / self.grid_size
        self.positions = np.linspace(0.0, 1.0, self.nodes)

    def _fold_ends(self, bandwidth: float) -> np.ndarray:
        """The arrays with the mass near each end split as on ``relplot``'s coarser grid.

        ``relplot`` rounds the samples onto ``M = max(2000, round(20/σ)) // 2 + 1`` nodes with
        spacing ``s = 1/(M-1)`` (about ``σ/10``, at most 0.001): a confidence ``x < s`` puts
        ``1 - x/s`` of its mass on the end node, which has one image in the reflection, and
        ``x/s`` on the node at ``s``, which has two. Node ``k`` of the fine grid at ``x_k < s``
        is split the same way (linear in ``x``, so exactly as its samples would be), the rest
        of the grid stays: everywhere else the two roundings agree to second order.
        """
        coarse = max(2000, round(20.0 / bandwidth)) // 2 + 1
        spacing = 1.0 / (coarse - 1)
        near = math.ceil(spacing * self.grid_size) - 1  # fine nodes 1..near lie inside
        if near < 1:
            return self.arrays
        arrays = self.arrays.copy()
        target = spacing * self.grid_size
        below = math.floor(target)
        upper = target - below
        share = self.positions[1 : near + 1] / spacing
        for inner, end, step in ((slice(1, near + 1), 0, 1), (slice(-2, -near - 2, -1), -1, -1)):
            moved = arrays[:, inner].copy()
            arrays[:, inner] = 0.0
            arrays[:, end] += moved @ (1.0 - share)
            outward = moved @ share
            arrays[:, end + step * below] += (1.0 - upper) * outward
            arrays[:, end + step * (below + 1)] += upper * outward
        return arrays

    def smooth(self, bandwidth: float) -> np.ndarray:
        """``sum_j K(x_k, x_j) a_j`` at every node ``x_k``, one row per array (``[A, G + 1]``)."""
        arrays = self._fold_ends(bandwidth)
        extended = np.concatenate([arrays, arrays[:, -2:0:-1]], axis=1)
        kernel = np.exp(-0.5 * (self.distance / bandwidth) ** 2) / (
            math.sqrt(2 * math.pi) * bandwidth
        )
        kernel[self.distance > KERNEL_RADIUS + 1e-12] = 0.0
        spectra = np.fft.rfft(extended, axis=-1) * np.fft.rfft(kernel)
        return np.fft.irfft(spectra, n=2 * self.grid_size)[:, : self.nodes]

    def on_mesh(self, bandwidth: float) -> tuple[np.ndarray, np.ndarray]:
        """The mesh of ``T = max(200, round(10/σ))`` points and the smoothed rows on it."""
        points = max(MIN_MESH_POINTS, round(10.0 / bandwidth))
        mesh = np.linspace(0.0, 1.0, points)
        rows = self.smooth(bandwidth)
        return mesh, np.stack([np.interp(mesh, self.positions, row) for row in rows])


def _value(smoother: _Smoother, bandwidth: float) -> float:
    """``smECE_σ``: mean of ``|R|`` over the mean of ``D`` on the mesh (rows: ``D``, ``R``)."""
    rows = smoother.on_mesh(bandwidth)[1]
    return float(np.abs(rows[1]).sum() / rows[0].sum())


def _search(smoother: _Smoother) -> float:
    """``σ*`` by bisection: the upper end of the last bracket with ``smECE_σ <= σ`` there."""
    low, high = 0.0, 1.0
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        if middle < MIN_BANDWIDTH or middle < _value(smoother, middle):
            low = middle
        else:
            high = middle
    return high


def _from_arrays(
    mass: np.ndarray, residual: np.ndarray, bandwidth: float | None
) -> tuple[float, float]:
    """``(smECE_σ, σ)`` with ``σ`` the given bandwidth or ``σ*``; NaN for an empty grid."""
    if not mass.sum() > 0:
        return math.nan, math.nan if bandwidth is None else bandwidth
    smoother = _Smoother([mass, residual])
    sigma = _search(smoother) if bandwidth is None else bandwidth
    return _value(smoother, sigma), sigma


@overload
def smooth_calibration_error_from_grid(
    mass: Any,
    residual: Any,
    *,
    bandwidth: float | None = None,
    return_bandwidth: Literal[False] = False,
) -> Tensor: ...


@overload
def smooth_calibration_error_from_grid(
    mass: Any, residual: Any, *, bandwidth: float | None = None, return_bandwidth: Literal[True]
) -> tuple[Tensor, Tensor]: ...


@overload
def smooth_calibration_error_from_grid(
    mass: Any, residual: Any, *, bandwidth: float | None = None, return_bandwidth: bool
) -> Tensor | tuple[Tensor, Tensor]: ...


def smooth_calibration_error_from_grid(
    mass: Any,
    residual: Any,
    *,
    bandwidth: float | None = None,
    return_bandwidth: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The smECE from the grid statistics alone (see the module doc for the definition).

    Args:
        mass: float64 ``[G + 1]`` sample mass per grid node, from
            :func:`smooth_grid_statistics` or the state of
            :class:`~lightning_losses.calibration.metrics.SmoothCalibrationError`.
        residual: float64 ``[G + 1]`` residual (confidence minus correctness) per node.
        bandwidth: ``None`` for the automatic ``σ*`` (``smECE_σ* = σ*``), or a fixed ``σ >=``
            :data:`MIN_BANDWIDTH`.
        return_bandwidth: also return the bandwidth used.

    Returns:
        A float64 scalar tensor (on the device of ``mass`` if it is a tensor), NaN for an
        empty grid; with ``return_bandwidth``, ``(smECE, σ)``, both float64 scalars.

    Raises:
        ValueError: arrays of two lengths, not 1-D, with non-finite values, negative mass or
            ``|residual| > mass``; a bandwidth below :data:`MIN_BANDWIDTH` or not finite.
        TypeError: a bandwidth that is not a real number.

    Example:
        >>> mass, residual = smooth_grid_statistics(
        ...     torch.tensor([0.9, 0.8, 0.7, 0.6]), torch.tensor([1.0, 0.0, 1.0, 0.0])
        ... )
        >>> value, sigma = smooth_calibration_error_from_grid(
        ...     mass, residual, return_bandwidth=True
        ... )
        >>> round(value.item(), 4), sigma.item()
        (0.2498, 0.25)
    """
    sigma = check_bandwidth(bandwidth)
    check_flag("return_bandwidth", return_bandwidth)
    device = mass.device if isinstance(mass, Tensor) else torch.device("cpu")
    value, used = _from_arrays(*_grid_arrays(mass, residual), sigma)
    result = torch.tensor(value, dtype=torch.float64, device=device)
    if return_bandwidth:
        return result, torch.tensor(used, dtype=torch.float64, device=device)
    return result


def smooth_reliability_curve(
    mass: Any, residual: Any, *, bandwidth: float | None = None
) -> SmoothReliabilityCurve:
    """The kernel-smoothed reliability diagram from the grid statistics.

    On the mesh of ``T = max(200, round(10/σ))`` points of [0, 1] (the one the smECE is
    evaluated on): the smoothed accuracy ``sum_i K(t, f_i) y_i / sum_i K(t, f_i)``, the
    smoothed residual, and the density ``δ(t)`` of the confidences, with the smECE and ``σ``.
    The accuracy uses ``sum_i K(t, f_i) f_i``, from the grid's first moment ``sum_k m_k x_k``,
    which the linear split keeps exact.

    Args:
        mass: float64 ``[G + 1]`` mass per grid node.
        residual: float64 ``[G + 1]`` residual per grid node.
        bandwidth: ``None`` for ``σ*`` (as :func:`smooth_calibration_error_from_grid`) or a
            fixed ``σ``.

    Raises:
        ValueError: as :func:`smooth_calibration_error_from_grid`, and for an empty grid.

    Example:
        >>> mass, residual = smooth_grid_statistics(
        ...     torch.tensor([0.9, 0.8, 0.7, 0.6]), torch.tensor([1.0, 0.0, 1.0, 0.0])
        ... )
        >>> curve = smooth_reliability_curve(mass, residual, bandwidth=0.1)
        >>> curve.mesh.shape, round(curve.value, 4), curve.bandwidth
        ((200,), 0.2493, 0.1)
    """
    sigma = check_bandwidth(bandwidth)
    mass, residual = _grid_arrays(mass, residual)
    total = mass.sum()
    if not total > 0:
        raise ValueError("the grid is empty (no mass): there is no curve to draw")
    smoother = _Smoother([mass, residual, mass * np.linspace(0.0, 1.0, mass.shape[0])])
    sigma = _search(smoother) if sigma is None else sigma
    mesh, (density, smoothed_residual, first_moment) = smoother.on_mesh(sigma)
    value = float(np.abs(smoothed_residual).sum() / density.sum())
    supported = density > 1e-9 * density.max()
    safe = np.where(supported, density, 1.0)
    accuracy = np.where(supported, (first_moment - smoothed_residual) / safe, np.nan)
    r_hat = np.where(supported, smoothed_residual / safe, np.nan)
    return SmoothReliabilityCurve(mesh, accuracy, r_hat, density / total, value, sigma)


# --- functional and metric -------------------------------------------------------------------


def smooth_calibration_error(
    preds: Tensor,
    target: Tensor,
    *,
    bandwidth: float | None = None,
    input_format: InputFormat = "probs",
    task: Task | None = None,
    validate_args: bool = True,
    ignore_index: int | None = None,
    return_bandwidth: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Smooth ECE (smECE) of Błasiok and Nakkiran, with the automatic bandwidth by default.

    ``smECE_σ = ∫ |r_σ(t)| δ_σ(t) dt / ∫ δ_σ(t) dt``: the kernel-smoothed residual ``r_σ``
    (confidence minus correctness) weighted by the kernel density ``δ_σ`` of the confidences,
    with the reflected Gaussian kernel of bandwidth ``σ``; the smECE takes ``σ = σ*``, the
    fixed point ``smECE_σ* = σ*`` (see the module doc). Confidence and correctness are those of
    :func:`~lightning_losses.calibration.functional.confidence_and_correct` (multiclass: top
    label; binary: positive class; multi-label: pooled labels). Source: Błasiok and Nakkiran,
    "Smooth ECE: Principled Reliability Diagrams via Kernel Smoothing", ICLR 2024; it agrees
    with their ``relplot.smECE`` to about 1e-4.

    Args:
        preds: ``[N, C]`` or dense ``[N, C, *]`` (multiclass), ``[N]`` (binary) or ``[N, K]``
            (multi-label) floats.
        target: ``[N]`` (dense: ``[N, *]``) class indices, or labels in {0, 1} of the shape of
            ``preds``.
        bandwidth: ``None`` for ``σ*``, or a fixed ``σ >= 0.001`` (``relplot.smECE_sigma``).
        input_format: ``"probs"`` or ``"logits"``.
        task: ``None`` (inferred from shapes), ``"multiclass"``, ``"binary"``, ``"multilabel"``.
        validate_args: check target values, probabilities in [0, 1] (multiclass rows summing
            to 1) and finite logits.
        ignore_index: target value whose samples (multi-label: decisions) are left out, as in
            :mod:`lightning_losses.calibration.functional`; ``None`` keeps every sample.
        return_bandwidth: also return ``σ``.

    Returns:
        A float64 scalar tensor (NaN for no samples); with ``return_bandwidth``,
        ``(smECE, σ)``.

    Example:
        >>> preds = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.6, 0.4]])
        >>> target = torch.tensor([0, 0, 1, 1])
        >>> value, sigma = smooth_calibration_error(preds, target, return_bandwidth=True)
        >>> round(value.item(), 4), sigma.item()
        (0.2498, 0.25)
        >>> round(smooth_calibration_error(preds, target, bandwidth=0.1).item(), 4)
        0.2493
    """
    sigma = check_bandwidth(bandwidth)
    check_flag("return_bandwidth", return_bandwidth)
    confidence, correct = CF.confidence_and_correct(
        preds,
        target,
        input_format=input_format,
        task=task,
        validate_args=validate_args,
        ignore_index=ignore_index,
    )
    mass, residual = smooth_grid_statistics(confidence, correct)
    return smooth_calibration_error_from_grid(
        mass, residual, bandwidth=sigma, return_bandwidth=return_bandwidth
    )
