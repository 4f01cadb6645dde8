"""The numbers of claims 8 and 9 in the README and the docs are the committed reports'.

The committed ``reports/REPORT.md`` lists every per-seed value (its appendix). This test reads
claims 8's and 9's values back (claim 9's Llama arms from ``reports/claim9_models/REPORT.md``,
which came after), recomputes the means the README cites and decides "(b) accuracy not below
CE's by more than 0.01" with the non-inferiority rule
(:func:`lightning_losses.compare.decide.non_inferior`), which the report's own (b) column must
show too, and the Llama arms' verdicts the docs cite.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from lightning_losses.compare.decide import decide, non_inferior

REPORT = Path(__file__).resolve().parents[2] / "reports" / "REPORT.md"
#: Claim 9 with both models (the Llama arms came after the committed report).
CLAIM9_MODELS = REPORT.parent / "claim9_models" / "REPORT.md"


def appendix(claim: int, report: Path = REPORT) -> dict[tuple[str, str], np.ndarray]:
    """``{(variant, metric): per-seed values}`` of one claim's appendix table."""
    text = report.read_text()
    start = text.index(f"### Claim {claim}: per-seed values")
    end = text.find("### Claim", start + 10)
    rows = {}
    for line in text[start : end if end > 0 else None].splitlines():
        match = re.match(r"^\| (\S+) \| `([^`]+)` \| (.+) \|$", line)
        if match:
            values = [float(v) for v in match.group(3).split(" | ")]
            rows[(match.group(1), match.group(2))] = np.array(values)
    return rows


@pytest.fixture(scope="module")
def claim8():
    return appendix(8)


@pytest.mark.parametrize(
    ("variant", "metric", "cited"),
    [
        ("ce", "rep/test_ece", 0.0535),
        ("ce", "rep/ts_test_ece", 0.0093),
        ("ce", "rep/test_acc", 0.931),
        ("flsd_53", "rep/test_ece", 0.0241),
        ("flsd_53", "rep/test_acc", 0.922),
        ("adafocal", "rep/test_ece", 0.0234),
        ("adafocal", "rep/test_acc", 0.925),
        ("focal_3", "rep/test_ece", 0.0288),
        ("focal_3", "rep/test_acc", 0.916),
        ("label_smoothing", "rep/test_acc", 0.953),
        ("label_smoothing", "rep/test_ece", 0.123),
        ("label_smoothing", "rep/ts_test_ece", 0.0073),
        ("gamma_0.5", "rep/test_ece", 0.0861),
        ("gamma_annealed", "rep/test_ece", 0.0759),
        ("tailr", "rep/test_ece", 0.0572),
        # the post-hoc arms (docs/calibration.md, README)
        ("ce", "rep/ph_temperature_test_ece", 0.0093),
        ("ce", "rep/ph_vector_test_ece", 0.0088),
        ("ce", "rep/ph_ensemble_temperature_test_ece", 0.0081),
        ("ce", "rep/ph_isotonic_test_ece", 0.0113),
        ("ce", "rep/ph_histogram_test_ece", 0.0156),
        ("ce", "rep/ph_matrix_test_ece", 0.0309),
        ("ce", "rep/ph_dirichlet_test_ece", 0.0339),
        ("ce", "rep/ph_best_test_ece", 0.0093),
        ("label_smoothing", "rep/ph_best_test_ece", 0.0075),
        # the literature's losses (README table, docs/losses.md)
        ("poly1", "rep/test_acc", 0.937),
        ("poly1", "rep/test_ece", 0.0494),
        ("poly1", "rep/ts_test_ece", 0.0092),
        ("mbls", "rep/test_acc", 0.953),
        ("mbls", "rep/test_ece", 0.0197),
        ("mbls", "rep/ts_test_ece", 0.0056),
        ("dual_focal", "rep/test_acc", 0.94),
        ("dual_focal", "rep/test_ece", 0.0401),
        ("dual_focal", "rep/ts_test_ece", 0.0096),
        ("mdca", "rep/test_acc", 0.932),
        ("mdca", "rep/test_ece", 0.0528),
        ("mdca", "rep/ts_test_ece", 0.0091),
        ("dca", "rep/test_acc", 0.867),
        ("dca", "rep/test_ece", 0.0324),
        ("dca", "rep/ts_test_ece", 0.0181),
        ("mmce", "rep/test_acc", 0.93),
        ("mmce", "rep/test_ece", 0.0544),
        ("mmce", "rep/ts_test_ece", 0.0103),
        ("mbls", "rep/ph_best_test_ece", 0.0064),
    ],
)
def test_cited_means_are_the_appendix_means(claim8, variant, metric, cited):
    values = claim8[(variant, metric)]
    assert len(values) == 10
    digits = len(str(cited).split(".")[1])
    assert round(float(values.mean()), digits) == pytest.approx(cited)


