"""The target-probability kernels under Triton's interpreter, against float64 and the torch path.

Run in a process started with ``TRITON_INTERPRET=1`` (see ``tests/kernels/conftest.py``), or on
a GPU with ``KERNEL_TEST_DEVICE=cuda`` (the kernels compiled; the references stay on the CPU).

The reference is written here in float64 from the same (rounded) inputs: ``log p =
log_softmax(x)``, the loss ``phi(log p_t)`` written with plain torch ops (autograd gives its
gradient, independently of the family's hand-written derivatives), and the smoothing term
``-sum_c w_c log p_c``. Tolerances: the kernels compute in float32 from the input's values, so
values and gradients sit within a few float32 roundings of that reference, scaled by the
magnitudes involved (``|x|`` through ``lse``; ``W max p`` in the smoothing gradient); a half
precision gradient adds its own output rounding (2**-11 relative for float16; 2**-7 for
bfloat16, which the interpreter truncates) and nothing else.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from lightning_losses.functional._core import _FusedTargetProbability
from lightning_losses.functional.adafocal import phi_adafocal
from lightning_losses.functional.target_probability import (
    phi_adaptive_focal,
    phi_cross_entropy,
    phi_focal,
    phi_gamma_cross_entropy,
    phi_hard_truncated,
    phi_poly1,
    phi_soft_accuracy,
)
from lightning_losses.kernels import target_probability
from lightning_losses.kernels.availability import use_kernels
from lightning_losses.kernels.target_probability import (
    TritonTargetProbability,
    blocks,
    row_statistics,
)

EPS32 = 2.0**-24
#: Where the kernels run: the CPU under the interpreter, or a GPU (KERNEL_TEST_DEVICE=cuda).
DEVICE = torch.device(os.environ.get("KERNEL_TEST_DEVICE", "cpu"))
#: Relative rounding of a gradient written in each dtype: half an ulp for float16; a whole ulp for
#: bfloat16, which Triton's interpreter writes by truncation (the GPU rounds to nearest).
OUTPUT_ROUNDING = {torch.float32: 0.0, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-7}


def _q(lp: Tensor) -> Tensor:
    """``1 - p``, kept off 0 so that ``q ** 0.5`` has a finite gradient at ``p = 1`` (C = 1)."""
    return (1 - lp.exp()).clamp_min(1e-300)


def _adafocal(lp: Tensor, inner: list[float], gammas: list[float]) -> Tensor:
    """``-(1 - s p)^|g| log p``, ``g`` the gamma of ``p``'s bin (``k`` inner edges ``<= p``)."""
    p = lp.exp()
    index = sum((p.detach() >= edge).long() for edge in inner)
    g = torch.tensor(gammas, dtype=lp.dtype)[index]
    base = torch.where(g >= 0, _q(lp), 1 + p)
    return -(base ** g.abs()) * lp


def _tailr(lp: Tensor, gamma: float, threshold: float) -> Tensor:
    p = lp.exp()
    w = p / (gamma + (1 - gamma) * p)
    return -torch.clamp(w, min=threshold).detach() * lp  # TaiLr's weight is not differentiated


#: (name, phi, hyperparameters, float64 reference of phi written with torch ops)
CASES: list[tuple[str, Callable[..., Any], dict[str, Any], Callable[[Tensor], Tensor]]] = [
    ("ce", phi_cross_entropy, {}, lambda lp: -lp),
    ("focal", phi_focal, {"gamma": 2.0}, lambda lp: -(_q(lp) ** 2.0) * lp),
    ("focal_half", phi_focal, {"gamma": 0.5}, lambda lp: -(_q(lp) ** 0.5) * lp),
    (
        "gamma_ce",
        phi_gamma_cross_entropy,
        {"gamma": 0.5},
        lambda lp: -torch.log(0.5 + 0.5 * lp.exp()) / 0.5,
    ),
    (
        "tailr",
        phi_gamma_cross_entropy,
        {"gamma": 0.3, "threshold": 0.2},
        lambda lp: _tailr(lp, 0.3, 0.2),
    ),
    ("soft_accuracy", phi_soft_accuracy, {}, lambda lp: 1 - lp.exp()),
    ("poly1", phi_poly1, {"epsilon": 1.0}, lambda lp: -lp + (1 - lp.exp())),
    (  # FLSD-53: gamma 5 below p = 0.2, 3 above (a per-sample gamma)
        "flsd53",
        phi_adaptive_focal,
        {"thresholds": [0.2], "gammas": [5.0, 3.0]},
        lambda lp: -(_q(lp) ** torch.where(lp.exp() < 0.2, 5.0, 3.0)) * lp,
    ),
    (  # AdaFocal: per-bin gammas, the negative one inverse focal (1 + p)^|g|
        "adafocal",
        phi_adafocal,
        {"edges": torch.tensor([0.0, 0.3, 0.7, 1.0]), "gammas": torch.tensor([4.0, -1.0, 2.0])},
        lambda lp: _adafocal(lp, [0.3, 0.7], [4.0, -1.0, 2.0]),
    ),
    (
        "hard_truncated",
        phi_hard_truncated,
        {"margin": 0.5},
        lambda lp: torch.where(lp.exp() <= 0.5, -lp, 0.0),
    ),
]
IDS = [case[0] for case in CASES]


