"""Poisson bootstrap replicates that depend only on (seed, sample position).

They give the same interval over any batching and any number of processes, from a state whose
size does not grow with N.

Source of the method: the Poisson bootstrap with replicate weights generated from a hash of
each unit's identifier, as in Chamandy, Muralidharan, Najmi and Naidu, "Estimating Uncertainty
for Massive Data Streams" (Google, 2012): each replicate gives every unit an independent
Poisson(1) weight instead of drawing ``N`` units with replacement, so replicates can be built
in one pass, in any order, on any number of machines.

Here a unit is a **group** of samples. Every decision (a sample; a label of a multi-label
sample; a position of a dense ``[N, C, *]`` sample) is hashed from ``(seed, position, offset)``
into one of ``n_groups`` groups (``position``: the sample's index in the data set, ``offset``:
the flat offset of the decision within its sample, 0 for ``[N]`` targets). Replicate ``r``
gives group ``m`` the weight ``w_rm ~ Poisson(1)``, a function of ``(seed, r, m)``. So every
sample's weight in every replicate is Poisson(1) and a deterministic function of ``(seed,
position)``; samples of one group share it. The state is the per-group sums (``[n_groups,
n_bins, 3]`` for the binned ECE), summed across batches and processes like every other state;
the replicates are ``W @ sums`` at ``compute``. With more groups than samples this is the
per-sample Poisson bootstrap; with fewer, the groups are random subsets of iid samples and
their sums are iid, so resampling them is the bootstrap of ``n_groups`` iid units (a
random-groups bootstrap): the replicate spread carries about ``n_groups`` degrees of freedom.

The hash works on 32-bit words held in int64 tensors, with multipliers below ``2**31`` so that
no product overflows (``mix32``: ``x ^= x >> 16; x = x * 0x21F0AAAD mod 2**32; x ^= x >> 15;
x = x * 0x735A2D97 mod 2**32; x ^= x >> 15``, a multiply-xorshift of Wellons' hash-prospector
family). For a seed ``s``: ``k = mix32(mix32(D ^ lo(s)) ^ hi(s))`` with a domain constant ``D``
(:data:`GROUP_DOMAIN` for groups, :data:`WEIGHT_DOMAIN` for weights); a decision's group is
``(h * n_groups) >> 32`` with ``h = mix32(mix32(mix32(k ^ lo(p)) ^ hi(p)) ^ lo(o))`` for
position ``p`` and offset ``o``; replicate ``r``'s weight of group ``m`` is the number of
thresholds ``floor(2**32 F(j))`` (``F`` the Poisson(1) CDF, ``j = 0, 1, ...``) at or below
``mix32(mix32(k ^ r) ^ m)``: Poisson(1) to within ``2**-32`` per value.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_losses.calibration import functional as CF
from lightning_losses.functional.checks import check_fraction, check_int

__all__ = [
    "DEFAULT_N_BOOTSTRAP",
    "DEFAULT_N_GROUPS",
    "GROUP_DOMAIN",
    "REPLICATE_GRID_SIZE",
    "WEIGHT_DOMAIN",
    "check_level",
    "ece_interval",
    "group_ids",
    "mean_interval",
    "mix32",
    "replicate_weights",
    "smooth_interval",
]

MASK32 = 0xFFFFFFFF
_MULTIPLIERS = (0x21F0AAAD, 0x735A2D97)
#: Domain constants: the group hash and the weight hash of one seed are unrelated.
GROUP_DOMAIN = 0x9E3779B9
WEIGHT_DOMAIN = 0x85EBCA77
#: Default number of replicates.
DEFAULT_N_BOOTSTRAP = 200
#: Default number of groups (the bootstrap's units).
DEFAULT_N_GROUPS = 1024
#: Intervals of the smooth ECE's replicate grid (its per-group state is ``[n_groups, G + 1, 2]``).
REPLICATE_GRID_SIZE = 256
#: Poisson(1) CDF thresholds in units of ``2**-32``: weight = number of thresholds <= hash.
_POISSON_THRESHOLDS = [
    math.floor(sum(math.exp(-1.0) / math.factorial(i) for i in range(j + 1)) * 2**32)
    for j in range(16)
]


# --- arguments -------------------------------------------------------------------------------


#: The bootstrap's arguments, each the checks module's check with its name and range: the
#: confidence level of an interval (a fraction, e.g. 0.95), the number of replicates (>= 2),
#: of groups (the bootstrap's units: at least 2, and group ids fit the hash's 32 bits) and the
#: seed (a non-negative int64).
check_level = partial(check_fraction, "level", example="0.95")
check_n_bootstrap = partial(check_int, "n_bootstrap", low=2)
check_n_groups = partial(check_int, "n_groups", low=2, high=2**31)
check_seed = partial(check_int, "seed", low=0, high=2**63 - 1)


# --- hashing ---------------------------------------------------------------------------------


def mix32(x: Tensor) -> Tensor:
    """The 32-bit mixer on an int64 tensor of values in ``[0, 2**32)`` (see the module doc).

    Example:
        >>> mix32(torch.tensor([0, 1, 2]))
        tensor([         0, 2261973619,  229111015])
    """
    x = x ^ (x >> 16)
    x = (x * _MULTIPLIERS[0]) & MASK32
    x = x ^ (x >> 15)
    x = (x * _MULTIPLIERS[1]) & MASK32
    return x ^ (x >> 15)


def _mix32_int(x: int) -> int:
    """:func:`mix32` of one Python int."""
    x ^= x >> 16
    x = (x * _MULTIPLIERS[0]) & MASK32
    x ^= x >> 15
    x = (x * _MULTIPLIERS[1]) & MASK32
    return x ^ (x >> 15)


def _seed_key(seed: int, domain: int) -> int:
    return _mix32_int(_mix32_int(domain ^ (seed & MASK32)) ^ (seed >> 32))


def group_ids(positions: Tensor, offsets: Tensor | None, *, seed: int, n_groups: int) -> Tensor:
    """The group (int64 in ``[0, n_groups)``) of each decision from its position and offset.

    Args:
        positions: int64 sample positions (``>= 0``), one per decision.
        offsets: int64 offsets within the sample (``< 2**32``), or ``None`` for all 0.
        seed: the bootstrap's seed.
        n_groups: number of groups.

    Example:
        >>> group_ids(torch.arange(6), None, seed=0, n_groups=4)
        tensor([3, 2, 3, 0, 3, 2])
    """
    h = mix32(positions.to(torch.int64).bitwise_and(MASK32) ^ _seed_key(seed, GROUP_DOMAIN))
    h = mix32(h ^ (positions.to(torch.int64) >> 32))
    h = mix32(h if offsets is None else h ^ offsets.to(torch.int64).bitwise_and(MASK32))
    return (h * n_groups) >> 32


def replicate_weights(
    *, seed: int, n_bootstrap: int, n_groups: int, device: torch.device | str | None = None
) -> Tensor:
    """Poisson(1) weights ``[n_bootstrap, n_groups]`` (float64), a function of (seed, r, m).

    Example:
        >>> w = replicate_weights(seed=0, n_bootstrap=400, n_groups=1000)
        >>> round(w.mean().item(), 2), round(w.var().item(), 2)
        (1.0, 1.0)
    """
    key = _seed_key(seed, WEIGHT_DOMAIN)
    r = torch.arange(n_bootstrap, dtype=torch.int64, device=device)
    m = torch.arange(n_groups, dtype=torch.int64, device=device)
    h = mix32(mix32(r ^ key)[:, None] ^ m[None, :])
    thresholds = torch.tensor(_POISSON_THRESHOLDS, dtype=torch.int64, device=device)
    return torch.bucketize(h, thresholds, right=True).to(torch.float64)


# --- states in a Metric ----------------------------------------------------------------------


def add_states(
    metric: Any, *, n_bins: int, n_groups: int, scores: bool = False, smooth: bool = False
) -> None:
    """Register the per-group states on a torchmetrics ``Metric`` (all ``dist_reduce_fx="sum"``).

    ``boot_bins`` ``[n_groups, n_bins, 3]`` (count, confidence sum, correct sum per group and
    bin), ``boot_seen`` (rows seen by this process, for default positions); with ``scores``
    ``boot_scores`` ``[n_groups, 3]`` (Brier, NLL and top-label-correct sums); with ``smooth``
    ``boot_grid`` ``[n_groups, REPLICATE_GRID_SIZE + 1, 2]`` (the smooth ECE's mass and residual
    on a coarse grid). A registered counter survives ``forward``, which restores every state.
    """
    zeros = torch.zeros(n_groups, n_bins, 3, dtype=torch.float64)
    metric.add_state("boot_bins", default=zeros, dist_reduce_fx="sum")
    metric.add_state("boot_seen", default=torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
    if scores:
        zeros = torch.zeros(n_groups, 3, dtype=torch.float64)
        metric.add_state("boot_scores", default=zeros, dist_reduce_fx="sum")
    if smooth:
        zeros = torch.zeros(n_groups, REPLICATE_GRID_SIZE + 1, 2, dtype=torch.float64)
        metric.add_state("boot_grid", default=zeros, dist_reduce_fx="sum")


def _process_rank(metric: Any) -> tuple[int, int]:
    """``(rank, world_size)`` of this process in the metric's process group; ``(0, 1)`` alone."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    group = getattr(metric, "process_group", None)
    return dist.get_rank(group), dist.get_world_size(group)