@pytest.mark.parametrize(
    ("variant", "outcome"),
    [
        ("label_smoothing", "holds"),
        ("tailr", "holds"),
        ("flsd_53", "undecided"),
        ("adafocal", "undecided"),
        ("focal_3", "undecided"),
        ("gamma_annealed", "undecided"),
        ("gamma_0.5", "undecided"),
        ("soft_truncated", "fails"),
    ],
)
def test_accuracy_not_below_ce_by_more_than_a_point(claim8, variant, outcome):
    differences = claim8[(variant, "rep/test_acc")] - claim8[("ce", "rep/test_acc")]
    assert non_inferior(decide(differences, margin=0.01), 0.01)[0] == outcome


def test_temperature_scaled_ce_is_below_every_loss_alone_beyond_noise(claim8):
    scaled_ce = claim8[("ce", "rep/ts_test_ece")]
    losses = {v for v, m in claim8 if v != "ce"}
    for variant in losses:
        decision = decide(claim8[(variant, "rep/test_ece")] - scaled_ce, margin=0.0)
        assert decision.low > 0, variant


def test_the_report_s_own_column_b_is_the_recomputed_verdict(claim8):
    """The report's per-loss table (yes / no / undecided in column (b)) agrees with the rule."""
    text = REPORT.read_text()
    start = text.index("| loss | (a) ECE below CE's | (b) acc not below CE's by more than 0.01 |")
    words = {"yes": "holds", "no": "fails", "undecided": "undecided"}
    rows = 0
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("| "):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        variant, column_b = cells[0], cells[2]
        differences = claim8[(variant, "rep/test_acc")] - claim8[("ce", "rep/test_acc")]
        expected = non_inferior(decide(differences, margin=0.01), 0.01)[0]
        assert words[column_b.split()[0].rstrip(",")] == expected, variant
        rows += 1
    assert rows == 8


# --- claim 9: the language model (README table, docs/reproduce.md) -----------------------------


@pytest.fixture(scope="module")
def claim9():
    return appendix(9)


@pytest.mark.parametrize(
    ("variant", "metric", "cited"),
    [
        ("ce", "rep/test_ppl", 110.2),
        ("ce", "rep/test_ece", 0.1103),
        ("ce", "rep/ts_test_ece", 0.0431),
        ("ce", "rep/rep4_greedy", 0.2845),
        ("ce", "rep/ce_lowprob_sampled", 0.1035),
        ("tailr", "rep/test_ppl", 110.1),
        ("tailr", "rep/test_ece", 0.113),
        ("tailr", "rep/ts_test_ece", 0.043),
        ("tailr", "rep/rep4_greedy", 0.2442),
        ("tailr", "rep/ce_lowprob_sampled", 0.1193),
        ("gamma_annealed", "rep/test_ppl", 160.7),
        ("gamma_annealed", "rep/test_ece", 0.2472),
        ("gamma_annealed", "rep/ts_test_ece", 0.0746),
        ("gamma_annealed", "rep/rep4_greedy", 0.3672),
        ("gamma_annealed", "rep/ce_lowprob_sampled", 0.1941),
        ("focal_3", "rep/test_ppl", 107.7),
        ("focal_3", "rep/test_ece", 0.0658),
        ("focal_3", "rep/ts_test_ece", 0.0523),
        ("focal_3", "rep/rep4_greedy", 0.2636),
        ("focal_3", "rep/ce_lowprob_sampled", 0.1453),
        ("label_smoothing", "rep/test_ppl", 89.2),
        ("label_smoothing", "rep/test_ece", 0.0715),
        ("label_smoothing", "rep/ts_test_ece", 0.0452),
        ("label_smoothing", "rep/rep4_greedy", 0.2797),
        ("label_smoothing", "rep/ce_lowprob_sampled", 0.2109),
    ],
)
def test_cited_language_model_means_are_the_appendix_means(claim9, variant, metric, cited):
    values = claim9[(variant, metric)]
    assert len(values) == 5
    digits = len(str(cited).split(".")[1])
    assert round(float(values.mean()), digits) == pytest.approx(cited)


