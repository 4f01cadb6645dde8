r"""Affine calibration maps: vector scaling, matrix scaling and Dirichlet calibration.

Each maps features :math:`x` of the logits :math:`z` (the logits themselves, or their
log-softmax for Dirichlet calibration) to calibrated log-probabilities through an affine map,

.. math::

    g(z) = \log \operatorname{softmax}(W x + b), \qquad
    (W, b) = \arg\min_{W, b} \; -\frac{1}{N} \sum_{i=1}^{N}
        \log \operatorname{softmax}(W x_i + b)_{y_i} \; + \; \Omega(W, b),

with :math:`W` diagonal for vector scaling (``w * x + b``, :math:`\Omega = 0`) and full for
matrix scaling and Dirichlet calibration, whose penalty is ODIR (off-diagonal and intercept
regularisation, Kull et al.),

.. math::

    \Omega(W, b) = \frac{\lambda}{C (C - 1)} \sum_{i \ne j} W_{ij}^2
        + \frac{\mu}{C} \sum_{j} b_j^2 ,

``reg_lambda`` :math:`= \lambda` and ``reg_mu`` :math:`= \mu` for :math:`C` classes. This is
exactly the objective of dirichletcal's ``FullDirichletCalibrator(reg_lambda=λ, reg_mu=μ,
reg_norm=True, ref_row=False)`` (its ``MultinomialRegression(method="Full", ...)`` on
log-probabilities; on logits for matrix scaling): the mean NLL, plus the penalties divided by
the number of off-diagonal entries and of intercepts (``reg_norm=True``), on the full
:math:`C \times C` matrix (``ref_row=False``). dirichletcal's default ``ref_row=True`` instead
subtracts the last class's row from every row of :math:`(W, b)` before the penalty (the same
probabilities without penalty, other ones with it), and its default ``reg_norm=False`` leaves
:math:`\lambda, \mu` undivided. The objective is convex; with :math:`\lambda, \mu > 0` its
minimiser is unique (on data that is not degenerate), so exact optimisers agree; with
:math:`\lambda = \mu = 0` the probabilities are unique (the parameters up to a common shift of
the rows).

The fit runs in float64 with L-BFGS (SciPy's L-BFGS-B without bounds, whose line search
enforces the strong Wolfe conditions; the objective and its gradient by torch, on the logits'
device), on detached copies of the logits, until the largest gradient entry is below 1e-10 or an
iteration lowers the objective by less than the float64 machine epsilon relative to it
(:func:`minimise_lbfgs`). Two choices make it fast without changing the minimiser: it starts
from temperature scaling's map (:math:`W = I / T`, :math:`b = 0`, which gives
``softmax(z / T)`` for the logits and for their log-softmax alike), and it optimises the same
objective in standardised coordinates (with :math:`x = m + s \odot u` column by column, the
map :math:`W x + b` is :math:`(W \operatorname{diag} s) u + (W m + b)`; the penalty is still
computed on :math:`W, b`), which L-BFGS handles far better than raw log-probabilities whose
entries reach -50 and below.

Sources: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017 (vector and matrix
scaling); Kull et al., "Beyond temperature scaling: obtaining well-calibrated multiclass
probabilities with Dirichlet calibration", NeurIPS 2019 (Dirichlet calibration, ODIR).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from lightning_losses.calibration.posthoc.base import PostHocCalibrator
from lightning_losses.calibration.posthoc.temperature import (
    SEPARATED,
    TEMPERATURE_RANGE,
    TOO_EASY,
    fit_temperature,
    separated,
)
from lightning_losses.functional.checks import check_int, check_real

__all__ = ["DirichletCalibration", "MatrixScaling", "VectorScaling", "minimise_lbfgs"]


def minimise_lbfgs(
    objective: Callable[[Tensor], Tensor] | Callable[[Tensor], tuple[Tensor, Tensor]],
    start: Tensor,
    *,
    max_iter: int,
    returns_gradient: bool = False,
) -> Tensor:
    """The minimiser of ``objective`` from ``start`` by L-BFGS, in float64.

    SciPy's L-BFGS-B without bounds (its line search enforces the strong Wolfe conditions),
    the objective and its gradient computed by torch on the device of ``start`` (the gradient
    by autograd, or by ``objective`` itself with ``returns_gradient=True``). It stops after
    ``max_iter`` iterations, when the largest gradient entry is below 1e-10, or when an
    iteration lowers the objective by less than the float64 machine epsilon relative to it (as
    dirichletcal's ``factr=1``). Torch's own L-BFGS stops short of that precision: it keeps no
    curvature pair whose ``y^T s`` is below 1e-10, so its model of a flat valley goes stale.

    Args:
        objective: a scalar function of a float64 vector, differentiable by autograd; with
            ``returns_gradient=True``, a function giving that scalar and its gradient.
        start: the float64 starting point (not modified).
        max_iter: the most L-BFGS iterations.
        returns_gradient: whether ``objective`` gives its own gradient (no autograd graph: a
            closed form is several times cheaper on the small problems of calibration).

    Raises:
        RuntimeError: the minimiser or the objective there is not finite.

    Example:
        >>> start = torch.zeros(2, dtype=torch.float64)
        >>> x = minimise_lbfgs(lambda t: ((t - 3.0) ** 2).sum(), start, max_iter=50)
        >>> bool((x - 3.0).abs().max() < 1e-8)
        True
    """
    from scipy.optimize import minimize

    def value_and_gradient(flat: np.ndarray) -> tuple[float, np.ndarray]:
        theta = torch.from_numpy(flat).to(start.device)
        if returns_gradient:
            with torch.no_grad():
                loss, gradient = objective(theta)
        else:
            theta.requires_grad_(True)
            with torch.enable_grad():
                loss = objective(theta)
                (gradient,) = torch.autograd.grad(loss, theta)
        return float(loss.detach()), gradient.detach().cpu().numpy()

    result = minimize(
        value_and_gradient,
        start.detach().to(torch.float64).cpu().numpy(),
        jac=True,
        method="L-BFGS-B",
        options={
            "maxiter": max_iter,
            "maxfun": 2 * max_iter,
            "maxcor": 20,
            "ftol": float(np.finfo(np.float64).eps),
            "gtol": 1e-10,
            "maxls": 50,
        },
    )
    theta = torch.from_numpy(np.asarray(result.x, dtype=np.float64)).to(start.device)
    if not (bool(torch.isfinite(theta).all()) and math.isfinite(float(result.fun))):
        raise RuntimeError(
            f"the L-BFGS fit diverged (objective {float(result.fun)}, non-finite parameters "
            f"or objective)"
        )
    return theta


class _AffineCalibrator(PostHocCalibrator, abc.ABC):
    """``log_softmax(affine(features(z)))`` fitted by L-BFGS on the NLL plus a penalty."""

    def __init__(self, *, max_iter: int) -> None:
        super().__init__()
        self.max_iter = check_int("max_iter", max_iter, low=1)

    def features(self, logits: Tensor) -> Tensor:
        """What the affine map acts on: the logits themselves (Dirichlet: log-probabilities)."""
        return logits

    @abc.abstractmethod
    def identity_weight(self, num_classes: int) -> Tensor:
        """The float64 weight of the identity map (divided by ``T``, it is where the fit starts)."""

    @abc.abstractmethod
    def affine(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """The calibrated logits ``[N, C]`` of the features ``x`` ``[N, C]``."""

    @abc.abstractmethod
    def affine_gradient(self, x: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """The gradients of ``sum(grad * affine(x, weight, bias))`` in ``weight`` and ``bias``."""

    def penalty(self, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The regularisation added to the mean NLL and its gradients in ``weight``, ``bias``.

        None by default.
        """
        return weight.new_zeros(()), torch.zeros_like(weight), torch.zeros_like(bias)

    def bias_is_free(self) -> bool:
        """Whether the objective ignores a common shift of the bias (no penalty on it)."""
        return True

    def _fit(self, logits: Tensor, target: Tensor) -> dict[str, Tensor]:
        x = self.features(logits)
        # Exact preconditioning: the affine map of x = shift + scale * u (u: standardised
        # columns) is W x + b = (W * scale) u + (W shift + b), so the fit runs on u with
        # V = W * scale and c = W shift + b; W and b are recovered from them in the objective,
        # which is the same function of (W, b). L-BFGS takes far fewer steps on u than on raw
        # log-probabilities (entries down to -50 and below at confident rows).
        shift = x.mean(dim=0)
        scale = x.std(dim=0)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        u = (x - shift) / scale
        # Start from temperature scaling's map (W = I / T, b = 0: softmax(z / T) for the
        # logits and for their log-softmax alike), a point of the same convex problem.
        temperature = fit_temperature(logits, target)
        weight = self.identity_weight(x.shape[1]).to(x.device) / temperature
        zero = x.new_zeros(x.shape[1])
        split = weight.numel()

        def original(theta: Tensor) -> tuple[Tensor, Tensor]:
            v, c = theta[:split].view_as(weight), theta[split:]
            w = v / scale
            return w, c - self.affine(shift[None, :], w, zero)[0]

        rows = torch.arange(len(target), device=x.device)

        def objective(theta: Tensor) -> tuple[Tensor, Tensor]:
            # The mean NLL of softmax(a), a = affine(u, V, c), has gradient (softmax(a) -
            # onehot(y)) / N in a; the penalty of (W, b) reaches (V, c) through W = V / scale
            # and b = c - affine(shift, W, 0).
            v, c = theta[:split].view_as(weight), theta[split:]
            log_p = torch.log_softmax(self.affine(u, v, c), dim=1)
            nll = -log_p[rows, target].mean()
            grad_a = log_p.exp()
            grad_a[rows, target] -= 1.0
            grad_a /= len(target)
            grad_v, grad_c = self.affine_gradient(u, grad_a)
            value, grad_w, grad_b = self.penalty(*original(theta))
            through_b, _ = self.affine_gradient(shift[None, :], -grad_b[None, :])
            gradient = torch.cat(
                [(grad_v + (grad_w + through_b) / scale).flatten(), grad_c + grad_b]
            )
            return nll + value, gradient

        start = torch.cat(
            [(weight * scale).flatten(), self.affine(shift[None, :], weight, zero)[0]]
        )
        w, b = original(
            minimise_lbfgs(objective, start, max_iter=self.max_iter, returns_gradient=True)
        )
        if self.bias_is_free():  # the same probabilities; the representative with sum(b) = 0
            b = b - b.mean()
        return {"weight": w, "bias": b}

    def _log_probs(self, logits: Tensor) -> Tensor:
        x = self.features(logits)
        return torch.log_softmax(self.affine(x, self.param("weight", x), self.param("bias", x)), 1)

    def bound_reason(self, logits: Tensor, target: Tensor) -> str:
        """Why the fitted map ran to a bound ("" if it did not): the analogue of a temperature.

        The map's largest weight ``max |W|`` plays ``1 / T`` (the fit starts from ``W = I / T``):
        labels the logits separate
        (:func:`~lightning_losses.calibration.posthoc.temperature.separated`) let the NLL fall
        without a minimum as ``W = I / T`` grows; a largest weight above
        ``1 / TEMPERATURE_RANGE[0]`` makes the probabilities (nearly) 0 or 1; all weights below
        ``1 / TEMPERATURE_RANGE[1]`` make the map ignore the logits.
        """
        low, high = TEMPERATURE_RANGE
        largest = float(self.params["weight"].abs().max())
        where = f"the map's largest weight |W| = {largest:.3g} (1/T of temperature scaling)"
        if separated(logits, target):
            return (
                f"{SEPARATED.format(what='the weights grow')}; the fit stopped where its steps "
                f"vanish, at {where}, and the calibrated probabilities are (nearly) 0 or 1. "
                f"{TOO_EASY}"
            )
        if largest > 1.0 / low:
            return (
                f"{where} is above {1.0 / low:g}: the map nearly separates the validation "
                "labels; the calibrated probabilities are (nearly) 0 or 1"
            )
        if largest < 1.0 / high:
            return (
                f"{where} is below {1.0 / high:g}: the map ignores the logits (the validation "
                "labels carry no information the logits predict) and gives every sample the "
                "same probabilities, softmax(b)"
            )
        return ""


class VectorScaling(_AffineCalibrator):
    r"""Vector scaling: a weight and a bias per class, ``log_softmax(w * z + b)``.

    .. math::

        g(z) = \log \operatorname{softmax}(w \odot z + b), \qquad
        (w, b) = \arg\min -\frac{1}{N} \sum_i \log \operatorname{softmax}(w \odot z_i + b)_{y_i}

    (no penalty), fitted from temperature scaling's ``w = 1 / T``, ``b = 0`` in float64 with
    L-BFGS. The optimum's
    probabilities are those of dirichletcal's ``VectorScaling(logit_input=True)`` (its
    ``reg_lambda_list=[0.0]`` default); ``b`` is defined up to a common shift (the fit keeps
    ``sum(b) = 0``). Falls back to the identity with fewer than ``2 C`` samples.

    Source: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017.

    Args:
        max_iter: the most L-BFGS iterations (``>= 1``).

    Example:
        >>> z = torch.tensor([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]]).repeat(4, 1)
        >>> y = torch.tensor([0, 1, 2, 0, 1, 2, 1, 2, 0, 2, 0, 1])  # right half the time
        >>> scaler = VectorScaling().fit(z, y)
        >>> scaler.probabilities(z[:1])  # the frequencies of the labels: w = log(2) / 3
        tensor([[0.5000, 0.2500, 0.2500]])
    """

    method: ClassVar[str] = "vector"

    def __init__(self, *, max_iter: int = 500) -> None:
        super().__init__(max_iter=max_iter)

    def min_samples(self, num_classes: int) -> int:
        """``2 C``: a weight and a bias per class."""
        return 2 * num_classes

    def identity_weight(self, num_classes: int) -> Tensor:
        """``w = 1``."""
        return torch.ones(num_classes, dtype=torch.float64)

    def affine(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """``w * x + b``."""
        return x * weight + bias

    def affine_gradient(self, x: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """``sum_i grad_i * x_i`` and ``sum_i grad_i``."""
        return (grad * x).sum(dim=0), grad.sum(dim=0)


class _FullAffine(_AffineCalibrator):
    """A full ``C x C`` matrix and a bias, with the ODIR penalty."""

    def __init__(self, *, reg_lambda: float, reg_mu: float, max_iter: int) -> None:
        super().__init__(max_iter=max_iter)
        self.reg_lambda = check_real("reg_lambda", reg_lambda, low=0.0)
        self.reg_mu = check_real("reg_mu", reg_mu, low=0.0)

    def min_samples(self, num_classes: int) -> int:
        """``C^2 + C``: the matrix and the bias."""
        return num_classes * num_classes + num_classes

    def identity_weight(self, num_classes: int) -> Tensor:
        """``W = I``."""
        return torch.eye(num_classes, dtype=torch.float64)

    def affine(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """``x W^T + b`` (row by row, ``W x_i + b``)."""
        return x @ weight.T + bias

    def affine_gradient(self, x: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """``grad^T x`` and ``sum_i grad_i``."""
        return grad.T @ x, grad.sum(dim=0)

    def bias_is_free(self) -> bool:
        """Without the intercept penalty (``reg_mu = 0``) a common shift of ``b`` is free."""
        return self.reg_mu == 0

    def penalty(self, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """ODIR, ``λ / (C (C - 1)) sum_{i != j} W_ij^2 + μ / C sum_j b_j^2``, and its gradients."""
        c = weight.shape[0]
        off_diagonal = weight - torch.diag_embed(torch.diagonal(weight))
        lam, mu = self.reg_lambda / (c * (c - 1)), self.reg_mu / c
        value = lam * off_diagonal.square().sum() + mu * bias.square().sum()
        return value, 2.0 * lam * off_diagonal, 2.0 * mu * bias

    def extra_repr(self) -> str:
        """The penalties, and whether the calibrator is fitted."""
        return f"reg_lambda={self.reg_lambda:g}, reg_mu={self.reg_mu:g}, {super().extra_repr()}"


class MatrixScaling(_FullAffine):
    r"""Matrix scaling with ODIR: ``log_softmax(W z + b)`` on the logits.

    .. math::

        g(z) = \log \operatorname{softmax}(W z + b), \qquad
        (W, b) = \arg\min -\frac{1}{N} \sum_i \log \operatorname{softmax}(W z_i + b)_{y_i}
            + \frac{\lambda}{C (C - 1)} \sum_{i \ne j} W_{ij}^2 + \frac{\mu}{C} \sum_j b_j^2

    (see :mod:`~lightning_losses.calibration.posthoc.linear` for how this equals dirichletcal's
    objective with ``reg_norm=True, ref_row=False``), fitted from ``W = I / T``, ``b = 0`` in
    float64 with L-BFGS. ``reg_lambda = reg_mu = 0`` is the unregularised matrix scaling of
    Guo et al. Falls back to the identity with fewer than ``C^2 + C`` samples.

    Sources: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017; Kull et al.,
    "Beyond temperature scaling: obtaining well-calibrated multiclass probabilities with
    Dirichlet calibration", NeurIPS 2019 (ODIR).

    Args:
        reg_lambda: ``λ >= 0``, the weight of the mean squared off-diagonal entry of ``W``.
        reg_mu: ``μ >= 0``, the weight of the mean squared intercept.
        max_iter: the most L-BFGS iterations (``>= 1``).

    Example:
        >>> z = torch.tensor([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]]).repeat(4, 1)
        >>> y = torch.tensor([0, 1, 2, 0, 1, 2, 1, 2, 0, 2, 0, 1])  # right half the time
        >>> scaler = MatrixScaling(reg_lambda=1e-2, reg_mu=1e-2).fit(z, y)
        >>> scaler.probabilities(z[:1])  # W = log(2) / 3 I: ODIR keeps it diagonal
        tensor([[0.5000, 0.2500, 0.2500]])
    """

    method: ClassVar[str] = "matrix"

    def __init__(
        self, *, reg_lambda: float = 1e-2, reg_mu: float = 1e-2, max_iter: int = 500
    ) -> None:
        super().__init__(reg_lambda=reg_lambda, reg_mu=reg_mu, max_iter=max_iter)


class DirichletCalibration(_FullAffine):
    r"""Dirichlet calibration with ODIR: the affine map on the log-probabilities.

    .. math::

        g(z) = \log \operatorname{softmax}(W \log \operatorname{softmax}(z) + b), \qquad
        (W, b) = \arg\min -\frac{1}{N} \sum_i \log \hat p(y_i \mid z_i)
            + \frac{\lambda}{C (C - 1)} \sum_{i \ne j} W_{ij}^2 + \frac{\mu}{C} \sum_j b_j^2 ,

    i.e. ``p ∝ exp(b) prod_j q_j^{W_ij}`` for the model's probabilities ``q``. This is the
    objective of dirichletcal's ``FullDirichletCalibrator(reg_lambda=λ, reg_mu=μ,
    reg_norm=True, ref_row=False)`` (see :mod:`~lightning_losses.calibration.posthoc.linear`),
    which takes ``log(clip(q))``; here the log-probabilities are ``log_softmax(z)`` without
    clipping. Fitted from ``W = I / T``, ``b = 0`` (temperature scaling) in float64 with
    L-BFGS. Falls back to the identity with fewer than ``C^2 + C`` samples.

    Source: Kull et al., "Beyond temperature scaling: obtaining well-calibrated multiclass
    probabilities with Dirichlet calibration", NeurIPS 2019.

    Args:
        reg_lambda: ``λ >= 0``, the weight of the mean squared off-diagonal entry of ``W``.
        reg_mu: ``μ >= 0``, the weight of the mean squared intercept.
        max_iter: the most L-BFGS iterations (``>= 1``).

    Example:
        >>> z = torch.tensor([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]]).repeat(4, 1)
        >>> y = torch.tensor([0, 1, 2, 0, 1, 2, 1, 2, 0, 2, 0, 1])  # right half the time
        >>> dirichlet = DirichletCalibration().fit(z, y)
        >>> dirichlet.probabilities(z[:1])
        tensor([[0.5000, 0.2500, 0.2500]])
    """

    method: ClassVar[str] = "dirichlet"

    def __init__(
        self, *, reg_lambda: float = 1e-2, reg_mu: float = 1e-2, max_iter: int = 500
    ) -> None:
        super().__init__(reg_lambda=reg_lambda, reg_mu=reg_mu, max_iter=max_iter)

    def features(self, logits: Tensor) -> Tensor:
        """The log-probabilities ``log_softmax(z)``."""
        return torch.log_softmax(logits, dim=1)
