"""The Triton kernels of the target-probability family against the torch path and F.cross_entropy.

For ``[N, C]`` logits, each case runs forward + backward (``.sum()`` of the per-row losses) three
ways, interleaved in the same run: ``F.cross_entropy(reduction="none")`` (the baseline), the
torch path's fused function and the Triton kernels' function (the same arguments: the
per-row ``phi(log p_t)`` and, with label smoothing, the smoothing term). Printed per case: the
median time of each, the ratios to ``F.cross_entropy``, the kernels' achieved bandwidth (the
logits read twice and the gradient written once) against ``--peak-gbs``, the peak memory above
the inputs against ``F.cross_entropy``'s, and the kernels' largest gradient error against a
float64 reference on the first rows (relative to that reference's largest entry).

    python benchmarks/kernels.py --rows 32768 --classes 1000 --dtype bfloat16   # on a GPU
    TRITON_INTERPRET=1 python benchmarks/kernels.py --device cpu --rows 64 --classes 50 --repeats 1

A second table times every public loss of ``[N, C]`` logits (``reduction="mean"``, forward +
backward) with ``backend="torch"`` and ``backend="triton"``, the latter with the argument checks
on (one host synchronisation) and off (``validate_args=False``, none), beside
``F.cross_entropy``; ``--no-public`` leaves it out.

On a CPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` set before the start):
that checks the script, not the speed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import lightning_losses.functional as LF
from lightning_losses.functional._core import _FusedTargetProbability
from lightning_losses.functional.target_probability import (
    phi_cross_entropy,
    phi_focal,
    phi_gamma_cross_entropy,
    phi_poly1,
    phi_soft_accuracy,
)
from lightning_losses.kernels.target_probability import TritonTargetProbability

#: (name, phi, hyperparameters, label smoothing with class weights)
CASES: list[tuple[str, Callable[..., Any], dict[str, Any], bool]] = [
    ("cross_entropy", phi_cross_entropy, {}, False),
    ("focal(2)", phi_focal, {"gamma": 2.0}, False),
    ("focal(0.5)", phi_focal, {"gamma": 0.5}, False),
    ("gamma_ce(0.5)", phi_gamma_cross_entropy, {"gamma": 0.5}, False),
    ("gamma_ce(0.5, b=0.2)", phi_gamma_cross_entropy, {"gamma": 0.5, "threshold": 0.2}, False),
    ("soft_accuracy", phi_soft_accuracy, {}, False),
    ("poly1(1)", phi_poly1, {"epsilon": 1.0}, False),
    ("cross_entropy(ls=0.1, weight)", phi_cross_entropy, {}, True),
]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _public_cases(classes: int, device: torch.device) -> list[tuple[str, Any, dict[str, Any]]]:
    """(name, public function, options) of every loss of [N, C] logits that takes backend=."""
    weight = torch.linspace(0.5, 1.5, classes, device=device)
    bins = 15
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64, device=device)
    gammas = torch.full((bins,), 1.0, dtype=torch.float64, device=device)
    return [
        ("cross_entropy", LF.cross_entropy, {}),
        (
            "cross_entropy(ls=0.1, weight)",
            LF.cross_entropy,
            {"label_smoothing": 0.1, "weight": weight},
        ),
        ("gamma_cross_entropy(0.5)", LF.gamma_cross_entropy, {"gamma": 0.5}),
        (
            "gamma_cross_entropy(0.5, b=0.2)",
            LF.gamma_cross_entropy,
            {"gamma": 0.5, "threshold": 0.2},
        ),
        ("soft_accuracy_loss", LF.soft_accuracy_loss, {}),
        ("focal_loss(2, alpha)", LF.focal_loss, {"gamma": 2.0, "alpha": weight}),
        ("adaptive_focal_loss (FLSD-53)", LF.adaptive_focal_loss, {}),
        ("adafocal_loss (15 bins)", LF.adafocal_loss, {"edges": edges, "gammas": gammas}),
        ("hard_truncated_loss", LF.hard_truncated_loss, {}),
        ("poly1_loss(1)", LF.poly1_loss, {"epsilon": 1.0}),
        ("mbls_loss", LF.mbls_loss, {}),
        ("dual_focal_loss(1)", LF.dual_focal_loss, {}),
        ("mdca_loss (base CE)", LF.mdca_loss, {}),
        ("dca_loss (base CE)", LF.dca_loss, {}),
        ("mmce_loss (base CE)", LF.mmce_loss, {}),
    ]


def _public_step(function: Any, options: dict[str, Any], x: Tensor, target: Tensor) -> None:
    """Forward + backward of a public loss (``function`` None: F.cross_entropy), the mean."""
    leaf = x.detach().requires_grad_()
    if function is None:
        F.cross_entropy(leaf, target).backward()
    else:
        function(leaf, target, **options).backward()


def _public_table(x: Tensor, target: Tensor, repeats: int) -> None:
    """Every public loss: F.cross_entropy, backend torch, triton, triton without checks."""
    device = x.device
    print()
    print(
        "| loss (mean, fwd + bwd) | F.cross_entropy ms | torch ms | triton ms "
        "| triton, validate_args=False ms | torch / F.ce | triton / F.ce "
        "| triton (no checks) / F.ce | peak mem triton / F.ce |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, function, options in _public_cases(x.shape[1], device):
        candidates = [
            (None, {}),
            (function, {**options, "backend": "torch"}),
            (function, {**options, "backend": "triton"}),
            (function, {**options, "backend": "triton", "validate_args": False}),
        ]
        for candidate, arguments in candidates:  # warm-up (and the kernels' compilation)
            _public_step(candidate, arguments, x, target)
        times: list[list[float]] = [[] for _ in candidates]
        for _ in range(repeats):  # interleaved
            for index, (candidate, arguments) in enumerate(candidates):
                _sync(device)
                start = time.perf_counter()
                _public_step(candidate, arguments, x, target)
                _sync(device)
                times[index].append(time.perf_counter() - start)
        median = [statistics.median(t) for t in times]
        peaks = []
        for candidate, arguments in (candidates[0], candidates[2]):
            if device.type != "cuda":
                break
            _sync(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            _public_step(candidate, arguments, x, target)
            _sync(device)
            peaks.append((torch.cuda.max_memory_allocated(device) - before) / 2**30)
        memory = f"{peaks[1] / peaks[0]:.2f}" if peaks and peaks[0] > 0 else "n/a"
        ms = [f"{m * 1e3:.3f}" for m in median]
        ratios = [f"{m / median[0]:.2f}" for m in median[1:]]
        print(f"| {name} | {' | '.join(ms)} | {' | '.join(ratios)} | {memory} |")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(function: Any, x: Tensor, target: Tensor, valid: Tensor, case: tuple) -> Tensor:
    """Forward + backward of one candidate; returns the gradient."""
    leaf = x.detach().requires_grad_()
    _, phi, hyperparameters, smoothed = case
    if function is None:  # F.cross_entropy
        weight = None
        if smoothed:
            weight = torch.linspace(0.5, 1.5, x.shape[1], device=x.device, dtype=x.dtype)
        loss = F.cross_entropy(
            leaf, target, weight, reduction="none", label_smoothing=0.1 if smoothed else 0.0
        )
        loss.sum().backward()
    elif smoothed:
        weight = torch.linspace(0.5, 1.5, x.shape[1], device=x.device)
        value, smooth = function.apply(leaf, target, valid, phi, hyperparameters, True, weight)
        (0.9 * value + 0.1 / x.shape[1] * smooth).sum().backward()
    else:
        function.apply(leaf, target, valid, phi, hyperparameters).sum().backward()
    assert leaf.grad is not None
    return leaf.grad


def _peak(function: Any, x: Tensor, target: Tensor, valid: Tensor, case: tuple) -> float:
    """Peak memory above what is allocated before the call, in GiB (CUDA only; 0 elsewhere)."""
    if x.device.type != "cuda":
        return 0.0
    _sync(x.device)
    before = torch.cuda.memory_allocated(x.device)
    torch.cuda.reset_peak_memory_stats(x.device)
    grad = _step(function, x, target, valid, case)
    del grad
    _sync(x.device)
    return (torch.cuda.max_memory_allocated(x.device) - before) / 2**30


def _error(x: Tensor, target: Tensor, valid: Tensor, case: tuple, rows: int) -> float:
    """The kernels' largest gradient error on the first rows, relative to float64's largest."""
    x = x[:rows]
    target, valid = target[:rows], valid[:rows]
    grad = _step(TritonTargetProbability, x, target, valid, case).double()
    reference = _step(_FusedTargetProbability, x.double(), target, valid, case)
    return float((grad - reference).abs().max() / reference.abs().max().clamp_min(1e-300))


def main() -> None:
    """Time every case and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--peak-gbs", type=float, default=4800.0, help="H200: 4.8 TB/s")
    parser.add_argument("--error-rows", type=int, default=256)
    parser.add_argument(
        "--no-public", action="store_true", help="leave out the table of the public losses"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    generator = torch.Generator(device=device).manual_seed(0)
    x = (
        torch.randn(
            args.rows, args.classes, device=device, generator=generator, dtype=torch.float32
        )
        .mul_(3)
        .to(DTYPES[args.dtype])
    )
    target = torch.randint(0, args.classes, (args.rows,), device=device, generator=generator)
    valid = torch.ones(args.rows, dtype=torch.bool, device=device)
    moved = 3 * x.numel() * x.element_size()  # read twice, gradient written once
    print(f"[{args.rows}, {args.classes}] {args.dtype} on {args.device}, {args.repeats} repeats")
    print(
        "| case | F.cross_entropy ms | torch ms | triton ms | torch / F.ce | triton / F.ce "
        f"| triton GB/s (of {args.peak_gbs:.0f}) | peak mem triton / F.ce | grad rel. error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    candidates = [None, _FusedTargetProbability, TritonTargetProbability]
    for case in CASES:
        times: list[list[float]] = [[] for _ in candidates]
        for function in candidates:  # warm-up (and the kernels' compilation)
            _step(function, x, target, valid, case)
        for _ in range(args.repeats):  # interleaved
            for index, function in enumerate(candidates):
                _sync(device)
                start = time.perf_counter()
                _step(function, x, target, valid, case)
                _sync(device)
                times[index].append(time.perf_counter() - start)
        median = [statistics.median(t) for t in times]
        peaks = [_peak(function, x, target, valid, case) for function in (None, candidates[2])]
        memory = f"{peaks[1] / peaks[0]:.2f}" if peaks[0] > 0 else "n/a"
        error = _error(x, target, valid, case, args.error_rows)
        print(
            f"| {case[0]} | {median[0] * 1e3:.3f} | {median[1] * 1e3:.3f} | "
            f"{median[2] * 1e3:.3f} | {median[1] / median[0]:.2f} | {median[2] / median[0]:.2f} "
            f"| {moved / median[2] / 1e9:.0f} ({moved / median[2] / 1e9 / args.peak_gbs:.0%}) "
            f"| {memory} | {error:.1e} |"
        )
    if not args.no_public:
        _public_table(x, target, args.repeats)


if __name__ == "__main__":
    main()
