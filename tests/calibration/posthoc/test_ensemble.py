"""Ensemble temperature scaling against a float64 grid minimiser written here.

The reference fits as the module states: ``T`` on a 1-D grid of the temperature-scaling NLL
(step 1e-5 around the best point of a 1e-2 grid), then the weights on a grid of the simplex
(step 1e-4 around the best point of a 1e-2 grid) with that ``T`` fixed. Tolerances from the
grid steps: the NLL is unimodal in ``T``, so the fitted ``T`` lies within one step (1e-5) of
the grid's best; the weights' NLL is convex on the simplex, and on these well-conditioned
problems the grid's best point lies within 3 steps (3e-4) of the fitted weights (the ``T``
difference of 1e-5 moves the weights far less), while no grid point has a lower NLL than the
fit (up to 1e-12).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.warned import package_warns

from lightning_losses.calibration.posthoc.ensemble import (
    EnsembleTemperatureScaling,
    simplex_mixture_weights,
)

T_STEP = 1e-5
W_STEP = 1e-4


def noisy(n: int, classes: int, seed: int, factor: float, noise: float):
    """Logits of a softmax model scaled by ``factor``; a share ``noise`` of labels at random."""
    g = torch.Generator().manual_seed(seed)
    w = 0.6 * torch.randn(classes, 4, generator=g, dtype=torch.float64)
    z = torch.randn(n, 4, generator=g, dtype=torch.float64) @ w.T
    y = torch.multinomial(z.softmax(1), 1, generator=g)[:, 0]
    flip = torch.rand(n, generator=g) < noise
    y[flip] = torch.randint(0, classes, (int(flip.sum()),), generator=g)
    return factor * z, y


def softmax_np(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def nll_of_temperature(z: np.ndarray, y: np.ndarray, t: float) -> float:
    return float(-np.log(softmax_np(z / t)[np.arange(len(y)), y]).mean())


def grid_temperature(z: np.ndarray, y: np.ndarray) -> float:
    coarse = np.arange(0.2, 20.0, 1e-2)
    best = coarse[np.argmin([nll_of_temperature(z, y, t) for t in coarse])]
    fine = best + T_STEP * np.arange(-2000, 2001)
    nll = [nll_of_temperature(z, y, t) for t in fine]
    assert 0 < np.argmin(nll) < len(fine) - 1
    return float(fine[np.argmin(nll)])


def mixture_nll(likelihoods: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """-mean_i log(P_i w) for each row w of ``weights`` [M, 3], in chunks."""
    out = []
    for start in range(0, len(weights), 4096):
        mixture = likelihoods @ weights[start : start + 4096].T
        with np.errstate(divide="ignore"):
            out.append(-np.log(mixture).mean(axis=0))
    return np.concatenate(out)


def simplex_grid(centre: np.ndarray | None, step: float, half_width: int) -> np.ndarray:
    """Points (w1, w2, 1 - w1 - w2) of the simplex on a grid of ``step``."""
    if centre is None:
        axis = np.arange(0, round(1 / step) + 1) * step
        u, v = np.meshgrid(axis, axis, indexing="ij")
    else:
        offsets = step * np.arange(-half_width, half_width + 1)
        u, v = np.meshgrid(centre[0] + offsets, centre[1] + offsets, indexing="ij")
    u, v = u.ravel(), v.ravel()
    keep = (u >= -1e-12) & (v >= -1e-12) & (u + v <= 1 + 1e-12)
    u, v = np.clip(u[keep], 0, 1), np.clip(v[keep], 0, 1)
    return np.stack([u, v, np.clip(1 - u - v, 0, 1)], axis=1)


def grid_weights(likelihoods: np.ndarray) -> tuple[np.ndarray, float]:
    coarse = simplex_grid(None, 1e-2, 0)
    best = coarse[np.argmin(mixture_nll(likelihoods, coarse))]
    fine = simplex_grid(best, W_STEP, 200)
    nll = mixture_nll(likelihoods, fine)
    return fine[np.argmin(nll)], float(nll.min())


def likelihoods_of(z: np.ndarray, y: np.ndarray, t: float) -> np.ndarray:
    rows = np.arange(len(y))
    return np.stack(
        [softmax_np(z / t)[rows, y], softmax_np(z)[rows, y], np.full(len(y), 1 / z.shape[1])], 1
    )


@pytest.mark.parametrize(
    ("factor", "noise", "face"),
    [(3.0, 0.2, "interior"), (0.7, 0.3, "edge w1 = 0")],
)
def test_ets_equals_the_float64_grid_minimiser(factor, noise, face):
    logits, target = noisy(500, 5, seed=0, factor=factor, noise=noise)
    z, y = logits.numpy(), target.numpy()
    t_grid = grid_temperature(z, y)
    w_grid, nll_grid = grid_weights(likelihoods_of(z, y, t_grid))

    ets = EnsembleTemperatureScaling().fit(logits, target)
    t, w = float(ets.params["temperature"]), ets.params["weights"].numpy()
    assert t == pytest.approx(t_grid, abs=T_STEP + 1e-9)
    np.testing.assert_allclose(w, w_grid, atol=3 * W_STEP)
    assert w.min() >= 0
    assert w.sum() == pytest.approx(1.0, abs=1e-15)
    assert (w[0] == 0) == (face == "edge w1 = 0")
    assert mixture_nll(likelihoods_of(z, y, t), w[None])[0] <= nll_grid + 1e-12

    # forward: log(w1 softmax(z / T) + w2 softmax(z) + w3 / C), computed plainly
    want = np.log(w[0] * softmax_np(z / t) + w[1] * softmax_np(z) + w[2] / z.shape[1])
    np.testing.assert_allclose(ets(logits).numpy(), want, rtol=0, atol=1e-12)
    out = ets(logits.float())
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.double().numpy(), want, atol=1e-5)


def test_forward_is_stable_for_extreme_logits_and_zero_weights():
    ets = EnsembleTemperatureScaling()
    ets.params = {
        "temperature": torch.tensor(2.0, dtype=torch.float64),
        "weights": torch.tensor([0.0, 0.9, 0.1], dtype=torch.float64),
        "num_classes": torch.tensor(3.0, dtype=torch.float64),
    }
    z = torch.tensor([[1000.0, -1000.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    out = ets(z)
    assert bool(torch.isfinite(out).all())
    # softmax(z) puts 1 on class 0 (and exactly 0 elsewhere, in float64): 0.9 + 0.1 / 3 there
    np.testing.assert_allclose(
        out[0].numpy(), np.log([0.9 + 0.1 / 3, 0.1 / 3, 0.1 / 3]), rtol=1e-12
    )
    np.testing.assert_allclose(out[1].numpy(), np.log([1 / 3] * 3), rtol=1e-12)
    z.requires_grad_(True)
    ets(z).sum().backward()
    assert bool(torch.isfinite(z.grad).all())


@pytest.mark.parametrize(
    "likelihoods",
    [
        [[0.9, 0.5, 0.25], [0.1, 0.5, 0.25]],  # a vertex: the second component alone
        [[0.9, 0.6, 0.5], [0.2, 0.3, 0.5], [0.7, 0.9, 0.5]],  # a mixture
        [[0.0, 0.5, 0.5], [0.8, 0.5, 0.5], [0.9, 0.6, 0.5]],  # a zero likelihood of the first
    ],
)
def test_simplex_weights_are_the_grid_minimiser(likelihoods):
    p = np.array(likelihoods, dtype=np.float64)
    w = simplex_mixture_weights(torch.from_numpy(p)).numpy()
    assert w.min() >= 0
    assert w.sum() == pytest.approx(1.0, abs=1e-15)
    w_grid, nll_grid = grid_weights(p)
    np.testing.assert_allclose(w, w_grid, atol=3 * W_STEP)
    assert mixture_nll(p, w[None])[0] <= nll_grid + 1e-12


def test_contract_and_fallback():
    assert EnsembleTemperatureScaling.method == "ensemble_temperature"
    assert EnsembleTemperatureScaling().min_samples(10) == 3
    with pytest.raises(TypeError):
        EnsembleTemperatureScaling(50)  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_iter"):
        EnsembleTemperatureScaling(max_iter=0)
    z = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    with package_warns(
        r"EnsembleTemperatureScaling \(ensemble_temperature\) falls back .* 2 samples"
    ):
        fitted = EnsembleTemperatureScaling().fit(z, torch.tensor([0, 1]))
    np.testing.assert_allclose(fitted(z).numpy(), torch.log_softmax(z.double(), 1), atol=1e-6)
    # binary [N] logits: two columns
    b = torch.linspace(-3, 3, 40, dtype=torch.float64)
    y = (torch.arange(40) % 3 == 0).long()
    # labels every third sample, whatever its logit: the logits do not predict them
    with package_warns(r"T=.* is above 1000: the validation labels carry no information"):
        assert EnsembleTemperatureScaling().fit(b, y)(b).shape == (40, 2)
