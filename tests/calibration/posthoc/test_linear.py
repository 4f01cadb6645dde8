"""Vector scaling, matrix scaling and Dirichlet calibration against dirichletcal and the objective.

References: dirichletcal 0.5.3 called directly (``FullDirichletCalibrator``, its
``MultinomialRegression`` on logits, ``MatrixScaling`` and ``VectorScaling``: Newton's method in
jax, so these few small calls are marked slow), and the ODIR objective written here in plain
torch float64, whose gradient must vanish at the fit.

Tolerances: dirichletcal stops at a summed absolute gradient of 1e-8 and our L-BFGS at a
largest gradient entry of 1e-10 or a relative change of 2.2e-16; on these problems (N = 300,
C = 4) the two minimisers differ by about 1e-7 in parameters and 3e-8 in probabilities
(measured), so probabilities are compared at 1e-6 and parameters at 1e-5 (an objective gap g
moves a parameter along the flattest direction, curvature 2 λ / (C (C - 1)) = 1.7e-3 for
λ = 0.01, by at most about 1e-8 / 1.7e-3 = 6e-6). Our objective is never above theirs by more
than 1e-12.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers.warned import package_warns

from lightning_losses.calibration.posthoc.linear import (
    DirichletCalibration,
    MatrixScaling,
    VectorScaling,
    minimise_lbfgs,
)

C = 4
PROBS = 1e-6
PARAMS = 1e-5


def miscalibrated(n: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels from a softmax model of rank 6; its logits scaled by 2.5, plus noise per class."""
    g = torch.Generator().manual_seed(seed)
    w = 0.8 * torch.randn(classes, 6, generator=g, dtype=torch.float64)
    z = torch.randn(n, 6, generator=g, dtype=torch.float64) @ w.T
    y = torch.multinomial(z.softmax(1), 1, generator=g)[:, 0]
    return 2.5 * z + 0.3 * torch.randn(n, classes, generator=g, dtype=torch.float64), y


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    z, y = miscalibrated(300, C, seed=0)
    assert torch.bincount(y, minlength=C).min() > 20  # dirichletcal needs every class present
    return z, y


def odir_objective(weight, bias, x, y, reg_lambda: float, reg_mu: float) -> torch.Tensor:
    """Mean NLL of softmax(x W^T + b) + λ/(C(C-1)) sum_{i!=j} W_ij^2 + μ/C sum_j b_j^2, plainly."""
    logits = x @ weight.T + bias
    nll = (torch.logsumexp(logits, dim=1) - logits[torch.arange(len(y)), y]).mean()
    classes = weight.shape[0]
    off = sum(weight[i, j] ** 2 for i in range(classes) for j in range(classes) if i != j) / (
        classes * (classes - 1)
    )
    return nll + reg_lambda * off + reg_mu * (bias**2).sum() / classes


def log_softmax_np(v: np.ndarray) -> np.ndarray:
    m = v.max(axis=1, keepdims=True)
    return v - m - np.log(np.exp(v - m).sum(axis=1, keepdims=True))


# ------------------------------------------------------------------ dirichletcal (slow: jax)


@pytest.mark.slow
def test_dirichlet_equals_dirichletcal_full_dirichlet_with_odir(data):
    from dirichletcal.calib.fulldirichlet import FullDirichletCalibrator

    z, y = data
    ours = DirichletCalibration().fit(z, y)  # the defaults: λ = μ = 0.01
    assert (ours.reg_lambda, ours.reg_mu) == (1e-2, 1e-2)
    probs = z.softmax(dim=1).numpy()
    ref = FullDirichletCalibrator(reg_lambda=1e-2, reg_mu=1e-2, reg_norm=True, ref_row=False)
    ref.fit(probs, y.numpy())
    weights = np.asarray(ref.weights)
    np.testing.assert_allclose(ours.probabilities(z).numpy(), ref.predict_proba(probs), atol=PROBS)
    np.testing.assert_allclose(ours.params["weight"].numpy(), weights[:, :-1], atol=PARAMS)
    np.testing.assert_allclose(ours.params["bias"].numpy(), weights[:, -1], atol=PARAMS)
    x = z.log_softmax(dim=1)
    theirs = odir_objective(
        torch.tensor(weights[:, :-1]), torch.tensor(weights[:, -1]), x, y, 1e-2, 1e-2
    )
    mine = odir_objective(ours.params["weight"], ours.params["bias"], x, y, 1e-2, 1e-2)
    assert float(mine) <= float(theirs) + 1e-12


