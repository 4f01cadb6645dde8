"""Thresholds and sets equal MAPIE 1.6's ``SplitConformalClassifier`` on the same probabilities.

A pass-through classifier (``predict_proba`` returns its input) makes MAPIE see exactly the
probabilities given to ours, in float64. LAC and top-k are deterministic; MAPIE's APS is
always randomised, with ``u = RandomState(random_state).uniform(size=n)`` drawn afresh for the
calibration scores and for the sets (``include_last_label="randomized"``): those draws are
given to ours as ``noise``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_losses.calibration.conformal import (
    conformal_scores,
    conformal_threshold,
    prediction_sets,
)

mapie_classification = pytest.importorskip(
    "mapie.classification", reason="MAPIE is a test reference (the dev extra)"
)
sklearn_base = pytest.importorskip("sklearn.base", reason="MAPIE needs scikit-learn")

SEED = 3
ALPHAS = [0.1, 0.2, 0.05]


class PassThrough(sklearn_base.ClassifierMixin, sklearn_base.BaseEstimator):
    """A fitted classifier whose probabilities are its inputs."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> PassThrough:
        self.classes_ = np.arange(x.shape[1])
        return self

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x)

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x).argmax(1)


def fitted(score: str, probs: torch.Tensor, target: torch.Tensor):
    x, y = probs.numpy(), target.numpy()
    model = mapie_classification.SplitConformalClassifier(
        PassThrough().fit(x, y),
        confidence_level=[1 - a for a in ALPHAS],
        conformity_score=score,
        prefit=True,
        random_state=SEED,
    )
    return model.conformalize(x[:200], y[:200])


@pytest.mark.parametrize("score", ["lac", "aps", "top_k"])
def test_thresholds_and_sets_equal_mapie(score: str) -> None:
    g = torch.Generator().manual_seed(11)
    probs = (3 * torch.randn(320, 6, generator=g, dtype=torch.float64)).softmax(1)
    target = torch.multinomial(probs, 1, generator=g)[:, 0]
    model = fitted(score, probs, target)
    options = {}
    if score == "aps":
        options = {"include_last_label": "randomized"}
    _, mapie_sets = model.predict_set(probs[200:].numpy(), conformity_score_params=options)
    inner = model._mapie_classifier
    draws = {n: torch.from_numpy(np.random.RandomState(SEED).uniform(size=n)) for n in (200, 120)}
    noise = (lambda n: draws[n]) if score == "aps" else (lambda n: None)
    scores = conformal_scores(
        probs[:200], target[:200], method=score, randomized=False, noise=noise(200)
    )
    mapie_scores = np.asarray(inner.conformity_scores_).ravel()
    offset = 1.0 if score == "top_k" else 0.0  # MAPIE's top-k score is the 0-based rank
    assert np.array_equal(scores.numpy(), mapie_scores + offset)
    thresholds = conformal_threshold(scores, ALPHAS)
    quantiles = np.asarray(inner.conformity_score_function_.quantiles_, dtype=np.float64)
    assert np.array_equal(thresholds.numpy(), quantiles + offset)
    for i, q in enumerate(thresholds):
        sets = prediction_sets(probs[200:], q, method=score, randomized=False, noise=noise(120))
        assert np.array_equal(sets.numpy(), mapie_sets[:, :, i])
