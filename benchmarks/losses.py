"""Forward + backward time and peak memory of every loss, beside F.cross_entropy, in one run.

Usage::

    python benchmarks/losses.py                     # [32768, 1000] float32 on the CPU
    python benchmarks/losses.py --rows 4096 --classes 100 --repeats 3
    python benchmarks/losses.py --markdown          # the README table
    python benchmarks/losses.py --only poly1_loss mdca_loss   # some cases, beside F.cross_entropy
    python benchmarks/losses.py --device cuda --dtype bfloat16   # on the GPU, bfloat16 logits
    python benchmarks/losses.py --small             # per-call cost: small batches, one thread

Times are the median of ``--repeats`` timed calls after one warm-up, the candidates run in
turn within each repetition so that drift of the machine hits them alike. Peak memory is
measured for each candidate in a fresh process: the resident-set high-water mark of one
forward + backward (reset just before it), less the resident set at that moment (inputs already
allocated; the gradient of the logits counts, for every candidate alike). Every
ratio is to ``F.cross_entropy`` measured in the same run. kornia's and torchvision's focal
losses are included when those packages import.

With ``--device cuda`` the inputs are made on the GPU, each timed call is bracketed by
``torch.cuda.synchronize()`` (so that its time covers the kernels it queued), and peak memory is
measured in this process after the warm-ups: ``torch.cuda.max_memory_allocated()`` over one
forward + backward (its statistics reset just before it) less ``torch.cuda.memory_allocated()``
at that moment (again inputs excluded, the gradient of the logits counted). A case that runs out
of GPU memory is left out of the table and named below it.

With ``--small`` the table is the per-call cost instead: forward + backward of the loss modules
(each registry loss of the target-probability family and the literature's, with its defaults,
built by :func:`lightning_losses.get_loss`), called as a training step calls them, on small
logits (``--small-sizes``, by default [100, 10], [32, 10] and [256, 100]) on one CPU thread,
with the argument checks on (``validate_args=True``, the default) and off, each over
``F.cross_entropy`` timed in the same run. Every call is timed on its own (``--small-repeats``
of them per case, the cases in turn within each repetition) and the median is shown, in µs.
With ``--small-warm`` each timed call follows an untimed call of the same case (a call's time
depends on the one before it; see :func:`small_medians`).
Targets: ``CrossEntropyLoss`` within 1.2x ``F.cross_entropy``, every other loss within 2x, with
the checks on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from peak_memory import reset_peak, status_bytes

from lightning_losses import functional as LF
from lightning_losses import get_loss

Case = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# AdaFocal's state as training leaves it: 15 bins, focal gammas above 0, inverse focal below.
ADAFOCAL_EDGES = torch.linspace(0.0, 1.0, 16, dtype=torch.float64)
ADAFOCAL_GAMMAS = torch.tensor(
    [5.0, 4.2, 3.1, 2.5, 1.7, 1.2, 0.8, 0.4, -0.2, -0.6, 0.3, 1.1, 2.0, -1.5, 3.0],
    dtype=torch.float64,
)


def _family_cases(device: str = "cpu") -> dict[str, tuple[str, Case]]:
    # AdaFocal's bins on the logits' device, as the loss module's buffers would be in training.
    edges, gammas = ADAFOCAL_EDGES.to(device), ADAFOCAL_GAMMAS.to(device)
    return {
        "F.cross_entropy": ("index", lambda x, t, y: F.cross_entropy(x, t)),
        "cross_entropy": ("index", lambda x, t, y: LF.cross_entropy(x, t)),
        "gamma_cross_entropy(0.5)": (
            "index",
            lambda x, t, y: LF.gamma_cross_entropy(x, t, gamma=0.5),
        ),
        "F.cross_entropy(ls=0.1)": (
            "index",
            lambda x, t, y: F.cross_entropy(x, t, label_smoothing=0.1),
        ),
        "cross_entropy(ls=0.1)": (
            "index",
            lambda x, t, y: LF.cross_entropy(x, t, label_smoothing=0.1),
        ),
        "gamma_cross_entropy(0.5, ls=0.1)": (
            "index",
            lambda x, t, y: LF.gamma_cross_entropy(x, t, gamma=0.5, label_smoothing=0.1),
        ),
        "gamma_cross_entropy(0.5, b=0.2)": (
            "index",
            lambda x, t, y: LF.gamma_cross_entropy(x, t, gamma=0.5, threshold=0.2),
        ),
        "soft_accuracy_loss": ("index", lambda x, t, y: LF.soft_accuracy_loss(x, t)),
        "focal_loss(2)": ("index", lambda x, t, y: LF.focal_loss(x, t, gamma=2.0)),
        "focal_loss(0.5)": ("index", lambda x, t, y: LF.focal_loss(x, t, gamma=0.5)),
        "adaptive_focal_loss": ("index", lambda x, t, y: LF.adaptive_focal_loss(x, t)),
        "adafocal_loss (15 bins)": (
            "index",
            lambda x, t, y: LF.adafocal_loss(x, t, edges=edges, gammas=gammas),
        ),
        "hard_truncated_loss": ("index", lambda x, t, y: LF.hard_truncated_loss(x, t)),
        "poly1_loss": ("index", lambda x, t, y: LF.poly1_loss(x, t, epsilon=1.0)),
    }


#: The losses with a batch-level calibration penalty (target: within 1.50x F.cross_entropy).
BATCH_PENALTIES = ("mdca_loss", "dca_loss", "mmce_loss")


def _other_cases() -> dict[str, tuple[str, Case]]:
    def nm(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, variant: str) -> torch.Tensor:
        m = 3
        n = x.shape[1] // m
        s = x[:, : n * m].reshape(x.shape[0], n, m)
        return LF.nm_categorical_crossentropy(s, t[:, None].expand(-1, n) % m, variant=variant)

    return {
        "soft_truncated_loss": ("index", lambda x, t, y: LF.soft_truncated_loss(x, t)),
        "mbls_loss": ("index", lambda x, t, y: LF.mbls_loss(x, t)),
        "dual_focal_loss": ("index", lambda x, t, y: LF.dual_focal_loss(x, t)),
        "mdca_loss": ("index", lambda x, t, y: LF.mdca_loss(x, t)),
        "dca_loss": ("index", lambda x, t, y: LF.dca_loss(x, t)),
        "mmce_loss": ("index", lambda x, t, y: LF.mmce_loss(x, t)),
        "exact_loss (32 nodes)": ("index", lambda x, t, y: LF.exact_loss(x, t)),
        "binary_focal_loss": ("binary", lambda x, t, y: LF.binary_focal_loss(x, y)),
        "binary_soft_truncated_loss": (
            "binary",
            lambda x, t, y: LF.binary_soft_truncated_loss(x, y),
        ),
        "binary_hard_truncated_loss": (
            "binary",
            lambda x, t, y: LF.binary_hard_truncated_loss(x, y),
        ),
        "multilabel_categorical_ce": (
            "binary",
            lambda x, t, y: LF.multilabel_categorical_crossentropy(x, y),
        ),
        "nm_categorical_ce (m=3, pairwise)": ("index", lambda x, t, y: nm(x, t, y, "pairwise")),
        "nm_categorical_ce (m=3, centered)": ("index", lambda x, t, y: nm(x, t, y, "centered")),
    }


def _peer_cases() -> dict[str, tuple[str, Case]]:
    cases: dict[str, tuple[str, Case]] = {}
    try:
        import kornia.losses as kl

        cases["kornia focal_loss(2)"] = (
            "index",
            lambda x, t, y: kl.focal_loss(x, t, alpha=None, gamma=2.0, reduction="mean"),
        )
        cases["kornia binary_focal_loss_with_logits"] = (
            "binary",
            lambda x, t, y: kl.binary_focal_loss_with_logits(
                x, y, alpha=None, gamma=2.0, reduction="mean"
            ),
        )
    except Exception:  # kornia is optional: the table says which peers ran
        pass
    try:
        from torchvision.ops import sigmoid_focal_loss

        cases["torchvision sigmoid_focal_loss"] = (
            "binary",
            lambda x, t, y: sigmoid_focal_loss(x, y, reduction="mean"),
        )
    except Exception:  # torchvision is optional and does not import beside every torch build
        pass
    return cases


def all_cases(device: str = "cpu") -> dict[str, tuple[str, Case]]:
    """Every timed loss by name, with its kind of target (``index`` or ``binary``)."""
    return {**_family_cases(device), **_peer_cases(), **_other_cases()}


FAMILY = set(_family_cases()) - {"F.cross_entropy", "F.cross_entropy(ls=0.1)"}
#: ``name with label smoothing -> the same loss without it`` (target: within 1.10x of it).
SMOOTHED = {
    "cross_entropy(ls=0.1)": "cross_entropy",
    "gamma_cross_entropy(0.5, ls=0.1)": "gamma_cross_entropy(0.5)",
}


#: The registry's losses in the small-batch table: the target-probability family (``ce`` within
#: 1.2x ``F.cross_entropy``) and the literature's built on it (each within 2x).
SMALL_LOSSES = (
    "ce",
    "gamma_ce",
    "soft_accuracy",
    "focal",
    "adaptive_focal",
    "adafocal",
    "hard_truncated",
    "poly1",
    "mbls",
    "dual_focal",
    "mdca",
    "dca",
    "mmce",
)
#: Options of the small table's variants beside the defaults: ``name -> (registry name, options)``.
SMALL_VARIANTS = {
    "gamma_ce (TaiLr, threshold=0.2)": ("gamma_ce", {"threshold": 0.2}),
    "ce (label_smoothing=0.1)": ("ce", {"label_smoothing": 0.1}),
}
#: The small table's ratio targets (with the checks on): ``ce`` and every other loss.
SMALL_TARGET_CE, SMALL_TARGET_OTHERS = 1.2, 2.0


def small_cases(x: torch.Tensor, t: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """``F.cross_entropy`` and each small-table module, checks on and off, as calls of x, t."""
    specs = {name: (name, {}) for name in SMALL_LOSSES}
    specs.update(SMALL_VARIANTS)
    cases: dict[str, Callable[[], torch.Tensor]] = {
        "F.cross_entropy": lambda: F.cross_entropy(x, t)
    }
    for validate_args in (True, False):
        for name, (registry_name, options) in specs.items():
            module = get_loss(registry_name, **options, validate_args=validate_args)
            key = name if validate_args else f"{name} [unchecked]"
            cases[key] = lambda module=module: module(x, t)
    return cases


def small_medians(
    cases: dict[str, Callable[[], torch.Tensor]], x: torch.Tensor, repeats: int, warm: bool = False
) -> dict[str, float]:
    """Median seconds of one forward + backward of each case, the cases in turn (warmed up).

    A call's time depends on the call before it (the caches and the allocator it leaves:
    ``F.cross_entropy`` at [100, 10] measured 15-20 µs slower right after a loss of a dozen
    operations than right after itself). In turn, each case follows another; with ``warm``
    each timed call follows an untimed call of the same case, as in consecutive steps.
    """
    times: dict[str, list[float]] = {name: [] for name in cases}
    for repeat in range(repeats + 20):
        for name, case in cases.items():
            x.grad = None
            if warm:
                case().backward()
                x.grad = None
            start = time.perf_counter()
            case().backward()
            elapsed = time.perf_counter() - start
            if repeat >= 20:  # the first calls warm up
                times[name].append(elapsed)
    return {name: statistics.median(values) for name, values in times.items()}


def small_table(args: argparse.Namespace) -> None:
    """The per-call table: every small-table module over ``F.cross_entropy``, one CPU thread."""
    torch.set_num_threads(1)
    worst: dict[str, float] = {}
    for size in args.small_sizes:
        rows, classes = (int(v) for v in size.split("x"))
        x, t, _ = make_inputs(rows, classes, binary=False)
        median = small_medians(small_cases(x, t), x, args.small_repeats, args.small_warm)
        base = median["F.cross_entropy"]
        title = (
            f"forward+backward of the loss modules, logits [{rows}, {classes}] float32, CPU "
            f"(1 thread), torch {torch.__version__}; median of {args.small_repeats} calls each"
            f"{', each after a call of itself' if args.small_warm else ', the cases in turn'}"
        )
        header = ["loss", "µs", "/ F.cross_entropy", "µs unchecked", "/ F.cross_entropy"]
        table = [["F.cross_entropy", f"{1e6 * base:.1f}", "1.00x", "", ""]]
        for name in median:
            if name == "F.cross_entropy" or name.endswith("[unchecked]"):
                continue
            checked, unchecked = median[name], median[f"{name} [unchecked]"]
            table.append(
                [
                    name,
                    f"{1e6 * checked:.1f}",
                    f"{checked / base:.2f}x",
                    f"{1e6 * unchecked:.1f}",
                    f"{unchecked / base:.2f}x",
                ]
            )
            worst[name] = max(worst.get(name, 0.0), checked / base)
        print_rows(title, "unchecked: validate_args=False", header, table, args.markdown)
        print()
    ce = worst.pop("ce")
    others = max(worst.values())
    slowest = max(worst, key=worst.__getitem__)
    print(
        f"ce: {ce:.2f}x F.cross_entropy at worst (target <= {SMALL_TARGET_CE}x: "
        f"{'met' if ce <= SMALL_TARGET_CE else 'NOT met'}); every other loss: {others:.2f}x at "
        f"worst ({slowest}; target <= {SMALL_TARGET_OTHERS}x: "
        f"{'met' if others <= SMALL_TARGET_OTHERS else 'NOT met'}), with the checks on"
    )


def synchronize(device: str) -> None:
    """Wait for the kernels queued on ``device`` (CUDA); nothing on the CPU."""
    if device == "cuda":
        torch.cuda.synchronize()


def device_text(device: str) -> str:
    """The device in the table's title: the GPU's name, or the CPU and its threads."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({torch.get_num_threads()} threads)"