@pytest.mark.slow
def test_matrix_scaling_equals_dirichletcal_on_logits(data):
    from dirichletcal.calib.matrixscaling import MatrixScaling as ReferenceMatrixScaling
    from dirichletcal.calib.multinomial import MultinomialRegression

    z, y = data
    # ODIR: dirichletcal's engine on the logits, with the paper's normalisation
    ours = MatrixScaling(reg_lambda=1.0, reg_mu=0.5).fit(z, y)
    ref = MultinomialRegression(
        method="Full", reg_lambda=1.0, reg_mu=0.5, reg_norm=True, ref_row=False
    ).fit(z.numpy(), y.numpy())
    weights = np.asarray(ref.weights_)
    np.testing.assert_allclose(
        ours.probabilities(z).numpy(), np.asarray(ref.predict_proba(z.numpy())), atol=PROBS
    )
    np.testing.assert_allclose(ours.params["weight"].numpy(), weights[:, :-1], atol=PARAMS)
    np.testing.assert_allclose(ours.params["bias"].numpy(), weights[:, -1], atol=PARAMS)

    # no penalty: dirichletcal's MatrixScaling on logits, whose rows are relative to the last
    plain = MatrixScaling(reg_lambda=0.0, reg_mu=0.0).fit(z, y)
    ref_plain = ReferenceMatrixScaling(logit_input=True).fit(z.numpy(), y.numpy())
    np.testing.assert_allclose(
        plain.probabilities(z).numpy(), ref_plain.predict_proba(z.numpy()), atol=PROBS
    )
    relative = torch.cat([plain.params["weight"], plain.params["bias"][:, None]], dim=1)
    relative = relative - relative[-1]
    np.testing.assert_allclose(relative.numpy(), np.asarray(ref_plain.weights_), atol=PARAMS)


@pytest.mark.slow
def test_vector_scaling_equals_dirichletcal(data):
    from dirichletcal.calib.vectorscaling import VectorScaling as ReferenceVectorScaling

    z, y = data
    ours = VectorScaling().fit(z, y)
    ref = ReferenceVectorScaling(logit_input=True).fit(z.numpy(), y.numpy())
    np.testing.assert_allclose(
        ours.probabilities(z).numpy(), ref.predict_proba(z.numpy()), atol=PROBS
    )
    # dirichletcal's weights are relative to the last class: row i is w_i at column i, -w_C at
    # column C and b_i - b_C as intercept
    weights = np.asarray(ref.weights_)
    w, b = ours.params["weight"].numpy(), ours.params["bias"].numpy()
    np.testing.assert_allclose(w[:-1], np.diag(weights[:-1, :-2]), atol=PARAMS)
    np.testing.assert_allclose(w[-1], -weights[0, -2], atol=PARAMS)
    np.testing.assert_allclose(b[:-1] - b[-1], weights[:-1, -1], atol=PARAMS)
    assert abs(b.sum()) < 1e-12  # the fit keeps the free common shift of b at 0


# ------------------------------------------------------------------- the objective (fast)


@pytest.mark.parametrize(
    ("cls", "features"), [(MatrixScaling, "logits"), (DirichletCalibration, "log_probs")]
)
def test_full_maps_minimise_the_stated_odir_objective(data, cls, features):
    z, y = data
    x = z if features == "logits" else z.log_softmax(dim=1)
    fitted = cls(reg_lambda=0.3, reg_mu=0.2).fit(z, y)
    weight = fitted.params["weight"].clone().requires_grad_(True)
    bias = fitted.params["bias"].clone().requires_grad_(True)
    grads = torch.autograd.grad(odir_objective(weight, bias, x, y, 0.3, 0.2), (weight, bias))
    assert max(float(g.abs().max()) for g in grads) < 1e-7  # stationary: the minimiser
    # the penalties are normalised as stated: undivided ones are not stationary there
    undivided = odir_objective(weight, bias, x, y, 0.3 * C * (C - 1), 0.2 * C)
    grads = torch.autograd.grad(undivided, (weight, bias))
    assert max(float(g.abs().max()) for g in grads) > 1e-3
    # and forward is log_softmax(W x + b) with the fitted parameters, in NumPy
    want = log_softmax_np(
        x.numpy() @ fitted.params["weight"].numpy().T + fitted.params["bias"].numpy()
    )
    np.testing.assert_allclose(fitted(z).numpy(), want, rtol=0, atol=1e-12)


def test_vector_scaling_is_stationary_and_forward_is_its_formula(data):
    z, y = data
    fitted = VectorScaling().fit(z, y)
    w = fitted.params["weight"].clone().requires_grad_(True)
    b = fitted.params["bias"].clone().requires_grad_(True)
    logits = z * w + b
    nll = (torch.logsumexp(logits, 1) - logits[torch.arange(len(y)), y]).mean()
    assert max(float(g.abs().max()) for g in torch.autograd.grad(nll, (w, b))) < 1e-7
    want = log_softmax_np(z.numpy() * w.detach().numpy() + b.detach().numpy())
    np.testing.assert_allclose(fitted(z).numpy(), want, rtol=0, atol=1e-12)
    out = fitted(z.float())
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.double().numpy(), want, atol=1e-5)


