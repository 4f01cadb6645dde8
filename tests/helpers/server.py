"""A real ``mlflow server`` on 127.0.0.1 (SQLite store), and free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from helpers.paths import MLFLOW

__all__ = ["Server", "free_port"]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now.

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """A real ``mlflow server`` process on 127.0.0.1, stoppable and restartable.

    Its store is ``root/server.db``, its artifacts ``root/artifacts`` and its output
    ``root/server.log``; the port is chosen once, so a restarted server has the same URI. As a
    context manager it is started on entry and stopped on exit.

    Args:
        root: an existing folder for the server's files.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> None:
        """Start the server and wait until its ``/health`` answers (an error after ``timeout``)."""
        command = [
            str(MLFLOW),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.root}/server.db",
            "--artifacts-destination",
            str(self.root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        # A tracking server: without MLflow 3's job runner (a runner and seven huey consumers,
        # each a Python process importing MLflow, for GenAI jobs the tests never submit).
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with (self.root / "server.log").open("a") as log:  # the child keeps its own handle
            self.process = subprocess.Popen(command, stdout=log, stderr=log, cwd=self.root, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
            if self.process.poll() is not None:
                break
        log_text = (self.root / "server.log").read_text()
        raise RuntimeError(f"mlflow server did not start:\n{log_text}")

    def stop(self) -> None:
        """Terminate the server (killed if it has not ended within 20 s)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
