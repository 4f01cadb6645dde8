"""Claims 7 and 8 (MNIST-1D): verdict rules on hand-made tables, the protocol, a shrunk run.

The verdicts are checked against Student's t and TOST computed here with SciPy.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers.paths import ROOT
from scipy import stats as scipy_stats

from lightning_losses.reproduce import display_uri, reproduce_claim
from lightning_losses.reproduce.claims import (
    ACC_TOLERANCE,
    CALIBRATION_LOSSES,
    CLAIM_7,
    CLAIM_8,
    ECE_MARGIN,
    LITERATURE_LOSSES,
    NEAR_ZERO_NLL,
    POSTHOC_METHODS,
    PUBLISHED_ACCURACY,
    PUBLISHED_TOLERANCE,
    benchmark_conditions,
    calibration_markdown,
    ece_band,
    loss_verdicts,
)
from lightning_losses.reproduce.report import mean_std, write_report
from lightning_losses.reproduce.spec import (
    MIXED,
    SUPPORTED,
    Variant,
    load_experiment,
    verdict,
    verdict_text,
)


def table_of(rows: dict[str, dict[str, list[float]]]):
    return {
        variant: {metric: mean_std(values) for metric, values in metrics.items()}
        for variant, metrics in rows.items()
    }


def t_ci(d, level: float = 0.95) -> tuple[float, float]:
    """The two-sided Student-t interval of the mean of ``d``, written out."""
    d = np.asarray(d, dtype=np.float64)
    half = scipy_stats.t.ppf((1 + level) / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return d.mean() - half, d.mean() + half


def tost(d, margin: float) -> bool:
    """Schuirmann's two one-sided tests at alpha 0.05: the 90% interval inside the margin."""
    low, high = t_ci(d, 0.90)
    return -margin < low and high < margin


def seeds_to_decide(d, margin: float) -> int:
    """The fewest seeds at which this mean and spread would give a verdict (paired t)."""
    d = np.asarray(d, dtype=np.float64)
    mean, sd = abs(d.mean()), d.std(ddof=1)
    for n in range(len(d) + 1, 1001):
        se = sd / math.sqrt(n)
        if mean > scipy_stats.t.ppf(0.975, n - 1) * se:
            return n
        if margin > 0 and mean + scipy_stats.t.ppf(0.95, n - 1) * se < margin:
            return n
    raise AssertionError("not decided within 1000 seeds")


# --- verdict rules ---------------------------------------------------------------------------


def benchmark_rows(cnn_acc: list[float], train_nll: list[float] | None = None):
    return {
        "logreg": {"rep/published_test_acc": [0.31, 0.33, 0.32, 0.315, 0.325]},
        "mlp": {"rep/published_test_acc": [0.67, 0.69, 0.68, 0.675, 0.685]},
        "cnn": {
            "rep/published_test_acc": cnn_acc,
            "rep/train_nll": train_nll or [1e-4, 2e-4, 1.5e-4, 0.3, 1e-4],
            "rep/test_nll_rise": [0.2, 0.25, 0.22, 0.21, 0.23],
            "rep/test_conf_gap": [0.06, 0.07, 0.065, 0.06, 0.068],
        },
    }


def test_benchmark_is_supported_when_every_model_is_equivalent_to_the_published_table():
    rows = benchmark_rows([0.93, 0.935, 0.94, 0.932, 0.938])
    conditions = benchmark_conditions(table_of(rows))
    assert verdict(conditions) == SUPPORTED
    assert len(conditions) == len(PUBLISHED_ACCURACY) + 3
    for condition, (name, published) in zip(conditions, PUBLISHED_ACCURACY.items(), strict=False):
        d = np.array(rows[name]["rep/published_test_acc"]) - published
        assert tost(d, PUBLISHED_TOLERANCE)  # the reference says equivalent, and so do we
        assert condition.margin == PUBLISHED_TOLERANCE
        assert condition.holds
        assert (condition.decision.low, condition.decision.high) == pytest.approx(t_ci(d))
        assert condition.describe().endswith(f"-> holds: equivalent within ±{PUBLISHED_TOLERANCE}")


