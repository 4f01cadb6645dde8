"""Closed forms, dense inputs with ignore_index, the measures and Metrics, and bad input."""

from __future__ import annotations

import pytest
import torch

from lightning_losses.calibration.conformal import (
    ConformalThreshold,
    PredictionSetMetrics,
    all_label_scores,
    all_label_scores_by_method,
    class_conditional_thresholds,
    class_coverage_gap,
    conformal_scores,
    conformal_threshold,
    coverage,
    empty_rate,
    mean_set_size,
    measures,
    prediction_sets,
    set_statistics,
    set_statistics_by_method,
    singleton_rate,
    size_stratified_coverage_violation,
)
from lightning_losses.calibration.conformal.scores import ranked_rows
from lightning_losses.warning import LightningLossesWarning

PROBS = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("method", "expected"),
    [  # U = 0.25 for both rows; targets 1 and 0 (ranks 1 and 2)
        ("lac", [1 - 0.3, 1 - 0.1]),
        ("aps", [0.8 - 0.25 * 0.3, 1.0 - 0.25 * 0.1]),
        ("raps", [0.8 - 0.25 * 0.3 + 0.5 * 2, 1.0 - 0.25 * 0.1 + 0.5 * 3]),  # k_reg=0, lam=.5
        ("saps", [0.5 + 2.0 * (1 - 0.25), 0.6 + 2.0 * (2 - 0.25)]),  # weight 2
        ("top_k", [2 - 0.25, 3 - 0.25]),
    ],
)
def test_scores_closed_form(method: str, expected: list[float]) -> None:
    u = torch.full((2,), 0.25, dtype=torch.float64)
    got = conformal_scores(
        PROBS, torch.tensor([1, 0]), method=method, noise=u, k_reg=0, lam=0.5, weight=2.0
    )
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), atol=1e-15)


def test_saps_at_rank_zero_and_sets_of_aps() -> None:
    u = torch.tensor([0.25, 0.5], dtype=torch.float64)
    got = conformal_scores(PROBS, torch.tensor([0, 1]), method="saps", noise=u)
    assert torch.allclose(got, torch.tensor([0.75 * 0.5, 0.5 * 0.6], dtype=torch.float64))
    sets = prediction_sets(PROBS, 0.95, method="aps", randomized=False)
    assert sets.tolist() == [[True, True, False], [False, True, True]]  # 0.5,0.8,1 | 0.6,0.9,1


def test_dense_inputs_and_ignore_index_equal_the_flattened_rows() -> None:
    g = torch.Generator().manual_seed(0)
    probs = torch.rand(3, 4, 5, 2, generator=g).softmax(1)  # [N, C, H, W]
    target = torch.randint(0, 4, (3, 5, 2), generator=g)
    target[0, 1, 1] = target[2, 4, 0] = -100
    rows = probs.movedim(1, -1).reshape(-1, 4)
    flat = target.reshape(-1)
    keep = flat != -100
    for method in ("lac", "aps", "raps", "saps", "top_k"):
        dense = conformal_scores(probs, target, method=method, randomized=False, ignore_index=-100)
        plain = conformal_scores(rows[keep], flat[keep], method=method, randomized=False)
        assert torch.equal(dense, plain)
        sets = prediction_sets(probs, 0.7, method=method, randomized=False)
        assert sets.shape == probs.shape
        assert torch.equal(
            sets.movedim(1, -1).reshape(-1, 4),
            prediction_sets(rows, 0.7, method=method, randomized=False),
        )
    sets = prediction_sets(probs, 0.7, method="lac")
    assert float(coverage(sets, target, ignore_index=-100)) == pytest.approx(
        float((rows[keep].gather(1, flat[keep, None]) >= 0.3).double().mean())
    )


