"""Triton kernels of the target-probability family for ``[N, C]`` logits, and their autograd.

A member of the family is ``phi(log p_t)`` per row (:mod:`lightning_losses.functional._core`).
Its gradient is ``phi'(log p_t) * (onehot(t) - softmax(x))``: cross-entropy's, scaled row by
row. So two kernels serve the whole family:

- the forward reads each row's logits once (online log-sum-exp over blocks of columns, in
  float32 whatever the input dtype) and writes per row ``lse``, ``log p_t = x_t - lse``, with
  label smoothing ``s = sum_c w_c (-log p_c) = W (lse - x_0) - sum_c w_c (x_c - x_0)`` (``w``
  the class weights, all 1 without them, ``W = sum_c w_c``, ``x_0`` the row's first logit, which
  keeps the sum free of a common offset's cancellation), and on request the runner-up logit
  (the largest logit strictly below ``x_t``, dual focal's second statistic). Ignored rows
  (target ``-1`` here) give 0;
- ``phi`` runs in torch on the ``N``-vector ``log p_t`` (the family's own ``phi`` functions,
  value and derivative);
- the backward reads the logits once more and writes, in the input dtype,
  ``grad = softmax * (h W - g) - h w + g onehot(t)``, ``g = grad_out * phi'(log p_t)`` and
  ``h`` the upstream gradient of ``s``: nothing of size ``[N, C]`` is kept but the logits.

The kernels are plain functions, wrapped when first needed: in Triton's interpreter for CPU
tensors (``TRITON_INTERPRET=1``, how the tests run them), compiled by Triton for CUDA tensors.
This module imports Triton at import time when it is installed; without it the module still
imports (documentation, doctest collection) and running a kernel raises.

Source of the scheme: the online log-sum-exp of Milakov and Gimelshein, "Online normalizer
calculation for softmax" (2018), as in Liger-Kernel's cross-entropy kernel; the scaled gradient
is this package's ``phi`` design.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the kernels are defined but cannot run
    triton = None
    tl = None

__all__ = ["TritonTargetProbability", "backward_rows", "forward_rows", "prepare", "row_statistics"]

#: ``phi(log_p, **hyperparameters) -> (value, derivative)``: the family's ``phi`` functions
#: (:mod:`lightning_losses.functional.target_probability`; this layer sits below that one).
Phi = Callable[..., tuple[Tensor, Tensor]]


def _forward_kernel(
    logits_ptr,
    target_ptr,
    weight_ptr,
    lse_ptr,
    log_p_ptr,
    smooth_ptr,
    runner_up_ptr,
    runner_up_index_ptr,
    rows,
    columns,
    stride,
    total_ptr,
    HAS_WEIGHT: tl.constexpr,
    SMOOTHING: tl.constexpr,
    RUNNER_UP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Per row: ``lse``, ``log p_t``, the smoothing sum and the runner-up logit (see module)."""
    row = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = row < rows
    target = tl.load(target_ptr + row, mask=row_mask, other=-1)
    valid = row_mask & (target >= 0)
    row_start = logits_ptr + row.to(tl.int64) * stride
    x_t = tl.load(row_start + target, mask=valid, other=0.0).to(tl.float32)
    first = tl.load(row_start, mask=row_mask, other=0.0).to(tl.float32)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    weighted = tl.zeros([BLOCK_N], tl.float32)
    runner_up = tl.full([BLOCK_N], float("-inf"), tl.float32)
    runner_up_index = tl.full([BLOCK_N], 0, tl.int32)
    for start in range(0, columns, BLOCK_C):
        column = start + tl.arange(0, BLOCK_C)
        column_mask = column < columns
        mask = row_mask[:, None] & column_mask[None, :]
        x = tl.load(row_start[:, None] + column[None, :], mask=mask, other=0.0).to(tl.float32)
        x = tl.where(column_mask[None, :], x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
        if SMOOTHING:
            shifted = tl.where(column_mask[None, :], x - first[:, None], 0.0)
            if HAS_WEIGHT:
                w = tl.load(weight_ptr + column, mask=column_mask, other=0.0).to(tl.float32)
                shifted = shifted * w[None, :]
            weighted += tl.sum(shifted, axis=1)
        if RUNNER_UP:  # the first column of the largest logit strictly below x_t
            below = tl.where(x < x_t[:, None], x, float("-inf"))
            best, index = tl.max(below, axis=1, return_indices=True)
            runner_up_index = tl.where(best > runner_up, start + index, runner_up_index)
            runner_up = tl.maximum(runner_up, best)
    lse = m + tl.log(s)
    tl.store(lse_ptr + row, lse, mask=row_mask)
    tl.store(log_p_ptr + row, tl.where(valid, x_t - lse, 0.0), mask=row_mask)
    if SMOOTHING:
        weight_total = tl.load(total_ptr)
        smooth = weight_total * (lse - first) - weighted
        tl.store(smooth_ptr + row, tl.where(valid, smooth, 0.0), mask=row_mask)
    if RUNNER_UP:
        tl.store(runner_up_ptr + row, runner_up, mask=row_mask)
        tl.store(runner_up_index_ptr + row, runner_up_index, mask=row_mask)


def _backward_kernel(
    logits_ptr,
    target_ptr,
    weight_ptr,
    lse_ptr,
    scale_ptr,
    h_ptr,
    second_ptr,
    second_scale_ptr,
    grad_ptr,
    rows,
    columns,
    stride,
    grad_stride,
    total_ptr,
    HAS_WEIGHT: tl.constexpr,
    SMOOTHING: tl.constexpr,
    SECOND: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """``grad = softmax * (h W - g - g_j) - h w + g onehot(t) + g_j onehot(j)``, per row.

    In the gradient's dtype; ``h`` with ``SMOOTHING``, the second column ``j`` and its factor
    ``g_j`` with ``SECOND`` (dual focal), each 0 otherwise.
    """
    row = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = row < rows
    target = tl.load(target_ptr + row, mask=row_mask, other=-1)
    lse = tl.load(lse_ptr + row, mask=row_mask, other=0.0)
    scale = tl.load(scale_ptr + row, mask=row_mask, other=0.0)
    h = tl.zeros([BLOCK_N], tl.float32)
    factor = -scale
    if SMOOTHING:
        h = tl.load(h_ptr + row, mask=row_mask, other=0.0)
        factor = h * tl.load(total_ptr) - scale
    second = tl.full([BLOCK_N], -1, tl.int64)
    second_scale = tl.zeros([BLOCK_N], tl.float32)
    if SECOND:
        second = tl.load(second_ptr + row, mask=row_mask, other=-1)
        second_scale = tl.load(second_scale_ptr + row, mask=row_mask, other=0.0)
        factor = factor - second_scale
    row_start = logits_ptr + row.to(tl.int64) * stride
    grad_start = grad_ptr + row.to(tl.int64) * grad_stride
    for start in range(0, columns, BLOCK_C):
        column = start + tl.arange(0, BLOCK_C)
        column_mask = column < columns
        mask = row_mask[:, None] & column_mask[None, :]
        x = tl.load(row_start[:, None] + column[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.exp(x - lse[:, None]) * factor[:, None]
        if SMOOTHING:
            if HAS_WEIGHT:
                w = tl.load(weight_ptr + column, mask=column_mask, other=0.0).to(tl.float32)
                g = g - h[:, None] * w[None, :]
            else:
                g = g - h[:, None]
        g = tl.where(column[None, :] == target[:, None], g + scale[:, None], g)
        if SECOND:
            g = tl.where(column[None, :] == second[:, None], g + second_scale[:, None], g)
        tl.store(grad_start[:, None] + column[None, :], g.to(grad_ptr.dtype.element_ty), mask=mask)


#: The kernels by name (the ahead-of-time compile test reads this too).
KERNELS = {"forward": _forward_kernel, "backward": _backward_kernel}


@functools.cache
def kernel(name: str, interpret: bool) -> Any:
    """The kernel ``name`` wrapped for Triton's interpreter (CPU tensors) or its compiler (CUDA)."""
    if triton is None:
        raise RuntimeError("the Triton kernels need the triton package (pip install triton)")
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(KERNELS[name])
    from triton.runtime.jit import JITFunction

    return JITFunction(KERNELS[name])


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


#: Elements of one program's block: on a GPU, and under the interpreter (tests may lower it to
#: make the column loop take several steps).
GPU_TILE = 1 << 12
INTERPRETER_TILE = 1 << 16


def blocks(rows: int, columns: int, interpret: bool) -> tuple[int, int, int]:
    """``(BLOCK_N, BLOCK_C, num_warps)`` for ``[rows, columns]`` logits.

    On a GPU a program covers about 4096 elements (up to 4096 columns a step, several rows when
    the rows are short); under the interpreter, whose cost grows with programs times loop steps,
    blocks of up to 2**16 elements.

    Example:
        >>> blocks(32768, 1000, interpret=False)
        (4, 1024, 4)
        >>> blocks(8, 32001, interpret=False)
        (1, 4096, 8)
    """
    tile = INTERPRETER_TILE if interpret else GPU_TILE
    block_c = min(_next_power_of_two(columns), tile)
    block_n = max(1, min(_next_power_of_two(rows), tile // block_c))
    num_warps = 8 if block_c >= 4096 else 4
    return block_n, block_c, num_warps


def _total(weight: Tensor | None, columns: int, device: torch.device) -> Tensor:
    """``W = sum_c w_c`` (``C`` without weights) as a float32 scalar on the device: no sync."""
    if weight is None:
        return torch.full((1,), float(columns), dtype=torch.float32, device=device)
    return weight.sum().reshape(1)


def forward_rows(
    logits: Tensor,
    target: Tensor,
    weight: Tensor | None,
    smoothing: bool,
    runner_up: bool,
) -> dict[str, Tensor]:
    """Launch the forward kernel on prepared inputs; the statistics of :func:`row_statistics`."""
    rows, columns = logits.shape
    interpret = logits.device.type != "cuda"
    new = functools.partial(torch.empty, rows, dtype=torch.float32, device=logits.device)
    found = {"lse": new(), "log_p": new()}
    if smoothing:
        found["smooth"] = new()
    if runner_up:
        found["runner_up"] = new()
        found["runner_up_index"] = torch.zeros(rows, dtype=torch.long, device=logits.device)
    if rows == 0:
        return found
    block_n, block_c, num_warps = blocks(rows, columns, interpret)
    spare = found["lse"]  # passed where a statistic is not asked for (never written)
    kernel("forward", interpret)[(triton.cdiv(rows, block_n),)](
        logits,
        target,
        spare if weight is None else weight,
        found["lse"],
        found["log_p"],
        found.get("smooth", spare),
        found.get("runner_up", spare),
        found.get("runner_up_index", target),
        rows,
        columns,
        logits.stride(0),
        _total(weight, columns, logits.device),
        HAS_WEIGHT=weight is not None,
        SMOOTHING=smoothing,
        RUNNER_UP=runner_up,
        BLOCK_N=block_n,
        BLOCK_C=block_c,
        num_warps=num_warps,
    )
    return found


def backward_rows(
    logits: Tensor,
    target: Tensor,
    lse: Tensor,
    scale: Tensor,
    *,
    h: Tensor | None = None,
    weight: Tensor | None = None,
    second: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Launch the backward kernel: the gradient of the logits, in their dtype.

    ``grad = softmax * (h W - g - g_j) - h w + g onehot(t) + g_j onehot(j)`` per row, with
    ``g = scale``, the smoothing factor ``h`` (and the class weights ``w``, ``W = sum w``) and
    ``second = (j, g_j)``, each left out when ``None``. ``target`` is ``-1`` on ignored rows
    (whose ``scale``, ``h`` and ``g_j`` are 0), as :func:`_prepare` gives.
    """
    grad = torch.empty_like(logits)
    rows, columns = logits.shape
    if rows == 0:
        return grad
    interpret = logits.device.type != "cuda"
    block_n, block_c, num_warps = blocks(rows, columns, interpret)
    kernel("backward", interpret)[(triton.cdiv(rows, block_n),)](
        logits,
        target,
        lse if weight is None else weight,
        lse,
        scale.float().contiguous(),
        scale if h is None else h.float().contiguous(),
        target if second is None else second[0].contiguous(),
        scale if second is None else second[1].float().contiguous(),
        grad,
        rows,
        columns,
        logits.stride(0),
        grad.stride(0),
        _total(weight, columns, logits.device),
        HAS_WEIGHT=weight is not None,
        SMOOTHING=h is not None,
        SECOND=second is not None,
        BLOCK_N=block_n,
        BLOCK_C=block_c,
        num_warps=num_warps,
    )
    return grad


def prepare(logits: Tensor, target: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor]:
    """Logits with unit column stride, and the target with ``-1`` on ignored rows (int64)."""
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    target = target.long()
    if valid is not None:
        target = torch.where(valid, target, -1)
    return logits, target.contiguous()


def row_statistics(
    logits: Tensor,
    target: Tensor,
    *,
    valid: Tensor | None = None,
    weight: Tensor | None = None,
    smoothing: bool = False,
    runner_up: bool = False,
) -> dict[str, Tensor]:
    """Per-row statistics of ``[N, C]`` logits from one pass of the forward kernel (no grad).

    Returns ``[N]`` tensors: ``"lse"`` (``logsumexp(x)``), ``"log_p"`` (``x_t - lse``, 0 on
    ignored rows), with ``smoothing`` ``"smooth"`` (``sum_c w_c (-log p_c)``, 0 on ignored
    rows), with ``runner_up`` ``"runner_up"`` (the largest logit strictly below ``x_t``,
    ``-inf`` when there is none; dual focal's ``p_j = exp(runner_up - lse)``) and
    ``"runner_up_index"`` (its first column, int64; 0 when there is none), the others float32.

    Args:
        logits: ``[N, C]`` float32, float16 or bfloat16 logits, on a CUDA device (or a CPU
            under ``TRITON_INTERPRET=1``).
        target: ``[N]`` class indices.
        valid: bool ``[N]``, the rows not ignored (all when ``None``).
        weight: optional class weights ``w`` of the smoothing sum.
        smoothing: also return the smoothing sum.
        runner_up: also return the runner-up logit and its column.
    """
    logits, target = prepare(logits, target, valid)
    if weight is not None:
        weight = weight.to(device=logits.device, dtype=torch.float32).contiguous()
    return forward_rows(logits, target, weight, smoothing, runner_up)


class TritonTargetProbability(torch.autograd.Function):
    """``phi(log p_t)`` per row of ``[N, C]`` logits by the two kernels; the torch path's twin.

    The same arguments and results as ``_FusedTargetProbability`` in
    :mod:`lightning_losses.functional._core`: ``(logits, target, valid, phi, hyperparameters,
    smoothing, smooth_weight)`` with ``target`` 0 on the ignored rows that ``valid`` marks;
    returns ``phi(log p_t)`` (0 where ignored) and with ``smoothing`` also the smoothing term
    ``sum_c w_c (-log p_c)``, both float32. Saved for the backward: the logits, the target and
    three ``N``-vectors (``lse``, ``phi'``, the ignore mask).
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
        """One forward kernel, then ``phi`` on the ``N``-vector ``log p_t``."""
        logits, kernel_target = prepare(logits, target, valid)
        weight = None
        if smooth_weight is not None:
            weight = smooth_weight.to(device=logits.device, dtype=torch.float32).contiguous()
        found = forward_rows(logits, kernel_target, weight, smoothing, False)
        log_p = found["log_p"]
        zero = torch.zeros((), dtype=log_p.dtype, device=log_p.device)
        with torch.autocast(logits.device.type, enabled=False):
            value, derivative = phi(log_p, **hyperparameters)
        derivative = torch.where(valid, derivative, zero)
        value = torch.where(valid, value, zero)
        ctx.smoothing = smoothing
        ctx.save_for_backward(logits, kernel_target, found["lse"], derivative, valid, weight)
        if not smoothing:
            return value
        return value, found["smooth"]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grad_outputs: Tensor) -> tuple[Tensor | None, ...]:
        """One backward kernel: the gradient of the logits, in their dtype."""
        logits, target, lse, derivative, valid, weight = ctx.saved_tensors
        h = torch.where(valid, grad_outputs[1].float(), 0.0) if ctx.smoothing else None
        scale = grad_outputs[0].float() * derivative
        grad = backward_rows(logits, target, lse, scale, h=h, weight=weight)
        return grad, None, None, None, None, None, None
