"""The chunked computation of :func:`~lightning_losses.functional.linear_target_loss`.

A :class:`Head` holds one call's counted rows and walks them a chunk at a time;
:func:`forward_chunks` computes each chunk's logits, the per-row statistics (``lse``, ``log
p_t``, the label-smoothing sum), the losses and, on request, the gradients of ``hidden``,
``weight`` and ``bias`` (accumulated in :class:`Grads`); :func:`backward_chunks` recomputes them
for ``reduction="none"``. The passes over a chunk's logits are torch operations, or the Triton
kernels of :mod:`lightning_losses.kernels.linear_head` when ``Head.kernels`` is set (the matrix
products are torch's either way). Split from :mod:`lightning_losses.functional.linear`, which
holds the checks, the autograd function and the public functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_losses.functional._core import Phi, compute_dtype

__all__ = [
    "CHUNK_BYTES",
    "MIN_CHUNK_ROWS",
    "Grads",
    "Head",
    "Terms",
    "backward_chunks",
    "default_chunk_size",
    "exp_floor",
    "forward_chunks",
    "reduce_rows",
]

#: Bytes of one chunk's float32 logits that :func:`default_chunk_size` aims at.
CHUNK_BYTES = 64 * 2**20
#: Fewest rows per chunk (unless ``hidden_size / 2`` is smaller): each chunk adds its
#: contribution to the whole ``[V, H]`` weight gradient, a pass over ``V * H`` numbers that
#: only a few hundred rows amortise.
MIN_CHUNK_ROWS = 256


def default_chunk_size(
    num_rows: int,
    vocab_size: int,
    hidden_size: int | None = None,
    *,
    chunk_bytes: int = CHUNK_BYTES,
) -> int:
    """Rows per chunk: at most 64 MiB of float32 logits and ``H`` rows, at least a few hundred.

    ``rows = max(min(chunk_bytes / (4 V), H), min(256, H / 2))``, rounded down to a power of
    two and clipped to ``[1, num_rows]`` (without ``hidden_size`` the cap ``H`` is dropped and
    the floor is 256). Each chunk costs three matrix products and one pass over the ``[V, H]``
    weight gradient (``addmm`` of the chunk's contribution), so small chunks are slow:
    measured on a 2-core CPU with one thread and H=512, 32 rows took 2.3x the time of 256 rows
    at V=128000 (N=2048), and 128 rows 1.07x the time of 512 at V=32000 (N=8192). The caps
    keep the logits buffer no larger than the weight gradient (``4 V H`` bytes, which any
    chunking must hold) and than 64 MiB; the floor keeps large vocabularies fast, at a buffer
    of at most half the weight gradient.

    Example:
        >>> default_chunk_size(8192, 32000, 512), default_chunk_size(8192, 128000, 512)
        (512, 256)
        >>> default_chunk_size(2048, 8000, 256), default_chunk_size(10, 32000)
        (256, 10)
        >>> default_chunk_size(8192, 10**9, 64)
        32
    """
    budget = max(1, chunk_bytes // (4 * max(vocab_size, 1)))
    if hidden_size is None:
        rows = max(budget, MIN_CHUNK_ROWS)
    else:
        rows = max(min(budget, hidden_size), min(MIN_CHUNK_ROWS, hidden_size // 2), 1)
    rows = 1 << (rows.bit_length() - 1)
    return max(1, min(rows, num_rows))


# --- the chunked computation --------------------------------------------------------------------


@dataclass
class Head:
    """One call's rows, in the compute dtype, and how to walk them chunk by chunk.

    ``rows`` holds the indices of the non-ignored rows, or is ``None`` when every row counts
    (then chunks are plain slices and nothing is copied). ``dtype`` is that of the softmax and
    of the sums (float32 at least); ``matmul_dtype`` that of the matrix products: ``dtype``, or
    the inputs' half precision with ``half_matmul`` (then ``half_buffer`` holds a chunk's
    logits and gradient in it).
    """

    hidden: Tensor  # [N, H], input dtype
    weight: Tensor  # [V, H], matmul dtype
    bias: Tensor | None  # [V], compute dtype
    target: Tensor  # [N]
    rows: Tensor | None
    count: int
    dtype: torch.dtype
    matmul_dtype: torch.dtype
    chunk_size: int
    half_buffer: Tensor | None = None
    row_weight: Tensor | None = None  # [count] class weight of each counted row
    total_weight: float = 0.0  # what "mean" divides by: the count, or the sum of row_weight
    class_weight: Tensor | None = None  # [V] in dtype, for the label-smoothing term
    class_weight_sum: float = 0.0  # W = sum of class_weight, or V without it
    token_weight: Tensor | None = None  # [count] token weight of each counted row, in dtype
    kernels: bool = False  # the Triton chunk kernels (linear_head.py) instead of torch ops

    @classmethod
    def build(
        cls,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        ignore_index: int,
        chunk_size: int | None,
        half_matmul: bool = False,
        class_weight: Tensor | None = None,
        token_weight: Tensor | None = None,
        kernels: bool = False,
    ) -> Head:
        input_dtype = torch.promote_types(hidden.dtype, weight.dtype)
        dtype = compute_dtype(input_dtype)
        if bias is not None:
            dtype = torch.promote_types(dtype, bias.dtype)
        matmul_dtype = input_dtype if half_matmul and input_dtype.itemsize < 4 else dtype
        valid = target != ignore_index
        count = int(valid.sum())
        rows = None if count == target.numel() else valid.nonzero().squeeze(1)
        if chunk_size is None:
            chunk_size = default_chunk_size(max(count, 1), weight.shape[0], weight.shape[1])
        head = cls(
            hidden=hidden,
            weight=weight.to(matmul_dtype),
            bias=None if bias is None else bias.to(dtype).contiguous(),
            target=target,
            rows=rows,
            count=count,
            dtype=dtype,
            matmul_dtype=matmul_dtype,
            chunk_size=chunk_size,
            kernels=kernels,
        )
        if matmul_dtype != dtype and count > 0 and not kernels:
            head.half_buffer = head.logits_buffer(matmul_dtype)
        head.total_weight = float(count)
        head.class_weight_sum = float(weight.shape[0])
        if class_weight is not None:
            head.class_weight = class_weight.to(dtype).contiguous()
            head.class_weight_sum = float(head.class_weight.sum())
            counted = target if rows is None else target.index_select(0, rows)
            head.row_weight = head.class_weight.index_select(0, counted)
        if token_weight is not None:
            token_weight = token_weight.to(dtype)
            head.token_weight = token_weight if rows is None else token_weight.index_select(0, rows)
        if head.row_weight is not None or head.token_weight is not None:
            weights = [w for w in (head.row_weight, head.token_weight) if w is not None]
            product = weights[0] if len(weights) == 1 else weights[0] * weights[1]
            head.total_weight = float(product.sum()) if count > 0 else 0.0
        return head

    def chunks(self) -> Iterator[tuple[int, int, Tensor | None, Tensor, Tensor]]:
        """``(start, size, row_index, hidden_chunk, target_chunk)`` over the counted rows."""
        for start in range(0, self.count, self.chunk_size):
            size = min(self.chunk_size, self.count - start)
            if self.rows is None:
                index = None
                hidden = self.hidden.narrow(0, start, size)
                target = self.target.narrow(0, start, size)
            else:
                index = self.rows.narrow(0, start, size)
                hidden = self.hidden.index_select(0, index)
                target = self.target.index_select(0, index)
            yield start, size, index, hidden.to(self.matmul_dtype), target

    def logits_buffer(self, dtype: torch.dtype | None = None) -> Tensor:
        rows = min(self.chunk_size, max(self.count, 1))
        shape = (rows, self.weight.shape[0])
        return torch.empty(shape, dtype=dtype or self.dtype, device=self.weight.device)

    def logits(self, hidden: Tensor, out: Tensor) -> Tensor:
        """``hidden @ weight.T + bias`` into ``out`` (in ``dtype``)."""
        if self.half_buffer is None:
            torch.mm(hidden, self.weight.t(), out=out)
        else:
            out.copy_(torch.mm(hidden, self.weight.t(), out=self.half_buffer[: out.shape[0]]))
        if self.bias is not None:
            out.add_(self.bias)
        return out

    def to_matmul(self, grad_logits: Tensor) -> Tensor:
        """A chunk's logit gradient in ``matmul_dtype`` (in ``half_buffer`` when half)."""
        if self.half_buffer is None or grad_logits.dtype == self.matmul_dtype:
            return grad_logits
        return self.half_buffer[: grad_logits.shape[0]].copy_(grad_logits)


