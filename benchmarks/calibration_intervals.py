"""What the error bars cost the CalibrationMonitor, and how often their intervals cover.

Cost (default): a real ``trainer.validate`` of a module that returns stored ``[N, C]`` logits
(float32, in batches), with no callback, with ``CalibrationMonitor()`` and with
``CalibrationMonitor(intervals=True)`` (and ``debiased=True``; ``--smooth`` adds the smooth
variants), ``--repeats`` times each, interleaved. The monitor's cost is a variant's median time
minus that of the run without a callback; the ratio is intervals on over intervals off.

Coverage (``--coverage``): the simulation behind the coverage table of the docs. Confidences
``c ~ Beta(4, 1.5)``, outcomes ``y ~ Bernoulli(f(c))`` for several calibration curves ``f``,
binary preds ``c``; for each of ``--draws`` independent draws (data seed and bootstrap seed
``d``) it asks whether the 95% interval of :func:`calibration_error_interval` covers the
population binned ECE (midpoint rule on 2,000,000 points), and prints the share that do, and
the shares missed below the low end and above the high end.

Usage::

    python benchmarks/calibration_intervals.py [--rows 100000] [--classes 100] [--repeats 5]
    python benchmarks/calibration_intervals.py --coverage [--draws 400]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
import warnings

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from lightning_losses.calibration import calibration_error_interval
from lightning_losses.callbacks import CalibrationMonitor
from lightning_losses.cli.quiet import silence_libraries


class Stored(L.LightningModule):
    """Returns the stored logits of each batch of row indices: the monitor is the only work."""

    def __init__(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        super().__init__()
        self.logits, self.target = logits, target

    def validation_step(self, rows, batch_idx):
        """The stored logits and targets of the batch's rows."""
        return {"logits": self.logits[rows], "target": self.target[rows]}


def validate_seconds(callbacks: list, module: Stored, batch_size: int) -> float:
    """Seconds of one ``trainer.validate`` of ``module`` with ``callbacks``."""
    rows = DataLoader(torch.arange(module.logits.shape[0]), batch_size=batch_size)
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            logger=False,
            default_root_dir=root,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            callbacks=callbacks,
        )
        start = time.perf_counter()
        trainer.validate(module, rows, verbose=False)
        return time.perf_counter() - start


def cost(args: argparse.Namespace) -> None:
    """Print what each monitor variant adds to a validation of stored logits."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(args.rows, args.classes, generator=generator) * 3
    target = torch.randint(0, args.classes, (args.rows,), generator=generator)
    module = Stored(logits, target)
    variants = {
        "no callback": dict,
        "CalibrationMonitor()": lambda: {"final_diagram": False},
        "CalibrationMonitor(intervals=True)": lambda: {"final_diagram": False, "intervals": True},
        "CalibrationMonitor(intervals=True, debiased=True)": lambda: {
            "final_diagram": False,
            "intervals": True,
            "debiased": True,
        },
    }
    if args.smooth:
        variants["CalibrationMonitor(smooth=True)"] = lambda: {
            "final_diagram": False,
            "smooth": True,
        }
        variants["CalibrationMonitor(smooth=True, intervals=True)"] = lambda: {
            "final_diagram": False,
            "smooth": True,
            "intervals": True,
        }
    validate_seconds([CalibrationMonitor(final_diagram=False)], module, args.batch_size)  # warm
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, options in variants.items():
            built = options()
            callbacks = [CalibrationMonitor(**built)] if name != "no callback" else []
            times[name].append(validate_seconds(callbacks, module, args.batch_size))
    base = statistics.median(times["no callback"])
    plain = statistics.median(times["CalibrationMonitor()"]) - base
    smooth_plain = (
        statistics.median(times["CalibrationMonitor(smooth=True)"]) - base if args.smooth else None
    )
    print(
        f"validate on [{args.rows:,}, {args.classes}] float32 logits, batches of "
        f"{args.batch_size}, {torch.get_num_threads()} thread(s), median of {args.repeats}\n"
    )
    print("| variant | s per validation | monitor's cost (s) | cost / monitor without intervals |")
    print("|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        if name == "no callback":
            print(f"| {name} | {median:.3f} | - | - |")
            continue
        reference = smooth_plain if "smooth" in name else plain
        print(
            f"| {name} | {median:.3f} | {median - base:.3f} | {(median - base) / reference:.2f}x |"
        )


CURVES = {
    "calibrated, f(c) = c": lambda c: c,
    "over-confident, f(c) = c^1.6": lambda c: c**1.6,
    "over-confident, f(c) = c - 0.08": lambda c: np.clip(c - 0.08, 0, 1),
    "under-confident, f(c) = c + 0.05": lambda c: np.clip(c + 0.05, 0, 1),
    "slightly off, f(c) = c^1.1": lambda c: c**1.1,
    "slightly off, f(c) = c + 0.03 sin(2 pi c)": lambda c: np.clip(
        c + 0.03 * np.sin(2 * np.pi * c), 0, 1
    ),
}
ALPHA, BETA, BINS = 4.0, 1.5, 15


def population_ece(curve) -> float:
    """The binned ECE of ``curve`` under Beta(4, 1.5) confidences (midpoint rule)."""
    points = 2_000_000
    c = (np.arange(points) + 0.5) / points
    log_norm = math.lgamma(ALPHA + BETA) - math.lgamma(ALPHA) - math.lgamma(BETA)
    weight = np.exp((ALPHA - 1) * np.log(c) + (BETA - 1) * np.log1p(-c) + log_norm) / points
    k = np.clip(np.ceil(c * BINS) - 1, 0, BINS - 1).astype(np.int64)
    return float(np.abs(np.bincount(k, (c - curve(c)) * weight, BINS)).sum())


def coverage(args: argparse.Namespace) -> None:
    """Print how often the 95% interval of the binned ECE holds the population value."""
    print(
        f"95% interval of the binned ECE, {args.draws} draws, c ~ Beta(4, 1.5), 15 bins, "
        "200 replicates\n"
    )
    print("| curve | population ECE | N | coverage | below low end | above high end |")
    print("|---|---|---|---|---|---|")
    for name, curve in CURVES.items():
        truth = population_ece(curve)
        for n in (400, 10_000):
            low_miss = high_miss = 0
            for seed in range(args.draws):
                rng = np.random.default_rng(seed)
                c = rng.beta(ALPHA, BETA, size=n)
                y = rng.random(n) < curve(c)
                _, low, high = calibration_error_interval(
                    torch.from_numpy(c), torch.from_numpy(y).long(), seed=seed
                )
                low_miss += truth < float(low)
                high_miss += truth > float(high)
            share = 1 - (low_miss + high_miss) / args.draws
            print(
                f"| {name} | {truth:.4f} | {n:,} | {share:.1%} | {low_miss / args.draws:.1%} "
                f"| {high_miss / args.draws:.1%} |"
            )


def main() -> None:
    """The cost table, or with ``--coverage`` the coverage simulation."""
    silence_libraries()  # Lightning's tips and device lines stay out of the tables
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smooth", action="store_true", help="also the smooth ECE variants")
    parser.add_argument("--coverage", action="store_true", help="the coverage simulation")
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    coverage(args) if args.coverage else cost(args)


if __name__ == "__main__":
    main()
