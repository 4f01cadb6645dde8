"""Post-hoc calibrators fitted on [100,000, 100] float32 logits: ours, netcal, torch-uncertainty.

Every method of ``lightning_losses.calibration.posthoc`` (``CALIBRATION_METHODS``) is fitted
on the same seeded logits of a synthetic overconfident model, and so is the cross-validated
choice among all of them (``select_calibrator``, 5 folds, then the refit of the winner). In the
same run, as the time unit the issue measures in ("the time of a few validation epochs"):

- a validation epoch, forward only under ``torch.no_grad``, batch 1,000, over as many samples
  as the logits have rows, of two small models with a 100-class linear head: the MNIST-1D CNN
  of the report's claims 7-8 (``CNN1D``, 25 channels, inputs of length 40; the cheapest
  epoch, hence the strictest unit) and a small image CNN on ``3 x 32 x 32`` inputs
  (CIFAR-100-shaped: conv 32, pool, conv 64, pool, linear 100);
- netcal's fits of the methods it has (``TemperatureScaling``, ``LogisticCalibration``, which
  is vector scaling for several classes, ``HistogramBinning``, ``IsotonicRegression``,
  ``BetaCalibration``) on the same data (probabilities ``softmax(z)`` as netcal takes them;
  ``tensorboard=False``);
- torch-uncertainty's scalers (``TemperatureScaler``, ``VectorScaler``, ``MatrixScaler``,
  ``DirichletScaler``, ``HistogramBinningScaler``, ``IsotonicRegressionScaler``) on a
  ``DataLoader`` of the same logits (one batch). ``import torch_uncertainty.post_processing``
  imports the package's ``__init__``, which needs torchvision; where that import fails the
  script says so, and (unless ``--no-tu-by-path``) loads the scaler modules from the installed
  package's files without its ``__init__`` (their code is unchanged; only the base class
  ``PostProcessing`` of ``post_processing/abstract.py`` is needed), which the table marks.

The logits: each row's true class ``k`` is uniform; the latent logits are ``3 * onehot(k) +
N(0, 1)``; the label is drawn from ``softmax(latent)`` (so the latent logits are calibrated)
and the model's logits are ``2.5 * latent`` (overconfident: temperature scaling should find
``T`` near 2.5). Beta calibration is for binary tasks: it (and netcal's) is fitted on
``[N]`` binary logits made the same way (latent ``1.5 * (2y' - 1) + N(0, 1)``, label drawn from
``sigmoid(latent)``, logits ``2.5 * latent``). Each fitted calibrator is scored by its NLL on
as many fresh samples of the same distribution (``-mean log max(p_y, 1e-12)``), a check that
the implementations fit comparable maps.

Times are wall seconds of one fit each (``--repeats`` > 1: the median, the implementations
interleaved within each repetition); every ratio is to a time of the same run. Progress goes to
stderr as ``[k/N] ... ETA``.

Usage::

    python benchmarks/posthoc.py                 # [100,000, 100], the table for the docs
    python benchmarks/posthoc.py --quick         # [10,000, 100], a minute or so
    python benchmarks/posthoc.py --markdown      # the docs' table
    python benchmarks/posthoc.py --no-peers      # ours and the validation epochs only
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lightning_losses.calibration.posthoc import CALIBRATION_METHODS, get_calibrator

ROOT = Path(__file__).resolve().parents[1]
#: Scale of the overconfident model's logits over the calibrated latent ones.
OVERCONFIDENCE = 2.5
#: Probabilities below this count as it in the held-out NLL (netcal's binning can give 0).
FLOOR = 1e-12
FOLDS = 5
BATCH = 1000
#: The methods netcal and torch-uncertainty have, by our method name: (module, class).
NETCAL = {
    "temperature": ("netcal.scaling", "TemperatureScaling"),
    "vector": ("netcal.scaling", "LogisticCalibration"),
    "histogram": ("netcal.binning", "HistogramBinning"),
    "isotonic": ("netcal.binning", "IsotonicRegression"),
    "beta": ("netcal.scaling", "BetaCalibration"),
}
TORCH_UNCERTAINTY = {
    "temperature": "TemperatureScaler",
    "vector": "VectorScaler",
    "matrix": "MatrixScaler",
    "dirichlet": "DirichletScaler",
    "histogram": "HistogramBinningScaler",
    "isotonic": "IsotonicRegressionScaler",
}


# --- data ----------------------------------------------------------------------------------------


def make_logits(rows: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Overconfident float32 logits ``[rows, classes]`` and labels drawn from the latent model."""
    gen = torch.Generator().manual_seed(seed)
    true = torch.randint(0, classes, (rows,), generator=gen)
    latent = torch.randn(rows, classes, generator=gen)
    latent[torch.arange(rows), true] += 3.0
    target = torch.multinomial(torch.softmax(latent, dim=1), 1, generator=gen)[:, 0]
    return (OVERCONFIDENCE * latent).float(), target