def test_threshold_order_statistic_and_several_alphas() -> None:
    scores = torch.randperm(50).double()  # 0..49 shuffled
    for alpha in (0.02, 0.1, 0.37):
        k = -(-(51 * (1 - alpha)) // 1)  # ceil
        assert float(conformal_threshold(scores, alpha)) == k - 1  # the k-th smallest
    both = conformal_threshold(torch.stack([scores, scores + 100]), [0.1, 0.5])
    assert both.tolist() == [[45.0, 25.0], [145.0, 125.0]]


def test_too_few_scores_raise_naming_n_and_alpha() -> None:
    with pytest.raises(ValueError, match=r"n=8 calibration scores are too few for alpha=0\.1"):
        conformal_threshold(torch.rand(8), 0.1)
    assert conformal_threshold(torch.arange(9.0), 0.1) == 8.0  # n = 9 is enough
    with pytest.raises(ValueError, match="alpha must lie in"):
        conformal_threshold(torch.rand(8), 1.0)


def test_mondrian_thresholds_and_short_class_warning() -> None:
    scores = torch.arange(30.0)
    target = torch.tensor([0] * 10 + [1] * 19 + [2])
    with pytest.warns(LightningLossesWarning, match=r"classes \[2, 3\] have fewer than 9"):
        q = class_conditional_thresholds(scores, target, 0.1, num_classes=4)
    # class 0: 0..9, k = ceil(11 * .9) = 10 -> 9; class 1: 10..28, k = 18 -> 27; 2 and 3: inf
    assert q.tolist() == [9.0, 27.0, float("inf"), float("inf")]
    sets = prediction_sets(torch.full((1, 4), 0.25), torch.tensor([0.8, 0.7, 0.0, 0.0]))
    assert sets.tolist() == [[True, False, False, False]]  # 1 - p = 0.75 against each q_y


def test_measures_equal_plain_formulas_and_metrics_equal_functions() -> None:
    g = torch.Generator().manual_seed(4)
    sets = torch.rand(200, 6, generator=g) < 0.3
    target = torch.randint(0, 6, (200,), generator=g)
    covered = sets[torch.arange(200), target].double()
    sizes = sets.sum(1)
    assert float(coverage(sets, target)) == pytest.approx(float(covered.mean()))
    assert float(mean_set_size(sets, target)) == pytest.approx(float(sizes.double().mean()))
    assert float(empty_rate(sets, target)) == pytest.approx(float((sizes == 0).double().mean()))
    assert float(singleton_rate(sets, target)) == pytest.approx(float((sizes == 1).double().mean()))
    strata = [(0, 1), (2, 3), (4, 6)]
    worst = max(abs(float(covered[(sizes >= a) & (sizes <= b)].mean()) - 0.9) for a, b in strata)
    sscv = size_stratified_coverage_violation(sets, target, alpha=0.1, strata=strata)
    assert float(sscv) == pytest.approx(worst)
    gaps = [abs(float(covered[target == c].mean()) - 0.9) for c in range(6)]
    assert float(class_coverage_gap(sets, target, alpha=0.1)) == pytest.approx(sum(gaps) / 6)
    metric = PredictionSetMetrics(num_classes=6, alpha=0.1, strata=strata)
    for part in torch.arange(200).split(37):
        metric.update(sets[part], target[part])
    values = metric.compute()
    assert float(values["coverage"]) == pytest.approx(float(covered.mean()))
    assert float(values["sscv"]) == pytest.approx(worst)
    probs = torch.rand(200, 6, generator=g).softmax(1)
    thresholds = ConformalThreshold(alpha=[0.1, 0.2], method="raps")
    for part in torch.arange(200).split(33):
        thresholds.update(probs[part], target[part])
    expected = conformal_threshold(
        conformal_scores(probs, target, method="raps", randomized=False).double(), [0.1, 0.2]
    )
    assert torch.equal(thresholds.compute(), expected)


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(ValueError, match="method must be one of"):
        conformal_scores(PROBS, torch.tensor([0, 1]), method="thr")
    with pytest.raises(ValueError, match="target must have shape"):
        conformal_scores(PROBS, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="target values must lie in"):
        conformal_scores(PROBS, torch.tensor([0, 3]))
    with pytest.raises(TypeError, match="probs must be a floating"):
        conformal_scores(torch.tensor([[1, 0]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="noise must be a tensor of shape"):
        conformal_scores(PROBS, torch.tensor([0, 1]), method="aps", noise=torch.rand(3))
    with pytest.raises(ValueError, match="threshold must be one number"):
        prediction_sets(PROBS, torch.tensor([0.1, 0.2]))
    with pytest.raises(ValueError, match="weight must lie in"):
        conformal_scores(PROBS, torch.tensor([0, 1]), method="saps", weight=0.0)


def test_a_python_float_threshold_is_not_rounded_to_float32() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    q = 1.0 - 1e-12  # float32 would round it to 1.0 and let the last label in
    assert prediction_sets(probs, q, method="aps", randomized=False).tolist() == [
        [True, True, float(probs.sum()) <= q]
    ]
    assert torch.equal(
        prediction_sets(probs, q, method="aps", randomized=False),
        prediction_sets(
            probs, torch.tensor(q, dtype=torch.float64), method="aps", randomized=False
        ),
    )


@pytest.mark.parametrize("shape", [(64, 7), (8, 5, 3, 2)])
def test_scores_by_method_equal_each_methods_scores_bit_for_bit(shape) -> None:
    g = torch.Generator().manual_seed(3)
    probs = torch.randn(shape, generator=g).mul(3).softmax(1)
    probs[0, :2] = probs[0, :2].mean()  # a tie: the stable sort's order decides
    rows = probs.numel() // probs.shape[1]
    noise = torch.rand(rows, generator=g)
    methods = ["saps", "lac", "aps", "top_k", "raps"]
    options = {"k_reg": 2, "lam": 0.05, "weight": 0.3}
    together = all_label_scores_by_method(probs, methods, noise=noise, **options)
    assert list(together) == methods
    for method in methods:
        alone = all_label_scores(probs, method=method, noise=noise, **options)
        assert torch.equal(together[method], alone), method
    with pytest.raises(ValueError, match="method must be one of"):
        all_label_scores_by_method(probs, ["aps", "thr"])


@pytest.mark.parametrize("chunk", [None, 50], ids=["one-chunk", "chunks-of-50-probs"])
@pytest.mark.parametrize("shape", [(64, 7), (8, 5, 3, 2)])
@pytest.mark.parametrize("randomized", [True, False])
def test_statistics_by_method_equal_those_of_the_sets_bit_for_bit(
    shape, randomized, chunk, monkeypatch
) -> None:
    if chunk is not None:  # rows taken a few at a time, the last chunk a partial one
        monkeypatch.setattr(measures, "CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(5)
    probs = torch.randn(shape, generator=g).mul(2).softmax(1)
    probs[0, :2] = probs[0, :2].mean()  # a tie: the stable sort's order decides
    target = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
    target.view(-1)[::5] = -1  # ignored positions, whose draws are skipped, not shifted
    rows = probs.numel() // probs.shape[1]
    noise = torch.rand(rows, generator=g) if randomized else torch.zeros(rows)
    methods = ["saps", "lac", "aps", "top_k", "raps"]
    options = {"k_reg": 2, "lam": 0.05, "weight": 0.3}
    scores = all_label_scores_by_method(probs, methods, noise=noise, **options)
    # levels between the scores and at scores themselves (a set holds a label at its score)
    levels = {m: [*scores[m].flatten()[[3, 17]].tolist(), 0.9, 2.5] for m in methods}
    found = set_statistics_by_method(probs, target, levels, noise=noise, ignore_index=-1, **options)
    assert list(found) == methods
    for method in methods:
        for q, statistics in zip(levels[method], found[method], strict=True):
            expected = set_statistics(scores[method] <= q, target, ignore_index=-1)
            for name, value in expected._asdict().items():
                assert torch.equal(getattr(statistics, name), value), (method, q, name)
    assert found["lac"][2].size_count.sum() == (target != -1).sum()
    # LAC alone needs no sort: its sets are counted in label order, the same sums
    alone = set_statistics_by_method(probs, target, {"lac": levels["lac"]}, ignore_index=-1)
    for mine, theirs in zip(alone["lac"], found["lac"], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))
    with pytest.raises(ValueError, match="method must be one of"):
        set_statistics_by_method(probs, target, {"thr": [0.5]})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_cumulative_sums_of_steps_at_least_zero_never_decrease(dtype) -> None:
    # set_statistics_by_method finds the set sizes of deterministic APS, RAPS and SAPS by binary
    # search without checking each row, because torch's CPU cumsum adds the terms in order: this
    # fails if a torch release sums otherwise (pairwise, blockwise) and a row's sums then dip
    g = torch.Generator().manual_seed(11)
    magnitudes = 10.0 ** torch.randint(-30, 1, (4000, 1000), generator=g).to(torch.float64)
    probs = torch.rand(4000, 1000, generator=g, dtype=torch.float64) * magnitudes
    probs = (probs / probs.sum(1, keepdim=True)).to(dtype)
    ordered = probs.sort(1, descending=True).values  # rank order, as the scores are summed
    sums = ordered.cumsum(1)
    assert bool((sums[:, 1:] >= sums[:, :-1]).all())
    # the sizes by binary search equal the counts of scores <= q, at levels inside the sums
    target = torch.randint(0, 1000, (4000,), generator=g)
    levels = [sums[:, r].median().item() for r in (3, 30, 500)]
    found = set_statistics_by_method(probs, target, {"aps": levels}, randomized=False)["aps"]
    scores = all_label_scores_by_method(probs, ["aps"], randomized=False)["aps"]
    for q, statistics in zip(levels, found, strict=True):
        expected = set_statistics(scores <= q, target)
        assert torch.equal(statistics.size_count, expected.size_count), q
        assert torch.equal(statistics.class_covered, expected.class_covered), q


@pytest.mark.parametrize("classes", [1, 2, 6])
def test_ranked_rows_give_the_stable_descending_sort_and_each_labels_rank(classes) -> None:
    # probabilities on a coarse grid, so ties are everywhere: first, middle and last places
    g = torch.Generator().manual_seed(3)
    rows = torch.randint(0, 4, (500, classes), generator=g).to(torch.float64) / 4
    rows[:5] = 0.25  # rows of one value throughout
    labels = torch.randint(0, classes, (500,), generator=g)
    ordered, rank = ranked_rows(rows, labels)
    values, order = rows.sort(dim=1, descending=True, stable=True)
    assert torch.equal(ordered, values)
    # the stable sort's place of each label, found in its permutation
    assert torch.equal(rank[:, 0], (order == labels[:, None]).int().argmax(1))
