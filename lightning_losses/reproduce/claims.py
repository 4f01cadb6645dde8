"""The claims that ``lightning-losses reproduce`` tests, each with its verdict rule.

The runs of claims 2-6 are the variants of ``configs/experiments/claim-<n>-<slug>.yaml``: a
shipped config plus overrides each. Every trained variant uses the same MLP (128, 64), Adam
(lr 0.003), batch 64, the same seeds and the same number of epochs within a claim (hard
truncation's longer arm excepted, which is the point of that arm); each loss keeps the
hyper-parameters of its shipped config, with no per-loss tuning.
"""

from __future__ import annotations

from .spec import Claim, Condition, Table, Variant, mean_of

#: Accuracy a variant may lose against cross-entropy and still count as "about the same".
ACC_TOLERANCE = 0.01
#: The rare class of claim 4 (a digit harder than 0, so that the losses can differ).
RARE_DIGIT = 8

MULTICLASS_METRICS = (
    ("rep/test_acc", "test acc"),
    ("rep/test_ece", "test ECE"),
    ("rep/test_nll", "test NLL"),
    ("rep/nll_gap", "NLL gap (val - train)"),
    ("rep/test_conf_gap", "conf - acc"),
)
BINARY_METRICS = (
    ("rep/test_pr_auc", "PR-AUC"),
    ("rep/test_f1", "F1 @ 0.5"),
    ("rep/test_recall_at_p90", "recall @ P>=0.9"),
    ("rep/test_ece", "test ECE"),
    ("rep/test_nll", "test NLL"),
)


# --- claim 1 -----------------------------------------------------------------------------------


def threshold_conditions(table: Table) -> list[Condition]:
    """Claim 1: no minimiser inside (0, 0.25) at k = 1; every descent inside with learnable k."""

    def num(key: str) -> float:
        return mean_of(table, "analysis", key)

    return [
        Condition("sigmoid CE grid argmin b >= 0.25", num("sigmoid_ce/grid_argmin_b"), ">=", 0.25),
        Condition("hinge flat minimum starts at b >= 0.25", num("hinge/grid_flat_low"), ">=", 0.25),
        Condition(
            "hinge GD ends outside (0, 0.25): fraction inside", num("hinge/gd_inside"), "<=", 0
        ),
        Condition(
            "sigmoid CE + learnable k: fraction of GD starts inside (0, 0.25)",
            num("sigmoid_ce/temp_gd_inside"),
            ">=",
            1.0,
        ),
        Condition(
            "hinge + learnable k: fraction of GD starts inside (0, 0.25)",
            num("hinge/temp_gd_inside"),
            ">=",
            1.0,
        ),
    ]


CLAIM_1 = Claim(
    1,
    "threshold-model",
    "Cross-entropy and hinge miss the perfect threshold without a temperature",
    "Seed 000: on (-0.25, neg), (0, neg), (0.25, pos) with f(x) = x - b, sigmoid CE is "
    "minimised at b = 0.7 and hinge is flat on [0.75, 1], outside the perfect interval (0, 0.25); "
    "with f(x) = k (x - b), k learnable, both reach it.",
    (
        ("sigmoid_ce/grid_argmin_b", "CE grid argmin b"),
        ("sigmoid_ce/gd_b_max", "CE GD b"),
        ("hinge/grid_flat_low", "hinge flat from"),
        ("hinge/grid_flat_high", "hinge flat to"),
        ("sigmoid_ce/temp_gd_b_min", "CE+k b min"),
        ("sigmoid_ce/temp_gd_b_max", "CE+k b max"),
        ("hinge/temp_gd_b_min", "hinge+k b min"),
        ("hinge/temp_gd_b_max", "hinge+k b max"),
    ),
    threshold_conditions,
    "supported if every listed comparison holds (k = 1: minimisers outside (0, 0.25); "
    "learnable k: all gradient-descent starts end inside).",
    fixed_variants=(
        Variant("analysis", "", epochs=1, label="closed form, grid + Adam from 6 starts"),
    ),
)


# --- claim 2 -----------------------------------------------------------------------------------


def smooth_accuracy_conditions(table: Table) -> list[Condition]:
    """Claim 2: soft accuracy and EXACT below CE's accuracy; -log E[p] not above -E[p]."""
    acc = "rep/test_acc"
    return [
        Condition(
            "acc(soft accuracy) < acc(CE)",
            mean_of(table, "soft_accuracy", acc),
            "<",
            mean_of(table, "ce", acc),
        ),
        Condition(
            "acc(EXACT) < acc(CE)", mean_of(table, "exact", acc), "<", mean_of(table, "ce", acc)
        ),
        Condition(
            "acc(EXACT, -log P) <= acc(EXACT, 1 - P)",
            mean_of(table, "exact_log", acc),
            "<=",
            mean_of(table, "exact", acc),
        ),
    ]


CLAIM_2 = Claim(
    2,
    "smooth-accuracy",
    "Optimising the smooth accuracy does not beat cross-entropy",
    "Seed 000: directly optimising the smooth accuracy (1 - p_t, EXACT) does not reach the "
    "accuracy of cross-entropy, and -log E[p] (EXACT, log=True) is not better than -E[p].",
    MULTICLASS_METRICS,
    smooth_accuracy_conditions,
    "supported if all three comparisons hold on the seed means of test accuracy.",
)


# --- claim 3 -----------------------------------------------------------------------------------

GAMMA_VARIANTS = ("gamma_0.5", "gamma_annealed", "tailr_threshold")


