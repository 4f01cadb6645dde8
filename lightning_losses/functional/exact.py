"""EXACT: the probability that the target wins under Gaussian noise, by quadrature.

After Su Jianlin, "How to train your accuracy?".

``P(t) = P(argmax_j (x_j / sigma + e_j) = t)`` with ``e ~ N(0, I)``. Conditioning on the
target's noise ``u`` gives a one-dimensional integral,
``P = ∫ phi(u) prod_{j != t} Phi((x_t - x_j) / sigma + u) du``, which Gauss–Hermite quadrature
with ``n_nodes`` nodes evaluates deterministically, centred per row on the integrand's
mode (adaptive Gauss–Hermite) so that small probabilities keep their relative accuracy and
``-log P`` stays exact when the target trails. Everything runs in log space
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

from lightning_losses.functional._core import compute_dtype, reduce_loss
from lightning_losses.functional.checks import (
    check_flag,
    check_index_target,
    check_int,
    check_range,
    check_reduction,
    check_same_device,
)
from lightning_losses.functional.target_probability import check_no_label_smoothing
from lightning_losses.loss_ranges import LOSS_RANGES

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)


@functools.lru_cache(maxsize=16)
def _gauss_hermite(n_nodes: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Nodes ``u_i = sqrt(2) z_i`` and log-weights ``log(w_i / sqrt(pi))`` for ``E[f(u)]``."""
    z, w = np.polynomial.hermite.hermgauss(n_nodes)
    return tuple(math.sqrt(2.0) * z), tuple(np.log(w) - 0.5 * math.log(math.pi))


def _inverse_mills(z: Tensor) -> Tensor:
    """``phi(z) / Phi(z) = sqrt(2/pi) / erfcx(-z / sqrt 2)``.

    No cancellation for ``z << 0`` (where it tends to ``-z``), and 0 at ``z = +inf``.
    """
    return _SQRT_2_OVER_PI / torch.special.erfcx(-z * _SQRT_HALF)


@torch.no_grad()
def _adaptive_nodes(margin: Tensor, is_target: Tensor, steps: int = 5) -> tuple[Tensor, Tensor]:
    """Centre ``mu`` and width ``s`` per row for adaptive Gauss–Hermite quadrature.

    The integrand ``phi(u) prod_j Phi(d_j + u)`` is log-concave; ``mu`` is its mode (Newton on
    ``g(u) = -u^2/2 + sum_j log Phi(d_j + u)`` from 0) and ``s = 1 / sqrt(-g''(mu))`` its width.
    When the target trails another class the mass sits far in the tail of ``phi``, where plain
    Gauss–Hermite nodes never reach; centring the nodes there keeps ``log P`` accurate.
    The integral does not depend on ``mu`` and ``s``, so they carry no gradient.
    """
    dtype = margin.dtype
    margin = margin.double()  # z + phi(z)/Phi(z) cancels for z << 0: float64 keeps it
    mu = torch.zeros(margin.shape[0], dtype=margin.dtype, device=margin.device)
    for _ in range(steps + 1):
        z = margin + mu[:, None]
        lam = _inverse_mills(z)
        # g''(u) = -1 + sum_j lambda'(z_j), lambda' = -lambda (z + lambda), in [-1, 0]
        lam_slope = torch.where(is_target, 0.0, -lam * (z + lam)).clamp(-1.0, 0.0)
        curvature = -1.0 + lam_slope.sum(dim=1)
        slope = -mu + lam.sum(dim=1)
        mu = mu - slope / curvature
    return mu.to(dtype), torch.rsqrt(-curvature).to(dtype)


