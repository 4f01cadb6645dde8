"""Batch-level calibration penalties: MDCA, DCA and MMCE, alone and added to a base loss.

Each penalty is one number per batch, a function of the batch's softmax probabilities ``p_i``,
its confidences ``r_i = max_c p_ic``, predictions ``a_i = argmax_c p_ic`` and correctness
``c_i = [a_i = t_i]`` over the ``n`` non-ignored elements ``i`` (positions of ``[N, C, *]``
logits are elements, flattened):

- MDCA, the multi-class difference of confidence and accuracy (Hebbalaguppe et al., "A Stitch in
  Time Saves Nine: A Train-Time Regularizing Loss for Improved Neural Network Calibration", CVPR
  2022): ``(1/C) sum_c |mean_i p_ic - mean_i [t_i = c]|``.
- DCA, the difference of confidence and accuracy (Liang et al., "Improved Trainable Calibration
  Method for Neural Networks on Medical Imaging Classification", BMVC 2020):
  ``|mean_i r_i - mean_i c_i|``.
- MMCE, the maximum mean calibration error (Kumar, Sarawagi and Jain, "Trainable Calibration
  Measures for Neural Networks from Kernel Mean Embeddings", ICML 2018), the unweighted
  ``MMCE_m`` squared, as the authors' code returns it (no square root):
  ``(1/n^2) sum_ij (c_i - r_i)(c_j - r_j) exp(-|r_i - r_j| / 0.4)``.

The losses add ``weight * penalty`` to the mean of a per-element base loss (cross-entropy, or
focal loss for MDCA with ``gamma > 0``), as the authors' training losses do.

Cost. One chunked pass over the logits (:class:`_BatchStatistics`) gives ``log p_t``, the
confidences, the predictions and the class sums of the softmax; its backward recomputes the
softmax a chunk at a time and writes the whole gradient in one pass, so no ``[N, C]`` tensor is
kept for backward and the penalties cost little more than cross-entropy. MMCE's kernel sum over
the ``n^2`` pairs is computed exactly in ``O(n log n)`` (:class:`_LaplacianQuadraticForm`).

Global batch. With ``global_batch=True`` the statistics are gathered over the ranks of the
default process group (:mod:`lightning_losses.functional.global_batch`): every rank gets the
penalty of the global batch, and DDP's average of the ranks' gradients is its exact gradient.
The base loss stays each rank's own mean. The default (``False``) is each rank's own batch, as
the authors' code computes it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from lightning_losses.functional._core import (
    CHUNK_ELEMENTS,
    CPU_SMOOTHING_ELEMENTS,
    apply_phi,
    compute_dtype,
    phi_cross_entropy,
    row_chunks,
)
from lightning_losses.functional._kernel_checks import check_index_values
from lightning_losses.functional.checks import (
    check_dca,
    check_flag,
    check_index_target,
    check_mdca,
    check_mmce,
    check_reduction,
)
from lightning_losses.functional.global_batch import concat_over_ranks, sum_over_ranks
from lightning_losses.functional.target_probability import phi_focal
from lightning_losses.kernels.availability import use_kernels

#: MMCE's kernel width: the Laplacian kernel ``exp(-|r - r'| / 0.4)`` of the authors' code.
MMCE_BANDWIDTH = 0.4


# --- one pass over the logits ------------------------------------------------------------------


class _BatchStatistics(torch.autograd.Function):
    """Per row of 2-D logits: ``log p_t``, ``log r`` and ``argmax``; the softmax's class sums.

    Forward takes each chunk's log-softmax (half precision in float32) and keeps ``log p_t``,
    with ``confidence`` the row maximum ``log r`` and its index ``a`` (the first on ties), with
    ``class_sums`` the sums ``s_c = sum_i valid_i p_ic``. Backward recomputes each chunk's softmax
    and writes, for upstream gradients ``u_i`` (of ``log p_t``), ``v_i`` (of ``log r``) and
    ``S`` (of the class sums)::

        grad_i = u_i onehot(t_i) + v_i onehot(a_i) + p_i * (valid_i (S - <S, p_i>) - u_i - v_i)

    (``d log p_t = onehot(t) - p``, ``d log r = onehot(a) - p``, ``d p_c / d x_k = p_c (delta_ck
    - p_k)``) in one pass. Ignored rows (``valid`` false) get zero outputs and zero gradient.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        target: Tensor,
        valid: Tensor,
        confidence: bool,
        class_sums: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        dtype = compute_dtype(logits.dtype)
        rows, columns = logits.shape
        device = logits.device
        log_pt = torch.empty(rows, dtype=dtype, device=device)
        log_r = torch.empty(rows if confidence else 0, dtype=dtype, device=device)
        predicted = torch.zeros(rows if confidence else 0, dtype=torch.long, device=device)
        sums = torch.zeros(columns if class_sums else 0, dtype=dtype, device=device)
        weight = valid.to(dtype)
        elements = CHUNK_ELEMENTS  # on a CPU, chunks that stay in cache for the extra passes
        if device.type == "cpu" and (confidence or class_sums):
            elements = CPU_SMOOTHING_ELEMENTS
        with torch.autocast(device.type, enabled=False):
            for start, stop in row_chunks(rows, columns, elements):
                log_softmax = torch.log_softmax(logits[start:stop].to(dtype), dim=1)
                log_pt[start:stop] = log_softmax.gather(1, target[start:stop, None])[:, 0]
                if confidence:
                    maximum, index = log_softmax.max(dim=1)
                    log_r[start:stop], predicted[start:stop] = maximum, index
                if class_sums:
                    sums.addmv_(log_softmax.exp_().T, weight[start:stop])
        zero = torch.zeros((), dtype=dtype, device=device)
        log_pt = torch.where(valid, log_pt, zero)
        if confidence:
            log_r = torch.where(valid, log_r, zero)
        ctx.confidence, ctx.class_sums = confidence, class_sums
        ctx.save_for_backward(logits, target, valid, predicted)
        ctx.mark_non_differentiable(predicted)
        ctx.set_materialize_grads(False)
        return log_pt, log_r, predicted, sums

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: Any,
        grad_pt: Tensor | None,
        grad_r: Tensor | None,
        _grad_predicted: Tensor | None,
        grad_sums: Tensor | None,
    ) -> tuple[Tensor | None, ...]:
        logits, target, valid, predicted = ctx.saved_tensors
        dtype = compute_dtype(logits.dtype)
        rows, columns = logits.shape
        u = None if grad_pt is None else torch.where(valid, grad_pt.to(dtype), 0)
        if not ctx.confidence:
            grad_r = None
        v = None if grad_r is None else torch.where(valid, grad_r.to(dtype), 0)
        factor = torch.zeros(rows, dtype=dtype, device=logits.device)
        for part in (u, v):
            if part is not None:
                factor = factor - part
        sums = None if grad_sums is None or not ctx.class_sums else grad_sums.to(dtype)
        weight = valid.to(dtype)
        grad = torch.empty_like(logits)
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in row_chunks(rows, columns):
                softmax = torch.softmax(logits[start:stop].to(dtype), dim=1)
                out = grad[start:stop] if grad.dtype == dtype else softmax
                if sums is None:
                    torch.mul(softmax, factor[start:stop, None], out=out)
                else:  # p * (valid S + factor - valid <S, p>), without a temporary when it can
                    row = factor[start:stop] - weight[start:stop] * torch.mv(softmax, sums)
                    if out is softmax:
                        softmax.mul_(torch.addr(row[:, None], weight[start:stop], sums))
                    else:
                        torch.addr(row[:, None], weight[start:stop], sums, out=out).mul_(softmax)
                if u is not None:
                    out.scatter_add_(1, target[start:stop, None], u[start:stop, None])
                if v is not None:
                    out.scatter_add_(1, predicted[start:stop, None], v[start:stop, None])
                if out is softmax:
                    grad[start:stop] = softmax
        return grad, None, None, None, None