def gamma_ce_conditions(table: Table) -> list[Condition]:
    """Claim 3: each gamma-CE variant has lower ECE than CE and accuracy within 1 point."""
    conditions = []
    for name in GAMMA_VARIANTS:
        conditions += [
            Condition(
                f"ECE({name}) < ECE(ce)",
                mean_of(table, name, "rep/test_ece"),
                "<",
                mean_of(table, "ce", "rep/test_ece"),
            ),
            Condition(
                f"acc({name}) >= acc(ce) - {ACC_TOLERANCE}",
                mean_of(table, name, "rep/test_acc"),
                ">=",
                mean_of(table, "ce", "rep/test_acc") - ACC_TOLERANCE,
            ),
        ]
    return conditions


CLAIM_3 = Claim(
    3,
    "gamma-ce",
    "gamma-CE lowers overconfidence at about the same accuracy",
    "Seed 001 (TaiLr): gamma-CE with gamma in (0, 1), fixed or annealed from 0 towards 1, and "
    "TaiLr's threshold form -max(b, w) log p_t, lower overconfidence at about the accuracy of CE.",
    MULTICLASS_METRICS,
    gamma_ce_conditions,
    f"supported if, for every gamma-CE variant, mean test ECE < CE's and mean test accuracy >= "
    f"CE's - {ACC_TOLERANCE}; not supported if none of these comparisons holds; else mixed.",
)


# --- claim 4 -----------------------------------------------------------------------------------


def rare_class_conditions(table: Table) -> list[Condition]:
    """Claim 4: focal / soft truncation above BCE on PR-AUC; hard truncation gains with epochs."""
    pr = "rep/test_pr_auc"
    conditions = [
        Condition(
            f"PR-AUC({name}) > PR-AUC(bce)",
            mean_of(table, name, pr),
            ">",
            mean_of(table, "bce", pr),
        )
        for name in ("focal", "soft_trunc_k1", "soft_trunc_k2")
    ]
    conditions.append(
        Condition(
            "PR-AUC(hard truncation, 3x epochs) > PR-AUC(hard truncation)",
            mean_of(table, "hard_trunc_long", pr),
            ">",
            mean_of(table, "hard_trunc", pr),
        )
    )
    return conditions


CLAIM_4 = Claim(
    4,
    "rare-class",
    "Focal and soft truncation beat cross-entropy on a rare class",
    f"Seed 004: on imbalanced data (digit {RARE_DIGIT} vs rest, 5% positives) focal loss and the "
    "soft truncation loss (k = 1, 2) beat sigmoid cross-entropy on the rare class; hard "
    "truncation needs more epochs.",
    BINARY_METRICS,
    rare_class_conditions,
    "supported if each comparison of seed-mean test PR-AUC holds (sklearn average precision of "
    "the fitted model's test scores).",
)


# --- claim 5 -----------------------------------------------------------------------------------


def scale_conditions(table: Table) -> list[Condition]:
    """Claim 5: a too-small scale costs accuracy; the learned scale exceeds the NormFace bound."""
    from ..functional import normface_min_scale

    acc = "rep/test_acc"
    fixed = [name for name in table if name.startswith("normface_s")]
    best = max((mean_of(table, name, acc) for name in fixed), default=float("nan"))
    return [
        Condition(
            "acc(NormFace s=1) < best fixed-scale acc - 0.05",
            mean_of(table, "normface_s1", acc),
            "<",
            best - 0.05,
        ),
        Condition(
            "acc(temperature 100) < acc(temperature 1) - 0.05",
            mean_of(table, "temperature_100", acc),
            "<",
            mean_of(table, "temperature_1", acc) - 0.05,
        ),
        Condition(
            "learned NormFace scale >= normface_min_scale(10, 0.9)",
            mean_of(table, "normface_learned", "rep/scale"),
            ">=",
            normface_min_scale(10, 0.9),
        ),
    ]


CLAIM_5 = Claim(
    5,
    "logit-scale",
    "The scale of the logits decides whether softmax can fit",
    "Seed 003: with normalised logits (NormFace) a small scale keeps softmax from approaching "
    "one-hot and hurts training; a learnable scale grows past normface_min_scale(C, p).",
    (*MULTICLASS_METRICS[:3], ("rep/scale", "final scale")),
    scale_conditions,
    "supported if all three comparisons hold (seed means; normface_min_scale(10, 0.9) = 3.955).",
)


# --- claim 6 -----------------------------------------------------------------------------------


def nm_conditions(table: Table) -> list[Condition]:
    """Claim 6: pairwise reaches 90% per-task accuracy; centered ranks the target first less."""
    acc = "rep/test_acc"
    return [
        Condition("acc(pairwise) >= 0.9", mean_of(table, "pairwise", acc), ">=", 0.9),
        Condition(
            "acc(centered) < acc(pairwise)",
            mean_of(table, "centered", acc),
            "<",
            mean_of(table, "pairwise", acc),
        ),
    ]


CLAIM_6 = Claim(
    6,
    "n-by-m",
    "n-by-m softmax CE: pairwise works, centered ranks the target first less often",
    "Seed 002: for n tasks of m classes with hard labels, the pairwise n-by-m loss works; the "
    "centered variant ranks the target first less often.",
    (
        ("rep/test_acc", "target ranked first (test)"),
        ("rep/test_nll", "test NLL"),
        ("rep/train_acc", "train acc"),
    ),
    nm_conditions,
    "supported if both comparisons hold on seed means of the test per-task accuracy.",
)


CLAIMS: dict[int, Claim] = {
    c.number: c for c in (CLAIM_1, CLAIM_2, CLAIM_3, CLAIM_4, CLAIM_5, CLAIM_6)
}
