"""The target-probability family over a linear head, chunked: no ``[N, V]`` logits, ever.

For language models the output layer maps ``N`` hidden states of size ``H`` to ``V`` classes
(tens of thousands of tokens), and the ``[N, V]`` logits, their softmax and their gradient
dominate memory. :func:`linear_target_loss` computes ``phi(log p_t)`` for every member of the
family (:data:`~lightning_losses.functional.target_probability.FAMILY`) over
``logits = hidden @ weight.T + bias`` a chunk of rows at a time. Because the gradient of the
family with respect to the logits is ``phi'(log p_t) * (onehot(t) - softmax(x))``, a chunk's
logits give both its losses and its gradients at once:

    dL/dx = g * (softmax(x) - onehot(t)),   g = -phi'(log p_t) * s
    dL/dhidden = (dL/dx) @ weight,   dL/dweight = (dL/dx).T @ hidden,   dL/dbias = sum_rows dL/dx

with ``s`` the reduction's factor (``1 / count`` of non-ignored rows for ``"mean"``, 1 for
``"sum"``). For ``"mean"`` and ``"sum"`` the gradients are accumulated in the forward pass and
the backward only multiplies them by the (scalar) upstream gradient, so the whole loss costs
three matrix products per chunk, like PyTorch's chunked
:func:`torch.nn.functional.linear_cross_entropy`. With ``reduction="none"`` the per-row
upstream gradient is unknown in the forward pass: the forward keeps ``log sum exp`` and
``phi'`` per row (2 N numbers) and the backward recomputes each chunk's logits, one matrix
product more (about 4/3 the time of ``"mean"``, same memory).

Source: the chunked head follows PyTorch's ``linear_cross_entropy`` (batch-chunked, gradients
precomputed in forward); the family and its ``phi`` are those of the target-probability
family (TaiLr's gamma-CE, focal loss, Poly-1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_losses.functional._core import Phi, compute_dtype
from lightning_losses.functional.checks import (
    check_class_indices,
    check_class_weights,
    check_finite,
    check_ignore_index,
    check_int,
    check_reduction,
    check_same_device,
)
from lightning_losses.functional.target_probability import (
    FAMILY,
    check_adaptive_focal,
    check_cross_entropy,
    check_focal,
    check_gamma_ce,
    check_hard_truncated,
    check_no_label_smoothing,
    check_poly1,
)

__all__ = [
    "LINEAR_TARGET_LOSSES",
    "default_chunk_size",
    "linear_prediction_statistics",
    "linear_target_loss",
]

#: Hyper-parameters of each loss and their defaults (those of the plain-logits functions).
#: ``label_smoothing`` is one of them for the two losses that define it (``ce``, ``gamma_ce``).
LINEAR_TARGET_LOSSES: dict[str, dict[str, Any]] = {
    "ce": {"label_smoothing": 0.0},
    "gamma_ce": {"gamma": 0.5, "threshold": 0.0, "label_smoothing": 0.0},
    "soft_accuracy": {},
    "focal": {"gamma": 2.0},
    "adaptive_focal": {"thresholds": (0.2,), "gammas": (5.0, 3.0)},
    "hard_truncated": {"margin": 0.5},
    "poly1": {"epsilon": 1.0},
}

#: The checks of the plain-logits losses, by name: the ranges are the same.
_CHECKS: dict[str, Callable[..., None]] = {
    "ce": check_cross_entropy,
    "gamma_ce": check_gamma_ce,
    "focal": check_focal,
    "adaptive_focal": check_adaptive_focal,
    "hard_truncated": check_hard_truncated,
    "poly1": check_poly1,
}

#: Bytes of one chunk's float32 logits that :func:`default_chunk_size` aims at.
CHUNK_BYTES = 64 * 2**20
#: Fewest rows per chunk (unless ``hidden_size / 2`` is smaller): each chunk adds its
#: contribution to the whole ``[V, H]`` weight gradient, a pass over ``V * H`` numbers that
#: only a few hundred rows amortise.
MIN_CHUNK_ROWS = 256


def resolve_loss(loss: str, hyperparameters: Mapping[str, Any]) -> tuple[Phi, dict[str, Any]]:
    """``phi`` of ``loss`` and its checked hyper-parameters, defaults filled in.

    The losses without label smoothing accept ``label_smoothing=0`` (and drop it).

    Raises:
        ValueError: unknown loss name (the message lists the names), a hyper-parameter the loss
            does not take, or a value out of range.
        TypeError: ``label_smoothing`` other than 0 for a loss that does not define it.

    Example:
        >>> resolve_loss("focal", {"gamma": 1})[1]
        {'gamma': 1.0}
        >>> resolve_loss("ce", {"label_smoothing": 0.1})[1]
        {'label_smoothing': 0.1}
    """
    if loss not in LINEAR_TARGET_LOSSES:
        raise ValueError(
            f"unknown loss {loss!r} for linear_target_loss; available: "
            f"{', '.join(LINEAR_TARGET_LOSSES)}"
        )
    defaults = LINEAR_TARGET_LOSSES[loss]
    if "label_smoothing" in hyperparameters and "label_smoothing" not in defaults:
        hyperparameters = dict(hyperparameters)
        check_no_label_smoothing(
            f"linear_target_loss with loss={loss!r}", hyperparameters.pop("label_smoothing")
        )
    unknown = sorted(set(hyperparameters) - set(defaults))
    if unknown:
        accepted = ", ".join(defaults) or "none"
        raise ValueError(
            f"loss {loss!r} has no hyper-parameter {unknown[0]!r}; it accepts: {accepted}"
        )
    values = {**defaults, **hyperparameters}
    if loss in _CHECKS:
        _CHECKS[loss](**values)
    resolved: dict[str, Any] = {
        name: tuple(float(v) for v in value) if isinstance(value, (tuple, list)) else float(value)
        for name, value in values.items()
    }
    return FAMILY[loss], resolved


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


# --- inputs -----------------------------------------------------------------------------------


def check_chunk_size(chunk_size: int | None) -> None:
    """``chunk_size``: ``None`` or a positive integer."""
    check_int("chunk_size", chunk_size, low=1, optional=True)


def _check_class_weight(class_weight: Any, weight: Tensor, validate_args: bool) -> Tensor | None:
    """``class_weight`` as a ``[V]`` float tensor on the weight's device, or ``None``.

    With ``validate_args`` its values must be finite and ``>= 0``.
    """
    if class_weight is None:
        return None
    vocab = weight.shape[0]
    if isinstance(class_weight, Tensor):
        check_same_device("class_weight", class_weight, "weight", weight)
    else:  # a Python sequence keeps its float64 precision until the compute dtype is known
        class_weight = torch.as_tensor(class_weight, dtype=torch.float64)
    if (
        class_weight.dim() != 1
        or class_weight.shape[0] != vocab
        or not class_weight.is_floating_point()
    ):
        raise ValueError(
            f"class_weight must be a float vector of one weight per class (shape [{vocab}]); "
            f"got {class_weight.dtype} of shape {list(class_weight.shape)}"
        )
    check_class_weights("class_weight", class_weight, validate_args=validate_args)
    return class_weight.to(weight.device)


def _check_inputs(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None,
    ignore_index: int,
    validate_args: bool,
) -> None:
    """Types, shapes and devices of the inputs; with ``validate_args``, their values too."""
    check_ignore_index(ignore_index)
    floats = [("hidden", hidden), ("weight", weight)] + (
        [("bias", bias)] if bias is not None else []
    )
    for name, tensor in floats:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor; got dtype {tensor.dtype}")
    _check_head_shapes(hidden, weight, bias)
    _check_target(target, hidden)
    for name, tensor in [*floats[1:], ("target", target)]:
        check_same_device(name, tensor, "hidden", hidden)
    if validate_args:
        check_class_indices("target", target, weight.shape[0], ignore_index=ignore_index)
        for name, tensor in floats:
            check_finite(name, tensor)


def _check_head_shapes(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """``hidden`` ``[N, H]`` or ``[B, L, H]``, ``weight`` ``[V, H]`` and ``bias`` ``[V]``."""
    if hidden.dim() < 2:
        raise ValueError(
            f"hidden must have shape [N, H] or [B, L, H]; got shape {list(hidden.shape)}"
        )
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight must have shape [V, H] with H={hidden.shape[-1]} (the last dimension of "
            f"hidden); got shape {list(weight.shape)}"
        )
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(
            f"bias must have shape [V] with V={weight.shape[0]}; got shape {list(bias.shape)}"
        )


def _check_target(target: Tensor, hidden: Tensor) -> None:
    """``target``: an integer tensor of class indices with the shape of ``hidden[..., 0]``."""
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor; got {type(target).__name__}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"target must hold class indices (an integer tensor); got {target.dtype}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"target must have shape {list(hidden.shape[:-1])} to match hidden of shape "
            f"{list(hidden.shape)}; got {list(target.shape)}"
        )


# --- the chunked computation --------------------------------------------------------------------


@dataclass
class _Head:
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
    ) -> _Head:
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
            bias=None if bias is None else bias.to(dtype),
            target=target,
            rows=rows,
            count=count,
            dtype=dtype,
            matmul_dtype=matmul_dtype,
            chunk_size=chunk_size,
        )
        if matmul_dtype != dtype and count > 0:
            head.half_buffer = head.logits_buffer(matmul_dtype)
        head.total_weight = float(count)
        head.class_weight_sum = float(weight.shape[0])
        if class_weight is not None:
            head.class_weight = class_weight.to(dtype)
            head.class_weight_sum = float(head.class_weight.sum())
            counted = target if rows is None else target.index_select(0, rows)
            head.row_weight = head.class_weight.index_select(0, counted)
            head.total_weight = float(head.row_weight.sum()) if count > 0 else 0.0
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
        if self.half_buffer is None:
            return grad_logits
        return self.half_buffer[: grad_logits.shape[0]].copy_(grad_logits)


@dataclass
class _Grads:
    """Gradient accumulators (``None`` where not wanted).

    Hidden in its dtype, others in the compute dtype until :meth:`finish`.
    """

    hidden: Tensor | None
    weight: Tensor | None
    bias: Tensor | None

    @classmethod
    def zeros(cls, head: _Head, needs: tuple[bool, ...]) -> _Grads:
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
        self, head: _Head, grad_logits: Tensor, hidden: Tensor, start: int, index: Tensor | None
    ) -> None:
        """Add one chunk's contribution, given ``dL/dlogits`` of its rows (in ``dtype``)."""
        if self.bias is not None:
            self.bias.add_(grad_logits.sum(0))
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

    def finish(self, weight: Tensor, bias: Tensor | None) -> _Grads:
        """Cast the accumulators to the dtypes of ``weight`` and ``bias``."""
        grad_weight = None if self.weight is None else self.weight.to(weight.dtype)
        grad_bias = None if self.bias is None or bias is None else self.bias.to(bias.dtype)
        return _Grads(self.hidden, grad_weight, grad_bias)


