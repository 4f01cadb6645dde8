"""The command line: the console entry, LightningCLI's ``fit``/``validate``/``test``/``predict``.

- :mod:`~lightning_losses.cli.console`: the ``lightning-losses`` script; answers ``--help``
  with the standard library only and dispatches each command.
- :mod:`~lightning_losses.cli.commands`: command texts and light parsers.
- :mod:`~lightning_losses.cli.fit`: the LightningCLI (:func:`main`, :func:`run_fit`).
- :mod:`~lightning_losses.cli.parser`, :mod:`~lightning_losses.cli.checks`: one-line errors for
  a command line, a config or a checkpoint; :mod:`~lightning_losses.cli.config_files`: shipped
  configs by name; :mod:`~lightning_losses.cli.quiet`: library noise kept off the terminal.
- :mod:`~lightning_losses.cli.sync`: ``sync-tracking``.

Importing the package is light: :func:`main`, :func:`run_fit`, :class:`LossesCLI` and
:class:`TrackingCLI` are imported from :mod:`~lightning_losses.cli.fit` on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_losses._lazy import lazy_exports

__all__ = ["LossesCLI", "TrackingCLI", "main", "run_fit"]

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports these
    from lightning_losses.cli.fit import LossesCLI, TrackingCLI, main, run_fit

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, "fit"), __all__)
