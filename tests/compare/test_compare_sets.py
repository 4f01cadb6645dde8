"""``compare --group-by``'s prediction-set metrics: set sizes decided, coverage shown without one.

``ConformalPrediction`` logs ``test/conformal_<method>_<alpha>_<measure>`` when a checkpoint is
tested. The records are built by hand with those keys; every interval is computed here with
SciPy's t-quantiles. (The shipped config's fit, test and ``compare`` output, end to end:
``tests/callbacks/test_conformal_callback.py``.)
"""

from __future__ import annotations

import math

import pytest
from scipy import stats

from lightning_losses.compare.groups import RunRecord, compare_groups, format_groups

SEEDS = (0, 1, 2, 3, 4)
CE = "lightning_losses.CrossEntropyLoss"
FOCAL = "lightning_losses.FocalLoss"
#: Mean APS set sizes and coverages at alpha 0.1 by seed (made up, of the size a CNN gives).
SIZES = {CE: (2.10, 2.30, 2.05, 2.20, 2.25), FOCAL: (1.70, 1.85, 1.60, 1.80, 1.75)}
COVERAGES = {CE: (0.901, 0.899, 0.905, 0.902, 0.898), FOCAL: (0.903, 0.9, 0.896, 0.904, 0.9)}
SIZE = "test/conformal_aps_0.1_size"
COVERAGE = "test/conformal_aps_0.1_coverage"


def record(loss: str, seed: int) -> RunRecord:
    index = SEEDS.index(seed)
    name = loss.rsplit(".", 1)[1]
    return RunRecord(
        run_id=f"{name}{seed}".ljust(32, "0"),
        run_name=name,
        start_time=seed,
        params={
            "model.criterion.class_path": loss,
            "seed_everything": str(seed),
            "data.class_path": "lightning_losses.data.MNIST1DDataModule",
        },
        tags={"loss": name},
        metrics={
            "val/acc": 0.8,
            SIZE: SIZES[loss][index],
            COVERAGE: COVERAGES[loss][index],
            "test/conformal_aps_0.1_singleton": 0.5,  # logged, not compared
        },
        status="FINISHED",
    )


@pytest.fixture(scope="module")
def result():
    records = [record(loss, seed) for loss in (CE, FOCAL) for seed in SEEDS]
    return compare_groups(records, "loss", pair_by="seed", level=0.95)


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def test_set_size_and_coverage_are_compared_after_the_validation_metrics(result):
    metrics = list(dict.fromkeys(row.metric for row in result.rows))
    assert metrics == ["val/acc", COVERAGE, SIZE]  # the singleton rate is not compared
    assert result.margins[SIZE] == 0.1
    assert result.margins[COVERAGE] == 0.02


def test_a_smaller_set_is_better_beyond_noise(result):
    (focal,) = [r for r in result.rows if r.metric == SIZE and r.group == "FocalLoss"]
    differences = [f - c for f, c in zip(SIZES[FOCAL], SIZES[CE], strict=True)]
    mean, low, high = t_interval(differences)
    assert focal.decision.difference == pytest.approx(mean, abs=1e-12)
    assert (focal.decision.low, focal.decision.high) == pytest.approx((low, high), abs=1e-12)
    assert high < -0.1  # smaller by more than the margin, beyond noise
    assert focal.decision.verdict == "better"
    assert focal.mean == pytest.approx(t_interval(list(SIZES[FOCAL]))[0], abs=1e-12)


def test_coverage_has_its_interval_and_no_verdict(result):
    rows = {r.group: r for r in result.rows if r.metric == COVERAGE}
    for loss, row in zip((CE, FOCAL), (rows["CrossEntropyLoss"], rows["FocalLoss"]), strict=True):
        assert (row.mean, row.low, row.high) == pytest.approx(t_interval(list(COVERAGES[loss])))
    assert rows["FocalLoss"].decision is None
    assert rows["FocalLoss"].note == "no verdict (a coverage)"
    text = format_groups(result, width=None)
    assert f"{COVERAGE} (should be 0.9, the level the sets guarantee)" in text
    assert f"{SIZE} (lower is better; equivalence margin ±0.1)" in text


def test_a_margin_option_reaches_the_set_size(result):
    records = [record(loss, seed) for loss in (CE, FOCAL) for seed in SEEDS]
    wide = compare_groups(records, "loss", pair_by="seed", margins={SIZE: 1.0})
    (focal,) = [r for r in wide.rows if r.metric == SIZE and r.group == "FocalLoss"]
    assert wide.margins[SIZE] == 1.0
    assert focal.decision.verdict.startswith("equivalent")  # within ±1 label, by TOST
