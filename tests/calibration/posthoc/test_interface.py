"""The post-hoc interface: fallback to the identity, saved state, bad input, the choice by CV.

The choice is checked against a plain k-fold loop written here: rows sorted by (label, logits
lexicographically) with Python's ``sorted``, sample j of that order in fold j mod K, each
candidate refitted on the other folds and scored by the summed NLL of its held-out fold.
"""

from __future__ import annotations

import io
import math
import warnings

import pytest
import torch
from helpers.warned import package_warns

from lightning_losses.calibration.posthoc import (
    CALIBRATION_METHODS,
    PostHocCalibrator,
    get_calibrator,
    select_calibrator,
)
from lightning_losses.calibration.posthoc.ensemble import EnsembleTemperatureScaling
from lightning_losses.calibration.posthoc.linear import (
    DirichletCalibration,
    MatrixScaling,
    VectorScaling,
)
from lightning_losses.calibration.posthoc.temperature import TemperatureScaler
from lightning_losses.warning import LightningLossesWarning

PARAMETRIC = (
    TemperatureScaler,
    VectorScaling,
    MatrixScaling,
    DirichletCalibration,
    EnsembleTemperatureScaling,
)


def overconfident(n: int, classes: int, seed: int, factor: float = 3.0):
    """Labels drawn from softmax(z); the logits shown are factor * z (factor 1: calibrated)."""
    g = torch.Generator().manual_seed(seed)
    w = 0.7 * torch.randn(classes, 4, generator=g, dtype=torch.float64)
    z = torch.randn(n, 4, generator=g, dtype=torch.float64) @ w.T
    y = torch.multinomial(z.softmax(1), 1, generator=g)[:, 0]
    return factor * z, y


def plain_cv_nll(make, z: torch.Tensor, y: torch.Tensor, folds: int) -> float:
    """Mean held-out NLL of ``make()`` (``None``: no calibration) over a plain k-fold loop."""
    order = sorted(range(len(y)), key=lambda i: (int(y[i]), *z[i].tolist()))
    z, y = z[order], y[order]
    total = 0.0
    for k in range(folds):
        held = [j for j in range(len(y)) if j % folds == k]
        rest = [j for j in range(len(y)) if j % folds != k]
        if make is None:
            log_probs = torch.log_softmax(z[held], dim=1)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LightningLossesWarning)
                log_probs = make().fit(z[rest], y[rest])(z[held])
        total -= float(log_probs[torch.arange(len(held)), y[held]].sum())
    return total / len(y)


# ------------------------------------------------------------------------ fallback