class _ExactLogProb(torch.autograd.Function):
    """``log P`` per row from margins ``d_j = (x_t - x_j) / sigma`` (``d_t = +inf``)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, sigma: Tensor, target: Tensor, n_nodes: int) -> Tensor:
        nodes, log_weights = _gauss_hermite(n_nodes)
        is_target = torch.zeros_like(logits, dtype=torch.bool)
        is_target.scatter_(1, target[:, None], True)
        x_t = logits.gather(1, target[:, None])
        margin = ((x_t - logits) / sigma[:, None]).masked_fill(is_target, math.inf)
        mu, width = _adaptive_nodes(margin, is_target)
        # E[f(u)] = E_v[ s * phi(mu + s v) / phi(v) * f(mu + s v) ],  v ~ N(0, 1)
        shifted_nodes = [mu + width * v for v in nodes]
        terms = torch.stack(
            [
                torch.special.log_ndtr(margin + u[:, None]).sum(dim=1)
                + lw
                + torch.log(width)
                + 0.5 * v * v
                - 0.5 * u * u
                for u, v, lw in zip(shifted_nodes, nodes, log_weights, strict=True)
            ],
            dim=1,
        )
        # A probability: quadrature can round it a few ulps above 1 (log P = 2e-16), which would
        # make 1 - P (and -log P) negative.
        log_p = torch.logsumexp(terms, dim=1).clamp(max=0.0)
        ctx.save_for_backward(margin, sigma, is_target, terms, mu, width)
        ctx.n_nodes = n_nodes
        return log_p

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_log_p: Tensor) -> tuple[Tensor | None, ...]:
        margin, sigma, is_target, terms, mu, width = ctx.saved_tensors
        nodes, _ = _gauss_hermite(ctx.n_nodes)
        # Normalised directly: exp(terms - log_p) drifts when log_p is ~1e8 in float32.
        responsibility = torch.softmax(terms, dim=1)
        grad_margin = torch.zeros_like(margin)
        for i, v in enumerate(nodes):
            shifted = margin + (mu + width * v)[:, None]
            grad_margin += responsibility[:, i : i + 1] * _inverse_mills(shifted)
        grad_margin = (grad_margin * grad_log_p[:, None]).masked_fill(is_target, 0.0)
        scaled = grad_margin / sigma[:, None]
        grad_logits = grad_sigma = None
        if ctx.needs_input_grad[0]:
            grad_logits = is_target * scaled.sum(dim=1, keepdim=True) - scaled
        if ctx.needs_input_grad[1]:
            finite_margin = margin.masked_fill(is_target, 0.0)
            grad_sigma = -(scaled * finite_margin).sum(dim=1)
        return grad_logits, grad_sigma, None, None


def check_exact(sigma: float | Tensor) -> None:
    """``sigma`` of EXACT: a finite float ``> 0`` (a per-sample tensor is checked by the loss)."""
    if not isinstance(sigma, Tensor):
        check_range("sigma", sigma, **LOSS_RANGES["exact"]["sigma"])


def check_exact_options(*, log: bool, n_nodes: int) -> None:
    """``log`` a bool, ``n_nodes`` an integer ``>= 2``."""
    check_flag("log", log)
    check_int("n_nodes", n_nodes, low=2)


def _check_sigma_tensor(sigma: Tensor, logits: Tensor, validate_args: bool) -> None:
    """A tensor ``sigma``: a scalar or ``[N]``, on the logits' device, finite and ``> 0``."""
    if sigma.dim() > 1 or (sigma.dim() == 1 and sigma.shape[0] != logits.shape[0]):
        raise ValueError(
            f"sigma must be a float, a scalar tensor or a tensor of shape [{logits.shape[0]}]"
            f" (one per sample); got shape {list(sigma.shape)}"
        )
    check_same_device("sigma", sigma, "logits", logits)
    if validate_args and not bool(((sigma > 0) & torch.isfinite(sigma)).all()):
        raise ValueError("sigma must be finite and positive; found a value <= 0, NaN or inf")


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
    label_smoothing: float = 0.0,
    validate_args: bool = True,
) -> Tensor:
    """EXACT: one minus the probability that the target wins under Gaussian noise.

    After Su Jianlin, "How to train your accuracy?".

    ``P = P(argmax_j (x_j / sigma + e_j) = t) = ∫ phi(u) prod_{j != t} Phi((x_t - x_j)/sigma + u)
    du``, ``e ~ N(0, I)``, computed by Gauss–Hermite quadrature. The loss is ``1 - P`` (the
    expected error of the noisy argmax classifier, a smooth accuracy), or ``-log P`` with
    ``log=True``. For two classes ``P = Phi((x_t - x_o) / (sigma * sqrt 2))``.

    Source: Karpukhin et al., "EXACT: How to Train Your Accuracy" (2022).

    Args:
        logits: ``[N, C]`` scores.
        target: ``[N]`` class indices in ``[0, C)`` or ``ignore_index``.
        sigma: noise scale, a finite float ``> 0`` or a positive per-sample tensor ``[N]`` on
            the logits' device (the paper's scalar network; gradients flow into it).
        log: return ``-log P`` instead of ``1 - P``.
        n_nodes: Gauss–Hermite nodes (32 agree with adaptive quadrature to 1e-7 on
            10-class logits of scale 3).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N]``), ``"mean"`` or ``"sum"``.
        label_smoothing: only 0 is accepted (so that a config may keep the key); other
            values raise ``TypeError``: label smoothing belongs to cross-entropy and gamma
            cross-entropy.
        validate_args: check target values, finite logits and that a tensor ``sigma`` is
            finite and positive.

    Example:
        >>> logits = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
        >>> exact_loss(logits, torch.tensor([0, 1]), reduction="none")  # 1 - Phi(d / sqrt 2)
        tensor([0.2398, 0.5000])
    """
    check_no_label_smoothing("EXACT", label_smoothing)
    check_reduction(reduction)
    check_exact(sigma)
    check_exact_options(log=log, n_nodes=n_nodes)
    check_index_target(logits, target, ignore_index=ignore_index, validate_args=validate_args)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [N, C] for EXACT; got {list(logits.shape)}")
    if isinstance(sigma, Tensor):
        _check_sigma_tensor(sigma, logits, validate_args)
    valid = target != ignore_index
    log_p = exact_log_probability(
        logits, torch.where(valid, target, 0), sigma=sigma, n_nodes=n_nodes
    )
    loss = -log_p if log else -torch.expm1(log_p)
    loss = torch.where(valid, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    return reduce_loss(loss, reduction, valid.sum())
