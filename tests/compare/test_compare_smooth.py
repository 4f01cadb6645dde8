"""``compare`` with the smooth ECE: the optional column, sorting and the smoothed diagrams.

Two runs log ``val/smooth_ece`` (as ``CalibrationMonitor(smooth=True)`` does) and both kinds of
diagram; a third logs only the binned ECE. Their binned and smooth ECEs rank the runs in
opposite orders, so a table or figure that reads the wrong metric fails.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from lightning_losses import compare

EXPERIMENT = "compare-smooth"
START_MS = 1_700_000_000_000

HISTORIES = {  # final values: binned order a < b < c, smooth order b < a (c has none)
    "a": {"val/acc": [0.8, 0.9], "val/ece": [0.2, 0.01], "val/smooth_ece": [0.3, 0.05]},
    "b": {"val/acc": [0.7, 0.8], "val/ece": [0.1, 0.02], "val/smooth_ece": [0.2, 0.04]},
    "c": {"val/acc": [0.6, 0.7], "val/ece": [0.3, 0.03]},
}
BINNED_COLOR = (1.0, 0.0, 0.0)
SMOOTH_COLOR = (0.0, 0.0, 1.0)


def _png(path: Path, color: tuple[float, float, float]) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(0.8, 0.96), dpi=100)
    fig.savefig(path, dpi=100, facecolor=color)
    return path


@pytest.fixture(autouse=True)
def _no_http(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(EXPERIMENT, artifact_location=(root / "art").as_uri())
    for i, (name, history) in enumerate(HISTORIES.items()):
        run = client.create_run(experiment, run_name=name, start_time=START_MS + i).info.run_id
        metrics = [
            Metric(key, value, START_MS + 1000 * step, step)
            for key, values in history.items()
            for step, value in enumerate(values)
        ]
        client.log_batch(run, metrics=metrics)
        diagrams = [("val_epoch=001.png", BINNED_COLOR)]
        if "val/smooth_ece" in history:
            diagrams.append(("val_smooth_epoch=001.png", SMOOTH_COLOR))
        for file, color in diagrams:
            folder = root / name
            folder.mkdir(exist_ok=True)
            client.log_artifact(run, str(_png(folder / file, color)), artifact_path="calibration")
        client.set_terminated(run, end_time=START_MS + 5_000)
    return uri


def _order(table: str) -> list[str]:
    return [line.split()[0] for line in table.splitlines()[2:]]


def _color_fraction(image: np.ndarray, color: tuple[float, float, float]) -> float:
    return float(np.mean(np.all(np.abs(image[..., :3] - np.array(color)) < 2 / 255, axis=-1)))


def test_rows_read_the_smooth_ece(store):
    rows = {row["run_name"]: row for row in compare.collect_runs(EXPERIMENT, tracking_uri=store)}
    assert rows["a"]["val/smooth_ece"] == pytest.approx(0.05)
    assert rows["b"]["val/smooth_ece"] == pytest.approx(0.04)
    assert rows["c"]["val/smooth_ece"] is None


def test_the_smooth_column_appears_only_when_a_run_has_it():
    with_smooth = compare.format_table([{"run_name": "x", "val/smooth_ece": 0.0123}])
    assert "val/smooth_ece" in with_smooth.splitlines()[0]
    assert "0.0123" in with_smooth
    without = compare.format_table([{"run_name": "x", "val/ece": 0.02}])
    assert "smooth" not in without


def test_main_with_smooth_ece_sorts_by_it_and_shows_the_smoothed_diagrams(store, tmp_path, capsys):
    from matplotlib.image import imread

    argv = ["--experiment", EXPERIMENT, "--tracking-uri", store, "--diagrams", "2"]
    assert compare.main([*argv, "--out", str(tmp_path / "s"), "--ece", "smooth"]) == 0
    table = capsys.readouterr().out.split("\n\n")[0]
    assert "val/smooth_ece" in table.splitlines()[0]
    assert _order(table) == ["b", "a", "c"]  # by smooth ECE; c has none, so last
    image = imread(tmp_path / "s" / "comparison.png")
    assert _color_fraction(image, SMOOTH_COLOR) > 0.01
    assert _color_fraction(image, BINNED_COLOR) == 0.0
    with (tmp_path / "s" / "comparison.csv").open(newline="") as handle:
        values = {row["run_name"]: row["val/smooth_ece"] for row in csv.DictReader(handle)}
    assert float(values["b"]) == pytest.approx(0.04)
    assert values["c"] == ""

    assert compare.main([*argv, "--out", str(tmp_path / "b")]) == 0  # the default: binned
    assert _order(capsys.readouterr().out.split("\n\n")[0]) == ["a", "b", "c"]
    image = imread(tmp_path / "b" / "comparison.png")
    assert _color_fraction(image, BINNED_COLOR) > 0.01
    assert _color_fraction(image, SMOOTH_COLOR) == 0.0


def test_bad_ece_choice_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="ece must be one of 'binned', 'smooth'"):
        compare.comparison_figure([], tmp_path / "x.png", diagrams=0, ece="binnd")
    with pytest.raises(SystemExit):
        compare.build_parser().parse_args(["--ece", "binnd"])
