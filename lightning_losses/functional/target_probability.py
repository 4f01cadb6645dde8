"""The target-probability family: losses ``phi(log p_t)`` of the target's softmax probability.

Each loss here is one scalar function ``phi`` (value and derivative, in log space) run by the
shared core in :mod:`lightning_losses.functional._core`, so each costs what cross-entropy costs.
Notation: ``log p_t = x_t - logsumexp(x)``, ``p_t = exp(log p_t)``, ``q = 1 - p_t =
-expm1(log p_t)`` (never ``1 - exp``, which loses every digit when ``p_t`` is near 1).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from lightning_losses.functional._core import (
    Phi,
    phi_cross_entropy,
    quick_cross_entropy,
    target_probability_loss,
)
from lightning_losses.functional.checks import (
    check_range,
)
from lightning_losses.loss_ranges import LOSS_RANGES

# --- phi functions: (log_p, **hyperparameters) -> (value, d value / d log_p) -----------------


def _gamma_ce_weight(log_p: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    """``log(gamma + (1-gamma) p)`` and ``w = p / (gamma + (1-gamma) p)``, both accurately.

    Where ``(1-gamma)(1-p)`` is small, ``log1p(-(1-gamma)(1-p))`` keeps the digits that the
    division by ``1-gamma`` would otherwise expose; elsewhere ``logaddexp(log gamma, log(1-gamma)
    + log p)`` stays exact down to ``p = 0`` and reduces to ``log p`` at ``gamma = 0``.
    """
    a = 1.0 - gamma
    minus_aq = torch.expm1(log_p).mul_(a)  # -a q, q = -expm1(log p)
    near_one = torch.log1p(minus_aq)
    log_gamma = math.log(gamma) if gamma > 0 else -math.inf
    far = torch.logaddexp(torch.full_like(log_p, log_gamma), log_p + math.log(a))
    log_mix = torch.where(minus_aq >= -0.5, near_one, far)
    return log_mix, torch.exp(log_p - log_mix)


def phi_gamma_cross_entropy(
    log_p: Tensor, gamma: float, threshold: float = 0.0
) -> tuple[Tensor, Tensor]:
    """``-log(gamma + (1-gamma) p) / (1-gamma)``, or ``-max(b, w) log p`` with a threshold."""
    if threshold > 0:
        if gamma == 1.0:
            w = torch.exp(log_p)
        else:
            w = _gamma_ce_weight(log_p, gamma)[1]
        factor = torch.clamp_min_(w, threshold).neg_()  # -max(b, w)
        return torch.mul(factor, log_p), factor
    if gamma == 0.0:
        return phi_cross_entropy(log_p)
    if gamma == 1.0:
        return phi_soft_accuracy(log_p)
    log_mix, w = _gamma_ce_weight(log_p, gamma)
    return torch.div(log_mix, -(1.0 - gamma)), w.neg_()


def phi_soft_accuracy(log_p: Tensor) -> tuple[Tensor, Tensor]:
    """``1 - p``."""
    return torch.expm1(log_p).neg_(), torch.exp(log_p).neg_()


def phi_focal(log_p: Tensor, gamma: float | Tensor) -> tuple[Tensor, Tensor]:
    """``-(1-p)^gamma log p`` and its derivative ``(1-p)^gamma (gamma p log p / (1-p) - 1)``.

    ``log p / (1-p)`` tends to -1 as ``p -> 1``, so the derivative stays finite for every
    ``gamma >= 0`` (autograd of ``pow`` would give ``0 * inf`` there when ``gamma < 1``).
    """
    q = torch.expm1(log_p).neg_()
    focal_weight = q.pow(gamma)
    # log p / q is 0 / 0 only where q = 0, i.e. log p = 0: there its limit, -1 (log p <= 0, so
    # q > 0 elsewhere; a NaN log p gives a NaN weight either way, an infinite one stays so)
    ratio = torch.div(log_p, q).nan_to_num_(nan=-1.0, posinf=math.inf, neginf=-math.inf)
    derivative = ratio.mul_(torch.exp(log_p)).mul_(gamma).sub_(1.0).mul_(focal_weight)
    return torch.mul(focal_weight, log_p).neg_(), derivative


def phi_adaptive_focal(
    log_p: Tensor, thresholds: Sequence[float], gammas: Sequence[float]
) -> tuple[Tensor, Tensor]:
    """Focal with ``gamma = gammas[k]``, ``k`` the number of thresholds ``<= p``."""
    boundaries, table = _adaptive_tables(
        tuple(thresholds), tuple(gammas), log_p.dtype, log_p.device
    )
    gamma = table[torch.bucketize(torch.exp(log_p), boundaries, right=True)]
    return phi_focal(log_p, gamma)


@functools.lru_cache(maxsize=32)
def _adaptive_tables(
    thresholds: tuple[float, ...],
    gammas: tuple[float, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """The thresholds and gammas of adaptive focal loss as tensors, made once per setting."""
    return (
        torch.tensor(thresholds, dtype=dtype, device=device),
        torch.tensor(gammas, dtype=dtype, device=device),
    )


def phi_poly1(log_p: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """``-log p + epsilon (1-p)`` and its derivative ``-1 - epsilon p = -(1+epsilon) + epsilon q``.

    ``q = 1 - p = -expm1(log p)`` keeps its digits where ``p`` is near 1, and the derivative is
    written with ``q`` so that at ``epsilon = -1`` it is ``-q`` itself, not ``p - 1`` rounded.
    """
    epsilon_q = torch.expm1(log_p).mul_(-epsilon)  # epsilon * q, q = -expm1(log p)
    return epsilon_q - log_p, epsilon_q - (1.0 + epsilon)


def phi_hard_truncated(log_p: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """``-log p`` where ``p <= margin``, 0 elsewhere."""
    keep = torch.exp(log_p) <= margin
    zero = torch.zeros((), dtype=log_p.dtype, device=log_p.device)
    return torch.where(keep, -log_p, zero), torch.where(keep, -1.0, zero)


#: The family's ``phi`` by registry name (used by the chunked linear-head losses too).
FAMILY: dict[str, Phi] = {
    "ce": phi_cross_entropy,
    "gamma_ce": phi_gamma_cross_entropy,
    "soft_accuracy": phi_soft_accuracy,
    "focal": phi_focal,
    "adaptive_focal": phi_adaptive_focal,
    "hard_truncated": phi_hard_truncated,
    "poly1": phi_poly1,
}


# --- checks of the hyper-parameters ----------------------------------------------------------
# One per loss, called by the loss function, by its module's ``check_hyperparameters`` and by
# the linear-head loss: the ranges are written once.


def check_cross_entropy(label_smoothing: float) -> None:
    """``label_smoothing`` of cross-entropy, a real number in ``[0, 1)``."""
    if isinstance(label_smoothing, Tensor) and label_smoothing.numel() != 1:
        raise TypeError(
            "label_smoothing must be a real number in [0, 1); got a tensor of shape "
            f"{list(label_smoothing.shape)}"
        )
    check_range("label_smoothing", label_smoothing, **LOSS_RANGES["ce"]["label_smoothing"])


def check_gamma_ce(gamma: float, threshold: float, label_smoothing: float = 0.0) -> None:
    """Check gamma cross-entropy's hyper-parameters.

    ``gamma`` and ``threshold`` both in ``[0, 1]``, and ``label_smoothing`` in ``[0, 1)``.
    """
    check_range("gamma", gamma, **LOSS_RANGES["gamma_ce"]["gamma"])
    check_range("threshold", threshold, **LOSS_RANGES["gamma_ce"]["threshold"])
    check_cross_entropy(label_smoothing)


#: The losses that take ``label_smoothing`` other than 0, for the error of those that do not.
SMOOTHED_LOSSES = (
    "cross-entropy and gamma cross-entropy (cross_entropy, gamma_cross_entropy, "
    "CrossEntropyLoss, GammaCrossEntropyLoss, linear_target_loss with loss='ce' or 'gamma_ce')"
)


def check_no_label_smoothing(loss: str, label_smoothing: object) -> None:
    """Accept ``label_smoothing == 0`` (any real zero) and reject every other value.

    The losses without label smoothing take ``label_smoothing=0`` so that a config can switch
    its loss and keep the key; anything else is an error that says which losses take it.

    Raises:
        TypeError: ``label_smoothing`` other than 0 (NaN, a string, ``True`` included).

    Example:
        >>> check_no_label_smoothing("focal loss", 0.0)
        >>> check_no_label_smoothing("focal loss", 0.1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: focal loss does not take label_smoothing (got 0.1): ...
    """
    value = label_smoothing
    if isinstance(value, Tensor) and value.numel() == 1 and value.is_floating_point():
        value = value.item()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return
    raise TypeError(
        f"{loss} does not take label_smoothing (got {label_smoothing!r}): only "
        f"{SMOOTHED_LOSSES} do, where it mixes eps / C times the cross-entropy of every class "
        f"into the loss. {loss[0].upper() + loss[1:]} has no single definition of label "
        "smoothing (smoothing the target inside the loss and adding a uniform term give "
        "different losses); smooth the target yourself or use cross_entropy / "
        "gamma_cross_entropy"
    )


def check_focal(gamma: float) -> None:
    """``gamma`` of focal loss, ``>= 0``."""
    check_range("gamma", gamma, **LOSS_RANGES["focal"]["gamma"])


def check_poly1(epsilon: float) -> None:
    """``epsilon`` of Poly-1, a real number ``>= -1``.

    Below -1 the loss ``-log p + epsilon (1-p)`` is no longer non-negative and the leading
    coefficient ``1 + epsilon`` of its expansion in ``(1-p)`` turns negative.

    Example:
        >>> check_poly1(1.0)
        >>> check_poly1(-2.0)
        Traceback (most recent call last):
        ...
        ValueError: epsilon must lie in [-1, inf); got -2.0
    """
    check_range("epsilon", epsilon, **LOSS_RANGES["poly1"]["epsilon"])


def check_hard_truncated(margin: float) -> None:
    """``margin`` of hard truncation, in ``[0, 1]``."""
    check_range("margin", margin, **LOSS_RANGES["hard_truncated"]["margin"])


def check_adaptive_focal(thresholds: Sequence[float], gammas: Sequence[float]) -> None:
    """Strictly increasing ``thresholds`` in ``[0, 1]`` and one more ``gammas``, each ``>= 0``."""
    for name, values in (("thresholds", thresholds), ("gammas", gammas)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(f"{name} must be a sequence of numbers; got {values!r}")
    thresholds, gammas = tuple(thresholds), tuple(gammas)
    if len(gammas) != len(thresholds) + 1:
        raise ValueError(
            "gammas must hold one more value than thresholds (one gamma per interval of p_t); "
            f"got {len(thresholds)} thresholds and {len(gammas)} gammas"
        )
    for value in thresholds:
        check_range("thresholds", value, **LOSS_RANGES["adaptive_focal"]["thresholds"])
    if any(b <= a for a, b in itertools.pairwise(thresholds)):
        raise ValueError(f"thresholds must be strictly increasing; got {thresholds}")
    for value in gammas:
        check_range("gammas", value, **LOSS_RANGES["adaptive_focal"]["gammas"])


# --- the losses --------------------------------------------------------------------------------


def cross_entropy(
    logits: Tensor,
    target: Tensor,
    *,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Cross-entropy ``-log p_t``: the baseline, with the signature of the rest of the family.

    Equals :func:`torch.nn.functional.cross_entropy` (``label_smoothing`` included, with the
    same meaning) except that a ``"mean"`` over a batch whose targets are all ignored (or whose
    weights sum to 0) is 0 (with zero gradient) instead of NaN.

    With ``label_smoothing = eps > 0`` the target is the mixture ``(1 - eps) onehot(t) + eps /
    C`` of the one-hot target and the uniform distribution over the ``C`` classes (Szegedy et
    al., "Rethinking the Inception Architecture for Computer Vision", 2016). Per element, with
    class weights ``w`` (all 1 without ``weight``)::

        loss = (1 - eps) * w_t * (-log p_t) + eps / C * sum_c w_c * (-log p_c)

    and ``"mean"`` divides the sum over the non-ignored elements by the sum of their ``w_t``
    (their number without ``weight``), as PyTorch does. For ``[N, C]`` logits the smoothing
    term is summed in the fused chunks of the family (``sum_c w_c (-log p_c)`` from each
    chunk's log-softmax; its gradient ``W softmax - w``, ``W = sum_c w_c``, added in the
    backward's one pass), so smoothing keeps no ``[N, C]`` tensor for backward, unlike
    PyTorch's kernel; ``[N, C, *]`` logits keep one log-softmax, as PyTorch does.

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1).
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        weight: optional ``[C]`` class weights, finite and ``>= 0``; ``"mean"`` divides by
            the sum of the weights of the non-ignored elements (0 if that sum is 0).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        label_smoothing: ``eps``, a real number in ``[0, 1)``; 0 is plain cross-entropy.
        validate_args: check target values, finite logits and weights (device
            synchronisations).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the fused kernels of
            :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error) or ``"torch"``.

    Raises:
        ValueError: ``label_smoothing`` outside ``[0, 1)`` or NaN (``TypeError`` if it is not
            a real number); a bad ``reduction``, ``target`` or ``weight``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> cross_entropy(logits, torch.tensor([0, 2]), reduction="none")
        tensor([0.2395, 1.0986])
        >>> cross_entropy(logits, torch.tensor([0, 2]), reduction="none", label_smoothing=0.3)
        tensor([0.6395, 1.0986])
    """
    if weight is None and backend == "auto":
        loss = quick_cross_entropy(
            logits, target, ignore_index, reduction, label_smoothing, validate_args
        )
        if loss is not None:
            return loss
    check_cross_entropy(label_smoothing)
    return target_probability_loss(
        logits,
        target,
        phi_cross_entropy,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
        validate_args=validate_args,
        backend=backend,
    )


def gamma_cross_entropy(
    logits: Tensor,
    target: Tensor,
    *,
    gamma: float = 0.5,
    threshold: float = 0.0,
    label_smoothing: float = 0.0,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Gamma cross-entropy of TaiLr: from cross-entropy to the expected error.

    After Su Jianlin, "A simple remedy for the overconfidence of cross-entropy".

    ``loss = -log(gamma + (1-gamma) p_t) / (1-gamma)``. ``gamma = 0`` is cross-entropy, and as
    ``gamma -> 1`` the loss tends to ``1 - p_t`` (its value at ``gamma = 1``). The gradient is
    ``-w * d log p_t`` with ``w = p_t / (gamma + (1-gamma) p_t)``: cross-entropy's gradient
    down-weighted on samples the model finds unlikely. With ``threshold = b > 0`` it is TaiLr's
    training form ``-max(b, w) log p_t`` with ``w`` held constant (no gradient through ``w``).

    Label smoothing follows TaiLr's released criterion (``tailr_loss`` of its fairseq code),
    which computes, with ``nll = -log p_t``, ``smooth = -sum_c log p_c`` over the ``C``
    classes and ``w = exp(log p_t - log(gamma + (1-gamma) p_t))`` clamped to
    ``[min_weight, 1]`` and detached::

        loss = (1 - eps) * w * nll + eps / C * smooth

    With ``threshold = b > 0`` this loss is exactly that, values and gradients, with
    ``min_weight = b`` (``w <= 1`` always). With ``threshold = 0`` the closed form above has
    the gradient of TaiLr's ``w * nll`` (``w`` detached, ``min_weight = 0``) but another value,
    so the value is ``(1 - eps) * gamma_ce + eps / C * smooth`` and the gradient TaiLr's.
    ``gamma = 0`` is :func:`torch.nn.functional.cross_entropy` with ``label_smoothing=eps``.
    TaiLr has no class weights; with ``weight`` the loss is that of :func:`cross_entropy`:
    ``(1 - eps) * w_t * gamma_ce + eps / C * sum_c w_c (-log p_c)``, and ``"mean"`` divides by
    the sum of ``w_t`` over the non-ignored elements. For ``[N, C]`` logits the smoothing term
    is computed in the fused chunks (no ``[N, C]`` tensor kept for backward).

    Source: Ji et al., "Tailoring Language Generation Models under Total Variation Distance"
    (ICLR 2023), and its released fairseq criterion for label smoothing.

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1).
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        gamma: in ``[0, 1]``.
        threshold: ``b`` in ``[0, 1]``; 0 uses the closed form above.
        label_smoothing: ``eps``, a real number in ``[0, 1)``; 0 is no smoothing.
        weight: optional ``[C]`` class weights, finite and ``>= 0``; ``"mean"`` divides by
            the sum of the weights of the non-ignored elements (0 if that sum is 0).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        validate_args: check target values, finite logits and weights (device
            synchronisations).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the fused kernels of
            :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error) or ``"torch"``.

    Raises:
        ValueError: ``gamma``, ``threshold`` or ``label_smoothing`` out of range or NaN
            (``TypeError`` if one is not a real number).

    Example:
        >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> target = torch.tensor([0, 2])
        >>> gamma_cross_entropy(logits, target, gamma=0.5, reduction="none")
        tensor([0.2252, 0.8109])
        >>> gamma_cross_entropy(logits, target, gamma=1.0, reduction="none")  # 1 - p_t
        tensor([0.2130, 0.6667])
        >>> gamma_cross_entropy(logits, target, gamma=0.5, label_smoothing=0.3, reduction="none")
        tensor([0.6295, 0.8972])
    """
    check_gamma_ce(gamma, threshold, label_smoothing)
    return target_probability_loss(
        logits,
        target,
        phi_gamma_cross_entropy,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
        validate_args=validate_args,
        backend=backend,
        gamma=float(gamma),
        threshold=float(threshold),
    )


def soft_accuracy_loss(
    logits: Tensor,
    target: Tensor,
    *,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Expected error ``1 - p_t``; its mean is one minus the smooth accuracy.

    After Su Jianlin, "How to train your accuracy?".

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1).
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        weight: optional ``[C]`` class weights, finite and ``>= 0``; ``"mean"`` divides by
            the sum of the weights of the non-ignored elements (0 if that sum is 0).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        label_smoothing: only 0 is accepted (so that a config may keep the key); other
            values raise ``TypeError``: label smoothing belongs to cross-entropy and gamma
            cross-entropy.
        validate_args: check target values, finite logits and weights (device
            synchronisations).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the fused kernels of
            :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error) or ``"torch"``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> soft_accuracy_loss(logits, torch.tensor([0, 2]), reduction="none")
        tensor([0.2130, 0.6667])
    """
    check_no_label_smoothing("soft accuracy loss", label_smoothing)
    return target_probability_loss(
        logits,
        target,
        phi_soft_accuracy,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        validate_args=validate_args,
        backend=backend,
    )


