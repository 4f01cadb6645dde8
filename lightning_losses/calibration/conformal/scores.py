"""Non-conformity scores of split conformal classification: LAC, APS, RAPS, SAPS and top-k.

A score ``s(x, y)`` is small when label ``y`` looks plausible for ``x``; the prediction set is
``{y : s(x, y) <= q}`` for the threshold ``q`` of :mod:`.threshold`. With the probabilities
``p`` of a row sorted in decreasing order (ties kept in class order), ``r`` the 0-based rank of
``y``, ``c_r`` the sum of the ``r + 1`` largest probabilities and ``U ~ Uniform(0, 1)`` one
draw per row (``U = 0`` when ``randomized=False``):

- ``lac`` (THR, Sadinle et al. 2019): ``1 - p_y`` (never randomised);
- ``aps`` (Romano et al. 2020): ``c_r - U p_y``;
- ``raps`` (Angelopoulos et al. 2021): ``c_r - U p_y + lambda * max(r + 1 - k_reg, 0)``;
- ``saps`` (Huang et al. 2024): ``(1 - U) p_max`` for ``r = 0``, else
  ``p_max + weight * (r - U)`` (summed as ``p_max + weight + ... + weight - U weight``);
- ``top_k`` (Angelopoulos et al. 2021): ``r + 1 - U``.

These are TorchCP 1.2's formulas (``U`` is its ``U``; Romano's ``u`` is ``1 - U``), so the
same draws give the same scores. One draw per row (not per row and label) keeps the sets nested
in the threshold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from lightning_losses.calibration.conformal._inputs import (
    METHODS,
    class_last,
    class_second,
    rows_and_target,
)
from lightning_losses.functional.checks import (
    check_choice,
    check_flag,
    check_int,
    check_probabilities,
    check_real,
)

__all__ = [
    "all_label_scores",
    "all_label_scores_by_method",
    "check_score_hyperparameters",
    "class_scores",
    "conformal_scores",
    "draw_uniform",
    "ranked_rows",
    "row_scores",
    "score_rows_and_draws",
    "sorted_order_scores",
]


def check_score_hyperparameters(k_reg: int, lam: float, weight: float) -> None:
    """RAPS's ``k_reg >= 0`` and ``lam >= 0``, SAPS's ``weight > 0`` (the checks module's)."""
    check_int("k_reg", k_reg, low=0)
    check_real("lam", lam, low=0.0)
    check_real("weight", weight, low=0.0, low_open=True)


def draw_uniform(
    n: int,
    *,
    like: Tensor,
    randomized: bool,
    generator: torch.Generator | None,
    noise: Tensor | None,
) -> Tensor:
    """The ``[n]`` draws ``U`` (zeros when not randomised; ``noise`` when given).

    ``torch.rand(n, generator=generator)`` on ``like``'s device, in ``like``'s dtype: with
    ``generator=None`` the global generator, so ``torch.manual_seed(s)`` reproduces TorchCP's
    draws.
    """
    check_flag("randomized", randomized)
    if noise is not None:
        if not isinstance(noise, Tensor) or tuple(noise.shape) != (n,):
            shape = list(noise.shape) if isinstance(noise, Tensor) else type(noise).__name__
            raise ValueError(
                f"noise must be a tensor of shape [{n}] (one draw per row); got {shape}"
            )
        return noise.to(device=like.device, dtype=like.dtype)
    if not randomized:
        return like.new_zeros(n)
    return torch.rand(n, generator=generator, device=like.device, dtype=like.dtype)


def row_scores(
    rows: Tensor,
    target: Tensor,
    u: Tensor,
    *,
    method: str,
    k_reg: int = 1,
    lam: float = 0.01,
    weight: float = 0.2,
) -> Tensor:
    """The true label's score for ``[M, C]`` rows, ``[M]`` targets and ``[M]`` draws.

    LAC and top-k need no sort: the rank of ``y`` is the number of classes before it (a larger
    probability, or an equal one at a smaller index). APS, RAPS and SAPS take their sums from
    the sorted cumulative sum of :func:`class_scores`, so a score here equals the set's own
    score bit for bit (a calibration sample at the threshold is in its set).

    Example:
        >>> rows = torch.tensor([[0.5, 0.3, 0.2]])
        >>> row_scores(rows, torch.tensor([1]), torch.zeros(1), method="aps")
        tensor([0.8000])
    """
    if method in ("aps", "raps", "saps"):
        scores = class_scores(rows, u, method=method, k_reg=k_reg, lam=lam, weight=weight)
        return scores.gather(1, target[:, None])[:, 0]
    p_y = rows.gather(1, target[:, None])
    if method == "lac":
        return 1.0 - p_y[:, 0]
    classes = torch.arange(rows.shape[1], device=rows.device)
    before = (rows > p_y) | ((rows == p_y) & (classes < target[:, None]))
    rank = before.sum(1).to(rows.dtype)
    return (rank + 1.0) - u  # top_k


def class_scores(
    rows: Tensor,
    u: Tensor,
    *,
    method: str,
    k_reg: int = 1,
    lam: float = 0.01,
    weight: float = 0.2,
) -> Tensor:
    """Every label's score for ``[M, C]`` rows and ``[M]`` draws, as ``[M, C]``.

    One stable descending sort per row; entry ``[m, y]`` equals :func:`row_scores` of label
    ``y``.

    Example:
        >>> class_scores(torch.tensor([[0.5, 0.3, 0.2]]), torch.zeros(1), method="aps")
        tensor([[0.5000, 0.8000, 1.0000]])
    """
    if method == "lac":
        return 1.0 - rows
    return _scores_of_sorted(
        rows.sort(dim=1, descending=True, stable=True),
        u,
        method=method,
        k_reg=k_reg,
        lam=lam,
        weight=weight,
    )


def _scores_of_sorted(
    sorted_rows: tuple[Tensor, Tensor],
    u: Tensor,
    *,
    method: str,
    k_reg: int,
    lam: float,
    weight: float,
) -> Tensor:
    """:func:`class_scores` of a sorting method from the rows' stable descending sort."""
    ordered, order = sorted_rows
    sorted_scores = sorted_order_scores(
        ordered, u, method=method, k_reg=k_reg, lam=lam, weight=weight
    )
    return torch.empty_like(sorted_scores).scatter_(1, order, sorted_scores)


def sorted_order_scores(
    ordered: Tensor,
    u: Tensor,
    *,
    method: str,
    k_reg: int = 1,
    lam: float = 0.01,
    weight: float = 0.2,
    out: Tensor | None = None,
) -> Tensor:
    """A sorting method's scores in rank order: entry ``[m, r]`` is the score of rank ``r``.

    ``ordered`` is ``[M, C]`` rows sorted in decreasing order (stably), ``u`` the ``[M]``
    draws; :func:`class_scores` is this scattered back to label order, the same numbers.
    ``out``: a contiguous ``[M, C]`` tensor of ``ordered``'s dtype to write them into (one
    buffer reused over the chunks of a large batch, which would otherwise fault in fresh pages
    for every temporary).

    Example:
        >>> sorted_order_scores(torch.tensor([[0.5, 0.3, 0.2]]), torch.zeros(1), method="aps")
        tensor([[0.5000, 0.8000, 1.0000]])
    """
    scores = _contiguous_like(ordered) if out is None else out
    rank = torch.arange(ordered.shape[1], device=ordered.device, dtype=ordered.dtype)
    u = u[:, None]
    if method == "top_k":
        return torch.sub(rank + 1.0, u, out=scores)
    # In place: the same numbers as ``cumsum - u * steps`` (+ the penalty). Without draws
    # (U = 0) the product is skipped: ``c - 0 * p`` is ``c`` for finite ``p``.
    draws = bool(u.ne(0).any())
    if method == "saps":  # TorchCP's sums: the cumulative sum of p_max, weight, weight, ...
        scores.fill_(weight)
        scores[:, 0] = ordered[:, 0]
        scores.cumsum_(1)
        if draws:  # minus U times each step: U p_max at rank 0, U weight after it
            scores[:, 0].sub_(u[:, 0] * ordered[:, 0])
            scores[:, 1:].sub_(u * weight)
        return scores
    torch.cumsum(ordered, 1, out=scores)
    if draws:
        scores.sub_(u * ordered)
    if method == "raps":
        scores.add_(lam * (rank + 1.0 - k_reg).clamp(min=0.0))
    return scores


def _contiguous_like(like: Tensor) -> Tensor:
    """An uninitialised contiguous tensor of ``like``'s shape, dtype and device."""
    return torch.empty(like.shape, dtype=like.dtype, device=like.device)


def ranked_rows(
    rows: Tensor, labels: Tensor, *, out: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``[M, C]`` rows sorted in decreasing order, and the 0-based rank ``[M, 1]`` of each label.

    What a stable descending sort gives (the rank of ``y``: the classes of a larger probability,
    plus those of an equal one at a smaller index), without the sort's permutation: the values
    alone are sorted (on a CPU by NumPy for float32 and float64, in place, about 10x faster than
    :func:`torch.sort` at ``[20,000, 100]``), and each rank is found by a binary search of the
    label's probability in its sorted row, the ties counted only in rows that have them (where the
    next sorted value equals the label's).
    ``out``: a contiguous ``[M, C]`` tensor of ``rows``' dtype for the sorted rows.

    Example:
        >>> ordered, rank = ranked_rows(torch.tensor([[0.2, 0.5, 0.3]]), torch.tensor([2]))
        >>> ordered, rank
        (tensor([[0.5000, 0.3000, 0.2000]]), tensor([[1]]))
    """
    negated = torch.neg(rows.detach(), out=_contiguous_like(rows) if out is None else out)
    if negated.is_cpu and negated.dtype in (torch.float32, torch.float64):
        negated.numpy().sort(axis=1)  # ascending -p is descending p; np.sort without its copy
    else:
        negated.copy_(negated.sort(dim=1).values)
    minus_p_y = rows.gather(1, labels[:, None]).neg()
    rank = torch.searchsorted(negated, minus_p_y)  # classes of a larger probability
    # -p_y is at position rank (its first occurrence); another class holds it iff the next
    # sorted value is -p_y too
    following = negated.gather(1, (rank + 1).clamp_(max=max(0, rows.shape[1] - 1)))
    tied = ((following == minus_p_y) & (rank + 1 < rows.shape[1]))[:, 0]
    if bool(tied.any()):  # equal probabilities at smaller indices come first
        where = tied.nonzero()[:, 0]
        classes = torch.arange(rows.shape[1], device=rows.device)
        before = (rows[where] == -minus_p_y[where]) & (classes < labels[where, None])
        rank[where, 0] += before.sum(1)
    return negated.neg_(), rank


def conformal_scores(
    probs: Tensor,
    target: Tensor,
    *,
    method: str = "lac",
    randomized: bool = True,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
    k_reg: int = 1,
    lam: float = 0.01,
    weight: float = 0.2,
    ignore_index: int | None = None,
) -> Tensor:
    """The non-conformity score of the true label, one per kept sample.

    Formulas (module docstring): ``lac`` ``1 - p_y``; ``aps`` ``c_r - U p_y``; ``raps`` adds
    ``lam * max(r + 1 - k_reg, 0)``; ``saps`` ``(1 - U) p_max`` at rank 0, else
    ``p_max + weight (r - U)``; ``top_k`` ``r + 1 - U``. Sources: Romano et al. (NeurIPS 2020),
    Angelopoulos et al. (ICLR 2021), Huang et al. (ICML 2024), as TorchCP 1.2 computes them.

    Args:
        probs: ``[N, C]`` or ``[N, C, *]`` probabilities (class dimension 1), not logits.
        target: ``[N]`` or ``[N, *]`` class indices.
        method: ``"lac"``, ``"aps"``, ``"raps"``, ``"saps"`` or ``"top_k"``.
        randomized: draw ``U`` per sample (else ``U = 0``: the deterministic scores).
        generator: the source of the draws (``None``: torch's global generator).
        noise: the ``[M]`` draws themselves (``M`` kept samples), overriding the two above.
        k_reg: RAPS's rank from which the penalty applies.
        lam: RAPS's penalty per rank.
        weight: SAPS's weight per rank (``> 0``).
        ignore_index: samples whose target equals it get no score.

    Returns:
        ``[M]`` scores of the kept samples in row-major order of ``target``.

    Raises:
        ValueError: an unknown ``method``, mismatched shapes, a target out of range or a bad
            hyper-parameter, naming the argument.

    Example:
        >>> probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]])
        >>> conformal_scores(probs, torch.tensor([1, 2]), method="aps", randomized=False)
        tensor([0.9000, 0.8000])
    """
    check_probabilities(probs)
    check_choice("method", method, METHODS)
    m = str(method)
    check_score_hyperparameters(k_reg, lam, weight)
    rows, labels = rows_and_target(probs, target, ignore_index=ignore_index)
    u = draw_uniform(
        rows.shape[0], like=rows, randomized=randomized, generator=generator, noise=noise
    )
    return row_scores(rows, labels, u, method=m, k_reg=k_reg, lam=lam, weight=weight)


def all_label_scores(
    probs: Tensor,
    *,
    method: str = "lac",
    randomized: bool = True,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
    k_reg: int = 1,
    lam: float = 0.01,
    weight: float = 0.2,
) -> Tensor:
    """Every label's score, in the layout of ``probs`` (``[N, C]`` or ``[N, C, *]``).

    One draw ``U`` per row (per sample, or per position of ``[N, C, *]`` in row-major order).

    Example:
        >>> all_label_scores(torch.tensor([[0.5, 0.3, 0.2]]), method="top_k", randomized=False)
        tensor([[1., 2., 3.]])
    """
    return all_label_scores_by_method(
        probs,
        [method],
        randomized=randomized,
        generator=generator,
        noise=noise,
        k_reg=k_reg,
        lam=lam,
        weight=weight,
    )[str(method)]


def score_rows_and_draws(
    probs: Tensor,
    methods: Iterable[str],
    *,
    randomized: bool,
    generator: torch.Generator | None,
    noise: Tensor | None,
    k_reg: int,
    lam: float,
    weight: float,
) -> tuple[Tensor, Tensor]:
    """Check the arguments of scoring several methods; every position's row and draw ``U``.

    ``probs`` must be probabilities, each method a known one and the hyper-parameters in range;
    returns :func:`~._inputs.class_last` of ``probs`` (``[M, C]``, every position, ignored ones
    included) and the ``[M]`` draws of :func:`draw_uniform`, one per row in that order.

    Example:
        >>> rows, u = score_rows_and_draws(torch.tensor([[0.5, 0.5]]), ["aps"], randomized=False,
        ...                                  generator=None, noise=None, k_reg=1, lam=0.0,
        ...                                  weight=0.2)
        >>> rows.shape, u
        (torch.Size([1, 2]), tensor([0.]))
    """
    check_probabilities(probs)
    for method in methods:
        check_choice("method", method, METHODS)
    check_score_hyperparameters(k_reg, lam, weight)
    rows = class_last(probs)
    u = draw_uniform(
        rows.shape[0], like=rows, randomized=randomized, generator=generator, noise=noise
    )
    return rows, u


def all_label_scores_by_method(
    probs: Tensor,
    methods: Sequence[str],
    *,
    randomized: bool = True,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
    k_reg: int = 1,
    lam: float = 0.01,
    weight: float = 0.2,
) -> dict[str, Tensor]:
    """:func:`all_label_scores` of several methods, the rows sorted once and ``U`` drawn once.

    Each value equals ``all_label_scores(probs, method=m, noise=U, ...)`` for the shared draws
    ``U`` (bit for bit): the sorting scores (APS, RAPS, SAPS, top-k) share one sort of the
    rows, the cost of each (a sort is most of it at 100 classes).

    Example:
        >>> p = torch.tensor([[0.5, 0.3, 0.2]])
        >>> scores = all_label_scores_by_method(p, ["lac", "aps"], randomized=False)
        >>> scores["aps"], scores["lac"]
        (tensor([[0.5000, 0.8000, 1.0000]]), tensor([[0.5000, 0.7000, 0.8000]]))
    """
    rows, u = score_rows_and_draws(
        probs,
        methods,
        randomized=randomized,
        generator=generator,
        noise=noise,
        k_reg=k_reg,
        lam=lam,
        weight=weight,
    )
    sorted_rows = None
    found: dict[str, Tensor] = {}
    for method in dict.fromkeys(str(m) for m in methods):
        if method == "lac":
            scores = 1.0 - rows
        else:
            if sorted_rows is None:
                sorted_rows = rows.sort(dim=1, descending=True, stable=True)
            scores = _scores_of_sorted(
                sorted_rows, u, method=method, k_reg=k_reg, lam=lam, weight=weight
            )
        found[method] = scores if probs.dim() == 2 else class_second(scores, probs)
    return found
