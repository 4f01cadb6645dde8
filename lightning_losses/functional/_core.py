"""The shared core of the target-probability family and the reductions.

A member of the family is ``phi(log p_t)`` for a scalar function ``phi``. Its gradient with
respect to the logits is ``phi'(log p_t) * (onehot(t) - softmax(x))`` (``phi'`` taken in
``log p``), exactly the gradient of cross-entropy scaled row by row. For ``[N, C]`` logits one
autograd function does it all a chunk of rows at a time (log-softmax in the forward, softmax
recomputed in the backward), so the loss costs what cross-entropy costs in time and less in
memory. For ``[N, C, *]`` logits ``log p_t`` comes from PyTorch's cross-entropy kernel
(``reduction="none"``) and ``phi`` is applied to that vector in a small autograd function whose
backward multiplies by ``phi'``. Either way nothing after ``log p_t`` touches a second
``[N, C]`` tensor.

Each ``phi`` returns its value and its derivative together, written in log space so that neither
has a ``0 * inf`` (see :mod:`lightning_losses.functional.target_probability`).

Label smoothing (``eps``) adds ``eps / C * sum_c w_c (-log p_c)`` to ``(1 - eps)`` times the
weighted loss. In the fused path that sum is taken from each chunk's log-softmax (on a CPU in
blocks small enough to stay in cache) and its gradient ``W softmax - w`` joins the backward's
one pass over the chunk, so smoothing keeps no ``[N, C]`` tensor either.

Small ``[N, C]`` logits (at most :data:`SMALL_ELEMENTS` elements) take the ``[N, C, *]`` path
instead: there a call's cost is the Python around the kernels, not the passes over the logits,
and PyTorch's fused cross-entropy kernels are the fewest calls. Cross-entropy itself is then
:func:`torch.nn.functional.cross_entropy` (weights, ``ignore_index``, label smoothing and the
reductions are its own; unweighted and unsmoothed on a CPU it is called straight from the
loss function, :func:`quick_cross_entropy`), and on a CPU that kernel's check of the target
values is the check (an out-of-range target is reported with the package's message, found only
once the kernel has raised); the finiteness of the logits costs one sum and one
synchronisation. On a CPU, rows of 3 to 15 classes of every loss but plain cross-entropy go
instead to :func:`lightning_losses.functional._small.small_rows` (one autograd function around
the log-softmax of the transpose, which PyTorch's kernel vectorises for such short rows; see
:func:`takes_small_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_losses.functional._small import TRANSPOSED_CLASSES, small_rows
from lightning_losses.functional.checks import (
    check_class_indices,
    check_class_vector,
    check_class_weights,
    check_finite,
    check_index_target,
    check_reduction,
)
from lightning_losses.kernels.availability import use_kernels

#: ``phi(log_p, **hyperparameters) -> (value, derivative)``, both of the shape of ``log_p``.
Phi = Callable[..., tuple[Tensor, Tensor]]


def phi_cross_entropy(log_p: Tensor) -> tuple[Tensor, Tensor]:
    """``-log p``.

    The core knows this ``phi``: cross-entropy outside the fused path is
    :func:`torch.nn.functional.cross_entropy` itself.

    Example:
        >>> phi_cross_entropy(torch.tensor([-0.5]))
        (tensor([0.5000]), tensor([-1.]))
    """
    return -log_p, torch.full_like(log_p, -1.0)


class _ApplyPhi(torch.autograd.Function):
    """``phi`` on a vector, with the derivative ``phi`` itself supplies."""

    @staticmethod
    def forward(ctx: Any, log_p: Tensor, phi: Phi, hyperparameters: dict[str, Any]) -> Tensor:
        value, derivative = phi(log_p, **hyperparameters)
        ctx.save_for_backward(derivative)
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, None, None]:
        (derivative,) = ctx.saved_tensors
        return grad_output * derivative, None, None


def apply_phi(log_p: Tensor, phi: Phi, **hyperparameters: Any) -> Tensor:
    """Return ``phi(log_p)`` whose backward multiplies by ``phi'(log_p)``."""
    if log_p.requires_grad:
        return _ApplyPhi.apply(log_p, phi, hyperparameters)
    return phi(log_p, **hyperparameters)[0]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are computed and returned in float32; others keep their dtype."""
    return torch.promote_types(dtype, torch.float32)


#: Elements of one chunk of logits in the fused path (32 MiB of float32): large enough that the
#: loop and the thread pool cost nothing per chunk, small next to the [N, C] tensors it spares.
CHUNK_ELEMENTS = 1 << 23


#: Elements of one chunk of the smoothed forward on a CPU (2 MiB of float32): the row sums of
#: the smoothing term then read a log-softmax still in cache, which makes them nearly free
#: (measured on one core: 3 ms more per 8192 x 1000 logits with 32 MiB chunks, none with 2 MiB).
CPU_SMOOTHING_ELEMENTS = 1 << 19


def row_chunks(rows: int, columns: int, elements: int | None = None) -> list[tuple[int, int]]:
    """``(start, stop)`` row ranges of about ``elements`` (``CHUNK_ELEMENTS``) elements each."""
    step = max(1, (CHUNK_ELEMENTS if elements is None else elements) // max(columns, 1))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


class _FusedTargetProbability(torch.autograd.Function):
    """``phi(log p_t)`` per row of 2-D logits, a chunk of rows at a time.

    Forward takes each chunk's log-softmax, keeps only the target's entry and drops the rest;
    it saves ``phi'(log p_t)``, N numbers. Backward recomputes each chunk's softmax and writes
    ``g_i * (onehot(t_i) - softmax(x_i))`` into the gradient, ``g_i = grad_i * phi'(log p_i)``.
    Unlike ``F.cross_entropy`` it never keeps an ``[N, C]`` log-softmax (nor a zero-filled
    ``[N, C]`` gradient of it), so the extra memory is the logits' gradient plus one chunk.
    Half-precision chunks are computed in float32 (a chunk at a time, not a full upcast).

    With ``smoothing`` it also returns the label-smoothing term ``s_i = sum_c w_c (-log p_ic)``
    (``w`` the class weights ``smooth_weight``, all 1 when ``None``; 0 where ignored), summed
    from the same chunk's log-softmax. Its gradient ``W softmax(x_i) - w`` (``W = sum_c w_c``)
    is added in the same pass of the backward: ``softmax * (h_i W - g_i) - h_i w`` plus ``g_i``
    at the target, ``h_i`` the upstream gradient of ``s_i``. Nothing of size ``[N, C]`` is
    kept for it either (the ignore mask and ``w`` are).
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        target: Tensor,
        valid: Tensor,
        phi: Phi,
        hyperparameters: dict[str, Any],
        smoothing: bool = False,
        smooth_weight: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        dtype = compute_dtype(logits.dtype)
        rows, columns = logits.shape
        target_log_p = torch.empty(rows, dtype=dtype, device=logits.device)
        smooth = torch.empty(rows, dtype=dtype, device=logits.device) if smoothing else None
        if smooth_weight is not None:
            smooth_weight = smooth_weight.to(dtype)
        row_weight = None
        if smoothing:  # a matrix-vector product sums rows in half the time of sum(dim=1) (CPU)
            row_weight = smooth_weight
            if row_weight is None:
                row_weight = torch.ones(columns, dtype=dtype, device=logits.device)
        elements = CHUNK_ELEMENTS
        if smoothing and logits.device.type == "cpu":
            elements = min(elements, CPU_SMOOTHING_ELEMENTS)
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in row_chunks(rows, columns, elements):
                log_softmax = torch.log_softmax(logits[start:stop].to(dtype), dim=1)
                target_log_p[start:stop] = log_softmax.gather(1, target[start:stop, None])[:, 0]
                if smooth is not None and row_weight is not None:
                    torch.mv(log_softmax, row_weight, out=smooth[start:stop])
            zero = torch.zeros((), dtype=dtype, device=logits.device)
            log_p = torch.where(valid, target_log_p, zero)
            value, derivative = phi(log_p, **hyperparameters)
        derivative = torch.where(valid, derivative, zero)
        value = torch.where(valid, value, zero)
        ctx.smoothing = smoothing
        if smooth is None:  # not smoothing
            ctx.save_for_backward(logits, target, derivative)
            return value
        ctx.save_for_backward(logits, target, derivative, valid, smooth_weight)
        return value, torch.where(valid, smooth.neg_(), zero)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grad_outputs: Tensor) -> tuple[Tensor | None, ...]:
        logits, target, derivative, *smoothing = ctx.saved_tensors
        # d log p_t / dx = onehot - softmax; the softmax is recomputed chunk by chunk.
        scale = (grad_outputs[0] * derivative)[:, None]
        if ctx.smoothing:  # d s / dx = W softmax - w: one factor per row on the softmax
            valid, smooth_weight = smoothing
            h = torch.where(valid, grad_outputs[1], 0).to(scale.dtype)[:, None]
            total = logits.shape[1] if smooth_weight is None else smooth_weight.sum()
            factor = h * total - scale
        else:
            factor = -scale
        grad = torch.empty_like(logits)
        rows, columns = logits.shape
        with torch.autocast(logits.device.type, enabled=False):
            for start, stop in row_chunks(rows, columns):
                softmax = torch.softmax(logits[start:stop].to(scale.dtype), dim=1)
                # written straight into the gradient when the dtypes agree (no extra copy)
                out = grad[start:stop] if grad.dtype == softmax.dtype else softmax
                if not ctx.smoothing:
                    torch.mul(softmax, factor[start:stop], out=out)
                elif smooth_weight is None:
                    torch.addcmul(-h[start:stop], softmax, factor[start:stop], out=out)
                else:
                    torch.mul(softmax, factor[start:stop], out=out)
                    out.addr_(h[start:stop, 0], smooth_weight, alpha=-1)
                out.scatter_add_(1, target[start:stop, None], scale[start:stop])
                if out is softmax:
                    grad[start:stop] = softmax
        return grad, None, None, None, None, None, None


