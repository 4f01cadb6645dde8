"""Aggregate runs read back from MLflow into tables, verdicts, figures and ``REPORT.md``.

The report names the code version of every claim's runs (their MLflow tag
``lightning_losses.code_version``) and ends with an appendix of every per-seed value of every
arm (variant x metric x seed), from which each verdict can be recomputed.
"""

from __future__ import annotations

import math
import re
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lightning_losses.reproduce.bins import BINS_ARTIFACT, SCALED_BINS_ARTIFACT
from lightning_losses.reproduce.runner import (
    PR_ARTIFACT,
    TEST_NLL_CURVE,
    as_array,
    client_for,
    read_code_version,
    read_json,
    read_metrics,
    run_seconds,
)
from lightning_losses.reproduce.spec import (
    LEVEL,
    MISSING,
    Claim,
    Condition,
    Stats,
    Table,
    stats,
    verdict_text,
)

#: Val metrics drawn as curves (MLflow history of the first seed).
CURVES = ("val/acc", "val/ece")


@dataclass
class ClaimResult:
    """Everything the report says about one claim.

    Args:
        claim: the claim.
        runs: ``{(variant, seed): run_id}``.
        metrics: ``{run_id: {metric: value}}`` read from MLflow.
        table: ``table[variant][metric] = (mean, std, n)``.
        conditions: the verdict conditions evaluated on ``table``.
        figures: paths of the figures, relative to the report.
        epochs: ``{variant: epochs}`` actually run.
        reused: how many runs already existed.
        seconds: wall time of all its runs, from MLflow's start and end times.
        failures: ``"<variant> seed <s>: <error>"`` for each run that failed.
        code_versions: ``{run_id: code version}``, the runs' ``lightning_losses.code_version``
            tags (``unknown`` for a run without one).
    """

    claim: Claim
    runs: dict[tuple[str, int], str]
    metrics: dict[str, dict[str, float]]
    table: Table
    conditions: list[Condition]
    figures: list[str] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)
    reused: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    code_versions: dict[str, str] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """``supported`` / ``not supported`` / ``mixed`` / ``undecided (needs ~k seeds)``."""
        return verdict_text(self.conditions)

    @property
    def versions_text(self) -> str:
        """The code versions of the runs, e.g. ```0.1.0+src.0123456789ab``` (sorted)."""
        versions = sorted(set(self.code_versions.values()))
        return ", ".join(f"`{v}`" for v in versions) if versions else "none (no runs)"


def mean_std(values: Sequence[float]) -> Stats:
    """Mean, sample std and count of the finite values (std 0 for one value, NaNs when empty).

    The values themselves are kept (in the order given) for paired comparisons.
    """
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return Stats(math.nan, math.nan, 0, tuple(values))
    std = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return Stats(statistics.fmean(finite), std, len(finite), tuple(values))


def aggregate(
    runs: Mapping[tuple[str, int], str],
    metrics: Mapping[str, Mapping[str, float]],
    keys: Sequence[str],
) -> dict[str, dict[str, Stats]]:
    """Mean ± std over seeds of each metric key, per variant.

    ``Stats.values`` has one entry per seed of the claim, in seed order, NaN where the variant
    has no run for that seed (a failed run), so that paired comparisons pair the same seeds.
    """
    table: dict[str, dict[str, Stats]] = {}
    variants = dict.fromkeys(v for v, _ in runs)
    seeds = sorted({seed for _, seed in runs})
    for variant in variants:
        ids = [runs.get((variant, seed)) for seed in seeds]
        table[variant] = {
            key: mean_std([metrics[r].get(key, math.nan) if r else math.nan for r in ids])
            for key in keys
        }
    return table


def collect(claim: Claim, runs: dict[tuple[str, int], str], tracking_uri: str) -> ClaimResult:
    """Read the runs' metrics from MLflow and evaluate the claim's verdict on them."""
    client = client_for(tracking_uri)
    metrics = {run_id: read_metrics(client, run_id) for run_id in runs.values()}
    keys = [key for key, _ in claim.metrics]
    if claim.number != 1:
        keys += ["rep/test_acc", "rep/test_pr_auc", "rep/scale", "rep/test_ece"]
        keys += claim.extra_metrics
    else:
        keys = sorted({k for m in metrics.values() for k in m})
    table = aggregate(runs, metrics, list(dict.fromkeys(keys)))
    seconds = sum(run_seconds(client, run_id) for run_id in runs.values())
    versions = {run_id: read_code_version(client, run_id) for run_id in runs.values()}
    return ClaimResult(
        claim,
        runs,
        metrics,
        table,
        claim.conditions(table),
        seconds=seconds,
        code_versions=versions,
    )


