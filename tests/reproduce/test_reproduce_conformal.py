"""Claim 10 (prediction sets on claim 8's MNIST-1D CNN): its measures, verdict and runs.

The measures are recomputed with the scores written out here from their papers' formulas (in
numpy), the threshold as the ``ceil((n + 1)(1 - alpha))``-th smallest calibration score
(integer arithmetic), coverage and set size as plain means; the verdict's intervals with
SciPy's Student t. A shrunk claim runs end to end through ``reproduce``'s pipeline on a real
SQLite MLflow store: claim 8's fits are reused, not trained again, and scored from their
checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.paths import ROOT
from scipy import stats as scipy_stats

from lightning_losses.reproduce import conformal_claim as cc
from lightning_losses.reproduce import reproduce_claim, version
from lightning_losses.reproduce.claims import CLAIM_8, CLAIMS
from lightning_losses.reproduce.report import mean_std, write_report
from lightning_losses.reproduce.spec import MIXED, SUPPORTED, UNDECIDED, Variant, verdict

STRATA = ((0, 1), (2, 3), (4, 10), (11, 100), (101, 1000))

# --- the measures, written out ---------------------------------------------------------------


def plain_scores(probs: np.ndarray, u: np.ndarray, score: str) -> np.ndarray:
    """Every label's score ``[N, C]``: ``r`` the 0-based rank of the label in its row.

    LAC ``1 - p_y``; APS ``sum of the r + 1 largest - U p_y``; RAPS adds
    ``0.01 max(r + 1 - 1, 0)``; SAPS ``(1 - U) p_max`` at rank 0, else
    ``p_max + 0.2 (r - U)``.
    """
    if score == "lac":
        return 1.0 - probs
    order = np.argsort(-probs, axis=1, kind="stable")
    ordered = np.take_along_axis(probs, order, axis=1)
    rank = np.arange(probs.shape[1], dtype=np.float64)[None, :]
    u = u[:, None]
    if score == "saps":
        top = ordered[:, :1]
        ranked = np.where(rank == 0, (1.0 - u) * top, top + 0.2 * (rank - u))
    else:
        ranked = np.cumsum(ordered, axis=1) - u * ordered
        if score == "raps":
            ranked = ranked + 0.01 * np.maximum(rank + 1 - 1, 0)
    scores = np.empty_like(ranked)
    np.put_along_axis(scores, order, ranked, axis=1)
    return scores


def plain_threshold(scores: np.ndarray) -> float:
    """The ``k``-th smallest of ``n`` scores, ``k = ceil((n + 1) 9 / 10)`` in integers."""
    k = -(-(len(scores) + 1) * 9 // 10)
    return float(np.sort(scores)[k - 1])


def plain_arm(cal, test) -> dict[str, float]:
    """Each score's threshold on ``cal``, coverage, size, SSCV and empty rate on ``test``."""
    (p, y, u), (tp, ty, tu) = cal, test
    found: dict[str, float] = {"n": float(len(y))}
    for score in ("lac", "aps", "raps", "saps"):
        q = plain_threshold(plain_scores(p, u, score)[np.arange(len(y)), y])
        inside = plain_scores(tp, tu, score) <= q
        covered = inside[np.arange(len(ty)), ty]
        size = inside.sum(axis=1)
        gaps = [
            abs(covered[(size >= a) & (size <= b)].mean() - 0.9)
            for a, b in STRATA
            if ((size >= a) & (size <= b)).any()
        ]
        found |= {
            f"{score}_q": q,
            f"{score}_coverage": float(covered.mean()),
            f"{score}_size": float(size.mean()),
            f"{score}_sscv": float(max(gaps)),
            f"{score}_empty": float((size == 0).mean()),
        }
    return found


def plain_draws(n_val: int, n_test: int, seed: int):
    generator = torch.Generator().manual_seed(10_000 + seed)
    return [
        torch.rand(n, generator=generator, dtype=torch.float64).numpy()
        for n in (n_val,) * 2 + (n_test,)
    ]


def softmax(logits: torch.Tensor, temperature: float = 1.0) -> np.ndarray:
    return torch.softmax(logits.double() / temperature, dim=1).numpy()


def nll(logits: torch.Tensor, target: torch.Tensor, temperature: float) -> float:
    p = softmax(logits, temperature)
    return float(-np.log(p[np.arange(len(target)), target.numpy()]).mean())


