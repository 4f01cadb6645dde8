"""Run ``tests/kernels/interpreted`` in a process started with ``TRITON_INTERPRET=1``.

The interpreter is chosen when ``triton`` is first imported, which this process has already done
(``import lightning`` imports it), so the interpreted tests get a process of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow  # a subprocess: the slow lane's, and first in make test's queue
def test_the_kernels_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    result = subprocess.run(
        [*command, str(HERE / "interpreted")],
        cwd=HERE.parents[1],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert " passed" in output, output[-2000:]
    assert "skipped" not in output, output[-2000:]
