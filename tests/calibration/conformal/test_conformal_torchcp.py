"""Scores, thresholds and sets equal TorchCP 1.2's on the same probabilities and draws.

TorchCP is loaded from its files (tests/helpers/torchcp.py). Inputs are float32 (TorchCP's
RAPS penalty is a float32 tensor whatever the input's dtype). Deterministic scores are compared
exactly; randomised ones with the same uniform draws: TorchCP draws from torch's global
generator, so ``torch.manual_seed(s)`` before its call and a generator seeded with ``s`` for
ours give the same ``U``.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from helpers import torchcp

from lightning_losses.calibration.conformal import (
    all_label_scores,
    conformal_scores,
    conformal_threshold,
    prediction_sets,
)

if not torchcp.available():
    pytest.skip("TorchCP is not installed (a test reference)", allow_module_level=True)

TCP = torchcp.load()
K_REG, LAM, WEIGHT = 2, 0.05, 0.3
OPTIONS = {"k_reg": K_REG, "lam": LAM, "weight": WEIGHT}


def reference(method: str, randomized: bool):
    """TorchCP's score object for ``method``, inputs already probabilities."""
    return {
        "lac": lambda: TCP.lac.LAC(score_type="identity"),
        "aps": lambda: TCP.aps.APS(score_type="identity", randomized=randomized),
        "raps": lambda: TCP.raps.RAPS(
            score_type="identity", randomized=randomized, penalty=LAM, kreg=K_REG
        ),
        "saps": lambda: TCP.saps.SAPS(score_type="identity", randomized=randomized, weight=WEIGHT),
        "top_k": lambda: TCP.topk.TOPK(score_type="identity", randomized=randomized),
    }[method]()


def data(n: int = 300, c: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    probs = (3 * torch.randn(n, c, generator=g)).softmax(1)
    return probs, torch.multinomial(probs, 1, generator=g)[:, 0]


METHODS = ["lac", "aps", "raps", "saps", "top_k"]


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_scores_thresholds_and_sets_equal_torchcp(method: str) -> None:
    probs, target = data()
    cal, test = slice(0, 200), slice(200, None)
    ref = reference(method, randomized=False)
    ours = conformal_scores(probs[cal], target[cal], method=method, randomized=False, **OPTIONS)
    if method == "saps":  # TorchCP's single-label SAPS is 0 at rank 0 (U p_max with U = 0),
        # its all-label form p_max, as the paper's: take the true label from the latter
        theirs = ref(probs[cal]).gather(1, target[cal, None])[:, 0]
    else:
        theirs = ref(probs[cal], target[cal])
    assert torch.equal(ours, theirs)
    for alpha in (0.05, 0.1, 0.2):  # (n + 1)(1 - alpha) is no float edge for n = 200
        q = conformal_threshold(ours, alpha)
        assert torch.equal(q, TCP.common.calculate_conformal_value(theirs, alpha))
        sets = prediction_sets(probs[test], q, method=method, randomized=False, **OPTIONS)
        assert torch.equal(sets, (ref(probs[test]) <= q))  # TorchCP's _generate_prediction_set
    assert torch.equal(
        all_label_scores(probs, method=method, randomized=False, **OPTIONS), ref(probs)
    )


@pytest.mark.parametrize("method", ["lac", "aps", "raps", "top_k"])
def test_randomised_true_label_scores_equal_torchcp_with_the_same_draws(method: str) -> None:
    probs, target = data(seed=1)
    torch.manual_seed(5)
    theirs = reference(method, randomized=True)(probs, target)
    ours = conformal_scores(
        probs,
        target,
        method=method,
        generator=torch.Generator().manual_seed(5),
        **OPTIONS,
    )
    assert torch.equal(ours, theirs)


def test_randomised_saps_equals_torchcp_all_label_form() -> None:
    """Randomised SAPS equals TorchCP's all-label form with one draw per row.

    TorchCP's single-label SAPS uses ``U p_max`` at rank 0 where its all-label form (and ours,
    and the paper with ``u = 1 - U``) uses ``(1 - U) p_max``: compare the all-label form, with
    one draw per row given to TorchCP as its ``[N, C]`` draws.
    """
    probs, target = data(seed=2)
    u = torch.rand(probs.shape[0], generator=torch.Generator().manual_seed(3))
    with mock.patch("torch.rand", lambda *shape, **kw: u[:, None].expand(*shape[0]).clone()):
        theirs = reference("saps", randomized=True)(probs)
    assert torch.equal(all_label_scores(probs, method="saps", noise=u, **OPTIONS), theirs)
    single = conformal_scores(probs, target, method="saps", noise=u, **OPTIONS)
    assert torch.equal(single, theirs.gather(1, target[:, None])[:, 0])


@pytest.mark.parametrize("method", ["aps", "raps", "top_k"])
def test_randomised_sets_equal_torchcp_with_the_same_draws(method: str) -> None:
    probs, target = data(seed=4)
    q = conformal_threshold(
        conformal_scores(probs[:200], target[:200], method=method, **OPTIONS), 0.1
    )
    u = torch.rand(100, generator=torch.Generator().manual_seed(7))
    with mock.patch("torch.rand", lambda *shape, **kw: u[:, None].expand(*shape[0]).clone()):
        theirs = reference(method, randomized=True)(probs[200:]) <= q
    assert torch.equal(prediction_sets(probs[200:], q, method=method, noise=u, **OPTIONS), theirs)


def test_sscv_and_coverage_gap_equal_torchcp() -> None:
    from lightning_losses.calibration.conformal import (
        class_coverage_gap,
        size_stratified_coverage_violation,
    )

    probs, target = data(n=400, c=12, seed=6)
    q = conformal_threshold(conformal_scores(probs[:200], target[:200], method="aps"), 0.1)
    sets = prediction_sets(probs[200:], q, method="aps")
    test = target[200:]
    sscv = size_stratified_coverage_violation(sets, test, alpha=0.1)
    assert float(sscv) == pytest.approx(TCP.metrics.SSCV(sets.int(), test, 0.1), abs=1e-6)
    gap = class_coverage_gap(sets, test, alpha=0.1)
    assert 100 * float(gap) == pytest.approx(
        TCP.metrics.CovGap(sets.int(), test, 0.1, 12), abs=1e-4
    )