def expected_metrics(val, test, seed: int) -> tuple[dict[str, float], np.ndarray]:
    """The run's measures written out, with the stored temperature; and the TS half."""
    (vz, vy), (tz, ty) = val, test
    split, u_val, u_test = plain_draws(len(vy), len(ty), seed)
    plain = plain_arm((softmax(vz), vy.numpy(), u_val), (softmax(tz), ty.numpy(), u_test))
    return {f"conf_{k}": v for k, v in plain.items()}, split < 0.5


def check_run_metrics(found: dict[str, float], val, test, seed: int, prefix: str = "") -> None:
    """The stored (or returned) measures of one run against the written-out ones."""
    (vz, vy), (tz, ty) = val, test
    expected, part = expected_metrics(val, test, seed)
    _, u_val, u_test = plain_draws(len(vy), len(ty), seed)
    temperature = found[f"{prefix}conf_ts_temperature"]
    # T minimises the NLL of the other half (no better value 2% either side).
    rest = torch.from_numpy(~part)
    at = [nll(vz[rest], vy[rest], temperature * f) for f in (1.0, 0.98, 1.02)]
    assert at[0] <= min(at[1:]) + 1e-12
    scaled = plain_arm(
        (softmax(vz[torch.from_numpy(part)], temperature), vy.numpy()[part], u_val[part]),
        (softmax(tz, temperature), ty.numpy(), u_test),
    )
    expected |= {f"conf_ts_{k}": v for k, v in scaled.items()}
    assert expected["conf_ts_n"] == part.sum() < len(vy)
    for key, value in expected.items():
        stored = found[prefix + key]
        if key.endswith("_q"):
            assert stored == pytest.approx(value, rel=1e-12, abs=1e-12), key
        else:
            assert stored == pytest.approx(value, abs=1e-12), key


