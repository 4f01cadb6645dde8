r"""Beta calibration of a binary classifier: a logistic regression on ``log s`` and ``log(1 - s)``.

Kull, Silva Filho and Flach, "Beta calibration: a well-founded and easily implemented
improvement on logistic calibration for binary classifiers" (AISTATS 2017). With
:math:`s = \operatorname{softmax}(z)_1 = \sigma(z_1 - z_0)` the score of class 1 (for ``[N]``
binary logits, :math:`s = \sigma(z)`), the calibrated probability of class 1 is

.. math::

    q(s) = \sigma\bigl(a \log s - b \log(1 - s) + c\bigr), \qquad a, b \ge 0,

the family of beta calibration maps, which contains the identity (:math:`a = b = 1, c = 0`),
maps that are not sigmoids of the logit, and, with :math:`a = b`, logistic (Platt) scaling of
the logit. :math:`c = b \log(1 - m) - a \log m` for the map's fixed point ``q(m) = 1/2`` of the
paper's :math:`(a, b, m)` parametrisation. The parameters maximise the likelihood of the labels.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_losses.calibration.posthoc.base import PostHocCalibrator
from lightning_losses.functional.checks import check_choice, check_int

__all__ = ["BetaCalibration"]

Parameters = Literal["abm", "ab", "am"]

#: betacal clips the score to [eps, 1 - eps]: the logit difference to +-logit(1 - eps).
EPS = float(torch.finfo(torch.float64).eps)
LOGIT_BOUND = math.log1p(-EPS) - math.log(EPS)
#: The inverse L2 strength of betacal's logistic regressions (scikit-learn's ``C``).
BETACAL_C = 99999999999.0


def _log_scores(logits: Tensor) -> tuple[Tensor, Tensor]:
    """``log s`` and ``log(1 - s)`` of two-class logits, ``s`` clipped to ``[eps, 1 - eps]``."""
    d = (logits[:, 1] - logits[:, 0]).clamp(-LOGIT_BOUND, LOGIT_BOUND)
    return F.logsigmoid(d), F.logsigmoid(-d)


def _logistic_fit(features: Tensor, target: Tensor, *, intercept: bool, max_iter: int) -> Tensor:
    """The maximum-likelihood logistic regression of 0/1 ``target`` on ``features`` ``[N, k]``.

    Minimises ``mean_i softplus(eta_i) - y_i eta_i + ||w||^2 / (2 C N)`` (scikit-learn's
    objective with betacal's ``C``; the intercept, last, is not penalised) by Newton's method
    with a backtracking line search, in float64. Returns the coefficients, then the intercept.
    """
    n = features.shape[0]
    design = torch.cat([features, torch.ones_like(features[:, :1])], 1) if intercept else features
    penalty = torch.full((design.shape[1],), 1.0 / (BETACAL_C * n), dtype=torch.float64)
    if intercept:
        penalty[-1] = 0.0
    penalty = penalty.to(design.device)

    def loss(theta: Tensor) -> Tensor:
        eta = design @ theta
        return F.binary_cross_entropy_with_logits(eta, target) + 0.5 * (penalty * theta**2).sum()

    theta = torch.zeros(design.shape[1], dtype=torch.float64, device=design.device)
    current = loss(theta)
    for _ in range(max_iter):
        p = torch.sigmoid(design @ theta)
        grad = design.T @ (p - target) / n + penalty * theta
        hessian = (design * (p * (1 - p))[:, None]).T @ design / n + torch.diag(penalty)
        step, info = torch.linalg.solve_ex(hessian, grad)
        if int(info) != 0 or not bool(torch.isfinite(step).all()):
            step = grad
        decrease = float(grad @ step)
        if decrease <= 1e-30:
            break
        size = 1.0
        while True:
            trial = theta - size * step
            value = loss(trial)
            if value <= current - 1e-4 * size * decrease or size < 1e-12:
                break
            size /= 2
        if not value < current:
            break
        theta, current = trial, value
    return theta


class BetaCalibration(PostHocCalibrator):
    r"""Beta calibration (binary tasks): ``q(s) = sigmoid(a log s - b log(1 - s) + c)``.

    Fitted by maximum likelihood as betacal fits it, with ``parameters``:

    - ``"abm"`` (default): :math:`a`, :math:`b`, :math:`c` free. If the fit gives
      :math:`a < 0` it is refitted with :math:`a = 0` (on :math:`-\log(1 - s)` alone); else if
      :math:`b < 0`, with :math:`b = 0` (on :math:`\log s` alone), as betacal does (which keeps
      the refit's coefficient as it comes, even negative).
    - ``"am"``: :math:`a = b`, i.e. logistic scaling of the logit
      :math:`\log s - \log(1 - s)`.
    - ``"ab"``: the map's fixed point at :math:`m = 1/2`, no intercept:
      :math:`\sigma(a \log 2s - b \log 2(1 - s))`, i.e. :math:`c = (a - b) \log 2`.

    The score :math:`s = \sigma(z_1 - z_0)` enters through :math:`\log s` and
    :math:`\log(1 - s)` computed from the logits, with the logit difference clipped to
    :math:`\pm \operatorname{logit}(1 - \varepsilon)` (:math:`\varepsilon` the float64 machine
    epsilon): betacal's clipping of the score to :math:`[\varepsilon, 1 - \varepsilon]`. The
    likelihood (with betacal's negligible L2 term :math:`\|w\|^2 / (2 C N)`, :math:`C =
    99999999999`) is minimised by Newton's method to the optimum in float64, where betacal's
    scikit-learn L-BFGS stops at a gradient of ``1e-4``. ``forward`` returns
    :math:`(\log(1 - q), \log q)`, finite everywhere.

    Binary only: logits ``[N, 2]`` or ``[N]`` (read as ``[0, z]``); more classes raise
    ``ValueError``. ``params``: ``a``, ``b``, ``c``. A fit needs as many samples as free
    parameters (3 for ``"abm"``, 2 otherwise) and both classes among the labels; with fewer it
    falls back to the identity with a warning.

    Source: Kull, Silva Filho and Flach, "Beta calibration: a well-founded and easily
    implemented improvement on logistic calibration for binary classifiers", AISTATS 2017.

    Args:
        parameters: ``"abm"`` (default), ``"am"`` or ``"ab"``, as betacal's.
        max_iter: the most Newton steps of each fit (``>= 1``).

    Example:
        >>> z = torch.tensor([-3.0, -1.0, -1.0, 0.5, 1.0, 1.0, 3.0, 4.0])  # [N] binary logits
        >>> y = torch.tensor([0, 0, 1, 0, 1, 0, 1, 1])
        >>> beta = BetaCalibration().fit(z, y)
        >>> {k: round(float(v), 4) for k, v in beta.params.items() if k != "num_classes"}
        {'a': 0.0163, 'b': 1.3447, 'c': -1.6314}
        >>> beta(torch.tensor([0.0])).exp()  # s = 1/2: q = sigmoid((b - a) log 2 + c)
        tensor([[0.6705, 0.3295]])
    """

    method: ClassVar[str] = "beta"

    def __init__(self, *, parameters: Parameters = "abm", max_iter: int = 100) -> None:
        super().__init__()
        check_choice(f"{type(self).__name__}: parameters", parameters, ("abm", "am", "ab"))
        #: Which parameters are free (the constructor's ``parameters``; ``Module.parameters`` is
        #: the module's method).
        self.free_parameters: Parameters = parameters
        self.max_iter = check_int(f"{type(self).__name__}: max_iter", max_iter, low=1)

    def check_classes(self, num_classes: int) -> None:
        """Beta calibration maps one score: two classes only."""
        if num_classes != 2:
            raise ValueError(
                f"{self.name}: beta calibration is for binary tasks (logits [N, 2] or [N]); got "
                f"C={num_classes} classes. For more classes use a multiclass method such as "
                f"'dirichlet', 'vector' or 'temperature'"
            )

    def min_samples(self, num_classes: int) -> int:
        """As many samples as free parameters: 3 for ``"abm"``, 2 for ``"am"`` and ``"ab"``."""
        return 3 if self.free_parameters == "abm" else 2

    def _fit(self, logits: Tensor, target: Tensor) -> dict[str, Tensor]:
        log_s, log_not_s = _log_scores(logits)
        y = target.to(torch.float64)
        fit = self.max_iter
        zero = torch.zeros((), dtype=torch.float64)
        if self.free_parameters == "am":
            a, c = _logistic_fit((log_s - log_not_s)[:, None], y, intercept=True, max_iter=fit)
            return {"a": a, "b": a.clone(), "c": c}
        if self.free_parameters == "ab":
            both = torch.stack([math.log(2.0) + log_s, math.log(2.0) + log_not_s], 1)
            a, minus_b = _logistic_fit(both, y, intercept=False, max_iter=fit)
            return {"a": a, "b": -minus_b, "c": (a + minus_b) * math.log(2.0)}
        both = torch.stack([log_s, -log_not_s], 1)
        a, b, c = _logistic_fit(both, y, intercept=True, max_iter=fit)
        if a < 0:
            b, c = _logistic_fit(-log_not_s[:, None], y, intercept=True, max_iter=fit)
            a = zero
        elif b < 0:
            a, c = _logistic_fit(log_s[:, None], y, intercept=True, max_iter=fit)
            b = zero
        return {"a": a, "b": b, "c": c}

    def _log_probs(self, logits: Tensor) -> Tensor:
        log_s, log_not_s = _log_scores(logits)
        eta = self.param("a", logits) * log_s - self.param("b", logits) * log_not_s
        eta = eta + self.param("c", logits)
        return torch.stack([F.logsigmoid(-eta), F.logsigmoid(eta)], dim=1)

    def extra_repr(self) -> str:
        """The parametrisation and whether it is fitted."""
        return f"parameters={self.free_parameters!r}, {super().extra_repr()}"