@dataclass
class Grads:
    """Gradient accumulators (``None`` where not wanted).

    Hidden in its dtype, others in the compute dtype until :meth:`finish`.
    """

    hidden: Tensor | None
    weight: Tensor | None
    bias: Tensor | None

    @classmethod
    def zeros(cls, head: Head, needs: tuple[bool, ...]) -> Grads:
        hidden, device = head.hidden, head.hidden.device
        grad_hidden = None
        if needs[0]:
            make = torch.empty if head.rows is None else torch.zeros
            grad_hidden = make(hidden.shape, dtype=hidden.dtype, device=device)
        grad_weight = None
        if needs[1]:
            grad_weight = torch.zeros(head.weight.shape, dtype=head.dtype, device=device)
        grad_bias = None
        if needs[2] and head.bias is not None:
            grad_bias = torch.zeros_like(head.bias)
        return cls(grad_hidden, grad_weight, grad_bias)

    def add_chunk(
        self, head: Head, grad_logits: Tensor, hidden: Tensor, start: int, index: Tensor | None
    ) -> None:
        """Add one chunk's contribution, given ``dL/dlogits`` of its rows (in ``dtype``)."""
        if self.bias is not None:
            self.bias.add_(grad_logits.sum(0, dtype=self.bias.dtype))
        grad = head.to_matmul(grad_logits)
        if self.hidden is not None:
            size = grad.shape[0]
            if index is None and self.hidden.dtype == grad.dtype:
                torch.mm(grad, head.weight, out=self.hidden.narrow(0, start, size))
            elif index is None:
                self.hidden.narrow(0, start, size).copy_(grad @ head.weight)
            else:
                self.hidden.index_copy_(0, index, (grad @ head.weight).to(self.hidden.dtype))
        if self.weight is not None:
            if grad.dtype == self.weight.dtype:
                self.weight.addmm_(grad.t(), hidden)
            else:  # half products, summed over the chunks in float32
                self.weight.add_(grad.t() @ hidden)

    def finish(self, weight: Tensor, bias: Tensor | None) -> Grads:
        """Cast the accumulators to the dtypes of ``weight`` and ``bias``."""
        grad_weight = None if self.weight is None else self.weight.to(weight.dtype)
        grad_bias = None if self.bias is None or bias is None else self.bias.to(bias.dtype)
        return Grads(self.hidden, grad_weight, grad_bias)


