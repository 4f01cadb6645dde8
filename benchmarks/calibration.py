"""Top-label ECE on [N, C] float32 probabilities: ours beside torchmetrics and netcal, one run.

Usage::

    python benchmarks/calibration.py                   # 1,000,000 x 100, 15 bins, CPU
    python benchmarks/calibration.py --rows 100000 --repeats 3
    python benchmarks/calibration.py --markdown        # the README table
    python benchmarks/calibration.py --threads 1       # one intra-op thread (netcal uses one)
    python benchmarks/calibration.py --dense 8 21 128 128   # also dense [N, C, H, W] inputs

The probabilities are the softmax of Gaussian logits whose scale varies per row (uniform in
[0, 8]), so the top-label confidences spread over all the bins; the target is the arg-max with
probability ``0.9 * confidence`` and a uniform class otherwise (a mildly over-confident model).
Every candidate gets the same tensors (netcal a zero-copy numpy view of them). Times are the
median of ``--repeats`` calls after one warm-up, the candidates interleaved within each
repetition so that drift of the machine hits them alike; each ratio is the candidate's time over
ours (``calibration_error`` with its default ``validate_args=True``) in the same run.

Conventions: ours bins ``(k/B, (k+1)/B]``; torchmetrics and netcal bin ``[k/B, (k+1)/B)``, and
netcal clips confidences to ``[eps, 1 - eps]`` (float32 ``eps`` = 1.2e-7). The values can only
differ through confidences that lie exactly on an inner edge (the script counts them) or the
clipping, both reported; torchmetrics sums in float32, ours in float64.

``--dense N C H W`` adds a segmentation-shaped case: ``[N, C, H, W]`` float32 probabilities
(made as above, per pixel) with ``[N, H, W]`` masks in which 10% of the pixels are 255, the
ignored label. Ours takes the dense tensors with ``ignore_index=255``; torchmetrics'
``multiclass_calibration_error`` runs on the same tensors (it flattens them itself), on pixels
flattened by hand in the timed call (``movedim(1, -1).reshape(-1, C)``, ignored rows dropped),
and on rows flattened before the clock starts (ours too); each ratio is over ours on the dense
tensors in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from lightning_losses.calibration import CalibrationError, calibration_error


def make_inputs(rows: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax probabilities ``[rows, classes]`` and mildly over-confident targets."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.empty(rows, 1).uniform_(0.0, 8.0, generator=gen)
    probs = torch.softmax(torch.randn(rows, classes, generator=gen) * scale, dim=1)
    confidence, top = probs.max(dim=1)
    hit = torch.rand(rows, generator=gen) < 0.9 * confidence
    target = torch.where(hit, top, torch.randint(0, classes, (rows,), generator=gen))
    return probs, target


def candidates(
    probs: torch.Tensor, target: torch.Tensor, n_bins: int, with_netcal: bool
) -> dict[str, Callable[[], float]]:
    """The timed calls on ``[N, C]`` probabilities, by name: ours, torchmetrics, netcal."""
    classes = probs.shape[1]

    def ours_metric() -> float:
        metric = CalibrationError(num_classes=classes, n_bins=n_bins)
        metric.update(probs, target)
        return metric.compute().item()

    cases: dict[str, Callable[[], float]] = {
        "ours calibration_error": lambda: calibration_error(probs, target, n_bins=n_bins).item(),
        "ours calibration_error(validate_args=False)": lambda: calibration_error(
            probs, target, n_bins=n_bins, validate_args=False
        ).item(),
        "ours CalibrationError update+compute": ours_metric,
    }
    try:
        from torchmetrics.functional.classification import multiclass_calibration_error

        cases["torchmetrics multiclass_calibration_error"] = lambda: multiclass_calibration_error(
            probs, target, num_classes=classes, n_bins=n_bins
        ).item()
    except ImportError:  # the table says which peers ran
        pass
    if with_netcal:
        try:
            from netcal.metrics import ECE

            x, y = probs.numpy(), target.numpy()
            cases["netcal ECE(bins).measure"] = lambda: float(ECE(bins=n_bins).measure(x, y))
        except ImportError:
            pass
    return cases


IGNORED = 255


def make_dense_inputs(
    images: int, classes: int, height: int, width: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, C, H, W]`` probabilities and ``[N, H, W]`` masks, 10% of pixels ``IGNORED``."""
    rows, target = make_inputs(images * height * width, classes, seed)
    probs = rows.reshape(images, height, width, classes).permute(0, 3, 1, 2).contiguous()
    target = target.reshape(images, height, width)
    gen = torch.Generator().manual_seed(seed + 1)
    ignored = torch.rand(target.shape, generator=gen) < 0.1
    return probs, target.masked_fill(ignored, IGNORED)