def test_benchmark_fails_when_a_model_is_off_beyond_the_noise():
    conditions = benchmark_conditions(table_of(benchmark_rows([0.86, 0.87, 0.865, 0.862, 0.868])))
    failed = [c.text for c in conditions if not c.holds]
    assert failed == ["acc(cnn, published test split) ~ 0.94 ± 0.03"]
    assert verdict(conditions) == MIXED


def test_benchmark_says_undecided_with_the_seeds_it_needs():
    rows = benchmark_rows([0.93, 0.935, 0.94, 0.932, 0.938])
    rows["mlp"]["rep/published_test_acc"] = [0.60, 0.70, 0.66, 0.75, 0.62]
    conditions = benchmark_conditions(table_of(rows))
    d = np.array(rows["mlp"]["rep/published_test_acc"]) - PUBLISHED_ACCURACY["mlp"]
    low, high = t_ci(d)
    assert low < 0 < high
    assert not tost(d, PUBLISHED_TOLERANCE)  # neither different nor equal
    k = seeds_to_decide(d, PUBLISHED_TOLERANCE)
    mlp = conditions[1]
    assert mlp.outcome == "undecided"
    assert mlp.decision.seeds_needed == k
    assert mlp.describe().endswith(f"-> undecided (needs ~{k} seeds)")
    assert verdict_text(conditions) == f"undecided (needs ~{k} seeds)"


def test_the_cnn_overfits_by_its_median_training_nll_over_the_seeds():
    # 4 of 10 seeds end above 0.01 (Adam's late spikes): the median is still near zero.
    spiky = [1e-4, 0.02, 2e-4, 0.05, 3e-4, 0.013, 1e-4, 0.3, 2e-4, 4e-4]
    rows = benchmark_rows([0.93, 0.935, 0.94, 0.932, 0.938], train_nll=spiky)
    median = benchmark_conditions(table_of(rows))[3]
    assert median.left == pytest.approx(float(np.median(spiky)))
    assert median.holds
    assert median.text.endswith("(6 of 10 seeds)")
    worse = [0.02, 0.05, 0.013, 0.3, 0.011, 0.012, 1e-4, 2e-4, 3e-4, 4e-4]
    rows = benchmark_rows([0.93, 0.935, 0.94, 0.932, 0.938], train_nll=worse)
    median = benchmark_conditions(table_of(rows))[3]
    assert median.left == pytest.approx(float(np.median(worse)))
    assert not median.holds
    assert median.text == f"median over seeds of train NLL(cnn) < {NEAR_ZERO_NLL:g} (4 of 10 seeds)"


def calibration_rows(ce_ece, loss_ece, loss_ts_ece, ce_ts_ece, loss_acc):
    rows = {
        "ce": {
            "rep/test_ece": ce_ece,
            "rep/ts_test_ece": ce_ts_ece,
            "rep/test_acc": [0.91, 0.92, 0.915, 0.91, 0.92],
        }
    }
    for name in CALIBRATION_LOSSES:
        rows[name] = {
            "rep/test_ece": loss_ece,
            "rep/ts_test_ece": loss_ts_ece,
            "rep/test_acc": loss_acc,
        }
    return rows


def cell(word: str, d) -> str:
    low, high = t_ci(d)
    return f"{word} ({np.mean(d):+.4f} [{low:+.4f}, {high:+.4f}])"


