"""The docs' quick look of ``lightning-losses reproduce`` leaves a clone's tracked files alone.

A run other than the committed one (every claim, 3 seeds, epochs scale 1) writes its report
into a new ``reproduce_runs/<date>-<time>/`` folder, which git ignores, and says where; the
committed ``reports/REPORT.md`` and its figures stay as they are.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.paths import ROOT, SCRIPT


def git(*arguments: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", *arguments], cwd=cwd, capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout


def quick_look() -> list[str]:
    """The command line docs/reproduce.md calls "a quick look", as words."""
    text = (ROOT / "docs" / "reproduce.md").read_text()
    [line] = [line for line in text.splitlines() if line.rstrip().endswith("# a quick look")]
    return shlex.split(line.partition("#")[0])


def clone_of_the_working_tree(target: Path) -> Path:
    """A git repository holding this checkout's files as they are now, committed and clean.

    ``git clone`` would leave out the changes not yet committed; the tracked and the untracked
    but not ignored files are copied instead, then committed.
    """
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    git("init", "-q", cwd=target)
    git("add", "-A", cwd=target)
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    git(*identity, "commit", "-q", "--no-verify", "-m", "clone", cwd=target)
    assert git("status", "--porcelain", cwd=target) == ""
    return target


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs git and a git checkout of the repository",
)
@pytest.mark.slow
def test_the_quick_look_leaves_the_committed_report_alone(tmp_path):
    words = quick_look()
    assert words[:2] == ["lightning-losses", "reproduce"]
    assert "--seeds" in words  # a partial run (the committed one has 3 seeds)
    arguments = words[2:]  # exactly as documented
    clone = clone_of_the_working_tree(tmp_path / "clone")
    committed = (clone / "reports" / "REPORT.md").read_bytes()
    unset = ("MLFLOW_TRACKING_URI", "LIGHTNING_LOSSES_VERBOSE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    done = subprocess.run(
        [str(SCRIPT), "reproduce", *arguments],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert git("status", "--porcelain", cwd=clone) == ""  # nothing changed, nothing new shown
    assert (clone / "reports" / "REPORT.md").read_bytes() == committed
    # Where it wrote is printed first and last, and is a new folder that git ignores.
    lines = done.stdout.splitlines()
    assert lines[0].startswith("lightning-losses reproduce: the report goes to reproduce_runs/")
    assert lines[-1].startswith("report: ")
    report = clone / lines[-1].removeprefix("report: ")
    assert report.is_file()
    assert report.parent.parent == clone / "reproduce_runs"
    assert (report.parent / "claim1_losses.png").is_file()
    assert "Claims 1, 6; 1 seed(s)" in report.read_text()
    git("check-ignore", "-q", str(report.relative_to(clone)), cwd=clone)  # raises if not


def test_a_partial_run_gets_a_new_folder_and_the_committed_run_reports(tmp_path, monkeypatch):
    from datetime import datetime

    from lightning_losses.reproduce.cli import build_parser, output_folder

    monkeypatch.chdir(tmp_path)
    now = datetime(2025, 1, 2, 3, 4, 5)
    partial = build_parser().parse_args(["--claims", "1", "3", "--seeds", "1"])
    first = output_folder(partial, now)
    assert first == Path("reproduce_runs/20250102-030405")
    first.mkdir(parents=True)  # a second run in the same second gets its own folder
    assert output_folder(partial, now) == Path("reproduce_runs/20250102-030405-2")
    for options in (["--seeds", "5"], ["--epochs-scale", "0.2"], ["--claims", "7", "8"]):
        assert output_folder(build_parser().parse_args(options), now).parent.name == (
            "reproduce_runs"
        )
    assert output_folder(build_parser().parse_args(["--jobs", "2"]), now) == Path("reports")
    chosen = build_parser().parse_args(["--claims", "1", "--out", "reports"])
    assert output_folder(chosen, now) == Path("reports")