def dense_candidates(
    probs: torch.Tensor, target: torch.Tensor, n_bins: int
) -> dict[str, Callable[[], float]]:
    """The timed calls on dense ``[N, C, H, W]`` probabilities, by name."""
    classes = probs.shape[1]

    def by_hand() -> tuple[torch.Tensor, torch.Tensor]:
        rows, labels = probs.movedim(1, -1).reshape(-1, classes), target.reshape(-1)
        kept = labels != IGNORED
        return rows[kept], labels[kept]

    def ours_metric() -> float:
        metric = CalibrationError(num_classes=classes, n_bins=n_bins, ignore_index=IGNORED)
        metric.update(probs, target)
        return metric.compute().item()

    cases: dict[str, Callable[[], float]] = {
        "ours calibration_error [N, C, H, W]": lambda: calibration_error(
            probs, target, n_bins=n_bins, ignore_index=IGNORED
        ).item(),
        "ours CalibrationError update+compute [N, C, H, W]": ours_metric,
    }
    rows, labels = by_hand()
    cases["ours, rows flattened beforehand"] = lambda: calibration_error(
        rows, labels, n_bins=n_bins
    ).item()
    try:
        from torchmetrics.functional.classification import multiclass_calibration_error
    except ImportError:
        return cases
    options = {"num_classes": classes, "n_bins": n_bins}
    cases["torchmetrics [N, C, H, W] (its own flattening)"] = lambda: multiclass_calibration_error(
        probs, target, ignore_index=IGNORED, **options
    ).item()
    cases["torchmetrics, flattened by hand in the call"] = lambda: multiclass_calibration_error(
        *by_hand(), **options
    ).item()
    cases["torchmetrics, rows flattened beforehand"] = lambda: multiclass_calibration_error(
        rows, labels, **options
    ).item()
    return cases


def run(cases: dict[str, Callable[[], float]], repeats: int) -> tuple[dict, dict]:
    """Values (from a warm-up call) and median times, the candidates interleaved."""
    values = {name: case() for name, case in cases.items()}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, case in cases.items():
            start = time.perf_counter()
            case()
            times[name].append(time.perf_counter() - start)
    return values, {name: statistics.median(t) for name, t in times.items()}


def table(title: str, values: dict, median: dict, base: str, markdown: bool) -> None:
    """Print the times and values of ``values`` beside ``base``'s (plain or Markdown)."""
    header = ["implementation", "ms", "time / ours", "ECE", "|ECE - ours|"]
    rows = [
        [
            name,
            f"{1000 * median[name]:.1f}",
            f"{median[name] / median[base]:.2f}x",
            f"{values[name]:.9f}",
            f"{abs(values[name] - values[base]):.1e}",
        ]
        for name in values
    ]
    if markdown:
        print(f"{title}.\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        print(title)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def dense_benchmark(shape: list[int], n_bins: int, repeats: int, markdown: bool) -> None:
    """Time and print the dense ``[N, C, H, W]`` case of ``--dense``."""
    images, classes, height, width = shape
    probs, target = make_dense_inputs(images, classes, height, width)
    values, median = run(dense_candidates(probs, target, n_bins), repeats)
    base = "ours calibration_error [N, C, H, W]"
    kept = int((target != IGNORED).sum())
    title = (
        f"dense top-label ECE, {n_bins} bins, probabilities [{images}, {classes}, {height}, "
        f"{width}] float32 with [{images}, {height}, {width}] masks ({kept:,} pixels kept, the "
        f"rest ignore_index={IGNORED}), CPU ({torch.get_num_threads()} threads), torch "
        f"{torch.__version__}; median of {repeats}"
    )
    print()
    table(title, values, median, base, markdown)
    pairs = [
        ("torchmetrics [N, C, H, W] (its own flattening)", base),
        ("torchmetrics, rows flattened beforehand", "ours, rows flattened beforehand"),
    ]
    print()
    for peer, ours in pairs:
        if peer in median:
            print(f"{peer} / {ours}: {median[peer] / median[ours]:.2f}x")


def edge_hits(probs: torch.Tensor, n_bins: int) -> int:
    """How many top-label confidences equal an inner edge k/B (float32)."""
    confidence = probs.max(dim=1).values
    edges = (torch.arange(1, n_bins, dtype=torch.float64) / n_bins).float()
    return int(torch.isin(confidence, edges).sum())


def main() -> None:
    """Time the candidates on ``[N, C]`` probabilities and print the table and checks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--bins", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-netcal", action="store_true", help="skip netcal (slowest)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--dense",
        type=int,
        nargs=4,
        metavar=("N", "C", "H", "W"),
        help="also time dense [N, C, H, W] probabilities with [N, H, W] masks",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    probs, target = make_inputs(args.rows, args.classes)
    cases = candidates(probs, target, args.bins, with_netcal=not args.no_netcal)
    values, median = run(cases, args.repeats)
    base = "ours calibration_error"
    title = (
        f"top-label ECE, {args.bins} bins, probabilities [{args.rows:,}, {args.classes}] float32, "
        f"CPU ({torch.get_num_threads()} threads), torch {torch.__version__}; "
        f"median of {args.repeats}"
    )
    table(title, values, median, base, args.markdown)
    peer = "torchmetrics multiclass_calibration_error"
    if peer in values:  # it casts confidences to float32 and sums in float32: redo in float64
        try:
            from torchmetrics.functional.classification.calibration_error import _ce_compute

            confidence, predicted = probs.max(dim=1)
            correct = (predicted == target).double()
            exact = _ce_compute(confidence.double(), correct, args.bins, norm="l1").item()
            gap = abs(exact - values[base])
            print(
                f"\n{peer}, its binning summed in float64: {exact:.9f} (|ECE - ours| = {gap:.1e})"
            )
        except ImportError:  # a private helper: skip the check where it moved
            pass
    hits = edge_hits(probs, args.bins)
    saturated = int((probs.max(dim=1).values == 1).sum())
    print(
        f"confidences exactly on an inner edge k/{args.bins}: {hits} (binned differently by "
        f"the peers); exactly 1: {saturated} (clipped to 1 - eps by netcal)"
    )
    if args.dense:
        del probs, target, cases
        dense_benchmark(args.dense, args.bins, args.repeats, args.markdown)


if __name__ == "__main__":
    main()