def _exp_floor(dtype: torch.dtype) -> float:
    """Lowest shifted logit passed to ``exp``: ``log(sqrt(tiny))`` (-43.7 in float32).

    Logits more than that below a row's maximum have probabilities under ``sqrt(tiny)``
    (1e-19 in float32); raising them to it changes the softmax's sum by less than ``V *
    sqrt(tiny)``, far below rounding, but keeps subnormal numbers out of ``exp`` and of the
    matrix products of the gradient, where x86 CPUs run up to 10x slower (measured: 2.5 s
    instead of 0.29 s for N=2048, H=256, V=8000 with logits of standard deviation 16).
    """
    return 0.5 * math.log(torch.finfo(dtype).tiny)


def _subtract_onehot(grad_logits: Tensor, target: Tensor, g: Tensor) -> None:
    grad_logits.scatter_add_(1, target.unsqueeze(1), -g.unsqueeze(1))


def _smoothing_offset(head: _Head, factor: float) -> Tensor:
    """``-factor * w`` (``[V]``), or ``-factor`` as a 0-d tensor without class weights."""
    if head.class_weight is None:
        return torch.full((), -factor, dtype=head.dtype, device=head.weight.device)
    return head.class_weight * -factor


def _row_sum_weight(head: _Head) -> Tensor:
    """``w`` ``[V]`` of the smoothing term ``sum_c w_c z_c``: the class weights, or ones.

    A matrix-vector product with it sums the rows fastest.
    """
    if head.class_weight is not None:
        return head.class_weight
    return torch.ones(head.weight.shape[0], dtype=head.dtype, device=head.hidden.device)