def _focal_family(
    logits: Tensor,
    target: Tensor,
    phi,
    *,
    alpha: Tensor | Sequence[float] | None,
    ignore_index: int,
    reduction: str,
    validate_args: bool,
    backend: str,
    **hyperparameters,
) -> Tensor:
    # alpha_t is a factor of the formula: "mean" stays a plain mean over non-ignored elements.
    return target_probability_loss(
        logits,
        target,
        phi,
        weight=alpha,
        weight_name="alpha",
        ignore_index=ignore_index,
        reduction=reduction,
        validate_args=validate_args,
        backend=backend,
        weighted_mean=False,
        **hyperparameters,
    )


def focal_loss(
    logits: Tensor,
    target: Tensor,
    *,
    gamma: float = 2.0,
    alpha: Tensor | Sequence[float] | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Focal loss ``-alpha_t (1-p_t)^gamma log p_t``.

    After Su Jianlin, "From hard truncation of the loss, through softening, to focal loss".

    The focal weight is computed as ``(-expm1(log p_t))^gamma`` and its derivative in the form
    ``(1-p)^gamma (gamma p log p / (1-p) - 1)``, finite for every ``gamma >= 0`` including
    ``0 < gamma < 1`` at ``p_t = 1``. ``gamma = 0`` without ``alpha`` is cross-entropy.

    Source: Lin et al., "Focal Loss for Dense Object Detection" (ICCV 2017).

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1).
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        gamma: focusing parameter, ``>= 0``.
        alpha: ``None``, or one weight per class (``[C]``), finite and ``>= 0``. ``"mean"`` is
            a plain mean over the non-ignored elements (``alpha`` is part of the formula, not a
            normaliser).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        label_smoothing: only 0 is accepted (so that a config may keep the key); other
            values raise ``TypeError``: label smoothing belongs to cross-entropy and gamma
            cross-entropy.
        validate_args: check target values, finite logits and weights (device
            synchronisations).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the fused kernels of
            :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error) or ``"torch"``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> focal_loss(logits, torch.tensor([0, 2]), gamma=2.0, reduction="none")
        tensor([0.0109, 0.4883])
    """
    check_no_label_smoothing("focal loss", label_smoothing)
    check_focal(gamma)
    return _focal_family(
        logits,
        target,
        phi_focal,
        alpha=alpha,
        ignore_index=ignore_index,
        reduction=reduction,
        validate_args=validate_args,
        backend=backend,
        gamma=float(gamma),
    )


def adaptive_focal_loss(
    logits: Tensor,
    target: Tensor,
    *,
    thresholds: Sequence[float] = (0.2,),
    gammas: Sequence[float] = (5.0, 3.0),
    alpha: Tensor | Sequence[float] | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Focal loss whose ``gamma`` is picked per sample from ``p_t`` (sample-dependent focal).

    ``gamma = gammas[k]`` where ``k`` is the number of ``thresholds`` that are ``<= p_t``; the
    default is FLSD-53: ``gamma = 5`` for ``p_t < 0.2`` and ``3`` otherwise. The choice of
    ``gamma`` carries no gradient (it is piecewise constant).

    Source: Mukhoti et al., "Calibrating Deep Neural Networks using Focal Loss" (NeurIPS 2020).

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1).
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        thresholds: strictly increasing probabilities in ``[0, 1]``.
        gammas: ``len(thresholds) + 1`` focusing parameters, each ``>= 0``.
        alpha: ``None``, or one weight per class (``[C]``), finite and ``>= 0``.
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        label_smoothing: only 0 is accepted (so that a config may keep the key); other
            values raise ``TypeError``: label smoothing belongs to cross-entropy and gamma
            cross-entropy.
        validate_args: check target values, finite logits and weights (device
            synchronisations).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the fused kernels of
            :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error) or ``"torch"``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> adaptive_focal_loss(logits, torch.tensor([0, 2]), reduction="none")
        tensor([0.0023, 0.3255])
    """
    check_no_label_smoothing("adaptive focal loss", label_smoothing)
    check_adaptive_focal(thresholds, gammas)
    return _focal_family(
        logits,
        target,
        phi_adaptive_focal,
        alpha=alpha,
        ignore_index=ignore_index,
        reduction=reduction,
        validate_args=validate_args,
        backend=backend,
        thresholds=tuple(float(v) for v in thresholds),
        gammas=tuple(float(v) for v in gammas),
    )


