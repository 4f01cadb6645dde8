"""Language-model heads: time and peak memory of the chunked losses beside PyTorch's, in one run.

Usage::

    python benchmarks/lm_head.py                       # N=8192, H=512, V=32000 and 128000
    python benchmarks/lm_head.py --quick               # small shapes, a smoke test (~1 min)
    python benchmarks/lm_head.py --shapes 4096x1024x50257 --dtype bfloat16 --threads 1
    python benchmarks/lm_head.py --markdown            # the README table

Every candidate is one forward + backward of a loss of ``logits = hidden @ weight.T`` with
``hidden [N, H]`` and ``weight [V, H]`` requiring gradients:

- ``plain logits + F.cross_entropy``: the ``[N, V]`` logits built (skipped when it would need
  more than ``--max-plain-gib``);
- ``torch chunked CE (mean)``: ``F.linear_cross_entropy`` with ``LinearCrossEntropyOptions()``
  (chunking on, ``chunking_method="auto"``: for float32 ``aspect_ratio:2`` rows per chunk and
  the ``compact`` policy), the baseline of every ratio;
- ``torch chunked CE (none) + focal / gamma_ce``: the composed path, PyTorch's chunked per-token
  cross-entropy with ``reduction="none"`` and the family's ``phi`` applied to ``log p = -CE``;
- ``ours <loss>``: :func:`lightning_losses.functional.linear_target_loss` for every member of
  the family (``reduction="mean"``, the chunk size it picks itself), and ``focal`` with
  ``reduction="none"`` then ``.mean()`` (recomputes in backward; not a target).

Times are the median of ``--repeats`` calls after one warm-up, the candidates interleaved in
each repetition so that drift of a shared machine hits them alike. Peak memory is measured for
each candidate in a fresh process: the resident high-water mark of one forward + backward
(reset just before it by writing 5 to ``/proc/self/clear_refs``) less the resident set at that
moment (inputs already allocated; the gradients count, for every candidate alike), after one
call on a tiny shape so that one-time set-up (loading kernels, registering ops) is not counted.
Targets for ours: time <= 1.05x and peak memory <= 1.2x PyTorch's chunked mean cross-entropy.
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

from lightning_losses.functional._core import apply_phi
from lightning_losses.functional.linear import linear_target_loss
from lightning_losses.functional.target_probability import FAMILY

Case = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
BASELINE = "torch chunked CE (mean)"
TIME_TARGET, MEMORY_TARGET = 1.05, 1.2
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _torch_chunked(reduction: str, label_smoothing: float = 0.0) -> Case:
    options = torch.nn.LinearCrossEntropyOptions()
    return lambda h, w, t: F.linear_cross_entropy(
        h, w, t, reduction=reduction, label_smoothing=label_smoothing, options=options
    )


def _composed(loss: str, **hyperparameters: float) -> Case:
    per_token = _torch_chunked("none")

    def case(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        log_p = -per_token(h, w, t).float()
        return apply_phi(log_p, FAMILY[loss], **hyperparameters).mean()

    return case


def _ours(loss: str, reduction: str = "mean", **hyperparameters: float) -> Case:
    def case(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        value = linear_target_loss(h, w, t, loss=loss, reduction=reduction, **hyperparameters)
        return value.mean() if reduction == "none" else value

    return case


#: Ours, one per member of the family: the candidates the targets apply to.
OURS = {
    "ours ce": _ours("ce"),
    "ours gamma_ce(0.5)": _ours("gamma_ce", gamma=0.5),
    "ours gamma_ce(0.5, b=0.2)": _ours("gamma_ce", gamma=0.5, threshold=0.2),
    "ours soft_accuracy": _ours("soft_accuracy"),
    "ours focal(2)": _ours("focal", gamma=2.0),
    "ours adaptive_focal": _ours("adaptive_focal"),
    "ours hard_truncated(0.5)": _ours("hard_truncated", margin=0.5),
    "ours ce, ls=0.1": _ours("ce", label_smoothing=0.1),
    "ours gamma_ce(0.5), ls=0.1": _ours("gamma_ce", gamma=0.5, label_smoothing=0.1),
}
#: ``name with label smoothing -> (the same loss without it, PyTorch's smoothed chunked CE)``.
SMOOTHED = {
    "ours ce, ls=0.1": ("ours ce", "torch chunked CE (mean), ls=0.1"),
    "ours gamma_ce(0.5), ls=0.1": ("ours gamma_ce(0.5)", "torch chunked CE (mean), ls=0.1"),
}


def all_cases() -> dict[str, Case]:
    """Every candidate by name: PyTorch's plain and chunked heads, and ours."""
    return {
        "plain logits + F.cross_entropy": lambda h, w, t: F.cross_entropy(h @ w.T, t),
        BASELINE: _torch_chunked("mean"),
        "torch chunked CE (mean), ls=0.1": _torch_chunked("mean", label_smoothing=0.1),
        "torch chunked CE (none) + focal(2)": _composed("focal", gamma=2.0),
        "torch chunked CE (none) + gamma_ce(0.5)": _composed("gamma_ce", gamma=0.5),
        **OURS,
        "ours focal(2), reduction=none": _ours("focal", reduction="none", gamma=2.0),
    }


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"8192x512x32000"`` -> ``(N, H, V)``."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"shape must be NxHxV (e.g. 8192x512x32000); got {text}")
    n, h, v = (int(p) for p in parts)
    return n, h, v