def exp_floor(dtype: torch.dtype) -> float:
    """Lowest shifted logit passed to ``exp``: ``log(sqrt(tiny))`` (-43.7 in float32).

    Logits more than that below a row's maximum have probabilities under ``sqrt(tiny)``
    (1e-19 in float32); raising them to it changes the softmax's sum by less than ``V *
    sqrt(tiny)``, far below rounding, but keeps subnormal numbers out of ``exp`` and of the
    matrix products of the gradient, where x86 CPUs run up to 10x slower (measured: 2.5 s
    instead of 0.29 s for N=2048, H=256, V=8000 with logits of standard deviation 16).
    """
    return 0.5 * math.log(torch.finfo(dtype).tiny)


def _smoothing_offset(head: Head, factor: float) -> Tensor:
    """``-factor * w`` (``[V]``), or ``-factor`` as a 0-d tensor without class weights."""
    if head.class_weight is None:
        return torch.full((), -factor, dtype=head.dtype, device=head.weight.device)
    return head.class_weight * -factor


def _row_sum_weight(head: Head) -> Tensor:
    """``w`` ``[V]`` of the smoothing term ``sum_c w_c z_c``: the class weights, or ones.

    A matrix-vector product with it sums the rows fastest.
    """
    if head.class_weight is not None:
        return head.class_weight
    return torch.ones(head.weight.shape[0], dtype=head.dtype, device=head.hidden.device)


@dataclass(frozen=True)
class Terms:
    """What a row's loss is made of, besides ``phi``: label smoothing ``eps`` and z-loss ``z``."""

    phi: Phi
    hyperparameters: dict[str, Any]
    label_smoothing: float = 0.0
    z_loss: float = 0.0


