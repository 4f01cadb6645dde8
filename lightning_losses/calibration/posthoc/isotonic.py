r"""Isotonic regression: the non-decreasing map of a probability closest to the labels.

Zadrozny and Elkan, "Transforming classifier scores into accurate multiclass probability
estimates" (KDD 2002). The fitted values at the distinct probabilities :math:`x_1 < \dots <
x_G` of the fit solve

.. math::

    \hat f = \arg\min_{f_1 \le \dots \le f_G} \sum_{g=1}^{G} w_g (\bar y_g - f_g)^2,

with :math:`w_g` the number of samples at :math:`x_g` and :math:`\bar y_g` the mean of their
0/1 labels; between two of them the map is the linear interpolation, outside
:math:`[x_1, x_G]` it is clipped to the end values. This is scikit-learn's
``IsotonicRegression(out_of_bounds="clip")`` (which netcal's ``IsotonicRegression`` calls), to
its conventions: probabilities closer than ``numpy.finfo(float64).resolution`` (1e-15) to the
first of a run of them count as one value (placed at that first one), as its ``_make_unique``
does.

The solution is the one pool-adjacent-violators (PAV) finds: :math:`\hat f_g` is the mean of
the block of adjacent values PAV pools :math:`g` into, which is the slope over :math:`g` of the
greatest convex minorant of the cumulative sum diagram :math:`(W_g, S_g)` (cumulative counts and
label sums; Barlow, Bartholomew, Bremner and Brunk, "Statistical inference under order
restrictions", 1972). It is computed here for all maps at once, without a loop over samples:
the diagram's lower convex hull by a vectorised quickhull in exact integer arithmetic (see
``_hull_vertices``), then each block's first and last value as the map's knots.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from lightning_losses.calibration.posthoc.binning import (
    DEFAULT_FLOOR,
    Mode,
    ProbabilityMapCalibrator,
)

__all__ = ["IsotonicCalibration", "interpolate_maps", "isotonic_maps"]

#: scikit-learn's tolerance for equal probabilities, ``numpy.finfo(float64).resolution``.
RESOLUTION = float(np.finfo(np.float64).resolution)
#: How many starts of each run of close values are followed one by one before pointer doubling.
CHASE = 32


def _group_starts(x: Tensor, width: int) -> Tensor:
    """Where a new distinct value starts in the sorted rows ``x`` (flattened, ``width`` each).

    As scikit-learn's ``_make_unique``, a value starts a new one when it lies at least
    :data:`RESOLUTION` above the first value of the current one (and each row starts one).
    Where neighbours are that far apart this is a cut between them. Inside a run of closer
    neighbours spanning more than that, the greedy rule is followed exactly: each element's next
    start (the first ``k`` with ``x_k - x_j >= RESOLUTION`` in float64, found by a search in its
    row and checked, bisected where the search's ``x_j + RESOLUTION`` rounds the other way),
    then the starts reachable from the run's first element, followed one by one for
    :data:`CHASE` steps and by pointer doubling beyond. All vectorised over the runs.
    """
    n, device = x.numel(), x.device
    cut = torch.zeros(n, dtype=torch.bool, device=device)
    cut[::width] = True
    cut[1:] |= (x[1:] - x[:-1]) >= RESOLUTION
    first = cut.nonzero().squeeze(1)
    last = torch.cat([first[1:] - 1, first.new_tensor([n - 1])])
    long = (x[last] - x[first]) >= RESOLUTION
    if not bool(long.any()):
        return cut
    firsts, lengths = first[long], (last - first + 1)[long]
    size = int(lengths.sum())
    cluster = torch.repeat_interleave(torch.arange(len(firsts), device=device), lengths)
    offsets = torch.cumsum(lengths, 0) - lengths
    local = torch.arange(size, device=device)
    positions = firsts[cluster] + (local - offsets[cluster])
    values, end = x[positions], (offsets + lengths)[cluster]
    jump = torch.cat(
        [_next_starts(x, width, positions, values, local, end), local.new_tensor([size])]
    )
    reached = torch.zeros(size + 1, dtype=torch.bool, device=device)
    current = offsets
    for _ in range(CHASE):  # most runs hold a few starts: follow them one by one
        reached[current] = True
        current = jump[current]
        current = current[current < size]
        if not current.numel():
            break
    if current.numel():  # the few long chains left: pointer doubling on their runs only
        left = torch.zeros(len(firsts), dtype=torch.bool, device=device)
        left[cluster[current]] = True
        members = left[cluster].nonzero().squeeze(1)
        index = torch.full((size + 1,), members.numel(), dtype=torch.long, device=device)
        index[members] = torch.arange(members.numel(), device=device)
        sub = torch.cat([index[jump[members]], index.new_tensor([members.numel()])])
        mark = torch.zeros(members.numel() + 1, dtype=torch.bool, device=device)
        mark[index[current]] = True
        while True:
            mark[sub[mark]] = True
            if bool((sub == members.numel()).all()):
                break
            sub = sub[sub]
        reached[members[mark[:-1]]] = True
    cut[positions[reached[:size]]] = True
    return cut


def _next_starts(
    x: Tensor, width: int, positions: Tensor, values: Tensor, local: Tensor, end: Tensor
) -> Tensor:
    """The local index of each long runs' element's next start, or ``len(local)`` if none.

    The elements sit at ``positions`` in ``x`` (``local``: their index among them, ``end``: one
    past the last of their run); the next start is the first later element of the run at least
    :data:`RESOLUTION` above it.
    """
    size, device = local.numel(), x.device
    row = torch.div(positions, width, rounding_mode="floor")
    counts = torch.bincount(row, minlength=x.numel() // width)
    column = local - (torch.cumsum(counts, 0) - counts)[row]
    queries = torch.full(
        (counts.numel(), int(counts.max())), torch.inf, dtype=x.dtype, device=device
    )
    queries[row, column] = values + RESOLUTION
    found = torch.searchsorted(x.view(-1, width), queries)[row, column]
    low = local + (row * width + found - positions)  # first k with x_k >= x_j + RESOLUTION
    low = torch.minimum(torch.maximum(low, local + 1), end)

    def far(k: Tensor, j: Tensor) -> Tensor:  # the float64 test of _make_unique
        return (values[k.clamp(max=size - 1)] - values[j]) >= RESOLUTION

    wrong = (low < end) & ~far(low, local)
    wrong |= (low > local + 1) & far(low - 1, local)
    pending = wrong.nonzero().squeeze(1)
    lo, hi = local[pending] + 1, end[pending]
    while pending.numel():  # bisect where the rounding of x_j + RESOLUTION misled the search
        middle = (lo + hi) // 2
        ahead = far(middle, pending)
        lo, hi = torch.where(ahead, lo, middle + 1), torch.where(ahead, middle, hi)
        low[pending] = lo
        done = lo >= hi
        pending, lo, hi = pending[~done], lo[~done], hi[~done]
    return torch.where(low < end, low, size)


def _hull_vertices(
    cum_w: Tensor, cum_s: Tensor, rises: Tensor, row: Tensor, last: Tensor
) -> Tensor:
    r"""The groups at the vertices of each row's greatest convex minorant, in order.

    Each row's cumulative sum diagram has the points :math:`P_k = (W_k, S_k)`, the sample count
    and label sum up to the end of its group :math:`k` (``cum_w``, ``cum_s``: integers held in
    float64, exact below 2**53), from the origin. The isotonic fit of a group is the slope of the
    diagram's lower convex hull over it: the mean of the block that pool-adjacent-violators
    pools it into. The hull is found by a vectorised quickhull: every pass adds, in every
    segment at once, the point farthest below its chord (compared exactly, as cross-products of
    integers), and drops the points on or above the chords, which are never vertices. Only
    points where the mean rises (``rises``: :math:`\bar y_k < \bar y_{k+1}`) can be vertices;
    each row's last group (``last``) always is one. Group ``-1`` stands for a row's origin.
    """
    device = cum_w.device
    ends = last.nonzero().squeeze(1)
    row_end = torch.full((int(row[-1]) + 1,), -1, dtype=torch.long, device=device)
    row_end[row[ends]] = ends
    candidate = rises.nonzero().squeeze(1)
    a, b = torch.full_like(candidate, -1), row_end[row[candidate]]
    chosen_all = [ends]

    def at(values: Tensor, group: Tensor) -> Tensor:
        return torch.where(group >= 0, values[group.clamp(min=0)], 0.0)

    while candidate.numel():
        w_a, s_a, w_b, s_b = at(cum_w, a), at(cum_s, a), at(cum_w, b), at(cum_s, b)
        below = (s_b - s_a) * (cum_w[candidate] - w_a) - (cum_s[candidate] - s_a) * (w_b - w_a)
        keep = below > 0
        candidate, a, b, below = candidate[keep], a[keep], b[keep], below[keep]
        if not candidate.numel():
            break
        new = torch.ones_like(keep[: candidate.numel()])
        new[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
        segment = torch.cumsum(new, 0) - 1
        segments = int(segment[-1]) + 1
        deepest = torch.zeros(segments, dtype=torch.float64, device=device)
        deepest = deepest.scatter_reduce(0, segment, below, "amax", include_self=False)
        at_deepest = below == deepest[segment]
        chosen = torch.zeros(segments, dtype=candidate.dtype, device=device)
        chosen = chosen.scatter_reduce(
            0, segment[at_deepest], candidate[at_deepest], "amin", include_self=False
        )
        chosen_all.append(chosen)
        pick = chosen[segment]
        a, b = torch.where(candidate > pick, pick, a), torch.where(candidate < pick, pick, b)
        rest = candidate != pick
        candidate, a, b = candidate[rest], a[rest], b[rest]
    return torch.sort(torch.cat(chosen_all)).values


def isotonic_maps(scores: Tensor, hits: Tensor) -> tuple[Tensor, Tensor]:
    """The knots of the isotonic maps of each row of ``scores`` ``[R, N]`` to ``hits`` (0/1).

    Returns:
        ``(x, y)``, both ``[R, K]`` float64: each row's knots, increasing in ``x`` and
        non-decreasing in ``y``: the first and the last distinct value of each block of equal
        fitted values (as scikit-learn keeps them; the interpolation is the same), padded at
        the right by repeating the last knot.
    """
    rows, n = scores.shape
    device = scores.device
    x, order = torch.sort(scores, dim=1, stable=True)
    x = x.reshape(-1)
    cum_hits = torch.zeros(rows * n + 1, dtype=torch.float64, device=device)
    cum_hits[1:] = torch.cumsum(hits.gather(1, order).reshape(-1).to(torch.float64), 0)
    first = _group_starts(x, n).nonzero().squeeze(1)  # each group's first element
    end = torch.cat([first[1:], first.new_tensor([rows * n])])  # one past its last
    row = torch.div(first, n, rounding_mode="floor")
    base = row * n
    cum_w, cum_s = (end - base).to(torch.float64), cum_hits[end] - cum_hits[base]
    weight, total = (end - first).to(torch.float64), cum_hits[end] - cum_hits[first]
    last = torch.ones_like(row, dtype=torch.bool)
    last[:-1] = row[1:] != row[:-1]
    rises = ~last
    rises[:-1] &= total[:-1] * weight[1:] < total[1:] * weight[:-1]
    vertex = _hull_vertices(cum_w, cum_s, rises, row, last)
    previous = torch.cat([vertex.new_tensor([-1]), vertex[:-1]])
    previous = torch.where(row[previous.clamp(min=0)] == row[vertex], previous, -1)
    w_before = torch.where(previous >= 0, cum_w[previous.clamp(min=0)], 0.0)
    s_before = torch.where(previous >= 0, cum_s[previous.clamp(min=0)], 0.0)
    slope = (cum_s[vertex] - s_before) / (cum_w[vertex] - w_before)
    block_start = torch.where(previous >= 0, previous + 1, vertex)
    row_first = torch.ones_like(last)
    row_first[1:] = last[:-1]
    first_of_row = row_first.nonzero().squeeze(1)
    block_start = torch.where(previous >= 0, block_start, first_of_row[row[vertex]])
    groups = torch.stack([block_start, vertex], 1).reshape(-1)
    keep = torch.stack([torch.ones_like(last[vertex]), vertex != block_start], 1).reshape(-1)
    groups, knot_y = groups[keep], slope.repeat_interleave(2)[keep]
    knot_x, knot_row = x[first[groups]], row[groups]
    counts = torch.bincount(knot_row, minlength=rows)
    width = max(2, int(counts.max()))
    column = (
        torch.arange(groups.numel(), device=device) - (torch.cumsum(counts, 0) - counts)[knot_row]
    )
    row_last = torch.cumsum(counts, 0) - 1
    out_x = knot_x[row_last][:, None].repeat(1, width)
    out_y = knot_y[row_last][:, None].repeat(1, width)
    out_x[knot_row, column], out_y[knot_row, column] = knot_x, knot_y
    return out_x, out_y


def interpolate_maps(x: Tensor, y: Tensor, scores: Tensor) -> Tensor:
    """Each row of ``scores`` ``[R, N]`` through its map: linear between knots, clipped outside.

    ``x``, ``y`` ``[R, K]`` as :func:`isotonic_maps` returns them (``K >= 2``; knots of equal
    ``x`` only in the padding, where ``y`` is equal too).

    Example:
        >>> x = torch.tensor([[0.2, 0.6, 0.6]], dtype=torch.float64)
        >>> y = torch.tensor([[0.0, 1.0, 1.0]], dtype=torch.float64)
        >>> interpolate_maps(x, y, torch.tensor([[0.0, 0.3, 0.6, 0.9]], dtype=torch.float64))
        tensor([[0.0000, 0.2500, 1.0000, 1.0000]], dtype=torch.float64)
    """
    t = torch.minimum(torch.maximum(scores, x[:, :1]), x[:, -1:]).contiguous()
    high = torch.searchsorted(x.contiguous(), t, right=True).clamp(1, x.shape[1] - 1)
    low = high - 1
    x_low, x_high = x.gather(1, low), x.gather(1, high)
    y_low, y_high = y.gather(1, low), y.gather(1, high)
    step = x_high - x_low
    share = torch.where(step > 0, (t - x_low) / torch.where(step > 0, step, 1.0), 0.0)
    return y_low + share * (y_high - y_low)


class IsotonicCalibration(ProbabilityMapCalibrator):
    r"""Isotonic regression of a probability to the labels, top-label or one-vs-rest.

    The map :math:`f` is the non-decreasing least-squares fit of the 0/1 labels on the
    probabilities (see the module), linear between the fitted points and clipped outside
    them, as scikit-learn's ``IsotonicRegression(out_of_bounds="clip")``. In
    ``mode="top_label"`` it maps the top confidence to the frequency of a right prediction; in
    ``mode="one_vs_rest"`` one map per class maps :math:`p_c` to the frequency of class
    :math:`c`, and the rows are renormalised, as netcal's ``IsotonicRegression`` (the rules for
    both modes, for absent classes and for probabilities of 0 are those of
    :mod:`~lightning_losses.calibration.posthoc.binning`).

    ``params``: ``x`` and ``y`` ``[R, K]``, the knots of each map (``R = 1``, or ``C`` in
    one-vs-rest with more than 2 classes; padded by repeating the last knot). A fit needs two
    samples and two classes among the labels; with fewer it falls back to the identity with a
    warning.

    Source: Zadrozny and Elkan, "Transforming classifier scores into accurate multiclass
    probability estimates", KDD 2002.

    Args:
        mode: ``"top_label"`` (default) or ``"one_vs_rest"``.
        floor: every row is mixed with it and renormalised, ``(p + floor) / (1 + C floor)``,
            so no probability is below ``floor / (1 + C floor)`` (default ``1e-6``).

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [0.0, 4.0]])
        >>> iso = IsotonicCalibration().fit(z, torch.tensor([0, 1, 0, 1]))
        >>> iso.params["x"]  # the top confidences
        tensor([[0.7311, 0.8808, 0.9526, 0.9820]], dtype=torch.float64)
        >>> iso.params["y"]  # right, wrong, right, right: the first two pooled
        tensor([[0.5000, 0.5000, 1.0000, 1.0000]], dtype=torch.float64)
        >>> iso(torch.tensor([[2.5, 0.0]])).exp()  # confidence 0.924: 0.5 + 0.5 * 0.604
        tensor([[0.8019, 0.1981]])
    """

    method: ClassVar[str] = "isotonic"
    values_key: ClassVar[str] = "y"

    def __init__(self, *, mode: Mode = "top_label", floor: float = DEFAULT_FLOOR) -> None:
        super().__init__(mode=mode, floor=floor)

    def _fit_maps(self, scores: Tensor, hits: Tensor) -> dict[str, Tensor]:
        x, y = isotonic_maps(scores, hits)
        return {"x": x, "y": y}

    def _apply_maps(self, scores: Tensor) -> Tensor:
        return interpolate_maps(self.param("x", scores), self.param("y", scores), scores)