def overconfident(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 logits of 10 classes, 3x a calibrated model's, and labels drawn from it."""
    gen = torch.Generator().manual_seed(seed)
    latent = torch.randn(n, 10, generator=gen)
    latent[torch.arange(n), torch.randint(0, 10, (n,), generator=gen)] += 2.5
    target = torch.multinomial(torch.softmax(latent, 1), 1, generator=gen)[:, 0]
    return (3.0 * latent).float(), target


def test_conformal_metrics_are_the_written_out_measures() -> None:
    val, test = overconfident(400, 0), overconfident(600, 1)
    found = cc.conformal_metrics(val, test, seed=3)
    check_run_metrics(found, val, test, seed=3)
    # Every key the claim logs, and nothing else.
    keys = {f"rep/{key}" for key in found}
    assert keys == set(cc.CLAIM_10.extra_metrics) | {k for k, _ in cc.COLUMNS[1:]}
    # The coverage is near 0.9 on exchangeable data, the sets not trivially all labels.
    for score in cc.SCORES:
        assert 0.8 < found[f"conf_{score}_coverage"] < 1.0
        assert 0.5 < found[f"conf_{score}_size"] < 9.0


def test_the_draws_depend_on_the_seed_only() -> None:
    a, b = cc.draws(50, 70, seed=1), cc.draws(50, 70, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(cc.draws(50, 70, seed=2)[0], a[0])
    # Not the stream that seed_everything(seed) gave the model's initial weights.
    model_stream = torch.rand(50, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert not torch.equal(model_stream, a[0])


# --- the claim and its verdict ---------------------------------------------------------------


def test_claim10_runs_claim8s_arms_with_their_fingerprints() -> None:
    assert CLAIMS[10] is cc.CLAIM_10
    assert cc.CLAIM_10.after_runs is cc.score_runs
    names = [v.name for v in cc.CLAIM_10.variants]
    assert names == ["ce", "focal_3", "flsd_53", "label_smoothing", "mbls"]
    assert {row[1] for row in cc.LOSS_ROWS} == set(names)
    for variant in cc.CLAIM_10.variants:
        same = CLAIM_8.variant(variant.name)
        assert (variant.fingerprint(), variant.epochs) == (same.fingerprint(), same.epochs)
        assert variant.overrides == ()
    assert cc.CLAIM_10.seeds(3) == CLAIM_8.seeds(3) == 10


def table_of(**rows: dict[str, list[float]]):
    return {v: {k: mean_std(values) for k, values in m.items()} for v, m in rows.items()}


def key(score: str, measure: str, scaled: bool = False) -> str:
    return f"rep/conf_{'ts_' if scaled else ''}{score}_{measure}"


def t_interval(d, level: float) -> tuple[float, float]:
    d = np.asarray(d, dtype=np.float64)
    half = scipy_stats.t.ppf((1 + level) / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return d.mean() - half, d.mean() + half


NOISE = [0.004, -0.006, 0.002, 0.008, -0.003, -0.001, 0.005, -0.007, 0.001, -0.003]


def ce_rows(coverage: dict[str, float], sizes: dict[str, float]) -> dict[str, list[float]]:
    """10 seeds of CE: each score's coverage and size, the noise shared by the seeds."""
    rows = {key(s, "coverage"): [c + e for e in NOISE] for s, c in coverage.items()}
    rows |= {
        key(s, "size"): [z + 3 * e * (i + 1) for e in NOISE]
        for i, (s, z) in enumerate(sizes.items())
    }
    return rows


COVERED = {"lac": 0.901, "aps": 0.902, "raps": 0.899, "saps": 0.903}
SIZES = {"lac": 1.00, "aps": 1.40, "raps": 1.25, "saps": 1.10}


def test_a_is_tost_of_each_coverage_against_0_9() -> None:
    table = table_of(ce=ce_rows(COVERED, SIZES))
    conditions = cc.coverage_conditions(table)
    assert [c.text for c in conditions] == [f"coverage(ce, {s}) ~ 0.9 ± 0.02" for s in cc.SCORES]
    for condition, (score, value) in zip(conditions, COVERED.items(), strict=True):
        d = [value + e - 0.9 for e in NOISE]
        low, high = t_interval(d, 0.90)  # two one-sided tests at 5%
        assert -0.02 < low < high < 0.02
        decision = condition.decision
        assert (decision.tost_low, decision.tost_high) == pytest.approx((low, high), abs=1e-12)
        assert (decision.low, decision.high) == pytest.approx(t_interval(d, 0.95), abs=1e-12)
        assert condition.outcome == "holds", score
    # 0.95 on every seed (give or take 0.008): beyond the margin, beyond the noise: fails.
    far = table_of(ce=ce_rows({**COVERED, "saps": 0.95}, SIZES))
    assert [c.outcome for c in cc.coverage_conditions(far)] == ["holds"] * 3 + ["fails"]
    # A wide spread around 0.91: neither inside the margin nor off 0.9 beyond the noise.
    wide = ce_rows(COVERED, SIZES)
    wide[key("aps", "coverage")] = [0.91 + 5 * e for e in NOISE]
    d = [0.91 + 5 * e - 0.9 for e in NOISE]
    low, high = t_interval(d, 0.90)
    assert high > 0.02
    assert t_interval(d, 0.95)[0] < 0
    assert cc.coverage_conditions(table_of(ce=wide))[1].outcome == UNDECIDED


def test_b_is_a_paired_t_test_of_the_set_sizes_over_the_seeds() -> None:
    rows = ce_rows(COVERED, SIZES)
    conditions = cc.size_conditions(table_of(ce=rows))
    assert [c.text for c in conditions] == [
        "size(ce, raps) < size(ce, aps)",
        "size(ce, saps) < size(ce, raps)",
    ]
    for condition, (smaller, larger) in zip(conditions, cc.SMALLER, strict=True):
        d = np.subtract(rows[key(smaller, "size")], rows[key(larger, "size")])
        low, high = t_interval(d, 0.95)
        assert high < 0
        assert condition.decision.difference == pytest.approx(d.mean(), abs=1e-12)
        assert (condition.decision.low, condition.decision.high) == pytest.approx((low, high))
        test = scipy_stats.ttest_rel(rows[key(smaller, "size")], rows[key(larger, "size")])
        assert test.pvalue < 0.05
        assert condition.outcome == "holds"
    assert verdict(cc.conformal_conditions(table_of(ce=rows))) == SUPPORTED
    # SAPS above RAPS beyond the noise: (b) half fails, the claim is mixed.
    rows[key("saps", "size")] = [v + 0.3 for v in rows[key("raps", "size")]]
    conditions = cc.conformal_conditions(table_of(ce=rows))
    assert [c.outcome for c in conditions] == ["holds"] * 5 + ["fails"]
    assert verdict(conditions) == MIXED
    # The other losses' numbers never enter the verdict.
    assert all("(ce," in c.text for c in conditions)
    assert verdict(cc.conformal_conditions(table_of(focal_3=ce_rows(COVERED, SIZES)))) != SUPPORTED


def loss_rows(shift: float) -> dict[str, list[float]]:
    """LAC and APS numbers of a loss, its sizes ``shift`` from CE's, and its TS arm."""
    rows = {}
    for scaled in (False, True):
        for score, size in (("lac", 1.0), ("aps", 1.4)):
            grow = shift - (0.1 if scaled else 0.0)
            rows[key(score, "size", scaled)] = [size + grow + e for e in NOISE]
            rows[key(score, "coverage", scaled)] = [0.9 + e for e in NOISE]
            rows[key(score, "sscv", scaled)] = [0.05 + e for e in NOISE]
    return rows


def test_c_tables_each_loss_against_ce_outside_the_verdict() -> None:
    ce, focal, mbls = loss_rows(0.0), loss_rows(0.2), loss_rows(0.001)
    mbls[key("lac", "size")] = [1.0 + 0.001 + 0.3 * e for e in NOISE]
    table = table_of(ce=ce, focal_3=focal, mbls=mbls)
    lines = cc.losses_markdown(table)
    text = "\n".join(lines)
    assert (
        "| loss | LAC coverage | LAC size | LAC SSCV | APS coverage | APS size | APS SSCV |" in text
    )
    cut = lines.index("| loss | LAC size below CE's | APS size below CE's |")
    numbers = {line.split(" | ")[0][2:]: line for line in lines[:cut] if line.startswith("| ")}
    marks = {line.split(" | ")[0][2:]: line for line in lines[cut:] if line.startswith("| ")}
    assert {"CE", "CE + TS", "focal (gamma 3)", "MbLS"} <= set(numbers)
    assert "CE" not in marks  # CE against itself: no row
    assert "FLSD-53" not in text  # no runs: no row
    sizes = focal[key("lac", "size")]
    assert f"| {np.mean(sizes):.4f} ± {np.std(sizes, ddof=1):.4f} |" in numbers["focal (gamma 3)"]
    # CE + TS reads the CE runs' scaled arm, against the CE runs' softmax, paired by seed.
    d = np.subtract(ce[key("aps", "size", True)], ce[key("aps", "size")])
    low, high = t_interval(d, 0.95)
    assert f"yes ({d.mean():+.4f} [{low:+.4f}, {high:+.4f}]) |" in marks["CE + TS"]
    # Focal's sets larger beyond the noise: no.
    d = np.subtract(focal[key("lac", "size")], ce[key("lac", "size")])
    low, high = t_interval(d, 0.95)
    assert f"| focal (gamma 3) | no ({d.mean():+.4f} [{low:+.4f}, {high:+.4f}])" in text
    # MbLS's LAC sets within 0.05 of CE's beyond the noise: equivalent, not smaller.
    d = np.subtract(mbls[key("lac", "size")], ce[key("lac", "size")])
    low, high = t_interval(d, 0.90)
    assert -0.05 < low < high < 0.05
    assert marks["MbLS"].startswith("| MbLS | no, equivalent within ±0.05 (")
    assert text.endswith("Smallest mean set size: LAC CE + TS (0.9000); APS CE + TS (1.3000).")
    assert cc.losses_markdown({}) == []
    # The section names how the sets were made; the verdict ignores (c).
    section = "\n".join(cc.conformal_markdown(table))
    assert "torch.Generator().manual_seed(10000 + seed)" in section
    assert "k_reg 1, lam 0.01, weight 0.2" in section


# --- a shrunk claim end to end ---------------------------------------------------------------

DATA = {"num_samples": 500, "test_samples": 300, "val_samples": 200}


def shrunk(name: str, config: str, folder: Path) -> Variant:
    """A claim-8 arm on 500 generated sequences, 300 test and 200 validation ones, 2 epochs."""
    overrides = (
        *(f"--data.init_args.{k}={v}" for k, v in DATA.items()),
        f"--data.init_args.cache_dir={folder / 'cache'}",
    )
    return Variant(name, str(ROOT / config), overrides, epochs=2, label=name)


def checkpoint_logits(folder: Path, run_id: str, seed: int):
    """The validation and test logits of a run's last checkpoint, its data built here."""
    from lightning_losses.data.mnist1d import MNIST1DDataModule
    from lightning_losses.lightning.classifier import ClassifierModule

    last = next(folder.rglob(f"{run_id}/**/last.ckpt"))
    model = ClassifierModule.load_from_checkpoint(last, weights_only=True).eval()
    data = MNIST1DDataModule(
        seed=seed, val_source="generated", cache_dir=str(folder / "cache"), **DATA
    )
    with torch.no_grad():
        return [(model(x), y) for x, y in (data.dataset(s).tensors for s in ("val", "test"))]


@pytest.mark.slow
def test_shrunk_claim10_scores_claim8s_runs_from_their_checkpoints(
    tmp_path, monkeypatch, capsys
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    arms = (
        shrunk("ce", "configs/mnist1d_ce.yaml", tmp_path),
        shrunk("focal_3", "configs/mnist1d_focal.yaml", tmp_path),
    )
    out = tmp_path / "reports"
    out.mkdir()

    def invocation(claim, code: str, **options):
        monkeypatch.setattr(version, "code_version", lambda: code)
        shrunk_claim = dataclasses.replace(claim, fixed_variants=arms)
        return reproduce_claim(
            shrunk_claim, seeds=2, scale=1.0, tracking_uri=uri, out=out, **options
        )

    trained = invocation(CLAIM_8, "0.1.0+src.aaaaaaaaaaaa")
    assert not trained.failures
    assert not any(
        "rep/conf_lac_size" in client.get_run(r).data.metrics for r in trained.runs.values()
    )
    # Claim 10 reuses claim 8's runs (the same fingerprints), trains nothing, scores each.
    capsys.readouterr()
    first = invocation(cc.CLAIM_10, "0.1.0+src.aaaaaaaaaaaa")
    assert not first.failures
    assert first.runs == trained.runs
    assert first.reused == 4
    assert "claim 10: prediction sets of 4 run(s) scored" in capsys.readouterr().out
    experiments = [e.experiment_id for e in client.search_experiments()]
    assert len(client.search_runs(experiments)) == 4
    for (_, seed), run_id in first.runs.items():
        run = client.get_run(run_id)
        assert run.data.tags[cc.SCORED_BY_TAG] == "0.1.0+src.aaaaaaaaaaaa"
        val, test = checkpoint_logits(tmp_path, run_id, seed)
        check_run_metrics(run.data.metrics, val, test, seed, prefix="rep/")
    # The same code version scores nothing again.
    again = invocation(cc.CLAIM_10, "0.1.0+src.aaaaaaaaaaaa")
    assert again.runs == first.runs
    assert "prediction sets of" not in capsys.readouterr().out
    # Another code version with --post-fit-only: the same runs, scored again by it, the same
    # numbers (the draws are seeded, the checkpoint unchanged).
    later = invocation(cc.CLAIM_10, "0.1.0+src.bbbbbbbbbbbb", post_fit_only=True)
    assert later.runs == first.runs
    assert "claim 10: prediction sets of 4 run(s) scored" in capsys.readouterr().out
    for run_id in later.runs.values():
        run = client.get_run(run_id)
        assert run.data.tags[cc.SCORED_BY_TAG] == "0.1.0+src.bbbbbbbbbbbb"
        assert run.data.tags[version.CODE_VERSION_TAG] == "0.1.0+src.aaaaaaaaaaaa"
        history = client.get_metric_history(run_id, "rep/conf_saps_size")
        assert len(history) == 2
        assert history[0].value == history[1].value
    # The report: the verdict's six conditions, every score on CE, and (c).
    report = write_report([later], out, ["shrunk"]).read_text()
    section = report[report.index("## Claim 10") : report.index("## Appendix")]
    for score in cc.SCORES:
        assert f"coverage(ce, {score}) ~ 0.9 ± 0.02" in section
    assert "size(ce, saps) < size(ce, raps)" in section
    for label in ("CE", "CE + TS", "focal (gamma 3)"):
        assert f"\n| {label} | " in section
    appendix = report[report.index("### Claim 10: per-seed values") :]
    for name in ("rep/conf_ts_raps_q", "rep/conf_ts_temperature", "rep/conf_aps_coverage_gap"):
        assert f"| ce | `{name}` |" in appendix
    for (variant, seed), run_id in later.runs.items():
        stored = client.get_run(run_id).data.metrics["rep/conf_lac_size"]
        assert later.table[variant]["rep/conf_lac_size"].values[seed] == stored