class _Batch(NamedTuple):
    """The statistics of one batch, flattened to elements (``M`` rows)."""

    log_pt: Tensor  # [M], 0 where ignored
    log_r: Tensor  # [M] log confidence (or empty), 0 where ignored
    predicted: Tensor  # [M] argmax (or empty)
    class_sums: Tensor  # [C] sum of the softmax over the non-ignored rows (or empty)
    target: Tensor  # [M] class indices, 0 where ignored
    valid: Tensor  # [M] bool
    shape: torch.Size  # the target's shape, for reduction="none"
    kernels: bool  # the base loss runs on the Triton kernels (backend=)


def _batch(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int,
    global_batch: bool,
    validate_args: bool,
    confidence: bool = False,
    class_sums: bool = False,
    backend: str = "torch",
) -> _Batch:
    """Check the inputs and take the statistics of ``logits`` in one chunked pass.

    ``backend`` chooses where the base loss runs (``_Batch.kernels``); on the kernels the value
    checks cost one synchronisation.
    """
    check_flag("global_batch", global_batch)
    check_index_target(logits, target, ignore_index=ignore_index, validate_args=False)
    kernels = use_kernels(logits, backend)
    if validate_args:
        check_index_values(logits, target, ignore_index=ignore_index, kernels=kernels)
    classes = logits.shape[1]
    flat = logits if logits.dim() == 2 else logits.movedim(1, -1).reshape(-1, classes)
    flat_target = target.reshape(-1).long()
    valid = flat_target != ignore_index
    safe = torch.where(valid, flat_target, 0)
    log_pt, log_r, predicted, sums = _BatchStatistics.apply(
        flat, safe, valid, confidence, class_sums
    )
    return _Batch(log_pt, log_r, predicted, sums, safe, valid, target.shape, kernels)


