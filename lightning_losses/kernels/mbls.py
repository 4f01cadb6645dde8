"""Margin-based label smoothing (MbLS) on ``[N, C]`` logits: two Triton kernels and their autograd.

MbLS (Liu et al., CVPR 2022) is, per row, with ``M = max_j x_j`` and ``C`` classes::

    loss = -log p_t + alpha / C * sum_k relu(M - x_k - margin)

Its gradient is cross-entropy's plus the hinge's: ``G (softmax - onehot(t)) + H (K onehot(a) -
active)``, ``G`` the upstream gradient, ``H = G alpha / C``, ``active_k = [M - x_k - margin >
0]``, ``K = sum_k active_k`` and ``a`` the first column of the maximum (the one
``max(dim=1)`` returns, as the authors' code and the torch path take it).

- The forward kernel reads each row twice in one program: an online log-sum-exp with the row
  maximum and its first column, then the hinge sum and the count ``K`` against that maximum.
  It writes ``N``-vectors only (``lse``, ``log p_t``, ``M``, ``a``, the hinge sum, ``K``).
- The backward kernel reads the row once and writes the whole gradient, in the logits' dtype.

Everything is float32 after the load, whatever the input dtype (float32, float16, bfloat16).
The torch path's twin is ``_FusedMarginLoss`` in :mod:`lightning_losses.functional.margin`;
the hinge's active set is computed with the same float32 operations, ``(M - x) - margin > 0``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from lightning_losses.kernels.target_probability import blocks, prepare

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the kernels are defined but cannot run
    triton = None
    tl = None

__all__ = ["KERNELS", "TritonMbLS", "kernel", "mbls_rows"]


def _forward_kernel(
    logits_ptr,
    target_ptr,
    lse_ptr,
    log_p_ptr,
    maximum_ptr,
    argmax_ptr,
    hinge_ptr,
    count_ptr,
    rows,
    columns,
    stride,
    margin,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Per row: ``lse``, ``log p_t``, ``M``, its first column, the hinge sum and ``K``."""
    row = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = row < rows
    target = tl.load(target_ptr + row, mask=row_mask, other=-1)
    valid = row_mask & (target >= 0)
    row_start = logits_ptr + row.to(tl.int64) * stride
    x_t = tl.load(row_start + target, mask=valid, other=0.0).to(tl.float32)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    argmax = tl.zeros([BLOCK_N], tl.int32)
    for start in range(0, columns, BLOCK_C):
        column = start + tl.arange(0, BLOCK_C)
        column_mask = column < columns
        mask = row_mask[:, None] & column_mask[None, :]
        x = tl.load(row_start[:, None] + column[None, :], mask=mask, other=0.0).to(tl.float32)
        x = tl.where(column_mask[None, :], x, float("-inf"))
        best = tl.max(x, axis=1)
        first = tl.min(tl.where(x == best[:, None], column[None, :], columns), axis=1)
        argmax = tl.where(best > m, first, argmax)  # strictly: an earlier block wins a tie
        m_new = tl.maximum(m, best)
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    hinge = tl.zeros([BLOCK_N], tl.float32)
    count = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, columns, BLOCK_C):  # the second read of the row (cache-resident)
        column = start + tl.arange(0, BLOCK_C)
        column_mask = column < columns
        mask = row_mask[:, None] & column_mask[None, :]
        x = tl.load(row_start[:, None] + column[None, :], mask=mask, other=0.0).to(tl.float32)
        distance = (m[:, None] - x) - margin
        active = (distance > 0.0) & column_mask[None, :]
        hinge += tl.sum(tl.where(active, distance, 0.0), axis=1)
        count += tl.sum(active.to(tl.float32), axis=1)
    lse = m + tl.log(s)
    tl.store(lse_ptr + row, lse, mask=row_mask)
    tl.store(log_p_ptr + row, tl.where(valid, x_t - lse, 0.0), mask=row_mask)
    tl.store(maximum_ptr + row, m, mask=row_mask)
    tl.store(argmax_ptr + row, argmax.to(tl.int64), mask=row_mask)
    tl.store(hinge_ptr + row, hinge, mask=row_mask)
    tl.store(count_ptr + row, count, mask=row_mask)