def target_log_prob(logits: Tensor, target: Tensor, ignore_index: int) -> Tensor:
    """``log softmax(logits)[t]`` per element, ``[N, *]``, in float32 at least; 0 where ignored.

    ``target`` may hold any integer dtype (PyTorch's kernel wants int64: it gets a copy).
    """
    target = target.long()
    log_p = -F.cross_entropy(logits, target, reduction="none", ignore_index=ignore_index)
    return log_p.to(compute_dtype(logits.dtype))


def reduce_loss(loss: Tensor, reduction: str, denominator: Tensor | None = None) -> Tensor:
    """Reduce per-element losses that are already zero where ignored.

    ``"mean"`` divides by ``denominator`` (the number of non-ignored elements, or the sum of their
    class weights); a batch with nothing to average gives 0 and a zero gradient, not NaN.
    """
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    if denominator is None:
        return total / max(loss.numel(), 1)
    if not denominator.is_floating_point():  # a count: max(count, 1) is where(count > 0, ...)
        return total / denominator.clamp_min(1)
    denominator = denominator.to(total.dtype)
    return total / torch.where(denominator > 0, denominator, torch.ones_like(denominator))


#: 2-D logits of at most this many elements (512 KiB of float32) take PyTorch's kernels (the
#: ``[N, C, *]`` path) rather than the fused chunks: there the calls around the kernels cost
#: more than the passes over the logits that fusing saves, and the ``[N, C]`` log-softmax that
#: autograd keeps is small. Measured on one CPU thread (forward + backward, fused over
#: unfused): cross-entropy 3.3x at [256, 100], 1.6x at [1024, 100], 1.3x at [256, 1000]; focal
#: loss 1.7x, 1.6x, 1.0x.
SMALL_ELEMENTS = 1 << 17