def test_strong_penalties_shrink_to_a_diagonal_map_without_intercept(data):
    z, y = data
    strong = MatrixScaling(reg_lambda=1e6, reg_mu=1e6).fit(z, y)
    weight = strong.params["weight"]
    assert float((weight - torch.diag(torch.diagonal(weight))).abs().max()) < 1e-4
    assert float(strong.params["bias"].abs().max()) < 1e-4
    assert float(torch.diagonal(weight).min()) > 0.1  # the diagonal is not penalised


def test_binary_logits_give_two_columns():
    g = torch.Generator().manual_seed(3)
    z = 3 * torch.randn(200, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(z / 3), generator=g).long()
    for cls in (VectorScaling, MatrixScaling, DirichletCalibration):
        fitted = cls().fit(z, y)
        out = fitted(z)
        assert out.shape == (200, 2)
        np.testing.assert_allclose(out.exp().sum(dim=1).numpy(), 1.0, atol=1e-12)
        assert fitted.num_classes == 2


@pytest.mark.parametrize(
    ("cls", "need"),
    [(VectorScaling, 2 * C), (MatrixScaling, C * C + C), (DirichletCalibration, C * C + C)],
)
def test_too_few_samples_fall_back_to_the_identity(data, cls, need):
    z, y = data
    assert cls().min_samples(C) == need
    few_z, few_y = z[: need - 1], y[: need - 1]
    assert len(torch.unique(few_y)) > 1
    with package_warns(
        rf"{cls.__name__} \({cls.method}\) falls back to the identity: {need - 1} samples"
    ):
        fitted = cls().fit(few_z, few_y)
    assert f"fewer than the {need}" in fitted.fallback
    np.testing.assert_allclose(fitted(z).numpy(), log_softmax_np(z.numpy()), atol=1e-12)
    assert cls().fit(z[:need], y[:need]).fallback == ""


def test_hyper_parameters_are_keyword_only_and_checked():
    with pytest.raises(TypeError):
        MatrixScaling(0.1, 0.1)  # type: ignore[misc]
    with pytest.raises(ValueError, match="reg_lambda"):
        DirichletCalibration(reg_lambda=-1.0)
    with pytest.raises(ValueError, match="reg_mu"):
        MatrixScaling(reg_mu=float("nan"))
    with pytest.raises(ValueError, match="max_iter"):
        VectorScaling(max_iter=0)
    assert "reg_lambda=0.01, reg_mu=0.01, not fitted" in repr(DirichletCalibration())
    assert (VectorScaling.method, MatrixScaling.method, DirichletCalibration.method) == (
        "vector",
        "matrix",
        "dirichlet",
    )


def test_minimise_lbfgs_reaches_float64_precision():
    # Rosenbrock's valley, a classic of slow convergence: minimum at (1, 1)
    def rosenbrock(t: torch.Tensor) -> torch.Tensor:
        return (1 - t[0]) ** 2 + 100 * (t[1] - t[0] ** 2) ** 2

    x = minimise_lbfgs(rosenbrock, torch.tensor([-1.2, 1.0], dtype=torch.float64), max_iter=500)
    np.testing.assert_allclose(x.numpy(), [1.0, 1.0], atol=1e-7)
    with pytest.raises(RuntimeError, match="diverged"):
        minimise_lbfgs(lambda t: t.sum() * math.nan, torch.ones(1, dtype=torch.float64), max_iter=5)


@pytest.mark.parametrize("cls", [VectorScaling, MatrixScaling, DirichletCalibration])
def test_the_fit_objective_gives_its_central_difference_gradient(data, cls, monkeypatch):
    # The fit's objective returns its own gradient (no autograd): it must be the derivative of
    # the value it returns, by central differences in float64, at points away from the start.
    import lightning_losses.calibration.posthoc.linear as linear

    seen = []

    def recording(objective, start, *, max_iter, returns_gradient=False):
        seen.append((objective, start, returns_gradient))
        return minimise_lbfgs(objective, start, max_iter=max_iter, returns_gradient=True)

    monkeypatch.setattr(linear, "minimise_lbfgs", recording)
    logits, target = data
    cls().fit(logits, target)
    ((objective, start, returns_gradient),) = seen
    assert returns_gradient
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        theta = start + 0.3 * torch.randn(start.shape, generator=generator, dtype=torch.float64)
        _, gradient = objective(theta)
        step = 1e-6
        numeric = torch.empty_like(theta)
        for k in range(theta.numel()):
            e = torch.zeros_like(theta)
            e[k] = step
            numeric[k] = (objective(theta + e)[0] - objective(theta - e)[0]) / (2 * step)
        np.testing.assert_allclose(gradient.numpy(), numeric.numpy(), rtol=1e-6, atol=1e-8)
