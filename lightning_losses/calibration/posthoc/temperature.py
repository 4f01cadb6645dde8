r"""Temperature scaling: one scalar ``T`` fitted on held-out logits to calibrate a classifier.

Guo et al., "On Calibration of Modern Neural Networks" (ICML 2017), Section 4.2. The calibrated
log-probabilities are ``log_softmax(z / T)`` (a binary ``[N]`` logit ``z`` is read as the two
class logits ``[0, z]``, whose softmax is ``(1 - sigmoid(z), sigmoid(z))``), with

.. math::

    T^\star = \arg\min_{T > 0} \; -\frac{1}{N} \sum_{i=1}^{N}
    \log \operatorname{softmax}(z_i / T)_{y_i} .

With soft labels (``target`` ``[N, C]``, a probability distribution ``q_i`` per row, e.g. the
votes of several annotators) the NLL is the cross-entropy against them,
``-(1/N) sum_i sum_c q_ic log softmax(z_i / T)_c`` (as torch-uncertainty's temperature scaler);
one-hot rows give the integer-label fit. ``ignore_index`` drops the rows of integer labels equal
to it (padding tokens) before anything else.

Dividing by ``T`` never changes the argmax, so accuracy is untouched. The fit optimises
``log T`` (so ``T`` stays positive) with L-BFGS and a strong-Wolfe line search, in float64 on a
detached copy of the logits. The NLL is convex in ``1 / T``, hence unimodal in ``log T``, and the
one-dimensional search converges in a few iterations.

netcal's :class:`netcal.scaling.TemperatureScaling` fits the same model from probabilities
(it takes ``log p``, which equals the logits up to a per-row shift that softmax ignores) and
reports the multiplier ``1 / T`` as its ``temperature``.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_losses.calibration.posthoc.base import (
    PostHocCalibrator,
    as_class_logits,
    fit_threads,
)
from lightning_losses.functional.checks import check_ignore_index, check_int, check_sums_to_one

__all__ = [
    "SEPARATED",
    "TEMPERATURE_RANGE",
    "TOO_EASY",
    "TemperatureScaler",
    "fit_temperature",
    "label_advantage",
    "separated",
    "temperature_bound",
    "why_uniform",
]

#: The temperatures a fit is taken to have run to a bound outside of: below, the calibrated
#: probabilities are (nearly) 0 or 1; above, (nearly) uniform. Their reciprocals bound the
#: weights of the affine maps (vector, matrix, Dirichlet) likewise.
TEMPERATURE_RANGE = (1e-3, 1e3)

_Scaler = TypeVar("_Scaler", bound="TemperatureScaler")


def _check_inputs(
    logits: Tensor, target: Tensor, ignore_index: int | None = None, *, owner: str
) -> tuple[Tensor, Tensor]:
    """Validate logits and their labels; return float64 detached copies of the kept rows.

    The target comes back as int64 labels ``[N]`` for ``[N, C]`` logits with integer labels,
    as float64 probabilities ``[N, C]`` for soft labels, and as float64 0/1 ``[N]`` for ``[N]``
    logits. Rows whose integer label is ``ignore_index`` are dropped first. Messages start with
    ``owner`` (the function or method that was called).
    """
    soft = _check_shapes(logits, target, ignore_index, owner)
    z, target = _kept_rows(logits, target, ignore_index, owner)
    return z, _checked_target(z, target, soft, ignore_index, owner).to(z.device)


def _check_shapes(logits: Tensor, target: Tensor, ignore_index: int | None, owner: str) -> bool:
    """Check the types, shapes and dtypes of logits and target; whether labels are soft."""
    if not isinstance(logits, Tensor) or not isinstance(target, Tensor):
        raise TypeError(f"{owner}: logits and target must be torch tensors")
    if ignore_index is not None:
        check_ignore_index(ignore_index)
    if logits.ndim not in (1, 2) or (logits.ndim == 2 and logits.shape[1] < 2):
        raise ValueError(
            f"{owner}: logits must be [N, C] with C >= 2 (softmax) or [N] (one binary logit), "
            f"got {tuple(logits.shape)}"
        )
    soft = logits.ndim == 2 and target.ndim == 2
    if soft:
        _check_soft_shape(logits, target, ignore_index, owner)
    elif target.shape != logits.shape[:1]:
        extra = f" (class labels) or [N, C] = {list(logits.shape)} (soft labels)"
        raise ValueError(
            f"{owner}: target must be [N] = [{logits.shape[0]}]"
            f"{extra if logits.ndim == 2 else ''}, got {tuple(target.shape)}"
        )
    if not logits.is_floating_point():
        raise TypeError(f"{owner}: logits must be floating point, got {logits.dtype}")
    if logits.ndim == 2 and not soft and (target.is_floating_point() or target.dtype == torch.bool):
        raise TypeError(f"{owner}: target must hold integer class labels, got {target.dtype}")
    return soft


def _check_soft_shape(logits: Tensor, target: Tensor, ignore_index: int | None, owner: str) -> None:
    """Soft labels ``[N, C]``: no ``ignore_index``, the logits' shape, a floating dtype."""
    if ignore_index is not None:
        raise ValueError(
            f"{owner}: ignore_index applies to integer class labels; drop the rows of soft "
            f"labels instead (got ignore_index={ignore_index} with soft labels [N, C])"
        )
    if target.shape != logits.shape:
        raise ValueError(
            f"{owner}: target of soft labels must be [N, C] = {list(logits.shape)} like the "
            f"logits, got {list(target.shape)}"
        )
    if not target.is_floating_point():
        raise TypeError(
            f"{owner}: target [N, C] must hold soft labels (float probabilities), got "
            f"{target.dtype}; integer class labels are [N]"
        )


