"""The conformal Metrics under real 2-process gloo DDP equal the one-process values on all data.

Two processes hold uneven shares (301 and 122 samples, in batches of different sizes).
``ConformalThreshold`` gathers its scores (``"cat"`` state) and ``PredictionSetMetrics`` sums
its statistics (``"sum"`` state) in ``compute()``; the reference is the package's functions in
this process over all 423 samples: thresholds exactly (an order statistic of the same numbers),
measures to 1e-12 (float64 sums in another order).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.ddp import spawn_gloo

from lightning_losses.calibration import conformal as CP

SHARES = (301, 122)
BATCHES = (100, 50)
ALPHAS = [0.1, 0.2]


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    logits = 2.0 * torch.randn(sum(SHARES), 7, generator=g, dtype=torch.float64)
    return logits.softmax(1), torch.multinomial((logits / 2).softmax(1), 1, generator=g)[:, 0]


def _worker(rank: int, out: str) -> None:
    probs, target = _data()
    start = sum(SHARES[:rank])
    mine = slice(start, start + SHARES[rank])
    results = {}
    for method in ("lac", "aps"):
        metric = CP.ConformalThreshold(alpha=ALPHAS, method=method)
        sets_metric = CP.PredictionSetMetrics(num_classes=7, alpha=0.1)
        for p, t in zip(
            probs[mine].split(BATCHES[rank]), target[mine].split(BATCHES[rank]), strict=True
        ):
            metric.update(p, t)
            sets_metric.update(CP.prediction_sets(p, 0.8, method=method, randomized=False), t)
        results[method] = (metric.compute(), sets_metric.compute())
    torch.save(results, Path(out) / f"rank{rank}.pt")


@pytest.mark.slow
def test_synced_metrics_equal_single_process_values(tmp_path):
    spawn_gloo(_worker, str(tmp_path), processes=len(SHARES))
    probs, target = _data()
    for rank in range(len(SHARES)):
        results = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        for method in ("lac", "aps"):
            thresholds, measures = results[method]
            scores = CP.conformal_scores(probs, target, method=method, randomized=False)
            assert torch.equal(thresholds, CP.conformal_threshold(scores, ALPHAS))
            sets = CP.prediction_sets(probs, 0.8, method=method, randomized=False)
            assert float(measures["coverage"]) == pytest.approx(
                float(CP.coverage(sets, target)), abs=1e-12
            )
            assert float(measures["size"]) == pytest.approx(
                float(CP.mean_set_size(sets, target)), abs=1e-12
            )
            assert float(measures["sscv"]) == pytest.approx(
                float(CP.size_stratified_coverage_violation(sets, target, alpha=0.1)), abs=1e-12
            )
