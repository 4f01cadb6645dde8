"""``backend=`` of the family's engine: the kernels (``"triton"``) against the torch path.

Under Triton's interpreter, :func:`target_probability_loss` with ``backend="triton"`` runs the
kernels (counted here) and gives the torch path's values and gradients, for every reduction,
class weights, ignored rows and label smoothing; the float64 references of the kernels
themselves are in ``test_kernel_target_probability.py``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from lightning_losses.functional._core import target_probability_loss
from lightning_losses.functional.target_probability import phi_cross_entropy, phi_focal
from lightning_losses.kernels import target_probability

EPS32 = 2.0**-24
DEVICE = torch.device(os.environ.get("KERNEL_TEST_DEVICE", "cpu"))  # see the family's tests


def _loss(backend: str, x: torch.Tensor, target: torch.Tensor, **options: Any) -> tuple:
    leaf = x.to(DEVICE, copy=True).requires_grad_()
    loss = target_probability_loss(leaf, target.to(DEVICE), backend=backend, **options)
    upstream = torch.linspace(-1, 1, loss.numel(), device=DEVICE)
    (loss if loss.dim() == 0 else loss @ upstream).backward()
    assert leaf.grad is not None
    return loss.detach().cpu(), leaf.grad.cpu()


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(
    "options",
    [
        {"phi": phi_cross_entropy},
        {"phi": phi_cross_entropy, "label_smoothing": 0.1, "weight": [0.5, 1.0, 2.0, 1.5, 1.0]},
        {
            "phi": phi_focal,
            "gamma": 2.0,
            "weight": [0.25, 1.0, 1.0, 0.5, 1.0],
            "weighted_mean": False,
        },
    ],
    ids=["ce", "ce_smoothed_weighted", "focal_alpha"],
)
def test_backend_triton_gives_the_torch_path(
    reduction: str, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    launches: list[str] = []
    kernel = target_probability.kernel

    def counted(name: str, interpret: bool) -> Any:
        launches.append(name)
        return kernel(name, interpret)

    monkeypatch.setattr(target_probability, "kernel", counted)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 5, generator=generator) * 3
    target = torch.randint(0, 5, (40,), generator=generator)
    target[::7] = -100  # ignored rows
    triton_loss, triton_grad = _loss("triton", x, target, reduction=reduction, **options)
    assert launches == ["forward", "backward"]
    torch_loss, torch_grad = _loss("torch", x, target, reduction=reduction, **options)
    torch.testing.assert_close(triton_loss, torch_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(triton_grad, torch_grad, rtol=1e-5, atol=1e-6)


def test_backend_auto_and_torch_keep_the_torch_path_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    launches: list[str] = []
    monkeypatch.setattr(target_probability, "kernel", lambda *a: launches.append("x"))
    x, target = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 0, 1])
    for backend in ("auto", "torch"):
        target_probability_loss(x, target, phi_cross_entropy, backend=backend)
    assert launches == []
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'triton', 'torch'"):
        target_probability_loss(x, target, phi_cross_entropy, backend="cuda")
