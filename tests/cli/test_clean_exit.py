"""A passing test run exits without a stray traceback (Hypothesis' gc callback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # tests/: conftest.py and helpers/
JUNKDRAWER = "hypothesis.internal.conjecture.junkdrawer"

SCRIPT = f"""
import atexit, gc, sys
sys.path.insert(0, {str(TESTS)!r})
import conftest  # registers the exit hook, as pytest does
from hypothesis import given, strategies as st

@given(st.integers())
def check(x):
    assert x == x

check()
installed = [c for c in gc.callbacks if getattr(c, "__module__", None) == {JUNKDRAWER!r}]
print("installed", len(installed))
atexit._run_exitfuncs()
left = [c for c in gc.callbacks if getattr(c, "__module__", None) == {JUNKDRAWER!r}]
print("left", len(left))
"""


def test_hypothesis_gc_callback_is_removed_at_exit():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # Hypothesis does install the callback (else this test would prove nothing) ...
    assert "installed 1" in done.stdout
    # ... and the exit hook removes it, so nothing is printed at interpreter exit.
    assert "left 0" in done.stdout
    assert "Exception ignored" not in done.stderr
    assert "Traceback" not in done.stderr
