"""The Triton kernels' tests: under Triton's interpreter, and compiled ahead of time.

Triton's interpreter must be switched on (``TRITON_INTERPRET=1``) before ``triton`` is first
imported, and ``import lightning`` imports it: so the interpreter tests in ``interpreted/`` run
in a process of their own, started with the variable set
(``test_kernels_under_the_interpreter.py``), and are left out of any other run. The rest of the
suite never sees the variable. On a GPU, ``KERNEL_TEST_DEVICE=cuda pytest
tests/kernels/interpreted`` runs the same tests on the compiled kernels. Without the ``triton``
package the folder is skipped.
"""

from __future__ import annotations

import importlib.util
import os

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("triton") is None:
    collect_ignore_glob = ["test_*.py", "compile_ahead.py", "interpreted/*"]
elif os.environ.get("TRITON_INTERPRET") != "1" and os.environ.get("KERNEL_TEST_DEVICE") != "cuda":
    collect_ignore_glob = ["interpreted/*"]
