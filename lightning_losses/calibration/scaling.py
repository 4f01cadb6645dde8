"""Temperature scaling: one scalar ``T`` fitted on held-out logits to calibrate a classifier.

Guo et al., "On Calibration of Modern Neural Networks" (ICML 2017), Section 4.2. The calibrated
probabilities are ``softmax(z / T)`` (or ``sigmoid(z / T)`` for a binary ``[N]`` logit), with

.. math::

    T^\\star = \\arg\\min_{T > 0} \\; -\\frac{1}{N} \\sum_{i=1}^{N}
    \\log \\operatorname{softmax}(z_i / T)_{y_i} .

Dividing by ``T`` never changes the argmax, so accuracy is untouched. The fit optimises
``log T`` (so ``T`` stays positive) with L-BFGS and a strong-Wolfe line search, in float64 on a
detached copy of the logits. The NLL is convex in ``1 / T``, hence unimodal in ``log T``, and the
one-dimensional search converges in a few iterations.

netcal's :class:`netcal.scaling.TemperatureScaling` fits the same model from probabilities
(it takes ``log p``, which equals the logits up to a per-row shift that softmax ignores) and
reports the multiplier ``1 / T`` as its ``temperature``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["TemperatureScaler", "fit_temperature"]


def _check_inputs(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Validate ``[N, C]`` / ``[N]`` logits and their labels; return float64 detached copies.

    The target comes back as int64 labels for ``[N, C]`` logits and as float64 0/1 for ``[N]``.
    """
    if not isinstance(logits, Tensor) or not isinstance(target, Tensor):
        raise TypeError("logits and target must be torch tensors")
    if logits.ndim not in (1, 2) or (logits.ndim == 2 and logits.shape[1] < 2):
        raise ValueError(
            "logits must be [N, C] with C >= 2 (softmax) or [N] (one binary logit), "
            f"got {tuple(logits.shape)}"
        )
    if target.shape != logits.shape[:1]:
        raise ValueError(f"target must be [N] = [{logits.shape[0]}], got {tuple(target.shape)}")
    if logits.shape[0] == 0:
        raise ValueError("need at least one sample to fit a temperature")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    z = logits.detach().to(torch.float64)
    if not torch.isfinite(z).all():
        raise ValueError("logits contain non-finite values")
    if logits.ndim == 2:
        if target.is_floating_point() or target.dtype == torch.bool:
            raise TypeError(f"target must hold integer class labels, got {target.dtype}")
        y = target.detach().long()
        if y.min() < 0 or y.max() >= logits.shape[1]:
            raise ValueError(f"target labels must lie in [0, {logits.shape[1]})")
    else:
        y = target.detach().to(torch.float64)
        if not ((y == 0) | (y == 1)).all():
            raise ValueError("binary target must hold 0 and 1 only")
    return z, y.to(z.device)


def _nll(z: Tensor, y: Tensor) -> Tensor:
    """Mean NLL: cross-entropy for ``[N, C]`` logits, binary cross-entropy for ``[N]``."""
    if z.ndim == 2:
        return F.cross_entropy(z, y)
    return F.binary_cross_entropy_with_logits(z, y)


