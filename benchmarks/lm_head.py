"""Language-model heads: time and peak memory of the chunked losses beside PyTorch's, in one run.

Usage::

    python benchmarks/lm_head.py                       # N=8192, H=512, V=32000 and 128000
    python benchmarks/lm_head.py --quick               # small shapes, a smoke test (~1 min)
    python benchmarks/lm_head.py --shapes 4096x1024x50257 --dtype bfloat16 --threads 1
    python benchmarks/lm_head.py --markdown            # the README table
    python benchmarks/lm_head.py --device cuda --shapes 32768x1024x128000 --max-plain-gib 64
    python benchmarks/lm_head.py --device cuda --backend torch triton --peers   # + Liger, CCE

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
  ``reduction="none"`` then ``.mean()`` (recomputes in backward; not a target); with
  ``--backend torch triton`` each of them once per backend (``[torch]``, ``[triton]``: the
  Triton chunk kernels of ``lightning_losses/kernels/linear_head.py``), with one backend (the
  default ``auto``) under the plain names;
- with ``--peers``, the other fused heads where they import (each left out with a printed reason
  otherwise): Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss``, Apple's cut-cross-entropy
  (``cce``, and ``cce_exact``: ``filter_eps=None``, no gradient filtering), a
  ``torch.compile``d chunked CE (4096 rows a chunk, each chunk checkpointed so that its logits
  are recomputed in the backward), and PyTorch's ``F.linear_cross_entropy`` (above) where this
  torch has it.

``--grad-error`` (default on with ``--peers``) prints, per candidate, the relative error
``||g - g64|| / ||g64||`` of the gradients of ``hidden`` and ``weight`` against a float64
reference from the full logits (``F.cross_entropy`` of the family member's plain-logits
formula in float64 for ours; plain CE for the peers), on the first ``--grad-rows`` rows (2048)
of the same inputs: the float32 runs are the ones the issue's ``1e-4`` applies to.

Times are the median of ``--repeats`` calls after one warm-up, the candidates interleaved in
each repetition so that drift of a shared machine hits them alike. Peak memory is measured for
each candidate in a fresh process: the resident high-water mark of one forward + backward
(reset just before it by writing 5 to ``/proc/self/clear_refs``) less the resident set at that
moment (inputs already allocated; the gradients count, for every candidate alike), after one
call on a tiny shape so that one-time set-up (loading kernels, registering ops) is not counted.
Targets for ours: time <= 1.05x and peak memory <= 1.2x PyTorch's chunked mean cross-entropy.

PyTorch's chunked cases need ``F.linear_cross_entropy`` with ``LinearCrossEntropyOptions``; on a
torch without them they are left out and the ratios are to the plain path (or, when that is
skipped too, to ``ours ce``), the targets then not judged.

With ``--device cuda`` the inputs are moved to the GPU (the same values as on the CPU), each
timed call is bracketed by ``torch.cuda.synchronize()``, and peak memory is measured in this
process after the warm-ups: ``torch.cuda.max_memory_allocated()`` over one forward + backward
(its statistics reset just before it) less ``torch.cuda.memory_allocated()`` at that moment
(inputs excluded, the gradients counted). A candidate that runs out of GPU memory is left out
of the table and named below it. ``--max-plain-gib`` still decides whether the plain path runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from peak_memory import reset_peak, status_bytes

from lightning_losses.functional._core import apply_phi
from lightning_losses.functional.linear import linear_target_loss, resolve_loss
from lightning_losses.functional.target_probability import FAMILY

Case = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
BASELINE = "torch chunked CE (mean)"
PLAIN = "plain logits + F.cross_entropy"
#: Whether this torch has the chunked ``F.linear_cross_entropy`` (PyTorch's cases need it).
TORCH_CHUNKED = hasattr(F, "linear_cross_entropy") and hasattr(
    torch.nn, "LinearCrossEntropyOptions"
)
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


def _ours(
    loss: str, reduction: str = "mean", backend: str = "auto", **hyperparameters: Any
) -> Case:
    def case(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        value = linear_target_loss(
            h, w, t, loss=loss, reduction=reduction, backend=backend, **hyperparameters
        )
        return value.mean() if reduction == "none" else value

    return case


#: Ours, one per member of the family (the candidates the targets apply to): keywords of
#: :func:`_ours`.
OURS_SPECS: dict[str, dict[str, Any]] = {
    "ours ce": {"loss": "ce"},
    "ours gamma_ce(0.5)": {"loss": "gamma_ce", "gamma": 0.5},
    "ours gamma_ce(0.5, b=0.2)": {"loss": "gamma_ce", "gamma": 0.5, "threshold": 0.2},
    "ours soft_accuracy": {"loss": "soft_accuracy"},
    "ours focal(2)": {"loss": "focal", "gamma": 2.0},
    "ours adaptive_focal": {"loss": "adaptive_focal"},
    "ours hard_truncated(0.5)": {"loss": "hard_truncated", "margin": 0.5},
    "ours ce, ls=0.1": {"loss": "ce", "label_smoothing": 0.1},
    "ours gamma_ce(0.5), ls=0.1": {"loss": "gamma_ce", "gamma": 0.5, "label_smoothing": 0.1},
}
#: Ours beyond the targets: the recomputing backward, and half-precision products (float32
#: accumulation, float32 softmax and sums: the tensor cores; the same as "ours ce" for float32).
OURS_EXTRA: dict[str, dict[str, Any]] = {
    "ours focal(2), reduction=none": {"loss": "focal", "reduction": "none", "gamma": 2.0},
    "ours ce, half_matmul": {"loss": "ce", "half_matmul": True},
    "ours gamma_ce(0.5), half_matmul": {"loss": "gamma_ce", "gamma": 0.5, "half_matmul": True},
    "ours ce, z_loss=1e-4": {"loss": "ce", "z_loss": 1e-4},
}
#: The backends ours run with (``--backend``); one backend keeps the plain names.
BACKENDS: list[str] = ["auto"]


def ours_name(name: str, backend: str) -> str:
    """``name`` with its backend (``"ours ce [triton]"``) when several backends run."""
    return name if len(BACKENDS) == 1 else f"{name} [{backend}]"


def ours_cases(specs: dict[str, dict[str, Any]]) -> dict[str, Case]:
    """``specs`` as cases, once per backend of :data:`BACKENDS`."""
    return {
        ours_name(name, backend): _ours(backend=backend, **spec)
        for name, spec in specs.items()
        for backend in BACKENDS
    }


def ours_names() -> list[str]:
    """The names of the candidates the targets apply to."""
    return [ours_name(name, backend) for name in OURS_SPECS for backend in BACKENDS]


#: The peers' import failures, by candidate (printed under each table).
PEER_NOTES: dict[str, str] = {}


def peer_cases() -> dict[str, Case]:
    """Liger's and CCE's fused heads and a compiled chunked CE, those that import here."""
    cases: dict[str, Case] = {}
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyLoss,
        )

        liger = LigerFusedLinearCrossEntropyLoss()
        cases["Liger fused linear CE"] = lambda h, w, t: liger(w, h, t)
    except Exception as error:  # any failure to import: a reason to print
        PEER_NOTES["Liger fused linear CE"] = f"{type(error).__name__}: {error}"
    try:
        from cut_cross_entropy import linear_cross_entropy as cce

        cases["CCE cce"] = lambda h, w, t: cce(h, w, t, impl="cce")
        cases["CCE cce_exact"] = lambda h, w, t: cce(h, w, t, impl="cce", filter_eps=None)
    except Exception as error:
        PEER_NOTES["CCE cce, cce_exact"] = f"{type(error).__name__}: {error}"
    cases["torch.compile chunked CE"] = _compiled_chunked_ce
    return cases


@functools.cache
def _compiled_chunk() -> Callable[..., torch.Tensor]:
    def chunk_loss(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy((h @ w.T).float(), t, reduction="sum")

    return torch.compile(chunk_loss)


def _compiled_chunked_ce(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Mean CE of ``h @ w.T``, 4096 rows a compiled, checkpointed chunk (logits recomputed)."""
    from torch.utils.checkpoint import checkpoint

    total = h.new_zeros((), dtype=torch.float32)
    for start in range(0, h.shape[0], 4096):
        rows = slice(start, start + 4096)
        total = total + checkpoint(_compiled_chunk(), h[rows], w, t[rows], use_reentrant=False)
    return total / max(h.shape[0], 1)