def make_binary(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Overconfident float32 binary logits ``[rows]`` and 0/1 labels."""
    gen = torch.Generator().manual_seed(seed)
    sign = 2.0 * torch.randint(0, 2, (rows,), generator=gen) - 1.0
    latent = 1.5 * sign + torch.randn(rows, generator=gen)
    target = (torch.rand(rows, generator=gen) < torch.sigmoid(latent)).long()
    return (OVERCONFIDENCE * latent).float(), target


def held_out_nll(probs: torch.Tensor | np.ndarray, target: torch.Tensor) -> float:
    """``-mean log max(p_y, FLOOR)`` of probabilities ``[N, C]`` (or ``[N]``: P(class 1))."""
    p = torch.as_tensor(np.asarray(probs), dtype=torch.float64)
    if p.dim() == 1:
        p = torch.stack([1 - p, p], dim=1)
    picked = p.gather(1, target[:, None].long())[:, 0]
    return float(-picked.clamp_min(FLOOR).log().mean())


# --- the time unit -------------------------------------------------------------------------------


def mnist1d_cnn(classes: int) -> tuple[nn.Module, tuple[int, ...]]:
    """The report's MNIST-1D CNN with a ``classes``-way linear head, and its input shape."""
    from lightning_losses.lightning.backbones import CNN1D

    cnn = CNN1D(channels=25)
    return nn.Sequential(cnn, nn.Linear(cnn.output_features(40), classes)), (40,)


def image_cnn(classes: int) -> tuple[nn.Module, tuple[int, ...]]:
    """A small CIFAR-shaped CNN: conv 32, pool, conv 64, pool, linear ``classes``."""
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, classes),
    )
    return model, (3, 32, 32)


UNITS: dict[str, Callable[[int], tuple[nn.Module, tuple[int, ...]]]] = {
    "MNIST-1D CNN": mnist1d_cnn,
    "small image CNN": image_cnn,
}


def validation_epoch(model: nn.Module, shape: tuple[int, ...], rows: int) -> float:
    """Seconds of one forward pass over ``rows`` samples in batches of :data:`BATCH`.

    The inputs are made once, before the clock starts (a DataLoader over tensors in memory
    would add little); the logits are kept, as a validation epoch keeps them for its metrics.
    """
    torch.manual_seed(0)
    batches = [torch.randn(min(BATCH, rows - i), *shape) for i in range(0, rows, BATCH)]
    model.eval()
    outputs = []
    start = time.perf_counter()
    with torch.no_grad():
        for x in batches:
            outputs.append(model(x))
    torch.cat(outputs)
    return time.perf_counter() - start


# --- the implementations -------------------------------------------------------------------------


@dataclass
class Case:
    """One timed fit: the method, whose implementation, the fit, and the held-out scorer."""

    method: str
    who: str
    fit: Callable[[], object]
    score: Callable[[object], float]
    seconds: list[float] = field(default_factory=list)
    nll: float = math.nan
    error: str = ""


@dataclass
class Data:
    """The fitting and held-out sets, multiclass and binary."""

    logits: torch.Tensor
    target: torch.Tensor
    test_logits: torch.Tensor
    test_target: torch.Tensor
    binary: torch.Tensor
    binary_target: torch.Tensor
    test_binary: torch.Tensor
    test_binary_target: torch.Tensor

    @classmethod
    def make(cls, rows: int, classes: int) -> Data:
        """Seeded sets: seed 0 to fit, seed 1 held out."""
        return cls(
            *make_logits(rows, classes, 0),
            *make_logits(rows, classes, 1),
            *make_binary(rows, 0),
            *make_binary(rows, 1),
        )

    def for_method(self, calibrator: object) -> tuple[torch.Tensor, ...]:
        """``(logits, target, test logits, test target)``: binary for a binary-only method."""
        try:
            calibrator.check_classes(self.logits.shape[1])  # type: ignore[attr-defined]
        except ValueError:
            return self.binary, self.binary_target, self.test_binary, self.test_binary_target
        return self.logits, self.target, self.test_logits, self.test_target


def available_methods() -> tuple[list[str], dict[str, str]]:
    """The registry's methods whose module is written, and why the others cannot be built."""
    ready, missing = [], {}
    for method in CALIBRATION_METHODS:
        try:
            get_calibrator(method)
        except (ImportError, AttributeError) as error:
            missing[method] = f"{type(error).__name__}: {error}"
        else:
            ready.append(method)
    return ready, missing


