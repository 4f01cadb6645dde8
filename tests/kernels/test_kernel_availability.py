"""The backend choice in a process that imported triton without the interpreter (this one)."""

from __future__ import annotations

import pytest
import torch

from lightning_losses.kernels.availability import imported_without_interpreter, use_kernels


def test_the_interpreter_needs_the_variable_before_triton_is_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import triton.language  # noqa: F401  (lightning imports it too)

    assert imported_without_interpreter()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="set before triton is first imported"):
        use_kernels(torch.zeros(2, 3), "triton")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match=r"runs on CUDA tensors, or on CPU tensors"):
        use_kernels(torch.zeros(2, 3), "triton")
    assert not use_kernels(torch.zeros(2, 3), "auto")
    with pytest.raises(RuntimeError, match=r"takes \[N, C\] logits; got shape \[2, 3, 4\]"):
        use_kernels(torch.zeros(2, 3, 4), "triton")


def test_backend_triton_on_cpu_without_the_interpreter_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lightning_losses.functional._core import phi_cross_entropy, target_probability_loss

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x, target = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    with pytest.raises(RuntimeError, match=r"^backend='triton' runs on CUDA tensors[^\n]*$"):
        target_probability_loss(x, target, phi_cross_entropy, backend="triton")
    torch.testing.assert_close(  # auto: the torch path on a CPU
        target_probability_loss(x, target, phi_cross_entropy, backend="auto"),
        torch.nn.functional.cross_entropy(x, target),
    )