def fused_rows(
    logits: Tensor,
    target: Tensor,
    valid: Tensor,
    phi: Phi,
    hyperparameters: dict[str, Any],
    eps: float,
    weight: Tensor | None,
    kernels: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The fused ``[N, C]`` path: ``phi(log p_t)`` per row and, with ``eps > 0``, the smoothing.

    Returns ``(loss, smooth)``: ``phi(log p_t)`` (0 where ``valid`` is false) and the
    label-smoothing term ``sum_c w_c (-log p_c)`` (``None`` when ``eps == 0``), each ``[N]``,
    from :class:`_FusedTargetProbability`, or with ``kernels`` from its Triton twin
    (:mod:`lightning_losses.kernels.target_probability`, imported only then).
    """
    fused: Any = _FusedTargetProbability
    if kernels:
        from lightning_losses.kernels.target_probability import TritonTargetProbability

        fused = TritonTargetProbability
    safe_target = torch.where(valid, target, 0)
    if eps == 0:
        return fused.apply(logits, safe_target, valid, phi, hyperparameters), None
    loss, smooth = fused.apply(logits, safe_target, valid, phi, hyperparameters, True, weight)
    return loss, smooth


def _finite(x: Tensor, loss: Tensor | None = None) -> bool:
    """Whether the sum of the logits ``x`` (and the scalar ``loss``) is finite.

    A finite sum means finite logits (NaN and inf propagate through a sum); a non-finite one
    may still be an overflow of finite values, or a non-finite ``loss``, for the caller to sort
    out. One reduction; off the CPU one synchronisation (the CPU reads each scalar alone).
    """
    total = x.detach().sum()
    if x.is_cpu:
        return math.isfinite(total.item()) and (loss is None or math.isfinite(loss.item()))
    if loss is not None:
        total = total + loss.detach()
    return math.isfinite(total.item())


def _element_weights(
    target: Tensor, valid: Tensor, weight: Tensor | None, dtype: torch.dtype
) -> Tensor | None:
    """``w_t`` per element (0 where ignored), or ``None`` without ``weight``."""
    if weight is None:
        return None
    return weight.to(dtype)[torch.where(valid, target, 0)] * valid


def _mean_denominator(target: Tensor, weight: Tensor | None, ignore_index: int) -> Tensor:
    """The denominator of cross-entropy's ``"mean"``: the non-ignored count or their weights."""
    valid = target != ignore_index
    element_weight = _element_weights(target, valid, weight, torch.float64)
    return valid.sum() if element_weight is None else element_weight.sum()


def _cross_entropy(
    x: Tensor,
    target: Tensor,
    weight: Tensor | None,
    ignore_index: int,
    reduction: str,
    eps: float,
    validate_args: bool,
) -> Tensor:
    """Cross-entropy by :func:`torch.nn.functional.cross_entropy`; a "mean" of nothing is 0.

    PyTorch's "mean" of a batch whose denominator (non-ignored count, or their weights' sum) is
    0 is NaN; here it is the sum over the batch (0 without smoothing), as :func:`reduce_loss`
    gives. With ``validate_args`` the finiteness of the logits and of the mean are read
    together, and the denominator is looked at only when that fails.
    """
    if reduction == "mean" and not validate_args and not x.is_cpu:  # no synchronisation
        total = F.cross_entropy(
            x, target, weight, ignore_index=ignore_index, reduction="sum", label_smoothing=eps
        )
        return reduce_loss(total, "mean", _mean_denominator(target, weight, ignore_index))
    loss = F.cross_entropy(
        x, target, weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=eps
    )
    if validate_args:
        if _finite(x, loss if reduction == "mean" else None):
            return loss
        check_finite("logits", x)
    elif reduction != "mean" or math.isfinite(loss.item()):  # reading a CPU scalar is free
        return loss
    if reduction == "mean" and not bool(_mean_denominator(target, weight, ignore_index) > 0):
        loss = F.cross_entropy(
            x, target, weight, ignore_index=ignore_index, reduction="sum", label_smoothing=eps
        )
    return loss


def quick_cross_entropy(
    logits: Tensor,
    target: Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    validate_args: bool,
) -> Tensor | None:
    """Unweighted cross-entropy of small 2-D CPU logits in the fewest calls, or ``None``.

    The common case of :func:`~lightning_losses.functional.cross_entropy` at small sizes,
    where a call costs its Python, not its arithmetic: float32 or float64 ``[N, C]`` CPU logits
    of at most :data:`SMALL_ELEMENTS` elements, int64 targets, no smoothing (``0.0``; PyTorch's
    smoothed kernel is no faster than :func:`~._small.small_rows`), a known ``reduction``,
    outside CPU autocast. It is
    :func:`torch.nn.functional.cross_entropy` and the checks of :func:`_cross_entropy` (with
    ``validate_args``, the finiteness of the logits' sum and of the mean), nothing else.
    ``None`` means "take the general path": the case is another one, or the kernel raised (a
    target out of range, a shape that does not match), or a value is not finite (bad logits,
    or a mean of nothing), each of which the general path reports or handles as documented.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0, 0.0]])
        >>> quick_cross_entropy(logits, torch.tensor([0]), -100, "mean", 0.0, True)
        tensor(0.2395)
        >>> quick_cross_entropy(logits, torch.tensor([3]), -100, "mean", 0.0, True) is None
        True
    """
    if not (
        logits.is_cpu
        and logits.dim() == 2
        and target.dtype is torch.int64
        and logits.dtype in _COMPUTE_DTYPES
        and type(label_smoothing) is float
        and label_smoothing == 0.0
        and reduction in _REDUCTIONS
        and logits.numel() <= SMALL_ELEMENTS
        and not torch.is_autocast_enabled("cpu")
    ):
        return None
    try:
        loss = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)
    except (IndexError, RuntimeError, TypeError, ValueError):
        return None
    if validate_args:
        return loss if _finite(logits, loss if reduction == "mean" else None) else None
    return loss if reduction != "mean" or math.isfinite(loss.item()) else None


