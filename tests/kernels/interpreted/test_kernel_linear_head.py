"""The linear head's Triton kernels (``backend="triton"``) against float64 and the torch path.

Run in a process started with ``TRITON_INTERPRET=1`` (see ``tests/kernels/conftest.py``), or on
a GPU with ``KERNEL_TEST_DEVICE=cuda``. The reference is written here from the full logits
``x = hidden @ weight.T + bias`` of the same (rounded) inputs in float64: ``lse =
logsumexp(x)``, the row loss ``u_i (c_t (1 - eps) phi(log p_t) + eps / V sum_c c_c (-log p_c)
+ z lse^2)`` with ``phi`` in plain torch operations, ``"mean"`` dividing by ``sum_i u_i
c_{t_i}`` over the non-ignored rows, and autograd for the gradients.

Tolerances: without ``half_matmul`` the kernels compute in float32 from the inputs' values, so
values and gradients sit within a few float32 roundings (times the magnitudes: ``|x|`` through
``lse``) of the reference; a half-precision gradient adds its own output rounding (2**-11
relative for float16, 2**-7 for bfloat16, which the interpreter truncates) and nothing else.
The gradient of ``hidden`` is a float32 matrix product over the ``V`` columns (torch's, in both
backends), whose rounding grows like ``sqrt(V) * 2**-24`` times the gradient's scale: 5e-5
relative at V = 32001 on this CPU, for the torch path as for the kernels; the absolute
tolerance carries that term (``8 sqrt(V) 2**-24``).
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch

from lightning_losses.functional.linear import LINEAR_TARGET_LOSSES, linear_target_loss
from lightning_losses.kernels import linear_head

DEVICE = torch.device(os.environ.get("KERNEL_TEST_DEVICE", "cpu"))
OUTPUT_ROUNDING = {torch.float32: 0.0, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-7}


def reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    *,
    loss: str = "ce",
    reduction: str = "mean",
    token_weight: torch.Tensor | None = None,
    z_loss: float = 0.0,
    class_weight: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    gamma: float = 2.0,
) -> torch.Tensor:
    """The float64 loss from the full logits, written plainly (see the module)."""
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    rows, vocab = logits.shape
    valid = target != -100
    safe = torch.where(valid, target, 0)
    lse = torch.logsumexp(logits, dim=1)
    log_p = logits - lse[:, None]
    log_p_t = log_p.gather(1, safe[:, None]).squeeze(1)
    phi = -log_p_t if loss == "ce" else -((1 - log_p_t.exp()) ** gamma) * log_p_t
    c = torch.ones(vocab, dtype=logits.dtype) if class_weight is None else class_weight
    row = c[safe] * (1 - label_smoothing) * phi - label_smoothing / vocab * (log_p * c).sum(1)
    row = row + z_loss * lse**2
    u = torch.ones(rows, dtype=logits.dtype) if token_weight is None else token_weight
    zero = torch.zeros((), dtype=logits.dtype)
    row = torch.where(valid, u * row, zero)
    if reduction == "none":
        return row
    divisor = torch.where(valid, u * c[safe], zero).sum()
    return row.sum() / divisor if reduction == "mean" and divisor > 0 else row.sum()


def make(rows, hidden_size, vocab, dtype, *, seed=0, bias=True, ignore=(0,)):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, hidden_size, generator=generator).to(dtype)
    weight = (torch.randn(vocab, hidden_size, generator=generator) * 0.8).to(dtype)
    b = torch.randn(vocab, generator=generator).to(dtype) if bias else None
    target = torch.randint(0, vocab, (rows,), generator=generator)
    for index in ignore:
        if index < rows:
            target[index] = -100
    token_weight = torch.rand(rows, generator=generator) * 2
    return hidden, weight, b, target, token_weight


def run(function, tensors, upstream_seed=1):
    """Value and gradients of ``function(*tensors)`` for a fixed upstream gradient."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors if t is not None]
    out = function(*leaves)
    generator = torch.Generator().manual_seed(upstream_seed)
    upstream = (torch.rand(out.shape, generator=generator, dtype=torch.float64) + 0.5).to(out)
    grads = torch.autograd.grad(out, leaves, upstream) if out.requires_grad else ()
    return out.detach(), grads


def ours(backend, target, options, **extra):
    def function(hidden, weight, bias=None):
        return linear_target_loss(
            hidden,
            weight,
            target.to(hidden.device),
            bias=bias,
            backend=backend,
            **{
                k: v.to(hidden.device) if isinstance(v, torch.Tensor) else v
                for k, v in options.items()
            },
            **extra,
        )

    return function


