"""Every kernel compiles ahead of time for the GPU (sm80 and sm90) on this CPU.

A kernel the interpreter accepts may still be one the GPU compiler rejects (a dtype mismatch in
a loop, a non-power-of-two block): Triton's compiler and ``ptxas`` (in the triton wheel) build a
cubin here without a GPU. Run in a process without ``TRITON_INTERPRET`` and with its own cache
folder, so every build is a real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow  # a subprocess: the slow lane's, and first in make test's queue
def test_every_kernel_compiles_for_sm80_and_sm90(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run(
        [sys.executable, str(HERE / "compile_ahead.py")],
        cwd=HERE.parents[1],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    builds = [json.loads(line) for line in result.stdout.splitlines()]
    # the family's 2 kernels x 3 dtypes x 2 variants x 2 architectures, MbLS's 2 kernels x 2
    # dtypes (float32, bfloat16) x 2 architectures, and the head's 2 kernels x 4 builds x 2
    assert len(builds) == 24 + 8 + 16
    kernels = ("forward", "backward", "mbls_forward", "mbls_backward")
    kernels += ("head_statistics", "head_gradient")
    assert {(b["kernel"], b["arch"]) for b in builds} == {(k, a) for k in kernels for a in (80, 90)}
    empty = [b for b in builds if b["cubin"] == 0 or b["ptx"] == 0]
    assert not empty, empty
