"""Dual focal loss by the kernels under Triton's interpreter, against float64 and the torch path.

The float64 reference is the paper's formula written with torch ops, ``-(1 - p_t + p_j)^gamma
log p_t`` with ``p_j`` the largest probability strictly below ``p_t`` (0 if none), its gradient
by autograd (through ``max``, whose gradient goes to the runner-up's column). Tolerances as in
``test_kernel_target_probability.py``: a few float32 roundings of the magnitudes, plus the
gradient's output rounding in half precision.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import Tensor

from lightning_losses.functional.dual_focal import _FusedDualFocal, dual_focal_terms
from lightning_losses.kernels import target_probability
from lightning_losses.kernels.dual_focal import TritonDualFocal

EPS32 = 2.0**-24
DEVICE = torch.device(os.environ.get("KERNEL_TEST_DEVICE", "cpu"))  # see the family's tests
OUTPUT_ROUNDING = {torch.float32: 0.0, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-7}


def _reference(x: Tensor, target: Tensor, valid: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    leaf = x.double().requires_grad_()
    p = torch.softmax(leaf, dim=1)
    p_t = p.gather(1, target[:, None])
    p_j = torch.where(p < p_t, p, 0.0).max(dim=1).values  # one column on ties (amax: shared)
    base = (1 - p_t[:, 0] + p_j).clamp_min(1e-300)  # C = 1: base 0, gradient 0
    loss = -(base**gamma) * torch.log(p_t[:, 0])
    return torch.where(valid, loss, 0.0), leaf


def _run(function, x, target, valid, gamma, *extra):  # type: ignore[no-untyped-def]
    leaf = x.to(DEVICE, copy=True).requires_grad_()
    value = function.apply(leaf, target.to(DEVICE), valid.to(DEVICE), gamma, *extra)
    upstream = torch.linspace(-1, 2, x.shape[0])
    (upstream.to(DEVICE) * value).sum().backward()
    return value.detach().cpu(), leaf.grad.cpu(), upstream


@pytest.mark.parametrize("gamma", [0.5, 2.0])
@pytest.mark.parametrize(
    ("rows", "columns", "dtype"),
    [
        (9, 1, torch.float32),
        (33, 3, torch.float32),
        (64, 1000, torch.float32),
        (48, 1000, torch.bfloat16),
        (0, 5, torch.float32),
    ],
)
def test_dual_focal(gamma: float, rows: int, columns: int, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, columns, generator=generator, dtype=torch.float64) * 3).to(dtype)
    valid = torch.rand(rows, generator=generator) > 0.25
    target = torch.where(valid, torch.randint(0, columns, (rows,), generator=generator), 0)
    value, grad, upstream = _run(TritonDualFocal, x, target, valid, gamma, dual_focal_terms)
    assert grad is not None
    assert grad.dtype == dtype
    reference, leaf = _reference(x, target, valid, gamma)
    (upstream.double() * reference).sum().backward()
    assert leaf.grad is not None
    big = 1 + (float(x.double().abs().max()) if x.numel() else 0.0)
    assert ((value.double() - reference).abs() <= 64 * EPS32 * big * (1 + reference.abs())).all()
    bound = 64 * EPS32 * big * 8 * upstream.double().abs()[:, None]
    bound = bound + OUTPUT_ROUNDING[dtype] * leaf.grad.abs()
    assert ((grad.double() - leaf.grad).abs() <= bound).all()
    torch_value, torch_grad, _ = _run(_FusedDualFocal, x, target, valid, gamma)
    assert torch_grad is not None
    assert ((value - torch_value).abs().double() <= 128 * EPS32 * big * (1 + reference.abs())).all()
    pair = 2 * bound + OUTPUT_ROUNDING[dtype] * torch_grad.double().abs()
    assert ((grad.double() - torch_grad.double()).abs() <= pair).all()


def test_dual_focal_over_several_column_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(target_probability, "INTERPRETER_TILE", 128)  # 8 steps of 128 columns
    test_dual_focal(2.0, 20, 1000, torch.float32)