# --- the penalties -----------------------------------------------------------------------------


def _mdca(batch: _Batch, global_batch: bool) -> Tensor:
    dtype = batch.class_sums.dtype
    counts = torch.zeros_like(batch.class_sums).scatter_add_(0, batch.target, batch.valid.to(dtype))
    totals = torch.cat([batch.class_sums, counts, batch.valid.sum().to(dtype)[None]])
    if global_batch:
        totals = sum_over_ranks(totals)
    classes = batch.class_sums.shape[0]
    n = totals[-1].clamp_min(1)
    confidence, frequency = totals[:classes] / n, totals[classes : 2 * classes] / n
    return (confidence - frequency).abs().mean()


def _dca(batch: _Batch, global_batch: bool) -> Tensor:
    dtype = batch.log_r.dtype
    confidence = torch.where(batch.valid, batch.log_r.exp(), 0)
    correct = (batch.valid & (batch.predicted == batch.target)).to(dtype)
    totals = torch.stack([confidence.sum(), correct.sum(), batch.valid.sum().to(dtype)])
    if global_batch:
        totals = sum_over_ranks(totals)
    n = totals[2].clamp_min(1)
    return (totals[0] / n - totals[1] / n).abs()


class _LaplacianQuadraticForm(torch.autograd.Function):
    """``sum_ij e_i e_j exp(-|r_i - r_j| / w)`` exactly, in ``O(n log n)``, in float64.

    With ``r`` sorted, the pairs below and above ``r_m`` factor::

        A_m = sum_j e_j k(r_m, r_j)
            = exp(-r_m/w) sum_{r_j < r_m} e_j exp(r_j/w)      (L_m)
            + exp(r_m/w) sum_{r_j > r_m} e_j exp(-r_j/w)       (U_m)
            + sum_{r_j = r_m} e_j

    (``r`` in ``[0, 1]``: the exponentials lie within ``exp(+-1/w)``, no overflow). Ties are
    exact: equal ``r`` form one group (their first position in sorted order, from
    ``searchsorted``), summed once, and the sums below and above a group are exclusive prefix
    and suffix sums over the groups. The value is ``sum_m e_m A_m``; its gradient
    ``d/de_m = 2 A_m`` and ``d/dr_m = -(2/w) e_m B_m`` with ``B_m = L_m - U_m`` (the sign of
    ``r_m - r_j`` is 0 on ties, as autograd's gradient of ``abs`` at 0).
    """

    @staticmethod
    def forward(ctx: Any, r: Tensor, e: Tensor, width: float) -> Tensor:
        order = torch.argsort(r)
        r_sorted, e_sorted = r[order], e[order]
        first = torch.searchsorted(r_sorted, r_sorted)  # the tie group's first position
        group = torch.zeros_like(e_sorted).index_add_(0, first, e_sorted)  # at first positions
        up, down = torch.exp(r_sorted / width), torch.exp(-r_sorted / width)
        zero = torch.zeros(1, dtype=r.dtype, device=r.device)
        below = torch.cat([zero, torch.cumsum(group * up, 0)[:-1]])  # groups before position
        above = torch.cat([torch.cumsum((group * down).flip(0), 0)[:-1].flip(0), zero])
        lower, upper = down * below[first], up * above[first]
        a_sorted = lower + upper + group[first]
        value = (e_sorted * a_sorted).sum()
        a, b = torch.empty_like(r), torch.empty_like(r)
        a[order], b[order] = a_sorted, lower - upper
        ctx.width = width
        ctx.save_for_backward(e, a, b)
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        e, a, b = ctx.saved_tensors
        return grad * (-2.0 / ctx.width) * e * b, grad * 2.0 * a, None


