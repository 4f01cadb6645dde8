"""``lightning-losses ...`` in a subprocess, as a user runs it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from helpers.paths import SCRIPT

__all__ = ["console_env", "run_console"]


def console_env(
    *, unset: Iterable[str] = ("MLFLOW_TRACKING_URI",), **variables: str
) -> dict[str, str]:
    """This process's environment for a child, ``unset`` removed and ``variables`` set.

    By default only ``MLFLOW_TRACKING_URI`` is removed: the store a developer's shell may name.

    Example:
        >>> env = console_env(PYTHONWARNINGS="ignore")
        >>> "MLFLOW_TRACKING_URI" in env, env["PYTHONWARNINGS"]
        (False, 'ignore')
    """
    removed = set(unset)
    env = {name: value for name, value in os.environ.items() if name not in removed}
    env.update(variables)
    return env


def run_console(
    arguments: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``lightning-losses ARGUMENTS``; its status and captured output (text).

    Args:
        arguments: the command line after ``lightning-losses``.
        cwd: the working directory (this process's by default).
        env: the environment; by default :func:`console_env` with ``PYTHONWARNINGS=ignore``
            (Lightning's and MLflow's warnings are not what these tests read).
        timeout: seconds before the run fails the test instead of blocking the suite.
    """
    if env is None:
        env = console_env(PYTHONWARNINGS="ignore")
    return subprocess.run(
        [str(SCRIPT), *arguments],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
