"""The main job: fit a few shipped configs with the CLI and print one comparison table.

Each run is ``lightning-losses fit --config configs/<name>.yaml`` (in this process, through
:func:`lightning_losses.cli.fit.run_fit`), the same model, data split, budget and seed for every
loss. While it runs, one line per config: ``[3/10] digits_focal ... 2.9 s, ETA 20 s``; no
progress bars, and Lightning's and MLflow's info lines, tips and each fit's summary lines stay
out of the terminal. A warning raised
by a run is printed once, at the end, with the configs that raised it. The table reports the
validation accuracy, negative log-likelihood and expected calibration error (from the configs'
CalibrationMonitor) after the last epoch, and the time of one training epoch. Every run is
tracked in MLflow (``sqlite:///mlflow.db`` in the working directory).

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
    return {
        "config": name,
        "loss": type(cli.model.criterion).__name__,
        "task": cli.model.task,
        "acc": float(metrics["val/acc"]),
        "nll": float(metrics["val/nll"]),
        "ece": float(metrics["val/ece"]),
        "epoch_s": float(metrics["time/epoch_seconds"]),
        "total_s": time.perf_counter() - started,
    }


def progress_line(k: int, n: int, name: str, seconds: float, elapsed: float) -> str:
    """``[3/10] digits_focal ... 2.9 s, ETA 20 s`` (the ETA from the mean time so far).

    Example:
        >>> progress_line(3, 10, "digits_focal", 2.94, 9.0)
        '[3/10] digits_focal                       ... 2.9 s, ETA 21 s'
    """
    eta = elapsed / k * (n - k)
    return f"[{k}/{n}] {name:34s} ... {seconds:.1f} s, ETA {eta:.0f} s"


def print_table(rows: list[dict[str, object]], epochs: int) -> None:
    """Print the demo's results, one row per config."""
    print(f"\nlightning-losses demo: {epochs} epochs each, validation split after the last epoch")
    header = (
        f"{'config':34s} {'loss':38s} {'task':10s} {'acc':>7s} {'NLL':>7s} {'ECE':>7s} "
        f"{'epoch s':>8s}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['config']:34s} {r['loss']:38s} {r['task']:10s} {r['acc']:7.4f} "
            f"{r['nll']:7.4f} {r['ece']:7.4f} {r['epoch_s']:8.3f}"
        )
    print("NLL: softmax cross-entropy (multiclass, per task for nm) or sigmoid BCE (binary,")
    print("multi-label) of the model's probabilities, whatever loss trained it.")
    print("ECE: top-label, 15 equal-width bins (binary: the positive-class probability).")
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