def check_against_float64(tensors, target, options, *, chunk_size=None, tol=1e-5):
    """Triton's values and gradients against float64, and against the torch path."""
    dtype = tensors[0].dtype
    on_device = [None if t is None else t.to(DEVICE) for t in tensors]
    got = run(ours("triton", target, options, chunk_size=chunk_size), on_device)
    torch_path = run(ours("torch", target, options, chunk_size=chunk_size), on_device)
    wide = [None if t is None else t.double() for t in tensors]
    double_options = {
        k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in options.items()
    }

    def plain(hidden, weight, bias=None):
        return reference(hidden, weight, bias, target, **double_options)

    want = run(plain, wide)
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got[0].cpu().double(), want[0], rtol=tol, atol=tol)
    torch.testing.assert_close(got[0], torch_path[0], rtol=tol, atol=tol)
    rounding = OUTPUT_ROUNDING[dtype]
    summed = 8 * math.sqrt(tensors[1].shape[0]) * 2.0**-24  # the V-term matrix product
    for grad, other, reference_grad in zip(got[1], torch_path[1], want[1], strict=True):
        assert grad.dtype == dtype
        scale = (float(reference_grad.abs().max()) + 1e-30) * (1 + summed / tol)
        torch.testing.assert_close(
            grad.cpu().double(), reference_grad, rtol=tol + 2 * rounding, atol=tol * scale
        )
        torch.testing.assert_close(
            grad.float(), other.float(), rtol=tol + 2 * rounding, atol=tol * scale
        )


