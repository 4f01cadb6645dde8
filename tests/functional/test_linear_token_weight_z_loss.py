"""``token_weight=`` and ``z_loss=`` of ``linear_target_loss`` (torch path) against float64.

The reference is written here from the full logits ``x = hidden @ weight.T + bias`` in float64:
``lse = logsumexp(x)``, ``log p = x - lse``, the row loss ``u_i (c_t (1 - eps) phi(log p_t) +
eps / V sum_c c_c (-log p_c) + z lse^2)`` with ``phi`` written with plain torch operations, and
``"mean"`` dividing by ``sum_i u_i c_{t_i}`` over the non-ignored rows; autograd of that
expression gives the reference gradients of ``hidden``, ``weight`` and ``bias``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from lightning_losses import LinearTargetLoss
from lightning_losses.functional.linear import linear_target_loss

N, H, V = 23, 6, 40


def _phi(name: str, log_p: torch.Tensor, hyper: dict[str, Any]) -> torch.Tensor:
    p = log_p.exp()
    if name == "ce":
        return -log_p
    if name == "focal":
        return -((1 - p) ** hyper["gamma"]) * log_p
    if name == "gamma_ce":
        g = hyper["gamma"]
        return -torch.log(g + (1 - g) * p) / (1 - g)
    raise AssertionError(name)


def reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    *,
    loss: str,
    reduction: str,
    token_weight: torch.Tensor | None = None,
    z_loss: float = 0.0,
    class_weight: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    **hyper: Any,
) -> torch.Tensor:
    """The loss from the full float64 logits, written plainly (see the module)."""
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)
    lse = torch.logsumexp(logits, dim=1)
    log_p = logits - lse[:, None]
    log_p_t = log_p.gather(1, safe[:, None]).squeeze(1)
    c = torch.ones(V, dtype=logits.dtype) if class_weight is None else class_weight
    row = c[safe] * (1 - label_smoothing) * _phi(loss, log_p_t, hyper)
    row = row + label_smoothing / V * (-(log_p * c).sum(1))
    row = row + z_loss * lse**2
    u = torch.ones(N, dtype=logits.dtype) if token_weight is None else token_weight
    row = torch.where(valid, u * row, torch.zeros((), dtype=logits.dtype))
    if reduction == "none":
        return row
    if reduction == "sum":
        return row.sum()
    divisor = torch.where(valid, u * c[safe], torch.zeros((), dtype=logits.dtype)).sum()
    return row.sum() / divisor if divisor > 0 else row.sum()


def inputs(seed: int = 0, *, bias: bool = True):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=generator, dtype=torch.float64)
    weight = torch.randn(V, H, generator=generator, dtype=torch.float64)
    b = torch.randn(V, generator=generator, dtype=torch.float64) if bias else None
    target = torch.randint(0, V, (N,), generator=generator)
    target[::4] = -100
    token_weight = torch.rand(N, generator=generator, dtype=torch.float64) * 2
    token_weight[1] = 0.0  # a token that counts for nothing
    return hidden, weight, b, target, token_weight


def values_and_grads(function, hidden, weight, bias, reduction):
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias) if t is not None]
    out = function(*leaves)
    upstream = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)
    return out.detach(), torch.autograd.grad(out, leaves, upstream)


def assert_matches(ours, expected, tol):
    torch.testing.assert_close(ours[0], expected[0], rtol=tol, atol=tol)
    for grad, want in zip(ours[1], expected[1], strict=True):
        torch.testing.assert_close(grad, want, rtol=tol, atol=tol)


CASES = [
    ("ce", {}),
    ("ce", {"label_smoothing": 0.2}),
    ("focal", {"gamma": 2.0}),
    ("gamma_ce", {"gamma": 0.5, "label_smoothing": 0.1}),
]


@pytest.mark.parametrize(("loss", "hyper"), CASES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize(
    "terms", [{"token_weight": True}, {"z_loss": 1e-2}, {"token_weight": True, "z_loss": 0.1}]
)
@pytest.mark.parametrize("class_weight", [False, True])
def test_token_weight_and_z_loss_match_the_float64_reference(
    loss, hyper, reduction, terms, class_weight
):
    hidden, weight, bias, target, token_weight = inputs()
    options: dict[str, Any] = {"z_loss": terms.get("z_loss", 0.0)}
    if terms.get("token_weight"):
        options["token_weight"] = token_weight
    if class_weight:
        options["class_weight"] = torch.linspace(0.2, 2.0, V, dtype=torch.float64)

    def ours(h, w, b):
        return linear_target_loss(
            h, w, target, loss=loss, bias=b, reduction=reduction, chunk_size=5, **options, **hyper
        )

    def plain(h, w, b):
        return reference(h, w, b, target, loss=loss, reduction=reduction, **options, **hyper)

    assert_matches(
        values_and_grads(ours, hidden, weight, bias, reduction),
        values_and_grads(plain, hidden, weight, bias, reduction),
        1e-10,
    )


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_float32_without_bias_matches_the_float64_reference(reduction):
    hidden, weight, _, target, token_weight = inputs(1, bias=False)

    def ours(h, w):
        return linear_target_loss(
            h.float(),
            w.float(),
            target,
            loss="ce",
            reduction=reduction,
            token_weight=token_weight.float(),
            z_loss=1e-3,
        )

    def plain(h, w):
        return reference(
            h,
            w,
            None,
            target,
            loss="ce",
            reduction=reduction,
            token_weight=token_weight,
            z_loss=1e-3,
        )

    ours_value, ours_grads = values_and_grads(ours, hidden, weight, None, reduction)
    want_value, want_grads = values_and_grads(plain, hidden, weight, None, reduction)
    assert ours_value.dtype == torch.float32
    torch.testing.assert_close(ours_value.double(), want_value, rtol=1e-5, atol=1e-5)
    for grad, want in zip(ours_grads, want_grads, strict=True):
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-5)


def test_unit_token_weights_and_zero_z_loss_change_nothing():
    hidden, weight, bias, target, _ = inputs(2)
    plain = linear_target_loss(hidden, weight, target, loss="focal", bias=bias)
    weighted = linear_target_loss(
        hidden, weight, target, loss="focal", bias=bias, token_weight=torch.ones(N).double()
    )
    assert torch.equal(plain, weighted)


def test_all_zero_token_weights_give_zero_with_zero_gradient():
    hidden, weight, bias, target, _ = inputs(3)
    hidden.requires_grad_()
    loss = linear_target_loss(
        hidden, weight, target, loss="ce", bias=bias, token_weight=torch.zeros(N).double()
    )
    loss.backward()
    assert loss.item() == 0.0
    assert hidden.grad is not None
    assert not hidden.grad.any()


def test_module_takes_z_loss_backend_and_token_weight():
    hidden, weight, bias, target, token_weight = inputs(4)
    criterion = LinearTargetLoss("ce", z_loss=0.05, backend="torch", reduction="sum")
    assert "z_loss=0.05" in repr(criterion)
    got = criterion(hidden, weight, target, bias, token_weight=token_weight)
    want = reference(
        hidden,
        weight,
        bias,
        target,
        loss="ce",
        reduction="sum",
        token_weight=token_weight,
        z_loss=0.05,
    )
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"token_weight": -torch.ones(N)}, ValueError, r"token_weight must be finite and >= 0"),
        (
            {"token_weight": torch.full((N,), float("nan"))},
            ValueError,
            r"token_weight must be finite and >= 0; found nan at token_weight\[0\]",
        ),
        ({"token_weight": torch.ones(N + 1)}, ValueError, r"token_weight must have the shape"),
        ({"token_weight": torch.ones(N, dtype=torch.long)}, TypeError, r"token_weight must be"),
        ({"z_loss": -0.1}, ValueError, r"z_loss must"),
        ({"z_loss": float("inf")}, ValueError, r"z_loss must"),
        ({"backend": "cuda"}, ValueError, r"backend must be 'auto', 'triton' or 'torch'"),
    ],
)
def test_bad_values_raise_one_line_errors_naming_the_argument(options, error, match):
    hidden, weight, _, target, _ = inputs(5)
    with pytest.raises(error, match=match) as raised:
        linear_target_loss(hidden.float(), weight.float(), target, loss="ce", **options)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("options", "match"),
    [({"z_loss": -1.0}, r"z_loss must"), ({"backend": "gpu"}, r"backend must be one of")],
)
def test_module_checks_z_loss_and_backend(options, match):
    with pytest.raises(ValueError, match=match):
        LinearTargetLoss("ce", **options)


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="runs the kernels under the interpreter"
)
def test_triton_backend_on_a_cpu_without_the_interpreter_raises_naming_the_backend():
    hidden, weight, _, target, _ = inputs(6)
    with pytest.raises(RuntimeError, match=r"backend='triton'") as raised:
        linear_target_loss(hidden.float(), weight.float(), target, loss="ce", backend="triton")
    assert "\n" not in str(raised.value)