def make_inputs(
    rows: int,
    classes: int,
    seed: int = 0,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    binary: bool = True,
):
    """Logits ``[rows, classes]`` (requiring grad), class indices and sparse labels.

    Made on ``device`` by a generator there (the CPU's values do not depend on the options);
    the labels ``[rows, classes]`` only with ``binary`` (else ``None``), in ``dtype`` as the
    logits.
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    x = 2 * torch.randn(rows, classes, generator=generator, device=device)
    x = x.to(dtype).requires_grad_()
    t = torch.randint(0, classes, (rows,), generator=generator, device=device)
    y = None
    if binary:
        y = (torch.rand(rows, classes, generator=generator, device=device) < 0.01).to(dtype)
    return x, t, y


def run_once(
    case: Case, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None, device: str = "cpu"
) -> float:
    """Seconds of one forward and backward of ``case`` (the gradient reset first).

    On CUDA the device is synchronised before the clock starts and before it stops.
    """
    x.grad = None
    synchronize(device)
    start = time.perf_counter()
    case(x, t, y).backward()
    synchronize(device)
    return time.perf_counter() - start


def measure_memory(name: str, rows: int, classes: int, dtype: torch.dtype) -> None:
    """Child process: print the peak extra resident memory of one forward + backward."""
    _, case = all_cases()[name]
    x, t, y = make_inputs(rows, classes, dtype=dtype)
    reset_peak()
    before = status_bytes("VmRSS")
    case(x, t, y).backward()
    peak = status_bytes("VmHWM")
    print(json.dumps({"extra_bytes": max(peak - before, 0)}))


def cuda_peak_memory(case: Case, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None) -> float:
    """Peak extra MiB of one forward + backward on CUDA, in this process (after a warm-up).

    ``torch.cuda.max_memory_allocated()`` over the call (statistics reset just before it) less
    ``torch.cuda.memory_allocated()`` then: the inputs are excluded, the new gradient counts.
    """
    x.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    case(x, t, y).backward()
    torch.cuda.synchronize()
    return max(torch.cuda.max_memory_allocated() - before, 0) / 2**20


def peak_memory(name: str, rows: int, classes: int, dtype: str = "float32") -> float:
    """Peak extra MiB of ``name`` measured in a fresh process (the CPU)."""
    command = [sys.executable, __file__, "--memory-of", name]
    command += ["--rows", str(rows), "--classes", str(classes), "--dtype", dtype]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["extra_bytes"] / 2**20


def parse_args() -> argparse.Namespace:
    """The command line's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--slow-repeats", type=int, default=1, help="repeats for EXACT")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--only", nargs="+", metavar="CASE", help="time these cases (and F.cross_entropy) only"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the inputs live"
    )
    parser.add_argument(
        "--dtype", choices=list(DTYPES), default="float32", help="the logits' dtype"
    )
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    parser.add_argument(
        "--small", action="store_true", help="the per-call table of small batches instead"
    )
    parser.add_argument(
        "--small-sizes",
        nargs="+",
        default=["100x10", "32x10", "256x100"],
        metavar="NxC",
        help="logits of the --small table",
    )
    parser.add_argument("--small-repeats", type=int, default=1000, help="calls per --small case")
    parser.add_argument(
        "--small-warm",
        action="store_true",
        help="--small: time each call right after an untimed call of the same case",
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(
            f"argument --device: cuda is not available to torch {torch.__version__} on this "
            "machine; use --device cpu"
        )
    return args


def warm_up(
    cases: dict[str, tuple[str, Case]], inputs: tuple, device: str
) -> dict[str, tuple[str, Case]]:
    """Run each case once (not timed); on CUDA, leave out (and name) those out of memory."""
    kept = {}
    for name, (kind, case) in cases.items():
        try:
            run_once(case, *inputs, device)
        except torch.cuda.OutOfMemoryError:
            if device == "cpu":
                raise
            inputs[0].grad = None
            torch.cuda.empty_cache()
            print(f"{name}: out of GPU memory, left out", file=sys.stderr)
            continue
        kept[name] = (kind, case)
    return kept


def median_times(
    cases: dict[str, tuple[str, Case]], inputs: tuple, args: argparse.Namespace
) -> dict[str, float]:
    """Median seconds of each case, interleaved (EXACT: ``--slow-repeats``); warmed up before."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for repeat in range(args.repeats):
        for name, (_, case) in cases.items():
            if "exact" in name and repeat >= args.slow_repeats:
                continue
            times[name].append(run_once(case, *inputs, args.device))
    return {name: statistics.median(values) for name, values in times.items()}


def print_table(
    names: list[str], median: dict[str, float], memory: dict[str, float], args: argparse.Namespace
) -> None:
    """The table of times and peak memory, each over ``F.cross_entropy``'s."""
    base_time = median["F.cross_entropy"]
    base_memory = memory.get("F.cross_entropy")
    title = (
        f"forward+backward, logits [{args.rows}, {args.classes}] {args.dtype}, "
        f"{device_text(args.device)}, torch {torch.__version__}; median of {args.repeats}"
    )
    if args.device == "cuda" and memory:
        title += (
            "; peak MiB: torch.cuda.max_memory_allocated over one call less the memory "
            "allocated before it"
        )
    header = ["loss", "ms", "time / F.cross_entropy", "peak MiB", "memory / F.cross_entropy"]
    rows = []
    for name in names:
        mem = memory.get(name)
        mem_text = "" if mem is None else f"{mem:.0f}"
        mem_ratio = "" if mem is None or not base_memory else f"{mem / base_memory:.2f}x"
        mark = " *" if name in FAMILY else ""
        rows.append(
            [
                name + mark,
                f"{1000 * median[name]:.1f}",
                f"{median[name] / base_time:.2f}x",
                mem_text,
                mem_ratio,
            ]
        )
    note = "`*`: target-probability family (target: within 1.10x)"
    print_rows(title, note, header, rows, args.markdown)


def print_rows(
    title: str, note: str, header: list[str], rows: list[list[str]], markdown: bool
) -> None:
    """A table: Markdown (title, note, then the rows) or aligned text (the note after the title)."""
    if markdown:
        print(f"{title}. {note}.\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        print(f"{title}   ({note.replace('`', '')})")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def print_targets(median: dict[str, float], memory: dict[str, float]) -> None:
    """The ratios the targets name (those whose losses ran): family, smoothing, Poly-1, ..."""
    base = median["F.cross_entropy"]
    family = [name for name in FAMILY if name in median]
    if family:
        worst = max(median[name] / base for name in family)
        print(f"\nslowest family member: {worst:.3f}x F.cross_entropy")
    for name, plain in SMOOTHED.items():
        if not {name, plain, "F.cross_entropy(ls=0.1)"} <= set(median):
            continue
        line = (
            f"{name}: time {median[name] / median[plain]:.3f}x {plain}, "
            f"{median[name] / median['F.cross_entropy(ls=0.1)']:.3f}x F.cross_entropy(ls=0.1)"
        )
        if memory:
            line += (
                f"; peak memory {memory[name] / memory[plain]:.2f}x {plain}, "
                f"{memory[name] / memory['F.cross_entropy(ls=0.1)']:.2f}x "
                "F.cross_entropy(ls=0.1)"
            )
        print(line + " (target: within 1.10x of the unsmoothed time, no extra [N, C] memory)")
    if "poly1_loss" in median:
        print(
            f"poly1_loss: {median['poly1_loss'] / base:.3f}x F.cross_entropy (target: within 1.10x)"
        )
    penalties = {name: median[name] / base for name in BATCH_PENALTIES if name in median}
    if penalties:
        print(
            "batch-level penalties: "
            + ", ".join(f"{name} {ratio:.3f}x" for name, ratio in penalties.items())
            + " F.cross_entropy (target: within 1.50x)"
        )
    if {"adafocal_loss (15 bins)", "focal_loss(2)", "focal_loss(0.5)"} <= set(median):
        adafocal = median["adafocal_loss (15 bins)"]
        print(
            f"adafocal_loss / focal_loss(2): {adafocal / median['focal_loss(2)']:.3f}x, "
            f"/ focal_loss(0.5): {adafocal / median['focal_loss(0.5)']:.3f}x "
            "(target: within 1.10x)"
        )


def main() -> None:
    """Time every case, measure its memory in child processes, print the table and targets."""
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_of:
        measure_memory(args.memory_of, args.rows, args.classes, DTYPES[args.dtype])
        return
    if args.small:
        small_table(args)
        return
    cases = all_cases(args.device)
    if args.only:
        unknown = sorted(set(args.only) - set(cases))
        if unknown:
            raise SystemExit(f"--only: unknown case(s) {unknown}; the cases: {sorted(cases)}")
        cases = {k: v for k, v in cases.items() if k == "F.cross_entropy" or k in args.only}
    binary = any(kind == "binary" for kind, _ in cases.values())
    dtype = DTYPES[args.dtype]
    inputs = make_inputs(args.rows, args.classes, device=args.device, dtype=dtype, binary=binary)
    timed = warm_up(cases, inputs, args.device)
    median = median_times(timed, inputs, args)
    memory = {}
    if not args.no_memory and args.device == "cpu":
        del inputs  # as before: the children make their own
        memory = {name: peak_memory(name, args.rows, args.classes, args.dtype) for name in timed}
    elif not args.no_memory:
        memory = {name: cuda_peak_memory(case, *inputs) for name, (_, case) in timed.items()}
    print_table(list(timed), median, memory, args)
    left_out = [name for name in cases if name not in timed]
    if left_out:
        print(f"\nout of GPU memory (left out): {', '.join(left_out)}")
    print_targets(median, memory)


if __name__ == "__main__":
    main()
