"""The server of :mod:`helpers.preloaded`: forks ``lightning-losses`` runs from a warm interpreter.

Run as a script (``python preloaded_server.py SCRIPT``) by :mod:`helpers.preloaded`, never
imported by the tests. It imports torch, Lightning, MLflow and the package's command line once,
then reads one JSON request a line on stdin: ``{"args", "cwd", "env", "stdout", "stderr",
"fsize_limit"}``. For each it forks a child that takes the request's working folder and
environment, writes its output to the two files, and runs the console script's own entry point,
``sys.exit(console_main())`` with ``sys.argv = [SCRIPT, *args]``, then leaves Python as a script
does (``atexit`` handlers run, buffers are flushed). The server answers ``{"pid"}`` when the
child starts and ``{"returncode"}`` when it ends (``-N`` for a signal), as ``subprocess`` does.
The server itself never computes anything, so the child starts with no OpenMP thread pool.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import sys
import warnings

#: Imported once by the server, so that no run pays for them (about 8 s of CPU each here).
PRELOAD = (
    "torch",
    "lightning",
    "lightning.pytorch.cli",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "lightning_losses.cli.console",
    "lightning_losses.cli.fit",
)


def _redirect(fd: int, path: str | None, flags: int) -> None:
    target = os.open(path or os.devnull, flags, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _child(request: dict, script: str) -> None:
    """Become ``lightning-losses ARGS`` as the request describes; never returns."""
    os.setpgid(0, 0)  # its own group: a timeout stops it and whatever it started
    _redirect(0, None, os.O_RDONLY)
    _redirect(1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    _redirect(2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # PYTHONWARNINGS acts when an interpreter starts: the server started without it, with the
    # filters Python and the imported packages set; the child's go on top, as at a start.
    sys.warnoptions[:] = [w for w in request["env"].get("PYTHONWARNINGS", "").split(",") if w]
    warnings._processoptions(sys.warnoptions)  # type: ignore[attr-defined]
    if request.get("fsize_limit") is not None:  # a write past it fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = int(request["fsize_limit"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    sys.argv = [script, *request["args"]]
    from lightning_losses.cli.console import console_main

    sys.exit(console_main())


def serve(script: str) -> None:
    for module in PRELOAD:
        importlib.import_module(module)
    answers = sys.stdout
    for line in sys.stdin.buffer:
        request = json.loads(line)
        answers.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, script)  # raises SystemExit: the interpreter ends as a script's
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve(sys.argv[1])
