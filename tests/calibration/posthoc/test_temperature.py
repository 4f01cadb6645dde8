"""Temperature scaling, as a function and as a post-hoc calibrator.

References are written here independently of the code under test: the NLL by a NumPy
log-sum-exp, per-bin ECE by an explicit loop over bin masks, a float64 grid minimiser of the
NLL over ``T`` (fine grid: the fit must lie within one grid step of the grid's best point),
scipy's bounded scalar minimiser for soft labels, and netcal's own class called directly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.warned import package_warns
from scipy.optimize import minimize_scalar

from lightning_losses.calibration.posthoc.temperature import TemperatureScaler, fit_temperature

IGNORE = -100


# ---------------------------------------------------------------- independent references


def reference_ece(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    """sum_k (n_k / N) |acc_k - conf_k| over bins (k/B, (k+1)/B] (0 in the first), by masks."""
    ece = 0.0
    for k in range(n_bins):
        mask = (confidence > k / n_bins) & (confidence <= (k + 1) / n_bins)
        if k == 0:
            mask |= confidence == 0
        if mask.any():
            gap = abs(correct[mask].mean() - confidence[mask].mean())
            ece += mask.sum() / len(confidence) * gap
    return float(ece)


def reference_nll(logits: np.ndarray, target: np.ndarray, temperature: float) -> float:
    """Mean NLL of softmax(z / T) (or sigmoid(z / T) for 1-D z) in NumPy float64."""
    z = logits / temperature
    if z.ndim == 1:  # -log sigmoid(s) = log(1 + exp(-s)) with s = +z for y = 1, -z for y = 0
        s = np.where(target == 1, z, -z)
        return float(np.mean(np.logaddexp(0.0, -s)))
    m = z.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
    return float(np.mean(lse - z[np.arange(len(z)), target]))


def reference_log_softmax(z: np.ndarray) -> np.ndarray:
    """The log-softmax over the last axis in NumPy float64."""
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def grid_temperature(z: np.ndarray, y: np.ndarray, step: float) -> tuple[float, float]:
    """The grid point of least NLL: a 1e-2 grid over [0.2, 10], then ``step`` around its best.

    The NLL is convex in 1 / T, so unimodal in T: its grid minimiser is one of the two grid
    points that bracket the true minimiser, within ``step`` of it.
    """
    coarse = np.arange(0.2, 10.0, 1e-2)
    best = coarse[np.argmin([reference_nll(z, y, t) for t in coarse])]
    assert 0.2 < best < 10.0 - 1e-2  # an interior minimum
    fine = best + step * np.arange(-2000, 2001)
    nll = np.array([reference_nll(z, y, t) for t in fine])
    assert 0 < nll.argmin() < len(fine) - 1
    return float(fine[nll.argmin()]), float(nll.min())


def overconfident_logits(n: int, n_classes: int, factor: float, seed: int):
    """True logits z of a softmax model, labels drawn from softmax(z), presented as factor * z."""
    g = torch.Generator().manual_seed(seed)
    weights = 0.45 * torch.randn(n_classes, 4, generator=g, dtype=torch.float64)
    z = torch.randn(n, 4, generator=g, dtype=torch.float64) @ weights.T
    target = torch.multinomial(z.softmax(dim=1), 1, generator=g).squeeze(1)
    return factor * z, target


def sometimes_right(n: int = 300, classes: int = 5, seed: int = 0):
    """Logits whose argmax is right 60% of the time, scaled up: T* > 1."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, classes, (n,), generator=gen)
    logits = torch.randn(n, classes, generator=gen)
    hit = torch.rand(n, generator=gen) < 0.6
    logits[hit, target[hit]] += 2.0
    return logits * 3, target