def test_loss_verdicts_a_to_d_follow_the_paired_t_intervals():
    ce_ece = [0.060, 0.062, 0.058, 0.061, 0.059]
    loss_ece = [0.030, 0.031, 0.029, 0.032, 0.030]
    loss_ts = [0.020, 0.021, 0.019, 0.020, 0.021]
    ce_ts = [0.010, 0.011, 0.012, 0.010, 0.011]
    loss_acc = [0.90, 0.915, 0.91, 0.905, 0.915]
    rows = calibration_rows(ce_ece, loss_ece, loss_ts, ce_ts, loss_acc)
    table = table_of(rows)
    v = loss_verdicts(table, "focal_3")
    a = np.subtract(loss_ece, ce_ece)
    assert t_ci(a)[1] < 0  # lower beyond the noise
    assert v["a"].outcome == "holds"
    acc = np.subtract(loss_acc, rows["ce"]["rep/test_acc"])
    assert t_ci(acc)[1] < 0  # below CE beyond the noise, but equivalent within 0.01:
    assert tost(acc, ACC_TOLERANCE)  # not below by more than the margin
    assert v["b"].holds
    c = np.subtract(loss_ece, ce_ts)
    assert t_ci(c)[0] > 0  # the loss alone is above CE + TS
    assert v["c"].outcome == "fails"
    assert v["d"].outcome == "holds"  # scaling the loss still lowers its ECE
    for key, d in (("a", a), ("b", acc), ("c", c)):
        assert (v[key].decision.low, v[key].decision.high) == pytest.approx(t_ci(d), abs=1e-12)
    # The band is the half-width of the 95% t interval of the paired ECE differences.
    low, high = t_ci(a)
    assert ece_band(table) == pytest.approx((high - low) / 2)
    assert ece_band(table) == pytest.approx(
        scipy_stats.t.ppf(0.975, 4) * np.std(a, ddof=1) / math.sqrt(5)
    )
    text = "\n".join(calibration_markdown(table))
    assert f"{(high - low) / 2:.4f}, below the 0.005" in text
    assert f"| focal_3 | {cell('yes', a)} | {cell('yes, equivalent within ±0.01', acc)} | " in text


def test_adafocal_is_compared_with_focal_and_flsd_before_and_after_scaling():
    rows = calibration_rows(
        ce_ece=[0.060, 0.062, 0.058, 0.061, 0.059],
        loss_ece=[0.020, 0.021, 0.019, 0.022, 0.020],
        loss_ts_ece=[0.015, 0.016, 0.014, 0.015, 0.016],
        ce_ts_ece=[0.010, 0.011, 0.012, 0.010, 0.011],
        loss_acc=[0.90, 0.915, 0.91, 0.905, 0.915],
    )
    rows["adafocal"]["rep/test_ece"] = [0.010, 0.012, 0.011, 0.010, 0.012]
    rows["adafocal"]["rep/ts_test_ece"] = [0.015, 0.017, 0.014, 0.016, 0.015]
    text = "\n".join(calibration_markdown(table_of(rows)))
    section = text[text.index("AdaFocal against the focal losses") :]
    before = np.subtract(rows["adafocal"]["rep/test_ece"], rows["focal_3"]["rep/test_ece"])
    after = np.subtract(rows["adafocal"]["rep/ts_test_ece"], rows["focal_3"]["rep/ts_test_ece"])
    assert t_ci(before)[1] < 0  # lower beyond the noise, and not within the ECE margin
    assert not tost(before, ECE_MARGIN)
    assert tost(after, ECE_MARGIN)  # after scaling: a tie within ±0.005, so not "below"
    for rival in ("focal_3", "flsd_53"):
        expected = f"| {rival} | {cell('yes', before)} | "
        expected += f"{cell(f'no, equivalent within ±{ECE_MARGIN}', after)} |"
        assert expected in section


