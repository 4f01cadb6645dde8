"""``make demo``: a line per config, a table per kind of task, no progress bars or info lines.

The rare class sits apart from multiclass, with its own measures, and the time is labelled.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers.paths import ROOT

pytestmark = pytest.mark.slow

LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S+) +\.\.\. \d+\.\d s, ETA \d+ s$")
RARE = "Rare class (binary; accuracy does not compare: all-negative scores 1 - positives)"


def tables_of(lines: list[str]) -> dict[str, list[str]]:
    """``{title: [header, rule, row, ...]}`` of the demo's tables (a title, then a header)."""
    tables: dict[str, list[str]] = {}
    for k in range(len(lines) - 1):
        if lines[k + 1].startswith("config "):
            body = []
            for row in lines[k + 1 :]:
                if not row.strip():
                    break
                body.append(row)
            tables[lines[k]] = body
    return tables


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
    assert lines[-1].startswith("demo: 2 configs in ")
    # Nothing but the progress lines, a blank line and the tables with their notes.
    assert len(lines) == 2 + 1 + len(table)
    assert (tmp_path / "mlflow.db").is_file()  # every run is tracked

    # One table per kind of task, none for a kind the demo did not fit; the time labelled.
    tables = tables_of(table)
    assert list(tables) == ["Multiclass (ten digits)", RARE]
    multiclass, rare = tables.values()
    assert multiclass[0].split() == ["config", "loss", "acc", "NLL", "ECE", "s/epoch"]
    header = ["config", "loss", "positives", "PR-AUC", "F1", "R@P0.9", "ECE", "s/epoch"]
    assert rare[0].split() == header
    assert [row.split()[:2] for row in multiclass[2:]] == [["digits_ce", "CrossEntropyLoss"]]
    assert [row.split()[:2] for row in rare[2:]] == [["rare_digit_binary_focal", "BinaryFocalLoss"]]
    assert "R@P0.9: recall at precision >= 0.9. s/epoch: wall time of the last training epoch." in (
        table
    )

    # The numbers: the multiclass accuracy is the run's val/acc in the store; the rare class's
    # positive share is its validation split's (the config's RareDigitDataModule, seed 0).
    from mlflow.tracking import MlflowClient

    from lightning_losses.data import RareDigitDataModule

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "lightning-losses"]
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    acc = float(multiclass[2].split()[2])
    assert acc == pytest.approx(runs["digits_ce"].data.metrics["val/acc"], abs=5e-5)
    positives = float(
        RareDigitDataModule(positive_digit=0, seed=0).dataset("val").tensors[1].mean()
    )
    cells = rare[2].split()
    assert cells[2] == f"{positives:.1%}"
    pr_auc, f1, recall = (float(v) for v in cells[3:6])
    assert 0.0 <= f1 <= 1.0
    assert 0.0 <= recall <= 1.0
    assert positives <= pr_auc <= 1.0  # at least what a random scorer gets