def soft_labels(target: torch.Tensor, classes: int, seed: int = 1) -> torch.Tensor:
    """Annotator-like soft labels: most mass on the label, the rest spread at random."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.rand(target.shape[0], classes, generator=gen, dtype=torch.float64)
    q = 0.3 * noise / noise.sum(dim=1, keepdim=True)
    return q + 0.7 * F.one_hot(target, classes).double()


def plain_soft_nll(logits: torch.Tensor, q: torch.Tensor, t: float) -> float:
    """-(1/N) sum_i sum_c q_ic log softmax(z_i / T)_c in float64, term by term."""
    z = logits.double()
    total = 0.0
    for i in range(z.shape[0]):
        row = z[i] / t
        log_norm = math.log(sum(math.exp(float(v - row.max())) for v in row)) + float(row.max())
        total -= sum(float(q[i, c]) * (float(row[c]) - log_norm) for c in range(z.shape[1]))
    return total / z.shape[0]


# ------------------------------------------------------------------- the fit: references


@pytest.fixture(scope="module")
def overconfident():
    logits, target = overconfident_logits(20000, 10, 3.0, seed=6)
    # netcal takes log(p) clipped at float64 eps; with no probability below eps its input is
    # exactly these logits up to a per-row shift, so both fits see the same problem.
    assert logits.log_softmax(dim=1).min() > math.log(np.finfo(np.float64).eps)
    return logits, target, TemperatureScaler().fit(logits, target)


def test_temperature_equals_the_float64_grid_minimiser():
    # Grid step 1e-5: the grid's best point brackets the minimiser, so the fit lies within one
    # step of it (plus 1e-9 for the fit's own convergence), and no grid point is better.
    step = 1e-5
    logits, target = overconfident_logits(3000, 5, 2.5, seed=11)
    z, y = logits.numpy(), target.numpy()
    best, best_nll = grid_temperature(z, y, step)
    scaler = TemperatureScaler().fit(logits.float(), target)
    assert scaler.temperature == pytest.approx(best, abs=step + 1e-9)
    assert reference_nll(z, y, scaler.temperature) <= best_nll + 1e-12
    assert scaler.temperature == fit_temperature(logits.float(), target)
    assert scaler.fallback == ""
    assert scaler.num_classes == 5


def test_temperature_recovers_the_overconfidence_factor(overconfident):
    logits, target, scaler = overconfident
    assert scaler.temperature == pytest.approx(3.0, rel=0.03)
    assert scaler.temperature == fit_temperature(logits, target)

    report = scaler.report(logits, target, n_bins=15)
    assert report["temperature"] == scaler.temperature
    assert report["ece_after"] < 0.3 * report["ece_before"]
    assert report["nll_after"] < report["nll_before"]

    z, y = logits.numpy(), target.numpy()
    assert report["nll_before"] == pytest.approx(reference_nll(z, y, 1.0), rel=1e-12)
    assert report["nll_after"] == pytest.approx(reference_nll(z, y, scaler.temperature), rel=1e-12)
    for key, t in (("ece_before", 1.0), ("ece_after", scaler.temperature)):
        probs = torch.softmax(logits / t, dim=1).numpy()
        correct = (probs.argmax(axis=1) == y).astype(np.float64)
        assert report[key] == pytest.approx(reference_ece(probs.max(axis=1), correct, 15), rel=1e-9)


def test_fitted_temperature_is_a_minimum_of_the_nll(overconfident):
    logits, target, scaler = overconfident
    z, y, t = logits.numpy(), target.numpy(), scaler.temperature
    best = reference_nll(z, y, t)
    assert best < reference_nll(z, y, t * 1.05)
    assert best < reference_nll(z, y, t / 1.05)
    assert best <= reference_nll(z, y, t * (1 + 1e-4))
    assert best <= reference_nll(z, y, t / (1 + 1e-4))


def test_temperature_matches_netcal(overconfident):
    from netcal.scaling import TemperatureScaling

    logits, target, scaler = overconfident
    netcal_ts = TemperatureScaling(method="mle")
    netcal_ts.fit(logits.softmax(dim=1).numpy(), target.numpy())
    # netcal's "temperature" is the weight w of softmax(w * log p), i.e. 1 / T; its own
    # optimiser stops earlier than ours, hence 1e-3.
    netcal_temperature = 1.0 / float(netcal_ts.temperature[0])
    assert netcal_temperature == pytest.approx(scaler.temperature, rel=1e-3)


def test_binary_temperature_matches_grid_search():
    from netcal.scaling import TemperatureScaling

    g = torch.Generator().manual_seed(7)
    true_logit = 1.5 * torch.randn(5000, generator=g, dtype=torch.float64)
    target = torch.bernoulli(torch.sigmoid(true_logit), generator=g)
    logits = 2.5 * true_logit
    t = fit_temperature(logits, target)

    z, y = logits.numpy(), target.numpy()
    grid = np.arange(1.0, 5.0, 1e-3)
    nll = np.array([reference_nll(z, y, s) for s in grid])
    best = grid[nll.argmin()]
    assert best > 1.0
    assert best < 5.0 - 1e-3  # an interior minimum
    assert t == pytest.approx(grid[nll.argmin()], abs=1.5e-3)
    assert reference_nll(z, y, t) <= nll.min() + 1e-12
    assert t == pytest.approx(2.5, rel=0.08)

    netcal_ts = TemperatureScaling(method="mle").fit(torch.sigmoid(logits).numpy(), y)
    netcal_temperature = 1.0 / float(netcal_ts.temperature[0])
    assert netcal_temperature == pytest.approx(t, rel=1e-3)

    # float 0/1 and integer targets of [N] logits fit the same T in the calibrator
    assert TemperatureScaler().fit(logits, target).temperature == t
    report = TemperatureScaler().fit(logits.float(), target.long()).report(logits, target)
    assert report["temperature"] == pytest.approx(t, rel=1e-6)
    assert report["nll_after"] < report["nll_before"]
    assert report["ece_after"] < report["ece_before"]


# ---------------------------------------------------------------- soft labels, ignore_index


def test_one_hot_soft_labels_give_the_integer_label_temperature():
    logits, target = sometimes_right()
    hard = fit_temperature(logits, target)
    for dtype in (torch.float32, torch.float64):
        one_hot = F.one_hot(target, 5).to(dtype)
        assert fit_temperature(logits, one_hot) == pytest.approx(hard, rel=1e-7)
        assert TemperatureScaler().fit(logits, one_hot).temperature == pytest.approx(hard, rel=1e-7)
    assert hard > 1.0


def test_soft_label_temperature_minimises_the_soft_nll():
    logits, target = sometimes_right(n=120)
    q = soft_labels(target, 5)
    fitted = fit_temperature(logits, q)
    best = minimize_scalar(
        lambda log_t: plain_soft_nll(logits, q, math.exp(log_t)),
        bounds=(-3.0, 3.0),
        method="bounded",
        options={"xatol": 1e-9},
    )
    assert fitted == pytest.approx(math.exp(best.x), rel=1e-5)
    # and it is not the hard-label temperature: the soft labels change the optimum
    assert abs(fitted - fit_temperature(logits, target)) > 1e-2
    scaler = TemperatureScaler().fit(logits, q)
    assert scaler.temperature == fitted
    assert scaler.num_classes == 5
    assert scaler.fallback == ""
    report = scaler.report(logits, q, n_bins=10)
    assert report["nll_after"] == pytest.approx(plain_soft_nll(logits, q, fitted), abs=1e-10)
    assert report["nll_before"] == pytest.approx(plain_soft_nll(logits, q, 1.0), abs=1e-10)


def test_soft_label_report_ece_uses_the_label_mass_of_the_predicted_class():
    logits, target = sometimes_right(n=200)
    q = soft_labels(target, 5)
    scaler = TemperatureScaler(temperature=1.7)
    report = scaler.report(logits, q, n_bins=10)
    for key, t in (("ece_before", 1.0), ("ece_after", 1.7)):
        probs = torch.softmax(logits.double() / t, dim=1)
        confidence, predicted = probs.max(dim=1)
        correct = q[torch.arange(200), predicted]  # chance the prediction is right under q
        ece = 0.0
        for k in range(10):
            members = (confidence > k / 10) & (confidence <= (k + 1) / 10)
            ece += abs(float(confidence[members].sum() - correct[members].sum()))
        assert report[key] == pytest.approx(ece / 200, abs=1e-12)
    # one-hot soft labels report exactly what integer labels report
    assert scaler.report(logits, F.one_hot(target, 5).double()) == pytest.approx(
        scaler.report(logits, target), abs=1e-12
    )


@pytest.mark.parametrize("binary", [False, True])
def test_ignore_index_equals_the_fit_on_masked_rows(binary):
    logits, target = sometimes_right()
    if binary:
        logits, target = logits[:, 0] - logits[:, 1], (target == 0).long()
    padded = target.clone()
    padded[::7] = IGNORE
    keep = padded != IGNORE
    masked = fit_temperature(logits[keep], target[keep])
    assert fit_temperature(logits, padded, ignore_index=IGNORE) == pytest.approx(masked, abs=1e-12)
    assert masked != pytest.approx(fit_temperature(logits, target), abs=1e-6)
    scaler = TemperatureScaler().fit(logits, padded, ignore_index=IGNORE)
    assert scaler.temperature == pytest.approx(masked, abs=1e-12)
    report = scaler.report(logits, padded, ignore_index=IGNORE)
    assert report == pytest.approx(scaler.report(logits[keep], target[keep]), abs=1e-12)


@pytest.mark.parametrize(
    ("target", "options", "error", "match"),
    [
        (torch.full((6, 3), 1 / 3), {"ignore_index": IGNORE}, ValueError, "ignore_index applies"),
        (torch.full((6, 4), 1 / 4), {}, ValueError, "target of soft labels must be"),
        (torch.full((6, 3), 0.3), {}, ValueError, "target must hold probabilities that sum"),
        (torch.tensor([[1.5, -0.5, 0.0]]).repeat(6, 1), {}, ValueError, "target soft labels"),
        (torch.ones(6, 3, dtype=torch.long), {}, TypeError, "target"),
        (torch.zeros(6, dtype=torch.long), {"ignore_index": 1.5}, TypeError, "ignore_index"),
        (torch.zeros(6, dtype=torch.long), {"ignore_index": True}, TypeError, "ignore_index"),
        (torch.full((6,), IGNORE), {"ignore_index": IGNORE}, ValueError, "not ignored"),
        (torch.full((6,), 3), {"ignore_index": IGNORE}, ValueError, "ignore_index=-100"),
    ],
)
def test_bad_soft_labels_and_ignore_index_are_named(target, options, error, match):
    logits = torch.randn(6, 3)
    with pytest.raises(error, match=match):
        fit_temperature(logits, target, **options)
    with pytest.raises(error, match=match):
        TemperatureScaler().report(logits, target, **options)
    with pytest.raises(error, match=match if target.ndim == 2 else "ignore_index|samples"):
        TemperatureScaler().fit(logits, target, **options)


@pytest.mark.parametrize(
    ("logits", "target", "error", "match"),
    [
        (torch.zeros(4, 3, 2), torch.zeros(4, dtype=torch.long), ValueError, r"\[N, C\]"),
        (torch.zeros(4, 1), torch.zeros(4, dtype=torch.long), ValueError, "C >= 2"),
        (torch.zeros(4, 3), torch.zeros(5, dtype=torch.long), ValueError, "target must be"),
        (torch.zeros(4, 3), torch.full((4,), 3), ValueError, "labels"),
        (torch.zeros(4, 3), torch.zeros(4), TypeError, "integer class labels"),
        (torch.zeros(4), torch.tensor([0, 1, 2, 1]), ValueError, "0 and 1"),
        (torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), ValueError, "at least one"),
        (torch.tensor([[math.inf, 0.0]]), torch.tensor([0]), ValueError, "non-finite"),
        (torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, dtype=torch.long), TypeError, "float"),
    ],
)
def test_fit_temperature_rejects_bad_inputs(logits, target, error, match):
    with pytest.raises(error, match=f"fit_temperature: .*{match}"):
        fit_temperature(logits, target)
    with pytest.raises(error, match="TemperatureScaler"):  # the calibrator names itself
        TemperatureScaler().fit(logits, target)


def test_report_bins_are_right_closed():
    # Top-label confidences 0.5 (exactly, from a zero binary logit) and 1.0 with n_bins = 2:
    # 0.5 belongs to (0, 0.5], so ECE = (|0.5 - 1| + |2 - 1|) / 3; a [0.5, 1) bin would give 1/6.
    logits = torch.tensor([0.0, 40.0, 40.0], dtype=torch.float64)
    target = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    report = TemperatureScaler().report(logits, target, n_bins=2)
    assert report["ece_before"] == pytest.approx(0.5, abs=1e-12)
    assert report["ece_after"] == report["ece_before"]
    with pytest.raises(ValueError, match="n_bins"):
        TemperatureScaler().report(logits, target, n_bins=0)


# ------------------------------------------------------------------------- the module


def test_forward_returns_log_softmax_of_the_scaled_logits():
    scaler = TemperatureScaler(temperature=2.0)
    x = torch.tensor([[4.0, -2.0, 1.0]], dtype=torch.float16, requires_grad=True)
    out = scaler(x)
    assert out.dtype == torch.float16
    want = reference_log_softmax(np.array([[4.0, -2.0, 1.0]]) / 2.0)
    np.testing.assert_allclose(out.detach().double().numpy(), want, atol=2e-3)  # float16 output
    # d log p_0 / d x_j = (1[j = 0] - p_j) / T
    out[0, 0].backward()
    p = np.exp(want[0])
    np.testing.assert_allclose(x.grad.double().numpy()[0], (np.eye(3)[0] - p) / 2.0, atol=2e-3)

    z = torch.randn(50, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    scaler.temperature = 1.3
    want = reference_log_softmax(z.numpy() / 1.3)
    np.testing.assert_allclose(scaler(z).numpy(), want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(scaler(z.float()).double().numpy(), want, atol=1e-5)
    # binary [N] logits: the two-class logits [0, z], i.e. log(1 - sigmoid), log sigmoid
    b = z[:, 0]
    binary = scaler(b)
    assert binary.shape == (50, 2)
    s = b.numpy() / 1.3
    np.testing.assert_allclose(
        binary.numpy(), np.stack([-np.logaddexp(0, s), -np.logaddexp(0, -s)], 1), atol=1e-12
    )
    # T = 1 (the default, before fit) is the identity: log_softmax
    np.testing.assert_allclose(TemperatureScaler()(z).numpy(), reference_log_softmax(z.numpy()))


def test_state_dict_round_trip_and_old_states():
    logits, target = overconfident_logits(400, 4, 2.0, seed=3)
    fitted = TemperatureScaler(max_iter=50).fit(logits, target)
    state = fitted.state_dict()
    assert set(state) == {"temperature_buffer", "_extra_state"}
    restored = TemperatureScaler()
    restored.load_state_dict(state)
    assert restored.temperature == fitted.temperature
    assert restored.num_classes == 4
    assert restored.fitted
    torch.testing.assert_close(restored(logits), fitted(logits), rtol=0, atol=0)
    # a state saved before the post-hoc interface holds the buffer only
    old = TemperatureScaler()
    old.load_state_dict({"temperature_buffer": torch.tensor(2.5, dtype=torch.float64)})
    assert old.temperature == 2.5
    assert not old.fitted


def test_constructor_and_fit_contract():
    with pytest.raises(TypeError):
        TemperatureScaler(2.0)  # type: ignore[misc]  # keyword-only
    with pytest.raises(ValueError, match="positive"):
        TemperatureScaler(temperature=0.0)
    with pytest.raises(ValueError, match="max_iter"):
        TemperatureScaler(max_iter=0)
    assert TemperatureScaler().temperature == 1.0
    assert TemperatureScaler.method == "temperature"
    fitted = TemperatureScaler()
    z = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    assert fitted.fit(z, torch.tensor([0, 1, 1])) is fitted
    assert fitted.temperature != 1.0
    assert "temperature=" in repr(fitted)


def test_a_single_class_falls_back_to_the_identity():
    scaler = TemperatureScaler(temperature=3.0)
    z = torch.tensor([[2.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    with package_warns(r"TemperatureScaler \(temperature\) falls back to the identity: every "):
        scaler.fit(z, torch.tensor([0, 0, 0]))
    assert scaler.temperature == 1.0
    assert "one class" in scaler.fallback
    assert "fell back" in repr(scaler)
    np.testing.assert_allclose(scaler(z).numpy(), reference_log_softmax(z.double().numpy()), 1e-6)
