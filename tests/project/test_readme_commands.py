"""README.md's command lines run as written, in a fresh copy of the repository.

A new user copies the ```` ```bash ```` blocks of the README into a shell of their own, whose
``PATH`` does not hold the project's ``.venv/bin``. The test does the same: the repository's
files (tracked, and new ones not ignored: what a clone of the working tree holds) are copied to
a temporary folder, ``.venv`` there is a link to the project's existing virtual environment
(what ``make`` would have built), and the lines of every bash block run in order in one
``bash -e`` with ``.venv/bin`` taken off ``PATH`` and no ``VIRTUAL_ENV``. Not run:

- ``make test`` and ``make demo``: they are the whole test suite and the demo's ten fits (each
  has its own test); their set-up, ``.venv``, is the link above.
- ``mlflow ui``: a server, which never ends; it is started alone, with the ``PATH`` the lines
  before it left, and must answer HTTP on its port before it is stopped.

The demo's closing hints are run too, as printed, in a shell without ``.venv/bin`` on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import ROOT

VENV = ROOT / ".venv"
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: README lines not run here, and why.
NOT_RUN = {
    "make test": "the whole test suite (this test is part of it)",
    "make demo": "ten fits; tests/project/test_demo.py runs the demo itself",
}
SERVER = "mlflow ui"
MLFLOW_PORT = 5000  # `mlflow ui`'s default, what the README's line serves on


def command_lines(markdown: str) -> list[str]:
    r"""The lines of the ```` ```bash ```` blocks of ``markdown``, in order, comments dropped.

    Example:
        >>> command_lines("x\n```bash\nls -l   # list\n\n# note\n```\n```python\nx\n```\n")
        ['ls -l   # list']
    """
    lines = []
    for block in BASH_BLOCK.findall(markdown):
        lines += [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    return lines


def _command(line: str) -> str:
    """``line`` without its trailing comment (for matching only; the line runs as written)."""
    return line.split("#", 1)[0].strip()


def fresh_shell_env() -> dict[str, str]:
    """The environment of a new user's shell: no virtual environment on ``PATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "MLFLOW_"))}
    env.pop("PYTHONPATH", None)  # the suite's (tests/helpers/store_template): not a user's
    bins = {str(VENV / "bin"), str(Path(sys.executable).parent)}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p not in bins]
    env["PATH"] = os.pathsep.join(path or ["/usr/bin", "/bin"])
    return env


def copy_repository(destination: Path) -> None:
    """The working tree's tracked and new (not ignored) files into ``destination``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def readme_lines() -> list[str]:
    return command_lines((ROOT / "README.md").read_text(encoding="utf-8"))


def test_readme_has_few_cheap_command_lines() -> None:
    lines = [_command(line) for line in readme_lines()]
    assert set(NOT_RUN) <= set(lines)  # the set-up the rest relies on is in the README
    servers = [line for line in lines if line.startswith(SERVER)]
    assert servers == [lines[-1]]  # one server, last: nothing after it waits on it
    assert sum(line.startswith("lightning-losses fit") for line in lines) <= 3
    assert not any(line.startswith(("pip ", "python -m pip")) for line in lines), (
        "an install line would point the shared .venv at the copy; say it in prose"
    )


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _serve(line: str, cwd: Path, env: dict[str, str]) -> str:
    """Start the server ``line``, wait until it listens on its port, stop it; its output."""
    server = subprocess.Popen(
        ["bash", "-c", line],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: stopped with its workers below
    )
    try:
        deadline = time.monotonic() + 120
        while not _port_open(MLFLOW_PORT) and server.poll() is None:
            assert time.monotonic() < deadline, f"`{line}` did not listen within 120 s"
            time.sleep(0.5)
        assert server.poll() is None, f"`{line}` ended: {server.stdout.read()[-3000:]}"
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        try:
            output = server.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            output = server.communicate()[0]
    return output


@pytest.mark.skipif(
    not (VENV / "bin" / "lightning-losses").exists(),
    reason="no .venv with lightning-losses in the repository (`make venv` builds it)",
)
@pytest.mark.slow
def test_readme_command_lines_run_as_written(tmp_path: Path) -> None:
    port_taken = _port_open(MLFLOW_PORT)  # before anything of ours could hold it
    copy_repository(tmp_path)
    (tmp_path / ".venv").symlink_to(VENV)
    lines = readme_lines()
    script = ["set -e -o pipefail"]
    for line in lines[:-1]:  # the last one is the server
        if _command(line) not in NOT_RUN:
            script += [f"echo {shlex.quote(f'+ {line}')} >&2", line]
    script.append('printf "%s" "$PATH" > .readme_path')  # what the lines left for the server
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=tmp_path,
        env=fresh_shell_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "command not found" not in done.stderr
    assert (tmp_path / "mine.yaml").is_file()  # --print_config wrote the user's copy
    rows = (tmp_path / "comparison" / "comparison.csv").read_text().splitlines()  # compare's
    fits = [line for line in lines if line.startswith("lightning-losses fit")]
    assert len(rows) - 1 == sum("--print_config" not in line for line in fits)  # a row a fit

    if port_taken:
        pytest.skip(f"port {MLFLOW_PORT} is taken on this machine: `{lines[-1]}` could not use it")
    env = {**fresh_shell_env(), "PATH": (tmp_path / ".readme_path").read_text()}
    output = _serve(lines[-1], tmp_path, env)
    assert f"127.0.0.1:{MLFLOW_PORT}" in output  # it served on its default port, as written


@pytest.mark.slow
def test_demo_hints_run_as_printed(tmp_path: Path) -> None:
    """The demo's closing lines name commands a shell without ``.venv/bin`` on PATH can run."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); import demo; demo.print_table([], 1)"
    env = fresh_shell_env()
    printed = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "scripts")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    hints = [c for c in re.findall(r"`([^`]+)`", printed) if re.search(r"lightning-losses|mlf", c)]
    assert len(hints) >= 2, printed
    for hint in hints:  # each with --help: it must start as printed, not run a whole command
        ran = subprocess.run(
            ["bash", "-c", f"{hint} --help"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert ran.returncode == 0, f"`{hint}` as printed by the demo: {ran.stderr[-2000:]}"


def test_readme_python_blocks_run_as_written(tmp_path: Path, monkeypatch) -> None:
    """The ```` ```python ```` blocks of the README, in order, in one namespace, in a new folder.

    The module example builds its Trainer (it does not fit: it has no data); the plain-PyTorch
    example trains 100 steps and computes the ECE, its interval and the losses it shows.
    """
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    ece, low, high = (float(v) for v in (namespace["ece"], namespace["low"], namespace["high"]))
    assert 0.0 <= low <= ece <= high <= 1.0