def hard_truncated_loss(
    logits: Tensor,
    target: Tensor,
    *,
    margin: float = 0.5,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Hard truncation: cross-entropy where ``p_t <= margin``, zero where above.

    After Su Jianlin, "From hard truncation of the loss, through softening, to focal loss".

    Samples the model already gets right with probability above ``margin`` stop contributing.
    ``margin = 1`` is cross-entropy. ``"mean"`` averages over all non-ignored elements,
    truncated ones included.

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1).
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        margin: in ``[0, 1]``.
        weight: optional ``[C]`` class weights, finite and ``>= 0``; ``"mean"`` divides by
            the sum of the weights of the non-ignored elements (0 if that sum is 0).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        label_smoothing: only 0 is accepted (so that a config may keep the key); other
            values raise ``TypeError``: label smoothing belongs to cross-entropy and gamma
            cross-entropy.
        validate_args: check target values, finite logits and weights (device
            synchronisations).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the fused kernels of
            :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error) or ``"torch"``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> hard_truncated_loss(logits, torch.tensor([0, 2]), margin=0.5, reduction="none")
        tensor([0.0000, 1.0986])
    """
    check_no_label_smoothing("hard truncation", label_smoothing)
    check_hard_truncated(margin)
    return target_probability_loss(
        logits,
        target,
        phi_hard_truncated,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        validate_args=validate_args,
        backend=backend,
        margin=float(margin),
    )


def poly1_loss(
    logits: Tensor,
    target: Tensor,
    *,
    epsilon: float = 1.0,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    validate_args: bool = True,
    backend: str = "auto",
) -> Tensor:
    """Poly-1: cross-entropy plus ``epsilon`` times the first polynomial term, ``1 - p_t``.

    ``loss = -log p_t + epsilon * (1 - p_t)``. Cross-entropy is ``sum_j (1-p_t)^j / j``; Poly-1
    raises the coefficient of the leading term from 1 to ``1 + epsilon`` and keeps the rest.
    The gradient is cross-entropy's scaled by ``1 + epsilon p_t``: ``epsilon > 0`` pushes
    harder on the samples already right, ``epsilon < 0`` less (``epsilon = -1`` leaves
    ``sum_{j>=2} (1-p_t)^j / j``, a loss that vanishes to second order at ``p_t = 1``).
    ``epsilon = 0`` is :func:`torch.nn.functional.cross_entropy`. ``1 - p_t`` is computed as
    ``-expm1(log p_t)`` from the log-softmax. For every ``epsilon >= -1`` the loss is
    ``>= 0`` (``-log p >= 1 - p``).

    Class weights follow :func:`cross_entropy` (the paper has none): the element's loss is
    ``w_t * (-log p_t + epsilon (1 - p_t))`` and ``"mean"`` divides by the sum of ``w_t`` over
    the non-ignored elements, so that ``epsilon = 0`` is ``F.cross_entropy(..., weight=w)``.

    Source: Leng et al., "PolyLoss: A Polynomial Expansion Perspective of Classification Loss
    Functions" (ICLR 2022), its listing of Poly-1 cross-entropy.

    Args:
        logits: ``[N, C, *]`` unnormalised scores (class dimension 1).
        target: ``[N, *]`` class indices in ``[0, C)`` or ``ignore_index``.
        epsilon: coefficient of ``1 - p_t``, a real number ``>= -1`` (the paper's default 1).
        weight: optional ``[C]`` class weights, finite and ``>= 0``; ``"mean"`` divides by
            the sum of the weights of the non-ignored elements (0 if that sum is 0).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``"none"`` (shape ``[N, *]``), ``"mean"`` or ``"sum"``.
        label_smoothing: only 0 is accepted (so that a config may keep the key); other
            values raise ``TypeError``: label smoothing belongs to cross-entropy and gamma
            cross-entropy.
        validate_args: check target values, finite logits and weights (device
            synchronisations).
        backend: ``"auto"`` (PyTorch until the Triton kernels are switched on for CUDA
            tensors, see ``docs/kernels.md``), ``"triton"`` (the fused kernels of
            :mod:`lightning_losses.kernels` for ``[N, C]`` logits: CUDA, or CPU under
            ``TRITON_INTERPRET=1``; else a one-line error) or ``"torch"``.

    Raises:
        ValueError: ``epsilon`` below -1, NaN or infinite (``TypeError`` if it is not a real
            number); a bad ``reduction``, ``target`` or ``weight``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
        >>> poly1_loss(logits, torch.tensor([0, 2]), epsilon=1.0, reduction="none")
        tensor([0.4526, 1.7653])
        >>> poly1_loss(logits, torch.tensor([0, 2]), epsilon=0.0, reduction="none")  # CE
        tensor([0.2395, 1.0986])
    """
    check_no_label_smoothing("Poly-1 loss", label_smoothing)
    check_poly1(epsilon)
    return target_probability_loss(
        logits,
        target,
        phi_poly1,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        validate_args=validate_args,
        backend=backend,
        epsilon=float(epsilon),
    )
