"""Every module of the package imports on its own, first, in a fresh interpreter.

A lazy package ``__getattr__`` (PEP 562) once answered ``from . import version`` inside
``reproduce/runner.py`` by importing the pipeline, which imports ``runner`` again: importing
``lightning_losses.reproduce.runner`` first failed with a circular ImportError, while the
suite passed because other tests had imported the package earlier.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import lightning_losses

pytestmark = pytest.mark.slow

PACKAGE_DIR = Path(lightning_losses.__file__).parent

CHILD = r"""
import os, sys, importlib
import torch, lightning, mlflow, numpy  # third-party imports are shared; ours are not
names = sys.argv[1:]
failed = []
for name in names:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # report any failure, then exit non-zero
            print(f"{name}: {type(exc).__name__}: {exc}", flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed.append(name)
print("FAILED", failed)
sys.exit(1 if failed else 0)
"""


def module_names() -> list[str]:
    """Dotted names of every module under the package.

    ``configs`` holds data, and a ``__main__`` module runs its command when imported.
    """
    names = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if "configs" in parts or parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def test_every_module_imports_first_in_a_fresh_process() -> None:
    names = module_names()
    assert "lightning_losses.reproduce.runner" in names
    assert len(names) > 50
    result = subprocess.run(
        [sys.executable, "-c", CHILD, *names], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