#: ``name with label smoothing -> (the same loss without it, PyTorch's smoothed chunked CE)``.
SMOOTHED = {
    "ours ce, ls=0.1": ("ours ce", "torch chunked CE (mean), ls=0.1"),
    "ours gamma_ce(0.5), ls=0.1": ("ours gamma_ce(0.5)", "torch chunked CE (mean), ls=0.1"),
}


def all_cases() -> dict[str, Case]:
    """Every candidate by name: PyTorch's plain and chunked heads (if it has them), and ours."""
    torch_cases: dict[str, Case] = {}
    if TORCH_CHUNKED:
        torch_cases = {
            BASELINE: _torch_chunked("mean"),
            "torch chunked CE (mean), ls=0.1": _torch_chunked("mean", label_smoothing=0.1),
            "torch chunked CE (none) + focal(2)": _composed("focal", gamma=2.0),
            "torch chunked CE (none) + gamma_ce(0.5)": _composed("gamma_ce", gamma=0.5),
        }
    return {
        PLAIN: lambda h, w, t: F.cross_entropy(h @ w.T, t),
        **torch_cases,
        **ours_cases(OURS_SPECS),
        **ours_cases(OURS_EXTRA),
        **(peer_cases() if PEERS else {}),
    }


#: Whether the peers run (``--peers``).
PEERS = False