def _forward_chunks(
    head: _Head,
    phi: Phi,
    hyperparameters: dict[str, Any],
    *,
    label_smoothing: float = 0.0,
    grads: _Grads | None = None,
    scale: float = 1.0,
    keep_for_backward: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Loss of each counted row; with ``grads``, also accumulate ``scale`` times the gradients.

    With ``label_smoothing = eps`` a row's loss is ``(1 - eps) w_t phi(log p_t) + eps / V
    sum_c w_c (-log p_c)``; the sum is ``W log(denominator) - sum_c w_c z_c`` with ``z`` the
    shifted logits (all terms ``>= 0``: no cancellation), and its gradient ``W softmax - w``
    joins the softmax's scaling in one pass over the chunk.

    Returns ``(values [count], lse, derivative)``; the last two (``[count]`` each) only with
    ``keep_for_backward`` (the derivative then includes ``(1 - eps) w_t``).
    """
    device = head.hidden.device
    values = torch.empty(head.count, dtype=head.dtype, device=device)
    lse = torch.empty_like(values) if keep_for_backward else None
    derivatives = torch.empty_like(values) if keep_for_backward else None
    if head.count == 0:
        return values, lse, derivatives
    buffer, floor = head.logits_buffer(), _exp_floor(head.dtype)
    smooth_factor = label_smoothing / head.weight.shape[0]
    offset = _smoothing_offset(head, smooth_factor * scale) if label_smoothing else None
    row_sum_weight = _row_sum_weight(head) if label_smoothing else None
    for start, size, index, hidden, target in head.chunks():
        logits = head.logits(hidden, buffer.narrow(0, 0, size))
        shift = logits.amax(1, keepdim=True)
        logits.sub_(shift)
        target_logit = logits.gather(1, target.unsqueeze(1)).squeeze(1)
        if row_sum_weight is not None:  # sum_c w_c z_c, before the logits turn into exponentials
            weighted_sum = torch.mv(logits, row_sum_weight)
        denominator = logits.clamp_(min=floor).exp_().sum(1)
        log_denominator = denominator.log()
        value, derivative = phi(target_logit - log_denominator, **hyperparameters)
        if head.row_weight is not None:
            row_weight = head.row_weight.narrow(0, start, size)
            value, derivative = value * row_weight, derivative * row_weight
        if label_smoothing:
            smooth = head.class_weight_sum * log_denominator - weighted_sum
            value = (1.0 - label_smoothing) * value + smooth_factor * smooth
            derivative = (1.0 - label_smoothing) * derivative
        values.narrow(0, start, size).copy_(value)
        if lse is not None and derivatives is not None:  # keep_for_backward
            lse.narrow(0, start, size).copy_(shift.squeeze(1) + log_denominator)
            derivatives.narrow(0, start, size).copy_(derivative)
        if grads is not None:
            g = derivative * -scale
            if offset is not None:  # softmax (g + s W) - s w, s = scale eps / V: one pass
                factor = (g + smooth_factor * scale * head.class_weight_sum) / denominator
                torch.addcmul(offset, logits, factor.unsqueeze(1), out=logits)
            else:
                logits.mul_((g / denominator).unsqueeze(1))  # g * softmax
            _subtract_onehot(logits, target, g)
            grads.add_chunk(head, logits, hidden, start, index)
    return values, lse, derivatives


def _backward_chunks(
    head: _Head,
    lse: Tensor,
    derivatives: Tensor,
    grad_rows: Tensor,
    grads: _Grads,
    label_smoothing: float = 0.0,
) -> None:
    """Recompute each chunk's softmax from ``lse`` and accumulate the gradients.

    The per-row upstream gradient is ``grad_rows`` ``[count]`` (with the smoothing term's
    ``s_i (W softmax - w)``, ``s_i = grad_i eps / V``, when ``label_smoothing = eps``).
    """
    if head.count == 0:
        return
    buffer, floor = head.logits_buffer(), _exp_floor(head.dtype)
    grad_rows = grad_rows.to(head.dtype)
    g_all = derivatives * -grad_rows
    s_all = grad_rows * (label_smoothing / head.weight.shape[0])
    for start, size, index, hidden, target in head.chunks():
        logits = head.logits(hidden, buffer.narrow(0, 0, size))
        logits.sub_(lse.narrow(0, start, size).unsqueeze(1)).clamp_(min=floor).exp_()
        g = g_all.narrow(0, start, size)
        if not label_smoothing:
            logits.mul_(g.unsqueeze(1))
        else:
            s = s_all.narrow(0, start, size).unsqueeze(1)
            factor = g.unsqueeze(1) + s * head.class_weight_sum
            if head.class_weight is None:
                torch.addcmul(-s, logits, factor, out=logits)
            else:
                logits.mul_(factor).addr_(s.squeeze(1), head.class_weight, alpha=-1)
        _subtract_onehot(logits, target, g)
        grads.add_chunk(head, logits, hidden, start, index)


def _scatter_rows(head: _Head, values: Tensor) -> Tensor:
    """Per-row values over all ``N`` rows (0 where ignored)."""
    if head.rows is None:
        return values
    full = torch.zeros(head.target.shape[0], dtype=values.dtype, device=values.device)
    return full.index_copy_(0, head.rows, values)


def _reduce(head: _Head, values: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return _scatter_rows(head, values)
    total = values.sum()
    if reduction == "mean" and head.total_weight > 0:
        return total / head.total_weight
    return total


@dataclass(frozen=True)
class _Spec:
    phi: Phi
    hyperparameters: dict[str, Any]
    reduction: str
    ignore_index: int
    chunk_size: int | None
    needs: tuple[bool, bool, bool]
    half_matmul: bool
    class_weight: Tensor | None = None
    label_smoothing: float = 0.0

    def head(self, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor) -> _Head:
        """The rows of one call, as this spec walks them."""
        return _Head.build(
            hidden,
            weight,
            bias,
            target,
            self.ignore_index,
            self.chunk_size,
            self.half_matmul,
            self.class_weight,
        )


class _LinearTargetLoss(torch.autograd.Function):
    """Autograd of the chunked loss.

    Gradients come from the forward pass (mean / sum), or are recomputed chunk by chunk in the
    backward pass (none).
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        spec: _Spec,
    ) -> Tensor:
        ctx.spec = spec
        with torch.autocast(hidden.device.type, enabled=False):
            head = spec.head(hidden, weight, bias, target)
            if spec.reduction == "none":
                values, lse, derivatives = _forward_chunks(
                    head,
                    spec.phi,
                    spec.hyperparameters,
                    label_smoothing=spec.label_smoothing,
                    keep_for_backward=True,
                )
                ctx.save_for_backward(hidden, weight, bias, target, lse, derivatives)
                return _reduce(head, values, "none")
            mean = spec.reduction == "mean" and head.total_weight > 0
            scale = 1.0 / head.total_weight if mean else 1.0
            grads = _Grads.zeros(head, spec.needs)
            values, _, _ = _forward_chunks(
                head,
                spec.phi,
                spec.hyperparameters,
                label_smoothing=spec.label_smoothing,
                grads=grads,
                scale=scale,
            )
            ctx.grads = grads.finish(weight, bias)
            return _reduce(head, values, spec.reduction)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        spec: _Spec = ctx.spec
        if spec.reduction == "none":
            hidden, weight, bias, target, lse, derivatives = ctx.saved_tensors
            with torch.autocast(grad_output.device.type, enabled=False):
                head = spec.head(hidden, weight, bias, target)
                grad_rows = grad_output.reshape(-1)
                if head.rows is not None:
                    grad_rows = grad_rows.index_select(0, head.rows)
                grads = _Grads.zeros(head, ctx.needs_input_grad[:3])
                _backward_chunks(head, lse, derivatives, grad_rows, grads, spec.label_smoothing)
                grads = grads.finish(weight, bias)
        else:
            grads = ctx.grads
            if grads is None:
                raise RuntimeError(
                    "linear_target_loss with reduction='mean' or 'sum' computes its gradients "
                    "in the forward pass and hands them over in the first backward; it cannot "
                    "run backward twice (retain_graph). Use reduction='none' (recomputes) or "
                    "call the loss again."
                )
            ctx.grads = None  # free them with this node, even if the graph is kept
            for grad in (grads.hidden, grads.weight, grads.bias):
                if grad is not None:
                    grad.mul_(grad_output)
        return grads.hidden, grads.weight, grads.bias, None, None