@pytest.mark.parametrize(("cls", "need"), [(c, c().min_samples(3)) for c in PARAMETRIC[1:]])
def test_too_few_samples_warn_with_the_method_and_reason(cls, need):
    # (temperature scaling needs 1 sample: only a single class makes it fall back, below)
    assert (
        need == {"vector": 6, "matrix": 12, "dirichlet": 12, "ensemble_temperature": 3}[cls.method]
    )
    z, _ = overconfident(40, 3, seed=1)
    n = need - 1
    z, y = z[:n], torch.arange(n) % 3
    message = (
        rf"{cls.__name__} \({cls.method}\) falls back to the identity: {n} samples are fewer "
        rf"than the {need} it needs for 3 classes"
    )
    with package_warns(message):
        fitted = cls().fit(z, y)
    assert fitted.fallback.startswith(f"{n} samples are fewer")
    assert fitted.fitted
    torch.testing.assert_close(fitted(z), torch.log_softmax(z, dim=1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", PARAMETRIC)
def test_a_single_class_warns_with_the_method_and_reason(cls):
    z, _ = overconfident(200, 3, seed=2)
    message = rf"{cls.__name__} \({cls.method}\) falls back to the identity: every label is class 1"
    with package_warns(message):
        fitted = cls().fit(z, torch.ones(200, dtype=torch.long))
    assert "one class cannot be calibrated" in fitted.fallback
    torch.testing.assert_close(fitted(z), torch.log_softmax(z, dim=1), rtol=0, atol=1e-12)


# --------------------------------------------------------------------- saved state


@pytest.mark.parametrize("method", sorted(CALIBRATION_METHODS))
def test_state_dict_round_trips_into_a_fresh_instance(method):
    calibrator = get_calibrator(method)
    assert calibrator.method == method
    try:
        calibrator.check_classes(3)
        z, y = overconfident(300, 3, seed=3)
    except ValueError:  # a binary method
        z, y = overconfident(300, 2, seed=3)
    fitted = calibrator.fit(z, y)
    assert fitted.fallback == ""
    buffer = io.BytesIO()
    torch.save(fitted.state_dict(), buffer)
    buffer.seek(0)
    fresh = get_calibrator(method)
    assert not fresh.fitted
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    assert fresh.fitted
    assert fresh.params.keys() == fitted.params.keys()
    for key, value in fitted.params.items():
        assert torch.equal(fresh.params[key], value), key
    assert torch.equal(fresh(z), fitted(z))
    assert fresh.num_classes == z.shape[1]


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("cls", PARAMETRIC)
def test_bad_input_errors_name_the_calibrator(cls):
    z, y = overconfident(50, 3, seed=4)
    nan = z.clone()
    nan[7, 1] = math.nan
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.fit: logits contain NaN"):
        cls().fit(nan, y)
    with pytest.raises(
        ValueError, match=rf"{cls.__name__}\.fit: target labels must lie in \[0, 2\]"
    ):
        cls().fit(z, torch.where(y == 0, 3, y))
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.fit: target labels must lie"):
        cls().fit(z, y - 1)


def test_get_calibrator_rejects_unknown_methods_and_hyper_parameters():
    with pytest.raises(
        ValueError, match=r"unknown calibration method 'platt'; choose one of 'temperature'"
    ):
        get_calibrator("platt")
    with pytest.raises(TypeError, match="reg_lambda"):
        get_calibrator("vector", reg_lambda=0.1)
    matrix = get_calibrator("matrix", reg_lambda=0.5)
    assert isinstance(matrix, MatrixScaling)
    assert matrix.reg_lambda == 0.5


# --------------------------------------------------------------- select_calibrator


def test_the_choice_equals_a_plain_k_fold_loop():
    z, y = overconfident(240, 3, seed=5)
    makers = {
        "temperature": TemperatureScaler,
        "vector": VectorScaling,
        "ensemble_temperature": EnsembleTemperatureScaling,
        "dirichlet": DirichletCalibration,
    }
    choice = select_calibrator([make() for make in makers.values()], z, y, folds=4)
    want = {"none": plain_cv_nll(None, z, y, 4)}
    want.update({method: plain_cv_nll(make, z, y, 4) for method, make in makers.items()})
    assert choice.scores.keys() == want.keys()
    for method, score in want.items():
        assert choice.scores[method] == pytest.approx(score, rel=1e-12, abs=1e-12), method
    best = min(want, key=lambda m: (want[m], list(want).index(m)))
    assert choice.method == best
    assert choice.method != "none"  # overconfident logits: some method helps
    assert choice.folds == 4
    # the chosen calibrator is refitted on all samples
    refit = makers[best]().fit(z, y)
    torch.testing.assert_close(choice.calibrator(z), refit(z), rtol=0, atol=1e-6)


def test_the_identity_is_chosen_when_every_method_worsens_the_held_out_nll():
    z, y = overconfident(45, 3, seed=4, factor=1.0)  # calibrated logits, few samples
    candidates = [VectorScaling(), MatrixScaling(reg_lambda=0.0, reg_mu=0.0)]
    choice = select_calibrator(candidates, z, y, folds=3)
    identity = plain_cv_nll(None, z, y, 3)
    for method in ("vector", "matrix"):
        assert choice.scores[method] > identity  # each overfits the calibrated logits
    assert choice.method == "none"
    torch.testing.assert_close(choice.calibrator(z), torch.log_softmax(z, 1), rtol=0, atol=0)


def test_folds_do_not_depend_on_the_order_of_the_rows():
    z, y = overconfident(150, 3, seed=7)
    candidates = [TemperatureScaler(), VectorScaling(), EnsembleTemperatureScaling()]
    first = select_calibrator(candidates, z, y, folds=5)
    perm = torch.randperm(150, generator=torch.Generator().manual_seed(0))
    second = select_calibrator(candidates, z[perm], y[perm], folds=5)
    assert first.scores == second.scores  # exactly
    assert first.method == second.method
    for key, value in first.calibrator.params.items():
        assert torch.equal(second.calibrator.params[key], value)


def test_every_method_is_a_post_hoc_calibrator():
    for method in CALIBRATION_METHODS:
        assert isinstance(get_calibrator(method), PostHocCalibrator)