def _top_label(z: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Top-label confidence and correctness (``max(p, 1 - p)`` and ``1[z > 0] == y`` for binary)."""
    if z.ndim == 2:
        confidence, predicted = z.softmax(dim=1).max(dim=1)
        return confidence, (predicted == y).to(z.dtype)
    p = z.sigmoid()
    return torch.maximum(p, 1 - p), ((z > 0).to(z.dtype) == y).to(z.dtype)


def _ece(confidence: Tensor, correct: Tensor, n_bins: int) -> float:
    """Top-label ECE ``sum_k |conf_sum_k - correct_sum_k| / N`` over bins ``(k/B, (k+1)/B]``."""
    inner = torch.arange(1, n_bins, dtype=torch.float64, device=confidence.device) / n_bins
    index = torch.bucketize(confidence, inner)  # (k/B, (k+1)/B] -> k; 0 falls in the first bin
    conf_sum = torch.zeros(n_bins, dtype=torch.float64, device=confidence.device)
    correct_sum = torch.zeros_like(conf_sum)
    conf_sum.index_add_(0, index, confidence.double())
    correct_sum.index_add_(0, index, correct.double())
    return float((conf_sum - correct_sum).abs().sum() / confidence.numel())


def fit_temperature(logits: Tensor, target: Tensor, *, max_iter: int = 100) -> float:
    """Fit the temperature that minimises the NLL of ``softmax(logits / T)`` on held-out data.

    ``T* = argmin_T mean_i -log softmax(z_i / T)[y_i]`` (``sigmoid`` and binary cross-entropy
    for ``[N]`` logits), found by L-BFGS with a strong-Wolfe line search on ``log T`` from
    ``T = 1``, in float64. ``T > 1`` softens an overconfident model, ``T < 1`` sharpens an
    underconfident one. If the logits separate the classes perfectly the NLL keeps falling as
    ``T -> 0`` and the returned ``T`` is merely small.

    Source: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017.

    Args:
        logits: held-out logits ``[N, C]`` (``C >= 2``), or ``[N]`` binary logits.
        target: class labels ``[N]`` (integers), or 0/1 for binary logits.
        max_iter: maximum number of L-BFGS iterations.

    Returns:
        The fitted temperature ``T > 0``.

    Raises:
        TypeError: for non-tensor inputs, integer logits or non-integer class labels.
        ValueError: for bad shapes, empty or non-finite inputs, or labels out of range.

    Example:
        >>> import math
        >>> z = torch.tensor([[2.0, 0.0], [2.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
        >>> y = torch.tensor([0, 0, 1, 1])  # 3 of 4 right: calibrated iff sigmoid(2 / T) = 3/4
        >>> t = fit_temperature(z, y)
        >>> round(t, 6), abs(t - 2 / math.log(3)) < 1e-6
        (1.820478, True)
    """
    z, y = _check_inputs(logits, target)
    log_t = torch.zeros((), dtype=torch.float64, device=z.device, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [log_t],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-12,
        tolerance_change=1e-14,
        line_search_fn="strong_wolfe",
    )

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = _nll(z * torch.exp(-log_t), y)
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    temperature = float(log_t.detach().exp())
    if not (temperature > 0 and temperature < float("inf")):
        raise RuntimeError(f"temperature fit diverged (T = {temperature})")
    return temperature


class TemperatureScaler(nn.Module):
    """Divide logits by a temperature fitted on held-out data (post-hoc calibration).

    ``forward(z) = z / T``: feed the result to ``softmax`` (or ``sigmoid`` for binary ``[N]``
    logits). ``T`` is kept as a float64 buffer, so it is saved in the ``state_dict``; the
    ``temperature`` property reads and sets it as a Python float. Before :meth:`fit` it is 1
    (the identity).

    Source: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017.

    Args:
        temperature: the initial temperature (``> 0``).
        max_iter: maximum number of L-BFGS iterations for :meth:`fit`.

    Example:
        >>> scaler = TemperatureScaler(temperature=2.0)
        >>> scaler(torch.tensor([[4.0, -2.0]]))
        tensor([[ 2., -1.]])
    """

    temperature_buffer: Tensor

    def __init__(self, temperature: float = 1.0, *, max_iter: int = 100) -> None:
        super().__init__()
        self.max_iter = max_iter
        self.register_buffer("temperature_buffer", torch.ones((), dtype=torch.float64))
        self.temperature = temperature

    @property
    def temperature(self) -> float:
        """The temperature ``T`` as a Python float."""
        return float(self.temperature_buffer)

    @temperature.setter
    def temperature(self, value: float) -> None:
        value = float(value)
        if not (value > 0 and value < float("inf")):
            raise ValueError(f"temperature must be positive and finite, got {value}")
        self.temperature_buffer.fill_(value)

    def fit(self, logits: Tensor, target: Tensor) -> TemperatureScaler:
        """Fit ``T`` on held-out ``logits`` and ``target`` (see :func:`fit_temperature`)."""
        self.temperature = fit_temperature(logits, target, max_iter=self.max_iter)
        return self

    def forward(self, logits: Tensor) -> Tensor:
        """Return ``logits / T`` in the dtype of ``logits``."""
        return logits / self.temperature

    def report(self, logits: Tensor, target: Tensor, n_bins: int = 15) -> dict[str, float]:
        """Top-label ECE and NLL of ``logits`` before and after scaling by the current ``T``.

        The ECE uses ``n_bins`` equal-width bins ``(k/B, (k+1)/B]`` (a confidence of 0 in the
        first) and is ``sum_k |conf_sum_k - correct_sum_k| / N`` from the per-bin sums.

        Returns:
            ``{"temperature", "ece_before", "ece_after", "nll_before", "nll_after"}``.
        """
        if n_bins < 1:
            raise ValueError(f"n_bins must be a positive integer, got {n_bins}")
        z, y = _check_inputs(logits, target)
        scaled = z / self.temperature
        with torch.no_grad():
            return {
                "temperature": self.temperature,
                "ece_before": _ece(*_top_label(z, y), n_bins),
                "ece_after": _ece(*_top_label(scaled, y), n_bins),
                "nll_before": float(_nll(z, y)),
                "nll_after": float(_nll(scaled, y)),
            }

    def extra_repr(self) -> str:
        return f"temperature={self.temperature:.6g}"
