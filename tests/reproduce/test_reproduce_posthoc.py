"""Claim 8's post-hoc arms, and ``reproduce --post-fit-only`` on runs of an older code version.

The metrics are checked against float64 formulas written here (top-label ECE, NLL, accuracy),
the cross-validated choice against folds rebuilt here from their documented rule, the report's
comparisons against Student's t computed with SciPy, and the completion of old runs on a real
SQLite MLflow store with real fits of a shrunk claim 8.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.paths import ROOT
from helpers.warned import package_warns
from scipy import stats as scipy_stats

from lightning_losses.calibration.posthoc import CALIBRATION_METHODS, get_calibrator
from lightning_losses.calibration.posthoc.temperature import fit_temperature
from lightning_losses.reproduce import reproduce_claim, runner, version
from lightning_losses.reproduce.claims import (
    BEST_CV_NLL,
    BEST_ECE,
    CLAIM_8,
    ECE_MARGIN,
    POSTHOC_METHODS,
    POSTHOC_METRICS,
    best_loss,
    calibration_markdown,
    posthoc_key,
    posthoc_markdown,
)
from lightning_losses.reproduce.cli import parse_args
from lightning_losses.reproduce.report import mean_std, write_report
from lightning_losses.reproduce.spec import Variant

BINS = 15
#: The methods with more parameters than the shrunk claim's 100 validation samples.
FALL_BACK = ("matrix", "dirichlet")


def ece_reference(probs: np.ndarray, target: np.ndarray) -> float:
    """Top-label ECE, 15 equal-width bins ``(k/B, (k+1)/B]``, in float64, written out."""
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == target).astype(np.float64)
    index = np.clip(np.ceil(confidence * BINS).astype(int) - 1, 0, BINS - 1)
    total = 0.0
    for k in range(BINS):
        inside = index == k
        total += abs(confidence[inside].sum() - correct[inside].sum())
    return total / len(target)


def nll_reference(probs: np.ndarray, target: np.ndarray) -> float:
    """``-mean log max(p_y, 1e-12)``."""
    return float(-np.log(np.maximum(probs[np.arange(len(target)), target], 1e-12)).mean())


def overconfident(n: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 logits 2.5x a calibrated model's, and labels drawn from that model."""
    gen = torch.Generator().manual_seed(seed)
    latent = torch.randn(n, classes, generator=gen)
    latent[torch.arange(n), torch.randint(0, classes, (n,), generator=gen)] += 2.0
    target = torch.multinomial(torch.softmax(latent, 1), 1, generator=gen)[:, 0]
    return (2.5 * latent).float(), target


def calibrated(method: str, val, test) -> np.ndarray:
    """The test probabilities of ``method`` fitted on ``val`` (float64)."""
    fitted = get_calibrator(method).fit(*val)
    with torch.no_grad():
        return fitted(test[0].double()).exp().numpy()


def cv_nll_reference(method: str | None, logits: torch.Tensor, target: torch.Tensor) -> float:
    """5-fold CV NLL with the documented folds: rows sorted by label then logits, j mod 5.

    ``method=None`` is the identity (no fit).
    """
    z = logits.double().numpy()
    order = np.lexsort([*(z[:, c] for c in range(z.shape[1] - 1, -1, -1)), target.numpy()])
    z, y = torch.from_numpy(z[order]), target[order]
    fold = np.arange(len(y)) % 5
    total = 0.0
    for k in range(5):
        held = torch.from_numpy(fold == k)
        if method is None:
            log_p = torch.log_softmax(z[held], 1)
        else:
            with torch.no_grad():
                log_p = get_calibrator(method).fit(z[~held], y[~held])(z[held])
        total += float(-log_p.gather(1, y[held][:, None]).sum())
    return total / len(y)


# --- the metrics of one run ------------------------------------------------------------------