#: The reductions :func:`quick_cross_entropy` takes (the general path checks the others).
_REDUCTIONS = ("mean", "sum", "none")


class _PhiReduced(torch.autograd.Function):
    """``w_t * phi(-nll)`` reduced, in one node: ``phi``, the weights and the reduction.

    ``nll`` is ``-log p_t`` from PyTorch's kernel (0 where ignored, where ``phi(0) = 0`` for
    every loss of the family), ``element_weight`` is ``w_t`` (0 where ignored) or ``None``,
    and ``denominator`` the divisor of ``"mean"``: a count (an ``int``, or an integer tensor
    off the CPU) or a sum of weights (a tensor); see :func:`reduce_loss` for its zero. One
    autograd node instead of one per operation: on small inputs each node costs more than its
    arithmetic. The backward is ``-w_t phi'(-nll)`` times the upstream gradient (divided by the
    denominator for ``"mean"``); the ignored elements' gradients are dropped by the nll
    kernel's backward. Once differentiable: the derivative is saved, not a graph.
    """

    @staticmethod
    def forward(
        ctx: Any,
        nll: Tensor,
        element_weight: Tensor | None,
        denominator: Tensor | int | None,
        reduction: str,
        phi: Phi,
        hyperparameters: dict[str, Any],
    ) -> Tensor:
        value, derivative = phi(nll.neg(), **hyperparameters)
        if element_weight is not None:
            value = value * element_weight
            derivative = derivative * element_weight
        ctx.denominator = None
        if reduction == "mean" and denominator is not None:
            if not isinstance(denominator, Tensor):
                denominator = max(denominator, 1)
            elif denominator.is_floating_point():  # a sum of weights: 1 where it is 0
                denominator = torch.where(denominator > 0, denominator, 1.0)
            else:
                denominator = denominator.clamp_min(1)
            ctx.denominator = denominator
            ctx.save_for_backward(derivative)
            return value.sum() / denominator
        ctx.save_for_backward(derivative)
        return value if reduction == "none" else value.sum()

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled():  # create_graph=True: PyTorch's error for a second order
            return _PhiReduced._once_differentiable_backward(ctx, grad_output)
        (derivative,) = ctx.saved_tensors
        grad = torch.mul(derivative, grad_output)
        if ctx.denominator is not None:
            grad = grad.div_(ctx.denominator)
        return grad.neg_(), None, None, None, None, None

    @staticmethod
    @torch.autograd.function.once_differentiable
    def _once_differentiable_backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        with torch.no_grad():
            return _PhiReduced.backward(ctx, grad_output)


