"""The category of every warning this package raises.

One category lets a program (or a test suite) filter, silence or raise the package's own
warnings without matching their texts: ``warnings.filterwarnings("error",
category=LightningLossesWarning)``, or in pytest's settings
``error::lightning_losses.warning.LightningLossesWarning``. It is a :class:`UserWarning`, so
filters and ``pytest.warns(UserWarning)`` written before it existed still apply.
:class:`LightningLossesRuntimeWarning` is the same category for the warnings about a failure at
run time (a tracking call that could be neither sent nor kept, a metric name MLflow refuses),
which were :class:`RuntimeWarning` and still are.

Standard library only: importing this module imports nothing else of the package's
dependencies.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warnings.warn("a message", LightningLossesRuntimeWarning, stacklevel=1)
    >>> issubclass(caught[0].category, (LightningLossesWarning, RuntimeWarning))
    True
"""

from __future__ import annotations

__all__ = ["LightningLossesRuntimeWarning", "LightningLossesWarning"]


class LightningLossesWarning(UserWarning):
    """A warning raised by lightning-losses (a schedule that replaces a value, a lost call)."""


class LightningLossesRuntimeWarning(LightningLossesWarning, RuntimeWarning):
    """A warning of lightning-losses about a failure at run time; also a RuntimeWarning."""
