"""A config saved by 0.1.0 (old class paths) fails with one line naming the new path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The shipped config's class path of 0.2.0 and the one a 0.1.0 config named.
NEW_TO_OLD = {"lightning_losses.lightning.CNN1D": "lightning_losses.backbones.CNN1D"}


@pytest.mark.slow
def test_a_config_of_0_1_0_names_where_its_class_moved(tmp_path):
    text = (ROOT / "configs" / "mnist1d_ce.yaml").read_text()
    for new, old in NEW_TO_OLD.items():
        assert new in text  # the shipped config names the new paths
        text = text.replace(new, old)
    (tmp_path / "old.yaml").write_text(text)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    done = subprocess.run(
        [sys.executable, "-m", "lightning_losses.cli.console", "fit", "--config", "old.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("lightning-losses fit: error: ")
    assert "lightning_losses.backbones.CNN1D moved to lightning_losses.lightning.CNN1D" in lines[0]
    assert "in 0.2.0: update the config" in lines[0]
    assert not list(tmp_path.glob("**/*.ckpt"))  # nothing ran
