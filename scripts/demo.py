"""The main job: fit a few shipped configs with the CLI and print their results, task by task.

Each run is ``lightning-losses fit --config configs/<name>.yaml`` (in this process, through
:func:`lightning_losses.cli.fit.run_fit`), the same model, data split, budget and seed for every
loss. While it runs, one line per config: ``[3/10] digits_focal ... 2.9 s, ETA 20 s``; no
progress bars, and Lightning's and MLflow's info lines, tips and each fit's summary lines stay
out of the terminal. A warning raised
by a run is printed once, at the end, with the configs that raised it. The results, on the
validation split after the last epoch, come in one table per kind of task, since their numbers
do not compare across kinds:

- multiclass (ten digits): accuracy, negative log-likelihood and expected calibration error
  (from the configs' CalibrationMonitor);
- the rare class (binary, about 5% positives, where scoring every sample negative has an
  accuracy of about 0.95): PR-AUC, F1 at 0.5, recall at precision >= 0.9 (as claim 4 of
  ``lightning-losses reproduce`` measures them) and the ECE of the positive-class probability;
- multi-label and n-by-m: accuracy per label / per task, NLL and ECE.

Each table's ``s/epoch`` is the wall time of the last training epoch. Every run is tracked in
MLflow (``sqlite:///mlflow.db`` in the working directory).

Usage: ``python scripts/demo.py [EPOCHS]`` (default 20), or ``make demo``.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [
    "digits_ce",
    "digits_gamma_ce_annealed",
    "digits_focal",
    "digits_soft_accuracy",
    "digits_exact",
    "digits_normface",
    "rare_digit_binary_focal",
    "rare_digit_binary_soft_truncated",
    "digits_multilabel",
    "digits_nm",
]
#: Options that keep each fit quiet: no progress bar, no model summary table.
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def quiet() -> None:
    """Lightning's and MLflow's info lines and warnings off (``LIGHTNING_LOSSES_VERBOSE=1``: on).

    The package's one home for it, :mod:`lightning_losses.cli.quiet`, as for ``lightning-losses``.
    """
    from lightning_losses.cli.quiet import silence_libraries, verbose_requested

    if not verbose_requested():
        silence_libraries()


def run(name: str, epochs: int, seen: dict[str, list[str]]) -> dict[str, object]:
    """Fit one config; record each warning it raises in ``seen`` (message -> configs)."""
    from lightning_losses.cli.fit import run_fit
    from lightning_losses.cli.quiet import fit_output_aside

    config = ROOT / "configs" / f"{name}.yaml"
    started = time.perf_counter()
    # Each fit's own summary lines (criterion, MLflow run) go to a buffer: the line per config
    # below says what the demo needs; every run is in the store.
    with warnings.catch_warnings(record=True) as caught, fit_output_aside():
        warnings.simplefilter("always")
        for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
            warnings.simplefilter("ignore", category)  # library internals, not the user's run
        cli = run_fit(["--config", str(config), f"--trainer.max_epochs={epochs}", *QUIET])
    for warning in caught:
        seen.setdefault(str(warning.message).strip(), []).append(name)
    metrics = cli.trainer.callback_metrics
    row: dict[str, object] = {
        "config": name,
        "loss": type(cli.model.criterion).__name__,
        "task": cli.model.task,
        "acc": float(metrics["val/acc"]),
        "nll": float(metrics["val/nll"]),
        "ece": float(metrics["val/ece"]),
        "epoch_s": float(metrics["time/epoch_seconds"]),
    }
    if row["task"] == "binary":
        row.update(rare_class(cli))
    row["total_s"] = time.perf_counter() - started
    return row


def rare_class(cli: object) -> dict[str, float]:
    """PR-AUC, F1 and recall at precision 0.9 on the validation split, and its positive share.

    The functions claim 4 of ``lightning-losses reproduce`` scores the rare class with.
    """
    from lightning_losses.reproduce.runner import binary_metrics, predict_logits

    logits, target = predict_logits(cli.model, cli.datamodule, "val")  # type: ignore[attr-defined]
    scores = binary_metrics(logits, target)
    scores["positives"] = float(target.float().mean())
    return {k: scores[k] for k in ("pr_auc", "f1", "recall_at_p90", "positives")}


def progress_line(k: int, n: int, name: str, seconds: float, elapsed: float) -> str:
    """``[3/10] digits_focal ... 2.9 s, ETA 20 s`` (the ETA from the mean time so far).

    Example:
        >>> progress_line(3, 10, "digits_focal", 2.94, 9.0)
        '[3/10] digits_focal                       ... 2.9 s, ETA 21 s'
    """
    eta = elapsed / k * (n - k)
    return f"[{k}/{n}] {name:34s} ... {seconds:.1f} s, ETA {eta:.0f} s"


#: The tables: (title, tasks, columns), a column as (header, row key, width, format).
TABLES = [
    (
        "Multiclass (ten digits)",
        ("multiclass",),
        [("acc", "acc", 7, ".4f"), ("NLL", "nll", 7, ".4f"), ("ECE", "ece", 7, ".4f")],
    ),
    (
        "Rare class (binary; accuracy does not compare: all-negative scores 1 - positives)",
        ("binary",),
        [
            ("positives", "positives", 9, ".1%"),
            ("PR-AUC", "pr_auc", 7, ".4f"),
            ("F1", "f1", 7, ".4f"),
            ("R@P0.9", "recall_at_p90", 7, ".4f"),
            ("ECE", "ece", 7, ".4f"),
        ],
    ),
    (
        "Multi-label and n-by-m: acc per label (multilabel), target ranked first per task (nm)",
        ("multilabel", "nm"),
        [
            ("task", "task", 10, "s"),
            ("acc", "acc", 7, ".4f"),
            ("NLL", "nll", 7, ".4f"),
            ("ECE", "ece", 7, ".4f"),
        ],
    ),
]


def table_lines(rows: list[dict[str, object]], title: str, columns: list) -> list[str]:
    """One table: its title, header, rule and one line per row (each ends with ``s/epoch``).

    Example:
        >>> row = {"config": "digits_ce", "loss": "CrossEntropyLoss", "acc": 0.9, "epoch_s": 0.1}
        >>> for line in table_lines([row], "Multiclass", [("acc", "acc", 7, ".4f")]):
        ...     print(line.rstrip())
        Multiclass
        config    loss                 acc  s/epoch
        -------------------------------------------
        digits_ce CrossEntropyLoss  0.9000    0.100
    """
    columns = [*columns, ("s/epoch", "epoch_s", 8, ".3f")]
    name = max(len("config"), *(len(str(r["config"])) for r in rows))
    loss = max(len("loss"), *(len(str(r["loss"])) for r in rows))
    header = f"{'config':{name}s} {'loss':{loss}s}" + "".join(
        f" {h:>{w}s}" for h, _, w, _ in columns
    )
    lines = [title, header, "-" * len(header)]
    for r in rows:
        cells = "".join(f" {format(r[key], fmt):>{w}s}" for _, key, w, fmt in columns)
        lines.append(f"{r['config']:{name}s} {r['loss']:{loss}s}{cells}")
    return lines


def print_table(rows: list[dict[str, object]], epochs: int) -> None:
    """Print the demo's results: one table per kind of task, then where the runs are."""
    print(f"\nlightning-losses demo: {epochs} epochs each, validation split after the last epoch")
    for title, tasks, columns in TABLES:
        chosen = [r for r in rows if r["task"] in tasks]
        if chosen:
            print("\n".join(["", *table_lines(chosen, title, columns)]))
    print("\nNLL: softmax cross-entropy (multiclass, per task for nm) or sigmoid BCE (binary,")
    print("multi-label) of the model's probabilities, whatever loss trained it.")
    print("ECE: top-label, 15 equal-width bins (binary: the positive-class probability).")
    print("R@P0.9: recall at precision >= 0.9. s/epoch: wall time of the last training epoch.")
    # The hints as this shell can run them: bare where the interpreter's scripts folder is on
    # PATH (an activated venv), else by that folder's path (`.venv/bin/...` after `make demo`).
    scripts = Path(sys.executable).parent
    prefix = ""
    if str(scripts) not in os.environ.get("PATH", "").split(os.pathsep):
        here = Path.cwd()
        prefix = f"{scripts.relative_to(here) if scripts.is_relative_to(here) else scripts}/"
    print(
        f"Runs are tracked in MLflow: `{prefix}lightning-losses compare --experiment "
        "lightning-losses`"
    )
    print(f"or `{prefix}mlflow ui --backend-store-uri sqlite:///mlflow.db`.")
    if prefix and (scripts / "activate").is_file():
        print(f"`source {prefix}activate` puts both commands on your PATH.")


def main_demo(epochs: int = 20, configs: list[str] | None = None) -> list[dict[str, object]]:
    """Fit ``configs`` (default: :data:`CONFIGS`) for ``epochs`` each; print lines and table."""
    quiet()
    names = list(configs or CONFIGS)
    seen: dict[str, list[str]] = {}
    rows = []
    started = time.perf_counter()
    for k, name in enumerate(names, 1):
        row = run(name, epochs, seen)
        rows.append(row)
        elapsed = time.perf_counter() - started
        print(progress_line(k, len(names), name, float(row["total_s"]), elapsed), flush=True)
    print_table(rows, epochs)
    for message, where in seen.items():
        print(f"warning ({', '.join(dict.fromkeys(where))}): {message}", file=sys.stderr)
    print(f"demo: {len(names)} configs in {time.perf_counter() - started:.0f} s")
    return rows


if __name__ == "__main__":
    main_demo(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