def linear_target_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    loss: str = "gamma_ce",
    bias: Tensor | None = None,
    class_weight: Tensor | Sequence[float] | None = None,
    chunk_size: int | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    half_matmul: bool = False,
    validate_args: bool = True,
    **hyperparameters: Any,
) -> Tensor:
    """A target-probability loss of the logits ``hidden @ weight.T + bias``, chunk by chunk.

    Equals ``F(hidden @ weight.T + bias, target, ...)`` for the family function ``F`` named by
    ``loss`` (values and gradients), but never builds the ``[N, V]`` logits: rows are
    processed ``chunk_size`` at a time and each chunk's logits live only inside the chunk. Per
    row, ``log p_t = x_t - logsumexp(x)`` and the loss is ``phi(log p_t)``:

    ==================  =====================================================  ====================================
    ``loss``            ``phi(log p_t)``                                       keywords
    ==================  =====================================================  ====================================
    ``ce``              ``-log p_t``
    ``gamma_ce``        ``-log(g + (1-g) p_t)/(1-g)``; ``-max(b, w) log p_t``  ``gamma=0.5, threshold=0``
    ``soft_accuracy``   ``1 - p_t``
    ``focal``           ``-(1-p_t)^gamma log p_t``                             ``gamma=2``
    ``adaptive_focal``  focal, ``gamma`` from ``p_t`` (FLSD-53)                ``thresholds=(0.2,), gammas=(5, 3)``
    ``hard_truncated``  ``-log p_t`` where ``p_t <= margin``, else 0           ``margin=0.5``
    ``poly1``           ``-log p_t + epsilon (1 - p_t)`` (Poly-1)              ``epsilon=1``
    ==================  =====================================================  ====================================

    ``ce`` and ``gamma_ce`` also take ``label_smoothing=eps`` in ``[0, 1)`` (default 0), with
    the meaning of :func:`~lightning_losses.functional.cross_entropy` and
    :func:`~lightning_losses.functional.gamma_cross_entropy` (TaiLr's form): per row
    ``(1 - eps) * w_t * phi(log p_t) + eps / V * sum_c w_c (-log p_c)``, ``w`` the class
    weights (all 1 without ``class_weight``). The sum comes from each chunk's logits (``W
    lse - sum_c w_c x_c``, ``W = sum_c w_c``) and its gradient ``W softmax - w`` joins the
    chunk's gradient in the same pass: still no ``[N, V]`` tensor. The other losses accept
    only ``label_smoothing=0`` (a ``TypeError`` otherwise).

    The gradient with respect to the logits is ``-phi'(log p_t) (softmax(x) - onehot(t))``,
    so with ``"mean"`` or ``"sum"`` the gradients of ``hidden``, ``weight`` and ``bias`` are
    accumulated in the forward pass and the backward only scales them (it cannot run twice;
    use ``"none"`` for ``retain_graph``). ``"none"`` recomputes each chunk's logits in the
    backward pass: one matrix product more per chunk (about 4/3 the time), same memory.
    When nothing requires a gradient, no gradient work is done. Half-precision inputs are
    computed in float32 (the weight is cast once, each chunk's rows as it comes), or with
    ``half_matmul=True`` multiplied in their own precision (the products accumulate in float32
    but round their results to half; softmax, ``phi`` and the sums over chunks stay float32).
    The loss is returned in float32 and the gradients in the inputs' dtypes. Autocast is
    disabled inside.

    Sources: TaiLr (Ji et al., ICLR 2023) for ``gamma_ce``, which was made for text
    generation; focal loss (Lin et al., 2017); Poly-1 (Leng et al., "PolyLoss", ICLR 2022);
    PyTorch's chunked ``linear_cross_entropy`` for the chunking.

    Args:
        hidden: ``[N, H]`` or ``[B, L, H]`` (any leading shape) hidden states.
        weight: ``[V, H]`` output weight (e.g. a tied embedding).
        target: class indices of the shape of ``hidden`` without its last dimension.
        loss: a name of the family: ``ce``, ``gamma_ce``, ``soft_accuracy``, ``focal``,
            ``adaptive_focal``, ``hard_truncated``, ``poly1``.
        bias: optional ``[V]`` output bias.
        class_weight: optional ``[V]`` float weight per class, finite and ``>= 0``: row ``i``
            counts ``w[t_i]`` times, and ``"mean"`` divides by the sum of the weights of the
            non-ignored rows (0 when that sum is 0),
            as ``weight`` of :func:`torch.nn.functional.cross_entropy` and of the plain-logits
            losses. (Focal's ``alpha`` weighs rows alike, but its ``"mean"`` divides by the
            number of rows: use ``"sum"`` and divide yourself for that.)
        chunk_size: rows per chunk; ``None`` chooses :func:`default_chunk_size` (at most 64
            MiB of float32 logits and ``H`` rows, at least ``min(256, H / 2)`` rows).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape of ``target``, 0 where ignored), ``"mean"`` (over the
            non-ignored rows; 0 with zero gradient when there are none) or ``"sum"``.
        half_matmul: with bfloat16 / float16 ``hidden`` and ``weight``, run the three matrix
            products in that precision (faster where the hardware has half matrix units: 1.75x
            for bfloat16 on a CPU with AMX; logits and gradients then carry half rounding).
            No effect on float32 and float64 inputs.
        validate_args: check target values, that ``hidden``, ``weight`` and ``bias`` are
            finite and that ``class_weight`` is finite and ``>= 0`` (device synchronisations).
            Finding the non-ignored rows synchronises once in any case.
        **hyperparameters: the loss's keywords above (``label_smoothing`` for ``ce`` and
            ``gamma_ce``), checked as in the plain-logits loss.

    Example:
        >>> hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> weight = torch.tensor([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
        >>> target = torch.tensor([0, 2])
        >>> linear_target_loss(hidden, weight, target, loss="ce", reduction="none")
        tensor([0.2395, 1.0986])
        >>> linear_target_loss(hidden, weight, target, loss="focal", gamma=2.0, reduction="none")
        tensor([0.0109, 0.4883])
        >>> linear_target_loss(hidden, weight, target, loss="gamma_ce", gamma=1.0)  # 1 - p_t
        tensor(0.4398)
        >>> linear_target_loss(hidden, weight, target, loss="poly1", epsilon=1.0, reduction="none")
        tensor([0.4526, 1.7653])
        >>> linear_target_loss(hidden, weight, target, loss="ce", label_smoothing=0.3,
        ...                    reduction="none")
        tensor([0.6395, 1.0986])
    """  # noqa: E501
    check_reduction(reduction)
    phi, resolved = resolve_loss(loss, hyperparameters)
    label_smoothing = resolved.pop("label_smoothing", 0.0)
    check_chunk_size(chunk_size)
    _check_inputs(hidden, weight, target, bias, ignore_index, validate_args)
    class_weight = _check_class_weight(class_weight, weight, validate_args)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_target = target.reshape(-1)
    grad_enabled = torch.is_grad_enabled()
    needs = (
        grad_enabled and hidden.requires_grad,
        grad_enabled and weight.requires_grad,
        grad_enabled and bias is not None and bias.requires_grad,
    )
    spec = _Spec(
        phi,
        resolved,
        reduction,
        ignore_index,
        chunk_size,
        needs,
        bool(half_matmul),
        class_weight,
        label_smoothing,
    )
    if any(needs):
        result = _LinearTargetLoss.apply(flat_hidden, weight, bias, flat_target, spec)
    else:
        with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
            head = spec.head(flat_hidden, weight, bias, flat_target)
            values, _, _ = _forward_chunks(head, phi, resolved, label_smoothing=label_smoothing)
            result = _reduce(head, values, reduction)
    return result.reshape(target.shape) if reduction == "none" else result