def _kept_rows(
    logits: Tensor, target: Tensor, ignore_index: int | None, owner: str
) -> tuple[Tensor, Tensor]:
    """Float64 logits and the target of the rows not ignored (detached; at least one, finite)."""
    logits, target = logits.detach(), target.detach()
    if ignore_index is not None:
        keep = target != ignore_index
        logits, target = logits[keep], target[keep]
    if logits.shape[0] == 0:
        left = " not ignored" if ignore_index is not None else ""
        raise ValueError(f"{owner}: need at least one sample{left} to fit a temperature")
    z = logits.to(torch.float64)
    if not torch.isfinite(z).all():
        raise ValueError(f"{owner}: logits contain non-finite values")
    return z, target


def _checked_target(
    z: Tensor, target: Tensor, soft: bool, ignore_index: int | None, owner: str
) -> Tensor:
    """The target's values checked: soft probabilities, labels in ``[0, C)``, or binary 0/1."""
    if soft:
        y = target.to(torch.float64)
        if not bool(((y >= 0) & (y <= 1)).all()):
            raise ValueError(
                f"{owner}: target soft labels must be probabilities in [0, 1] (and not NaN)"
            )
        check_sums_to_one(
            f"{owner}: target", y.sum(dim=1), target.dtype, over="the classes of each row", values=y
        )
    elif z.ndim == 2:
        y = target.long()
        if y.min() < 0 or y.max() >= z.shape[1]:
            extra = "" if ignore_index is None else f" (or equal ignore_index={ignore_index})"
            raise ValueError(f"{owner}: target labels must lie in [0, {z.shape[1]}){extra}")
    else:
        y = target.to(torch.float64)
        if not ((y == 0) | (y == 1)).all():
            raise ValueError(f"{owner}: binary target must hold 0 and 1 only")
    return y


def _nll(z: Tensor, y: Tensor) -> Tensor:
    """Mean NLL of the logits.

    Cross-entropy for ``[N, C]`` logits (against soft labels ``[N, C]`` too), binary
    cross-entropy for ``[N]``.
    """
    if z.ndim == 2:
        return F.cross_entropy(z, y)  # float [N, C] targets: -sum_c q_c log softmax(z)_c
    return F.binary_cross_entropy_with_logits(z, y)


