"""The package's own warnings, asserted: in pytest they are errors unless a test expects them.

pyproject.toml turns every :class:`~lightning_losses.warning.LightningLossesWarning` into an
error, so a test that provokes one says so with :func:`package_warns` (``pytest.warns``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from lightning_losses.warning import LightningLossesWarning

__all__ = ["REPLACED", "RETIMED", "package_warns"]

#: LossScheduler and GammaAnnealing: a schedule replaces the value a criterion was given.
REPLACED = "replacing the value given"
#: A resumed schedule with fractional boundaries and another total length of training.
RETIMED = "has boundaries given as fractions"


@contextlib.contextmanager
def package_warns(match: str, *, expected: bool = True) -> Iterator[None]:
    """Expect a package warning whose message matches ``match`` (a regular expression).

    With ``expected=False`` nothing is expected: a package warning then fails the test, as
    anywhere else in the suite.
    """
    if not expected:
        yield
        return
    with pytest.warns(LightningLossesWarning, match=match):
        yield
