"""Claim 10: split conformal prediction sets on claim 8's overconfident MNIST-1D CNN.

The runs are claim 8's (``configs/experiments/claim-10-mnist1d-conformal.yaml`` lists claim
8's arms ``ce``, ``focal_3``, ``flsd_53``, ``label_smoothing`` and ``mbls`` with the same
configs and epochs, so the same runs are reused); nothing is trained for this claim alone.
Once a claim's runs are done (:attr:`~lightning_losses.reproduce.spec.Claim.after_runs`),
:func:`score_runs` loads each run's last checkpoint, predicts the validation split (1,000
generated samples) and the test split (10,000), and logs the measures of split conformal
prediction sets at :data:`ALPHA` into the run (``rep/conf_<score>_<measure>``; the run is then
tagged :data:`SCORED_BY_TAG` with the code version that scored it, and scored again only by
another one). Two arms per run:

- the softmax of the logits: each score's threshold is fitted on the whole validation split;
- after temperature scaling (``rep/conf_ts_<score>_<measure>``): the validation split is cut
  into two disjoint, seeded halves, the temperature is fitted on one and the thresholds on the
  other's scaled probabilities (fitting both on the same samples would void the guarantee, as
  :class:`~lightning_losses.callbacks.ConformalPrediction` says).

The scores are LAC, APS, RAPS and SAPS (:mod:`lightning_losses.calibration.conformal`) with
the package's hyper-parameters (:data:`SCORE_OPTIONS`, untuned), APS, RAPS and SAPS
randomised: one uniform draw ``U`` per sample, the same for every score, from a generator
seeded by the run's seed (:func:`draws`). The verdict is (a) and (b) on the cross-entropy runs
(:func:`conformal_conditions`); (c), the training losses' set sizes, is a table outside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_losses.reproduce.spec import (
    EQUIVALENT,
    Claim,
    Condition,
    Table,
    against,
    compare,
    mark,
    stats,
)

if TYPE_CHECKING:  # torch is imported where used: `reproduce --help` imports this module
    from torch import Tensor

#: The miscoverage level: sets that should hold the true label 90% of the time.
ALPHA = 0.1
#: The target coverage ``1 - alpha``.
TARGET_COVERAGE = 1 - ALPHA
#: Equivalence margin of (a): a coverage within it of the target is "0.90".
COVERAGE_MARGIN = 0.02
#: Equivalence margin of the set sizes in (c)'s comparisons with CE (in labels per set).
SIZE_MARGIN = 0.05
#: The scores, in the order of the claim (each of RAPS and SAPS against the one before it).
SCORES = ("lac", "aps", "raps", "saps")
#: RAPS's ``k_reg`` and ``lam`` and SAPS's ``weight``: the package's defaults, not tuned here.
SCORE_OPTIONS: dict[str, Any] = {"k_reg": 1, "lam": 0.01, "weight": 0.2}
#: The measures logged per score and arm (``q``: the threshold).
MEASURES = ("coverage", "size", "sscv", "empty", "singleton", "coverage_gap", "q")
#: Added to a run's seed to seed its draws: ``seed_everything(seed)`` seeded torch's global
#: generator with the seed itself, and the model's initial weights came from it.
DRAWS_SEED = 10_000
#: The share of the validation split whose thresholds the temperature-scaled arm fits.
CONFORMAL_FRACTION = 0.5
#: Tag of a run whose conformal measures are logged: the code version that computed them.
SCORED_BY_TAG = "conformal_code_version"
#: The cross-entropy arm: the verdict's runs, and the reference of (c).
REFERENCE = "ce"
#: Verdict (b): ``(smaller, larger)``, the first score's sets claimed smaller than the second's.
SMALLER = (("raps", "aps"), ("saps", "raps"))
#: The rows of (c): ``(label, variant, after temperature scaling)``.
LOSS_ROWS = (
    ("CE", "ce", False),
    ("CE + TS", "ce", True),
    ("focal (gamma 3)", "focal_3", False),
    ("FLSD-53", "flsd_53", False),
    ("label smoothing 0.1", "label_smoothing", False),
    ("MbLS", "mbls", False),
)
#: The scores of (c).
TABLE_SCORES = ("lac", "aps")
#: The column titles of (c)'s measures.
TITLES = {"coverage": "coverage", "size": "size", "sscv": "SSCV"}


def conformal_key(score: str, measure: str, scaled: bool = False) -> str:
    """The MLflow key of a conformal measure; ``scaled``: after temperature scaling.

    Example:
        >>> conformal_key("aps", "size"), conformal_key("lac", "coverage", scaled=True)
        ('rep/conf_aps_size', 'rep/conf_ts_lac_coverage')
    """
    return f"rep/conf_{'ts_' if scaled else ''}{score}_{measure}"


# --- the measures of one run -----------------------------------------------------------------


def draws(n_val: int, n_test: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """A run's split of the validation samples and its draws ``U``, all float64 in ``[0, 1)``.

    ``g = torch.Generator().manual_seed(DRAWS_SEED + seed)``, then, in this order,
    ``torch.rand(n_val, generator=g, dtype=torch.float64)`` (the split: a validation sample
    calibrates the temperature-scaled arm's thresholds when its number is below
    :data:`CONFORMAL_FRACTION`, else it fits the temperature), the same for the validation
    samples' ``U`` and ``torch.rand(n_test, ...)`` for the test samples' ``U``.

    Example:
        >>> split, u_val, u_test = draws(5, 3, seed=0)
        >>> split.shape, u_val.shape, u_test.shape, u_test.dtype
        (torch.Size([5]), torch.Size([5]), torch.Size([3]), torch.float64)
    """
    import torch

    generator = torch.Generator().manual_seed(DRAWS_SEED + seed)
    split, u_val, u_test = (
        torch.rand(n, generator=generator, dtype=torch.float64) for n in (n_val, n_val, n_test)
    )
    return split, u_val, u_test


def set_measures(sets: Tensor, target: Tensor) -> dict[str, float]:
    """Coverage, mean size, SSCV, empty and singleton rates and class coverage gap of sets.

    Example:
        >>> import torch
        >>> sets = torch.tensor([[True, False], [True, True], [False, False]])
        >>> m = set_measures(sets, torch.tensor([0, 1, 1]))
        >>> m["coverage"], m["size"], m["empty"]
        (0.6666666666666666, 1.0, 0.3333333333333333)
    """
    from lightning_losses.calibration import conformal as cp

    found = cp.set_statistics(sets, target)
    return {name: float(value) for name, value in cp.all_measures(found, alpha=ALPHA).items()}


def arm_metrics(
    calibration: tuple[Tensor, Tensor, Tensor], test: tuple[Tensor, Tensor, Tensor]
) -> dict[str, float]:
    """Each score's threshold on ``calibration``, its sets' measures on ``test``.

    Both are ``(probs [N, C], target [N], U [N])``. For each score of :data:`SCORES`:
    ``q = conformal_threshold(conformal_scores(probs, target, method=score, noise=U), ALPHA)``
    on the calibration samples, the test sets ``{y : s(x, y) <= q}`` with the test samples'
    ``U``, and ``<score>_<measure>`` for each of :data:`MEASURES`; ``n``: the calibration
    samples.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.7, 0.2, 0.1]] * 20, dtype=torch.float64)
        >>> target, u = torch.zeros(20, dtype=torch.long), torch.zeros(20, dtype=torch.float64)
        >>> m = arm_metrics((probs, target, u), (probs, target, u))
        >>> m["n"], m["lac_q"], m["lac_coverage"], m["aps_size"]
        (20.0, 0.30000000000000004, 1.0, 1.0)
    """
    from lightning_losses.calibration import conformal as cp

    probs, target, u = calibration
    test_probs, test_target, test_u = test
    every = cp.all_label_scores_by_method(test_probs, SCORES, noise=test_u, **SCORE_OPTIONS)
    metrics = {"n": float(len(target))}
    for score in SCORES:
        scores = cp.conformal_scores(probs, target, method=score, noise=u, **SCORE_OPTIONS)
        q = cp.conformal_threshold(scores, ALPHA)
        measured = {**set_measures(every[score] <= q, test_target), "q": float(q)}
        metrics.update({f"{score}_{name}": value for name, value in measured.items()})
    return metrics


def _probabilities(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``softmax(logits / T)`` in float64."""
    return (logits.double() / temperature).softmax(dim=1)