def _phi_loss(
    x: Tensor,
    target: Tensor,
    phi: Phi,
    hyperparameters: dict[str, Any],
    eps: float,
    weight: Tensor | None,
    ignore_index: int,
    reduction: str,
    weighted_mean: bool,
    validate_args: bool,
) -> Tensor:
    """``w_t * phi(log p_t)`` (plus the smoothing term) reduced, from PyTorch's kernels."""
    if eps == 0:
        nll = F.cross_entropy(x, target, ignore_index=ignore_index, reduction="none")
        if validate_args and not _finite(x):
            check_finite("logits", x)
        if x.is_cpu and ignore_index < 0 and target.numel() and int(target.min()) >= 0:
            # nothing ignored (the kernel let only [0, C) and ignore_index through): no mask
            element_weight = None if weight is None else weight[target]
            count: Tensor | int = target.numel()
        else:
            valid = target != ignore_index
            element_weight = _element_weights(target, valid, weight, x.dtype)
            count = int(valid.sum()) if x.is_cpu else valid.sum()
        denominator = None
        if reduction == "mean":
            weighted = element_weight is not None and weighted_mean
            denominator = element_weight.sum() if weighted else count  # type: ignore[union-attr]
        return _PhiReduced.apply(nll, element_weight, denominator, reduction, phi, hyperparameters)
    valid = target != ignore_index
    log_p = torch.log_softmax(x, dim=1)  # one log-softmax gives both terms
    nll = F.nll_loss(log_p, target, ignore_index=ignore_index, reduction="none")
    if validate_args and not _finite(x):
        check_finite("logits", x)
    if weight is None:
        smooth = log_p.sum(dim=1)
    else:
        smooth = (log_p * weight.view(-1, *[1] * (x.dim() - 2))).sum(dim=1)
    smooth = torch.where(valid, smooth.neg(), 0.0)
    loss = _PhiReduced.apply(nll, None, None, "none", phi, hyperparameters)
    return _weigh_and_reduce(
        loss, smooth, target, valid, weight, eps, x.shape[1], reduction, weighted_mean
    )


