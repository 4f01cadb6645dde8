"""Whether the Triton kernels can run for a tensor; nothing here imports Triton at import time.

The kernels run on CUDA tensors when Triton imports, and on CPU tensors under Triton's
interpreter (``TRITON_INTERPRET=1``, how the test suite runs them on a machine without a GPU).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import torch
from torch import Tensor

#: The logits dtypes the kernels read (each computed in float32 after the load).
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.cache
def triton_importable() -> bool:
    """Whether the ``triton`` package is installed (found without importing it).

    Example:
        >>> isinstance(triton_importable(), bool)
        True
    """
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set: the kernels then run on CPU tensors, slowly.

    Example:
        >>> isinstance(interpreter_enabled(), bool)
        True
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def imported_without_interpreter() -> bool:
    """Whether ``triton`` was imported before ``TRITON_INTERPRET=1`` was set.

    Triton reads the variable once, when ``triton.language`` is imported (its reductions are
    then compiled functions, which the interpreter cannot call); ``import lightning`` imports
    it. The interpreter needs the variable set before that first import.

    Example:
        >>> isinstance(imported_without_interpreter(), bool)
        True
    """
    language = sys.modules.get("triton.language")
    if language is None:
        return False
    return type(getattr(language, "sum", None)).__name__ != "InterpretedFunction"


def kernels_can_run(tensor: Tensor) -> bool:
    """Whether the kernels can run on ``tensor``'s device here.

    True for a CUDA tensor when Triton is installed, and for a CPU tensor when Triton is
    installed and ``TRITON_INTERPRET=1`` is set.

    Example:
        >>> import os
        >>> kernels_can_run(torch.zeros(2, 3)) == (triton_importable() and interpreter_enabled())
        True
    """
    if not triton_importable():
        return False
    if tensor.device.type == "cuda":
        return True
    return tensor.device.type == "cpu" and interpreter_enabled()


#: Whether ``backend="auto"`` picks the kernels for CUDA tensors. Off until the kernels have run
#: on a GPU (``benchmarks/device_check.sh``): so far they are tested under Triton's interpreter
#: and compiled ahead of time for sm80/sm90, never executed on a device, so ``"auto"`` keeps the
#: PyTorch path and ``backend="triton"`` opts in.
AUTO_USES_KERNELS = False

#: The values of ``backend=``.
BACKENDS = ("auto", "triton", "torch")


def use_kernels(logits: Tensor, backend: str) -> bool:
    """Whether ``backend`` (``"auto"``, ``"triton"`` or ``"torch"``) runs the kernels on ``logits``.

    ``"auto"`` runs them on ``[N, C]`` CUDA tensors of float32, float16 or bfloat16 when
    Triton is installed and :data:`AUTO_USES_KERNELS` is on, the torch path elsewhere;
    ``"torch"`` never; ``"triton"`` always, and raises where they cannot run.

    Raises:
        ValueError: an unknown ``backend``.
        RuntimeError: ``backend="triton"`` where the kernels cannot run (no Triton, a CPU tensor
            without ``TRITON_INTERPRET=1``, logits of another shape or of a dtype they do not
            read).

    Example:
        >>> use_kernels(torch.zeros(2, 3), "torch")
        False
        >>> use_kernels(torch.zeros(2, 3, dtype=torch.float64), "auto")
        False
    """
    if backend == "auto":  # first: the common case, on every call (is_cuda is the cheap test)
        return (
            AUTO_USES_KERNELS
            and logits.is_cuda
            and logits.dim() == 2
            and logits.dtype in KERNEL_DTYPES
            and triton_importable()
        )
    if backend == "torch":
        return False
    if backend != "triton":  # the message of functional.checks.check_choice (a lower layer)
        choices = ", ".join(repr(choice) for choice in BACKENDS)
        raise ValueError(f"backend must be one of {choices}; got {backend!r}")
    if logits.dim() != 2:
        raise RuntimeError(
            f"backend='triton' takes [N, C] logits; got shape {list(logits.shape)} "
            "(use backend='torch' or 'auto')"
        )
    if logits.dtype not in KERNEL_DTYPES:
        raise RuntimeError(
            f"backend='triton' reads float32, float16 or bfloat16 logits; got {logits.dtype} "
            "(use backend='torch' or 'auto')"
        )
    if not triton_importable():
        raise RuntimeError("backend='triton' needs the triton package (pip install triton)")
    if not kernels_can_run(logits):
        raise RuntimeError(
            "backend='triton' runs on CUDA tensors, or on CPU tensors under Triton's "
            f"interpreter (TRITON_INTERPRET=1); got a {logits.device.type} tensor"
        )
    if logits.device.type != "cuda" and imported_without_interpreter():
        raise RuntimeError(
            "backend='triton' on CPU tensors needs TRITON_INTERPRET=1 set before triton is "
            "first imported (import lightning imports it): set it in the environment of the "
            "process"
        )
    return True