def conformal_metrics(
    val: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], seed: int
) -> dict[str, float]:
    """The conformal measures of one run from its validation and test logits and targets.

    ``conf_<score>_<measure>``: thresholds on the whole validation split's softmax;
    ``conf_ts_<score>_<measure>``: the temperature ``T`` (``conf_ts_temperature``,
    :func:`~lightning_losses.calibration.posthoc.temperature.fit_temperature`) fitted on the
    validation samples outside the part :func:`draws` picks, the thresholds on the part's
    ``softmax(logits / T)``; both measured on the test split (:func:`arm_metrics`). ``seed``
    (the run's) seeds the split and the draws.
    """
    from lightning_losses.calibration.posthoc.temperature import fit_temperature

    (val_logits, val_target), (test_logits, test_target) = val, test
    split, u_val, u_test = draws(len(val_target), len(test_target), seed)
    plain = arm_metrics(
        (_probabilities(val_logits), val_target, u_val),
        (_probabilities(test_logits), test_target, u_test),
    )
    part = split < CONFORMAL_FRACTION
    temperature = fit_temperature(val_logits[~part], val_target[~part])
    scaled = arm_metrics(
        (_probabilities(val_logits[part], temperature), val_target[part], u_val[part]),
        (_probabilities(test_logits, temperature), test_target, u_test),
    )
    return {
        **{f"conf_{key}": value for key, value in plain.items()},
        **{f"conf_ts_{key}": value for key, value in scaled.items()},
        "conf_ts_temperature": temperature,
    }