def make_inputs(shape: tuple[int, int, int], dtype: torch.dtype, seed: int = 0):
    """Hidden states ``[N, H]``, weight ``[V, H]`` (both requiring grad) and targets."""
    n, h, v = shape
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=generator) / h**0.5).to(dtype).requires_grad_()
    target = torch.randint(0, v, (n,), generator=generator)
    return hidden, weight, target


def plain_bytes(shape: tuple[int, int, int]) -> int:
    """About what the plain path holds at its peak: logits, log-softmax and two gradients."""
    n, _, v = shape
    return 4 * n * v * 4


def run_once(case: Case, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor):
    """Seconds of one forward and backward of ``case`` (gradients reset first)."""
    hidden.grad = weight.grad = None
    start = time.perf_counter()
    case(hidden, weight, target).backward()
    return time.perf_counter() - start


def measure_memory(name: str, shape: tuple[int, int, int], dtype: torch.dtype) -> None:
    """Child process: print the peak extra resident memory of one forward + backward."""
    case = all_cases()[name]
    case(*make_inputs((64, 16, 256), dtype)).backward()  # first-call set-up, not counted
    hidden, weight, target = make_inputs(shape, dtype)
    reset_peak()
    before = status_bytes("VmRSS")
    case(hidden, weight, target).backward()
    peak = status_bytes("VmHWM")
    print(json.dumps({"extra_bytes": max(peak - before, 0)}))