def baseline_of(names: list[str]) -> str:
    """The candidate of the ratios: PyTorch's chunked mean CE, else the plain path, else ours."""
    return next(name for name in (BASELINE, PLAIN, ours_names()[0]) if name in names)


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"8192x512x32000"`` -> ``(N, H, V)``."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"shape must be NxHxV (e.g. 8192x512x32000); got {text}")
    n, h, v = (int(p) for p in parts)
    return n, h, v


def make_inputs(
    shape: tuple[int, int, int], dtype: torch.dtype, seed: int = 0, device: str = "cpu"
):
    """Hidden states ``[N, H]``, weight ``[V, H]`` (both requiring grad) and targets.

    Drawn on the CPU and moved to ``device``: the same values on every device.
    """
    n, h, v = shape
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=generator).to(device, dtype).requires_grad_()
    weight = torch.randn(v, h, generator=generator) / h**0.5
    weight = weight.to(device, dtype).requires_grad_()
    target = torch.randint(0, v, (n,), generator=generator).to(device)
    return hidden, weight, target


def plain_bytes(shape: tuple[int, int, int]) -> int:
    """About what the plain path holds at its peak: logits, log-softmax and two gradients."""
    n, _, v = shape
    return 4 * n * v * 4


def synchronize(device: str) -> None:
    """Wait for the kernels queued on ``device`` (CUDA); nothing on the CPU."""
    if device == "cuda":
        torch.cuda.synchronize()


def device_text(device: str, dtype: str) -> str:
    """The device in a table's title: the GPU (and its float32 matmul precision) or the CPU."""
    if device == "cuda":
        precision = torch.get_float32_matmul_precision()
        suffix = f", float32 matmul precision {precision}" if dtype == "float32" else ""
        return torch.cuda.get_device_name() + suffix
    return f"CPU ({torch.get_num_threads()} threads)"


def run_once(
    case: Case,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    device: str = "cpu",
) -> float:
    """Seconds of one forward and backward of ``case`` (gradients reset first).

    On CUDA the device is synchronised before the clock starts and before it stops.
    """
    hidden.grad = weight.grad = None
    synchronize(device)
    start = time.perf_counter()
    case(hidden, weight, target).backward()
    synchronize(device)
    return time.perf_counter() - start


