"""``lightning-losses reproduce``: verdict rules, claim 1's numbers, and claim 3 end to end.

The verdict rules are checked against Student's t intervals and TOST computed here with SciPy.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats as scipy_stats
from scipy.optimize import minimize, minimize_scalar

from lightning_losses.cli.fit import main as cli_main
from lightning_losses.reproduce import reproduce
from lightning_losses.reproduce.claims import CLAIM_3, CLAIMS, gamma_ce_conditions, scale_conditions
from lightning_losses.reproduce.report import aggregate, cell, mean_std
from lightning_losses.reproduce.spec import (
    MIXED,
    NOT_SUPPORTED,
    SUPPORTED,
    UNDECIDED,
    Condition,
    Variant,
    against,
    compare,
    config_path,
    load_experiment,
    load_variants,
    mean_of,
    verdict,
    verdict_text,
)
from lightning_losses.reproduce.threshold import analysis

X = np.array([-0.25, 0.0, 0.25])
L = np.array([-1.0, -1.0, 1.0])


# --- verdict rules on synthetic numbers ---------------------------------------------------------


GAMMA = ("gamma_0.5", "gamma_annealed", "tailr_threshold")


def _table(ce: dict[str, list[float]], other: dict[str, list[float]]) -> dict:
    """A claim-3 table from per-seed values: CE, and the same values for every gamma variant."""
    table = {"ce": {key: mean_std(values) for key, values in ce.items()}}
    return table | {name: {k: mean_std(v) for k, v in other.items()} for name in GAMMA}


CE = {"rep/test_acc": [0.95, 0.96, 0.94], "rep/test_ece": [0.05, 0.06, 0.04]}
CE |= {"rep/nll_gap": [0.10, 0.12, 0.08]}


def test_verdict_supported_only_when_every_condition_holds() -> None:
    better = {"rep/test_acc": [0.945, 0.955, 0.935], "rep/test_ece": [0.02, 0.03, 0.01]}
    better |= {"rep/nll_gap": [0.05, 0.07, 0.03]}
    assert verdict(gamma_ce_conditions(_table(CE, better))) == SUPPORTED
    worse_acc = better | {"rep/test_acc": [0.90, 0.91, 0.89]}
    assert verdict(gamma_ce_conditions(_table(CE, worse_acc))) == MIXED
    nothing = {"rep/test_acc": [0.90, 0.91, 0.89], "rep/test_ece": [0.08, 0.09, 0.07]}
    nothing |= {"rep/nll_gap": [0.2, 0.2, 0.2]}
    assert verdict(gamma_ce_conditions(_table(CE, nothing))) == NOT_SUPPORTED


def t_ci(d, level: float = 0.95) -> tuple[float, float]:
    """The two-sided Student-t interval of the mean of ``d``, written out."""
    d = np.asarray(d, dtype=np.float64)
    half = scipy_stats.t.ppf((1 + level) / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return d.mean() - half, d.mean() + half


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


def test_a_difference_within_the_seed_noise_is_undecided_with_the_seeds_it_needs() -> None:
    # The mean ECE is lower, but one seed of three goes the other way.
    ece = [0.02, 0.07, 0.03]
    table = _table(CE, {"rep/test_ece": ece})
    condition = compare(table, "ECE < ECE(ce)", "gamma_0.5", "<", "ce", "rep/test_ece")
    diffs = np.array(ece) - np.array(CE["rep/test_ece"])
    low, high = t_ci(diffs)  # t with 2 degrees of freedom: 4.303 standard errors, not 2
    assert (condition.decision.low, condition.decision.high) == pytest.approx((low, high))
    reference = scipy_stats.ttest_rel(ece, CE["rep/test_ece"]).confidence_interval(0.95)
    assert (low, high) == pytest.approx((reference.low, reference.high))
    assert condition.difference == pytest.approx(diffs.mean())
    assert low < 0 < high
    assert condition.outcome == UNDECIDED
    assert not condition.holds
    k = seeds_to_decide(diffs, 0.0)
    assert condition.decision.seeds_needed == k
    assert condition.describe().endswith(f"-> undecided (needs ~{k} seeds)")
    assert verdict_text([condition]) == f"undecided (needs ~{k} seeds)"


def test_two_standard_errors_are_not_enough_with_three_seeds() -> None:
    # Mean difference 2.5 standard errors below 0: the old 2-SE rule called it a difference;
    # t with 2 degrees of freedom needs 4.303.
    ece = [0.035, 0.055, 0.025]  # differences -0.015, -0.005, -0.015: mean -0.01167
    table = _table(CE, {"rep/test_ece": ece})
    condition = compare(table, "ECE < ECE(ce)", "gamma_0.5", "<", "ce", "rep/test_ece")
    diffs = np.array(ece) - np.array(CE["rep/test_ece"])
    se = diffs.std(ddof=1) / math.sqrt(3)
    assert 2 < -diffs.mean() / se < scipy_stats.t.ppf(0.975, 2)
    assert condition.outcome == UNDECIDED


def test_a_claim_of_no_difference_needs_equivalence_within_its_margin() -> None:
    def about_the_same(acc: list[float]) -> Condition:
        table = _table(CE, {"rep/test_acc": acc})
        return compare(
            table, "acc not below acc(ce)", "gamma_0.5", ">=", "ce", "rep/test_acc", margin=0.01
        )

    # No difference detected is not equivalence: the 90% interval reaches past -0.01.
    noisy = about_the_same([0.93, 0.97, 0.93])
    d = np.array([0.93, 0.97, 0.93]) - np.array(CE["rep/test_acc"])
    assert t_ci(d)[0] < 0 < t_ci(d)[1]
    assert t_ci(d, 0.90)[0] < -0.01
    assert noisy.outcome == UNDECIDED
    assert not noisy.holds
    assert noisy.decision.seeds_needed == seeds_to_decide(d, 0.01)
    # Inside (-0.01, 0.01) by two one-sided tests; ">=" needs only the low side (non-inferiority).
    close = [0.951, 0.958, 0.941]
    d = np.array(close) - np.array(CE["rep/test_acc"])
    low, high = t_ci(d, 0.90)
    assert -0.01 < low
    assert high < 0.01
    equivalent = about_the_same(close)
    described = equivalent.describe()
    assert equivalent.holds
    assert described.endswith("-> holds: not below by more than 0.01 (one-sided t, 5%)")
    clearly_worse = about_the_same([0.90, 0.91, 0.89])
    assert clearly_worse.outcome == "fails"
    assert not clearly_worse.holds
    # "~" (about the same) needs its margin.
    with pytest.raises(ValueError, match="needs an equivalence margin"):
        compare(_table(CE, {"rep/test_acc": close}), "a ~ b", "gamma_0.5", "~", "ce", "a")


def test_against_a_constant_uses_students_t_for_the_number_of_seeds() -> None:
    values = [0.91, 0.95, 0.93]
    table = {"v": {"m": mean_std(values)}}
    condition = against(table, "m >= 0.9", "v", "m", ">=", 0.9)
    reference = scipy_stats.ttest_1samp(values, 0.9).confidence_interval(0.95)  # of the mean
    assert (condition.decision.low, condition.decision.high) == pytest.approx(
        (reference.low - 0.9, reference.high - 0.9)
    )
    assert reference.low < 0.9
    assert condition.outcome == UNDECIDED  # 2 SE (0.023) would hold
    five = [0.91, 0.95, 0.93, 0.92, 0.94]
    held = against({"v": {"m": mean_std(five)}}, "m >= 0.9", "v", "m", ">=", 0.9)
    assert scipy_stats.ttest_1samp(five, 0.9).confidence_interval(0.95).low > 0.9
    assert held.holds


def test_verdict_missing_numbers_never_support() -> None:
    assert verdict([]) == NOT_SUPPORTED
    assert verdict([Condition("x < 1", math.nan, "<", 1.0)]) == NOT_SUPPORTED
    assert Condition("x ~ 1", math.nan, "~", 1.0, margin=0.1).outcome == "missing"
    better = {"rep/test_acc": [0.95, 0.96, 0.94], "rep/test_ece": [0.02, 0.03, 0.01]}
    better |= {"rep/nll_gap": [0.05, 0.07, 0.03]}
    table = _table(CE, better)
    del table["tailr_threshold"]
    assert verdict(gamma_ce_conditions(table)) == MIXED


def test_condition_describe_and_bad_operator() -> None:
    assert Condition("a", 1.0, "<=", 1.0).describe() == "a: 1.0000 <= 1.0000 -> holds"
    with pytest.raises(ValueError, match="op must be"):
        Condition("a", 1.0, "==", 1.0)
    with pytest.raises(ValueError, match=re.escape("margin must lie in [0, inf)")):
        Condition("a", 1.0, ">=", 1.0, margin=-0.1)


def test_a_claim_is_undecided_only_while_no_condition_holds_against_one_that_fails() -> None:
    holds, fails = Condition("h", 1.0, "<", 2.0), Condition("f", 3.0, "<", 2.0)
    table = _table(CE, {"rep/test_ece": [0.02, 0.07, 0.03]})
    open_ = compare(table, "u", "gamma_0.5", "<", "ce", "rep/test_ece")
    assert verdict([holds, open_]) == UNDECIDED
    assert verdict([fails, open_]) == UNDECIDED
    assert verdict([holds, fails, open_]) == MIXED
    one_seed = _table({"rep/test_ece": [0.05]}, {"rep/test_ece": [0.02]})
    single = compare(one_seed, "u", "gamma_0.5", "<", "ce", "rep/test_ece")
    assert verdict_text([holds, single]) == "undecided (needs at least 2 seeds)"


def test_aggregate_pairs_values_by_seed_when_a_run_is_missing() -> None:
    runs = {("a", 0): "a0", ("a", 1): "a1", ("a", 2): "a2", ("b", 0): "b0", ("b", 2): "b2"}
    metrics = {"a0": {"m": 1.0}, "a1": {"m": 5.0}, "a2": {"m": 3.0}}
    metrics |= {"b0": {"m": 0.0}, "b2": {"m": 2.0}}
    table = aggregate(runs, metrics, ["m"])
    assert table["b"]["m"].values[0] == 0.0
    assert math.isnan(table["b"]["m"].values[1])
    assert table["b"]["m"][:3] == (1.0, pytest.approx(math.sqrt(2)), 2)
    # pairs (1, 0) and (3, 2): differences 1 and 1, no noise
    condition = compare(table, "a > b", "a", ">", "b", "m")
    assert condition.decision.n == 2
    assert condition.difference == 1.0
    assert (condition.decision.low, condition.decision.high) == (1.0, 1.0)
    assert condition.holds
    assert (condition.left, condition.right) == (3.0, 1.0)  # the means shown beside it


def test_aggregate_mean_std() -> None:
    runs = {("a", 0): "r0", ("a", 1): "r1"}
    table = aggregate(runs, {"r0": {"m": 1.0}, "r1": {"m": 3.0}}, ["m"])
    assert table["a"]["m"] == (2.0, pytest.approx(math.sqrt(2)), 2, (1.0, 3.0))
    assert cell(table["a"]["m"]) == "2.0000 ± 1.4142"


def test_claim5_best_fixed_scale_comes_from_the_table() -> None:
    def row(acc: float, nll: float) -> dict:
        spread = (-0.01, 0.0, 0.012)
        return {
            "rep/test_acc": mean_std([acc + e for e in spread]),
            "rep/test_nll": mean_std([nll + e for e in spread]),
        }

    table = {"normface_s1": row(0.5, 1.4), "normface_s4": row(0.97, 0.2)}
    table |= {"normface_s16": row(0.96, 0.1)}
    nll, acc, *_ = scale_conditions(table)
    assert "normface_s16" in nll.text
    assert (nll.left, nll.right) == pytest.approx((1.4 + 0.002 / 3, 0.1 + 0.002 / 3))
    assert "normface_s4" in acc.text
    assert acc.difference == pytest.approx(0.5 - 0.97)
    assert nll.holds
    assert acc.holds


# --- experiment files -----------------------------------------------------------------------------


def _dotted(config: dict, key: str):
    for part in key.split("."):
        config = config[part]
    return config


@pytest.mark.parametrize("number", [n for n in CLAIMS if n != 1])
def test_experiment_files_parse_and_their_overrides_reach_the_cli(number, capsys) -> None:
    import yaml

    from lightning_losses.lm.cli import main as lm_main

    mains = {"classifier": cli_main, "lm": lm_main}  # the CLI of each experiment's program
    claim = CLAIMS[number]
    spec = yaml.safe_load(open(claim.experiment_file))
    assert [v.name for v in claim.variants] == [item["name"] for item in spec["variants"]]
    for variant, item in zip(claim.variants, spec["variants"], strict=True):
        with pytest.raises(SystemExit) as exit_info:
            mains[variant.program](
                [
                    "fit",
                    "--config",
                    config_path(variant.config),
                    *variant.overrides,
                    "--print_config",
                ]
            )
        assert exit_info.value.code in (0, None)
        printed = yaml.safe_load(capsys.readouterr().out)
        expected = {**(spec.get("overrides") or {}), **(item.get("overrides") or {})}
        for key, value in expected.items():
            assert _dotted(printed, key) == value, (variant.name, key)
        assert variant.epochs == item.get("epochs", spec["epochs"])


def test_variant_fingerprint_follows_the_config_text_and_the_overrides(tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  hidden: [8]\n")
    plain = Variant("a", str(config))
    changed = Variant("a", str(config), ("--model.temperature=2",))
    assert len(plain.fingerprint()) == 12
    assert plain.fingerprint() == Variant("b", str(config), epochs=99).fingerprint()
    assert changed.fingerprint() != plain.fingerprint()
    before = plain.fingerprint()
    config.write_text("model:\n  hidden: [16]\n")
    assert plain.fingerprint() != before


def test_claim4_runs_at_least_ten_seeds() -> None:
    # its test split holds about 17 positives: 3 seeds cannot separate the losses
    assert CLAIMS[4].seeds(3) == 10
    assert CLAIMS[4].seeds(12) == 12
    assert CLAIMS[3].seeds(3) == 3
    assert CLAIMS[1].seeds(3) == 3


def test_experiment_file_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="experiment file"):
        load_variants(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("variants:\n  - name: a\n")
    with pytest.raises(ValueError, match=r"variants\[0\] must be a mapping with .*config"):
        load_variants(bad)
    bad.write_text("variants:\n  - {name: a, config: c.yaml}\n  - {name: a, config: c.yaml}\n")
    with pytest.raises(ValueError, match="'a' is used twice"):
        load_variants(bad)
    bad.write_text("variants:\n  - {name: a, config: c.yaml, overrides: [x]}\n")
    with pytest.raises(ValueError, match="overrides must be a mapping"):
        load_variants(bad)
    bad.write_text("epochs: 3\n")
    with pytest.raises(ValueError, match="at least one variant"):
        load_variants(bad)
    bad.write_text("min_seeds: 0\nvariants:\n  - {name: a, config: c.yaml}\n")
    with pytest.raises(ValueError, match="min_seeds must be >= 1; got 0"):
        load_variants(bad)
    good = tmp_path / "good.yaml"
    good.write_text(
        "epochs: 3\noverrides: {data.init_args.seed: 1}\n"
        "variants:\n  - {name: a, config: c.yaml, epochs: 9,\n"
        "     overrides: {m.alpha: null, m.log: true}}\n"
    )
    assert load_experiment(good).min_seeds == 1
    (variant,) = load_variants(good)
    assert variant.epochs == 9
    assert variant.overrides == ("--data.init_args.seed=1", "--m.alpha=null", "--m.log=true")


# --- claim 1 against scipy on the closed form -----------------------------------------------------


def _ce(b: float, k: float = 1.0) -> float:
    return float(np.logaddexp(0.0, -L * k * (X - b)).sum())


def _hinge(b: float, k: float = 1.0) -> float:
    return float(np.maximum(0.0, 1 - L * k * (X - b)).sum())


@pytest.fixture(scope="module")
def numbers() -> dict[str, float]:
    return analysis()


def test_claim1_matches_scipy(numbers: dict[str, float]) -> None:
    best = minimize_scalar(_ce, bounds=(-1, 2), method="bounded", options={"xatol": 1e-8}).x
    assert numbers["sigmoid_ce/grid_argmin_b"] == pytest.approx(best, abs=2e-4)
    assert numbers["sigmoid_ce/gd_b_max"] == pytest.approx(best, abs=2e-4)
    # Hinge: 1.75 on [0.75, 1] (closed form), larger outside.
    assert _hinge(0.75) == _hinge(1.0) == pytest.approx(1.75)
    assert min(_hinge(0.74), _hinge(1.01)) > 1.75
    assert numbers["hinge/grid_flat_low"] == pytest.approx(0.75, abs=2e-4)
    assert numbers["hinge/grid_flat_high"] == pytest.approx(1.0, abs=2e-4)
    assert 0.75 - 1e-6 <= numbers["hinge/gd_b_min"] <= numbers["hinge/gd_b_max"] <= 1.0 + 1e-6


def test_claim1_temperature_reaches_perfect_interval(numbers: dict[str, float]) -> None:
    # With k free, scipy from k = 1 also lands inside (0, 0.25).
    fit = minimize(lambda p: _ce(p[0], np.exp(p[1])), x0=[1.0, 0.0], method="Nelder-Mead")
    assert 0.0 < fit.x[0] < 0.25
    for name in ("sigmoid_ce", "hinge"):
        assert 0.0 < numbers[f"{name}/temp_gd_b_min"] <= numbers[f"{name}/temp_gd_b_max"] < 0.25


# --- claim 3 end to end ---------------------------------------------------------------------------


def _run_ids(client, experiment: str) -> set[str]:
    found = client.get_experiment_by_name(experiment)
    return {r.info.run_id for r in client.search_runs([found.experiment_id])}


@pytest.mark.slow
def test_claim3_end_to_end_and_reuse(tmp_path, monkeypatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "reports"
    report = reproduce([3], seeds=1, out=out, tracking_uri=uri, scale=0.07)
    text = report.read_text()
    assert "## Claim 3" in text
    assert "**Verdict: " in text
    assert "![" in text
    client = MlflowClient(tracking_uri=uri)
    ids = _run_ids(client, CLAIM_3.experiment)
    assert len(ids) == len(CLAIM_3.variants)
    table = {}
    for variant in CLAIM_3.variants:
        (run_id,) = re.findall(rf"\| {re.escape(variant.name)} \| 0 \| `(\w+)` \|", text)
        assert run_id in ids
        metrics = client.get_run(run_id).data.metrics
        row = next(line for line in text.splitlines() if line.startswith(f"| {variant.name} |"))
        for key, _ in CLAIM_3.metrics:
            assert f"{metrics[key]:.4f} ± 0.0000" in row
        table[variant.name] = {key: mean_std([value]) for key, value in metrics.items()}
    # The verdict and every condition line follow from the numbers in MLflow: with one seed,
    # nothing over seeds can be decided.
    conditions = gamma_ce_conditions(table)
    assert f"**Verdict: {verdict_text(conditions)}**" in text
    assert "undecided (needs at least 2 seeds)" in text
    for condition in conditions:
        assert f"- {condition.describe()}" in text
    for name in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (out / name).is_file()
    # A second invocation into a new folder reuses every run, and their artifacts (the test
    # bins of the reliability diagrams) live beside the database, not in the first report.
    again = reproduce([3], seeds=1, out=tmp_path / "again", tracking_uri=uri, scale=0.07)
    assert _run_ids(client, CLAIM_3.experiment) == ids
    second = again.read_text()
    assert f"{len(ids)} runs ({len(ids)} reused" in second
    reliability = [n for n in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", second) if "reliab" in n]
    assert len(reliability) == len(CLAIM_3.variants)
    assert all((tmp_path / "again" / name).is_file() for name in reliability)


def test_a_fingerprint_that_reads_as_a_number_is_still_reused(tmp_path, monkeypatch) -> None:
    """``247691913e07`` on the command line becomes a float; the run must still be found."""
    from lightning_losses.reproduce import run_or_reuse
    from lightning_losses.reproduce.spec import Claim

    monkeypatch.chdir(tmp_path)
    numeric = re.compile(r"^[0-9]+e[0-9]+$")
    variants = (
        Variant(
            "v",
            "configs/digits_ce.yaml",
            (f"--trainer.log_every_n_steps={k}", "--trainer.limit_train_batches=2"),
            1,
        )
        for k in range(1, 100_000)
    )
    variant = next(v for v in variants if numeric.match(v.fingerprint()))
    claim = Claim(
        98,
        "numeric-fingerprint",
        "a run whose fingerprint looks like a number",
        "a test",
        (("rep/test_acc", "test acc"),),
        lambda table: [],
        fixed_variants=(variant,),
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first, reused, completed = run_or_reuse(claim, variant, 0, 1.0, uri, tmp_path / "out")
    assert not reused
    assert not completed
    again, reused, completed = run_or_reuse(claim, variant, 0, 1.0, uri, tmp_path / "out")
    assert reused
    assert not completed  # a run of this code version: nothing to complete
    assert again == first


def test_a_failing_run_is_reported_and_the_others_go_on(tmp_path, monkeypatch) -> None:
    from lightning_losses.reproduce import reproduce_claim
    from lightning_losses.reproduce.report import claim_markdown
    from lightning_losses.reproduce.spec import Claim

    monkeypatch.chdir(tmp_path)
    claim = Claim(
        99,
        "failure",
        "one variant cannot run",
        "a test",
        (("rep/test_acc", "test acc"),),
        lambda table: [Condition("acc(ok) >= 0", mean_of(table, "ok", "rep/test_acc"), ">=", 0)],
        fixed_variants=(
            Variant("ok", "configs/digits_ce.yaml", epochs=1),
            Variant("bad", "configs/digits_ce.yaml", ("--model.criterion.init_args.gama=1",), 1),
        ),
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = reproduce_claim(claim, seeds=1, scale=1.0, tracking_uri=uri, out=tmp_path)
    assert set(result.runs) == {("ok", 0)}
    (failure,) = result.failures
    assert failure.startswith("bad seed 0: SystemExit")
    text = "\n".join(claim_markdown(result))
    assert "**Failed runs**" in text
    assert "- bad seed 0: SystemExit" in text
    assert result.verdict == SUPPORTED  # decided on the run that exists


def test_pr_curve_is_sklearns_curve_thinned_to_at_most_200_points() -> None:
    import torch
    from sklearn.metrics import precision_recall_curve

    from lightning_losses.reproduce.runner import PR_POINTS, pr_curve

    generator = torch.Generator().manual_seed(0)
    target = (torch.rand(1000, generator=generator) < 0.1).float()
    logits = torch.randn(1000, generator=generator) + 2 * target
    curve = pr_curve(logits, target)
    precision, recall, _ = precision_recall_curve(target.numpy(), torch.sigmoid(logits).numpy())
    assert len(recall) > PR_POINTS >= len(curve["recall"]) > PR_POINTS // 2
    points = set(zip(precision.tolist(), recall.tolist(), strict=True))
    assert set(zip(curve["precision"], curve["recall"], strict=True)) <= points
    assert (curve["precision"][0], curve["recall"][0]) == (precision[0], recall[0])
    assert (curve["precision"][-1], curve["recall"][-1]) == (precision[-1], recall[-1])


@pytest.mark.slow
def test_jobs_run_fits_in_worker_processes_into_a_new_store(tmp_path, monkeypatch, capsys) -> None:
    # Two worker processes on a store that does not exist yet: its schema is created once,
    # before they start, and every run lands in MLflow with the progress lines in order.
    from mlflow.tracking import MlflowClient

    from lightning_losses.reproduce import run_claim
    from lightning_losses.reproduce.spec import Claim
    from lightning_losses.reproduce.version import code_version

    monkeypatch.chdir(tmp_path)
    claim = Claim(
        98,
        "jobs",
        "two fits at a time",
        "a test",
        (("rep/test_acc", "test acc"),),
        lambda table: [],  # not picklable: the workers get the claim without it
        fixed_variants=(
            Variant("ce", "configs/digits_ce.yaml", epochs=1),
            Variant("focal", "configs/digits_focal.yaml", epochs=1),
        ),
    )
    uri = f"sqlite:///{tmp_path}/fresh.db"
    runs, reused, failures = run_claim(claim, 2, 1.0, uri, tmp_path, jobs=2)
    assert failures == []
    assert reused == 0
    assert sorted(runs) == [("ce", 0), ("ce", 1), ("focal", 0), ("focal", 1)]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(claim.experiment)
    found = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
    assert set(found) == set(runs.values())
    for (variant, seed), run_id in runs.items():
        tags = found[run_id].data.tags
        assert (tags["variant"], tags["seed"], tags["reproduce_complete"]) == (
            variant,
            str(seed),
            "1",
        )
        # each worker process tags its run with the same code version as this process
        assert tags["lightning_losses.code_version"] == code_version()
    progress = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [line.split(" claim")[0] for line in progress] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    assert all(re.search(r": \w{32} \(\d+\.\d s\) ETA \d+ s$", line) for line in progress)
