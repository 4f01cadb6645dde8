"""Split conformal thresholds and sets on [1,000,000, 100] probabilities: ours against TorchCP.

In one run, on the same seeded float32 probabilities (softmax of ``2.5 * (3 onehot(k) +
N(0, 1))``, labels drawn from the calibrated ``softmax(3 onehot(k) + N(0, 1))``):

- thresholds: the true label's score of every row and the ``ceil((n + 1)(1 - alpha))``-th
  smallest (``conformal_scores`` + ``conformal_threshold``) against TorchCP 1.2's score
  object on the labels and ``calculate_conformal_value``, per score (LAC, APS, RAPS, SAPS,
  deterministic); TorchCP is loaded from its files as in the tests (its package ``__init__``
  imports torchsort and torchvision; where TorchCP is absent its columns are empty);
- sets: ``prediction_sets`` against TorchCP's all-label scores ``<= q``;
- the test loop of a small model (the MNIST-1D CNN, batch 1,000) with and without
  ``ConformalPrediction`` (four scores, two levels), on as many test samples as ``--loop-rows``
  of random inputs, for each number of classes of ``--loop-classes`` (10, the shipped
  ``mnist1d_ce_conformal`` config's, and 100).

Times are wall seconds, the median of ``--repeats``, ours and TorchCP's interleaved; every
ratio is to a time of the same run. The loop's table adds the time spent in the callback's own
hooks (median over the loops with it), in all and per test sample: the cost the callback adds
whatever the model, which the ratio divides by this model's loop. Run on a quiet machine and
quote ``uptime`` beside figures.

Usage::

    python benchmarks/conformal.py                       # [1,000,000, 100]
    python benchmarks/conformal.py --rows 100000 --repeats 3
    python benchmarks/conformal.py --loop-only --repeats 9   # the test loop, pairs alternated
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from lightning_losses.cli.quiet import silence_libraries


def probabilities(rows: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Overconfident float32 probabilities ``[rows, classes]`` and labels (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(0, classes, (rows,), generator=g)
    latent = 3.0 * torch.nn.functional.one_hot(k, classes).float()
    latent += torch.randn(rows, classes, generator=g)
    labels = torch.multinomial(latent.softmax(1), 1, generator=g)[:, 0]
    return (2.5 * latent).softmax(1), labels


def timed(function: Callable[[], object], repeats: int) -> float:
    """The median wall seconds of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def torchcp_modules():
    """TorchCP's modules loaded from its files, or ``None`` where it is not installed."""
    if importlib.util.find_spec("torchcp") is None:
        return None
    from helpers import torchcp  # the tests' loader: the score files without the package

    return torchcp.load()