def decision_groups(
    metric: Any,
    target: Tensor,
    index: Tensor | None,
    ignore_index: int | None,
    *,
    seed: int,
    n_groups: int,
) -> Tensor:
    """The group of every kept decision of a batch, in the order the metrics flatten them.

    Decisions are laid out as ``target`` (``[N]``, ``[N, K]`` or dense ``[N, *]``), row-major,
    ignored entries dropped. Row ``i`` has position ``index[i]``, or by default ``rank +
    world_size * (rows seen before + i)``: the order in which
    :class:`~lightning_losses.data.samplers.UnpaddedDistributedSampler` (and torch's
    ``DistributedSampler`` without shuffling) deals a data set to the processes, so the default
    is the dataset position whenever each row is one sample in loader order. Advances
    ``metric.boot_seen`` by ``N``.
    """
    rows = target.shape[0] if target.dim() else 1
    if index is None:
        rank, world = _process_rank(metric)
        local = torch.arange(rows, dtype=torch.int64, device=target.device) + metric.boot_seen
        positions = local * world + rank
    else:
        positions = _checked_index(index, rows, target.device)
    metric.boot_seen.add_(rows)
    per_row = target[0].numel() if target.dim() > 1 and rows else 1
    offsets = None
    if per_row > 1:
        offsets = torch.arange(per_row, dtype=torch.int64, device=target.device)
        offsets = offsets.expand(rows, per_row).reshape(target.shape)
        positions = positions.reshape((rows,) + (1,) * (target.dim() - 1)).expand(target.shape)
    if ignore_index is not None:
        keep = target != ignore_index
        positions = (
            positions[keep] if positions.shape == keep.shape else positions[keep.reshape(-1)]
        )
        offsets = None if offsets is None else offsets[keep]
    return group_ids(
        positions.reshape(-1),
        None if offsets is None else offsets.reshape(-1),
        seed=seed,
        n_groups=n_groups,
    )


