"""Beta calibration (binary).

References, independent of the code under test: betacal's ``BetaCalibration`` called directly
on the scores ``s = sigmoid(z_1 - z_0)``, and scipy's trust-region Newton minimiser of the same
log-likelihood written here in NumPy float64.

Tolerances: betacal fits with scikit-learn's ``LogisticRegression`` (L-BFGS, ``tol=1e-4``),
which stops once the largest gradient component of the mean log-loss is below 1e-4 (checked
here), so its parameters lie about ``H^-1 g`` from the optimum: up to 6e-3 on these data,
where the smallest eigenvalue of the Hessian ``H`` of the mean loss is near 0.006. One Newton
step from betacal's parameters (in NumPy, here) removes that first-order error: ours match
the result within 1e-4 (what is left is second order, about 1e-5). The calibrated
probabilities agree with betacal's own within 1e-3 (3.5e-4 seen); our NLL is never above
betacal's, and our parameters equal scipy's trust-region Newton minimiser (gradient below
1e-9) within 1e-6.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from betacal import BetaCalibration as BetaCal
from helpers.warned import package_warns
from scipy.optimize import minimize

from lightning_losses.calibration import BetaCalibration
from lightning_losses.calibration.posthoc import get_calibrator

PARAMETERS = ("abm", "am", "ab")


def scores(n: int, a: float, b: float, c: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Binary logits ``d`` and labels drawn from the beta map ``(a, b, c)`` of ``sigmoid(d)``."""
    g = torch.Generator().manual_seed(seed)
    d = 3.0 * torch.randn(n, generator=g, dtype=torch.float64)
    s = torch.sigmoid(d)
    q = torch.sigmoid(a * s.log() - b * torch.log1p(-s) + c)
    return d, (torch.rand(n, generator=g, dtype=torch.float64) < q).long()


def betacal_fit(d: torch.Tensor, y: torch.Tensor, parameters: str) -> BetaCal:
    return BetaCal(parameters=parameters).fit(torch.sigmoid(d).numpy(), y.numpy())


def nll(q: np.ndarray, y: np.ndarray) -> float:
    return float(-np.mean(np.where(y == 1, np.log(q), np.log1p(-q))))