def test_literature_losses_are_compared_with_ce_focal_and_flsd_outside_the_verdict():
    rows = calibration_rows(
        ce_ece=[0.060, 0.062, 0.058, 0.061, 0.059],
        loss_ece=[0.020, 0.021, 0.019, 0.022, 0.020],
        loss_ts_ece=[0.015, 0.016, 0.014, 0.015, 0.016],
        ce_ts_ece=[0.010, 0.011, 0.012, 0.010, 0.011],
        loss_acc=[0.90, 0.915, 0.91, 0.905, 0.915],
    )
    table = table_of(rows)
    before_verdict = [c.outcome for c in CLAIM_8.conditions(table)]
    mdca = {
        "rep/test_ece": [0.080, 0.081, 0.079, 0.082, 0.080],  # above CE's: (a) fails
        "rep/ts_test_ece": [0.015, 0.017, 0.014, 0.016, 0.015],
        "rep/test_acc": [0.91, 0.92, 0.915, 0.91, 0.92],  # CE's exactly
    }
    table = table_of({**rows, "mdca": mdca})
    # Not part of the verdict: the conditions are those without the literature's arm.
    assert [c.outcome for c in CLAIM_8.conditions(table)] == before_verdict
    text = "\n".join(calibration_markdown(table))
    section = text[text.index("The train-time calibration losses of the literature") :]
    a = np.subtract(mdca["rep/test_ece"], rows["ce"]["rep/test_ece"])
    assert t_ci(a)[0] > 0
    numbers = " | ".join(
        f"{np.mean(mdca[k]):.4f} ± {np.std(mdca[k], ddof=1):.4f}"
        for k in ("rep/test_acc", "rep/test_ece", "rep/ts_test_ece")
    )
    assert f"| mdca | {numbers} | {cell('no', a)} | " in section
    for rival in ("focal_3", "flsd_53"):
        before = np.subtract(mdca["rep/test_ece"], rows[rival]["rep/test_ece"])
        after = np.subtract(mdca["rep/ts_test_ece"], rows[rival]["rep/ts_test_ece"])
        assert t_ci(before)[0] > 0
        assert tost(after, ECE_MARGIN)
        expected = f"{cell('no', before)} | {cell(f'no, equivalent within ±{ECE_MARGIN}', after)}"
        assert expected in section
    # Arms not run leave no rows.
    assert "| poly1 |" not in section


# --- the protocol ------------------------------------------------------------------------------


def _reference(**overrides) -> dict[str, np.ndarray]:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    for name, value in overrides.items():
        setattr(args, name, value)
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        return make_dataset(args)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def test_generated_validation_keeps_the_published_training_set_whole(tmp_path):
    from lightning_losses.data.mnist1d import MNIST1DDataModule

    dm = MNIST1DDataModule(
        num_samples=200,
        test_samples=100,
        val_source="generated",
        val_samples=50,
        val_seed=2,
        cache_dir=str(tmp_path),
    )
    published = _reference(num_samples=200)  # mnist1d's own split: 160 training, 40 test
    x, y = (t.numpy() for t in dm.dataset("train").tensors)
    assert np.array_equal(x, published["x"].astype(np.float32))  # every training sequence
    assert np.array_equal(y, published["y"])
    x_pub, y_pub = (t.numpy() for t in dm.dataset("published_test").tensors)
    assert np.array_equal(x_pub, published["x_test"].astype(np.float32))
    assert np.array_equal(y_pub, published["y_test"])
    assert dm.extra_splits == ("published_test",)
    generated = _reference(num_samples=50, train_split=0.0, seed=2)
    x_val, y_val = (t.numpy() for t in dm.dataset("val").tensors)
    assert np.array_equal(x_val, generated["x_test"].astype(np.float32))
    assert np.array_equal(y_val, generated["y_test"])
    # disjoint from training (and from both test sets): no validation row appears there
    for other in (x, x_pub, dm.dataset("test").tensors[0].numpy()):
        assert not (x_val[:, None, :] == other[None, :, :]).all(-1).any()
    with pytest.raises(ValueError, match="val_seed must differ from test_seed=1"):
        MNIST1DDataModule(
            num_samples=200,
            test_samples=100,
            val_source="generated",
            val_seed=1,
            cache_dir=str(tmp_path),
        )
    with pytest.raises(ValueError, match="val_source must be one of"):
        MNIST1DDataModule(num_samples=200, val_source="held-out", cache_dir=str(tmp_path))