# --- figures -----------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def first_seed_runs(result: ClaimResult) -> dict[str, str]:
    """``{variant: run_id}`` of the lowest seed of each variant."""
    chosen: dict[str, tuple[int, str]] = {}
    for (variant, seed), run_id in result.runs.items():
        if variant not in chosen or seed < chosen[variant][0]:
            chosen[variant] = (seed, run_id)
    return {variant: run_id for variant, (_, run_id) in chosen.items()}


def curves_figure(result: ClaimResult, tracking_uri: str, path: Path) -> bool:
    """Val accuracy and ECE per epoch (first seed of each variant), one value per step.

    The histories are read with :func:`lightning_losses.tracking.metric_history`, so a
    resumed run draws its resumed values only.
    """
    from lightning_losses.tracking import metric_history

    client = client_for(tracking_uri)
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(CURVES), figsize=(5 * len(CURVES), 4))
    drawn = False
    for variant, run_id in first_seed_runs(result).items():
        for ax, key in zip(axes, CURVES, strict=True):
            history = metric_history(client, run_id, key)
            if history:
                ax.plot(range(1, len(history) + 1), [m.value for m in history], label=variant)
                ax.set_title(key)
                ax.set_xlabel("validation epoch")
                drawn = True
    if drawn:
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
    plt.close(fig)
    return drawn


def reliability_figures(result: ClaimResult, tracking_uri: str, out: Path) -> list[str]:
    """One test reliability diagram per variant (first seed), from the bins logged in MLflow."""
    from lightning_losses.calibration.diagram import reliability_diagram

    client = client_for(tracking_uri)
    plt = _pyplot()
    names = []
    for variant, run_id in first_seed_runs(result).items():
        with tempfile.TemporaryDirectory() as scratch:
            bins = read_json(client, run_id, BINS_ARTIFACT, Path(scratch))
        if bins is None:
            continue
        name = f"claim{result.claim.number}_reliability_{variant}.png"
        counts = (as_array(bins[key]) for key in ("count", "conf_sum", "correct"))
        fig = reliability_diagram(*counts, path=out / name, title=f"{variant} (test)")
        plt.close(fig)
        names.append(name)
    return names


