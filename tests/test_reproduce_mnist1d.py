"""Claims 7 and 8 (MNIST-1D): verdict rules on hand-made tables, and a shrunk run end to end."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch

from lightning_losses.reproduce import display_uri, reproduce_claim
from lightning_losses.reproduce.claims import (
    CALIBRATION_LOSSES,
    CLAIM_7,
    CLAIM_8,
    PUBLISHED_ACCURACY,
    benchmark_conditions,
    calibration_markdown,
    ece_band,
    loss_verdicts,
)
from lightning_losses.reproduce.report import mean_std, write_report
from lightning_losses.reproduce.spec import SUPPORTED, Variant, load_experiment, verdict

ROOT = Path(__file__).resolve().parents[1]


def table_of(rows: dict[str, dict[str, list[float]]]):
    return {
        variant: {metric: mean_std(values) for metric, values in metrics.items()}
        for variant, metrics in rows.items()
    }


# --- verdict rules ---------------------------------------------------------------------------


def benchmark_rows(cnn_acc: list[float]) -> dict[str, dict[str, list[float]]]:
    rows = {
        "logreg": {"rep/test_acc": [0.31, 0.33, 0.32]},
        "mlp": {"rep/test_acc": [0.66, 0.67, 0.66]},
        "cnn": {
            "rep/test_acc": cnn_acc,
            "rep/train_nll": [1e-4, 2e-4, 1.5e-4],
            "rep/test_nll_rise": [0.2, 0.25, 0.22],
            "rep/test_conf_gap": [0.06, 0.07, 0.065],
        },
    }
    return rows


def test_benchmark_is_supported_within_three_points_of_the_published_table():
    conditions = benchmark_conditions(table_of(benchmark_rows([0.92, 0.93, 0.925])))
    assert verdict(conditions) == SUPPORTED
    assert len(conditions) == 2 * len(PUBLISHED_ACCURACY) + 3


def test_benchmark_fails_when_a_model_is_off_beyond_the_noise():
    conditions = benchmark_conditions(table_of(benchmark_rows([0.86, 0.87, 0.865])))
    failed = [c.text for c in conditions if not c.holds]
    assert failed == ["acc(cnn) >= 0.94 - 0.03"]


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


def test_loss_verdicts_a_to_d_follow_the_paired_differences():
    table = table_of(
        calibration_rows(
            ce_ece=[0.060, 0.062, 0.058, 0.061, 0.059],
            loss_ece=[0.030, 0.031, 0.029, 0.032, 0.030],
            loss_ts_ece=[0.020, 0.021, 0.019, 0.020, 0.021],
            ce_ts_ece=[0.010, 0.011, 0.012, 0.010, 0.011],
            loss_acc=[0.90, 0.915, 0.91, 0.905, 0.915],
        )
    )
    v = loss_verdicts(table, "focal_3")
    assert v["a"].outcome == "holds"  # 0.0304 < 0.060
    assert v["b"].holds  # 0.909 vs 0.915 - 0.01: within the tolerance
    assert v["c"].outcome == "fails"  # the loss alone (0.030) does not beat CE + TS (0.011)
    assert v["d"].outcome == "holds"  # scaling the loss still lowers its ECE
    # The band is 2 standard errors of the per-seed differences, written out.
    diffs = [
        a - b
        for a, b in zip(
            [0.030, 0.031, 0.029, 0.032, 0.030], [0.060, 0.062, 0.058, 0.061, 0.059], strict=True
        )
    ]
    mean = sum(diffs) / 5
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4 / 5)
    assert ece_band(table) == pytest.approx(2 * se)
    text = "\n".join(calibration_markdown(table))
    assert f"{2 * se:.4f}, below the 0.005" in text
    assert "| focal_3 | yes (+0.0296 ± " in text


# --- the experiment files --------------------------------------------------------------------


def test_claim8_shares_its_cross_entropy_arm_with_claim7():
    benchmark = load_experiment(ROOT / "configs/experiments/claim-7-mnist1d-benchmark.yaml")
    calibration = load_experiment(ROOT / "configs/experiments/claim-8-mnist1d-calibration.yaml")
    cnn = next(v for v in benchmark.variants if v.name == "cnn")
    ce = next(v for v in calibration.variants if v.name == "ce")
    assert cnn.fingerprint() == ce.fingerprint()
    assert benchmark.min_seeds >= 5 and calibration.min_seeds >= 5
    assert {v.name for v in calibration.variants} == {"ce", *CALIBRATION_LOSSES}


def test_display_uri_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    assert display_uri(f"sqlite:///{tmp_path}/runs/mlflow.db") == "sqlite:///runs/mlflow.db"
    monkeypatch.chdir(tmp_path / "work")
    assert display_uri(f"sqlite:///{tmp_path}/runs/mlflow.db") == "sqlite:///../runs/mlflow.db"


# --- a shrunk claim 7 and 8 end to end -------------------------------------------------------


def shrunk(name: str, config: str, folder: Path) -> Variant:
    """A shipped config on 500 generated sequences and 200 test ones, 3 epochs, curves every
    epoch (a copy of the config with ``every_n_epochs: 1``)."""
    text = (ROOT / config).read_text()
    assert "every_n_epochs: 5" in text
    copy = folder / Path(config).name
    copy.write_text(text.replace("every_n_epochs: 5", "every_n_epochs: 1"))
    overrides = (
        "--data.init_args.num_samples=500",
        "--data.init_args.test_samples=200",
        f"--data.init_args.cache_dir={folder / 'cache'}",
    )
    return Variant(name, str(copy), overrides, epochs=3, label=name)


def test_shrunk_mnist1d_claims_end_to_end(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from lightning_losses.calibration.scaling import fit_temperature
    from lightning_losses.data import MNIST1DDataModule
    from lightning_losses.models import ClassifierModule

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
        seed=0, num_samples=500, test_samples=200, cache_dir=str(configs / "cache")
    )
    features, target = dm.dataset("val").tensors
    model.eval()
    with torch.no_grad():
        logits = model(features)
    assert metrics["rep/temperature"] == pytest.approx(fit_temperature(logits, target), rel=1e-5)
    # The test-NLL curve was logged every epoch and summarised.
    history = [m.value for m in client.get_metric_history(run_id, "curve/test_nll")]
    assert len(history) == 3
    assert metrics["rep/test_nll_rise"] == pytest.approx(history[-1] - min(history))
    # Verdicts and figures.
    assert "## Claim 7" in report and "## Claim 8" in report
    assert "| model | published test acc | ours (mean ± std) |" in report
    assert "Largest 2-SE band of the paired ECE differences" in report
    for name in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report):
        assert (out / name).is_file()
    assert "claim8_test_nll.png" in report and "claim8_reliability_ce_scaled.png" in report


def test_adafocal_is_compared_with_focal_and_flsd_before_and_after_scaling():
    rows = calibration_rows(
        ce_ece=[0.060, 0.062, 0.058, 0.061, 0.059],
        loss_ece=[0.020, 0.021, 0.019, 0.022, 0.020],
        loss_ts_ece=[0.015, 0.016, 0.014, 0.015, 0.016],
        ce_ts_ece=[0.010, 0.011, 0.012, 0.010, 0.011],
        loss_acc=[0.90, 0.915, 0.91, 0.905, 0.915],
    )
    rows["adafocal"]["rep/test_ece"] = [0.010, 0.012, 0.011, 0.010, 0.012]  # 0.0090 below
    rows["adafocal"]["rep/ts_test_ece"] = [0.015, 0.017, 0.014, 0.016, 0.015]  # 0.0004 above
    text = "\n".join(calibration_markdown(table_of(rows)))
    section = text[text.index("AdaFocal against the focal losses") :]
    # ECE: adafocal - focal per seed = -0.010, -0.009, -0.008, -0.012, -0.008: mean -0.0094,
    # written in the claimed direction (focal - adafocal) as +0.0094.
    diffs = [-0.010, -0.009, -0.008, -0.012, -0.008]
    mean = sum(diffs) / 5
    band = 2 * math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4 / 5)
    # After TS: adafocal - focal = 0, +0.001, 0, +0.001, -0.001: inside its band.
    after = [0.0, 0.001, 0.0, 0.001, -0.001]
    mean_after = sum(after) / 5
    band_after = 2 * math.sqrt(sum((d - mean_after) ** 2 for d in after) / 4 / 5)
    for rival in ("focal_3", "flsd_53"):
        assert (
            f"| {rival} | yes (+0.0094 ± {band:.4f}) | "
            f"within noise ({-mean_after:+.4f} ± {band_after:.4f}) |"
        ) in section