OPTIONS: list[dict[str, Any]] = [
    {"loss": "ce"},
    {"loss": "ce", "z_loss": 1e-2, "label_smoothing": 0.1},
    {"loss": "focal", "gamma": 2.0},
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("index", range(len(OPTIONS)))
def test_triton_matches_float64_and_the_torch_path(dtype, reduction, index):
    tensors, target = (lambda h, w, b, t, u: ((h, w, b), t))(
        *make(9, 5, 67, dtype, seed=index, ignore=(0, 4))
    )
    options = {**OPTIONS[index], "reduction": reduction}
    check_against_float64(tensors, target, options, chunk_size=4)


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_token_weight_class_weight_smoothing_and_z_loss_together(reduction):
    hidden, weight, bias, target, token_weight = make(8, 4, 30, torch.float32, seed=7)
    options = {
        "loss": "ce",
        "reduction": reduction,
        "token_weight": token_weight,
        "class_weight": torch.linspace(0.1, 2.0, 30),
        "label_smoothing": 0.2,
        "z_loss": 0.05,
    }
    check_against_float64((hidden, weight, bias), target, options, chunk_size=3)


@pytest.mark.parametrize("vocab", [32000, 32001])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_large_vocabulary(vocab, dtype):
    hidden, weight, bias, target, token_weight = make(5, 4, vocab, dtype, seed=vocab)
    options = {"loss": "ce", "token_weight": token_weight, "z_loss": 1e-3}
    check_against_float64((hidden, weight, bias), target, options, tol=2e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_several_column_blocks_per_row(monkeypatch, bias):
    """Blocks of 64 columns over V = 200: the online log-sum-exp across four steps."""
    if DEVICE.type == "cpu":
        monkeypatch.setattr(linear_head, "INTERPRETER_TILE", 64)
    hidden, weight, b, target, _ = make(6, 4, 200, torch.float32, seed=3, bias=bias)
    options = {"loss": "ce", "label_smoothing": 0.1, "z_loss": 1e-2}
    check_against_float64((hidden, weight, b), target, options)


def test_half_matmul_matches_the_torch_path():
    hidden, weight, bias, target, _ = make(7, 8, 50, torch.bfloat16, seed=5)
    on_device = [t.to(DEVICE) for t in (hidden, weight, bias)]
    got = run(ours("triton", target, {"loss": "ce"}, half_matmul=True), on_device)
    want = run(ours("torch", target, {"loss": "ce"}, half_matmul=True), on_device)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for grad, other in zip(got[1], want[1], strict=True):
        assert grad.dtype == torch.bfloat16
        scale = float(other.float().abs().max())
        torch.testing.assert_close(grad.float(), other.float(), rtol=2**-6, atol=2**-6 * scale)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_all_ignored_and_empty_batches(reduction):
    for rows, ignore in ((4, range(4)), (0, ())):
        hidden, weight, bias, target, _ = make(rows, 3, 11, torch.float32, ignore=tuple(ignore))
        on_device = [t.to(DEVICE) for t in (hidden, weight, bias)]
        value, grads = run(
            ours("triton", target, {"loss": "ce", "reduction": reduction}), on_device
        )
        assert value.shape == ((rows,) if reduction == "none" else ())
        assert not value.any()
        assert all(not grad.any() for grad in grads)


def test_tied_weight_gets_both_gradients():
    """The output weight is also the input embedding: its gradient sums the two uses."""
    generator = torch.Generator().manual_seed(11)
    weight = torch.randn(40, 6, generator=generator, dtype=torch.float64)
    tokens = torch.randint(0, 40, (7,), generator=generator)
    target = torch.roll(tokens, -1)
    target[-1] = -100

    def tied(backend):
        def function(w):
            hidden = torch.tanh(w[tokens.to(w.device)])
            if backend is None:
                return reference(hidden, w, None, target, z_loss=0.1)
            return linear_target_loss(
                hidden, w, target.to(w.device), loss="ce", z_loss=0.1, backend=backend
            )

        return function

    got = run(tied("triton"), [weight.float().to(DEVICE)])
    want = run(tied(None), [weight.float().double()])
    torch.testing.assert_close(got[0].cpu().double(), want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1][0].cpu().double(), want[1][0], rtol=1e-5, atol=1e-5)


def test_deterministic_algorithms_give_bitwise_equal_runs(monkeypatch):
    # PyTorch's own condition for deterministic cuBLAS products on a GPU (ignored on a CPU)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    hidden, weight, bias, target, token_weight = make(12, 4, 90, torch.float32, seed=9)
    options = {"loss": "focal", "token_weight": token_weight, "z_loss": 1e-2}
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        on_device = [t.to(DEVICE) for t in (hidden, weight, bias)]
        first = run(ours("triton", target, options, chunk_size=5), on_device)
        second = run(ours("triton", target, options, chunk_size=5), on_device)
    finally:
        torch.use_deterministic_algorithms(before)
    assert torch.equal(first[0], second[0])
    assert all(torch.equal(a, b) for a, b in zip(first[1], second[1], strict=True))


def test_the_triton_backend_runs_the_kernels(monkeypatch):
    calls: list[str] = []
    original = linear_head.kernel

    def counting(name: str, interpret: bool):
        calls.append(name)
        return original(name, interpret)

    monkeypatch.setattr(linear_head, "kernel", counting)
    hidden, weight, bias, target, _ = make(6, 3, 20, torch.float32)
    on_device = [t.to(DEVICE) for t in (hidden, weight, bias)]
    run(ours("triton", target, {"loss": "ce", "reduction": "none"}, chunk_size=3), on_device)
    # two chunks: a statistics pass each in the forward, a gradient pass each in the backward
    assert calls == ["statistics", "statistics", "gradient", "gradient"]
    calls.clear()
    run(ours("torch", target, {"loss": "ce"}), on_device)
    assert calls == []


def test_triton_refuses_float64_naming_the_backend():
    hidden, weight, _, target, _ = make(3, 2, 5, torch.float64)
    with pytest.raises(RuntimeError, match=r"backend='triton' reads float32, float16 or bfloat16"):
        linear_target_loss(hidden, weight, target, loss="ce", backend="triton")


@pytest.mark.parametrize("loss", list(LINEAR_TARGET_LOSSES))
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_every_loss_matches_the_torch_path(loss, reduction):
    """Every member of the family (its defaults), through the same ``phi`` on both backends."""
    hidden, weight, bias, target, token_weight = make(10, 4, 70, torch.float32, seed=13)
    options = {"loss": loss, "reduction": reduction, "token_weight": token_weight}
    on_device = [t.to(DEVICE) for t in (hidden, weight, bias)]
    got = run(ours("triton", target, options, chunk_size=4), on_device)
    want = run(ours("torch", target, options, chunk_size=4), on_device)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    for grad, other in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(grad, other, rtol=1e-5, atol=1e-6)


def test_strided_target_bias_and_class_weight():
    """Views with strides (every other element) read as their values, not as memory."""
    hidden, weight, _, target, _ = make(6, 4, 30, torch.float32, seed=17)
    long_target = torch.stack([target, torch.zeros_like(target)], 1).reshape(-1)
    strided_target = long_target[::2]
    strided_bias = torch.randn(60, generator=torch.Generator().manual_seed(2))[::2]
    strided_weight = torch.linspace(0.5, 2.0, 60)[::2]
    assert not strided_target.is_contiguous()
    assert not strided_bias.is_contiguous()
    options = {"loss": "ce", "class_weight": strided_weight, "label_smoothing": 0.1}
    check_against_float64((hidden, weight, strided_bias), strided_target, options)


def test_sequence_shaped_hidden_states():
    """``[B, L, H]`` hidden states and ``[B, L]`` targets, as a language model gives them."""
    hidden, weight, bias, target, token_weight = make(12, 4, 40, torch.float32, seed=19)
    options = {"loss": "ce", "reduction": "none", "token_weight": token_weight.reshape(3, 4)}
    on_device = [hidden.reshape(3, 4, 4).to(DEVICE), weight.to(DEVICE), bias.to(DEVICE)]
    got = run(ours("triton", target.reshape(3, 4), options), on_device)
    want = run(ours("torch", target.reshape(3, 4), options), on_device)
    assert got[0].shape == (3, 4)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    for grad, other in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(grad, other, rtol=1e-5, atol=1e-6)