def nll_curves_figure(result: ClaimResult, tracking_uri: str, path: Path) -> bool:
    """Test NLL against training step (first seed of each variant), from the SplitCurves log.

    Nothing is drawn for a claim whose runs have no ``curve/test_nll`` history.
    """
    from lightning_losses.tracking import metric_history

    client = client_for(tracking_uri)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    drawn = False
    for variant, run_id in first_seed_runs(result).items():
        history = metric_history(client, run_id, TEST_NLL_CURVE)
        if history:
            ax.plot([m.step for m in history], [m.value for m in history], label=variant)
            drawn = True
    if drawn:
        ax.set_xlabel("training step")
        ax.set_ylabel("test NLL")
        ax.set_title(f"claim {result.claim.number}: test NLL during training (first seed)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
    plt.close(fig)
    return drawn


def best_variant(result: ClaimResult, metric: str, exclude: str = "ce") -> str | None:
    """The variant other than ``exclude`` with the lowest mean ``metric`` (None if none)."""
    candidates = [
        name
        for name in result.table
        if name != exclude and not math.isnan(stats(result.table, name, metric).mean)
    ]
    return min(candidates, key=lambda n: stats(result.table, n, metric).mean, default=None)


def scaling_reliability_figures(result: ClaimResult, tracking_uri: str, out: Path) -> list[str]:
    """Test reliability diagrams before and after temperature scaling, from MLflow's bins.

    Of CE and of the loss with the lowest mean test ECE, first seed.
    """
    from lightning_losses.calibration.diagram import reliability_diagram

    best = best_variant(result, "rep/test_ece")
    runs = first_seed_runs(result)
    if best is None or "ce" not in runs:
        return []
    client = client_for(tracking_uri)
    plt = _pyplot()
    names = []
    for variant in ("ce", best):
        for artifact, suffix, when in (
            (BINS_ARTIFACT, "", "test"),
            (SCALED_BINS_ARTIFACT, "_scaled", "test, after temperature scaling"),
        ):
            with tempfile.TemporaryDirectory() as scratch:
                bins = read_json(client, runs[variant], artifact, Path(scratch))
            if bins is None:
                continue
            name = f"claim{result.claim.number}_reliability_{variant}{suffix}.png"
            counts = (as_array(bins[key]) for key in ("count", "conf_sum", "correct"))
            plt.close(reliability_diagram(*counts, path=out / name, title=f"{variant} ({when})"))
            names.append(name)
    return names


def pr_figure(result: ClaimResult, tracking_uri: str, path: Path) -> bool:
    """Test precision-recall curves of the rare class, first seed of each variant."""
    client = client_for(tracking_uri)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    drawn = False
    for variant, run_id in first_seed_runs(result).items():
        with tempfile.TemporaryDirectory() as scratch:
            curve = read_json(client, run_id, PR_ARTIFACT, Path(scratch))
        if curve is not None:
            ax.step(curve["recall"], curve["precision"], where="post", label=variant)
            drawn = True
    if drawn:
        ax.set_xlabel("recall")
        ax.set_ylabel("precision")
        ax.set_title("rare class, test split, first seed")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
    plt.close(fig)
    return drawn


def metrics_figure(result: ClaimResult, path: Path) -> bool:
    """The claim's table as bars: one panel per metric, a bar per variant, ± std over seeds."""
    claim = result.claim
    variants = [v.name for v in claim.variants if v.name in result.table]
    metrics = [(key, title) for key, title in claim.metrics if key != "rep/scale"]
    if not variants or not metrics:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(metrics), figsize=(3.2 * len(metrics), 0.35 * len(variants) + 1.6), squeeze=False
    )
    for ax, (key, title) in zip(axes[0], metrics, strict=True):
        stats = [result.table[v].get(key, MISSING) for v in variants]
        ax.barh(
            range(len(variants)),
            [s.mean for s in stats],
            xerr=[s.std for s in stats],
            color="tab:blue",
            alpha=0.75,
            capsize=3,
        )
        ax.set_yticks(range(len(variants)), variants if ax is axes[0][0] else [], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"claim {claim.number}: test metrics, mean ± std over seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _points(table: Table, prefix: str, invert: bool = False) -> list[tuple[float, str]]:
    """``(x, variant)`` sorted by ``x``, for variants named ``<prefix><number>`` exactly."""
    points = []
    for name in table:
        suffix = name[len(prefix) :]
        if name.startswith(prefix) and re.fullmatch(r"\d+(\.\d+)?", suffix):
            value = float(suffix)
            points.append((1 / value if invert else value, name))
    return sorted(points)


def scale_figure(result: ClaimResult, path: Path) -> bool:
    """Claim 5: test accuracy and ECE against the temperature and the NormFace scale.

    The x values come from the variant names of the experiment file: ``temperature_<t>``
    (drawn at ``1 / t``) and ``normface_s<s>``.
    """
    from lightning_losses.functional import normface_min_scale

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    series = {
        "1 / temperature (linear head)": _points(result.table, "temperature_", invert=True),
        "NormFace scale": _points(result.table, "normface_s"),
    }
    for ax, key in zip(axes, ("rep/test_acc", "rep/test_ece"), strict=True):
        for label, points in series.items():
            xs = [x for x, _ in points]
            ys = [result.table[v][key][0] for _, v in points]
            ax.plot(xs, ys, marker="o", label=label)
        learned = stats(result.table, "normface_learned", "rep/scale").mean
        ax.axvline(learned, color="k", ls="--", label=f"learned scale {learned:.2f}")
        ax.axvline(normface_min_scale(10, 0.9), color="r", ls=":", label="min scale (p=0.9)")
        ax.set_xscale("log")
        ax.set_title(key)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


# --- markdown ----------------------------------------------------------------------------------


def cell(stats: Stats) -> str:
    """``mean ± std`` with four decimals (``n/a`` when missing)."""
    if stats.n == 0:
        return "n/a"
    return f"{stats.mean:.4f} ± {stats.std:.4f}"


def table_markdown(result: ClaimResult) -> list[str]:
    """The claim's table: one row per variant, mean ± std over seeds."""
    claim = result.claim
    header = ["variant", "what", "epochs", "seeds", *(title for _, title in claim.metrics)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for variant in claim.variants:
        row = result.table.get(variant.name)
        if row is None:
            continue
        seeds = sum(1 for v, _ in result.runs if v == variant.name)
        cells = [cell(row.get(key, MISSING)) for key, _ in claim.metrics]
        epochs = str(result.epochs.get(variant.name, ""))
        lines.append(
            "| " + " | ".join([variant.name, variant.label, epochs, str(seeds), *cells]) + " |"
        )
    return lines


def runs_markdown(result: ClaimResult) -> list[str]:
    """The MLflow run ids behind the table."""
    lines = ["| variant | seed | MLflow run id |", "|---|---|---|"]
    for (variant, seed), run_id in sorted(result.runs.items()):
        lines.append(f"| {variant} | {seed} | `{run_id}` |")
    return lines


def failures_markdown(result: ClaimResult) -> list[str]:
    """The failed runs of a claim (nothing when none failed)."""
    if not result.failures:
        return []
    lines = ["**Failed runs** (missing from the table; a missing number never holds):", ""]
    return [*lines, *(f"- {failure}" for failure in result.failures), ""]


def claim_markdown(result: ClaimResult) -> list[str]:
    """The section of one claim."""
    claim = result.claim
    numbers = "; ".join(c.describe() for c in result.conditions)
    lines = [
        f"## Claim {claim.number}: {claim.title}",
        "",
        claim.statement,
        "",
        f"MLflow experiment `{claim.experiment}`; {len(result.runs)} runs "
        f"({result.reused} reused from earlier invocations) that took {result.seconds:.0f} s; "
        f"code version of the runs: {result.versions_text}.",
        "",
        *table_markdown(result),
        "",
        *([*claim.extra(result.table), ""] if claim.extra else []),
        *failures_markdown(result),
        f"**Verdict: {result.verdict}** — {numbers}.",
        "",
        f"Rule: {claim.rule}",
        "",
        *(f"- {c.describe()}" for c in result.conditions),
        "",
        f"Per-seed values: [appendix]({appendix_anchor(claim)}).",
        "",
        *(f"![{name}]({name})" for name in result.figures),
        "",
        "<details><summary>run ids</summary>",
        "",
        *runs_markdown(result),
        "",
        "</details>",
        "",
    ]
    return lines


BUDGET = (
    "Same budget and tuning effort for every loss: within a claim every trained variant uses "
    "the same model, optimizer, batch size, seeds and number of epochs: on digits (claims 2-6) "
    "an MLP (hidden 128, 64), Adam with lr 0.003, batch 64 (the exceptions are the `*_long` "
    "arms, claim 4's hard truncation and claim 5's temperature 100, whose extra epochs are what "
    "they test); on MNIST-1D (claims 7-8; claim 10 scores claim 8's runs) the recipe of the "
    "shipped `configs/mnist1d_*.yaml`, "
    "the paper's: all 4,000 training samples, Adam with lr 0.01, batch 100, 150 epochs (6,000 "
    "steps), validation on 1,000 separately generated samples, and the CNN for every loss; on "
    "the language model (claim 9) the shipped `configs/lm/lm_*.yaml`: a 2-layer causal "
    "Transformer of width 128 on Python's own documentation, AdamW with lr 0.002, batch 32 "
    "windows of 32 tokens, 8 epochs, with a tenth of the topics for validation and a tenth "
    "for testing, and the same recipe for its Llama-architecture arms (`hf_*`: the shipped "
    "`configs/lm/hf_llama_tiny_*.yaml`, transformers' `LlamaForCausalLM` of 2 layers and "
    "width 128 with a byte-level BPE trained on the training topics). Every loss keeps the "
    "hyper-parameters of its "
    "shipped config (those of its source) and none was tuned. Numbers are computed after "
    "fit on the test split (claim 9: the test topics' tokens) from the fitted (last-epoch) "
    "model and logged into each run as "
    "`rep/*` metrics; temperature scaling (`TS`, `ts_*`) is fitted on the validation split's "
    "logits and applied to the test logits. Every number in the tables is read "
    "back from MLflow, and the appendix lists each seed's value.\n\n"
    f"How a verdict is reached. Variants share seeds (the data split and, for the same "
    f"architecture, the initial weights), so two variants are compared on their per-seed "
    f"differences, a number against a constant on each seed's difference from it, with "
    f"Student's t for the number of seeds: the {LEVEL:.0%} interval of the mean difference. "
    f"A claimed difference (`<`, `>`) holds when that interval lies on the claimed side of 0 "
    f"and fails when it lies on the other side. A claim that two things are about the same "
    f"(`~`), or that one is not below another by more than a margin (`>=`, `<=`), states its "
    f"equivalence margin (accuracy ±0.01, claim 7's published accuracy ±0.03, ECE ±0.005 in "
    f"claim 8's per-loss table) and is tested by "
    f"two one-sided tests (TOST) at {1 - LEVEL:.0%}: failing to find a difference is never "
    f"taken for equivalence. What the data cannot decide is `undecided`, with the number of "
    f"seeds the same mean and spread would need (`undecided (needs ~k seeds)`). A verdict is "
    f"`supported` when every condition holds, `not supported` when every one fails, `mixed` "
    f"when some hold and some fail, and `undecided (needs ~k seeds)` otherwise. The bar "
    f"charts (`claim<n>_metrics.png`) show the spread over seeds (± std); the verdicts use the "
    f"paired differences, whose noise is smaller because the seeds are shared."
)


def appendix_anchor(claim: Claim) -> str:
    """The link target of a claim's part of the appendix, e.g. ``#claim-3-per-seed-values``."""
    return f"#claim-{claim.number}-per-seed-values"


def value_text(value: float) -> str:
    """A per-seed value as Python writes a float: the shortest text that reads back exactly.

    Example:
        >>> value_text(0.1 + 0.2), value_text(float("nan"))
        ('0.30000000000000004', 'n/a')
    """
    return "n/a" if math.isnan(value) else repr(float(value))


def appendix_markdown(result: ClaimResult) -> list[str]:
    """Every per-seed value of every arm of a claim: one row per (variant, metric).

    The values are those the table and the verdict were computed from, written so that they
    read back exactly; a seed without a run, or a run without the metric, is ``n/a``.
    """
    claim = result.claim
    seeds = sorted({seed for _, seed in result.runs})
    lines = [
        f"### Claim {claim.number}: per-seed values",
        "",
        f"Code version of the runs: {result.versions_text}.",
        "",
        "| variant | metric | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---|---|" + "---|" * len(seeds),
    ]
    names = [v.name for v in claim.variants if v.name in result.table]
    names += [name for name in result.table if name not in names]
    for name in names:
        for metric, values in result.table[name].items():
            if not any(not math.isnan(v) for v in values.values):
                continue
            cells = [value_text(v) for v in values.values]
            lines.append(f"| {name} | `{metric}` | " + " | ".join(cells) + " |")
    return [*lines, ""]


def write_report(results: Sequence[ClaimResult], out: Path, header: Sequence[str]) -> Path:
    """Write ``REPORT.md`` into ``out`` and return its path."""
    lines = [
        "# Reproduction report",
        "",
        *header,
        "",
        BUDGET,
        "",
        "| claim | verdict |",
        "|---|---|",
    ]
    lines += [f"| {r.claim.number}. {r.claim.title} | {r.verdict} |" for r in results]
    lines.append("")
    for result in results:
        lines += claim_markdown(result)
    lines += [
        "## Appendix: per-seed values",
        "",
        "Each value of each arm (variant x metric x seed) behind the tables and the verdicts, "
        "as read back from MLflow, written so that it reads back exactly: every verdict can "
        "be recomputed from them (seed s of one variant is paired with seed s of another).",
        "",
    ]
    for result in results:
        lines += appendix_markdown(result)
    path = out / "REPORT.md"
    path.write_text("\n".join(lines) + "\n")
    return path
