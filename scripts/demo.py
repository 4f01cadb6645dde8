"""The main job: fit a few shipped configs with the CLI and print one comparison table.

Each run is ``lightning-losses fit --config configs/<name>.yaml`` (in this process, so the
progress bars show), the same model, data split, budget and seed for every loss. The table
reports the validation accuracy, negative log-likelihood and expected calibration error (from
the configs' CalibrationMonitor) after the last epoch and the time of one training epoch. Every
run is tracked in MLflow (``sqlite:///mlflow.db`` in the working directory).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from lightning_losses.cli import main

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


def run(name: str, epochs: int) -> dict[str, object]:
    config = ROOT / "configs" / f"{name}.yaml"
    started = time.perf_counter()
    cli = main(["fit", "--config", str(config), f"--trainer.max_epochs={epochs}"])
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


def main_demo(epochs: int = 20) -> None:
    rows = [run(name, epochs) for name in CONFIGS]
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
    print("Runs are tracked in MLflow: `lightning-losses compare --experiment lightning-losses`")
    print("or `mlflow ui --backend-store-uri sqlite:///mlflow.db`.")


if __name__ == "__main__":
    main_demo(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