@torch.no_grad()
def linear_prediction_statistics(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    bias: Tensor | None = None,
    chunk_size: int | None = None,
    ignore_index: int = -100,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token ``log p_t``, top-label confidence and correctness, chunk by chunk, no gradient.

    For the non-ignored rows of ``logits = hidden @ weight.T + bias`` (in their flattened
    order): ``log p_t = x_t - logsumexp(x)`` (so ``-log p_t`` is the token's cross-entropy
    whatever loss trained the model), the confidence ``max_j softmax(x)_j = 1 / sum_j
    exp(x_j - max x)`` and whether ``argmax x == t``. These are what perplexity and a top-label
    calibration error need, without the ``[N, V]`` logits.

    Args:
        hidden: ``[N, H]`` or ``[B, L, H]`` hidden states.
        weight: ``[V, H]`` output weight.
        target: class indices of the shape of ``hidden`` without its last dimension.
        bias: optional ``[V]`` output bias.
        chunk_size: rows per chunk (``None``: :func:`default_chunk_size`).
        ignore_index: rows with this target are left out.

    Returns:
        ``(log_p, confidence, correct)``, each ``[count]``: float32 at least, and bool.

    Example:
        >>> hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> weight = torch.tensor([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
        >>> log_p, confidence, correct = linear_prediction_statistics(
        ...     hidden, weight, torch.tensor([0, 2, -100])
        ... )
        >>> -log_p, confidence, correct
        (tensor([0.2395, 1.0986]), tensor([0.7870, 0.3333]), tensor([ True, False]))
    """
    _check_inputs(hidden, weight, target, bias, ignore_index, validate_args=False)
    with torch.autocast(hidden.device.type, enabled=False):
        head = _Head.build(
            hidden.reshape(-1, hidden.shape[-1]),
            weight,
            bias,
            target.reshape(-1),
            ignore_index,
            chunk_size,
        )
        device = hidden.device
        log_p = torch.empty(head.count, dtype=head.dtype, device=device)
        confidence = torch.empty_like(log_p)
        correct = torch.empty(head.count, dtype=torch.bool, device=device)
        if head.count == 0:
            return log_p, confidence, correct
        buffer = head.logits_buffer()
        for start, size, _, chunk_hidden, chunk_target in head.chunks():
            logits = head.logits(chunk_hidden, buffer.narrow(0, 0, size))
            top, prediction = logits.max(1, keepdim=True)
            logits.sub_(top)
            target_logit = logits.gather(1, chunk_target.unsqueeze(1)).squeeze(1)
            denominator = logits.clamp_(min=_exp_floor(head.dtype)).exp_().sum(1)
            log_p.narrow(0, start, size).copy_(target_logit - denominator.log())
            confidence.narrow(0, start, size).copy_(denominator.reciprocal())
            correct.narrow(0, start, size).copy_(prediction.squeeze(1) == chunk_target)
    return log_p, confidence, correct