def our_cases(data: Data, methods: list[str]) -> list[Case]:
    """One fit of each of our methods, then the cross-validated choice among them."""
    cases = []
    for method in methods:
        z, y, test_z, test_y = data.for_method(get_calibrator(method))

        def fit(method: str = method, z: torch.Tensor = z, y: torch.Tensor = y) -> object:
            return get_calibrator(method).fit(z, y)

        def score(fitted: object, test_z: torch.Tensor = test_z, test_y: torch.Tensor = test_y):
            with torch.no_grad():
                return held_out_nll(fitted.probabilities(test_z), test_y)  # type: ignore[attr-defined]

        cases.append(Case(method, "ours", fit, score))
    multiclass = [m for m in methods if data.for_method(get_calibrator(m))[0] is data.logits]
    if multiclass:
        from lightning_losses.calibration.posthoc import select_calibrator

        def select() -> object:
            candidates = [get_calibrator(m) for m in multiclass]
            return select_calibrator(candidates, data.logits, data.target, folds=FOLDS)

        def score_choice(choice: object) -> float:
            with torch.no_grad():
                probs = choice.calibrator.probabilities(data.test_logits)  # type: ignore[attr-defined]
            return held_out_nll(probs, data.test_target)

        cases.append(Case("select_calibrator", "ours", select, score_choice))
    return cases


def netcal_cases(data: Data, methods: list[str]) -> tuple[list[Case], str]:
    """The fits of netcal's methods that we have, on ``softmax(z)`` (``sigmoid(z)``: binary)."""
    try:
        import netcal
    except ImportError as error:
        return [], f"netcal not importable: {error}"
    cases = []
    for method, (module, name) in NETCAL.items():
        if method not in CALIBRATION_METHODS:
            continue
        binary = method == "beta"
        if binary:
            z, y, test_z, test_y = (
                data.binary,
                data.binary_target,
                data.test_binary,
                data.test_binary_target,
            )
            x, test_x = torch.sigmoid(z).numpy(), torch.sigmoid(test_z).numpy()
        else:
            z, y, test_z, test_y = data.logits, data.target, data.test_logits, data.test_target
            x, test_x = torch.softmax(z, 1).numpy(), torch.softmax(test_z, 1).numpy()
        cls = getattr(importlib.import_module(module), name)
        labels = y.numpy()

        def fit(cls: type = cls, x: np.ndarray = x, labels: np.ndarray = labels) -> object:
            calibrator = cls()
            options = {"tensorboard": False} if "tensorboard" in _parameters(cls.fit) else {}
            calibrator.fit(x, labels, **options)
            return calibrator

        def score(fitted: object, test_x: np.ndarray = test_x, test_y: torch.Tensor = test_y):
            return held_out_nll(fitted.transform(test_x), test_y)  # type: ignore[attr-defined]

        cases.append(Case(method, "netcal", fit, score))
    return cases, f"netcal {netcal.__version__}"


def _parameters(function: Callable) -> set[str]:
    import inspect

    return set(inspect.signature(function).parameters)


def torch_uncertainty_module() -> tuple[types.ModuleType | None, str]:
    """torch-uncertainty's calibration module, and how it was imported (or why not)."""
    try:
        import torch_uncertainty.post_processing.calibration as calibration
    except ImportError as error:
        reason = f"`import torch_uncertainty.post_processing` fails here: {error}"
    else:
        return calibration, _tu_version()
    return None, reason


def _tu_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"torch-uncertainty {version('torch-uncertainty')}"
    except PackageNotFoundError:
        return "torch-uncertainty"


def torch_uncertainty_by_path() -> types.ModuleType:
    """torch-uncertainty's ``post_processing.calibration`` loaded from its files, unchanged.

    The package's own ``__init__`` modules are skipped (they import torchvision); the parent
    packages are created empty and ``post_processing`` gets only ``PostProcessing`` from its
    ``abstract.py``, the one name the scalers import from it.
    """
    spec = importlib.util.find_spec("torch_uncertainty")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torch-uncertainty is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, folder in (
        ("torch_uncertainty", root),
        ("torch_uncertainty.post_processing", root / "post_processing"),
    ):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    abstract = _load("torch_uncertainty.post_processing.abstract", root / "post_processing")
    sys.modules["torch_uncertainty.post_processing"].PostProcessing = abstract.PostProcessing  # type: ignore[attr-defined]
    return _load("torch_uncertainty.post_processing.calibration", root / "post_processing")


