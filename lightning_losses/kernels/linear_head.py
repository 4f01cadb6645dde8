"""Triton kernels of the linear head (:func:`~lightning_losses.functional.linear_target_loss`).

Design: Liger-style chunks. :func:`~lightning_losses.functional.linear_target_loss` walks the
rows a chunk at a time; for each chunk the matrix products stay PyTorch's (cuBLAS on a GPU:
``logits = hidden @ weight.T`` into one chunk-sized buffer, then ``grad @ weight`` and
``grad.T @ hidden``), and two kernels here replace the dozen elementwise passes of the torch
path over the chunk's logits:

- :func:`chunk_statistics` reads the chunk's logits once (the bias added on the fly, float32
  whatever the buffer's dtype, an online log-sum-exp over blocks of columns) and writes per
  row ``lse``, the target logit ``x_t`` and, for label smoothing, ``sum_c w_c (lse - x_c)``
  (``w`` the class weights, all 1 without them; computed as ``W (lse - x_0) - sum_c w_c (x_c
  - x_0)``, ``W = sum_c w_c``, ``x_0`` the row's first logit, free of a common offset's
  cancellation);
- ``phi``, the class / token weights and z-loss act on these ``N``-vectors in torch, which
  gives per row the three coefficients of the gradient;
- :func:`chunk_gradient` reads the logits once more and overwrites them, in place and in the
  buffer's dtype, with ``dL/dx = softmax(x) * a - b * w + g * onehot(t)``.

So the ``[N, V]`` logits are never stored (one ``[chunk, V]`` buffer, in float32, or in the
inputs' half precision with ``half_matmul=True``: products accumulated in float32 by the
matrix units, rounded to half on output, read back into float32 by the kernels), and the
gradient of ``"mean"`` / ``"sum"`` is computed in the forward pass (the backward scales it), as
in Liger-Kernel's fused linear cross-entropy.

Why not CCE's blockwise kernels (logit tiles from ``tl.dot`` that never leave the chip, with
gradient filtering): they need a matrix-multiplication kernel of our own for the forward and
two for the backward (``grad_hidden`` and ``grad_weight`` in separate passes to stay free of
float atomics), tuned per GPU, and could not be checked on a GPU in the time at hand; the
chunked design reuses cuBLAS and is tested here under Triton's interpreter against the torch
path and a float64 reference. There is consequently no gradient filtering: cuBLAS multiplies
the whole chunk, so there is no tile to skip; every gradient is exact (to rounding).

Determinism: no atomics anywhere (each program owns its rows; the sums over rows are cuBLAS's
matrix products and ``Tensor.sum``), so with ``torch.use_deterministic_algorithms(True)`` two
runs give bitwise-equal losses and gradients (on a GPU PyTorch also asks for
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in the environment, for its cuBLAS products).

The kernels are plain functions, wrapped when first needed: in Triton's interpreter for CPU
tensors (``TRITON_INTERPRET=1``, how the tests run them), compiled by Triton for CUDA tensors.

Sources: Liger-Kernel's ``fused_linear_cross_entropy`` (Hsu et al., 2024) for the chunked
design; the online log-sum-exp of Milakov and Gimelshein (2018); z-loss from PaLM (Chowdhery
et al., 2022).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the kernels are defined but cannot run
    triton = None
    tl = None

__all__ = ["KERNELS", "chunk_gradient", "chunk_statistics", "kernel"]


def _statistics_kernel(
    logits_ptr,
    bias_ptr,
    weight_ptr,
    target_ptr,
    lse_ptr,
    target_logit_ptr,
    smooth_ptr,
    total_ptr,
    rows,
    columns,
    stride,
    HAS_BIAS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    SMOOTHING: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Per row of the chunk: ``lse``, ``x_t`` and the smoothing sum (see the module)."""
    row = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = row < rows
    target = tl.load(target_ptr + row, mask=row_mask, other=0)
    row_start = logits_ptr + row.to(tl.int64) * stride
    x_t = tl.load(row_start + target, mask=row_mask, other=0.0).to(tl.float32)
    first = tl.load(row_start, mask=row_mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x_t += tl.load(bias_ptr + target, mask=row_mask, other=0.0).to(tl.float32)
        first += tl.load(bias_ptr).to(tl.float32)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    weighted = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, columns, BLOCK_C):
        column = start + tl.arange(0, BLOCK_C)
        column_mask = column < columns
        mask = row_mask[:, None] & column_mask[None, :]
        x = tl.load(row_start[:, None] + column[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            b = tl.load(bias_ptr + column, mask=column_mask, other=0.0).to(tl.float32)
            x += b[None, :]
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
    lse = m + tl.log(s)
    tl.store(lse_ptr + row, lse, mask=row_mask)
    tl.store(target_logit_ptr + row, x_t, mask=row_mask)
    if SMOOTHING:
        total = tl.load(total_ptr)
        tl.store(smooth_ptr + row, total * (lse - first) - weighted, mask=row_mask)


def _gradient_kernel(
    logits_ptr,
    bias_ptr,
    weight_ptr,
    target_ptr,
    lse_ptr,
    a_ptr,
    b_ptr,
    g_ptr,
    grad_ptr,
    rows,
    columns,
    stride,
    grad_stride,
    HAS_BIAS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    SMOOTHING: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """``grad = softmax(x) * a - b * w + g * onehot(t)`` per row, in the gradient's dtype.

    ``grad_ptr`` may be ``logits_ptr`` (in place: each element is read before it is written,
    by the same program). ``b`` only with ``SMOOTHING``; ``w`` the class weights (1 without).
    """
    row = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = row < rows
    target = tl.load(target_ptr + row, mask=row_mask, other=-1)
    lse = tl.load(lse_ptr + row, mask=row_mask, other=0.0)
    a = tl.load(a_ptr + row, mask=row_mask, other=0.0)
    g = tl.load(g_ptr + row, mask=row_mask, other=0.0)
    b = tl.zeros([BLOCK_N], tl.float32)
    if SMOOTHING:
        b = tl.load(b_ptr + row, mask=row_mask, other=0.0)
    row_start = logits_ptr + row.to(tl.int64) * stride
    grad_start = grad_ptr + row.to(tl.int64) * grad_stride
    for start in range(0, columns, BLOCK_C):
        column = start + tl.arange(0, BLOCK_C)
        column_mask = column < columns
        mask = row_mask[:, None] & column_mask[None, :]
        x = tl.load(row_start[:, None] + column[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + column, mask=column_mask, other=0.0).to(tl.float32)
            x += bias[None, :]
        grad = tl.exp(x - lse[:, None]) * a[:, None]
        if SMOOTHING:
            if HAS_WEIGHT:
                w = tl.load(weight_ptr + column, mask=column_mask, other=0.0).to(tl.float32)
                grad = grad - b[:, None] * w[None, :]
            else:
                grad = grad - b[:, None]
        grad = tl.where(column[None, :] == target[:, None], grad + g[:, None], grad)
        tl.store(
            grad_start[:, None] + column[None, :], grad.to(grad_ptr.dtype.element_ty), mask=mask
        )


#: The kernels by name (the ahead-of-time compile test reads this too).
KERNELS = {"statistics": _statistics_kernel, "gradient": _gradient_kernel}


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


#: Elements of one program's block on a GPU, and under the interpreter (whose cost grows with
#: programs times loop steps; tests may lower it to make the column loop take several steps).
GPU_TILE = 1 << 12
INTERPRETER_TILE = 1 << 16


def blocks(rows: int, columns: int, interpret: bool) -> tuple[int, int, int]:
    """``(BLOCK_N, BLOCK_C, num_warps)`` for a ``[rows, columns]`` chunk of logits.

    Example:
        >>> blocks(512, 32000, interpret=False)
        (1, 4096, 8)
        >>> blocks(512, 1000, interpret=False)
        (4, 1024, 4)
    """
    tile = INTERPRETER_TILE if interpret else GPU_TILE
    block_c = min(1 << max(columns - 1, 0).bit_length(), tile)
    block_n = max(1, min(1 << max(rows - 1, 0).bit_length(), tile // block_c))
    return block_n, block_c, 8 if block_c >= 4096 else 4


def _launch(logits: Tensor) -> tuple[int, int, int, int, int, bool]:
    """``(rows, columns, BLOCK_N, BLOCK_C, num_warps, interpret)`` of a launch on ``logits``."""
    rows, columns = logits.shape
    interpret = logits.device.type != "cuda"
    return (rows, columns, *blocks(rows, columns, interpret), interpret)


def chunk_statistics(
    logits: Tensor,
    target: Tensor,
    *,
    bias: Tensor | None = None,
    weight: Tensor | None = None,
    smoothing: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(lse, x_t, smooth)`` per row of ``logits + bias``, in float32, from one pass.

    Args:
        logits: ``[n, V]`` chunk of logits (float32, float16 or bfloat16), unit column stride,
            without the bias.
        target: ``[n]`` int64 class indices, all in ``[0, V)``.
        bias: optional ``[V]`` bias, added to each row as it is read.
        weight: optional ``[V]`` float32 class weights of the smoothing sum.
        smoothing: also return ``sum_c w_c (lse - x_c)`` (else ``None``).
    """
    rows, columns, block_n, block_c, num_warps, interpret = _launch(logits)
    new = functools.partial(torch.empty, rows, dtype=torch.float32, device=logits.device)
    lse, target_logit = new(), new()
    smooth = new() if smoothing else None
    if rows == 0:
        return lse, target_logit, smooth
    total = _total(weight, columns, logits.device)
    kernel("statistics", interpret)[(triton.cdiv(rows, block_n),)](
        logits,
        lse if bias is None else bias,
        lse if weight is None else weight,
        target,
        lse,
        target_logit,
        lse if smooth is None else smooth,
        total,
        rows,
        columns,
        logits.stride(0),
        HAS_BIAS=bias is not None,
        HAS_WEIGHT=weight is not None,
        SMOOTHING=smoothing,
        BLOCK_N=block_n,
        BLOCK_C=block_c,
        num_warps=num_warps,
    )
    return lse, target_logit, smooth


def chunk_gradient(
    logits: Tensor,
    target: Tensor,
    lse: Tensor,
    a: Tensor,
    g: Tensor,
    *,
    b: Tensor | None = None,
    bias: Tensor | None = None,
    weight: Tensor | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """``softmax(logits + bias) * a - b * w + g * onehot(target)`` per row, into ``out``.

    ``a``, ``b``, ``g`` and ``lse`` are float32 ``[n]`` vectors; ``w`` the class weights
    ``weight`` (1 without); ``b`` left out when ``None``. ``out`` (default: a new tensor like
    ``logits``) may be ``logits`` itself: the gradient then overwrites the logits in place.
    """
    grad = torch.empty_like(logits) if out is None else out
    rows, columns, block_n, block_c, num_warps, interpret = _launch(logits)
    if rows == 0:
        return grad
    kernel("gradient", interpret)[(triton.cdiv(rows, block_n),)](
        logits,
        lse if bias is None else bias,
        lse if weight is None else weight,
        target,
        lse,
        a,
        a if b is None else b,
        g,
        grad,
        rows,
        columns,
        logits.stride(0),
        grad.stride(0),
        HAS_BIAS=bias is not None,
        HAS_WEIGHT=weight is not None,
        SMOOTHING=b is not None,
        BLOCK_N=block_n,
        BLOCK_C=block_c,
        num_warps=num_warps,
    )
    return grad


def _total(weight: Tensor | None, columns: int, device: torch.device) -> Tensor:
    """``W = sum_c w_c`` (``V`` without weights) as a float32 scalar on the device: no sync."""
    if weight is None:
        return torch.full((1,), float(columns), dtype=torch.float32, device=device)
    return weight.sum(dtype=torch.float32).reshape(1)
