"""``lightning-losses reproduce``: verdict rules, claim 1's numbers, and claim 3 end to end."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy.optimize import minimize, minimize_scalar

from lightning_losses.cli import main as cli_main
from lightning_losses.reproduce import reproduce
from lightning_losses.reproduce.claims import CLAIM_3, CLAIMS, gamma_ce_conditions, scale_conditions
from lightning_losses.reproduce.report import aggregate, cell
from lightning_losses.reproduce.spec import (
    MIXED,
    NOT_SUPPORTED,
    SUPPORTED,
    Condition,
    config_path,
    load_variants,
    verdict,
)
from lightning_losses.reproduce.threshold import analysis

X = np.array([-0.25, 0.0, 0.25])
L = np.array([-1.0, -1.0, 1.0])


# --- verdict rules on synthetic numbers ---------------------------------------------------------


def _table(ce_acc: float, ce_ece: float, other: tuple[float, float]) -> dict:
    row = {"rep/test_acc": (other[0], 0.0, 1), "rep/test_ece": (other[1], 0.0, 1)}
    table = {"ce": {"rep/test_acc": (ce_acc, 0.0, 1), "rep/test_ece": (ce_ece, 0.0, 1)}}
    return table | {name: dict(row) for name in ("gamma_0.5", "gamma_annealed", "tailr_threshold")}


def test_verdict_supported_only_when_every_condition_holds() -> None:
    assert verdict(gamma_ce_conditions(_table(0.95, 0.05, (0.945, 0.02)))) == SUPPORTED
    assert verdict(gamma_ce_conditions(_table(0.95, 0.05, (0.90, 0.02)))) == MIXED
    assert verdict(gamma_ce_conditions(_table(0.95, 0.05, (0.90, 0.08)))) == NOT_SUPPORTED


def test_verdict_missing_numbers_never_support() -> None:
    assert verdict([]) == NOT_SUPPORTED
    assert verdict([Condition("x < 1", math.nan, "<", 1.0)]) == NOT_SUPPORTED
    table = _table(0.95, 0.05, (0.945, 0.02))
    del table["tailr_threshold"]
    assert verdict(gamma_ce_conditions(table)) == MIXED


def test_condition_describe_and_bad_operator() -> None:
    assert Condition("a", 1.0, "<=", 1.0).describe() == "a: 1.0000 <= 1.0000 -> holds"
    with pytest.raises(ValueError, match="op must be"):
        _ = Condition("a", 1.0, "==", 1.0).holds


def test_aggregate_mean_std() -> None:
    runs = {("a", 0): "r0", ("a", 1): "r1"}
    table = aggregate(runs, {"r0": {"m": 1.0}, "r1": {"m": 3.0}}, ["m"])
    assert table["a"]["m"] == (2.0, pytest.approx(math.sqrt(2)), 2)
    assert cell(table["a"]["m"]) == "2.0000 ± 1.4142"


def test_claim5_best_fixed_scale_comes_from_the_table() -> None:
    row = {"rep/test_acc": (0.97, 0.0, 1)}
    table = {"normface_s1": {"rep/test_acc": (0.5, 0.0, 1)}, "normface_s16": row}
    (small_scale, *_) = scale_conditions(table)
    assert (small_scale.left, small_scale.right) == (0.5, pytest.approx(0.92))
    assert small_scale.holds


# --- experiment files -----------------------------------------------------------------------------


def _dotted(config: dict, key: str):
    for part in key.split("."):
        config = config[part]
    return config


@pytest.mark.parametrize("number", [n for n in CLAIMS if n != 1])
def test_experiment_files_parse_and_their_overrides_reach_the_cli(number, capsys) -> None:
    import yaml

    claim = CLAIMS[number]
    spec = yaml.safe_load(open(claim.experiment_file))
    assert [v.name for v in claim.variants] == [item["name"] for item in spec["variants"]]
    for variant, item in zip(claim.variants, spec["variants"], strict=True):
        with pytest.raises(SystemExit) as exit_info:
            cli_main(
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
    good = tmp_path / "good.yaml"
    good.write_text(
        "epochs: 3\noverrides: {data.init_args.seed: 1}\n"
        "variants:\n  - {name: a, config: c.yaml, epochs: 9,\n"
        "     overrides: {m.alpha: null, m.log: true}}\n"
    )
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


def test_claim3_end_to_end_and_reuse(tmp_path, monkeypatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "reports"
    report = reproduce([3], seeds=1, out=out, tracking_uri=uri, scale=0.07)
    text = report.read_text()
    assert "## Claim 3" in text and "**Verdict: " in text and "![" in text
    client = MlflowClient(tracking_uri=uri)
    ids = _run_ids(client, CLAIM_3.experiment)
    assert len(ids) == len(CLAIM_3.variants)
    for variant in CLAIM_3.variants:
        (run_id,) = re.findall(rf"\| {re.escape(variant.name)} \| 0 \| `(\w+)` \|", text)
        assert run_id in ids
        metrics = client.get_run(run_id).data.metrics
        row = next(line for line in text.splitlines() if line.startswith(f"| {variant.name} |"))
        for key, _ in CLAIM_3.metrics:
            assert f"{metrics[key]:.4f} ± 0.0000" in row
    for name in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (out / name).is_file()
    reproduce([3], seeds=1, out=out, tracking_uri=uri, scale=0.07)
    assert _run_ids(client, CLAIM_3.experiment) == ids
    assert f"{len(ids)} runs ({len(ids)} reused" in (out / "REPORT.md").read_text()
