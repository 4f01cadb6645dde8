"""``lightning-losses ...`` in a real process that starts without paying for its imports.

Most of the suite's time went to the processes it starts, and most of theirs to importing
torch, Lightning and MLflow (about 8 s of CPU each on the 2-core test machine, where a tiny fit
itself takes 2-4 s). :func:`run_preloaded` runs the console script's entry point in a child
forked from a server that imported them once per pytest worker
(:mod:`helpers.preloaded_server`): a separate process with its own working folder,
environment, output files, exit status and ``atexit`` handlers, running the same
``console_main`` the installed script runs.

What it does not show is the start of a process: what importing prints, and what a command does
before Lightning is imported. Tests of those (the quiet output, the README's commands, the
fast checks of a command line, an installed wheel, signals sent to a fit) start the script
itself (:func:`helpers.console.run_console`, ``subprocess``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from helpers.console import console_env
from helpers.paths import SCRIPT

__all__ = ["run_preloaded"]

SERVER = Path(__file__).with_name("preloaded_server.py")

_lock = threading.Lock()
_server: subprocess.Popen[bytes] | None = None


def _stop_server() -> None:
    if _server is not None and _server.poll() is None:
        _server.stdin.close()  # type: ignore[union-attr]
        try:
            _server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _server.kill()


def _started_server() -> subprocess.Popen[bytes]:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen(
            [sys.executable, str(SERVER), str(SCRIPT)],
            bufsize=0,  # no read-ahead: select() then sees every answer not yet read
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=console_env(unset=("MLFLOW_TRACKING_URI", "PYTHONWARNINGS")),  # see the server
        )
        atexit.register(_stop_server)
    return _server


def _answer(server: subprocess.Popen[bytes], timeout: float | None) -> dict:
    stdout = server.stdout
    assert stdout is not None
    if timeout is not None and not select.select([stdout], [], [], timeout)[0]:
        raise TimeoutError
    line = stdout.readline()
    if not line:
        raise RuntimeError(f"the preloaded server ended (status {server.wait()})")
    return json.loads(line)


def _kill(pid: int) -> None:
    """Kill the child's process group (the child itself, if it has not made its group yet)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_preloaded(
    arguments: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    fsize_limit: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``lightning-losses ARGUMENTS`` in a forked child; its status and output (text).

    Args:
        arguments: the command line after ``lightning-losses``.
        cwd: the working directory (this process's by default).
        env: the child's whole environment; by default :func:`helpers.console.console_env`
            with ``PYTHONWARNINGS=ignore``, as :func:`helpers.console.run_console` gives.
        timeout: seconds before the child (and its process group) is killed and
            ``subprocess.TimeoutExpired`` raised.
        fsize_limit: a limit in bytes on the size of any file the child writes
            (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored: a write past it fails with ``EFBIG``).
    """
    if env is None:
        env = console_env(PYTHONWARNINGS="ignore")
    with _lock, tempfile.TemporaryDirectory(prefix="preloaded-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        request = {
            "args": list(arguments),
            "cwd": str(Path(cwd or os.getcwd()).resolve()),
            "env": dict(env),
            "stdout": str(out),
            "stderr": str(err),
            "fsize_limit": fsize_limit,
        }
        server = _started_server()
        assert server.stdin is not None
        try:
            server.stdin.write(json.dumps(request).encode() + b"\n")
            server.stdin.flush()
            pid = _answer(server, 600)["pid"]  # the first request waits for the imports
            try:
                returncode = _answer(server, timeout)["returncode"]
            except TimeoutError:
                _kill(pid)
                _answer(server, 60)
                raise subprocess.TimeoutExpired(
                    ["lightning-losses", *arguments], timeout, out.read_text(), err.read_text()
                ) from None
        except BaseException as error:  # a server out of step with its requests is not reused
            if not isinstance(error, subprocess.TimeoutExpired):
                server.kill()
                server.wait()
            raise
        return subprocess.CompletedProcess(
            ["lightning-losses", *arguments], returncode, out.read_text(), err.read_text()
        )