def test_the_shipped_configs_are_the_papers_protocol_and_the_experiments_recipe():
    """All 4,000 training samples, 6,000 steps of batch 100, generated validation, both tests.

    The experiment files of claims 7 and 8 run exactly these epochs on 10 seeds.
    """
    steps_per_epoch = 4000 // 100
    experiments = [
        load_experiment(ROOT / "configs/experiments/claim-7-mnist1d-benchmark.yaml"),
        load_experiment(ROOT / "configs/experiments/claim-8-mnist1d-calibration.yaml"),
    ]
    for experiment in experiments:
        assert experiment.min_seeds == 10
        for variant in experiment.variants:
            config = yaml.safe_load((ROOT / variant.config).read_text())
            data = config["data"]["init_args"]
            assert variant.epochs == config["trainer"]["max_epochs"], variant.name
            assert variant.epochs * steps_per_epoch == 6000
            assert data["val_source"] == "generated"
            assert data["batch_size"] == 100
            assert data.get("num_samples", 5000) == 5000
            assert data.get("train_split", 0.8) == 0.8
            assert data["test_samples"] == 10000


# --- the experiment files --------------------------------------------------------------------


def test_claim8_shares_its_cross_entropy_arm_with_claim7():
    benchmark = load_experiment(ROOT / "configs/experiments/claim-7-mnist1d-benchmark.yaml")
    calibration = load_experiment(ROOT / "configs/experiments/claim-8-mnist1d-calibration.yaml")
    cnn = next(v for v in benchmark.variants if v.name == "cnn")
    ce = next(v for v in calibration.variants if v.name == "ce")
    assert cnn.fingerprint() == ce.fingerprint()
    assert benchmark.min_seeds >= 10
    assert calibration.min_seeds >= 10
    assert {v.name for v in calibration.variants} == {
        "ce",
        *CALIBRATION_LOSSES,
        *LITERATURE_LOSSES,
    }


def test_display_uri_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    assert display_uri(f"sqlite:///{tmp_path}/runs/mlflow.db") == "sqlite:///runs/mlflow.db"
    monkeypatch.chdir(tmp_path / "work")
    assert display_uri(f"sqlite:///{tmp_path}/runs/mlflow.db") == "sqlite:///../runs/mlflow.db"


# --- a shrunk claim 7 and 8 end to end -------------------------------------------------------


def shrunk(name: str, config: str, folder: Path) -> Variant:
    """A shipped config on 500 generated sequences, 200 test and 100 validation ones, 3 epochs.

    Curves every epoch (a copy of the config with ``every_n_epochs: 1``).
    """
    text = (ROOT / config).read_text()
    assert "every_n_epochs: 5" in text
    copy = folder / Path(config).name
    copy.write_text(text.replace("every_n_epochs: 5", "every_n_epochs: 1"))
    overrides = (
        "--data.init_args.num_samples=500",
        "--data.init_args.test_samples=200",
        "--data.init_args.val_samples=100",
        f"--data.init_args.cache_dir={folder / 'cache'}",
    )
    return Variant(name, str(copy), overrides, epochs=3, label=name)


