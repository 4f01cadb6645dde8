"""``compare`` after two fits of one config (issue 22, item 9).

Five runs of four shipped configs are logged into a SQLite store the way the package's MLflow
logger logs them (tags, dotted params, epoch-end metric histories with their timestamps), two
of them fits of one config with identical results. The table must tell those two apart by run
id, fit in 100 columns, and report each fit's own wall time; the scatter labels of identical
and near points must overlap neither each other nor any point. The wall time is also checked
on a real fit followed by a real ``test`` of its checkpoint, which logs into the same run.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import math
import os
import pty
import select
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT

from lightning_losses import compare
from lightning_losses.compare import figure

EXPERIMENT = "first-hour"
START_MS = 1_700_000_000_000
WIDTH = 100

FOCAL = {
    "model.criterion.class_path": "lightning_losses.FocalLoss",
    "model.criterion.init_args.gamma": "2.0",
    "model.criterion.init_args.label_smoothing": "0.0",
    "model.criterion.init_args.reduction": "mean",
    "model.criterion.init_args.ignore_index": "-100",
    "data.class_path": "lightning_losses.data.digits.DigitsDataModule",
}
GAMMA_ANNEALED = {
    "model.criterion.class_path": "lightning_losses.GammaCrossEntropyLoss",
    "model.criterion.init_args.gamma": "0.0",
    "model.criterion.init_args.threshold": "0.0",
    "model.criterion.init_args.label_smoothing": "0.0",
    "trainer.callbacks.0.class_path": "lightning_losses.callbacks.GammaAnnealing",
    "trainer.callbacks.0.init_args.start": "0.0",
    "trainer.callbacks.0.init_args.end": "1.0",
    "trainer.callbacks.0.init_args.begin": "0",
    "trainer.callbacks.0.init_args.until": "1.0",
    "data.class_path": "lightning_losses.data.digits.DigitsDataModule",
}
LOSS_SWITCH = {
    "model.criterion.class_path": "lightning_losses.CrossEntropyLoss",
    "model.criterion.init_args.label_smoothing": "0.0",
    "trainer.callbacks.0.class_path": "lightning_losses.callbacks.LossSwitch",
    "trainer.callbacks.0.init_args.criteria.0": "ce",
    "trainer.callbacks.0.init_args.criteria.1.class_path": "lightning_losses.FocalLoss",
    "trainer.callbacks.0.init_args.criteria.1.init_args.gamma": "2.0",
    "trainer.callbacks.0.init_args.milestones.0": "10",
    "data.class_path": "lightning_losses.data.digits.DigitsDataModule",
}
LONGTAIL = {
    **FOCAL,
    "data.class_path": "lightning_losses.data.digits.LongTailedDigitsDataModule",
}

# (run name, loss tag, params, final val/acc, final val/ece): two fits of digits_focal with
# identical results; loss_switch's point is near theirs along x, gamma's along y.
RUNS = [
    ("digits_focal", "FocalLoss", FOCAL, 0.9, 0.05),
    ("digits_focal", "FocalLoss", FOCAL, 0.9, 0.05),
    ("digits_gamma_ce_annealed", "GammaCrossEntropyLoss", GAMMA_ANNEALED, 0.9, 0.0503),
    ("digits_loss_switch", "CrossEntropyLoss", LOSS_SWITCH, 0.9012, 0.05),
    ("longtail_focal", "FocalLoss", LONGTAIL, 0.8, 0.09),
]
EPOCHS = 3
EPOCH_MS = 1_000  # each epoch's metrics one second after the last
TEST_DELAY_MS = 60_000  # a `test` one minute after the fit, logged into the run


@pytest.fixture(autouse=True)
def _no_http(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


def _log_fit(client, run_id: str, start: int, acc: float, ece: float) -> None:
    """Epoch-end metrics of a fit: val/* then train/* and time/epoch_seconds, as the module."""
    from mlflow.entities import Metric

    metrics = []
    for epoch in range(EPOCHS):
        step, stamp = 10 * (epoch + 1) - 1, start + EPOCH_MS * (epoch + 1)
        last = epoch == EPOCHS - 1
        for key, value in {
            "val/acc": acc if last else acc - 0.1,
            "val/ece": ece if last else ece + 0.1,
            "val/nll": 0.3,
            "val/brier": 0.15,
            "epoch": float(epoch),
        }.items():
            metrics.append(Metric(key, value, stamp - 100, step))
        for key, value in {"train/loss_epoch": 0.4, "time/epoch_seconds": 0.9}.items():
            metrics.append(Metric(key, value, stamp, step))
    client.log_batch(run_id, metrics=metrics)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """The five runs; each fit lasts EPOCHS seconds, the loss_switch run is tested later."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(EXPERIMENT, artifact_location=(root / "a").as_uri())
    ids = []
    for i, (name, loss, params, acc, ece) in enumerate(RUNS):
        start = START_MS + 600_000 * i
        run_id = client.create_run(
            experiment,
            run_name=name,
            start_time=start,
            tags={"loss": loss, "dataset": params["data.class_path"].rsplit(".", 1)[1]},
        ).info.run_id
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
        _log_fit(client, run_id, start, acc, ece)
        end = start + EPOCH_MS * EPOCHS + 200
        if name == "digits_loss_switch":  # `test --ckpt_path` later logs into the same run
            tested = end + TEST_DELAY_MS
            client.log_batch(run_id, metrics=[Metric("test/acc", 0.88, tested, 0)])
            end = tested + 500
        client.set_terminated(run_id, end_time=end)
        ids.append(run_id)
    return {"uri": uri, "ids": ids}


def _printed(store: dict, out: Path, *extra: str) -> str:
    """What ``compare`` prints (standard output is not a terminal here), less its file lines."""
    argv = ["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--diagrams", "0"]
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        assert compare.main([*argv, "--out", str(out), *extra]) == 0
    return stdout.getvalue().split("\nwrote ")[0].rstrip("\n")


@pytest.fixture(scope="module")
def printed(store, tmp_path_factory) -> str:
    """``compare``'s table of the store, as printed by default."""
    return _printed(store, tmp_path_factory.mktemp("cmp"))


def test_two_fits_of_one_config_are_told_apart_by_run_id(store, printed):
    lines = printed.splitlines()
    header = lines[0].split()
    assert header[:2] == ["run", "id"]
    body = lines[2 : 2 + len(RUNS)]
    for run_id in store["ids"]:  # each run on exactly one line, named by its id's first 8
        assert [line.split()[1] for line in body].count(run_id[:8]) == 1
    focal = [line for line in body if line.split()[0] == "digits_focal"]
    assert len(focal) == 2
    assert focal[0] != focal[1]


def test_the_csv_has_every_column_with_whole_ids_and_start_times(store, tmp_path):
    from datetime import datetime

    rows = compare.collect_runs(EXPERIMENT, tracking_uri=store["uri"])
    path = compare.write_csv(rows, tmp_path / "runs.csv")
    with path.open(newline="") as handle:
        parsed = list(csv.DictReader(handle))
    assert [row["run_id"] for row in parsed] == store["ids"]  # oldest first, whole ids
    for i, row in enumerate(parsed):
        started = datetime.fromtimestamp((START_MS + 600_000 * i) / 1000.0)
        assert row["start_time"] == started.strftime("%Y-%m-%d %H:%M:%S")
        assert row["dataset"].endswith("DataModule")
        assert "label_smoothing=0" in row["hparams"]


def test_printed_table_fits_100_columns_and_names_what_all_runs_share(printed):
    for line in printed.splitlines():
        assert len(line) <= WIDTH, line
    # label_smoothing=0 is an argument of every run's loss: said once, not in each row.
    common = [line for line in printed.splitlines() if line.startswith("common:")]
    assert common
    assert "label_smoothing=0" in common[0]
    rows = printed.split("\n\n")[0]
    assert "label_smoothing" not in rows
    for _, loss, *_ in RUNS:
        assert loss in rows  # the loss names stay whole
    body = rows.splitlines()[2:]
    assert [line.split()[0] for line in body].count("digits_gamma_ce_annealed") == 1
    assert {line.split()[0] for line in body} == {name for name, *_ in RUNS}  # names whole
    assert any(cell.endswith("...") for cell in rows.split())  # long hparams are cut
    notes = " ".join(printed.split("\n\n")[1].split())
    assert "to fit 100 columns: left out" in notes
    assert "dataset" in notes
    assert "--wide" in notes
    with pytest.raises(ValueError, match="width must be >= 1; got 0"):
        compare.format_table([], width=0)
    from lightning_losses.compare import cli, table

    with contextlib.redirect_stdout(io.StringIO()):  # not a terminal
        assert cli.table_width() == WIDTH == table.DEFAULT_WIDTH == cli._DEFAULT_WIDTH


def test_wide_shows_every_column_in_full(store, tmp_path):
    printed = _printed(store, tmp_path, "--wide")
    assert max(len(line) for line in printed.splitlines()) > WIDTH
    assert "common:" not in printed
    for run_id in store["ids"]:
        assert run_id in printed  # the whole id
    header = printed.splitlines()[0].split()
    for title in ("started", "dataset", "val/brier", "epochs", "wall"):
        assert title in header
    assert "LossSwitch(ce, FocalLoss(gamma=2)@10)" in printed
    assert "LongTailedDigitsDataModule" in printed
    assert "label_smoothing=0" in printed


def test_the_table_fits_the_terminal_width(store, tmp_path, monkeypatch):
    """On a terminal (a pseudo-terminal here) the table fits its width (``COLUMNS``)."""
    master, slave = pty.openpty()
    monkeypatch.setenv("COLUMNS", "132")
    with open(slave, "w", encoding="utf-8", closefd=True) as terminal:
        monkeypatch.setattr(sys, "stdout", terminal)
        argv = ["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--diagrams", "0"]
        assert compare.main([*argv, "--out", str(tmp_path)]) == 0
        terminal.flush()
        monkeypatch.undo()
    chunks = []
    while select.select([master], [], [], 0.5)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # Linux: the other end is closed and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    lines = text.split("\nwrote ")[0].splitlines()
    assert max(len(line) for line in lines) <= 132
    assert max(len(line) for line in lines) > WIDTH  # more room, more shown
    for title in ("val/brier", "epochs"):  # left out at 100 columns, shown here
        assert title in lines[0].split()
    names = {line.split()[0] for line in lines[2 : 2 + len(RUNS)]}
    assert names == {name for name, *_ in RUNS}  # whole run names


def test_wall_time_is_the_fits_own_not_a_later_tests(store):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store["uri"])
    rows = {
        row["run_id"]: row for row in compare.collect_runs(EXPERIMENT, tracking_uri=store["uri"])
    }
    for run_id in store["ids"]:
        run = client.get_run(run_id)
        # Independent reference: the last train/ or time/ timestamp minus the run's start.
        fit_end = max(
            m.timestamp
            for key in ("train/loss_epoch", "time/epoch_seconds")
            for m in client.get_metric_history(run_id, key)
        )
        expected = (fit_end - run.info.start_time) / 1000.0
        assert expected == pytest.approx(EPOCHS * EPOCH_MS / 1000.0)  # the store as built
        assert rows[run_id]["wall_time_s"] == pytest.approx(expected)
    tested = store["ids"][3]
    run = client.get_run(tested)
    assert (run.info.end_time - run.info.start_time) / 1000.0 > 60.0  # the run's end moved


def test_wall_time_of_a_resumed_fit_leaves_out_the_pause(store, tmp_path):
    """A fit resumed into its run: each attempt's start to its last epoch end, summed."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    uri = store["uri"]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("resumed", artifact_location=tmp_path.as_uri())
    run_id = client.create_run(experiment, run_name="r", start_time=START_MS).info.run_id
    first = [START_MS + 1_000, START_MS + 2_000]  # attempt 1: epochs 0, 1, then killed
    resumed_at = START_MS + 50_000  # attempt 2 starts from the checkpoint of step 1
    second = [resumed_at + 1_500, resumed_at + 3_000]
    steps = [0, 1, 1, 2]  # the resumed attempt logs step 1 again
    epochs = zip(steps, [*first, *second], strict=True)
    client.log_batch(
        run_id, metrics=[Metric("time/epoch_seconds", 1.0, stamp, s) for s, stamp in epochs]
    )
    marker = {"step": 1, "time_ms": resumed_at, "previous_status": "KILLED"}
    client.set_tag(run_id, "resume.1", json.dumps(marker))
    client.set_terminated(run_id, end_time=resumed_at + 3_500)
    [row] = compare.collect_runs("resumed", tracking_uri=uri)
    expected = ((first[-1] - START_MS) + (second[-1] - resumed_at)) / 1000.0  # 2 s + 3 s
    assert row["wall_time_s"] == pytest.approx(expected)
    # A run without fit metrics (not logged by ClassifierModule): its start to its end.
    other = client.create_run(experiment, run_name="plain", start_time=START_MS).info.run_id
    client.log_batch(other, metrics=[Metric("val/acc", 0.5, START_MS + 10, 0)])
    client.set_terminated(other, end_time=START_MS + 7_250)
    # A run whose module logs train/ metrics but no time/epoch_seconds, tested later: those.
    custom = client.create_run(experiment, run_name="custom", start_time=START_MS).info.run_id
    client.log_batch(
        custom,
        metrics=[
            Metric("train/loss", 0.5, START_MS + 1_200, 3),
            Metric("train/loss", 0.4, START_MS + 2_400, 7),
            Metric("test/acc", 0.9, START_MS + 30_000, 0),
        ],
    )
    client.set_terminated(custom, end_time=START_MS + 31_000)
    rows = {row["run_name"]: row for row in compare.collect_runs("resumed", tracking_uri=uri)}
    assert rows["plain"]["wall_time_s"] == pytest.approx(7.25)
    assert rows["custom"]["wall_time_s"] == pytest.approx(2.4)


# --------------------------------------------------------------------------------------------
# Scatter labels of identical and near points
# --------------------------------------------------------------------------------------------


def _drawn(rows: list[dict], tiles: int):
    """The scatter panel of a comparison figure with ``tiles`` diagram tiles, drawn."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width = figure.SCATTER_WIDTH + figure.DIAGRAM_WIDTH * tiles
    fig = Figure(figsize=(width, figure.FIGURE_HEIGHT), dpi=figure.DPI, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(
        1, 1 + tiles, width_ratios=[figure.SCATTER_WIDTH] + [figure.DIAGRAM_WIDTH] * tiles
    )
    ax = fig.add_subplot(grid[0, 0])
    for i in range(tiles):
        tile = fig.add_subplot(grid[0, i + 1])
        tile.imshow(np.ones((480, 640, 3)))
        tile.set_title("digits_focal [abcdef]\nFocalLoss gamma=2", fontsize=8)
        tile.set_axis_off()
    texts = figure.draw_scatter(ax, rows)
    fig.canvas.draw()  # what savefig renders
    return fig, ax, texts


def _overlap(a, b) -> bool:
    """Whether two display boxes share area (touching edges do not)."""
    return min(a.x1, b.x1) > max(a.x0, b.x0) and min(a.y1, b.y1) > max(a.y0, b.y0)


def _marker_boxes(fig, ax) -> list:
    """The display box of every plotted marker: its centre, +- half its width (sqrt(s) pt)."""
    from matplotlib.transforms import Bbox

    boxes = []
    for collection in ax.collections:
        half = math.sqrt(collection.get_sizes()[0]) / 2 * fig.dpi / 72.0
        for x, y in ax.transData.transform(collection.get_offsets()):
            boxes.append(Bbox([[x - half, y - half], [x + half, y + half]]))
    return boxes


NEAR = [  # (run name, val/acc, val/ece): identical pairs and points closer than a label
    [("digits_focal", 0.9, 0.05), ("digits_focal", 0.9, 0.05)],
    [("a", 0.9, 0.05), ("b", 0.9, 0.05), ("c", 0.9012, 0.05), ("d", 0.9, 0.0503)],
    [("a", 0.5, 0.1), ("b", 0.5004, 0.1), ("c", 0.5008, 0.1), ("d", 0.5012, 0.1), ("e", 0.9, 0.3)],
    [("a", 0.95, 0.02), ("b", 0.95, 0.02), ("c", 0.9495, 0.02), ("d", 0.2, 0.02)],
    [  # two fits of one config, a run a label's width to the right, one far away
        ("digits_focal", 0.85, 0.05),
        ("digits_focal", 0.85, 0.05),
        ("digits_loss_switch", 0.86, 0.05),
        ("longtail_focal", 0.95, 0.1),
    ],
    [
        ("digits_focal", 0.9, 0.05),
        ("digits_focal", 0.9, 0.05),
        ("ce", 0.906, 0.0502),
        ("far", 0.95, 0.06),
    ],
]


@pytest.mark.parametrize("case", range(len(NEAR)))
@pytest.mark.parametrize("tiles", [0, 2])
def test_labels_of_identical_and_near_points_overlap_nothing(case, tiles):
    rows = [
        {"run_id": f"{i:x}" * 32, "run_name": name, "val/acc": acc, "val/ece": ece}
        for i, (name, acc, ece) in enumerate(NEAR[case])
    ]
    fig, ax, texts = _drawn(rows, tiles)
    assert ax.get_legend() is None
    assert len(texts) == len(rows)  # labelled beside the points
    renderer = fig.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in texts]
    for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2):
        assert not _overlap(a, b), (texts[i].get_text(), texts[j].get_text())
    for text, box in zip(texts, boxes, strict=True):
        for marker in _marker_boxes(fig, ax):
            assert not _overlap(box, marker), (text.get_text(), box, marker)


def test_labels_of_the_stores_runs_overlap_nothing(store):
    rows = compare.collect_runs(EXPERIMENT, tracking_uri=store["uri"])
    fig, ax, texts = _drawn(rows, 2)
    labels = [text.get_text() for text in texts]
    assert len(set(labels)) == len(RUNS)  # the two digits_focal fits: two labels
    renderer = fig.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in texts]
    markers = _marker_boxes(fig, ax)
    for a, b in itertools.combinations(boxes, 2):
        assert not _overlap(a, b)
    assert not any(_overlap(box, marker) for box in boxes for marker in markers)


# --------------------------------------------------------------------------------------------
# A real fit, then a real `test` of its checkpoint into the same run
# --------------------------------------------------------------------------------------------

QUICK = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


@pytest.mark.usefixtures("isolated_tracking")
@pytest.mark.slow
def test_wall_time_of_a_real_fit_excludes_its_later_test(tmp_path):
    from mlflow.tracking import MlflowClient

    from lightning_losses.cli.fit import main

    uri = f"sqlite:///{tmp_path / 'real.db'}"
    config = str(ROOT / "configs" / "digits_focal.yaml")
    common = ["--config", config, f"--trainer.logger.init_args.tracking_uri={uri}"]
    common.append("--trainer.logger.init_args.experiment_name=first-hour-real")
    fitted = main(["fit", *common, *QUICK])
    run_id = fitted.trainer.logger.run_id
    checkpoint = fitted.trainer.checkpoint_callback.best_model_path
    tested = main(["test", *common, "--ckpt_path", checkpoint, *QUICK[2:]])
    assert tested.trainer.logger.run_id == run_id  # the test logged into the fit's run

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    history = {key: client.get_metric_history(run_id, key) for key in run.data.metrics}
    test_keys = [key for key in history if key.startswith("test/")]
    assert test_keys
    # The fit's span, from MLflow's metric history: the run's start to the last metric that
    # only the fit logs (its training-epoch-end metrics).
    fit_keys = [key for key in history if key.startswith(("train/", "time/"))]
    fit_end = max(m.timestamp for key in fit_keys for m in history[key])
    test_start = min(m.timestamp for key in test_keys for m in history[key])
    expected = (fit_end - run.info.start_time) / 1000.0

    [row] = compare.collect_runs("first-hour-real", tracking_uri=uri)
    assert row["wall_time_s"] == pytest.approx(expected)
    assert run.info.start_time + 1000.0 * row["wall_time_s"] <= test_start
    assert row["wall_time_s"] < (run.info.end_time - run.info.start_time) / 1000.0
