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

Per-token weights (``token_weight=``) and PaLM's z-loss (``z_loss=``) join the per-row
coefficients of the same gradient. The passes over a chunk's logits are torch operations
(``backend="torch"``) or two Triton kernels (``backend="triton"``,
:mod:`lightning_losses.kernels.linear_head`); the chunk loop itself lives in
:mod:`lightning_losses.functional._linear_chunks`, this module holds the checks, the autograd
function and the public functions.

Source: the chunked head follows PyTorch's ``linear_cross_entropy`` (batch-chunked, gradients
precomputed in forward); the family and its ``phi`` are those of the target-probability
family (TaiLr's gamma-CE, focal loss, Poly-1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_losses.functional._core import Phi
from lightning_losses.functional._linear_chunks import (
    CHUNK_BYTES,
    MIN_CHUNK_ROWS,
    Grads,
    Head,
    Terms,
    backward_chunks,
    default_chunk_size,
    exp_floor,
    forward_chunks,
    reduce_rows,
)
from lightning_losses.functional.checks import (
    check_class_indices,
    check_class_weights,
    check_finite,
    check_ignore_index,
    check_int,
    check_real,
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
    "CHUNK_BYTES",
    "LINEAR_TARGET_LOSSES",
    "MIN_CHUNK_ROWS",
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


@dataclass(frozen=True)
class _Spec:
    terms: Terms
    reduction: str
    ignore_index: int
    chunk_size: int | None
    needs: tuple[bool, bool, bool]
    half_matmul: bool
    class_weight: Tensor | None = None
    kernels: bool = False

    def head(
        self,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        token_weight: Tensor | None,
    ) -> Head:
        """The rows of one call, as this spec walks them."""
        return Head.build(
            hidden,
            weight,
            bias,
            target,
            self.ignore_index,
            self.chunk_size,
            self.half_matmul,
            self.class_weight,
            token_weight,
            self.kernels,
        )


class _LinearTargetLoss(torch.autograd.Function):
    """Autograd of the chunked loss.

    Gradients come from the forward pass (mean / sum), or are recomputed chunk by chunk in the
    backward pass (none). ``token_weight`` gets no gradient.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        token_weight: Tensor | None,
        spec: _Spec,
    ) -> Tensor:
        ctx.spec = spec
        with torch.autocast(hidden.device.type, enabled=False):
            head = spec.head(hidden, weight, bias, target, token_weight)
            if spec.reduction == "none":
                values, lse, derivatives = forward_chunks(head, spec.terms, keep_for_backward=True)
                ctx.save_for_backward(hidden, weight, bias, target, token_weight, lse, derivatives)
                return reduce_rows(head, values, "none")
            mean = spec.reduction == "mean" and head.total_weight > 0
            scale = 1.0 / head.total_weight if mean else 1.0
            grads = Grads.zeros(head, spec.needs)
            values, _, _ = forward_chunks(head, spec.terms, grads=grads, scale=scale)
            ctx.grads = grads.finish(weight, bias)
            return reduce_rows(head, values, spec.reduction)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        spec: _Spec = ctx.spec
        if spec.reduction == "none":
            hidden, weight, bias, target, token_weight, lse, derivatives = ctx.saved_tensors
            with torch.autocast(grad_output.device.type, enabled=False):
                head = spec.head(hidden, weight, bias, target, token_weight)
                grad_rows = grad_output.reshape(-1)
                if head.rows is not None:
                    grad_rows = grad_rows.index_select(0, head.rows)
                grads = Grads.zeros(head, ctx.needs_input_grad[:3])
                backward_chunks(head, spec.terms, lse, derivatives, grad_rows, grads)
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
        return grads.hidden, grads.weight, grads.bias, None, None, None


def _check_token_weight(token_weight: Any, target: Tensor, validate_args: bool) -> Tensor | None:
    """``token_weight``: ``None`` or a float tensor of ``target``'s shape; finite and ``>= 0``."""
    if token_weight is None:
        return None
    if not isinstance(token_weight, Tensor) or not token_weight.is_floating_point():
        got = (
            token_weight.dtype if isinstance(token_weight, Tensor) else type(token_weight).__name__
        )
        raise TypeError(f"token_weight must be a floating-point tensor; got {got}")
    if tuple(token_weight.shape) != tuple(target.shape):
        raise ValueError(
            f"token_weight must have the shape of target, {list(target.shape)}; "
            f"got {list(token_weight.shape)}"
        )
    check_same_device("token_weight", token_weight, "target", target)
    if validate_args and token_weight.numel() > 0:
        bad = ~((token_weight >= 0) & torch.isfinite(token_weight))
        if bool(bad.any()):
            index = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"token_weight must be finite and >= 0; found {token_weight[index].item()!r} "
                f"at token_weight{list(index)}"
            )
    return token_weight.detach().reshape(-1)


def _use_kernels(backend: str, hidden: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether ``backend`` runs the head's Triton kernels for these inputs (see ``backend``)."""
    from lightning_losses.kernels.availability import KERNEL_DTYPES, use_kernels

    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch'; got {backend!r}")
    if backend == "torch":
        return False
    dtypes = [t.dtype for t in (hidden, weight, bias) if t is not None]
    if any(dtype not in KERNEL_DTYPES for dtype in dtypes):
        if backend == "auto":
            return False
        raise RuntimeError(
            "backend='triton' reads float32, float16 or bfloat16 hidden, weight and bias; got "
            f"{', '.join(str(d) for d in dtypes)} (use backend='torch' or 'auto')"
        )
    return use_kernels(hidden, backend)


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
    token_weight: Tensor | None = None,
    z_loss: float = 0.0,
    backend: str = "auto",
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

    Per-token weights and z-loss: with ``token_weight = u`` and ``z_loss = z`` the loss of
    row ``i`` is ``u_i (l_i + z lse_i^2)``, ``l_i`` the loss above (class weight and label
    smoothing included) and ``lse_i = logsumexp(x_i)``; z-loss is PaLM's auxiliary term
    (gradient ``2 z lse_i softmax(x_i)``), which keeps the log-normaliser near 0.
    ``"mean"`` divides the sum of these by ``sum_i u_i c_{t_i}`` over the non-ignored rows
    (``c`` the class weights, 1 without them): ``sum_i u_i loss_i / sum_i u_i`` without class
    weights, the plain mean with neither (0, with zero gradient, when the divisor is 0).
    ``token_weight`` gets no gradient.

    Backends: ``"torch"`` runs every pass over a chunk's logits with torch operations;
    ``"triton"`` runs them with the two Triton kernels of
    :mod:`lightning_losses.kernels.linear_head` (one statistics pass, one gradient pass
    that overwrites the chunk's logits; the matrix products stay torch's, so the head is
    Liger-Kernel's chunked design; deterministic under
    ``torch.use_deterministic_algorithms(True)``, no atomics), on CUDA tensors or on CPU
    tensors under ``TRITON_INTERPRET=1``; ``"auto"`` picks the kernels only where
    :func:`~lightning_losses.kernels.availability.use_kernels` does (CUDA tensors of float32,
    float16 or bfloat16, Triton installed and
    :data:`~lightning_losses.kernels.availability.AUTO_USES_KERNELS` on), the torch path
    elsewhere. Both give the same values and gradients up to float32 rounding.

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
        token_weight: optional float weight per token, of ``target``'s shape, finite and
            ``>= 0``: multiplies the token's loss and gradient (see above for ``"mean"``).
        z_loss: coefficient ``z >= 0`` of the z-loss term ``z lse^2`` per token (default 0).
        backend: ``"auto"`` (default), ``"triton"`` or ``"torch"`` (see above).
            ``"triton"`` raises a ``RuntimeError`` where the kernels cannot run.
        validate_args: check target values, that ``hidden``, ``weight`` and ``bias`` are
            finite and that ``class_weight`` and ``token_weight`` are finite and ``>= 0``
            (device synchronisations).
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
        >>> linear_target_loss(hidden, weight, target, loss="ce", z_loss=0.01, reduction="none")
        tensor([0.2897, 1.1107])
        >>> linear_target_loss(hidden, weight, target, loss="ce",  # (3 * 0.2395 + 1.0986) / 4
        ...                    token_weight=torch.tensor([3.0, 1.0]))
        tensor(0.4543)
    """  # noqa: E501
    check_reduction(reduction)
    phi, resolved = resolve_loss(loss, hyperparameters)
    label_smoothing = resolved.pop("label_smoothing", 0.0)
    check_chunk_size(chunk_size)
    z_loss = check_real("z_loss", z_loss, low=0.0)
    _check_inputs(hidden, weight, target, bias, ignore_index, validate_args)
    kernels = _use_kernels(backend, hidden.reshape(-1, hidden.shape[-1]), weight, bias)
    class_weight = _check_class_weight(class_weight, weight, validate_args)
    token_weight = _check_token_weight(token_weight, target, validate_args)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_target = target.reshape(-1)
    grad_enabled = torch.is_grad_enabled()
    needs = (
        grad_enabled and hidden.requires_grad,
        grad_enabled and weight.requires_grad,
        grad_enabled and bias is not None and bias.requires_grad,
    )
    spec = _Spec(
        Terms(phi, resolved, label_smoothing, z_loss),
        reduction,
        ignore_index,
        chunk_size,
        needs,
        bool(half_matmul),
        class_weight,
        kernels,
    )
    if any(needs):
        result = _LinearTargetLoss.apply(flat_hidden, weight, bias, flat_target, token_weight, spec)
    else:
        with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
            head = spec.head(flat_hidden, weight, bias, flat_target, token_weight)
            values, _, _ = forward_chunks(head, spec.terms)
            result = reduce_rows(head, values, reduction)
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
        head = Head.build(
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
            denominator = logits.clamp_(min=exp_floor(head.dtype)).exp_().sum(1)
            log_p.narrow(0, start, size).copy_(target_logit - denominator.log())
            confidence.narrow(0, start, size).copy_(denominator.reciprocal())
            correct.narrow(0, start, size).copy_(prediction.squeeze(1) == chunk_target)
    return log_p, confidence, correct