def test_tailr_s_cited_verdicts_are_the_recomputed_ones(claim9):
    """(b) holds, (a) and (c) undecided, (d) fails: as the README and the Evidence page say."""
    tailr = {m: claim9[("tailr", m)] for m in ("rep/test_nll", "rep/test_ece", "rep/rep4_greedy")}
    ce = {m: claim9[("ce", m)] for m in (*tailr, "rep/ts_test_ece")}
    nll = decide(tailr["rep/test_nll"] - ce["rep/test_nll"], margin=0.05, higher_is_better=False)
    assert non_inferior(nll, 0.05, higher_is_better=False)[0] == "holds"
    for metric in ("rep/test_ece", "rep/rep4_greedy"):
        decision = decide(tailr[metric] - ce[metric], margin=0.0, higher_is_better=False)
        assert decision.verdict == "undecided", metric
    scaled = decide(tailr["rep/test_ece"] - ce["rep/ts_test_ece"], margin=0.005)
    assert scaled.low > 0.005  # CE + TS below TaiLr beyond noise and beyond the margin


# --- claim 9's Llama-architecture arms (README table, docs/reproduce.md) ------------------------


@pytest.fixture(scope="module")
def claim9_models():
    return appendix(9, CLAIM9_MODELS)


@pytest.mark.parametrize(
    ("variant", "metric", "cited"),
    [
        ("hf_ce", "rep/test_ppl", 119.3),
        ("hf_ce", "rep/test_ece", 0.0912),
        ("hf_ce", "rep/ts_test_ece", 0.0486),
        ("hf_ce", "rep/rep4_greedy", 0.0797),
        ("hf_ce", "rep/hf_ce_lowprob_sampled", 0.1084),
        ("hf_tailr", "rep/test_ppl", 118.3),
        ("hf_tailr", "rep/test_ece", 0.0954),
        ("hf_tailr", "rep/ts_test_ece", 0.044),
        ("hf_tailr", "rep/rep4_greedy", 0.0968),
        ("hf_tailr", "rep/hf_ce_lowprob_sampled", 0.1637),
        ("hf_focal_3", "rep/test_ppl", 117.5),
        ("hf_focal_3", "rep/test_ece", 0.055),
        ("hf_focal_3", "rep/ts_test_ece", 0.0537),
        ("hf_focal_3", "rep/rep4_greedy", 0.0888),
        ("hf_focal_3", "rep/hf_ce_lowprob_sampled", 0.259),
        # the Transformer's arms trained again by that code: ce and tailr as committed
        ("ce", "rep/test_ece", 0.1103),
        ("tailr", "rep/test_ece", 0.113),
        ("focal_3", "rep/test_ece", 0.0605),
        ("gamma_annealed", "rep/test_ece", 0.2468),
    ],
)
def test_cited_llama_means_are_the_appendix_means(claim9_models, variant, metric, cited):
    values = claim9_models[(variant, metric)]
    assert len(values) == 5
    digits = len(str(cited).split(".")[1])
    assert round(float(values.mean()), digits) == pytest.approx(cited)


def test_the_llama_verdicts_cited_are_the_recomputed_ones(claim9_models):
    """TaiLr: (b) holds, (a), (c), (d) undecided; focal lowers the token ECE beyond noise."""
    arms = claim9_models
    differences = {
        metric: arms[("hf_tailr", metric)] - arms[("hf_ce", metric)]
        for metric in ("rep/test_nll", "rep/test_ece", "rep/rep4_greedy")
    }
    nll = decide(differences["rep/test_nll"], margin=0.05, higher_is_better=False)
    assert non_inferior(nll, 0.05, higher_is_better=False)[0] == "holds"
    cited = {"rep/test_ece": (0.0041, -0.0053, 0.0136), "rep/rep4_greedy": (0.017, -0.0149, 0.0489)}
    for metric, (mean, low, high) in cited.items():
        decision = decide(differences[metric], margin=0.0, higher_is_better=False)
        assert decision.verdict == "undecided", metric
        assert (round(decision.low, 4), round(decision.high, 4)) == (low, high), metric
        assert round(float(differences[metric].mean()), 4) == mean, metric
    scaled = decide(
        arms[("hf_tailr", "rep/test_ece")] - arms[("hf_ce", "rep/ts_test_ece")], margin=0.005
    )
    assert scaled.low < 0.005 < scaled.high  # neither below nor above CE + TS beyond noise
    focal = decide(
        arms[("hf_focal_3", "rep/test_ece")] - arms[("hf_ce", "rep/test_ece")], margin=0.0
    )
    assert (round(focal.low, 4), round(focal.high, 4)) == (-0.0419, -0.0306)


