"""Scalers whose fit runs to a bound say so: a temperature driven to infinity or to 0.

References are independent float64 computations in NumPy/SciPy: the NLL of
``softmax(b z)`` and its slope in ``b = 1 / T``, ``-mean_i(sum_c q_ic z_ic - sum_c p_ic z_ic)``,
whose root (SciPy's ``brentq``) is the exact minimiser where one exists; where none exists
the slope stays negative and the NLL keeps falling.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.special import log_softmax, softmax

from lightning_losses.calibration.posthoc import (
    DirichletCalibration,
    EnsembleTemperatureScaling,
    MatrixScaling,
    TemperatureScaler,
    VectorScaling,
)
from lightning_losses.warning import LightningLossesWarning

C = 5


def logits(n: int = 200, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 2.0 * torch.randn(n, C, generator=generator, dtype=torch.float64)


def soft(labels: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Integer labels as one-hot rows (soft labels as they are)."""
    return labels if labels.ndim == 2 else np.eye(z.shape[1])[labels]


def nll(b: float, z: np.ndarray, q: np.ndarray) -> float:
    """Mean cross-entropy of softmax(b z) against the rows q, float64."""
    return float(-(q * log_softmax(b * z, axis=1)).sum(axis=1).mean())


def slope(b: float, z: np.ndarray, q: np.ndarray) -> float:
    """The slope of the NLL in b: -mean_i (sum_c q_ic z_ic - sum_c softmax(b z_i)_c z_ic)."""
    return float(-((q * z).sum(axis=1) - (softmax(b * z, axis=1) * z).sum(axis=1)).mean())


def reference_temperature(z: np.ndarray, q: np.ndarray) -> float:
    """1 / b* with b* the root of the slope (it is negative at 0 and positive at 10)."""
    root = brentq(lambda b: slope(b, z, q), 1e-12, 10.0, xtol=1e-300, rtol=1e-15, maxiter=500)
    return 1.0 / root


# --- T -> infinity --------------------------------------------------------------------------


def test_uninformative_soft_labels_give_uniform_probabilities_with_a_warning():
    z = logits()
    q = torch.full_like(z, 1.0 / C)  # every class equally likely, whatever the logits
    with pytest.warns(
        LightningLossesWarning,
        match=r"^TemperatureScaler \(temperature\): the fitted temperature T=\S+ is above 1000: "
        r"the validation labels carry no information the logits predict .* the calibrated "
        r"probabilities are uniform",
    ):
        scaler = TemperatureScaler().fit(z, q)
    assert scaler.temperature > 1e3
    assert scaler.bound.startswith("the fitted temperature")
    zn, qn = z.numpy(), q.numpy()
    # The exact minimiser: the NLL is convex in b = 1/T and its slope at b = 0 is 0, so b* = 0
    # (T = infinity), where the probabilities are uniform and the NLL is log C.
    assert slope(0.0, zn, qn) == pytest.approx(0.0, abs=1e-12)
    assert slope(1e-3, zn, qn) > 0
    probabilities = softmax(zn / scaler.temperature, axis=1)
    np.testing.assert_allclose(probabilities, 1.0 / C, atol=1e-5)
    assert nll(1.0 / scaler.temperature, zn, qn) == pytest.approx(math.log(C), abs=1e-9)
    np.testing.assert_allclose(scaler(z).exp().numpy(), probabilities, rtol=1e-12)


def test_weakly_informative_soft_labels_give_a_large_finite_temperature_and_a_warning():
    z = logits()
    eps = 2e-4  # a sliver of mass on the arg-max: b* = 1/T* is small but positive
    q = (1 - eps) / C + eps * torch.nn.functional.one_hot(z.argmax(1), C).to(z.dtype)
    want = reference_temperature(z.numpy(), q.numpy())
    assert 1e3 < want < 1e5
    with pytest.warns(
        LightningLossesWarning,
        match=r"above 1000: the logits barely predict the validation labels; the calibrated "
        r"probabilities are uniform \(each within \S+ of 1/C = 0\.2\)",
    ):
        scaler = TemperatureScaler().fit(z, q)
    # The NLL is nearly flat there: L-BFGS on log T stops once its gradient, b dNLL/db, is
    # below 1e-12, which leaves T within 1e-4 of the root (measured: 8.4e-5) and the NLL
    # within 1e-12 of its minimum.
    assert scaler.temperature == pytest.approx(want, rel=1e-3)
    zn, qn = z.numpy(), q.numpy()
    assert nll(1.0 / scaler.temperature, zn, qn) == pytest.approx(
        nll(1.0 / want, zn, qn), abs=1e-12
    )


def test_labels_the_logits_do_not_predict_drive_the_temperature_up():
    z = logits()
    y = (z.argmax(1) + 1) % C  # always a class other than the predicted one
    with pytest.warns(LightningLossesWarning, match=r"carry no information the logits predict"):
        scaler = TemperatureScaler().fit(z, y)
    zn, qn = z.numpy(), soft(y.numpy(), z.numpy())
    assert slope(0.0, zn, qn) > 0  # the NLL rises from b = 0: its minimum is at T = infinity
    assert scaler.temperature > 1e3


# --- T -> 0 ---------------------------------------------------------------------------------


