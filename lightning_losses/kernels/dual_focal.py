"""Dual focal loss on ``[N, C]`` logits by the target-probability kernels.

Dual focal loss (Tao, Dong and Xu, ICML 2023) is ``-(1 - p_t + p_j)^gamma log p_t``, ``p_j``
the largest probability strictly below ``p_t``. Its gradient is ``c_t (e_t - p) + c_j (e_j -
p)``: the family's scaled gradient plus a second column ``j``. The forward kernel of
:mod:`lightning_losses.kernels.target_probability` gives ``log p_t``, the runner-up logit and
its column in its one pass (``p_j = exp(x_j - lse)``); the per-row terms come from the torch
path's own function (``dual_focal_terms`` of :mod:`lightning_losses.functional.dual_focal`,
passed in, as ``phi`` is); the backward kernel writes the two-column gradient in one pass.

The torch path masks ``p < p_t`` after rounding ``p``, the kernel ``x < x_t``: they differ only
for a logit within a rounding of ``x_t`` (then ``p_j`` and ``p_t`` agree to that rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lightning_losses.kernels.target_probability import backward_rows, forward_rows, prepare

__all__ = ["TritonDualFocal"]

#: ``terms(log_p_t, p_j, gamma) -> (loss, c_t, c_j)``, as ``dual_focal_terms``.
Terms = Callable[[Tensor, Tensor, float], tuple[Tensor, Tensor, Tensor]]


class TritonDualFocal(torch.autograd.Function):
    """``-(1 - p_t + p_j)^gamma log p_t`` per row of ``[N, C]`` logits by the two kernels.

    Arguments ``(logits, target, valid, gamma, terms)``: ``target`` 0 on the ignored rows that
    ``valid`` marks, ``terms`` the torch path's ``dual_focal_terms``. Returns the float32 loss
    per row, 0 where ignored. Saved for the backward: the logits, the target and four
    ``N``-vectors (``lse``, ``j``, ``c_t``, ``c_j``).
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        target: Tensor,
        valid: Tensor,
        gamma: float,
        terms: Terms,
    ) -> Tensor:
        """One forward kernel, then the terms on the ``N``-vectors ``log p_t`` and ``p_j``."""
        logits, kernel_target = prepare(logits, target, valid)
        found = forward_rows(logits, kernel_target, None, False, True)
        zero = torch.zeros((), dtype=torch.float32, device=logits.device)
        with torch.autocast(logits.device.type, enabled=False):
            p_j = torch.where(valid, torch.exp(found["runner_up"] - found["lse"]), zero)
            value, c_t, c_j = terms(found["log_p"], p_j, gamma)
        ctx.save_for_backward(
            logits,
            kernel_target,
            found["lse"],
            found["runner_up_index"],
            torch.where(valid, c_t, zero),
            torch.where(valid, c_j, zero),
        )
        return torch.where(valid, value, zero)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        """One backward kernel: ``g (c_t e_t + c_j e_j - (c_t + c_j) softmax)``."""
        logits, target, lse, index, c_t, c_j = ctx.saved_tensors
        g = grad_output.float()
        grad = backward_rows(logits, target, lse, g * c_t, second=(index, g * c_j))
        return grad, None, None, None, None