def log_features(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log s and log(1 - s) of s = sigmoid(d), d clipped as betacal clips s to [eps, 1 - eps]."""
    eps = np.finfo(np.float64).eps
    d = np.clip(d, math.log(eps) - math.log1p(-eps), math.log1p(-eps) - math.log(eps))
    return -np.logaddexp(0.0, -d), -np.logaddexp(0.0, d)


def design(d: torch.Tensor, columns: str) -> np.ndarray:
    """Betacal's regressors for ``columns``, and for its refits without a or b.

    "abm": [log s, -log(1-s), 1]; "am": [logit s, 1]; "ab": [log 2s, log 2(1-s)]; "b":
    [-log(1-s), 1] (a = 0) and "a": [log s, 1] (b = 0).
    """
    log_s, log_not_s = log_features(d.numpy())
    one, two = np.ones_like(log_s), math.log(2.0)
    return {
        "abm": np.stack([log_s, -log_not_s, one], 1),
        "am": np.stack([log_s - log_not_s, one], 1),
        "ab": np.stack([two + log_s, two + log_not_s], 1),
        "b": np.stack([-log_not_s, one], 1),
        "a": np.stack([log_s, one], 1),
    }[columns]


def gradient_and_hessian(x: np.ndarray, y: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, ...]:
    """Of the mean log-loss of sigmoid(x @ theta) against 0/1 labels y."""
    p = 1.0 / (1.0 + np.exp(-(x @ theta)))
    return x.T @ (p - y) / len(y), (x * (p * (1.0 - p))[:, None]).T @ x / len(y)


def check_against_betacal(
    ours: BetaCalibration, reference: BetaCal, x: np.ndarray, y: np.ndarray, columns: str
) -> None:
    """Betacal stopped at a gradient <= 1e-4; one Newton step from there reaches our optimum."""
    model = reference.calibrator_.lr_
    theta_b = np.r_[model.coef_[0], model.intercept_] if columns != "ab" else model.coef_[0]
    grad, hessian = gradient_and_hessian(x, y, theta_b)
    assert np.abs(grad).max() <= 1.01e-4
    newton = theta_b - np.linalg.solve(hessian, grad)
    a, b, c = (float(ours.params[k]) for k in "abc")
    theta = {"abm": [a, b, c], "am": [a, c], "ab": [a, -b], "b": [b, c], "a": [a, c]}[columns]
    np.testing.assert_allclose(theta, newton, atol=1e-4)


@pytest.mark.parametrize("parameters", PARAMETERS)
@pytest.mark.parametrize("seed", [0, 1])
def test_equals_betacal_within_its_optimiser_tolerance(parameters: str, seed: int) -> None:
    """Betacal's fit corrected by one Newton step, within 1e-4; probabilities within 1e-3.

    Our NLL on the fitted samples is no larger than betacal's.
    """
    truth = [(0.8, 1.3, 0.4), (1.4, 0.6, -0.3)][seed]
    d, y = scores(3000, *truth, seed=seed)
    reference = betacal_fit(d, y, parameters)
    ours = BetaCalibration(parameters=parameters).fit(d, y)  # type: ignore[arg-type]
    check_against_betacal(ours, reference, design(d, parameters), y.numpy(), parameters)
    d_test = torch.linspace(-12.0, 12.0, 241, dtype=torch.float64)
    expected = reference.predict(torch.sigmoid(d_test).numpy())
    np.testing.assert_allclose(ours(d_test).exp()[:, 1].numpy(), expected, atol=1e-3)
    fitted = ours(d).exp()[:, 1].numpy()
    reference_fit = reference.predict(torch.sigmoid(d).numpy())
    assert nll(fitted, y.numpy()) <= nll(reference_fit, y.numpy()) + 1e-12


def test_equals_a_tight_minimiser() -> None:
    """The three parameters of "abm" are the float64 optimum of the likelihood within 1e-6."""
    d, y = scores(2000, 1.4, 0.6, -0.3, seed=1)
    x, target = design(d, "abm"), y.numpy().astype(np.float64)

    def loss(theta: np.ndarray) -> float:
        eta = x @ theta
        return float(np.mean(np.logaddexp(0.0, eta) - target * eta))

    best = minimize(
        loss,
        np.zeros(3),
        jac=lambda t: gradient_and_hessian(x, target, t)[0],
        hess=lambda t: gradient_and_hessian(x, target, t)[1],
        method="trust-exact",
        options={"gtol": 1e-9},
    )
    assert np.abs(gradient_and_hessian(x, target, best.x)[0]).max() < 1e-9
    ours = BetaCalibration().fit(d, y).params
    np.testing.assert_allclose([float(ours[k]) for k in "abc"], best.x, atol=1e-6)


@pytest.mark.parametrize(("a", "b", "zeroed"), [(-0.6, 1.0, "a"), (1.0, -0.6, "b")])
def test_negative_coefficient_refits_as_betacal(a: float, b: float, zeroed: str) -> None:
    """A negative a (or b) in the full fit: refitted without it, as betacal, the other kept."""
    d, y = scores(4000, a, b, 0.0, seed=2)
    reference = betacal_fit(d, y, "abm")
    ours = BetaCalibration().fit(d, y)
    assert reference.calibrator_.map_[0 if zeroed == "a" else 1] == 0
    assert float(ours.params[zeroed]) == 0.0
    kept = "b" if zeroed == "a" else "a"
    check_against_betacal(ours, reference, design(d, kept), y.numpy(), kept)
    d_test = torch.linspace(-10.0, 10.0, 101, dtype=torch.float64)
    expected = reference.predict(torch.sigmoid(d_test).numpy())
    np.testing.assert_allclose(ours(d_test).exp()[:, 1].numpy(), expected, atol=1e-3)


def test_two_column_logits_and_extreme_scores() -> None:
    """[N, 2] logits use z_1 - z_0; scores beyond [eps, 1 - eps] are clipped as betacal's."""
    d, y = scores(1500, 0.9, 1.1, 0.2, seed=3)
    d = torch.cat([d, torch.tensor([-60.0, -45.0, 45.0, 60.0], dtype=torch.float64)])
    y = torch.cat([y, torch.tensor([0, 1, 0, 1])])
    pair = torch.stack([1.0 - 0.5 * d, 1.0 + 0.5 * d], dim=1)
    ours = BetaCalibration().fit(pair, y)
    torch.testing.assert_close(ours(pair), BetaCalibration().fit(d, y)(d), rtol=0, atol=1e-9)
    reference = betacal_fit(d, y, "abm")
    extreme = torch.tensor([-80.0, -40.0, 40.0, 80.0], dtype=torch.float64)
    expected = reference.predict(torch.sigmoid(extreme).numpy())
    out = ours(torch.stack([torch.zeros_like(extreme), extreme], 1))
    np.testing.assert_allclose(out.exp()[:, 1].numpy(), expected, atol=1e-3)
    assert bool(torch.isfinite(out).all())


def test_state_dict_round_trip_and_dtype() -> None:
    """A fresh calibrator loads the fit; float32 in, float32 out."""
    d, y = scores(500, 1.0, 1.0, 0.5, seed=4)
    fitted = BetaCalibration(parameters="am").fit(d, y)
    fresh = BetaCalibration(parameters="am")
    fresh.load_state_dict(fitted.state_dict())
    assert torch.equal(fresh(d), fitted(d))
    out = fresh(d.float())
    assert out.dtype == torch.float32
    assert out.shape == (500, 2)


def test_more_than_two_classes_is_an_error() -> None:
    """C > 2 raises a ValueError naming BetaCalibration and C."""
    with pytest.raises(ValueError, match=r"BetaCalibration: .*binary.*got C=3 classes"):
        BetaCalibration().fit(torch.randn(10, 3), torch.arange(10) % 3)


def test_fallback_and_bad_input() -> None:
    """Fewer samples than parameters, or one class: the identity with a warning."""
    d = torch.tensor([-1.0, 2.0])
    with package_warns(r"BetaCalibration \(beta\) falls back.*2 samples are fewer than the 3"):
        beta = BetaCalibration().fit(d, torch.tensor([0, 1]))
    torch.testing.assert_close(beta(d), torch.log_softmax(torch.stack([torch.zeros(2), d], 1), 1))
    with package_warns(r"BetaCalibration \(beta\) falls back.*one class"):
        BetaCalibration(parameters="ab").fit(torch.randn(6), torch.ones(6, dtype=torch.long))
    with pytest.raises(ValueError, match="BetaCalibration: parameters must be one of"):
        BetaCalibration(parameters="abc")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"BetaCalibration\.fit: target labels must lie in \[0, 1\]"
    ):
        BetaCalibration().fit(torch.randn(6), torch.tensor([0, 1, 2, 0, 1, 0]))
    assert get_calibrator("beta", parameters="ab").free_parameters == "ab"  # type: ignore[attr-defined]