def score_runs(runs: dict[tuple[str, int], str], tracking_uri: str, out: Path) -> int:
    """Log :func:`conformal_metrics` into every run not yet scored by this code version.

    Each run's fitted model is its last checkpoint (and its DataModule its ``config.yaml``,
    :func:`~lightning_losses.reproduce.runner.load_fitted_run`), wherever its fit saved them:
    a run reused from claim 8, or from an earlier code version with ``--post-fit-only``, is
    scored as one trained now. The metrics go in as post-fit metrics (``rep/`` prefix), and
    the run is tagged :data:`SCORED_BY_TAG` with this code version.

    Args:
        runs: ``{(variant, seed): run id}``.
        tracking_uri: the MLflow store of the runs.
        out: the report folder (where a server's runs keep their files).

    Returns:
        How many runs were scored.
    """
    import time

    from lightning_losses.reproduce import version
    from lightning_losses.reproduce.runner import (
        client_for,
        load_fitted_run,
        log_post_fit,
        predict_logits,
        runs_folder,
    )

    client = client_for(tracking_uri)
    folder = runs_folder(tracking_uri, out)
    current = version.code_version()
    started, scored = time.perf_counter(), 0
    for (_, seed), run_id in sorted(runs.items()):
        run = client.get_run(run_id)
        if run.data.tags.get(SCORED_BY_TAG) == current:
            continue
        model, datamodule = load_fitted_run(folder / run.info.experiment_id / run_id)
        val, test = (predict_logits(model, datamodule, split) for split in ("val", "test"))
        metrics = conformal_metrics(val, test, seed)
        log_post_fit(client, run_id, metrics, {}, {SCORED_BY_TAG: current})
        scored += 1
    if scored:
        seconds = time.perf_counter() - started
        print(f"claim 10: prediction sets of {scored} run(s) scored in {seconds:.1f} s")
    return scored


# --- the verdict -----------------------------------------------------------------------------


def coverage_conditions(table: Table) -> list[Condition]:
    """(a): each score's test coverage on the CE runs is ``1 - alpha`` within the margin (TOST).

    Example:
        >>> [c.text for c in coverage_conditions({})][:2]
        ['coverage(ce, lac) ~ 0.9 ± 0.02', 'coverage(ce, aps) ~ 0.9 ± 0.02']
    """
    return [
        against(
            table,
            f"coverage({REFERENCE}, {score}) ~ {TARGET_COVERAGE:g} ± {COVERAGE_MARGIN:g}",
            REFERENCE,
            conformal_key(score, "coverage"),
            EQUIVALENT,
            TARGET_COVERAGE,
            margin=COVERAGE_MARGIN,
        )
        for score in SCORES
    ]


def size_conditions(table: Table) -> list[Condition]:
    """(b): RAPS's mean set size below APS's, SAPS's below RAPS's, paired over the CE seeds.

    Example:
        >>> [c.text for c in size_conditions({})]
        ['size(ce, raps) < size(ce, aps)', 'size(ce, saps) < size(ce, raps)']
    """
    return [
        compare(
            table,
            f"size({REFERENCE}, {smaller}) < size({REFERENCE}, {larger})",
            REFERENCE,
            "<",
            REFERENCE,
            conformal_key(smaller, "size"),
            right_metric=conformal_key(larger, "size"),
        )
        for smaller, larger in SMALLER
    ]


