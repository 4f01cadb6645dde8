"""``make demo`` prints one line per config and a table: no progress bars, tips or info lines."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers.paths import ROOT

pytestmark = pytest.mark.slow

LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S+) +\.\.\. \d+\.\d s, ETA \d+ s$")


def test_demo_prints_one_line_per_config_and_nothing_else(tmp_path):
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import demo; "
        "demo.main_demo(1, ['digits_ce', 'rare_digit_binary_focal'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "scripts")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no warnings, tips, seeds, store creation or progress bars
    lines = done.stdout.splitlines()
    progress = [LINE.match(line) for line in lines[:2]]
    assert all(progress), lines[:2]
    assert [(m[1], m[2], m[3]) for m in progress] == [
        ("1", "2", "digits_ce"),
        ("2", "2", "rare_digit_binary_focal"),
    ]
    table = lines[
        lines.index("lightning-losses demo: 1 epochs each, validation split after the last epoch") :
    ]
    rows = [line.split() for line in table if line.startswith(("digits_ce ", "rare_digit_binary"))]
    assert [row[:3] for row in rows] == [
        ["digits_ce", "CrossEntropyLoss", "multiclass"],
        ["rare_digit_binary_focal", "BinaryFocalLoss", "binary"],
    ]
    assert lines[-1].startswith("demo: 2 configs in ")
    # Nothing but the progress lines, a blank line and the table with its notes.
    assert len(lines) == 2 + 1 + len(table)
    assert (tmp_path / "mlflow.db").is_file()  # every run is tracked