def _checked_index(index: Tensor, rows: int, device: torch.device) -> Tensor:
    if not isinstance(index, Tensor) or index.is_floating_point() or index.is_complex():
        raise TypeError(
            "index must be an integer tensor [N] of the samples' positions in the data set; "
            f"got {type(index).__name__ if not isinstance(index, Tensor) else index.dtype}"
        )
    if index.dtype == torch.bool or index.shape != (rows,):
        raise ValueError(
            f"index must be an integer tensor of shape [N] = [{rows}] (one position per "
            f"sample, the first dimension of target); got {list(index.shape)} {index.dtype}"
        )
    index = index.to(device=device, dtype=torch.int64)
    if rows and int(index.min()) < 0:
        raise ValueError(f"index must hold positions >= 0; found {int(index.min())}")
    return index


def add_batch(
    metric: Any,
    groups: Tensor,
    confidence: Tensor,
    correct: Tensor,
    *,
    n_bins: int,
    scores: Tensor | None = None,
) -> None:
    """Add a batch's decisions (their groups, confidences, correctness) to the group states.

    ``scores`` (``[n, 3]``: Brier, NLL, top-label correct per decision) goes to ``boot_scores``;
    a metric with ``boot_grid`` also gets the coarse smooth-ECE grid.
    """
    confidence = confidence.reshape(-1)
    correct = correct.reshape(-1).to(torch.float64)
    conf64 = confidence.to(torch.float64)
    slot = groups * n_bins + CF._bin_index(confidence, n_bins)
    rows = torch.stack([torch.ones_like(conf64), conf64, correct], dim=1)
    metric.boot_bins.view(-1, 3).index_add_(0, slot, rows)
    if scores is not None:
        metric.boot_scores.index_add_(0, groups, scores.to(torch.float64))
    if hasattr(metric, "boot_grid"):
        size = REPLICATE_GRID_SIZE
        position = (conf64 * size).clamp(0, size).nan_to_num(nan=0.0)
        lower = position.floor().clamp(max=size - 1)
        upper_share = position - lower
        gap = conf64 - correct
        node = groups * (size + 1) + lower.long()
        grid = metric.boot_grid.view(-1, 2)
        lower_share = 1 - upper_share
        grid.index_add_(0, node, torch.stack([lower_share, gap * lower_share], dim=1))
        grid.index_add_(0, node + 1, torch.stack([upper_share, gap * upper_share], dim=1))