def cuda_peak_memory(
    case: Case, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor
) -> float:
    """Peak extra MiB of one forward + backward on CUDA, in this process (after a warm-up).

    ``torch.cuda.max_memory_allocated()`` over the call (statistics reset just before it) less
    ``torch.cuda.memory_allocated()`` then: the inputs are excluded, the new gradients count.
    """
    hidden.grad = weight.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    case(hidden, weight, target).backward()
    torch.cuda.synchronize()
    return max(torch.cuda.max_memory_allocated() - before, 0) / 2**20


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
    command += ["--backend", *BACKENDS] + (["--peers"] if PEERS else [])
    command += ["--shapes", "x".join(map(str, shape)), "--threads", str(threads)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["extra_bytes"] / 2**20


def benchmark_shape(shape, args, names: list[str]) -> dict[str, tuple[float, float | None]]:
    """``{name: (median seconds, peak MiB or None)}`` for one shape (on CUDA: those that fit)."""
    cases = all_cases()
    dtype = DTYPES[args.dtype]
    inputs = make_inputs(shape, dtype, device=args.device)
    names = warm_up(cases, names, inputs, args.device)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            times[name].append(run_once(cases[name], *inputs, args.device))
    memory: dict[str, float | None] = dict.fromkeys(names)
    if not args.no_memory and args.device == "cuda":
        for name in names:
            memory[name] = cuda_peak_memory(cases[name], *inputs)
    del inputs
    if not args.no_memory and args.device == "cpu":
        for name in names:
            memory[name] = peak_memory(name, shape, args.dtype, torch.get_num_threads())
    if args.device == "cuda":
        torch.cuda.empty_cache()
    if args.grad_error:
        GRAD_ERRORS.update(gradient_errors(cases, names, shape, args))
    return {name: (statistics.median(times[name]), memory[name]) for name in names}


#: ``{name: (relative error of grad hidden, of grad weight)}`` of the last shape (``--grad-error``).
GRAD_ERRORS: dict[str, tuple[float, float]] = {}
#: The loss each candidate that is not plain CE computes, as keywords of ``linear_target_loss``.
COMPOSED_SPECS: dict[str, dict[str, Any]] = {
    "torch chunked CE (mean), ls=0.1": {"loss": "ce", "label_smoothing": 0.1},
    "torch chunked CE (none) + focal(2)": {"loss": "focal", "gamma": 2.0},
    "torch chunked CE (none) + gamma_ce(0.5)": {"loss": "gamma_ce", "gamma": 0.5},
}


def spec_of(name: str) -> dict[str, Any]:
    """The loss candidate ``name`` computes (plain mean CE for the peers)."""
    base = name.split(" [")[0]
    spec = {**OURS_SPECS, **OURS_EXTRA, **COMPOSED_SPECS}.get(base, {"loss": "ce"})
    return {k: v for k, v in spec.items() if k not in ("reduction", "half_matmul")}


def float64_loss(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, spec: dict[str, Any]
) -> torch.Tensor:
    """The mean loss of ``spec`` from the full float64 logits (the family's ``phi``)."""
    hyper = dict(spec)
    loss, z = hyper.pop("loss"), hyper.pop("z_loss", 0.0)
    phi, hyper = resolve_loss(loss, hyper)  # the defaults filled in
    eps = hyper.pop("label_smoothing", 0.0)
    logits = hidden @ weight.T
    lse = torch.logsumexp(logits, dim=1)
    log_p = logits - lse[:, None]
    row = apply_phi(log_p.gather(1, target[:, None]).squeeze(1), phi, **hyper)
    row = (1 - eps) * row - eps / logits.shape[1] * log_p.sum(1) + z * lse**2
    return row.mean()


def gradient_errors(
    cases: dict[str, Case], names: list[str], shape: tuple[int, int, int], args
) -> dict[str, tuple[float, float]]:
    """Relative errors ``||g - g64|| / ||g64||`` of each candidate's gradients, first rows."""
    rows = min(shape[0], args.grad_rows)
    hidden, weight, target = make_inputs(shape, DTYPES[args.dtype], device=args.device)
    hidden, target = hidden.detach()[:rows], target[:rows]
    weight = weight.detach()
    references: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    errors = {}
    for name in names:
        spec = spec_of(name)
        key = json.dumps(spec, sort_keys=True)
        if key not in references:
            h64 = hidden.double().requires_grad_()
            w64 = weight.double().requires_grad_()
            float64_loss(h64, w64, target, spec).backward()
            references[key] = (h64.grad, w64.grad)  # type: ignore[assignment]
        h_leaf = hidden.clone().requires_grad_()
        w_leaf = weight.clone().requires_grad_()
        try:
            cases[name](h_leaf, w_leaf, target).backward()
        except Exception as error:  # reported, not fatal
            print(f"{name}: gradient check failed ({type(error).__name__})", file=sys.stderr)
            continue
        want_h, want_w = references[key]
        assert h_leaf.grad is not None
        assert w_leaf.grad is not None
        errors[name] = (
            float((h_leaf.grad.double() - want_h).norm() / want_h.norm()),
            float((w_leaf.grad.double() - want_w).norm() / want_w.norm()),
        )
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return errors


def warm_up(cases: dict[str, Case], names: list[str], inputs: tuple, device: str) -> list[str]:
    """Run each candidate once (not timed); on CUDA, leave out (and name) those out of memory."""
    kept = []
    for name in names:
        try:
            run_once(cases[name], *inputs, device)
        except torch.cuda.OutOfMemoryError:
            if device == "cpu":
                raise
            inputs[0].grad = inputs[1].grad = None
            torch.cuda.empty_cache()
            print(f"{name}: out of GPU memory, left out", file=sys.stderr)
            continue
        except Exception as error:  # a peer that does not run here (CCE on a CPU ...)
            if name.startswith("ours"):
                raise
            inputs[0].grad = inputs[1].grad = None
            PEER_NOTES[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
            print(f"{name}: failed, left out ({PEER_NOTES[name]})", file=sys.stderr)
            continue
        kept.append(name)
    return kept


def report(shape, results, args, notes: list[str]) -> tuple[str, float, float | None]:
    """Print one shape's table; return its baseline and the worst time and memory ratios of ours."""
    baseline = baseline_of(list(results))
    base_time, base_memory = results[baseline]
    n, h, v = shape
    title = (
        f"N={n} tokens, H={h}, V={v}, {args.dtype}, {device_text(args.device, args.dtype)}, "
        f"torch {torch.__version__}; forward+backward, median of {args.repeats}"
    )
    if args.device == "cuda" and base_memory is not None:
        title += (
            "; peak MiB: torch.cuda.max_memory_allocated over one call less the memory "
            "allocated before it"
        )
    header = ["candidate", "ms", f"time / {baseline}", "peak MiB", "memory / baseline"]
    if args.grad_error:
        rows_checked = min(n, args.grad_rows)
        header.append(f"grad rel. error (hidden, weight) vs float64, first {rows_checked} rows")
    rows = []
    for name, (seconds, mib) in results.items():
        mark = " *" if name in ours_names() else ""
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
        if args.grad_error:
            error = GRAD_ERRORS.get(name)
            rows[-1].append("" if error is None else f"{error[0]:.1e}, {error[1]:.1e}")
    print_table(title, header, rows, notes, args.markdown)
    print_smoothed(results)
    ours = [name for name in ours_names() if name in results]
    worst_time = max(results[name][0] for name in ours) / base_time
    worst_memory = None
    if base_memory:
        worst_memory = max(results[name][1] or 0.0 for name in ours) / base_memory
    return baseline, worst_time, worst_memory


def print_table(
    title: str, header: list[str], rows: list[list[str]], notes: list[str], markdown: bool
) -> None:
    """One shape's table, as markdown or as aligned text, with its notes under the title."""
    if markdown:
        print(f"\n{title}. `*`: ours, target <= {TIME_TARGET}x time, <= {MEMORY_TARGET}x memory.")
        for note in notes:
            print(f"{note}.")
        print("\n| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        print(f"\n{title}   (* ours)")
        for note in notes:
            print(note)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def print_smoothed(results: dict[str, tuple[float, float | None]]) -> None:
    """Label smoothing's cost: ours smoothed over ours plain and over PyTorch's smoothed."""
    for name, (plain, torch_name) in SMOOTHED.items():
        if not {name, plain, torch_name} <= set(results):
            continue
        (seconds, mib), (plain_seconds, plain_mib) = results[name], results[plain]
        torch_seconds, torch_mib = results[torch_name]
        line = (
            f"{name}: time {seconds / plain_seconds:.2f}x {plain}, "
            f"{seconds / torch_seconds:.2f}x {torch_name}"
        )
        if mib and plain_mib and torch_mib:
            line += f"; peak memory {mib / plain_mib:.2f}x, {mib / torch_mib:.2f}x"
        print(line)


def parse_args() -> argparse.Namespace:
    """The command line's options (``--device cuda`` refused where CUDA is not available)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shape, nargs="+", help="NxHxV, several allowed")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--quick", action="store_true", help="small shapes, 2 repeats")
    parser.add_argument("--max-plain-gib", type=float, default=6.0)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the inputs live"
    )
    parser.add_argument(
        "--backend",
        nargs="+",
        choices=("auto", "torch", "triton"),
        default=["auto"],
        help="backend(s) of ours; several: each of ours once per backend",
    )
    parser.add_argument("--peers", action="store_true", help="Liger, CCE, compiled chunked CE")
    parser.add_argument(
        "--grad-error",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="gradients' relative error against float64 (default: on with --peers)",
    )
    parser.add_argument("--grad-rows", type=int, default=2048)
    parser.add_argument(
        "--only",
        nargs="+",
        help="candidates to run, by name without the backend (plain logits always runs)",
    )
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.grad_error is None:
        args.grad_error = args.peers
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(
            f"argument --device: cuda is not available to torch {torch.__version__} on this "
            "machine; use --device cpu"
        )
    return args


def shape_notes(
    shape: tuple[int, int, int], args: argparse.Namespace
) -> tuple[list[str], list[str]]:
    """The candidates to run on ``shape`` and the notes saying which are left out and why."""
    names = list(all_cases())
    notes = []
    if args.only:
        names = [name for name in names if name.split(" [")[0] in args.only or name == PLAIN]
    if not TORCH_CHUNKED:
        notes.append(
            f"torch {torch.__version__} has no chunked F.linear_cross_entropy: PyTorch's "
            "chunked candidates left out, the targets not judged"
        )
    if plain_bytes(shape) > args.max_plain_gib * 2**30:
        names.remove(PLAIN)
        notes.append(
            f"plain logits skipped: it would need about {plain_bytes(shape) / 2**30:.1f} GiB "
            f"(> --max-plain-gib {args.max_plain_gib:g})"
        )
    return names, notes


def print_verdicts(verdicts: list[tuple[tuple[int, int, int], str, float, float | None]]) -> None:
    """One line per shape: ours' worst ratios, and the targets where the baseline is PyTorch's."""
    print()
    for shape, baseline, worst_time, worst_memory in verdicts:
        memory_text = "n/a" if worst_memory is None else f"{worst_memory:.2f}x"
        line = (
            f"{'x'.join(map(str, shape))}: slowest of ours {worst_time:.2f}x, largest peak "
            f"{memory_text} of {baseline}"
        )
        if baseline == BASELINE:
            met = worst_time <= TIME_TARGET and (worst_memory or 0.0) <= MEMORY_TARGET
            line += f"; targets ({TIME_TARGET}x, {MEMORY_TARGET}x) {'met' if met else 'NOT met'}"
        else:
            line += f" (targets are to {BASELINE}: not judged)"
        print(line)


def main() -> None:
    """Time (and measure) every candidate on each shape and print the tables."""
    global BACKENDS, PEERS
    args = parse_args()
    BACKENDS, PEERS = list(dict.fromkeys(args.backend)), args.peers
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
        names, notes = shape_notes(shape, args)
        results = benchmark_shape(shape, args, names)
        left_out = [name for name in names if name not in results and name not in PEER_NOTES]
        if left_out:
            notes.append(f"out of GPU memory (left out): {', '.join(left_out)}")
        notes += [f"{name} left out: {reason}" for name, reason in PEER_NOTES.items()]
        verdicts.append((shape, *report(shape, results, args, notes)))
    print_verdicts(verdicts)


if __name__ == "__main__":
    main()