def test_probability_metrics_match_float64_formulas() -> None:
    probs, target = overconfident(500, 5, 0)
    p = torch.softmax(probs.double(), 1)
    p[:7, 0] = 0.0  # a zero probability, as binning gives: the NLL floors it at 1e-12
    p = p / p.sum(1, keepdim=True)
    target[:7] = 0
    found = runner.probability_metrics(p, target)
    x, y = p.numpy(), target.numpy()
    accuracy = float((x.argmax(1) == y).mean())
    assert found["acc"] == accuracy
    assert found["nll"] == pytest.approx(nll_reference(x, y), rel=1e-12)
    assert found["ece"] == pytest.approx(ece_reference(x, y), abs=1e-12)
    brier = float(((x - np.eye(5)[y]) ** 2).sum(1).mean())
    assert found["brier"] == pytest.approx(brier, rel=1e-12)
    assert found["conf_gap"] == pytest.approx(x.max(1).mean() - accuracy, rel=1e-12)


def test_the_arms_are_the_registrys_multiclass_methods() -> None:
    assert runner.posthoc_methods(10) == list(POSTHOC_METHODS)
    assert set(CALIBRATION_METHODS) - set(POSTHOC_METHODS) == {"beta"}
    assert "beta" in runner.posthoc_methods(2)
    assert set(POSTHOC_METRICS) >= {posthoc_key(m, "test_ece") for m in POSTHOC_METHODS}


def test_posthoc_metrics_score_every_method_and_the_cross_validated_choice() -> None:
    val, test = overconfident(150, 3, 1), overconfident(200, 3, 2)
    metrics, tags = runner.posthoc_metrics(val, test)
    y = test[1].numpy()
    for method in POSTHOC_METHODS:
        probs = calibrated(method, val, test)
        assert metrics[f"ph_{method}_test_ece"] == pytest.approx(ece_reference(probs, y), abs=1e-9)
        assert metrics[f"ph_{method}_test_nll"] == pytest.approx(nll_reference(probs, y), rel=1e-9)
        assert metrics[f"ph_{method}_test_acc"] == float((probs.argmax(1) == y).mean())
        assert metrics[f"ph_{method}_fallback"] == 0.0
    # The temperature arm is temperature scaling (ts_test_*), in float64.
    scaled = torch.softmax(test[0].double() / fit_temperature(*val), 1).numpy()
    assert metrics["ph_temperature_test_ece"] == pytest.approx(ece_reference(scaled, y), abs=1e-6)
    # The choice: the lowest CV NLL (the identity included), folds rebuilt here.
    for method in ("temperature", "vector", "histogram"):
        reference = cv_nll_reference(method, *val)
        assert metrics[f"ph_{method}_cv_nll"] == pytest.approx(reference, rel=1e-6)
    scores = {m: metrics[f"ph_{m}_cv_nll"] for m in POSTHOC_METHODS}
    scores["none"] = cv_nll_reference(None, *val)
    chosen = min(scores, key=lambda m: math.inf if math.isnan(scores[m]) else scores[m])
    assert tags == {runner.POSTHOC_BEST_TAG: chosen}
    assert chosen != "none"  # overconfident logits: some method beats the identity
    assert metrics["ph_best_cv_nll"] == scores[chosen]
    # Refitted on all rows (in their canonical order): the method's own fit, to rounding.
    assert metrics["ph_best_test_ece"] == pytest.approx(metrics[f"ph_{chosen}_test_ece"], rel=1e-9)
    assert metrics["ph_best_test_nll"] == pytest.approx(metrics[f"ph_{chosen}_test_nll"], rel=1e-9)
    assert [m for m in POSTHOC_METHODS if metrics[f"ph_{m}_chosen"] == 1.0] == [chosen]