# --- intervals -------------------------------------------------------------------------------


def _quantile(values: Tensor, q: float) -> Tensor:
    """``nanquantile`` with linear interpolation; NaN when no replicate is finite."""
    return torch.nanquantile(values, q)


def _per_bin(count: Tensor, total: Tensor, gap_sum: Tensor) -> tuple[Tensor, Tensor]:
    """Bin shares ``n_k / N`` and gaps ``(conf_sum - correct_sum) / n_k`` (0 when empty)."""
    safe = torch.where(count > 0, count, torch.ones_like(count))
    return count / total.unsqueeze(-1), gap_sum / safe


def ece_interval(
    bins: tuple[Tensor, Tensor, Tensor], replicates: Tensor, level: float
) -> tuple[Tensor, Tensor]:
    """Interval of the binned (l1) ECE from the data's bins and replicate bins ``[R, B, 3]``.

    With ``p_k = n_k / N`` and gaps ``g_k = conf_k - acc_k`` of the data, ``p*_k`` and ``g*_k``
    of a replicate, ``ECE = sum_k p_k |g_k|``, ``ECE* = sum_k p*_k |g*_k|`` and ``a = (1 -
    level) / 2``:

    - low end ``max(0, ECE - q_{1-a}(sum_k p*_k |g*_k - g_k|))``: the basic bootstrap of a
      world in which every bin is calibrated (``g_k = 0``), where the upward bias of the
      plug-in ``|g_k|`` is largest;
    - high end ``ECE + mean(ECE*) - q_a(ECE*)``: the replicates' spread below their mean, with
      no bias correction (the plug-in's bias is never negative in expectation, so this errs
      on the safe side).

    ``|g|`` is not differentiable at 0, so no bootstrap world centred on the data's own gaps
    reproduces the bias of bins whose true gap is near 0; the two ends take the largest and
    the smallest bias instead. Replicates with no sample are left out of the quantiles.
    """
    count, conf_sum, correct_sum = (b.to(torch.float64) for b in bins)
    total = count.sum()
    estimate = (conf_sum - correct_sum).abs().sum() / total
    gap = _per_bin(count, total, conf_sum - correct_sum)[1]
    r_count, r_conf, r_correct = replicates.unbind(-1)
    r_total = r_count.sum(-1)
    r_p, r_gap = _per_bin(r_count, r_total, r_conf - r_correct)
    finite = r_total > 0
    r_ece = torch.where(finite, (r_p * r_gap.abs()).sum(-1), torch.nan)
    zero_world = torch.where(finite, (r_p * (r_gap - gap).abs()).sum(-1), torch.nan)
    alpha = (1.0 - level) / 2
    low = (estimate - _quantile(zero_world, 1 - alpha)).clamp(min=0)
    spread = r_ece[finite].mean() - _quantile(r_ece, alpha) if bool(finite.any()) else r_ece[0]
    return low, torch.maximum(estimate + spread, low)