def _inputs(
    rows: int, columns: int, dtype: torch.dtype, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, columns, generator=generator, dtype=torch.float64) * 3).to(dtype)
    target = torch.randint(0, columns, (rows,), generator=generator)
    valid = torch.rand(rows, generator=generator) > 0.25  # about a quarter ignored
    return x, torch.where(valid, target, 0), valid


def _reference(
    x: Tensor, target: Tensor, valid: Tensor, phi: Callable[[Tensor], Tensor], w: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """float64 ``phi(log p_t)``, the smoothing term and the leaf they were computed from."""
    leaf = x.double().requires_grad_()
    log_p = torch.log_softmax(leaf, dim=1)
    lp_t = log_p.gather(1, target[:, None])[:, 0]
    zero = torch.zeros((), dtype=torch.float64)
    value = torch.where(valid, phi(torch.where(valid, lp_t, zero)), zero)
    weights = torch.ones(x.shape[1], dtype=torch.float64) if w is None else w.double()
    smooth = torch.where(valid, -(log_p * weights).sum(dim=1), zero)
    return value, smooth, leaf


def _assert_within(actual: Tensor, expected: Tensor, tolerance: Tensor | float, what: str) -> None:
    error = (actual.double() - expected).abs()
    bound = torch.as_tensor(tolerance, dtype=torch.float64).expand_as(error)
    worst = (error - bound).argmax() if error.numel() else None
    assert error.numel() == 0 or bool((error <= bound).all()), (
        f"{what}: error {error.flatten()[worst]:.3g} > {bound.flatten()[worst]:.3g}"
    )


def _run(
    function: Any,
    x: Tensor,
    target: Tensor,
    valid: Tensor,
    phi: Callable[..., Any],
    hyperparameters: dict[str, Any],
    weight: Tensor | None,
    smoothing: bool,
    upstream: tuple[Tensor, Tensor],
) -> tuple[Tensor, Tensor | None, Tensor]:
    leaf = x.to(DEVICE, copy=True).requires_grad_()
    if weight is not None:
        weight = weight.to(DEVICE)
    out = function.apply(
        leaf, target.to(DEVICE), valid.to(DEVICE), phi, hyperparameters, smoothing, weight
    )
    value, smooth = out if smoothing else (out, None)
    total = (upstream[0].to(DEVICE) * value).sum()
    if smooth is not None:
        total = total + (upstream[1].to(DEVICE) * smooth).sum()
    total.backward()
    assert leaf.grad is not None
    return value.detach().cpu(), None if smooth is None else smooth.detach().cpu(), leaf.grad.cpu()


def _stats(x: Tensor, target: Tensor, valid: Tensor, **options: Any) -> dict[str, Tensor]:
    """:func:`row_statistics` on ``DEVICE``, back on the CPU."""
    found = row_statistics(x.to(DEVICE), target.to(DEVICE), valid=valid.to(DEVICE), **options)
    return {key: value.cpu() for key, value in found.items()}


def _check(
    case: tuple[str, Callable[..., Any], dict[str, Any], Callable[[Tensor], Tensor]],
    rows: int,
    columns: int,
    dtype: torch.dtype,
    smoothing: bool,
    weighted: bool,
) -> None:
    _, phi, hyperparameters, reference_phi = case
    x, target, valid = _inputs(rows, columns, dtype)
    generator = torch.Generator().manual_seed(1)
    weight = torch.rand(columns, generator=generator) + 0.5 if weighted else None
    upstream = (torch.randn(rows, generator=generator), torch.randn(rows, generator=generator))
    value, smooth, grad = _run(
        TritonTargetProbability, x, target, valid, phi, hyperparameters, weight, smoothing, upstream
    )
    assert value.dtype == torch.float32
    assert grad.dtype == dtype

    # (a) the float64 reference, from the same rounded inputs
    ref_value, ref_smooth, leaf = _reference(x, target, valid, reference_phi, weight)
    ref_total = (upstream[0].double() * ref_value).sum()
    if smoothing:
        ref_total = ref_total + (upstream[1].double() * ref_smooth).sum()
    ref_total.backward()
    assert leaf.grad is not None
    ref_grad = leaf.grad
    big = float(x.double().abs().max()) if x.numel() else 0.0
    # lse and log p_t are within a few roundings of |x|: phi and its derivative are bounded
    # multiples of log p_t (|phi'| <= 1 + gamma + epsilon here)
    value_tolerance = 64 * EPS32 * (1 + big) * (1 + ref_value.abs())
    _assert_within(value, ref_value, value_tolerance, "value")
    total_weight = columns if weight is None else float(weight.sum())
    scale = upstream[0].double().abs()[:, None] * 4
    if smooth is not None:
        # a sum of C terms of size |x|: C roundings of |x| at worst, far fewer in practice
        smooth_tolerance = 64 * EPS32 * (1 + big) * total_weight
        _assert_within(smooth, ref_smooth, smooth_tolerance, "smoothing term")
        scale = scale + upstream[1].double().abs()[:, None] * (total_weight + 2)
    grad_tolerance = 64 * EPS32 * (1 + big) * scale + OUTPUT_ROUNDING[dtype] * ref_grad.abs()
    _assert_within(grad, ref_grad, grad_tolerance, "gradient")

    # (b) the torch path on the same inputs (its own float32 rounding on top of ours)
    torch_value, torch_smooth, torch_grad = _run(
        _FusedTargetProbability, x, target, valid, phi, hyperparameters, weight, smoothing, upstream
    )
    _assert_within(value, torch_value.double(), 2 * value_tolerance, "value against torch")
    if smooth is not None and torch_smooth is not None:
        _assert_within(smooth, torch_smooth.double(), 2 * smooth_tolerance, "smoothing vs torch")
    grad_tolerance_pair = 2 * grad_tolerance + OUTPUT_ROUNDING[dtype] * torch_grad.double().abs()
    _assert_within(grad, torch_grad.double(), grad_tolerance_pair, "gradient against torch")


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize(("rows", "columns"), [(9, 1), (33, 3), (64, 1000)])
def test_every_loss_of_the_family(case: Any, rows: int, columns: int) -> None:
    _check(case, rows, columns, torch.float32, smoothing=False, weighted=False)


@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=["ce", "tailr"])
@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "class_weights"])
@pytest.mark.parametrize(("rows", "columns"), [(9, 1), (33, 3), (64, 1000)])
def test_label_smoothing(case: Any, weighted: bool, rows: int, columns: int) -> None:
    _check(case, rows, columns, torch.float32, smoothing=True, weighted=weighted)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", [CASES[0], CASES[1]], ids=["ce", "focal"])