@pytest.mark.slow
def test_shrunk_mnist1d_claims_end_to_end(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from lightning_losses.calibration.posthoc.temperature import fit_temperature
    from lightning_losses.data.mnist1d import MNIST1DDataModule
    from lightning_losses.lightning.classifier import ClassifierModule

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    configs = tmp_path / "configs"
    configs.mkdir()
    benchmark = dataclasses.replace(
        CLAIM_7, fixed_variants=(shrunk("cnn", "configs/mnist1d_ce.yaml", configs),)
    )
    calibration = dataclasses.replace(
        CLAIM_8,
        fixed_variants=(
            shrunk("ce", "configs/mnist1d_ce.yaml", configs),
            shrunk("focal_3", "configs/mnist1d_focal.yaml", configs),
        ),
    )
    out = tmp_path / "reports"
    out.mkdir()
    results = [
        reproduce_claim(claim, seeds=2, scale=1.0, tracking_uri=uri, out=out)
        for claim in (benchmark, calibration)
    ]
    assert not any(r.failures for r in results)
    report = write_report(results, out, ["shrunk"]).read_text()
    # Claim 8's cross-entropy arm is claim 7's CNN: the same runs, reused, not trained again.
    for seed in (0, 1):
        assert results[1].runs[("ce", seed)] == results[0].runs[("cnn", seed)]
    assert results[1].reused == 2
    client = MlflowClient(uri)
    for result in results:
        for (variant, seed), run_id in result.runs.items():
            assert re.search(rf"\| {variant} \| {seed} \| `{run_id}` \|", report)
    # Every number of the calibration table is MLflow's, and the temperature is the one a fit
    # on the checkpoint's validation logits gives.
    run_id = results[1].runs[("focal_3", 0)]
    metrics = client.get_run(run_id).data.metrics
    row = next(line for line in report.splitlines() if line.startswith("| focal_3 | focal_3 |"))
    for key, _ in CLAIM_8.metrics:
        stats = results[1].table["focal_3"][key]
        assert stats.values[0] == pytest.approx(metrics[key])
        assert f"{stats.mean:.4f} ± {stats.std:.4f}" in row
    last = next((tmp_path).rglob(f"{run_id}/**/last.ckpt"))
    model = ClassifierModule.load_from_checkpoint(last, weights_only=True)
    dm = MNIST1DDataModule(
        seed=0,
        num_samples=500,
        test_samples=200,
        val_source="generated",
        val_samples=100,
        cache_dir=str(configs / "cache"),
    )
    features, target = dm.dataset("val").tensors
    model.eval()
    with torch.no_grad():
        logits = model(features)
        published_x, published_y = dm.dataset("published_test").tensors
        published_acc = (model(published_x).argmax(1) == published_y).double().mean()
    assert metrics["rep/temperature"] == pytest.approx(fit_temperature(logits, target), rel=1e-5)
    # The published test split (mnist1d's own 100 of these 500) is scored beside the 200.
    assert len(published_y) == 100
    assert metrics["rep/published_test_acc"] == pytest.approx(float(published_acc), abs=1e-6)
    # The test-NLL curve was logged every epoch and summarised.
    history = [m.value for m in client.get_metric_history(run_id, "curve/test_nll")]
    assert len(history) == 3
    assert metrics["rep/test_nll_rise"] == pytest.approx(history[-1] - min(history))
    # Verdicts and figures.
    assert "## Claim 7" in report
    assert "## Claim 8" in report
    assert "| model | published test acc | ours, published 1,000 (mean ± std) |" in report
    assert "Largest half-width of the 95% interval of the paired ECE differences" in report
    # The appendix holds every per-seed value of every arm, exactly as the store has it.
    appendix = report[report.index("## Appendix: per-seed values") :]
    for result in results:
        for (variant, seed), run_id in result.runs.items():
            stored = client.get_run(run_id).data.metrics
            for metric in result.table[variant]:
                if metric not in stored:
                    continue
                (row,) = re.findall(
                    rf"^\| {re.escape(variant)} \| `{metric}` \| .*$",
                    appendix.split(f"### Claim {result.claim.number}:")[1].split("###")[0],
                    flags=re.M,
                )
                cells = [c.strip() for c in row.strip("|").split("|")][2:]
                assert float(cells[seed]) == stored[metric], (variant, metric, seed)
    for name in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report):
        assert (out / name).is_file()
    assert "claim8_test_nll.png" in report
    assert "claim8_reliability_ce_scaled.png" in report
    # A new fit logs the post-hoc arms (their values: tests/reproduce/test_reproduce_posthoc.py)
    # and claim 8's section shows them.
    assert client.get_run(run_id).data.tags["ph_best_method"] in {"none", *POSTHOC_METHODS}
    assert {f"rep/ph_{m}_test_ece" for m in POSTHOC_METHODS} <= set(metrics)
    assert "Post-hoc arms." in report
