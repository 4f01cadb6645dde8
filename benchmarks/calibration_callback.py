"""What CalibrationMonitor adds to an epoch of the digits model, measured in one run.

Fits the same ClassifierModule on DigitsDataModule for ``--epochs`` epochs, with and without
the monitor (and with a diagram every epoch, the worst case), ``--repeats`` times each,
interleaved, and prints the median wall time per epoch (training + validation) and the
overhead in percent of the plain run.

Usage::

    python benchmarks/calibration_callback.py [--epochs 10] [--repeats 5] [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import lightning as L
import torch

from lightning_losses.callbacks import CalibrationMonitor
from lightning_losses.cli.quiet import silence_libraries
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.classifier import ClassifierModule

VARIANTS = {
    "no callback": lambda: [],
    "CalibrationMonitor (metrics only, final_diagram=False)": lambda: [
        CalibrationMonitor(final_diagram=False)
    ],
    "CalibrationMonitor (default: metrics, final diagram)": lambda: [CalibrationMonitor()],
    "CalibrationMonitor (diagram every 5 epochs)": lambda: [
        CalibrationMonitor(diagram_every_n_epochs=5)
    ],
    "CalibrationMonitor (diagram every epoch)": lambda: [
        CalibrationMonitor(diagram_every_n_epochs=1)
    ],
}


def fit_seconds(callbacks: list, epochs: int) -> float:
    """Seconds per epoch of one fit of the digits model with ``callbacks``."""
    L.seed_everything(0, verbose=False)
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=epochs,
            logger=L.pytorch.loggers.CSVLogger(root),
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            callbacks=callbacks,
        )
        model = ClassifierModule("ce")
        start = time.perf_counter()
        trainer.fit(model, DigitsDataModule(batch_size=64))
        return (time.perf_counter() - start) / epochs


def main() -> None:
    """Fit each variant ``--repeats`` times, interleaved, and print the overheads."""
    silence_libraries()  # Lightning's tips and device lines stay out of the tables
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    fit_seconds([], 1)  # warm-up: imports, thread pools
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, make in VARIANTS.items():
            times[name].append(fit_seconds(make(), args.epochs))
    base = statistics.median(times["no callback"])
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        rows.append((name, f"{1000 * median:.1f}", f"{100 * (median - base) / base:+.1f}%"))
    title = (
        f"digits MLP, batch 64, {args.epochs} epochs (train + validation), "
        f"median of {args.repeats} runs per variant"
    )
    if args.markdown:
        print(title + "\n")
        print("| variant | ms per epoch | overhead |\n|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        print(title)
        for row in rows:
            print(f"{row[0]:58s} {row[1]:>8s} ms  {row[2]:>7s}")


if __name__ == "__main__":
    main()
