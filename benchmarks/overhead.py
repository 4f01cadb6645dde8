"""What the package's stack costs per epoch against the same job in plain Lightning.

The job is MNIST-1D's CNN (Greydanus, "Scaling down deep learning") as ``configs/mnist1d_ce.yaml``
sets it up: 4,000 training sequences in batches of 100 (40 steps per epoch), 1,000 generated
validation sequences, Adam with lr 0.01, ``log_every_n_steps=40``. Variants, each a ``fit`` of
``--epochs`` epochs in this one process, interleaved ``--repeats`` times:

- ``full``: ``ClassifierModule`` (cross-entropy, ``CNN1D(25)``), ``CalibrationMonitor(n_bins=15,
  diagram_every_n_epochs=0)``, ``ModelCheckpoint(monitor="val/nll", filename="best-{epoch}-
  {step}")`` and ``LastCheckpoint``, ``TrackingLogger`` (the config's callbacks and logger;
  ``SplitCurves``, which evaluates the test split every 5 epochs, is left out: the plain job has
  no counterpart).
- ``plain``: the same network, data and optimizer written in plain Lightning:
  ``F.cross_entropy``, ``train/loss``/``train/acc`` each step and epoch, ``val/loss``,
  ``val/acc``, ``val/nll`` and torchmetrics' ``MulticlassCalibrationError(n_bins=15)`` per
  validation, ``MLFlowLogger``, ``ModelCheckpoint(monitor="val/nll", save_last=True)``.
- ``full - X``: the full stack with one part replaced by its plain counterpart (the module by
  the plain module, which leaves the ECE to the monitor; the criterion by ``F.cross_entropy``;
  the logger; the checkpoints) or removed (the monitor), so that X's cost is ``full`` minus it.

Each store is timed in turn: a SQLite file and a local ``mlflow server`` (SQLite behind it).
Seconds per epoch are medians over every epoch but each fit's first (start-up, the first calls
of each kernel) and its last (the final diagram), from one epoch's start to the next: training,
validation, checkpoints and logging are all in it. Per step: from one training batch's start to
the next. Each is given in wall-clock time and in the training thread's CPU time
(``time.thread_time``), which the load of a shared machine moves less.

Usage::

    python benchmarks/overhead.py [--epochs 5] [--repeats 5] [--stores sqlite server]
        [--threads 1] [--markdown] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import itertools
import math
import os
import pstats
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn
from torchmetrics.classification import MulticlassCalibrationError

from lightning_losses import CrossEntropyLoss
from lightning_losses.callbacks import CalibrationMonitor, LastCheckpoint
from lightning_losses.data.mnist1d import MNIST1DDataModule
from lightning_losses.lightning.backbones import CNN1D
from lightning_losses.lightning.classifier import ClassifierModule
from lightning_losses.tracking import TrackingLogger

SKIP_FIRST = 1  # epochs left out at the start of each fit


# --- the plain job ------------------------------------------------------------------------------


class PlainModule(L.LightningModule):
    """The MNIST-1D CNN in plain Lightning: cross-entropy, accuracy, NLL, torchmetrics' ECE.

    With ``ece=False`` the ECE is left to a ``CalibrationMonitor``, which reads the logits and
    targets ``validation_step`` returns.
    """

    def __init__(self, ece: bool = True) -> None:
        super().__init__()
        self.backbone = CNN1D(25)
        self.head = nn.Linear(125, 10)
        self.ece = MulticlassCalibrationError(num_classes=10, n_bins=15) if ece else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, 10]`` of inputs ``[N, 40]``."""
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        """Cross-entropy of the batch; logs the loss and the accuracy."""
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("train/acc", acc, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        """Log loss, accuracy, NLL (and ECE); without ECE return the outputs."""
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("val/loss", loss, on_epoch=True, prog_bar=True)
        self.log("val/acc", (logits.argmax(1) == y).float().mean(), on_epoch=True, prog_bar=True)
        self.log("val/nll", loss, on_epoch=True)
        if self.ece is None:
            return {"logits": logits.detach(), "target": y}
        self.ece.update(logits.softmax(1), y)
        self.log("val/ece", self.ece, on_epoch=True)
        return None

    def configure_optimizers(self):
        """Adam, learning rate 0.01."""
        return torch.optim.Adam(self.parameters(), lr=0.01)


# --- the variants -------------------------------------------------------------------------------


def full_module(criterion: Callable = CrossEntropyLoss) -> L.LightningModule:
    """The package's ClassifierModule with the CNN1D and ``criterion()``."""
    return ClassifierModule(
        criterion(),
        input_dim=40,
        num_classes=10,
        backbone=CNN1D(25),
        optimizer=lambda params: torch.optim.Adam(params, lr=0.01),
    )


def package_checkpoints() -> list[Callback]:
    """The package's checkpoints: best by ``val/nll`` and ``LastCheckpoint``."""
    best = ModelCheckpoint(monitor="val/nll", mode="min", filename="best-{epoch}-{step}")
    return [best, LastCheckpoint()]


def plain_checkpoints() -> list[Callback]:
    """Lightning's ``ModelCheckpoint`` by ``val/nll`` with ``save_last``."""
    return [ModelCheckpoint(monitor="val/nll", mode="min", save_last=True)]


def monitor() -> list[Callback]:
    """A ``CalibrationMonitor`` without diagrams."""
    return [CalibrationMonitor(n_bins=15, diagram_every_n_epochs=0)]


def package_logger(uri: str, root: str) -> L.pytorch.loggers.Logger:
    """The package's ``TrackingLogger``."""
    return TrackingLogger(tracking_uri=uri, save_dir=root, run_name="overhead")


def plain_logger(uri: str, root: str) -> L.pytorch.loggers.Logger:
    """Lightning's ``MLFlowLogger``."""
    return MLFlowLogger(tracking_uri=uri, save_dir=root, run_name="overhead")


def full_module_torch_loss() -> L.LightningModule:
    """The full module with PyTorch's ``F.cross_entropy`` as criterion."""
    return full_module(lambda: F.cross_entropy)


def plain_module_with_monitor() -> L.LightningModule:
    """The plain module that leaves its ECE to a ``CalibrationMonitor``."""
    return PlainModule(ece=False)


def both(*parts: Callable[[], list[Callback]]) -> Callable[[], list[Callback]]:
    """One callbacks factory from several."""
    return lambda: [callback for part in parts for callback in part()]


#: name -> (module, callbacks, logger). "full - X": the full stack with X replaced by the plain
#: job's counterpart (the module, the logger, the checkpoints) or removed (the monitor).
VARIANTS: dict[str, tuple[Callable, Callable, Callable]] = {
    "full": (full_module, both(monitor, package_checkpoints), package_logger),
    "plain": (PlainModule, plain_checkpoints, plain_logger),
    "full - ClassifierModule": (
        plain_module_with_monitor,
        both(monitor, package_checkpoints),
        package_logger,
    ),
    "full - CrossEntropyLoss": (
        full_module_torch_loss,
        both(monitor, package_checkpoints),
        package_logger,
    ),
    "full - CalibrationMonitor": (full_module, package_checkpoints, package_logger),
    "full - TrackingLogger": (full_module, both(monitor, package_checkpoints), plain_logger),
    "full - shipped checkpoints": (full_module, both(monitor, plain_checkpoints), package_logger),
}


class Clock(Callback):
    """Each epoch's and each training batch's start: (wall clock, this thread's CPU time)."""

    def __init__(self) -> None:
        self.epochs: list[tuple[float, float]] = []
        self.batches: list[list[tuple[float, float]]] = []

    @staticmethod
    def now() -> tuple[float, float]:
        """Wall clock and this thread's CPU time."""
        return time.perf_counter(), time.thread_time()

    def on_train_epoch_start(self, trainer, pl_module):
        """Note the epoch's start."""
        self.epochs.append(self.now())
        self.batches.append([])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        """Note the batch's start."""
        self.batches[-1].append(self.now())

    def epoch_seconds(self) -> list[tuple[float, float]]:
        """Start-to-start intervals, the first ``SKIP_FIRST`` epochs and the last left out."""
        starts = self.epochs[SKIP_FIRST:]
        return [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(starts)]

    def step_seconds(self) -> list[tuple[float, float]]:
        """Batch-start-to-batch-start intervals within the same epochs (training only)."""
        out = []
        for starts in self.batches[SKIP_FIRST:-1]:
            out.extend((b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(starts))
        return out


def data() -> MNIST1DDataModule:
    """The MNIST-1D DataModule of every variant."""
    return MNIST1DDataModule(
        batch_size=100, seed=0, val_source="generated", val_samples=1000, val_seed=2
    )


def fit(name: str, uri: str, epochs: int) -> Clock:
    """Fit variant ``name`` for ``epochs`` epochs logging to ``uri``; its clock."""
    make_module, make_callbacks, make_logger = VARIANTS[name]
    clock = Clock()
    L.seed_everything(0, verbose=False)
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=epochs,
            log_every_n_steps=40,
            logger=make_logger(uri, root),
            callbacks=[*make_callbacks(), clock],
            default_root_dir=root,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(make_module(), data())
    return clock


# --- the stores -----------------------------------------------------------------------------


def free_port() -> int:
    """A free local TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def store(kind: str) -> Iterator[str]:
    """A SQLite file, or a local ``mlflow server`` with a SQLite backend, in a temporary folder.

    The folder is also the working directory meanwhile: MLflow puts the artifacts of a SQLite
    store's new experiments in ``./mlruns``.
    """
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        if kind == "sqlite":
            yield f"sqlite:///{folder}/mlflow.db"
            return
        port = free_port()
        mlflow = Path(sys.executable).with_name("mlflow")
        command = [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{folder}/s.db"]
        command += ["--artifacts-destination", f"{folder}/artifacts", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--workers", "1"]
        log = open(f"{folder}/server.log", "w")
        server = subprocess.Popen(command, stdout=log, stderr=log)
        uri = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(uri + "/health", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError(Path(f"{folder}/server.log").read_text()) from None
                    time.sleep(0.5)
            yield uri
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()


# --- the run ------------------------------------------------------------------------------------


def medians(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Medians of the wall and CPU times of ``pairs``."""
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def measure(kind: str, names: list[str], epochs: int, repeats: int) -> dict[str, tuple]:
    """Per variant: (wall s/epoch, CPU s/epoch, wall ms/step, CPU ms/step, epochs, fit means).

    Medians; CPU is the training thread's own time (``time.thread_time``), which a loaded
    machine changes much less than the wall clock (and which leaves out a logging thread).
    ``fit means``: each fit's mean (wall, CPU) seconds per counted epoch, in repeat order, for
    the ratios of the variants fitted in the same repeat (:func:`paired_ratio`).
    """
    epoch_times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    step_times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    fit_means: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with store(kind) as uri:
        fit("plain", uri, 2)  # warm-up: imports, the store's tables, the data cache
        started = time.perf_counter()
        for repeat in range(repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                clock = fit(name, uri, epochs)
                epochs_of_fit = clock.epoch_seconds()
                epoch_times[name] += epochs_of_fit
                step_times[name] += clock.step_seconds()
                fit_means[name].append(
                    (
                        statistics.fmean(e[0] for e in epochs_of_fit),
                        statistics.fmean(e[1] for e in epochs_of_fit),
                    )
                )
                wall, cpu = medians(epochs_of_fit)
                left = (time.perf_counter() - started) / (repeat + 1) * (repeats - repeat - 1)
                print(
                    f"  [{kind} {repeat + 1}/{repeats}] {name}: {wall:.4f} s/epoch "
                    f"({cpu:.4f} s CPU), ETA {left:.0f} s",
                    file=sys.stderr,
                )
    results = {}
    for name in names:
        wall, cpu = medians(epoch_times[name])
        step_wall, step_cpu = medians(step_times[name])
        results[name] = (
            wall,
            cpu,
            1000 * step_wall,
            1000 * step_cpu,
            len(epoch_times[name]),
            fit_means[name],
        )
    return results


def paired_ratio(variant: list[float], baseline: list[float]) -> str:
    """``g (low-high)``: the geometric mean of the repeats' ratios, 95% Student-t interval.

    Each repeat fits every variant once, so ``variant[k] / baseline[k]`` is a pair measured
    minutes apart at most; the interval is that of the mean log ratio (t with ``n - 1``
    degrees of freedom), exponentiated.
    """
    from lightning_losses.compare.decide import t_interval

    logs = [math.log(v / b) for v, b in zip(variant, baseline, strict=True)]
    mean, low, high = (math.exp(x) for x in t_interval(logs))
    if len(logs) < 2:
        return f"{mean:.3f}"
    return f"{mean:.3f} ({low:.3f}-{high:.3f})"


def profile(kind: str, epochs: int) -> None:
    """Profile one full fit with cProfile: where the package's own time goes (top 25)."""
    with store(kind) as uri:
        fit("full", uri, 2)
        profiler = cProfile.Profile()
        profiler.enable()
        fit("full", uri, epochs)
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
    stats.print_stats("lightning_losses", 25)
    print(out.getvalue())


def report(kind: str, results: dict[str, tuple], markdown: bool) -> None:
    """Print one store's table and the cost of each part of the full stack."""
    plain, full = results["plain"], results["full"]
    header = (
        "variant",
        "s / epoch",
        "/ plain",
        "CPU s / epoch",
        "/ plain",
        "ms / step",
        "- plain",
        "CPU ms / step",
        "- plain",
        "epochs",
        "repeats' ratios to plain: geometric mean (95% t-interval)",
        "the same, CPU",
    )
    print(f"\n{kind}:\n")
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|---|" + "---:|" * (len(header) - 1))
    else:
        print("  ".join(header))
    for name, (wall, cpu, step, step_cpu, count, means) in results.items():
        cells = (
            name,
            f"{wall:.4f}",
            f"{wall / plain[0]:.2f}x",
            f"{cpu:.4f}",
            f"{cpu / plain[1]:.2f}x",
            f"{step:.2f}",
            f"{step - plain[2]:+.2f}",
            f"{step_cpu:.2f}",
            f"{step_cpu - plain[3]:+.2f}",
            str(count),
            paired_ratio([m[0] for m in means], [m[0] for m in plain[5]]),
            paired_ratio([m[1] for m in means], [m[1] for m in plain[5]]),
        )
        print("| " + " | ".join(cells) + " |" if markdown else "  ".join(cells))
    print()
    for name in (n for n in results if n.startswith("full - ")):
        wall, cpu, step, step_cpu, _, _ = results[name]
        print(
            f"cost of {name[7:]}: {full[0] - wall:+.4f} s/epoch ({full[1] - cpu:+.4f} s CPU), "
            f"{full[2] - step:+.2f} ms/step ({full[3] - step_cpu:+.2f} ms CPU)"
        )


def main(argv: list[str] | None = None) -> None:
    """Measure each store and variant (or profile one fit) and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5, help="epochs per fit (>= 3)")
    parser.add_argument("--repeats", type=int, default=5, help="fits per variant and store")
    parser.add_argument("--stores", nargs="+", default=["sqlite", "server"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cProfile one full fit instead")
    args = parser.parse_args(argv)
    if args.epochs < SKIP_FIRST + 2:
        parser.error(f"--epochs must be at least {SKIP_FIRST + 2}")
    names = ["full", "plain", *[n for n in args.variants if n not in ("full", "plain")]]
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from lightning_losses.cli.quiet import silence_libraries

    silence_libraries()  # MLflow's store-creation lines too (its level is read at its import)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    load = os.getloadavg()
    print(
        f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; cores {os.cpu_count()}"
    )
    for kind in args.stores:
        if args.profile:
            profile(kind, args.epochs)
            continue
        report(kind, measure(kind, names, args.epochs, args.repeats), args.markdown)
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