@pytest.mark.parametrize("smoothing", [False, True], ids=["plain", "smoothed"])
def test_half_precision_inputs(dtype: torch.dtype, case: Any, smoothing: bool) -> None:
    _check(case, 48, 1000, dtype, smoothing=smoothing, weighted=smoothing)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("tile", [1 << 16, 1 << 11], ids=["one_block", "several_blocks"])
def test_a_large_vocabulary(dtype: torch.dtype, tile: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # 32001 columns: one block of 2**15 under the interpreter's tile, 16 steps of 2048 with the
    # smaller one (the GPU's blocks take 4096 columns, so its loop always runs several steps)
    assert blocks(3, 32001, interpret=False)[1] < 32001
    monkeypatch.setattr(target_probability, "INTERPRETER_TILE", tile)
    _check(CASES[1], 3, 32001, dtype, smoothing=True, weighted=True)


@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=["ce", "tailr"])
@pytest.mark.parametrize("smoothing", [False, True], ids=["plain", "smoothed"])
def test_the_online_log_sum_exp_over_column_blocks(
    case: Any, smoothing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # blocks of 1 row x 256 columns: 4 column steps per row of 1000, the last one partial
    monkeypatch.setattr(target_probability, "INTERPRETER_TILE", 256)
    assert blocks(30, 1000, interpret=True)[:2] == (1, 256)
    _check(case, 30, 1000, torch.float32, smoothing=smoothing, weighted=smoothing)


@pytest.mark.parametrize("smoothing", [False, True])
def test_an_empty_batch(smoothing: bool) -> None:
    _check(CASES[0], 0, 7, torch.float32, smoothing=smoothing, weighted=False)


def test_every_row_ignored_gives_zeros_and_a_zero_gradient() -> None:
    x, target, _ = _inputs(5, 4, torch.float32)
    valid = torch.zeros(5, dtype=torch.bool)
    upstream = (torch.ones(5), torch.ones(5))
    value, smooth, grad = _run(
        TritonTargetProbability, x, target, valid, phi_focal, {"gamma": 2.0}, None, True, upstream
    )
    assert smooth is not None
    assert not value.any()
    assert not smooth.any()
    assert not grad.any()


def test_a_common_offset_does_not_cancel_the_smoothing_sum() -> None:
    # logits near 1000: sum_c x_c and C lse are near 1e6, their difference near C log C
    x, target, valid = _inputs(16, 1000, torch.float32)
    x = x + 1000.0
    found = _stats(x, target, valid, smoothing=True)
    expected = torch.where(valid, -torch.log_softmax(x.double(), dim=1).sum(dim=1), 0.0)
    _assert_within(found["smooth"], expected, 64 * EPS32 * 1000 * 10, "offset smoothing sum")


@pytest.mark.parametrize("tile", [1 << 16, 64], ids=["one_block", "several_blocks"])
def test_row_statistics_lse_and_the_runner_up_logit(
    tile: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(target_probability, "INTERPRETER_TILE", tile)
    x, target, valid = _inputs(40, 37, torch.float32)
    x[0] = 1.0  # a tie everywhere: no logit strictly below the target's
    found = _stats(x, target, valid, runner_up=True)
    x64 = x.double()
    _assert_within(found["lse"], torch.logsumexp(x64, dim=1), 16 * EPS32 * 10, "lse")
    x_t = x64.gather(1, target[:, None])
    below = torch.where(x64 < x_t, x64, -math.inf).amax(dim=1)
    assert torch.equal(found["runner_up"][valid].double(), below[valid])
    assert found["runner_up"][0] == -math.inf
    has = valid & (below > -math.inf)  # row 0 has none: its index is 0
    index = found["runner_up_index"][has]
    assert torch.equal(x64[has].gather(1, index[:, None])[:, 0], below[has])
    assert found["runner_up_index"][0] == 0


def test_strided_rows_are_read_in_place() -> None:
    x, target, valid = _inputs(12, 50, torch.float32)
    wide = torch.zeros(12, 80, device=DEVICE)
    wide[:, 10:60] = x.to(DEVICE)
    view = wide[:, 10:60]  # row stride 80, column stride 1
    a = row_statistics(view, target.to(DEVICE), valid=valid.to(DEVICE), smoothing=True)
    b = row_statistics(x.to(DEVICE), target.to(DEVICE), valid=valid.to(DEVICE), smoothing=True)
    assert all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the interpreter's backend choice")
def test_the_backend_choice_and_its_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.zeros(2, 3)
    assert use_kernels(x, "triton")
    assert not use_kernels(x, "auto")  # auto: CUDA tensors only
    assert not use_kernels(x, "torch")
    with pytest.raises(ValueError, match="backend must be"):
        use_kernels(x, "cuda")
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        use_kernels(x.double(), "triton")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match=r"backend='triton' runs on CUDA tensors"):
        use_kernels(x, "triton")