def peak_memory(name: str, shape: tuple[int, int, int], dtype: str, threads: int) -> float:
    """Peak extra MiB of ``name`` measured in a fresh process."""
    command = [sys.executable, __file__, "--memory-of", name, "--dtype", dtype]
    command += ["--shapes", "x".join(map(str, shape)), "--threads", str(threads)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["extra_bytes"] / 2**20


def benchmark_shape(shape, args, names: list[str]) -> dict[str, tuple[float, float | None]]:
    """``{name: (median seconds, peak MiB or None)}`` for one shape."""
    cases = all_cases()
    dtype = DTYPES[args.dtype]
    inputs = make_inputs(shape, dtype)
    for name in names:
        run_once(cases[name], *inputs)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            times[name].append(run_once(cases[name], *inputs))
    del inputs
    memory: dict[str, float | None] = dict.fromkeys(names)
    if not args.no_memory:
        for name in names:
            memory[name] = peak_memory(name, shape, args.dtype, torch.get_num_threads())
    return {name: (statistics.median(times[name]), memory[name]) for name in names}


def report(shape, results, args, skipped: str | None) -> tuple[float, float | None]:
    """Print one shape's table; return the worst time and memory ratios of ours."""
    base_time, base_memory = results[BASELINE]
    n, h, v = shape
    title = (
        f"N={n} tokens, H={h}, V={v}, {args.dtype}, CPU ({torch.get_num_threads()} threads), "
        f"torch {torch.__version__}; forward+backward, median of {args.repeats}"
    )
    header = ["candidate", "ms", f"time / {BASELINE}", "peak MiB", "memory / baseline"]
    rows = []
    for name, (seconds, mib) in results.items():
        mark = " *" if name in OURS else ""
        memory_ratio = "" if mib is None or not base_memory else f"{mib / base_memory:.2f}x"
        rows.append(
            [
                name + mark,
                f"{1000 * seconds:.0f}",
                f"{seconds / base_time:.2f}x",
                "" if mib is None else f"{mib:.0f}",
                memory_ratio,
            ]
        )
    if args.markdown:
        print(f"\n{title}. `*`: ours, target <= {TIME_TARGET}x time, <= {MEMORY_TARGET}x memory.")
        if skipped:
            print(f"{skipped}.")
        print("\n| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        print(f"\n{title}   (* ours)")
        if skipped:
            print(skipped)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    for name, (plain, torch_name) in SMOOTHED.items():
        (seconds, mib), (plain_seconds, plain_mib) = results[name], results[plain]
        torch_seconds, torch_mib = results[torch_name]
        line = (
            f"{name}: time {seconds / plain_seconds:.2f}x {plain}, "
            f"{seconds / torch_seconds:.2f}x {torch_name}"
        )
        if mib and plain_mib and torch_mib:
            line += f"; peak memory {mib / plain_mib:.2f}x, {mib / torch_mib:.2f}x"
        print(line)
    worst_time = max(results[name][0] for name in OURS) / base_time
    worst_memory = None
    if base_memory:
        worst_memory = max(results[name][1] or 0.0 for name in OURS) / base_memory
    return worst_time, worst_memory


def main() -> None:
    """Time (and measure) every candidate on each shape and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shape, nargs="+", help="NxHxV, several allowed")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--quick", action="store_true", help="small shapes, 2 repeats")
    parser.add_argument("--max-plain-gib", type=float, default=6.0)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_of:
        measure_memory(args.memory_of, args.shapes[0], DTYPES[args.dtype])
        return
    if args.quick:
        args.shapes = args.shapes or [(2048, 256, 8000), (2048, 256, 32000)]
        args.repeats = 2
    shapes = args.shapes or [(8192, 512, 32000), (8192, 512, 128000)]

    verdicts = []
    for shape in shapes:
        names = list(all_cases())
        skipped = None
        if plain_bytes(shape) > args.max_plain_gib * 2**30:
            names.remove("plain logits + F.cross_entropy")
            skipped = (
                f"plain logits skipped: it would need about {plain_bytes(shape) / 2**30:.1f} GiB "
                f"(> --max-plain-gib {args.max_plain_gib:g})"
            )
        results = benchmark_shape(shape, args, names)
        verdicts.append((shape, *report(shape, results, args, skipped)))
    print()
    for shape, worst_time, worst_memory in verdicts:
        memory_text = "n/a" if worst_memory is None else f"{worst_memory:.2f}x"
        met = worst_time <= TIME_TARGET and (worst_memory or 0.0) <= MEMORY_TARGET
        print(
            f"{'x'.join(map(str, shape))}: slowest of ours {worst_time:.2f}x, largest peak "
            f"{memory_text} of {BASELINE}; targets ({TIME_TARGET}x, {MEMORY_TARGET}x) "
            f"{'met' if met else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