def mean_interval(numerators: Tensor, denominators: Tensor, level: float) -> tuple[Tensor, Tensor]:
    """Percentile interval of a mean from replicate sums ``[R]`` and counts ``[R]``."""
    values = numerators / denominators
    values = torch.where(denominators > 0, values, torch.nan)
    alpha = (1.0 - level) / 2
    return _quantile(values, alpha), _quantile(values, 1 - alpha)


class _ReplicateSmoother:
    """smECE at given bandwidths for rows of ``[R, G + 1]`` mass / residual grids, vectorised.

    The computation of :mod:`lightning_losses.calibration.smooth` (reflected Gaussian by FFT,
    cut at :data:`~lightning_losses.calibration.smooth.KERNEL_RADIUS`; means over ``T =
    max(200, round(10/σ))`` mesh points), each row at its own ``σ``. On a grid of at most
    1,000 intervals ``relplot``'s end correction moves nothing (its node spacing of at most
    0.001 is below one interval), so none is applied.
    """

    def __init__(self, mass: np.ndarray, residual: np.ndarray) -> None:
        self.size = mass.shape[1] - 1
        period = 2 * self.size
        steps = np.arange(period)
        self.period = period
        self.distance = np.minimum(steps, period - steps) / self.size
        arrays = np.stack([mass, residual], axis=1)  # [R, 2, G + 1]
        mirrored = np.concatenate([arrays, arrays[..., -2:0:-1]], axis=-1)
        self.spectra = np.fft.rfft(mirrored, axis=-1)

    def values(self, sigma: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The smECE of ``rows`` (indices) at bandwidths ``sigma`` (one per row)."""
        from lightning_losses.calibration.smooth import KERNEL_RADIUS, MIN_MESH_POINTS

        count, nodes = len(rows), self.size + 1
        kernel = np.exp(-0.5 * (self.distance / sigma[:, None]) ** 2) / (
            math.sqrt(2 * math.pi) * sigma[:, None]
        )
        kernel[:, self.distance > KERNEL_RADIUS + 1e-12] = 0.0
        product = self.spectra[rows] * np.fft.rfft(kernel)[:, None, :]
        smoothed = np.fft.irfft(product, n=self.period)[..., :nodes]
        points = np.maximum(MIN_MESH_POINTS, np.round(10.0 / sigma)).astype(np.int64)
        most = int(points.max())
        j = np.arange(most)
        used = j[None, :] < points[:, None]
        where = np.minimum(j[None, :] / (points[:, None] - 1), 1.0) * self.size
        left = np.minimum(np.floor(where), self.size - 1).astype(np.int64)
        share = where - left
        shape = (count, 2, most)
        picked = np.take_along_axis(smoothed, np.broadcast_to(left[:, None], shape), -1)
        after = np.take_along_axis(smoothed, np.broadcast_to(left[:, None] + 1, shape), -1)
        on_mesh = np.where(used[:, None], picked + share[:, None] * (after - picked), 0.0)
        return np.abs(on_mesh[:, 1]).sum(-1) / on_mesh[:, 0].sum(-1)

    def goes_up(self, sigma: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The bisection's test ``σ < smECE_σ`` (true below the floor) and ``smECE_σ``."""
        from lightning_losses.calibration.smooth import MIN_BANDWIDTH

        value = self.values(np.maximum(sigma, MIN_BANDWIDTH), rows)
        return (sigma < MIN_BANDWIDTH) | (sigma < value), value

    def bisect(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(σ*, smECE_σ*)`` by ``relplot``'s ten halvings of [0, 1] (``σ*`` their upper end)."""
        from lightning_losses.calibration.smooth import BISECTION_STEPS

        low, high = np.zeros(len(rows)), np.ones(len(rows))
        for _ in range(BISECTION_STEPS):
            middle = (low + high) / 2
            up = self.goes_up(middle, rows)[0]
            low, high = np.where(up, middle, low), np.where(up, high, middle)
        return high, self.values(high, rows)


def _smooth_values_by_bisection(mass: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """The smECE at the automatic bandwidth of each row by ten halvings (the reference)."""
    smoother = _ReplicateSmoother(mass, residual)
    result = smoother.bisect(np.arange(mass.shape[0]))[1]
    return np.where(mass.sum(-1) > 0, result, np.nan)


def _smooth_values(mass: np.ndarray, residual: np.ndarray, *, attempts: int = 4) -> np.ndarray:
    """The smECE at the automatic bandwidth of each row of ``[R, G + 1]`` grids.

    Row 0 is the full data. Ten halvings of [0, 1] end at the upper end ``k / 1024`` of the dyadic
    step holding the crossing of ``σ`` and ``smECE_σ``: the step where the test ``σ < smECE_σ``
    holds at ``(k - 1) / 1024`` and fails at ``k / 1024``. Row 0 is bisected; every replicate starts
    at row 0's crossing moved by one secant step (``smECE`` of the replicate at row 0's ``σ*`` and
    row 0's slope), tests the two ends of its step and, where the crossing is elsewhere, takes a
    secant step of its own, up to ``attempts`` times; rows not confirmed so are bisected. Where the
    test changes sign once (it does on calibration grids: ``smECE_σ`` falls as ``σ`` grows) the
    result is the bisection's, to rounding (the mesh sums run over other batches of rows), at about
    a third of its cost. NaN for rows without mass.
    """
    from lightning_losses.calibration.smooth import BISECTION_STEPS

    scale = 1 << BISECTION_STEPS
    smoother = _ReplicateSmoother(mass, residual)
    rows = mass.shape[0]
    result = np.full(rows, np.nan)
    first_high, first_value = smoother.bisect(np.array([0]))
    result[0] = first_value[0]
    sigma0 = first_high[0]
    below = smoother.values(np.array([max(sigma0 - 1.0 / scale, 1.0 / scale)]), np.array([0]))
    slope = (first_value[0] - below[0]) * scale  # d smECE / d sigma at row 0
    todo = np.arange(1, rows)
    if len(todo):
        # g(σ) = smECE_σ - σ falls through 0 at the crossing; a secant step per row finds it.
        last_sigma = np.full(len(todo), sigma0)
        last_gap = smoother.values(last_sigma, todo) - sigma0
        guess = sigma0 + last_gap / max(1.0 - slope, 1e-3)
        k = np.clip(np.ceil(guess * scale), 1, scale).astype(np.int64)
        for _ in range(attempts):
            if not len(todo):
                break
            sigma = k / scale
            up_high, value_high = smoother.goes_up(sigma, todo)
            up_low = np.ones(len(todo), dtype=bool)  # below the first step the test holds
            inner = k > 1
            if inner.any():
                up_low[inner] = smoother.goes_up((k[inner] - 1) / scale, todo[inner])[0]
            done = up_low & (~up_high | (k == scale))
            result[todo[done]] = value_high[done]
            gap = value_high - sigma
            change = gap - last_gap
            safe = np.where(change == 0, -1.0, change)
            root = np.where(change == 0, sigma, sigma - gap * (sigma - last_sigma) / safe)
            step = np.ceil(root * scale).astype(np.int64)
            step = np.where(up_high, np.maximum(step, k + 1), np.minimum(step, k - 1))
            keep = ~done
            todo, k = todo[keep], np.clip(step[keep], 1, scale)
            last_sigma, last_gap = sigma[keep], gap[keep]
        if len(todo):
            result[todo] = smoother.bisect(todo)[1]
    return np.where(mass.sum(-1) > 0, result, np.nan)


def smooth_interval(
    estimate: Tensor, grid: Tensor, replicates: Tensor, level: float
) -> tuple[Tensor, Tensor]:
    """Basic bootstrap interval of the smooth ECE from the coarse grids.

    ``grid`` ``[G + 1, 2]`` (all data) and ``replicates`` ``[R, G + 1, 2]`` hold mass and
    residual on the coarse replicate grid; the deviations ``smECE(replicate) - smECE(grid)``
    (both on that grid, at their own automatic bandwidths) are subtracted from the estimate of
    the full grid: ``[estimate - q_{1-a}, estimate - q_a]``, the low end at least 0.
    """
    arrays = torch.cat([grid[None], replicates]).detach().cpu().numpy()
    smooth = _smooth_values(arrays[..., 0], arrays[..., 1])
    deviations = torch.tensor(smooth[1:] - smooth[0], dtype=torch.float64, device=estimate.device)
    alpha = (1.0 - level) / 2
    low = (estimate - _quantile(deviations, 1 - alpha)).clamp(min=0)
    high = (estimate - _quantile(deviations, alpha)).clamp(min=0)
    return low, torch.maximum(high, low)


def interval_values(
    metric: Any,
    bins: tuple[Tensor, Tensor, Tensor],
    *,
    level: float,
    n_bootstrap: int,
    seed: int,
    smooth_estimate: Tensor | None = None,
) -> dict[str, Tensor]:
    """``{name}_low`` / ``{name}_high`` of a metric's synced group states.

    ``ece`` always; ``brier``, ``nll``, ``accuracy`` when the metric keeps ``boot_scores``;
    ``smooth_ece`` when it keeps ``boot_grid`` and ``smooth_estimate`` is given.
    """
    group_bins = metric.boot_bins
    n_groups = group_bins.shape[0]
    weights = replicate_weights(
        seed=seed, n_bootstrap=n_bootstrap, n_groups=n_groups, device=group_bins.device
    )
    replicates = (weights @ group_bins.reshape(n_groups, -1)).reshape(n_bootstrap, -1, 3)
    values: dict[str, Tensor] = {}
    values["ece_low"], values["ece_high"] = ece_interval(bins, replicates, level)
    if hasattr(metric, "boot_scores"):
        sums = weights @ metric.boot_scores  # [R, 3]
        counts = replicates[..., 0].sum(-1)
        for column, name in enumerate(("brier", "nll", "accuracy")):
            low, high = mean_interval(sums[:, column], counts, level)
            values[f"{name}_low"], values[f"{name}_high"] = low, high
    if hasattr(metric, "boot_grid") and smooth_estimate is not None:
        grid = metric.boot_grid
        grids = (weights @ grid.reshape(n_groups, -1)).reshape(n_bootstrap, *grid.shape[1:])
        low, high = smooth_interval(smooth_estimate, grid.sum(0), grids, level)
        values["smooth_ece_low"], values["smooth_ece_high"] = low, high
    return values