def _unfused_loss(logits: Tensor, *arguments: Any) -> Tensor:
    """:func:`_unfused` (same arguments) outside autocast: computed in float32 at least."""
    device_type = "cpu" if logits.is_cpu else logits.device.type
    if torch.is_autocast_enabled(device_type):
        with torch.autocast(device_type, enabled=False):
            return _unfused(logits, *arguments)
    return _unfused(logits, *arguments)


def _unfused(
    logits: Tensor,
    target: Tensor,
    phi: Phi,
    hyperparameters: dict[str, Any],
    weight: Tensor | None,
    weight_name: str,
    ignore_index: int,
    reduction: str,
    eps: float,
    validate_args: bool,
    weighted_mean: bool,
) -> Tensor:
    """The loss from PyTorch's cross-entropy kernels: ``[N, C, *]`` and small ``[N, C]``.

    Cross-entropy is :func:`torch.nn.functional.cross_entropy`; another ``phi`` is applied to
    its ``-log p_t`` (``reduction="none"``). On a CPU the kernel's own check of the targets
    is the check (its error is replaced by the package's); elsewhere (a CUDA kernel asserts)
    the targets are checked first.
    """
    if validate_args and not logits.is_cpu:
        check_class_indices("target", target, logits.shape[1], ignore_index=ignore_index)
    x = logits if logits.dtype in _COMPUTE_DTYPES else logits.to(compute_dtype(logits.dtype))
    if target.dtype != torch.int64:
        target = target.long()
    if weight is not None:
        weight = weight.to(x.dtype)
    try:
        if phi is phi_cross_entropy and weighted_mean:
            loss = _cross_entropy(x, target, weight, ignore_index, reduction, eps, validate_args)
        else:
            loss = _phi_loss(
                x,
                target,
                phi,
                hyperparameters,
                eps,
                weight,
                ignore_index,
                reduction,
                weighted_mean,
                validate_args,
            )
    except (IndexError, RuntimeError):  # on a CPU, a target out of range: the package's error
        check_class_indices("target", target, x.shape[1], ignore_index=ignore_index)
        raise
    if validate_args and weight is not None:
        check_class_weights(weight_name, weight)
    return loss