def conformal_conditions(table: Table) -> list[Condition]:
    """Claim 10's verdict: (a) for every score, then (b)."""
    return [*coverage_conditions(table), *size_conditions(table)]


# --- the report ------------------------------------------------------------------------------


def _cell(table: Table, variant: str, metric: str) -> str:
    """``mean ± std`` over the seeds, or ``n/a``."""
    found = stats(table, variant, metric)
    return "n/a" if found.n == 0 else f"{found.mean:.4f} ± {found.std:.4f}"


def scores_markdown(table: Table) -> list[str]:
    """Every score on the CE runs, with and without temperature scaling."""
    lines = [
        f"Every score on `{REFERENCE}`, thresholds on the softmax (the whole validation split) "
        "and after temperature scaling (T on one seeded half, the thresholds on the other); "
        "mean ± std over the seeds:",
        "",
        "| score | coverage | set size | SSCV | empty | singleton | coverage, TS | set size, TS "
        "| SSCV, TS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for score in SCORES:
        plain = [
            _cell(table, REFERENCE, conformal_key(score, m))
            for m in ("coverage", "size", "sscv", "empty", "singleton")
        ]
        scaled = [
            _cell(table, REFERENCE, conformal_key(score, m, scaled=True))
            for m in ("coverage", "size", "sscv")
        ]
        lines.append(f"| {score} | " + " | ".join([*plain, *scaled]) + " |")
    return lines


def against_ce(table: Table, variant: str, scaled: bool, score: str) -> Condition:
    """``size(variant) < size(CE)`` for one score, paired over the seeds, margin SIZE_MARGIN.

    Example:
        >>> against_ce({}, "ce", True, "aps").text
        'size(ce + TS, aps) < size(ce, aps)'
    """
    name = f"{variant} + TS" if scaled else variant
    return compare(
        table,
        f"size({name}, {score}) < size({REFERENCE}, {score})",
        variant,
        "<",
        REFERENCE,
        conformal_key(score, "size", scaled),
        right_metric=conformal_key(score, "size"),
        margin=SIZE_MARGIN,
    )


def present_rows(table: Table) -> list[tuple[str, str, bool]]:
    """The rows of :data:`LOSS_ROWS` with numbers in ``table``."""
    return [
        row for row in LOSS_ROWS if stats(table, row[1], conformal_key("lac", "size", row[2])).n > 0
    ]


def smallest_text(table: Table, score: str) -> str:
    """The row of :data:`LOSS_ROWS` with the smallest mean set size of ``score``.

    Example:
        >>> from lightning_losses.reproduce.spec import Stats
        >>> table = {"ce": {conformal_key("lac", "size"): Stats(1.2, 0, 2, (1.1, 1.3)),
        ...                 conformal_key("lac", "size", True): Stats(1.1, 0, 2, (1.0, 1.2))}}
        >>> smallest_text(table, "lac")
        'CE + TS (1.1000)'
    """
    rows = present_rows(table)
    if not rows:
        return "n/a"

    def size(row: tuple[str, str, bool]) -> float:
        return stats(table, row[1], conformal_key(score, "size", row[2])).mean

    best = min(rows, key=size)
    return f"{best[0]} ({size(best):.4f})"


def losses_markdown(table: Table) -> list[str]:
    """(c): LAC and APS set sizes and SSCV per training loss, and each against CE's."""
    rows = present_rows(table)
    if not rows:
        return []
    columns = [(s, m) for s in TABLE_SCORES for m in ("coverage", "size", "sscv")]
    lines = [
        "(c), outside the verdict: which training loss gives the smallest sets at the same "
        f"coverage (alpha {ALPHA:g}; mean ± std over the seeds; CE + TS: the CE runs after "
        "temperature scaling, thresholds on the other half of the validation split):",
        "",
        "| loss | " + " | ".join(f"{s.upper()} {TITLES[m]}" for s, m in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for label, variant, scaled in rows:
        cells = [_cell(table, variant, conformal_key(s, m, scaled)) for s, m in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Set size against CE's (loss - CE, paired over the seeds; equivalent within "
        f"±{SIZE_MARGIN:g} of a label):",
        "",
        "| loss | " + " | ".join(f"{s.upper()} size below CE's" for s in TABLE_SCORES) + " |",
        "|---|" + "---|" * len(TABLE_SCORES),
    ]
    for label, variant, scaled in rows:
        if (variant, scaled) == (REFERENCE, False):
            continue
        marks = [mark(against_ce(table, variant, scaled, s)) for s in TABLE_SCORES]
        lines.append(f"| {label} | " + " | ".join(marks) + " |")
    smallest = "; ".join(f"{s.upper()} {smallest_text(table, s)}" for s in TABLE_SCORES)
    return [*lines, "", f"Smallest mean set size: {smallest}."]


def conformal_markdown(table: Table) -> list[str]:
    """How the sets were made, every score on CE, and (c)."""
    options = ", ".join(f"{k} {v:g}" for k, v in SCORE_OPTIONS.items())
    return [
        f"Split conformal prediction at alpha {ALPHA:g}, scored from each run's last "
        "checkpoint: each score's threshold is the ceil((n + 1)(1 - alpha))-th smallest "
        "score of the validation split's n samples, and the sets are measured on the test "
        f"split. Scores with the package's hyper-parameters ({options}; not tuned); APS, "
        "RAPS and SAPS randomised, one uniform draw per sample from "
        f"`torch.Generator().manual_seed({DRAWS_SEED} + seed)` (the same draw for every "
        "score and loss of a seed). SSCV: the largest gap between 1 - alpha and the coverage "
        "of a set-size stratum (Angelopoulos et al.'s strata).",
        "",
        *scores_markdown(table),
        "",
        *losses_markdown(table),
    ]


#: The claim's table: test accuracy, then each score's coverage and set size.
COLUMNS = (
    ("rep/test_acc", "test acc"),
    *(
        (conformal_key(score, measure), f"{score.upper()} {title}")
        for score in SCORES
        for measure, title in (("coverage", "coverage"), ("size", "size"))
    ),
)


def _extra_metrics() -> tuple[str, ...]:
    """Every conformal key of both arms that is not a column, the counts and the temperature."""
    keys = [
        conformal_key(score, measure, scaled)
        for scaled in (False, True)
        for score in SCORES
        for measure in MEASURES
    ]
    keys += ["rep/conf_n", "rep/conf_ts_n", "rep/conf_ts_temperature"]
    return tuple(key for key in keys if key not in dict(COLUMNS))


CLAIM_10 = Claim(
    10,
    "mnist1d-conformal",
    "Prediction sets on the overconfident CNN: coverage, RAPS and SAPS against APS, by loss",
    "Split conformal prediction turns a classifier's probabilities into sets that hold the "
    "true label with probability at least 1 - alpha (Vovk et al., 2005). Angelopoulos, Bates, "
    'Malik and Jordan, "Uncertainty Sets for Image Classifiers using Conformal Prediction" '
    "(ICLR 2021): RAPS, APS (Romano et al., NeurIPS 2020) with a penalty on unlikely labels, "
    'gives smaller sets than APS at that coverage; Huang et al., "Conformal Prediction for '
    'Deep Classifier via Label Ranking" (ICML 2024): SAPS, which keeps only the top '
    "probability and the ranks, gives smaller sets than RAPS. On claim 8's overconfident "
    f"MNIST-1D CNN (its runs, scored from their checkpoints) at alpha = {ALPHA:g}: (a) every "
    f"score's test coverage is {TARGET_COVERAGE:.2f} within ±{COVERAGE_MARGIN:g} (LAC, APS, "
    "RAPS, SAPS); (b) RAPS's sets are smaller than APS's and SAPS's than RAPS's. Outside the "
    "verdict, (c): which training loss (CE, CE + temperature scaling, focal, FLSD-53, label "
    "smoothing, MbLS) gives the smallest sets at the same coverage.",
    COLUMNS,
    conformal_conditions,
    f"on the cross-entropy runs, the test coverage of LAC, APS, RAPS and SAPS each equivalent "
    f"to {TARGET_COVERAGE:.2f} within ±{COVERAGE_MARGIN:g} (a: two one-sided tests at 5%, the "
    "90% t interval of the mean inside the margin), and the mean test set size of RAPS below "
    "APS's and SAPS's below RAPS's beyond the seed noise (b: paired over the seeds): "
    "supported if all six hold; not supported if every one fails; mixed if some hold and some "
    "fail; else undecided. (c) is answered in the table, not in the verdict.",
    extra=conformal_markdown,
    extra_metrics=_extra_metrics(),
    after_runs=score_runs,
)