def test_a_method_that_cannot_help_is_logged_as_a_fallback_not_a_warning() -> None:
    # 30 validation samples of 6 classes: matrix scaling and Dirichlet calibration have 42
    # parameters and fall back to the identity (their warning would fail this test).
    val, test = overconfident(30, 6, 3), overconfident(200, 6, 4)
    metrics, _ = runner.posthoc_metrics(val, test)
    identity = torch.softmax(test[0].double(), 1).numpy()
    for method in ("matrix", "dirichlet"):
        assert metrics[f"ph_{method}_fallback"] == 1.0
        expected = ece_reference(identity, test[1].numpy())
        assert metrics[f"ph_{method}_test_ece"] == pytest.approx(expected, abs=1e-12)
    assert metrics["ph_temperature_fallback"] == 0.0


# --- claim 8's tables ------------------------------------------------------------------------


def t_ci(d, level: float = 0.95) -> tuple[float, float]:
    """The two-sided Student-t interval of the mean of ``d``, written out."""
    d = np.asarray(d, dtype=np.float64)
    half = scipy_stats.t.ppf((1 + level) / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return d.mean() - half, d.mean() + half


def posthoc_rows(ce_best_ece: list[float]) -> dict[str, dict[str, list[float]]]:
    """A claim-8 table of 5 seeds with the post-hoc metrics of CE and of two losses."""
    ce = {
        "rep/ts_test_ece": [0.020, 0.022, 0.019, 0.021, 0.020],
        posthoc_key("vector", "test_ece"): [0.010, 0.012, 0.009, 0.011, 0.010],
        posthoc_key("vector", "test_nll"): [0.30] * 5,
        posthoc_key("vector", "fallback"): [0.0] * 5,
        posthoc_key("vector", "chosen"): [1.0, 1.0, 1.0, 0.0, 0.0],
        posthoc_key("matrix", "test_ece"): [0.040, 0.020, 0.030, 0.010, 0.050],
        posthoc_key("matrix", "test_nll"): [0.40] * 5,
        posthoc_key("matrix", "fallback"): [1.0, 1.0, 0.0, 0.0, 0.0],
        posthoc_key("matrix", "chosen"): [0.0, 0.0, 0.0, 1.0, 0.0],
        BEST_ECE: ce_best_ece,
        "rep/ph_best_test_nll": [0.3] * 5,
        BEST_CV_NLL: [0.30] * 5,
    }
    label_smoothing = {  # lowest test ECE after its best method, but not the best on validation
        BEST_ECE: [0.001, 0.002, 0.001, 0.002, 0.001],
        BEST_CV_NLL: [0.35] * 5,
        posthoc_key("temperature", "chosen"): [1.0] * 5,
    }
    focal = {
        BEST_ECE: [0.018, 0.021, 0.017, 0.020, 0.019],
        BEST_CV_NLL: [0.25] * 5,
        posthoc_key("isotonic", "chosen"): [1.0] * 5,
    }
    return {"ce": ce, "label_smoothing": label_smoothing, "focal_3": focal}


def table_of(rows):
    return {v: {k: mean_std(values) for k, values in m.items()} for v, m in rows.items()}


def test_claim8_posthoc_tables_decide_over_the_paired_seeds() -> None:
    rows = posthoc_rows([0.010, 0.012, 0.009, 0.012, 0.010])
    lines = posthoc_markdown(table_of(rows))
    text = "\n".join(lines)
    assert f"ECE margin ±{ECE_MARGIN}" in text
    (vector,) = [line for line in lines if line.startswith("| vector |")]
    d = np.subtract(rows["ce"][posthoc_key("vector", "test_ece")], rows["ce"]["rep/ts_test_ece"])
    low, high = t_ci(d)
    assert high < 0  # the reference: below CE + TS beyond the noise
    assert f"| yes ({d.mean():+.4f} [{low:+.4f}, {high:+.4f}]) |" in vector
    assert "| 0 of 5 | 3 of 5 |" in vector
    (matrix,) = [line for line in lines if line.startswith("| matrix |")]
    d = np.subtract(rows["ce"][posthoc_key("matrix", "test_ece")], rows["ce"]["rep/ts_test_ece"])
    low, high = t_ci(d)
    assert low < 0 < high  # neither side beyond the noise, nor inside the margin: undecided
    assert "| undecided, needs" in matrix
    assert "| 2 of 5 | 1 of 5 |" in matrix
    assert "| best (vector 3, matrix 1, none 1) |" in text
    # Each loss + its best method against CE + its best; the best loss is chosen on the
    # validation split (focal_3's CV NLL), not on the test ECE (label smoothing's is lowest).
    assert best_loss(table_of(rows)) == "focal_3"
    d = np.subtract(rows["focal_3"][BEST_ECE], rows["ce"][BEST_ECE])
    low, high = t_ci(d)
    assert low > 0  # focal + best is above CE + best beyond the noise
    assert (
        f"ECE(focal_3 + best) < ECE(ce + best): no ({d.mean():+.4f} [{low:+.4f}, {high:+.4f}])"
        in text
    )
    assert "| label_smoothing | temperature 5 |" in text
    assert "| focal_3 | isotonic 5 |" in text


def test_runs_without_posthoc_metrics_leave_the_claim8_text_as_it_was() -> None:
    rows = posthoc_rows([0.01] * 5)
    old = {v: {k: x for k, x in m.items() if not k.startswith("rep/ph_")} for v, m in rows.items()}
    assert posthoc_markdown(table_of(old)) == []
    assert not any("Post-hoc" in line for line in calibration_markdown(table_of(old)))
    assert any("Post-hoc arms" in line for line in calibration_markdown(table_of(rows)))
    assert set(POSTHOC_METRICS) <= set(CLAIM_8.extra_metrics)
    assert not set(POSTHOC_METRICS) & {key for key, _ in CLAIM_8.metrics}  # columns unchanged


# --- reuse across code versions ---------------------------------------------------------------


def test_layout_fingerprints_accept_moved_class_paths_only(tmp_path) -> None:
    new = (
        "model:\n  backbone:\n    class_path: lightning_losses.lightning.CNN1D\n"
        "  criterion:\n    class_path: lightning_losses.CrossEntropyLoss\n  lr: 0.01\n"
    )
    config = tmp_path / "c.yaml"
    config.write_text(new)
    variant = Variant("v", str(config), ("--seed_everything=1",))

    def sha(text: str, overrides: tuple[str, ...] = variant.overrides) -> str:
        digest = hashlib.sha1(text.encode())
        for override in overrides:
            digest.update(b"\0" + override.encode())
        return digest.hexdigest()[:12]

    accepted = runner.layout_fingerprints(variant)
    old = new.replace("lightning_losses.lightning.CNN1D", "lightning_losses.backbones.CNN1D")
    assert {variant.fingerprint(), sha(new), sha(old)} <= accepted
    assert sha(old.replace("lr: 0.01", "lr: 0.02")) not in accepted
    assert sha(old, ("--seed_everything=2",)) not in accepted
    assert sha(new.replace("CNN1D", "MLP")) not in accepted


def test_moved_class_paths_are_written_anew_in_a_saved_config() -> None:
    saved = {
        "backbone": {"class_path": "lightning_losses.backbones.CNN1D", "init_args": {"c": 1}},
        "callbacks": [{"class_path": "lightning_losses.mnist1d.MNIST1DDataModule"}],
        "note": "lightning_losses.backbones.CNN1D",  # not a class path: left alone
    }
    assert runner._moved_class_paths(saved) == {
        "backbone": {"class_path": "lightning_losses.lightning.CNN1D", "init_args": {"c": 1}},
        "callbacks": [{"class_path": "lightning_losses.data.MNIST1DDataModule"}],
        "note": "lightning_losses.backbones.CNN1D",
    }


def test_post_fit_only_and_fresh_exclude_each_other(capsys) -> None:
    assert parse_args(["--claims", "8", "--post-fit-only"]).post_fit_only
    assert parse_args(["--claims", "8", "--reuse-trained"]).reuse_trained
    for pair in (["--fresh", "--reuse-trained"], ["--post-fit-only", "--reuse-trained"]):
        with pytest.raises(SystemExit) as exited:
            parse_args(["--claims", "8", *pair])
        assert exited.value.code == 2
        assert "pick one" in capsys.readouterr().err
    with pytest.raises(SystemExit) as raised:
        parse_args(["--claims", "8", "--post-fit-only", "--fresh"])
    assert raised.value.code == 2
    assert "pick one" in capsys.readouterr().err


def shrunk_ce(folder: Path, test_samples: int = 200) -> Variant:
    """Claim 8's CE arm on 500 generated sequences, 200 test and 100 validation ones, 2 epochs."""
    overrides = (
        "--data.init_args.num_samples=500",
        f"--data.init_args.test_samples={test_samples}",
        "--data.init_args.val_samples=100",
        f"--data.init_args.cache_dir={folder / 'cache'}",
    )
    return Variant("ce", str(ROOT / "configs/mnist1d_ce.yaml"), overrides, epochs=2, label="ce")


@pytest.mark.slow
def test_post_fit_only_completes_runs_of_another_code_version(
    tmp_path, monkeypatch, capsys
) -> None:
    from mlflow.tracking import MlflowClient

    from lightning_losses.data.mnist1d import MNIST1DDataModule
    from lightning_losses.lightning.classifier import ClassifierModule

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    claim = dataclasses.replace(CLAIM_8, fixed_variants=(shrunk_ce(tmp_path),))
    out = tmp_path / "reports"
    out.mkdir()

    def invocation(code: str, **options):
        monkeypatch.setattr(version, "code_version", lambda: code)
        return reproduce_claim(claim, seeds=2, scale=1.0, tracking_uri=uri, out=out, **options)

    # Runs of an older code version, which computed no post-hoc arms.
    with monkeypatch.context() as older:
        older.setattr(runner, "posthoc_metrics", lambda val, test: ({}, {}))
        first = invocation("0.1.0+src.aaaaaaaaaaaa")
    assert not first.failures
    runs = dict(first.runs)
    stored = {r: client.get_run(r).data.metrics for r in runs.values()}
    assert not any(key.startswith("rep/ph_") for m in stored.values() for key in m)
    assert "Post-hoc arms" not in write_report([first], out, ["old"]).read_text()
    # A run whose checkpoint does not give its stored numbers is not completed.
    run_1 = runs[("ce", 1)]
    client.log_metric(run_1, "rep/test_ece", stored[run_1]["rep/test_ece"] + 0.5, step=1)
    with pytest.raises(ValueError, match=r"does not reproduce its stored metrics \(rep/test_ece"):
        runner.complete_post_fit(client, run_1, runner.runs_folder(uri, out))
    assert not any(k.startswith("rep/ph_") for k in client.get_run(run_1).data.metrics)
    client.log_metric(run_1, "rep/test_ece", stored[run_1]["rep/test_ece"], step=2)
    # Another code version: without --post-fit-only nothing would be reused; with it, the
    # old runs are completed from their checkpoints and nothing is trained.
    capsys.readouterr()
    second = invocation("0.1.0+src.bbbbbbbbbbbb", post_fit_only=True)
    assert not second.failures
    # The progress lines say which runs were completed: both, and only by this invocation.
    assert capsys.readouterr().out.count("(reused, post-fit metrics completed in ") == 2
    assert second.runs == runs
    assert second.reused == 2
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == 2
    for (_, seed), run_id in runs.items():
        run = client.get_run(run_id)
        assert run.data.tags[version.CODE_VERSION_TAG] == "0.1.0+src.aaaaaaaaaaaa"
        assert run.data.tags[runner.POST_FIT_VERSION_TAG] == "0.1.0+src.bbbbbbbbbbbb"
        for key, value in stored[run_id].items():  # nothing it had was logged again
            if key != "rep/test_ece" or seed == 0:
                assert run.data.metrics[key] == value, key
        assert len(client.get_metric_history(run_id, "rep/test_acc")) == 1
        # The new numbers: every method fitted on the checkpoint's validation logits.
        last = next(tmp_path.rglob(f"{run_id}/**/last.ckpt"))
        model = ClassifierModule.load_from_checkpoint(last, weights_only=True).eval()
        dm = MNIST1DDataModule(
            seed=seed,
            num_samples=500,
            test_samples=200,
            val_source="generated",
            val_samples=100,
            cache_dir=str(tmp_path / "cache"),
        )
        with torch.no_grad():
            val, test = ((model(x), y) for x, y in (dm.dataset(s).tensors for s in ("val", "test")))
            val, test = list(val), list(test)
        for method in POSTHOC_METHODS:
            # 100 validation samples of 10 classes: matrix scaling and Dirichlet calibration
            # (110 parameters) fall back, with a warning here, as a metric in the run.
            with package_warns("falls back to the identity", expected=method in FALL_BACK):
                probs = calibrated(method, val, test)
            expected = ece_reference(probs, test[1].numpy())
            found = run.data.metrics[f"rep/ph_{method}_test_ece"]
            assert found == pytest.approx(expected, abs=1e-9), method
            assert run.data.metrics[f"rep/ph_{method}_fallback"] == float(method in FALL_BACK)
        chosen = run.data.tags[runner.POSTHOC_BEST_TAG]
        assert chosen in {"none", *POSTHOC_METHODS}
    report = write_report([second], out, ["completed"]).read_text()
    assert "Post-hoc arms" in report
    assert "| best (" in report
    appendix = report[report.index("### Claim 8: per-seed values") :]
    assert "`rep/ph_best_test_ece`" in appendix
    # Completed runs are not completed again by a later version.
    third = invocation("0.1.0+src.cccccccccccc", post_fit_only=True)
    assert third.runs == runs
    assert "post-fit metrics completed" not in capsys.readouterr().out
    for run_id in runs.values():
        assert len(client.get_metric_history(run_id, "rep/ph_best_test_ece")) == 1
        tags = client.get_run(run_id).data.tags
        assert tags[runner.POST_FIT_VERSION_TAG] == "0.1.0+src.bbbbbbbbbbbb"
    # A variant with no run to complete is a failure, and nothing is trained.
    other = dataclasses.replace(claim, fixed_variants=(shrunk_ce(tmp_path, test_samples=201),))
    monkeypatch.setattr(version, "code_version", lambda: "0.1.0+src.dddddddddddd")
    missing = reproduce_claim(
        other, seeds=1, scale=1.0, tracking_uri=uri, out=out, post_fit_only=True
    )
    assert len(missing.failures) == 1
    assert "--post-fit-only trains nothing" in missing.failures[0]
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == 2
    # --reuse-trained: the same reuse, and the variant with no run of any version is trained
    # (by this code version); the completed runs are reused as they are.
    added = dataclasses.replace(shrunk_ce(tmp_path, test_samples=210), name="ce_210")
    both = dataclasses.replace(claim, fixed_variants=(*claim.fixed_variants, added))
    mixed = reproduce_claim(
        both, seeds=1, scale=1.0, tracking_uri=uri, out=out, post_fit_only=True, train_missing=True
    )
    assert not mixed.failures
    assert mixed.reused == 1
    assert mixed.runs[("ce", 0)] == runs[("ce", 0)]
    assert set(mixed.runs) == {("ce", 0), ("ce_210", 0)}
    tags = client.get_run(mixed.runs[("ce_210", 0)]).data.tags
    assert tags[version.CODE_VERSION_TAG] == "0.1.0+src.dddddddddddd"
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == 3