#: The dtypes the losses compute in (half precision is computed in float32).
_COMPUTE_DTYPES = (torch.float32, torch.float64)


def _weigh_and_reduce(
    loss: Tensor,
    smooth: Tensor | None,
    target: Tensor,
    valid: Tensor,
    weight: Tensor | None,
    eps: float,
    classes: int,
    reduction: str,
    weighted_mean: bool,
) -> Tensor:
    """``w_t * loss`` (plus the smoothing term), reduced; see :func:`target_probability_loss`."""
    element_weight = _element_weights(target, valid, weight, loss.dtype)
    if element_weight is None:
        denominator = valid.sum()
    else:
        loss = loss * element_weight
        denominator = element_weight.sum() if weighted_mean else valid.sum()
    if smooth is not None:
        loss = (1.0 - eps) * loss + (eps / classes) * smooth
    return reduce_loss(loss, reduction, denominator)


def takes_small_rows(logits: Tensor, phi: Phi, eps: float, weighted_mean: bool) -> bool:
    """Whether the loss goes through :func:`~._small.small_rows`: small 2-D CPU logits.

    At most :data:`SMALL_ELEMENTS` elements, at least one row, rows of 3 to 15 classes (whose
    log-softmax PyTorch's CPU kernel does not vectorise: :data:`~._small.TRANSPOSED_CLASSES`),
    outside CPU autocast; not plain cross-entropy, which is
    :func:`torch.nn.functional.cross_entropy` itself. Measured on one CPU thread (forward +
    backward of the modules, each timed after a call of itself): 6-8% less time than the
    ``[N, C, *]`` path for focal loss, Poly-1, gamma cross-entropy and smoothed cross-entropy
    at ``[100, 10]``, within 3% at ``[32, 10]``, 2-7% more at ``[256, 100]`` (hence the range).

    Example:
        >>> from lightning_losses.functional.target_probability import phi_focal
        >>> takes_small_rows(torch.zeros(100, 10), phi_focal, 0.0, False)
        True
        >>> takes_small_rows(torch.zeros(100, 10), phi_cross_entropy, 0.0, True)
        False
    """
    return (
        logits.dim() == 2
        and logits.shape[1] in TRANSPOSED_CLASSES
        and logits.is_cpu
        and 0 < logits.numel() <= SMALL_ELEMENTS
        and not (phi is phi_cross_entropy and weighted_mean and eps == 0)
        and not torch.is_autocast_enabled("cpu")
    )