def _row_values(
    head: Head, terms: Terms, start: int, lse: Tensor, log_p: Tensor, smooth: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``(loss, derivative)`` of a chunk's rows from their ``lse``, ``log p_t`` and smoothing sum.

    ``loss = u (c_t (1 - eps) phi(log p_t) + eps / V smooth + z lse^2)`` (``u`` the token
    weight, ``c_t`` the class weight, each 1 when absent); ``derivative = c_t (1 - eps)
    phi'(log p_t)``, without ``u``.
    """
    size = log_p.shape[0]
    value, derivative = terms.phi(log_p, **terms.hyperparameters)
    if head.row_weight is not None:
        row_weight = head.row_weight.narrow(0, start, size)
        value, derivative = value * row_weight, derivative * row_weight
    eps = terms.label_smoothing
    if eps:
        assert smooth is not None
        value = (1.0 - eps) * value + (eps / head.weight.shape[0]) * smooth
        derivative = (1.0 - eps) * derivative
    if terms.z_loss:
        value = value + terms.z_loss * lse.square()
    if head.token_weight is not None:
        value = value * head.token_weight.narrow(0, start, size)
    return value, derivative


def _coefficients(
    head: Head,
    terms: Terms,
    start: int,
    lse: Tensor,
    derivative: Tensor,
    scale: float | Tensor,
) -> tuple[Tensor, Tensor, float | Tensor | None]:
    """``(a, g, b)`` of a chunk's logit gradient ``softmax * a - b * w + g * onehot(t)``.

    With ``r = scale * u`` per row: ``g = r * derivative``, ``b = r eps / V`` (``None``
    without smoothing) and ``a = -g + b W + 2 z lse r`` (``W = sum_c w_c``).
    """
    size = lse.shape[0]
    rate: float | Tensor = scale
    if head.token_weight is not None:
        rate = head.token_weight.narrow(0, start, size) * scale
    g = derivative * rate
    a = -g
    b: float | Tensor | None = None
    if terms.label_smoothing:
        b = rate * (terms.label_smoothing / head.weight.shape[0])
        a = a + b * head.class_weight_sum
    if terms.z_loss:
        a = a + (2.0 * terms.z_loss) * lse * rate
    return a, g, b


def _torch_statistics(
    head: Head, logits: Tensor, target: Tensor, row_sum_weight: Tensor | None, floor: float
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """``(lse, log p_t, smooth, denominator)`` of a chunk; ``logits`` become ``exp(x - max)``."""
    shift = logits.amax(1, keepdim=True)
    logits.sub_(shift)
    target_logit = logits.gather(1, target.unsqueeze(1)).squeeze(1)
    weighted_sum = None
    if row_sum_weight is not None:  # sum_c w_c z_c, before the logits turn into exponentials
        weighted_sum = torch.mv(logits, row_sum_weight)
    denominator = logits.clamp_(min=floor).exp_().sum(1)
    log_denominator = denominator.log()
    smooth = None
    if weighted_sum is not None:
        smooth = head.class_weight_sum * log_denominator - weighted_sum
    return shift.squeeze(1) + log_denominator, target_logit - log_denominator, smooth, denominator


def _torch_gradient(
    head: Head,
    exponentials: Tensor,
    denominator: Tensor | None,
    target: Tensor,
    coefficients: tuple[Tensor, Tensor, float | Tensor | None],
) -> Tensor:
    """``softmax * a - b * w + g * onehot(t)`` in place of ``exponentials`` (``/ denominator``)."""
    a, g, b = coefficients
    factor = (a if denominator is None else a / denominator).unsqueeze(1)
    if b is None:
        exponentials.mul_(factor)
    elif not isinstance(b, Tensor):  # one pass: softmax * a + offset
        torch.addcmul(_smoothing_offset(head, b), exponentials, factor, out=exponentials)
    elif head.class_weight is None:
        torch.addcmul(-b.unsqueeze(1), exponentials, factor, out=exponentials)
    else:
        exponentials.mul_(factor).addr_(b, head.class_weight, alpha=-1)
    exponentials.scatter_add_(1, target.unsqueeze(1), g.unsqueeze(1))
    return exponentials


def _kernel_logits(head: Head, hidden: Tensor, buffer: Tensor) -> Tensor:
    """A chunk's ``hidden @ weight.T`` in the matmul dtype, without the bias (kernels add it)."""
    return torch.mm(hidden, head.weight.t(), out=buffer.narrow(0, 0, hidden.shape[0]))


def _kernel_gradient(
    head: Head,
    terms: Terms,
    logits: Tensor,
    target: Tensor,
    lse: Tensor,
    coefficients: tuple[Tensor, Tensor, float | Tensor | None],
) -> Tensor:
    """The chunk's logit gradient, by the kernel of ``linear_head.chunk_gradient``."""
    from lightning_losses.kernels import linear_head

    a, g, b = coefficients
    if b is not None and not isinstance(b, Tensor):
        b = torch.full_like(a, b)
    class_weight = head.class_weight if terms.label_smoothing else None
    return linear_head.chunk_gradient(
        logits,
        target.contiguous(),
        lse.float().contiguous(),
        a.float().contiguous(),
        g.float().contiguous(),
        b=None if b is None else b.float().contiguous(),
        bias=head.bias,
        weight=class_weight,
        out=logits,
    )


def forward_chunks(
    head: Head,
    terms: Terms,
    *,
    grads: Grads | None = None,
    scale: float = 1.0,
    keep_for_backward: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Loss of each counted row; with ``grads``, also accumulate ``scale`` times the gradients.

    With ``label_smoothing = eps`` a row's loss is ``(1 - eps) w_t phi(log p_t) + eps / V
    sum_c w_c (-log p_c)``; the sum is ``W log(denominator) - sum_c w_c z_c`` with ``z`` the
    shifted logits (all terms ``>= 0``: no cancellation), and its gradient ``W softmax - w``
    joins the softmax's scaling in one pass over the chunk; z-loss adds ``z lse^2`` and
    ``2 z lse softmax``; the token weight multiplies the row's loss and gradient. With
    ``head.kernels`` the two Triton kernels of :mod:`lightning_losses.kernels.linear_head` do
    the passes over the chunk's logits.

    Returns ``(values [count], lse, derivative)``; the last two (``[count]`` each) only with
    ``keep_for_backward`` (the derivative then includes ``(1 - eps) w_t``, not the token weight).
    """
    device = head.hidden.device
    values = torch.empty(head.count, dtype=head.dtype, device=device)
    lse_all = torch.empty_like(values) if keep_for_backward else None
    derivatives = torch.empty_like(values) if keep_for_backward else None
    if head.count == 0:
        return values, lse_all, derivatives
    eps = terms.label_smoothing
    if head.kernels:
        from lightning_losses.kernels import linear_head

        buffer = head.logits_buffer(head.matmul_dtype)
        smooth_weight = head.class_weight if eps else None
    else:
        buffer, floor = head.logits_buffer(), exp_floor(head.dtype)
        row_sum_weight = _row_sum_weight(head) if eps else None
    for start, size, index, hidden, target in head.chunks():
        denominator = None
        if head.kernels:
            logits = _kernel_logits(head, hidden, buffer)
            lse, target_logit, smooth = linear_head.chunk_statistics(
                logits,
                target.contiguous(),
                bias=head.bias,
                weight=smooth_weight,
                smoothing=bool(eps),
            )
            log_p = target_logit - lse
        else:
            logits = head.logits(hidden, buffer.narrow(0, 0, size))
            lse, log_p, smooth, denominator = _torch_statistics(
                head, logits, target, row_sum_weight, floor
            )
        value, derivative = _row_values(head, terms, start, lse, log_p, smooth)
        values.narrow(0, start, size).copy_(value)
        if lse_all is not None and derivatives is not None:  # keep_for_backward
            lse_all.narrow(0, start, size).copy_(lse)
            derivatives.narrow(0, start, size).copy_(derivative)
        if grads is not None:
            coefficients = _coefficients(head, terms, start, lse, derivative, scale)
            if head.kernels:
                grad = _kernel_gradient(head, terms, logits, target, lse, coefficients)
            else:
                grad = _torch_gradient(head, logits, denominator, target, coefficients)
            grads.add_chunk(head, grad, hidden, start, index)
    return values, lse_all, derivatives


def backward_chunks(
    head: Head,
    terms: Terms,
    lse: Tensor,
    derivatives: Tensor,
    grad_rows: Tensor,
    grads: Grads,
) -> None:
    """Recompute each chunk's softmax from ``lse`` and accumulate the gradients.

    The per-row upstream gradient is ``grad_rows`` ``[count]``; the coefficients are those of
    :func:`_coefficients` with ``scale = grad_rows``.
    """
    if head.count == 0:
        return
    if head.kernels:
        buffer = head.logits_buffer(head.matmul_dtype)
    else:
        buffer, floor = head.logits_buffer(), exp_floor(head.dtype)
    grad_rows = grad_rows.to(head.dtype)
    for start, size, index, hidden, target in head.chunks():
        row_lse = lse.narrow(0, start, size)
        coefficients = _coefficients(
            head,
            terms,
            start,
            row_lse,
            derivatives.narrow(0, start, size),
            grad_rows.narrow(0, start, size),
        )
        if head.kernels:
            logits = _kernel_logits(head, hidden, buffer)
            grad = _kernel_gradient(head, terms, logits, target, row_lse, coefficients)
        else:
            logits = head.logits(hidden, buffer.narrow(0, 0, size))
            logits.sub_(row_lse.unsqueeze(1)).clamp_(min=floor).exp_()
            grad = _torch_gradient(head, logits, None, target, coefficients)
        grads.add_chunk(head, grad, hidden, start, index)


def _scatter_rows(head: Head, values: Tensor) -> Tensor:
    """Per-row values over all ``N`` rows (0 where ignored)."""
    if head.rows is None:
        return values
    full = torch.zeros(head.target.shape[0], dtype=values.dtype, device=values.device)
    return full.index_copy_(0, head.rows, values)


def reduce_rows(head: Head, values: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return _scatter_rows(head, values)
    total = values.sum()
    if reduction == "mean" and head.total_weight > 0:
        return total / head.total_weight
    return total