# --- claim 10: prediction sets (README, docs/reproduce.md, docs/prediction_sets.md) -------------

CLAIM10 = REPORT.parent / "claim10" / "REPORT.md"


@pytest.fixture(scope="module")
def claim10():
    return appendix(10, CLAIM10)


@pytest.mark.parametrize(
    ("variant", "metric", "cited"),
    [
        ("ce", "rep/conf_lac_coverage", 0.9102),
        ("ce", "rep/conf_aps_coverage", 0.9006),
        ("ce", "rep/conf_raps_coverage", 0.9002),
        ("ce", "rep/conf_saps_coverage", 0.9019),
        ("ce", "rep/conf_lac_size", 0.9547),
        ("ce", "rep/conf_aps_size", 0.992),
        ("ce", "rep/conf_raps_size", 0.9887),
        ("ce", "rep/conf_saps_size", 1.0032),
        ("ce", "rep/conf_ts_lac_size", 0.9566),
        ("ce", "rep/conf_ts_aps_size", 1.1126),
        ("ce", "rep/conf_ts_raps_size", 1.099),
        ("ce", "rep/conf_ts_saps_size", 1.1186),
        ("focal_3", "rep/conf_lac_size", 0.9737),
        ("focal_3", "rep/conf_aps_size", 1.0838),
        ("flsd_53", "rep/conf_lac_size", 0.9749),
        ("flsd_53", "rep/conf_aps_size", 1.0862),
        ("label_smoothing", "rep/conf_lac_size", 0.9282),
        ("label_smoothing", "rep/conf_aps_size", 1.3368),
        ("label_smoothing", "rep/conf_aps_coverage", 0.8954),
        ("mbls", "rep/conf_lac_size", 0.923),
        ("mbls", "rep/conf_aps_size", 1.0966),
        ("mbls", "rep/conf_saps_size", 1.0703),
        ("ce", "rep/test_acc", 0.9347),
        ("ce", "rep/test_ece", 0.0505),
    ],
)
def test_cited_prediction_set_means_are_the_appendix_means(claim10, variant, metric, cited):
    values = claim10[(variant, metric)]
    assert len(values) == 10
    digits = len(str(cited).split(".")[1])
    assert round(float(values.mean()), digits) == pytest.approx(cited)


def test_claim_10_s_cited_verdicts_are_the_recomputed_ones(claim10, claim8):
    """(a) holds for every score, RAPS < APS holds, SAPS < RAPS fails; MbLS repeats claim 8."""
    for score in ("lac", "aps", "raps", "saps"):
        coverage = claim10[("ce", f"rep/conf_{score}_coverage")] - 0.9
        assert decide(coverage, margin=0.02, level=0.90).verdict == "equivalent", score
    size = {s: claim10[("ce", f"rep/conf_{s}_size")] for s in ("aps", "raps", "saps")}
    raps = decide(size["raps"] - size["aps"], margin=0.0, higher_is_better=False)
    assert raps.verdict == "better"
    assert (round(raps.low, 4), round(raps.high, 4)) == (-0.0042, -0.0025)
    saps = decide(size["saps"] - size["raps"], margin=0.0, higher_is_better=False)
    assert saps.verdict == "worse"
    assert (round(saps.low, 4), round(saps.high, 4)) == (0.0123, 0.0166)
    # claim 8's arms trained again: MbLS to the bit, CE not
    assert np.array_equal(claim10[("mbls", "rep/test_acc")], claim8[("mbls", "rep/test_acc")])
    assert not np.array_equal(claim10[("ce", "rep/test_acc")], claim8[("ce", "rep/test_acc")])