def separated_logits(margin: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Random logits whose arg-max is every label, ahead of the others by at least margin."""
    z = logits()
    y = z.argmax(1)
    z[torch.arange(len(y)), y] += margin
    return z, y


@pytest.mark.parametrize(("margin", "below"), [(0.0, True), (3.0, False)])
def test_separated_labels_drive_the_temperature_to_zero_with_a_warning(margin, below):
    z, y = separated_logits(margin)
    with pytest.warns(
        LightningLossesWarning,
        match=r"^TemperatureScaler \(temperature\): the fitted temperature T=\S+ runs to 0: "
        r"every validation label is the arg-max of its logits, so the NLL keeps falling as T "
        r"shrinks and has no minimum",
    ):
        scaler = TemperatureScaler().fit(z, y)
    t = scaler.temperature
    # Where the fit stopped depends on the margin (below 1e-3 without one); it warns either way.
    assert (t < 1e-3) is below
    zn, qn = z.numpy(), soft(y.numpy(), z.numpy())
    # No minimum at the fitted T: the slope there is still negative (or 0 in float64, once
    # the other classes' probabilities underflow) and halving T lowers the NLL further.
    assert slope(1.0 / t, zn, qn) <= 0
    assert nll(2.0 / t, zn, qn) <= nll(1.0 / t, zn, qn)
    if margin:
        assert slope(1.0 / t, zn, qn) < 0
        assert nll(2.0 / t, zn, qn) < nll(1.0 / t, zn, qn)
    assert softmax(zn / t, axis=1)[np.arange(len(y)), y.numpy()].min() > 1 - 1e-6


def test_binary_logits_separated_by_their_sign_warn_too():
    z = torch.linspace(-4, 4, 40, dtype=torch.float64)
    z = z[z != 0]
    with pytest.warns(LightningLossesWarning, match=r"runs to 0: every validation label"):
        TemperatureScaler().fit(z, (z > 0).long())


def test_one_label_off_the_arg_max_gives_the_exact_finite_temperature_silently():
    z, y = separated_logits(0.0)
    y[0] = (y[0] + 1) % C  # one wrong prediction: the NLL has a minimum
    want = reference_temperature(z.numpy(), soft(y.numpy(), z.numpy()))
    assert 1e-3 < want < 1e3
    scaler = TemperatureScaler().fit(z, y)  # a package warning would fail the test
    assert scaler.bound == ""
    assert scaler.temperature == pytest.approx(want, rel=1e-6)


# --- the other scalers ----------------------------------------------------------------------

AFFINE = [VectorScaling, MatrixScaling, DirichletCalibration]


@pytest.mark.parametrize("cls", AFFINE, ids=lambda c: c.__name__)
def test_affine_maps_on_separated_labels_warn_that_the_weights_grow(cls):
    z, y = separated_logits(0.0)
    with pytest.warns(
        LightningLossesWarning,
        match=rf"^{cls.__name__} \({cls.method}\): every validation label is the arg-max of its "
        r"logits, so the NLL keeps falling as the weights grow and has no minimum; the fit "
        r"stopped where its steps vanish, at the map's largest weight \|W\| = \S+",
    ):
        fitted = cls().fit(z, y)
    # The map's probabilities, from its parameters: every label near 1.
    x = z.numpy() if cls is not DirichletCalibration else log_softmax(z.numpy(), axis=1)
    weight, bias = fitted.params["weight"].numpy(), fitted.params["bias"].numpy()
    mapped = x * weight + bias if weight.ndim == 1 else x @ weight.T + bias
    assert softmax(mapped, axis=1)[np.arange(len(y)), y.numpy()].min() > 1 - 1e-6


def balanced_patterns() -> tuple[torch.Tensor, torch.Tensor]:
    """Two logit patterns, each with every label equally often: the logits tell nothing."""
    z = torch.tensor([[3.0, 0.0, 0.0]] * 12 + [[0.0, 3.0, 0.0]] * 12, dtype=torch.float64)
    return z, torch.tensor([0, 1, 2] * 8)


@pytest.mark.parametrize("cls", AFFINE, ids=lambda c: c.__name__)
def test_affine_maps_on_uninformative_labels_warn_that_they_ignore_the_logits(cls):
    z, y = balanced_patterns()
    with pytest.warns(
        LightningLossesWarning,
        match=rf"^{cls.__name__} \({cls.method}\): the map's largest weight \|W\| = \S+ \(1/T "
        r"of temperature scaling\) is below 0\.001: the map ignores the logits",
    ):
        fitted = cls().fit(z, y)
    # The label frequencies are 1/3 in each pattern: the exact fit is the uniform prediction.
    np.testing.assert_allclose(fitted.probabilities(z).numpy(), 1.0 / 3.0, atol=1e-5)


def test_ensemble_temperature_scaling_says_what_its_first_component_does():
    z, y = separated_logits(0.0)
    with pytest.warns(
        LightningLossesWarning,
        match=r"^EnsembleTemperatureScaling \(ensemble_temperature\): the temperature of its "
        r"first component, T=\S+, runs to 0: every validation label is the arg-max",
    ):
        EnsembleTemperatureScaling().fit(z, y)
    z, y = balanced_patterns()
    with pytest.warns(
        LightningLossesWarning,
        match=r"is above 1000: the validation labels carry no information the logits predict "
        r".*; that component is uniform, like the third, so the calibrated probabilities are "
        r"0 softmax\(z\) \+ 1 / C",
    ):
        fitted = EnsembleTemperatureScaling().fit(z, y)
    np.testing.assert_allclose(fitted.probabilities(z).numpy(), 1.0 / 3.0, atol=1e-9)


def test_a_fit_inside_the_bounds_is_silent_and_clears_the_last_bound():
    scaler = TemperatureScaler()
    with pytest.warns(LightningLossesWarning, match="runs to 0"):
        scaler.fit(*separated_logits(0.0))
    z, y = separated_logits(0.0)
    y[::7] = (y[::7] + 1) % C
    scaler.fit(z, y)
    assert scaler.bound == ""