def _mmce(batch: _Batch, global_batch: bool) -> Tensor:
    dtype = batch.log_r.dtype
    confidence = batch.log_r.exp()
    correct = (batch.predicted == batch.target).to(dtype)
    columns = torch.stack([confidence, correct, batch.valid.to(dtype)], dim=1)
    if global_batch:
        columns = concat_over_ranks(columns)
    r, c, valid = columns.double().unbind(1)
    error = (c - r) * valid  # ignored rows: e = 0, no term and no gradient
    value = _LaplacianQuadraticForm.apply(r, error, MMCE_BANDWIDTH)
    return (value / valid.sum().clamp_min(1) ** 2).to(dtype)


def mdca_penalty(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int = -100,
    global_batch: bool = False,
    validate_args: bool = True,
) -> Tensor:
    """MDCA: ``(1/C) sum_c |mean_i p_ic - mean_i [t_i = c]|`` over the non-ignored elements.

    Source: Hebbalaguppe et al., "A Stitch in Time Saves Nine: A Train-Time Regularizing Loss for
    Improved Neural Network Calibration" (CVPR 2022). 0 for a batch with nothing to average.

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1); positions are elements.
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        ignore_index: target value that takes no part in the penalty.
        global_batch: the penalty of the batch of all ranks of the default process group
            (see :mod:`lightning_losses.functional.global_batch`); without one, this batch's.
        validate_args: check target values and finite logits (device synchronisations).

    Example:
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
        >>> mdca_penalty(logits, torch.tensor([0, 0]))  # |0.6904 - 1| and |0.3096 - 0|, halved
        tensor(0.3096)
    """
    batch = _batch(
        logits,
        target,
        ignore_index=ignore_index,
        global_batch=global_batch,
        validate_args=validate_args,
        class_sums=True,
    )
    return _mdca(batch, global_batch)


def dca_penalty(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int = -100,
    global_batch: bool = False,
    validate_args: bool = True,
) -> Tensor:
    """DCA: ``|mean_i max_c p_ic - mean_i [argmax_c p_ic = t_i]|`` over the non-ignored elements.

    Source: Liang et al., "Improved Trainable Calibration Method for Neural Networks on Medical
    Imaging Classification" (BMVC 2020). The prediction is the first maximal class; the
    accuracy carries no gradient. Arguments as :func:`mdca_penalty`.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
        >>> dca_penalty(logits, torch.tensor([0, 0]))  # |(0.8808 + 0.7311) / 2 - 1 / 2|
        tensor(0.3059)
    """
    batch = _batch(
        logits,
        target,
        ignore_index=ignore_index,
        global_batch=global_batch,
        validate_args=validate_args,
        confidence=True,
    )
    return _dca(batch, global_batch)


def mmce_penalty(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int = -100,
    global_batch: bool = False,
    validate_args: bool = True,
) -> Tensor:
    """MMCE_m squared: ``(1/n^2) sum_ij (c_i - r_i)(c_j - r_j) exp(-|r_i - r_j| / 0.4)``.

    ``r_i`` is the confidence (the largest softmax probability), ``c_i`` the correctness of the
    prediction (no gradient), over the ``n`` non-ignored elements: the unweighted ``MMCE_m`` of
    Kumar, Sarawagi and Jain, "Trainable Calibration Measures for Neural Networks from Kernel
    Mean Embeddings" (ICML 2018), squared, as their code returns it (no square root). The sum
    over the ``n^2`` pairs is computed exactly in ``O(n log n)`` and in float64. It is ``>= 0``
    up to rounding (the kernel is positive definite). Arguments as :func:`mdca_penalty`.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
        >>> mmce_penalty(logits, torch.tensor([0, 1]))  # r = 0.8808, 0.5; c = 1, 0
        tensor(0.0546)
    """
    batch = _batch(
        logits,
        target,
        ignore_index=ignore_index,
        global_batch=global_batch,
        validate_args=validate_args,
        confidence=True,
    )
    return _mmce(batch, global_batch)