def target_probability_loss(
    logits: Tensor,
    target: Tensor,
    phi: Phi,
    *,
    weight: Tensor | Sequence[float] | None = None,
    weight_name: str = "weight",
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    validate_args: bool = True,
    weighted_mean: bool = True,
    backend: str = "auto",
    **hyperparameters: Any,
) -> Tensor:
    """``weight_t * phi(log p_t)`` per element, reduced; the engine of the family.

    With ``label_smoothing = eps > 0`` the per-element loss is

        (1 - eps) * w_t * phi(log p_t) + eps / C * sum_c w_c * (-log p_c)

    (``w`` the class weights, all 1 without ``weight``): for ``phi = -log p`` the cross-entropy
    against ``(1 - eps) onehot(t) + eps / C``, as in :func:`torch.nn.functional.cross_entropy`.
    ``"mean"`` still divides by the sum of ``w_t`` over the non-ignored elements. For ``[N, C]``
    logits the smoothing term comes from the fused chunks (no ``[N, C]`` tensor kept for
    backward); for ``[N, C, *]`` (and small ``[N, C]``) from one log-softmax of the logits,
    kept by autograd.

    Args:
        logits: ``[N, C, *]`` unnormalised scores.
        target: ``[N, *]`` class indices, or ``ignore_index``.
        phi: ``phi(log_p, **hyperparameters) -> (value, derivative)``.
        weight: optional per-class factor ``[C]``, finite and ``>= 0``. ``"mean"`` then divides
            by the sum of the weights of the non-ignored elements, as
            :func:`torch.nn.functional.cross_entropy` (0 when that sum is 0).
        weight_name: the caller's name of ``weight``, for error messages (focal: ``alpha``).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.
        label_smoothing: ``eps`` in ``[0, 1)``, checked by the caller; 0 leaves the loss as it
            is (same path, same numbers).
        validate_args: check target values, that the logits are finite and that the weights
            are finite and ``>= 0`` (costs a device synchronisation).
        weighted_mean: ``"mean"`` divides by the sum of ``w_t`` (cross-entropy's convention);
            ``False``: by the number of non-ignored elements, the weight being a factor of the
            formula (focal loss's ``alpha``).
        backend: ``"auto"`` (the Triton kernels of :mod:`lightning_losses.kernels` for
            ``[N, C]`` CUDA logits when Triton imports and
            :data:`~lightning_losses.kernels.availability.AUTO_USES_KERNELS` is on, the torch
            path elsewhere), ``"torch"`` or ``"triton"`` (the kernels; on CPU tensors only
            under ``TRITON_INTERPRET=1``, else a one-line error). On the kernel path the value
            checks cost one synchronisation (none with ``validate_args=False``).
        **hyperparameters: passed to ``phi``.
    """
    check_reduction(reduction)
    check_index_target(logits, target, ignore_index=ignore_index, validate_args=False)
    if weight is not None:
        weight = check_class_vector(weight_name, weight, logits, validate_args=False)
    eps = float(label_smoothing)
    kernels = use_kernels(logits, backend)
    if not kernels and takes_small_rows(logits, phi, eps, weighted_mean):
        return small_rows(
            logits,
            target,
            None if phi is phi_cross_entropy and weighted_mean else phi,
            hyperparameters,
            weight,
            weight_name,
            ignore_index,
            reduction,
            eps,
            validate_args,
            weighted_mean,
        )
    if not kernels and (logits.dim() > 2 or logits.numel() <= SMALL_ELEMENTS):
        return _unfused_loss(
            logits,
            target,
            phi,
            hyperparameters,
            weight,
            weight_name,
            ignore_index,
            reduction,
            eps,
            validate_args,
            weighted_mean,
        )
    if validate_args and kernels:  # one synchronisation for every check
        from lightning_losses.functional._kernel_checks import check_kernel_inputs

        check_kernel_inputs(
            logits, target, ignore_index=ignore_index, weight=weight, weight_name=weight_name
        )
    elif validate_args:
        check_class_indices("target", target, logits.shape[1], ignore_index=ignore_index)
        check_finite("logits", logits)
        if weight is not None:
            check_class_weights(weight_name, weight)
    valid = target != ignore_index
    loss, smooth = fused_rows(logits, target, valid, phi, hyperparameters, eps, weight, kernels)
    return _weigh_and_reduce(
        loss, smooth, target, valid, weight, eps, logits.shape[1], reduction, weighted_mean
    )