def scores_table(rows: int, repeats: int) -> list[str]:
    """The Markdown table of threshold and set times, ours and TorchCP's."""
    from lightning_losses.calibration import conformal as CP

    probs, labels = probabilities(rows, 100)
    tcp = torchcp_modules()
    references = {}
    if tcp is not None:
        references = {
            "lac": tcp.lac.LAC(score_type="identity"),
            "aps": tcp.aps.APS(score_type="identity", randomized=False),
            "raps": tcp.raps.RAPS(score_type="identity", randomized=False, penalty=0.01, kreg=1),
            "saps": tcp.saps.SAPS(score_type="identity", randomized=False, weight=0.2),
        }
    lines = [
        "| score | thresholds: ours (s) | TorchCP (s) | ratio "
        "| sets: ours (s) | TorchCP (s) | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in ("lac", "aps", "raps", "saps"):
        q = CP.conformal_threshold(
            CP.conformal_scores(probs, labels, method=method, randomized=False), 0.1
        )
        ours_q = timed(
            lambda m=method: CP.conformal_threshold(
                CP.conformal_scores(probs, labels, method=m, randomized=False), 0.1
            ),
            repeats,
        )
        ours_s = timed(
            lambda m=method, q=q: CP.prediction_sets(probs, q, method=m, randomized=False),
            repeats,
        )
        if method in references:
            ref = references[method]

            def their_threshold(ref=ref, saps=method == "saps"):
                # TorchCP's single-label SAPS differs at rank 0: take its all-label form
                s = ref(probs).gather(1, labels[:, None])[:, 0] if saps else ref(probs, labels)
                return tcp.common.calculate_conformal_value(s, 0.1)

            theirs_q = timed(their_threshold, repeats)
            theirs_s = timed(lambda ref=ref, q=q: ref(probs) <= q, repeats)
            cells = [f"{theirs_q:.3f}", f"{ours_q / theirs_q:.2f}x"]
            set_cells = [f"{theirs_s:.3f}", f"{ours_s / theirs_s:.2f}x"]
        else:
            cells = set_cells = ["-", "-"]
        lines.append(
            f"| {method} | {ours_q:.3f} | {cells[0]} | {cells[1]} | {ours_s:.3f} | "
            f"{set_cells[0]} | {set_cells[1]} |"
        )
        print(f"[{method}] done", file=sys.stderr)
    return lines


def loop_table(rows: int, repeats: int, classes: int = 100) -> list[str]:
    """The Markdown table of the test loop with and without the callback (``classes`` labels)."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_losses.callbacks import ConformalPrediction
    from lightning_losses.lightning.backbones import CNN1D

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(CNN1D(channels=25), torch.nn.LazyLinear(classes))

        def forward(self, x):
            return self.net(x)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return {"logits": self(x), "target": y}

        def test_step(self, batch, batch_idx):
            return self.validation_step(batch, batch_idx)

    class TimedConformal(ConformalPrediction):
        """The callback, with the wall time spent in its test hooks added up."""

        spent = 0.0

        def on_test_batch_end(self, *args, **kwargs) -> None:
            start = time.perf_counter()
            super().on_test_batch_end(*args, **kwargs)
            self.spent += time.perf_counter() - start

        def on_test_epoch_end(self, *args, **kwargs) -> None:
            start = time.perf_counter()
            super().on_test_epoch_end(*args, **kwargs)
            self.spent += time.perf_counter() - start

    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 1, 40, generator=g)
    y = torch.randint(0, classes, (rows,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=1000)
    model = Model()
    model(x[:2])
    callback = TimedConformal(alpha=[0.1, 0.05])

    def run(callbacks, stage):
        trainer = L.Trainer(
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            callbacks=callbacks,
        )
        getattr(trainer, stage)(model, loader, verbose=False)

    run([callback], "validate")  # fits the thresholds
    run([], "test")  # one untimed loop of each: the first call's set-up
    run([callback], "test")
    pairs = []  # (without, with), alternating, so that a drift of the machine hits both
    hooks = []  # the time in the callback's hooks, each loop with it
    started = time.perf_counter()
    for k in range(repeats):
        callback.spent = 0.0
        pairs.append((timed(lambda: run([], "test"), 1), timed(lambda: run([callback], "test"), 1)))
        hooks.append(callback.spent)
        left = (time.perf_counter() - started) / (k + 1) * (repeats - k - 1)
        print(
            f"[{k + 1}/{repeats}] test loop without / with the callback, ETA {left:.0f} s",
            file=sys.stderr,
        )
    without = statistics.median(p[0] for p in pairs)
    with_callback = statistics.median(p[1] for p in pairs)
    ratios = sorted(w / o for o, w in pairs)
    in_hooks = statistics.median(hooks)
    return [
        "| test loop | without (s) | with ConformalPrediction (s) | ratio of medians | "
        "pairs' ratios | their geometric mean (95% t-interval) | in its hooks (ms) | "
        "per sample (µs) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {rows:,} samples, CNN1D, {classes} classes | {without:.3f} | {with_callback:.3f} | "
        f"{with_callback / without:.2f}x | {ratios[0]:.2f}-{ratios[-1]:.2f}x | "
        f"{geometric_mean_interval(ratios)} | {in_hooks * 1e3:.0f} | "
        f"{in_hooks / rows * 1e6:.2f} |",
    ]


def geometric_mean_interval(ratios: list[float]) -> str:
    """``g (low-high)``: the geometric mean of ``ratios`` and its 95% Student-t interval.

    The interval of the mean log ratio over the pairs (t with ``n - 1`` degrees of freedom),
    exponentiated: the pairs' ratio the loop settles at, with the noise of ``n`` pairs.
    """
    from lightning_losses.compare.decide import t_interval

    mean, low, high = (math.exp(x) for x in t_interval([math.log(r) for r in ratios]))
    if len(ratios) < 2:
        return f"{mean:.2f}"
    return f"{mean:.2f} ({low:.2f}-{high:.2f})"


def main(argv: list[str] | None = None) -> None:
    """Print both tables, with the load."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--loop-rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--loop-classes", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--loop-only", action="store_true", help="only the test loop's table")
    args = parser.parse_args(argv)
    silence_libraries()  # Lightning's device lines and tips stay out of the tables
    torch.set_num_threads(args.threads)
    print(f"load: {os.getloadavg()}; threads: {args.threads}; torch {torch.__version__}")
    if not args.loop_only:
        print(f"\n[{args.rows:,}, 100] float32 probabilities, alpha 0.1\n")
        print("\n".join(scores_table(args.rows, args.repeats)))
        print()
    for k, classes in enumerate(args.loop_classes):
        lines = loop_table(args.loop_rows, args.repeats, classes)
        print("\n".join(lines if k == 0 else lines[2:]))


if __name__ == "__main__":
    main()