# --- the losses --------------------------------------------------------------------------------


def _combine(base: Tensor, penalty: Tensor, weight: float, batch: _Batch, reduction: str) -> Tensor:
    """``base`` per element (0 where ignored) plus ``weight * penalty``, reduced.

    ``"none"``: ``base_i + weight * penalty`` per element (0 where ignored), so that its mean
    over the non-ignored elements is ``"mean"``; ``"mean"``: the mean base loss plus ``weight *
    penalty``; ``"sum"``: ``n`` times ``"mean"``.
    """
    base = torch.where(batch.valid, base, 0)
    added = weight * penalty
    if reduction == "none":
        return torch.where(batch.valid, base + added, 0).reshape(batch.shape)
    count = batch.valid.sum()
    if reduction == "sum":
        return base.sum() + added * count
    return base.sum() / count.clamp_min(1) + added


def _base_loss(log_pt: Tensor, gamma: float = 0.0) -> Tensor:
    """Cross-entropy ``-log p_t`` or, with ``gamma > 0``, focal ``-(1 - p_t)^gamma log p_t``."""
    if gamma == 0:
        return -log_pt
    return apply_phi(log_pt, phi_focal, gamma=float(gamma))


def _kernel_base_loss(logits: Tensor, batch: _Batch, gamma: float = 0.0) -> Tensor:
    """The base loss per row by the family's kernels (0 where ignored); the penalty stays torch.

    Its gradient comes from the backward kernel; the penalty's from the torch pass of
    :class:`_BatchStatistics`, which then writes no ``log p_t`` term.
    """
    from lightning_losses.kernels.target_probability import TritonTargetProbability

    if gamma == 0:
        return TritonTargetProbability.apply(
            logits, batch.target, batch.valid, phi_cross_entropy, {}
        )
    hyperparameters = {"gamma": float(gamma)}
    return TritonTargetProbability.apply(
        logits, batch.target, batch.valid, phi_focal, hyperparameters
    )