def _load(name: str, folder: Path) -> types.ModuleType:
    leaf = name.rsplit(".", 1)[1]
    path = folder / leaf / "__init__.py" if (folder / leaf).is_dir() else folder / f"{leaf}.py"
    locations = [str(path.parent)] if path.name == "__init__.py" else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=locations)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def torch_uncertainty_cases(
    data: Data, methods: list[str], by_path: bool
) -> tuple[list[Case], str]:
    """torch-uncertainty's scalers fitted on a one-batch DataLoader of the logits."""
    from torch.utils.data import DataLoader, TensorDataset

    calibration, how = torch_uncertainty_module()
    if calibration is None:
        if not by_path:
            return [], how + " (not timed: --no-tu-by-path)"
        try:
            calibration = torch_uncertainty_by_path()
        except Exception as error:  # the fallback is best effort; the table says what happened
            return [], f"{how}; loading its scaler modules by path failed too: {error}"
        how = (
            f"{how}; its scaler modules (unchanged) were loaded from {_tu_version()}'s files "
            "without the package's __init__"
        )
    loader = DataLoader(TensorDataset(data.logits, data.target), batch_size=len(data.target))
    classes = data.logits.shape[1]
    cases = []
    for method, name in TORCH_UNCERTAINTY.items():
        if method not in CALIBRATION_METHODS:
            continue
        cls = getattr(calibration, name)
        options = {"num_classes": classes} if "num_classes" in _parameters(cls.__init__) else {}

        def fit(cls: type = cls, options: dict = options) -> object:
            scaler = cls(model=None, **options)
            with warnings.catch_warnings(), _quiet_logging():
                warnings.simplefilter("ignore")
                scaler.fit(loader, progress=False)
            return scaler

        def score(fitted: object) -> float:
            with torch.no_grad():
                out = fitted(data.test_logits)  # type: ignore[operator]
            return held_out_nll(torch.softmax(out.double(), dim=1), data.test_target)

        cases.append(Case(method, "torch-uncertainty", fit, score))
    return cases, how


class _quiet_logging:
    """Silence the ``logging`` warnings torch-uncertainty prints on ``model=None``."""

    def __enter__(self) -> None:
        import logging

        self.level = logging.root.manager.disable
        logging.disable(logging.WARNING)

    def __exit__(self, *exc: object) -> None:
        import logging

        logging.disable(self.level)


# --- the run -------------------------------------------------------------------------------------


def run(
    cases: list[Case], units: dict[str, tuple[nn.Module, tuple[int, ...]]], rows: int, repeats: int
) -> dict[str, list[float]]:
    """Time every case and validation epoch ``repeats`` times, interleaved; print progress."""
    epochs: dict[str, list[float]] = {name: [] for name in units}
    total = repeats * (len(cases) + len(units))
    k, started = 0, time.perf_counter()
    for repeat in range(repeats):
        for name, (model, shape) in units.items():
            epochs[name].append(validation_epoch(model, shape, rows))
            k = _progress(k, total, started, f"validation epoch, {name}", epochs[name][-1])
        for case in cases:
            if case.error:
                k += 1
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    start = time.perf_counter()
                    fitted = case.fit()
                    case.seconds.append(time.perf_counter() - start)
                if repeat == 0:
                    case.nll = case.score(fitted)
            except Exception as error:  # a peer that fails is reported, not fatal
                case.error = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
                k += 1
                continue
            what = f"{case.who} {case.method} (held-out NLL {case.nll:.4f})"
            k = _progress(k, total, started, what, case.seconds[-1])
    return epochs


def _progress(k: int, total: int, started: float, what: str, seconds: float) -> int:
    k += 1
    elapsed = time.perf_counter() - started
    eta = elapsed / k * (total - k)
    print(f"[{k}/{total}] {what}: {seconds:.2f} s  ETA {eta:.0f} s", file=sys.stderr, flush=True)
    return k


def commit() -> str:
    """The checkout's short commit, with ``+changes`` when its tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def machine() -> str:
    """CPU model, cores and torch threads, as the table's caption gives them."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def seconds_text(values: list[float]) -> str:
    """The median of ``values`` in seconds, two decimals (``-`` when none)."""
    return f"{statistics.median(values):.2f}" if values else "-"


