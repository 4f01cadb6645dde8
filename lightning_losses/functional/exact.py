"""EXACT (seed 000): the probability that the target wins under Gaussian noise, by quadrature.

``P(t) = P(argmax_j (x_j / sigma + e_j) = t)`` with ``e ~ N(0, I)``. Conditioning on the
target's noise ``u`` gives a one-dimensional integral,
``P = ∫ phi(u) prod_{j != t} Phi((x_t - x_j) / sigma + u) du``, which Gauss–Hermite quadrature
with ``n_nodes`` nodes evaluates deterministically. Everything runs in log space
(``log_ndtr``); the forward and backward loop over the nodes, so memory stays at a few
``[N, C]`` tensors however many nodes are used, and the gradient is the exact derivative of the
quadrature (``phi / Phi`` ratios), not a sampled one.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._core import compute_dtype, reduce_loss
from ._validation import check_index_target, check_range, check_reduction

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@functools.lru_cache(maxsize=16)
def _gauss_hermite(n_nodes: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Nodes ``u_i = sqrt(2) z_i`` and log-weights ``log(w_i / sqrt(pi))`` for ``E[f(u)]``."""
    z, w = np.polynomial.hermite.hermgauss(n_nodes)
    return tuple(math.sqrt(2.0) * z), tuple(np.log(w) - 0.5 * math.log(math.pi))


def _log_pdf(z: Tensor) -> Tensor:
    return -0.5 * z * z - _LOG_SQRT_2PI


class _ExactLogProb(torch.autograd.Function):
    """``log P`` per row from margins ``d_j = (x_t - x_j) / sigma`` (``d_t = +inf``)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, sigma: Tensor, target: Tensor, n_nodes: int) -> Tensor:
        nodes, log_weights = _gauss_hermite(n_nodes)
        is_target = torch.zeros_like(logits, dtype=torch.bool)
        is_target.scatter_(1, target[:, None], True)
        x_t = logits.gather(1, target[:, None])
        margin = ((x_t - logits) / sigma[:, None]).masked_fill(is_target, math.inf)
        terms = torch.stack(
            [
                torch.special.log_ndtr(margin + u).sum(dim=1) + lw
                for u, lw in zip(nodes, log_weights, strict=True)
            ],
            dim=1,
        )
        log_p = torch.logsumexp(terms, dim=1)
        ctx.save_for_backward(margin, sigma, is_target, terms, log_p)
        ctx.n_nodes = n_nodes
        return log_p

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_log_p: Tensor) -> tuple[Tensor | None, ...]:
        margin, sigma, is_target, terms, log_p = ctx.saved_tensors
        nodes, _ = _gauss_hermite(ctx.n_nodes)
        responsibility = torch.exp(terms - log_p[:, None])  # softmax over the nodes
        grad_margin = torch.zeros_like(margin)
        for i, u in enumerate(nodes):
            shifted = margin + u
            inverse_mills = torch.exp(_log_pdf(shifted) - torch.special.log_ndtr(shifted))
            grad_margin += responsibility[:, i : i + 1] * inverse_mills
        grad_margin = (grad_margin * grad_log_p[:, None]).masked_fill(is_target, 0.0)
        scaled = grad_margin / sigma[:, None]
        grad_logits = grad_sigma = None
        if ctx.needs_input_grad[0]:
            grad_logits = is_target * scaled.sum(dim=1, keepdim=True) - scaled
        if ctx.needs_input_grad[1]:
            finite_margin = margin.masked_fill(is_target, 0.0)
            grad_sigma = -(scaled * finite_margin).sum(dim=1)
        return grad_logits, grad_sigma, None, None


def exact_log_probability(
    logits: Tensor, target: Tensor, *, sigma: float | Tensor = 1.0, n_nodes: int = 32
) -> Tensor:
    """``log P(argmax_j(x_j/sigma + e_j) = t)`` per row of ``[N, C]`` logits (no checks)."""
    dtype = compute_dtype(logits.dtype)
    x = logits.to(dtype)
    sigma_rows = torch.as_tensor(sigma, dtype=dtype, device=x.device).expand(x.shape[0])
    return _ExactLogProb.apply(x, sigma_rows, target, n_nodes)


def exact_loss(
    logits: Tensor,
    target: Tensor,
    *,
    sigma: float | Tensor = 1.0,
    log: bool = False,
    n_nodes: int = 32,
    ignore_index: int = -100,
    reduction: str = "mean",
    validate_args: bool = True,
) -> Tensor:
    """EXACT: one minus the probability that the target wins under Gaussian noise (seed 000).

    ``P = P(argmax_j (x_j / sigma + e_j) = t) = ∫ phi(u) prod_{j != t} Phi((x_t - x_j)/sigma + u)
    du``, ``e ~ N(0, I)``, computed by Gauss–Hermite quadrature. The loss is ``1 - P`` (the
    expected error of the noisy argmax classifier, a smooth accuracy), or ``-log P`` with
    ``log=True``. For two classes ``P = Phi((x_t - x_o) / (sigma * sqrt 2))``.

    Source: Karpukhin et al., "EXACT: How to Train Your Accuracy" (2022); seed 000.

    Args:
        logits: ``[N, C]`` scores.
        target: ``[N]`` class indices in ``[0, C)`` or ``ignore_index``.
        sigma: noise scale, a float ``> 0`` or a positive per-sample tensor ``[N]`` (the
            paper's scalar network; gradients flow into it).
        log: return ``-log P`` instead of ``1 - P``.
        n_nodes: Gauss–Hermite nodes (32 agree with adaptive quadrature to 1e-7 on
            10-class logits of scale 3).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N]``), ``"mean"`` or ``"sum"``.
        validate_args: check target values and that a tensor ``sigma`` is positive.

    Example:
        >>> logits = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
        >>> exact_loss(logits, torch.tensor([0, 1]), reduction="none")  # 1 - Phi(d / sqrt 2)
        tensor([0.2398, 0.5000])
    """
    check_reduction(reduction)
    check_index_target(logits, target, ignore_index=ignore_index, validate_args=validate_args)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [N, C] for EXACT; got {list(logits.shape)}")
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or n_nodes < 2:
        raise ValueError(f"n_nodes must be an integer >= 2; got {n_nodes!r}")
    if isinstance(sigma, Tensor):
        if sigma.dim() > 1 or (sigma.dim() == 1 and sigma.shape[0] != logits.shape[0]):
            raise ValueError(
                f"sigma must be a float, a scalar tensor or a tensor of shape [{logits.shape[0]}]"
                f" (one per sample); got shape {list(sigma.shape)}"
            )
        if validate_args and bool((sigma <= 0).any()):
            raise ValueError("sigma must be positive; found a value <= 0")
    else:
        check_range("sigma", sigma, low=0.0, low_open=True)
    valid = target != ignore_index
    log_p = exact_log_probability(
        logits, torch.where(valid, target, 0), sigma=sigma, n_nodes=n_nodes
    )
    loss = -log_p if log else -torch.expm1(log_p)
    loss = torch.where(valid, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    return reduce_loss(loss, reduction, valid.sum())