def _backward_kernel(
    logits_ptr,
    target_ptr,
    lse_ptr,
    maximum_ptr,
    argmax_ptr,
    count_ptr,
    g_ptr,
    h_ptr,
    grad_ptr,
    rows,
    columns,
    stride,
    grad_stride,
    margin,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """``grad = G softmax - H active - G onehot(t) + H K onehot(a)``, per row, in one pass."""
    row = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = row < rows
    target = tl.load(target_ptr + row, mask=row_mask, other=-1)
    lse = tl.load(lse_ptr + row, mask=row_mask, other=0.0)
    maximum = tl.load(maximum_ptr + row, mask=row_mask, other=0.0)
    argmax = tl.load(argmax_ptr + row, mask=row_mask, other=-1)
    count = tl.load(count_ptr + row, mask=row_mask, other=0.0)
    g_row = tl.load(g_ptr + row, mask=row_mask, other=0.0)
    h_row = tl.load(h_ptr + row, mask=row_mask, other=0.0)
    row_start = logits_ptr + row.to(tl.int64) * stride
    grad_start = grad_ptr + row.to(tl.int64) * grad_stride
    for start in range(0, columns, BLOCK_C):
        column = start + tl.arange(0, BLOCK_C)
        column_mask = column < columns
        mask = row_mask[:, None] & column_mask[None, :]
        x = tl.load(row_start[:, None] + column[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.exp(x - lse[:, None]) * g_row[:, None]
        active = ((maximum[:, None] - x) - margin) > 0.0
        g = tl.where(active, g - h_row[:, None], g)
        g = tl.where(column[None, :] == target[:, None], g - g_row[:, None], g)
        g = tl.where(column[None, :] == argmax[:, None], g + (h_row * count)[:, None], g)
        tl.store(grad_start[:, None] + column[None, :], g.to(grad_ptr.dtype.element_ty), mask=mask)


#: The kernels by name (the ahead-of-time compile test reads this too).
KERNELS = {"mbls_forward": _forward_kernel, "mbls_backward": _backward_kernel}


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


def mbls_rows(logits: Tensor, target: Tensor, margin: float) -> dict[str, Tensor]:
    """Launch the forward kernel on prepared inputs (``target`` ``-1`` on ignored rows).

    Returns ``[N]`` tensors: ``"lse"``, ``"log_p"`` (0 on ignored rows), ``"maximum"`` (``M``),
    ``"argmax"`` (int64, its first column), ``"hinge"`` (``sum_k relu(M - x_k - margin)``) and
    ``"count"`` (the number of active classes, float32).
    """
    rows, columns = logits.shape
    device = logits.device
    new = functools.partial(torch.empty, rows, dtype=torch.float32, device=device)
    found = {name: new() for name in ("lse", "log_p", "maximum", "hinge", "count")}
    found["argmax"] = torch.zeros(rows, dtype=torch.long, device=device)
    if rows == 0:
        return found
    interpret = device.type != "cuda"
    block_n, block_c, num_warps = blocks(rows, columns, interpret)
    kernel("mbls_forward", interpret)[(triton.cdiv(rows, block_n),)](
        logits,
        target,
        found["lse"],
        found["log_p"],
        found["maximum"],
        found["argmax"],
        found["hinge"],
        found["count"],
        rows,
        columns,
        logits.stride(0),
        float(margin),
        BLOCK_N=block_n,
        BLOCK_C=block_c,
        num_warps=num_warps,
    )
    return found


class TritonMbLS(torch.autograd.Function):
    """MbLS per row of ``[N, C]`` logits by the two kernels; the torch path's twin.

    Arguments ``(logits, target, valid, margin, alpha)``: ``target`` 0 on the ignored rows that
    ``valid`` marks. Returns the float32 loss per row, 0 where ignored. Saved for the backward:
    the logits, the target and four ``N``-vectors (``lse``, ``M``, ``a``, ``K``).
    """

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, valid: Tensor, margin: float, alpha: float
    ) -> Tensor:
        """One forward kernel, then ``-log p_t + alpha / C * hinge`` on the ``N``-vectors."""
        logits, kernel_target = prepare(logits, target, valid)
        found = mbls_rows(logits, kernel_target, margin)
        value = found["hinge"] * (alpha / max(logits.shape[1], 1)) - found["log_p"]
        ctx.margin, ctx.alpha = margin, alpha
        ctx.save_for_backward(
            logits, kernel_target, found["lse"], found["maximum"], found["argmax"], found["count"]
        )
        return torch.where(valid, value, 0.0)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        """One backward kernel: the gradient of the logits, in their dtype."""
        logits, target, lse, maximum, argmax, count = ctx.saved_tensors
        rows, columns = logits.shape
        g = torch.where(target >= 0, grad_output.float(), 0.0).contiguous()
        h = (g * (ctx.alpha / max(columns, 1))).contiguous()
        grad = torch.empty_like(logits)
        if rows == 0:
            return grad, None, None, None, None
        interpret = logits.device.type != "cuda"
        block_n, block_c, num_warps = blocks(rows, columns, interpret)
        kernel("mbls_backward", interpret)[(triton.cdiv(rows, block_n),)](
            logits,
            target,
            lse,
            maximum,
            argmax,
            count,
            g,
            h,
            grad,
            rows,
            columns,
            logits.stride(0),
            grad.stride(0),
            float(ctx.margin),
            BLOCK_N=block_n,
            BLOCK_C=block_c,
            num_warps=num_warps,
        )
        return grad, None, None, None, None