def table(
    cases: list[Case],
    epochs: dict[str, list[float]],
    uncalibrated: dict[str, float],
    markdown: bool,
) -> list[str]:
    """The rows: method, ours, netcal, torch-uncertainty (s and held-out NLL), ratios.

    A held-out NLL within 1e-4 of the uncalibrated one (``uncalibrated``, by ``"multiclass"``
    and ``"binary"``) is marked ``= uncalibrated``: that fit changed nothing.
    """
    by = {(c.method, c.who): c for c in cases}
    methods = list(dict.fromkeys(c.method for c in cases if c.who == "ours"))
    unit = {name: statistics.median(values) for name, values in epochs.items()}
    header = [
        "method",
        "ours s (NLL)",
        "netcal s (NLL)",
        "torch-uncertainty s (NLL)",
        *(f"ours / epoch of {name}" for name in unit),
        "netcal / ours",
        "torch-uncertainty / ours",
    ]
    rows = []
    for method in methods:
        ours = by[(method, "ours")]
        cells = [method]
        for who in ("ours", "netcal", "torch-uncertainty"):
            case = by.get((method, who))
            if case is None:
                cells.append("n/a")
            elif case.error:
                cells.append(f"failed ({case.error})")
            else:
                raw = uncalibrated["binary" if method == "beta" else "multiclass"]
                same = " = uncalibrated" if abs(case.nll - raw) < 1e-4 else ""
                cells.append(f"{seconds_text(case.seconds)} ({case.nll:.4f}{same})")
        mine = statistics.median(ours.seconds) if ours.seconds else math.nan
        cells += [f"{mine / seconds:.2f}" for seconds in unit.values()]
        for who in ("netcal", "torch-uncertainty"):
            case = by.get((method, who))
            ok = case is not None and case.seconds and not case.error
            cells.append(f"{statistics.median(case.seconds) / mine:.2f}x" if ok else "-")
        rows.append(cells)
    total = sum(
        statistics.median(by[(m, "ours")].seconds)
        for m in methods
        if m != "select_calibrator" and by[(m, "ours")].seconds
    )
    rows.append(
        [
            "every method once (sum)",
            f"{total:.2f}",
            "",
            "",
            *(f"{total / seconds:.2f}" for seconds in unit.values()),
            "",
            "",
        ]
    )
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    else:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]
        ]
    epoch_text = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in unit.items())
    return [*lines, "", f"validation epoch (forward only, batch {BATCH}): {epoch_text}"]


def main(argv: list[str] | None = None) -> int:
    """Build the data, time every fit and validation epoch, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="10,000 rows (unless --rows)")
    parser.add_argument("--repeats", type=int, default=1, help="fits of each (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--no-peers", action="store_true", help="ours and the epochs only")
    parser.add_argument(
        "--no-tu-by-path",
        action="store_true",
        help="do not load torch-uncertainty's scaler modules by path when its import fails",
    )
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.quick and args.rows == parser.get_default("rows"):
        args.rows = 10_000
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    data = Data.make(args.rows, args.classes)
    methods, missing = available_methods()
    cases = our_cases(data, methods)
    peers: list[str] = []
    if not args.no_peers:
        more, note = netcal_cases(data, methods)
        cases += more
        peers.append(note)
        more, note = torch_uncertainty_cases(data, methods, by_path=not args.no_tu_by_path)
        cases += more
        peers.append(note)
    # the cross-validated choice last: the longest, and a stopped run keeps the others' lines
    cases.sort(key=lambda case: case.method == "select_calibrator")
    units = {name: make(args.classes) for name, make in UNITS.items()}
    validation_epoch(*units["MNIST-1D CNN"], min(args.rows, 2 * BATCH))  # warm-up
    epochs = run(cases, units, args.rows, args.repeats)
    print(
        f"post-hoc fits on [{args.rows:,}, {args.classes}] float32 logits (beta: [{args.rows:,}] "
        f"binary logits), wall seconds of one fit"
        f"{f' (median of {args.repeats})' if args.repeats > 1 else ''} and, in brackets, the "
        f"NLL on {args.rows:,} fresh samples; select_calibrator: {FOLDS}-fold CV over the "
        f"multiclass methods, then the refit. Commit {commit()}, {machine()}, torch "
        f"{torch.__version__}, load average {load:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end."
    )
    for note in peers:
        print(f"- {note}")
    for method, reason in missing.items():
        print(f"- {method}: not timed, its module is not written yet ({reason})")
    uncalibrated = {
        "multiclass": held_out_nll(torch.softmax(data.test_logits.double(), 1), data.test_target),
        "binary": held_out_nll(torch.sigmoid(data.test_binary.double()), data.test_binary_target),
    }
    print(
        f"- uncalibrated NLL on the fresh samples: {uncalibrated['multiclass']:.4f} "
        f"(binary: {uncalibrated['binary']:.4f})"
    )
    print()
    for line in table(cases, epochs, uncalibrated, args.markdown):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
