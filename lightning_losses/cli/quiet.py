"""Keep Lightning's and MLflow's output out of the terminal unless asked (``--verbose``).

``lightning-losses fit|validate|test|predict``, ``lightning-losses reproduce`` and the demo
print the package's own lines only. Kept out, unless ``--verbose`` is given (or
``LIGHTNING_LOSSES_VERBOSE=1`` is set):

- Lightning's info lines (seed, devices, the litlogger tip, the model summary, "fit stopped")
  and MLflow's (store creation), set to WARNING (:data:`QUIET_LOGGERS`); Lightning's MLflow
  logger's "Experiment ... not found. Creating it." (a warning) too;
- every warning raised from Lightning's, lightning_utilities', torchmetrics' or MLflow's code
  (e.g. the ``LeafSpec`` deprecation), and deprecation and future warnings raised anywhere
  but in this package (:func:`silence_libraries`);
- Lightning's progress bar, except for ``fit`` with the terminal as its standard output, and
  the results table of ``validate``/``test``, replaced by one line of ours
  (:func:`results_line`).

Warnings raised by this package stay visible. Standard library only at import; Lightning is
imported by :func:`silence_libraries`, MLflow never (it reads ``MLFLOW_LOGGING_LEVEL`` when it
is imported).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "VERBOSE_ENV",
    "VERBOSE_FLAG",
    "command_output",
    "fit_output_aside",
    "progress_bar_off",
    "results_line",
    "silence_libraries",
    "take_verbose_flag",
    "verbose_requested",
]

#: The command-line flag that shows Lightning's and MLflow's output.
VERBOSE_FLAG = "--verbose"
#: The environment variable with the same effect (``1``); child processes (DDP ranks,
#: ``reproduce --jobs`` workers) inherit the choice through it.
VERBOSE_ENV = "LIGHTNING_LOSSES_VERBOSE"
#: Loggers whose info lines stay out of the terminal, and the level they are set to.
QUIET_LOGGERS = {
    "lightning.pytorch": logging.WARNING,
    "lightning.fabric": logging.WARNING,
    "lightning_utilities": logging.WARNING,
    "lightning.pytorch.loggers.mlflow": logging.ERROR,  # "Experiment ... not found. Creating it."
    "mlflow": logging.WARNING,
    "alembic": logging.WARNING,
}
#: Environment variables read by MLflow: its log level (at import) and its download bars.
QUIET_ENV = {"MLFLOW_LOGGING_LEVEL": "WARNING", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
#: Modules whose warnings are not shown (a regular expression matched at the module's start).
LIBRARY_MODULES = (
    r"(lightning|lightning_fabric|lightning_utilities|pytorch_lightning|torchmetrics|mlflow)"
    r"(\.|$)"
)
#: Every module but this package and ``__main__``: their deprecations stay visible.
NOT_OURS = r"(?!(lightning_losses(\.|$)|__main__$))"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def verbose_requested() -> bool:
    """Whether ``LIGHTNING_LOSSES_VERBOSE`` asks for Lightning's and MLflow's output."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in _TRUE


def take_verbose_flag(args: Sequence[str]) -> tuple[list[str], bool]:
    """``args`` without ``--verbose``, and whether the output is to be verbose.

    ``--verbose``, ``--verbose=BOOL`` and ``--verbose BOOL`` are taken out (the words of
    BOOL: true/false, yes/no, on/off, 1/0); without them the answer is
    :func:`verbose_requested`.

    Example:
        >>> take_verbose_flag(["fit", "--verbose", "--trainer.max_epochs=1"])
        (['fit', '--trainer.max_epochs=1'], True)
        >>> take_verbose_flag(["test", "--verbose", "false", "--ckpt_path=a.ckpt"])
        (['test', '--ckpt_path=a.ckpt'], False)
    """
    kept: list[str] = []
    chosen: bool | None = None
    words = list(args)
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == VERBOSE_FLAG:
            following = words[index].lower() if index < len(words) else ""
            chosen = following not in _FALSE
            index += following in _TRUE + _FALSE
            continue
        value = word.partition("=")[2].lower()
        if word.startswith(VERBOSE_FLAG + "=") and value in _TRUE + _FALSE:
            chosen = value in _TRUE
            continue
        kept.append(word)
    return kept, verbose_requested() if chosen is None else chosen


def silence_libraries() -> None:
    """Keep Lightning's and MLflow's info lines and warnings out, for the whole process.

    For scripts and worker processes that only run fits (the demo, ``reproduce``); a command
    that returns to its caller uses :func:`command_output`, which puts everything back.
    """
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    import lightning.pytorch  # noqa: F401  (its import sets its loggers to INFO: set them after)

    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    warnings.filterwarnings("ignore", module=LIBRARY_MODULES)
    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=NOT_OURS)


@contextlib.contextmanager
def command_output(verbose: bool) -> Iterator[None]:
    """While a command runs: :func:`silence_libraries` unless ``verbose``; then put back.

    ``LIGHTNING_LOSSES_VERBOSE`` holds the choice meanwhile, so that the processes the command
    starts (DDP ranks) make the same one. Logger levels, warning filters and environment
    variables are restored on the way out.
    """
    names = (VERBOSE_ENV, *QUIET_ENV)
    saved_env = {name: os.environ.get(name) for name in names}
    saved_levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    os.environ[VERBOSE_ENV] = "1" if verbose else "0"
    try:
        with warnings.catch_warnings():
            if not verbose:
                silence_libraries()
            yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if not verbose:
            for name, level in saved_levels.items():
                logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def fit_output_aside() -> Iterator[None]:
    """Keep a fit's printed lines (its summary lines) off stdout, unless verbose output is asked.

    ``reproduce`` and the demo print one line per fit instead; each run is in MLflow.
    """
    if verbose_requested():
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _is_progress_bar(callback: Any) -> bool:
    class_path = str(callback.get("class_path", "")) if hasattr(callback, "get") else ""
    return "ProgressBar" in class_path.rpartition(".")[2]


def progress_bar_off(config: Any, command: str | None) -> bool:
    """Whether a quiet command turns Lightning's progress bar off, from its parsed ``config``.

    The bar stays for ``fit`` when standard output is a terminal, and wherever it was chosen
    (``--trainer.enable_progress_bar=true``, or a progress bar callback); the parsed config
    itself is left as it is (it is the run's record).
    """
    trainer = (config or {}).get("trainer") or {}
    if trainer.get("enable_progress_bar") is not None:
        return False
    if any(_is_progress_bar(c) for c in trainer.get("callbacks") or [] if c is not None):
        return False
    return not (command == "fit" and sys.stdout.isatty())


def results_line(command: str, metrics: Mapping[str, Any], run_id: str | None = None) -> str:
    """One line for what ``validate``/``test`` logged: each metric, 4 significant digits.

    Example:
        >>> results_line("test", {"test/nll": 0.31416, "test/acc": 0.9})
        'lightning-losses test: test/acc 0.9, test/nll 0.3142'
        >>> results_line("test", {"test/acc": 0.9}, run_id="ab12")
        'lightning-losses test: test/acc 0.9; MLflow run ab12'
    """
    values = ", ".join(f"{name} {float(metrics[name]):.4g}" for name in sorted(metrics))
    line = f"lightning-losses {command}: {values or 'no metrics logged'}"
    return f"{line}; MLflow run {run_id}" if run_id else line