def mdca_loss(
    logits: Tensor,
    target: Tensor,
    *,
    beta: float = 1.0,
    gamma: float = 0.0,
    ignore_index: int = -100,
    reduction: str = "mean",
    global_batch: bool = False,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Cross-entropy (or focal loss) plus ``beta`` times MDCA (:func:`mdca_penalty`).

    ``loss = mean_i base_i + beta * MDCA`` with ``base = -log p_t`` (``gamma = 0``, the
    authors' "NLL+MDCA") or ``-(1 - p_t)^gamma log p_t`` (``gamma > 0``, "FL+MDCA").

    Source: Hebbalaguppe et al., "A Stitch in Time Saves Nine: A Train-Time Regularizing Loss for
    Improved Neural Network Calibration" (CVPR 2022); ``beta = 1`` is their default.

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1); positions are elements.
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        beta: the weight of the penalty, ``>= 0``.
        gamma: the focal exponent of the base loss, ``>= 0`` (0: cross-entropy).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"mean"`` (the authors' form), ``"none"`` (``base_i + beta * MDCA`` per
            element, 0 where ignored: its mean over the non-ignored elements is ``"mean"``) or
            ``"sum"`` (``n`` times ``"mean"``, ``n`` non-ignored elements).
        global_batch: the penalty of the batch of all ranks (the base loss stays this rank's);
            see :mod:`lightning_losses.functional.global_batch`.
        validate_args: check target values and finite logits (device synchronisations).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the base loss by the fused kernels
            of :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error; the penalty stays PyTorch) or
            ``"torch"``.

    Raises:
        ValueError: ``beta`` or ``gamma`` negative or not finite; a bad ``reduction`` or
            ``target``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
        >>> mdca_loss(logits, torch.tensor([0, 0]), beta=1.0)  # (0.1269 + 0.6931) / 2 + 0.3096
        tensor(0.7196)
    """
    check_mdca(beta, gamma)
    check_reduction(reduction)
    batch = _batch(
        logits,
        target,
        ignore_index=ignore_index,
        global_batch=global_batch,
        validate_args=validate_args,
        class_sums=True,
        backend=backend,
    )
    base = (
        _kernel_base_loss(logits, batch, gamma)
        if batch.kernels
        else _base_loss(batch.log_pt, gamma)
    )
    return _combine(base, _mdca(batch, global_batch), beta, batch, reduction)


def dca_loss(
    logits: Tensor,
    target: Tensor,
    *,
    beta: float = 10.0,
    ignore_index: int = -100,
    reduction: str = "mean",
    global_batch: bool = False,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Cross-entropy plus ``beta`` times DCA (:func:`dca_penalty`).

    ``loss = mean_i (-log p_t) + beta * DCA``. Source: Liang et al., "Improved Trainable
    Calibration Method for Neural Networks on Medical Imaging Classification" (BMVC 2020);
    ``beta = 10`` is the default of the authors' released loss.

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1); positions are elements.
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        beta: the weight of the penalty, ``>= 0``.
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"mean"``, ``"none"`` or ``"sum"``, as in :func:`mdca_loss`.
        global_batch: the penalty of the batch of all ranks, as in :func:`mdca_loss`.
        validate_args: check target values and finite logits (device synchronisations).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the base loss by the fused kernels
            of :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error; the penalty stays PyTorch) or
            ``"torch"``.

    Raises:
        ValueError: ``beta`` negative or not finite; a bad ``reduction`` or ``target``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
        >>> dca_loss(logits, torch.tensor([0, 0]), beta=1.0)  # (0.1269 + 1.3133) / 2 + 0.3059
        tensor(1.0260)
    """
    check_dca(beta)
    check_reduction(reduction)
    batch = _batch(
        logits,
        target,
        ignore_index=ignore_index,
        global_batch=global_batch,
        validate_args=validate_args,
        confidence=True,
        backend=backend,
    )
    base = _kernel_base_loss(logits, batch) if batch.kernels else -batch.log_pt
    return _combine(base, _dca(batch, global_batch), beta, batch, reduction)


def mmce_loss(
    logits: Tensor,
    target: Tensor,
    *,
    lambda_: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "mean",
    global_batch: bool = False,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Cross-entropy plus ``lambda_`` times MMCE_m squared (:func:`mmce_penalty`).

    ``loss = mean_i (-log p_t) + lambda_ * MMCE_m^2``, the unweighted form of Kumar, Sarawagi
    and Jain, "Trainable Calibration Measures for Neural Networks from Kernel Mean Embeddings"
    (ICML 2018), as the PyTorch ``MMCE`` of Mukhoti et al. ("Calibrating Deep Neural Networks
    using Focal Loss", NeurIPS 2020) adds it, with its default ``lambda_ = 1``.

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1); positions are elements.
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        lambda_: the weight of the penalty, ``>= 0``.
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"mean"``, ``"none"`` or ``"sum"``, as in :func:`mdca_loss`.
        global_batch: the penalty of the batch of all ranks, as in :func:`mdca_loss`.
        validate_args: check target values and finite logits (device synchronisations).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the base loss by the fused kernels
            of :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error; the penalty stays PyTorch) or
            ``"torch"``.

    Raises:
        ValueError: ``lambda_`` negative or not finite; a bad ``reduction`` or ``target``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
        >>> mmce_loss(logits, torch.tensor([0, 1]))  # (0.1269 + 0.6931) / 2 + 0.0546
        tensor(0.4646)
    """
    check_mmce(lambda_)
    check_reduction(reduction)
    batch = _batch(
        logits,
        target,
        ignore_index=ignore_index,
        global_batch=global_batch,
        validate_args=validate_args,
        confidence=True,
        backend=backend,
    )
    base = _kernel_base_loss(logits, batch) if batch.kernels else -batch.log_pt
    return _combine(base, _mmce(batch, global_batch), lambda_, batch, reduction)