def _top_label(z: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Top-label confidence and correctness (``max(p, 1 - p)`` and ``1[z > 0] == y`` for binary).

    With soft labels ``y`` ``[N, C]`` the correctness is ``y[i, argmax_c z_ic]``: the chance that
    the prediction is right when the label is drawn from the soft label (1 or 0 if one-hot).
    """
    if z.ndim == 2:
        confidence, predicted = z.softmax(dim=1).max(dim=1)
        if y.ndim == 2:
            return confidence, y.gather(1, predicted[:, None])[:, 0]
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


def _minimise_temperature(z: Tensor, y: Tensor, max_iter: int) -> float:
    """The ``T`` minimising the mean cross-entropy of ``softmax(z / T)`` against ``y``.

    ``z`` float64 ``[N, C]``; ``y`` int64 labels ``[N]`` or float64 soft labels ``[N, C]``.
    L-BFGS with a strong-Wolfe line search on ``log T`` from ``T = 1``.
    """
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
        loss = F.cross_entropy(z * torch.exp(-log_t), y)
        loss.backward()
        return loss

    with torch.enable_grad(), fit_threads(z.numel()):
        optimizer.step(closure)
    temperature = float(log_t.detach().exp())
    if not (temperature > 0 and temperature < float("inf")):
        raise RuntimeError(f"temperature fit diverged (T = {temperature})")
    return temperature


def _label_rows(z: Tensor, y: Tensor) -> Tensor:
    """Soft labels ``[N, C]`` of integer labels ``[N]`` (float64 one-hot), soft ones as given."""
    if y.ndim == 2:
        return y.to(z.dtype)
    return F.one_hot(y.long(), z.shape[1]).to(z.dtype)


def separated(logits: Tensor, target: Tensor) -> bool:
    """Whether every row's label is the strict arg-max of its logits.

    Then ``softmax(z / T)`` puts more probability on every label as ``T`` shrinks, and so does
    every affine map that contains ``W = I / T``: the NLL has no minimum (its infimum, 0, is
    approached as ``T -> 0``). Soft labels count when one-hot on the arg-max.

    Args:
        logits: float ``[N, C]``.
        target: integer labels ``[N]`` or soft labels ``[N, C]``.

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
        >>> separated(z, torch.tensor([0, 1])), separated(z, torch.tensor([0, 0]))
        (True, False)
    """
    q = _label_rows(logits, target)
    one_hot = q.max(dim=1).values >= 1.0 - 1e-12
    label = q.argmax(dim=1)
    label_logit = logits.gather(1, label[:, None])[:, 0]
    others = logits.scatter(1, label[:, None], float("-inf")).max(dim=1).values
    return bool((one_hot & (label_logit > others)).all())


def label_advantage(logits: Tensor, target: Tensor) -> float:
    """``mean_i (sum_c q_ic z_ic - mean_c z_ic)``: how far the labels' logits lie above the mean.

    It is minus the slope of the NLL of ``softmax(b z)`` in ``b = 1 / T`` at ``b = 0``; the NLL
    is convex in ``b``, so when it is ``<= 0`` the NLL is least at ``b = 0``: ``T = infinity``,
    uniform probabilities.

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
        >>> label_advantage(z, torch.tensor([0, 1])), label_advantage(z, torch.full((2, 2), 0.5))
        (1.0, 0.0)
    """
    q = _label_rows(logits, target)
    return float(((q * logits).sum(dim=1) - logits.mean(dim=1)).mean())


#: Why labels the logits separate leave the fit without a minimum (``{what}``: what grows).
SEPARATED = (
    "every validation label is the arg-max of its logits, so the NLL keeps falling as {what} "
    "and has no minimum"
)
#: What to do about it.
TOO_EASY = "The held-out samples are too easy to calibrate on: fit on more, or harder, ones"


def why_uniform(logits: Tensor, target: Tensor) -> str:
    """Why a temperature runs above the range: the logits do not (or barely) predict the labels.

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
        >>> why_uniform(z, torch.tensor([1, 0])).split(" (")[0]
        'the validation labels carry no information the logits predict'
    """
    scale = 1.0 + float(logits.abs().mean())
    if label_advantage(logits, target) <= 1e-12 * scale:
        return (
            "the validation labels carry no information the logits predict (on average a "
            "label's logit is no higher than its row's mean logit, so the NLL is least at T = "
            "infinity)"
        )
    return "the logits barely predict the validation labels"


def temperature_bound(logits: Tensor, target: Tensor, temperature: float) -> str:
    """Why a fitted temperature ran to a bound, and what the calibrated map then does ("": none).

    Three cases: the labels are :func:`separated` by the logits (``T`` runs to 0 and the fit
    stops wherever its steps vanish, whatever ``T`` that is); ``T`` above
    ``TEMPERATURE_RANGE[1]`` (the logits do not, or barely, predict the labels: the
    probabilities are uniform); ``T`` below ``TEMPERATURE_RANGE[0]`` (nearly 0 or 1).

    Args:
        logits: the float64 logits ``[N, C]`` of the fit.
        target: their integer labels ``[N]`` or soft labels ``[N, C]``.
        temperature: the fitted ``T``.

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
        >>> temperature_bound(z, torch.tensor([0, 1]), 0.05)[:46]
        'the fitted temperature T=0.05 runs to 0: every'
        >>> temperature_bound(z, torch.tensor([0, 0]), 1.5)
        ''
    """
    low, high = TEMPERATURE_RANGE
    where = f"the fitted temperature T={temperature:.3g}"
    if separated(logits, target):
        return (
            f"{where} runs to 0: {SEPARATED.format(what='T shrinks')} (the fit stops where its "
            f"steps vanish); the calibrated probabilities are (nearly) 0 or 1. {TOO_EASY}"
        )
    if temperature > high:
        classes = logits.shape[1]
        spread = float((torch.softmax(logits / temperature, dim=1) - 1.0 / classes).abs().max())
        return (
            f"{where} is above {high:g}: {why_uniform(logits, target)}; the calibrated "
            "probabilities are uniform "
            f"(each within {spread:.1e} of 1/C = {1.0 / classes:.3g})"
        )
    if temperature < low:
        return (
            f"{where} is below {low:g}: the logits nearly separate the validation labels; the "
            "calibrated probabilities are (nearly) 0 or 1"
        )
    return ""


def fit_temperature(
    logits: Tensor, target: Tensor, *, max_iter: int = 100, ignore_index: int | None = None
) -> float:
    """Fit the temperature that minimises the NLL of ``softmax(logits / T)`` on held-out data.

    ``T* = argmin_T mean_i -log softmax(z_i / T)[y_i]`` (``sigmoid`` and binary cross-entropy
    for ``[N]`` logits, fitted as the two-class logits ``[0, z]``; ``mean_i -sum_c q_ic log
    softmax(z_i / T)_c`` for soft labels ``q``), found by L-BFGS with a strong-Wolfe line search
    on ``log T`` from ``T = 1``, in float64. ``T > 1`` softens an overconfident model, ``T < 1``
    sharpens an underconfident one. If the logits separate the classes perfectly the NLL keeps
    falling as ``T -> 0`` and the returned ``T`` is merely small; if they do not predict the
    labels it is least as ``T -> infinity`` and the returned ``T`` is merely large. This
    function does not warn; :meth:`TemperatureScaler.fit` does (:func:`temperature_bound`).

    Source: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017.

    Args:
        logits: held-out logits ``[N, C]`` (``C >= 2``), or ``[N]`` binary logits.
        target: class labels ``[N]`` (integers); soft labels ``[N, C]`` (float probabilities,
            each row summing to 1 within 1e-3 for float32 and float64, or within 0.031 for a
            row of bfloat16 numbers cast up, used as given) for ``[N, C]`` logits; or 0/1 for
            binary logits.
        max_iter: maximum number of L-BFGS iterations (``>= 1``).
        ignore_index: rows whose integer label equals it are left out (``None``: keep all).
            Not for soft labels: drop their rows instead.

    Returns:
        The fitted temperature ``T > 0``.

    Raises:
        TypeError: for non-tensor inputs, integer logits, non-integer class labels, integer
            ``[N, C]`` targets, or an ``ignore_index`` that is not an int.
        ValueError: for bad shapes, empty (or all ignored) or non-finite inputs, labels out of
            range, soft labels outside [0, 1] or whose rows do not sum to 1, or
            ``ignore_index`` given with soft labels.

    Example:
        >>> import math
        >>> z = torch.tensor([[2.0, 0.0], [2.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
        >>> y = torch.tensor([0, 0, 1, 1])  # 3 of 4 right: calibrated iff sigmoid(2 / T) = 3/4
        >>> t = fit_temperature(z, y)
        >>> round(t, 6), abs(t - 2 / math.log(3)) < 1e-6
        (1.820478, True)
        >>> soft = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
        >>> abs(fit_temperature(z, soft) - t) < 1e-6  # one-hot rows: the integer-label fit
        True
        >>> padded = fit_temperature(torch.cat([z, z[:1]]), torch.tensor([0, 0, 1, 1, -100]),
        ...                          ignore_index=-100)
        >>> abs(padded - t) < 1e-9
        True
    """
    check_int("max_iter", max_iter, low=1)
    z, y = _check_inputs(logits, target, ignore_index, owner="fit_temperature")
    if z.ndim == 1:
        z, y = as_class_logits(z), y.long()
    return _minimise_temperature(z, y, max_iter)


class TemperatureScaler(PostHocCalibrator):
    r"""Temperature scaling as a post-hoc calibrator: ``log_softmax(z / T)``, ``T`` fitted.

    .. math::

        g(z) = \log \operatorname{softmax}(z / T), \qquad
        T = \arg\min_{T > 0} -\frac{1}{N} \sum_i \log \operatorname{softmax}(z_i / T)_{y_i}

    (see :func:`fit_temperature`, which :meth:`fit` calls). ``forward`` returns the calibrated
    log-probabilities ``[N, C]`` (``[N, 2]`` for ``[N]`` binary logits, read as ``[0, z]``) in
    the dtype of the logits, computed in float64; gradients flow to the logits. ``T`` is kept
    as a float64 buffer (``temperature_buffer``), so it is saved in the ``state_dict`` with the
    base's extra state; the ``temperature`` property reads and sets it as a Python float.
    ``forward`` divides by the current ``T`` whether or not :meth:`fit` ran: before it, ``T``
    is the constructor's ``temperature`` (1, the identity, by default). ``T`` does not depend
    on the number of classes, so a fitted scaler applies to logits of any width.

    ``fit`` takes what :func:`fit_temperature` takes: integer labels ``[N]`` (rows equal to
    ``ignore_index`` left out), soft labels ``[N, C]``, or 0/1 targets of ``[N]`` binary
    logits. Integer labels of a single class fall back to the identity (``T = 1``) with a
    warning, as every calibrator of the interface does. A fit that runs to a bound of ``T``
    warns too (:func:`temperature_bound`: labels the logits separate drive ``T`` to 0 and the
    probabilities to 0 or 1; a ``T`` above 1e3, from labels the logits do not predict, makes
    them uniform) and keeps the fitted ``T``; the reason is in :attr:`bound`.

    Source: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017.

    Args:
        temperature: the initial temperature (``> 0``).
        max_iter: maximum number of L-BFGS iterations for :meth:`fit` (``>= 1``).

    Example:
        >>> scaler = TemperatureScaler(temperature=2.0)
        >>> scaler(torch.tensor([[4.0, -2.0]])).exp()  # softmax([2, -1])
        tensor([[0.9526, 0.0474]])
        >>> z = torch.tensor([[2.0, 0.0], [2.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
        >>> round(scaler.fit(z, torch.tensor([0, 0, 1, 1])).temperature, 6)
        1.820478
    """

    method: ClassVar[str] = "temperature"
    temperature_buffer: Tensor

    def __init__(self, *, temperature: float = 1.0, max_iter: int = 100) -> None:
        super().__init__()
        self.max_iter = check_int("max_iter", max_iter, low=1)
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

    def min_samples(self, num_classes: int) -> int:
        """One parameter, ``T``: one sample will do (two classes among the labels still must)."""
        return 1

    def fit(
        self: _Scaler, logits: Tensor, target: Tensor, *, ignore_index: int | None = None
    ) -> _Scaler:
        """Fit ``T`` on held-out ``logits`` and ``target`` (see :func:`fit_temperature`).

        ``target`` holds integer labels ``[N]`` (rows equal to ``ignore_index`` left out), soft
        labels ``[N, C]``, or 0/1 (integers or floats) for ``[N]`` binary logits.

        Returns:
            The scaler itself, fitted (``T = 1`` with a warning if it fell back).
        """
        binary_float = (
            isinstance(logits, Tensor)
            and isinstance(target, Tensor)
            and logits.ndim == 1
            and target.is_floating_point()
        )
        if (isinstance(target, Tensor) and target.ndim == 2) or binary_float:
            z, y = _check_inputs(logits, target, ignore_index, owner=f"{self.name}.fit")
            if y.ndim == 2:  # soft labels: no fallback (each row is a distribution)
                self.params, self.fallback = {}, ""
                self.temperature = _minimise_temperature(z, y, self.max_iter)
                self.params = {"num_classes": torch.tensor(z.shape[1], dtype=torch.float64)}
                self.note_bound(z, y, stacklevel=2)
                return self
            logits, target, ignore_index = z, y.long(), None
        super().fit(logits, target, ignore_index=ignore_index)
        temperature = self.params.pop("temperature", None)
        self.temperature = 1.0 if temperature is None else float(temperature)
        return self

    def _fit(self, logits: Tensor, target: Tensor) -> dict[str, Tensor]:
        temperature = _minimise_temperature(logits, target, self.max_iter)
        return {"temperature": torch.tensor(temperature, dtype=torch.float64)}

    def bound_reason(self, logits: Tensor, target: Tensor) -> str:
        """:func:`temperature_bound` of the fitted ``T``."""
        fitted = self.params.get("temperature")
        temperature = self.temperature if fitted is None else float(fitted)
        return temperature_bound(logits, target, temperature)

    def _log_probs(self, logits: Tensor) -> Tensor:
        return torch.log_softmax(logits / self.temperature_buffer.to(logits.device), dim=1)

    def forward(self, logits: Tensor) -> Tensor:
        """Calibrated log-probabilities ``log_softmax(z / T)`` ``[N, C]`` (``[N, 2]`` for ``[N]``).

        Computed in float64 and returned in the dtype of ``logits``, with the current ``T``.
        """
        z = as_class_logits(logits, owner=self.name)
        return self._log_probs(z.to(torch.float64)).to(logits.dtype)

    def report(
        self,
        logits: Tensor,
        target: Tensor,
        n_bins: int = 15,
        *,
        ignore_index: int | None = None,
    ) -> dict[str, float]:
        """Top-label ECE and NLL of ``logits`` before and after scaling by the current ``T``.

        The ECE uses ``n_bins`` equal-width bins ``(k/B, (k+1)/B]`` (a confidence of 0 in the
        first) and is ``sum_k |conf_sum_k - correct_sum_k| / N`` from the per-bin sums. The
        rows of integer labels equal to ``ignore_index`` are left out.

        With soft labels ``q`` ``[N, C]`` the NLL is the cross-entropy against them (what
        :meth:`fit` minimises) and the correctness of sample ``i`` in the ECE is
        ``q[i, argmax_c z_ic]``, the probability that the predicted class is right when the
        label is drawn from ``q``: with one-hot rows both are the integer-label values, with
        annotator votes the ECE compares confidence with the expected agreement.

        Returns:
            ``{"temperature", "ece_before", "ece_after", "nll_before", "nll_after"}``.

        Example:
            >>> logits = torch.tensor([[3.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
            >>> soft = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.5, 0.5]])
            >>> report = TemperatureScaler().fit(logits, soft).report(logits, soft)
            >>> report["nll_after"] <= report["nll_before"]
            True
        """
        if n_bins < 1:
            raise ValueError(f"n_bins must be a positive integer, got {n_bins}")
        z, y = _check_inputs(logits, target, ignore_index, owner=f"{self.name}.report")
        scaled = z / self.temperature
        with torch.no_grad():
            return {
                "temperature": self.temperature,
                "ece_before": _ece(*_top_label(z, y), n_bins),
                "ece_after": _ece(*_top_label(scaled, y), n_bins),
                "nll_before": float(_nll(z, y)),
                "nll_after": float(_nll(scaled, y)),
            }

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        """Load a state saved before the interface too (the buffer without extra state)."""
        if prefix + "temperature_buffer" in state_dict and prefix + "_extra_state" not in (
            state_dict
        ):
            state_dict[prefix + "_extra_state"] = {"params": {}, "fallback": ""}
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        """The temperature, and whether the fit fell back, shown in the module's ``repr``."""
        fell_back = ", identity (fell back)" if self.fallback else ""
        return f"temperature={self.temperature:.6g}{fell_back}"
