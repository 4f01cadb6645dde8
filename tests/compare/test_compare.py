"""Run comparison (``lightning-losses compare``) against a small SQLite MLflow store.

Three runs are logged the way the package's MLflow logger logs them (tags, dotted params,
metric histories over several steps, reliability-diagram artifacts), plus a failed run that the
comparison leaves out. Final values are chosen to be neither the first, the smallest nor the
largest of their history, so reading any value but the last step's fails the tests.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lightning_losses import compare

EXPERIMENT = "compare-test"
START_MS = 1_700_000_000_000

# Metric histories, one value per step; the last is the final value.
FOCAL = {
    "val/acc": [0.50, 0.95, 0.90],
    "val/nll": [1.20, 0.25, 0.30],
    "val/ece": [0.20, 0.03, 0.07],
    "val/brier": [0.40, 0.12, 0.15],
    "epoch": [0.0, 1.0, 2.0],
}
GAMMA = {  # no val/brier and no epoch metric: epochs from trainer.max_epochs
    "val/acc": [0.60, 0.97, 0.93],
    "val/nll": [1.00, 0.20, 0.22],
    "val/ece": [0.15, 0.01, 0.02],
}
CE = {
    "val/acc": [0.70, 0.99, 0.96, 0.94],
    "val/nll": [0.90, 0.15, 0.18, 0.21],
    "val/ece": [0.30, 0.05, 0.09, 0.11],
    "val/brier": [0.30, 0.08, 0.09, 0.10],
    "epoch": [0.0, 1.0, 2.0, 3.0],
}
FINAL = {
    name: {key: values[-1] for key, values in history.items()}
    for name, history in {"focal-run": FOCAL, "gamma-run": GAMMA, "ce-run": CE}.items()
}

# Solid colours of the diagram images: the figure must show the latest one, not the older one.
OLD_COLOR = (1.0, 0.0, 0.0)  # calibration/val_epoch=000.png of focal-run
NEW_COLOR = (0.0, 1.0, 0.0)  # calibration/val_epoch=002.png of focal-run
GAMMA_COLOR = (0.0, 0.0, 1.0)  # calibration/val_epoch=009.png of gamma-run


def _png(path: Path, color: tuple[float, float, float]) -> Path:
    """A small solid-colour PNG (80 x 96 pixels) written with matplotlib."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(0.8, 0.96), dpi=100)
    fig.patch.set_facecolor(color)
    fig.savefig(path, dpi=100, facecolor=color)
    return path


def _log(client, run_id: str, params: dict, history: dict) -> None:
    """Log params and metric histories (step i, timestamps increasing) in one batch."""
    from mlflow.entities import Metric, Param

    metrics = [
        Metric(key, value, START_MS + 1000 * step, step)
        for key, values in history.items()
        for step, value in enumerate(values)
    ]
    client.log_batch(run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()])


@pytest.fixture(autouse=True)
def _no_http(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """A SQLite store with focal-run, gamma-run (finished), ce-run (running), one failed run."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    client.create_experiment("other-experiment", artifact_location=(root / "a0").as_uri())
    experiment_id = client.create_experiment(
        EXPERIMENT, artifact_location=(root / "artifacts").as_uri()
    )
    ids = {}

    focal = client.create_run(
        experiment_id,
        run_name="focal-run",
        start_time=START_MS,
        tags={"loss": "FocalLoss", "dataset": "DigitsDataModule", "config": "digits_focal"},
    ).info.run_id
    _log(
        client,
        focal,
        {
            "model.criterion.class_path": "lightning_losses.FocalLoss",
            "model.criterion.init_args.gamma": "2.0",
            "model.criterion.init_args.alpha": "None",
            "model.criterion.init_args.reduction": "mean",
            "model.criterion.init_args.ignore_index": "-100",
            "trainer.max_epochs": "20",
            "data.class_path": "lightning_losses.data.digits.DigitsDataModule",
        },
        FOCAL,
    )
    for name, color in (("val_epoch=000.png", OLD_COLOR), ("val_epoch=002.png", NEW_COLOR)):
        client.log_artifact(focal, str(_png(root / name, color)), artifact_path="calibration")
    client.set_terminated(focal, end_time=START_MS + 12_345)
    ids["focal-run"] = focal

    gamma = client.create_run(  # no loss / dataset tag: both from the params
        experiment_id, run_name="gamma-run", start_time=START_MS + 60_000
    ).info.run_id
    _log(
        client,
        gamma,
        {
            "model.criterion.class_path": "lightning_losses.GammaCrossEntropyLoss",
            "model.criterion.init_args.gamma": "0.5",
            "model.criterion.init_args.threshold": "0.2",
            "trainer.max_epochs": "5",
            "trainer.callbacks.0.class_path": "lightning_losses.callbacks.GammaAnnealing",
            "trainer.callbacks.0.init_args.start": "0.0",
            "trainer.callbacks.0.init_args.end": "1.0",
            "trainer.callbacks.0.init_args.begin": "0",
            "trainer.callbacks.0.init_args.until": "0.8",
            "trainer.callbacks.1.class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "data.class_path": "lightning_losses.data.digits.LongTailedDigitsDataModule",
        },
        GAMMA,
    )
    image = _png(root / "val_epoch=009.png", GAMMA_COLOR)
    client.log_artifact(gamma, str(image), artifact_path="calibration")
    client.set_terminated(gamma, end_time=START_MS + 60_000 + 3_000)
    ids["gamma-run"] = gamma

    ce = client.create_run(  # left running: no end time
        experiment_id,
        run_name="ce-run",
        tags={"loss": "CrossEntropyLoss", "dataset": "DigitsDataModule"},
    ).info.run_id
    _log(
        client,
        ce,
        {
            "model.criterion.class_path": "lightning_losses.CrossEntropyLoss",
            "model.criterion.init_args.reduction": "mean",
            "trainer.callbacks.0.class_path": "lightning_losses.callbacks.LossSwitch",
            "trainer.callbacks.0.init_args.criteria.0": "ce",
            "trainer.callbacks.0.init_args.criteria.1.class_path": "lightning_losses.FocalLoss",
            "trainer.callbacks.0.init_args.criteria.1.init_args.gamma": "2.0",
            "trainer.callbacks.0.init_args.milestones": "[10]",
        },
        CE,
    )
    ids["ce-run"] = ce

    failed = client.create_run(experiment_id, run_name="failed-run", tags={"loss": "X"})
    client.set_terminated(failed.info.run_id, status="FAILED")
    ids["failed-run"] = failed.info.run_id
    return {"uri": uri, "root": root, "ids": ids}


@pytest.fixture(scope="module")
def rows(store) -> dict[str, dict]:
    """collect_runs of the test experiment, by run name."""
    found = compare.collect_runs(EXPERIMENT, tracking_uri=store["uri"])
    return {row["run_name"]: row for row in found}


def test_collect_runs_lists_finished_and_running_runs_only(rows, store):
    assert sorted(rows) == ["ce-run", "focal-run", "gamma-run"]
    assert rows["ce-run"]["status"] == "RUNNING"
    for name, row in rows.items():
        assert row["run_id"] == store["ids"][name]


@pytest.mark.parametrize("name", ["focal-run", "gamma-run", "ce-run"])
def test_collect_runs_reads_the_last_step_of_each_metric(rows, name):
    for metric in ("val/acc", "val/nll", "val/ece", "val/brier"):
        expected = FINAL[name].get(metric)
        if expected is None:
            assert rows[name][metric] is None
        else:
            assert rows[name][metric] == pytest.approx(expected)


def test_collect_runs_loss_dataset_hparams(rows):
    focal, gamma, ce = rows["focal-run"], rows["gamma-run"], rows["ce-run"]
    assert (focal["loss"], focal["dataset"], focal["config"]) == (
        "FocalLoss",
        "DigitsDataModule",
        "digits_focal",
    )
    # Without tags: the class names at the end of the class paths.
    assert (gamma["loss"], gamma["dataset"], gamma["config"]) == (
        "GammaCrossEntropyLoss",
        "LongTailedDigitsDataModule",
        None,
    )
    assert ce["loss"] == "CrossEntropyLoss"
    # None values and reduction / ignore_index are not hyper-parameters of the loss.
    assert focal["hparams"] == "gamma=2"
    assert gamma["hparams"] == "gamma=0.5, threshold=0.2; GammaAnnealing(gamma 0->1, 0..0.8)"
    assert ce["hparams"] == "LossSwitch(ce, FocalLoss(gamma=2)@10)"


def test_collect_runs_epochs_and_wall_time(rows):
    assert rows["focal-run"]["epochs"] == 3  # last `epoch` value 2, + 1 (not max_epochs 20)
    assert rows["gamma-run"]["epochs"] == 5  # no `epoch` metric: trainer.max_epochs
    assert rows["ce-run"]["epochs"] == 4
    assert rows["focal-run"]["wall_time_s"] == pytest.approx(12.345)
    assert rows["gamma-run"]["wall_time_s"] == pytest.approx(3.0)
    running = rows["ce-run"]["wall_time_s"]  # still running: from its start to now
    assert 0.0 <= running < 600.0


def test_collect_runs_selected_ids_keep_their_order(store):
    ids = store["ids"]
    chosen = [ids["gamma-run"], ids["failed-run"], ids["focal-run"]]
    found = compare.collect_runs(EXPERIMENT, tracking_uri=store["uri"], run_ids=chosen)
    assert [row["run_id"] for row in found] == chosen
    assert found[1]["status"] == "FAILED"  # named explicitly: listed whatever its status
    with pytest.raises(ValueError, match="0123456789abcdef"):
        compare.collect_runs(
            EXPERIMENT, tracking_uri=store["uri"], run_ids=[ids["ce-run"], "0123456789abcdef"]
        )


def test_unknown_experiment_is_named_with_the_existing_ones(store):
    with pytest.raises(ValueError, match="no-such-experiment") as info:
        compare.collect_runs("no-such-experiment", tracking_uri=store["uri"])
    assert EXPERIMENT in str(info.value)
    assert "other-experiment" in str(info.value)


def test_tracking_uri_from_the_environment(store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["uri"])
    assert len(compare.collect_runs(EXPERIMENT)) == 3


def test_default_store_missing_is_an_error_and_not_created(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"mlflow\.db"):
        compare.collect_runs(EXPERIMENT)
    assert not (tmp_path / "mlflow.db").exists()


def _table_order(table: str) -> list[str]:
    """The run names of a formatted table, top to bottom."""
    return [line.split()[0] for line in table.splitlines()[2:]]


def test_format_table_sorts_by_ece(rows):
    table = compare.format_table(rows.values(), sort_by="val/ece")
    assert _table_order(table) == ["gamma-run", "focal-run", "ce-run"]  # 0.02, 0.07, 0.11
    table = compare.format_table(rows.values(), sort_by="val/ece", descending=True)
    assert _table_order(table) == ["ce-run", "focal-run", "gamma-run"]
    assert _table_order(compare.format_table(rows.values(), sort_by="acc")) == [
        "focal-run",  # 0.90
        "gamma-run",  # 0.93
        "ce-run",  # 0.94
    ]


def test_format_table_aligns_and_shows_missing_as_dash(rows):
    table = compare.format_table(rows.values(), sort_by="val/brier")
    lines = table.splitlines()
    assert len({len(line) for line in lines[:2]}) == 1  # header as wide as the rule
    # The store lists a RUNNING run beside FINISHED ones: a status column says which.
    header = ["run", "id", "status", "started", "loss", "hparams", "dataset"]
    assert lines[0].split()[:7] == header
    status = lines[0].index("status")
    statuses = {line.split()[0]: line[status:].split()[0] for line in lines[2:]}
    assert statuses == {row["run_name"]: row["status"] for row in rows.values()}
    assert set(statuses.values()) == {"FINISHED", "RUNNING"}
    assert _table_order(table)[-1] == "gamma-run"  # no val/brier: last, shown as "-"
    gamma_line = lines[-1]
    assert "0.9300" in gamma_line
    assert "0.0200" in gamma_line
    columns = lines[0].index("val/brier"), lines[0].index("val/brier") + len("val/brier")
    assert gamma_line[columns[0] : columns[1]].strip() == "-"
    for line in lines[2:]:  # right-aligned numbers: every ECE ends where its header ends
        end = lines[0].index("val/ece") + len("val/ece")
        assert line[end - 1].isdigit()
        assert line[end] == " "


def test_sort_by_unknown_column_is_an_error(rows):
    with pytest.raises(ValueError, match="cannot sort by 'bogus'"):
        compare.format_table(rows.values(), sort_by="bogus")


def test_write_csv_parses_back(rows, tmp_path):
    path = compare.write_csv(compare.sort_rows(rows.values()), tmp_path / "out" / "runs.csv")
    with path.open(newline="") as handle:
        parsed = list(csv.DictReader(handle))
    assert [row["run_name"] for row in parsed] == ["gamma-run", "focal-run", "ce-run"]
    assert list(parsed[0])[: len(compare.COLUMNS)] == list(compare.COLUMNS)
    for row in parsed:
        final = FINAL[row["run_name"]]
        for metric in ("val/acc", "val/nll", "val/ece", "val/brier"):
            if metric in final:
                assert float(row[metric]) == pytest.approx(final[metric], abs=1e-12)
            else:
                assert row[metric] == ""
    by_name = {row["run_name"]: row for row in parsed}
    assert int(by_name["focal-run"]["epochs"]) == 3
    assert float(by_name["focal-run"]["wall_time_s"]) == pytest.approx(12.345)
    assert by_name["gamma-run"]["hparams"] == rows["gamma-run"]["hparams"]


def _color_fraction(image: np.ndarray, color: tuple[float, float, float]) -> float:
    """Fraction of pixels within 2/255 of ``color``."""
    return float(np.mean(np.all(np.abs(image[..., :3] - np.array(color)) < 2 / 255, axis=-1)))


def test_comparison_figure_shows_the_latest_diagrams(rows, store, tmp_path):
    from matplotlib.image import imread

    ordered = compare.sort_rows(rows.values())  # gamma-run, focal-run, ce-run (no diagram)
    path = compare.comparison_figure(
        ordered, tmp_path / "fig" / "comparison.png", tracking_uri=store["uri"], diagrams=4
    )
    image = imread(path)
    # Two diagrams found (ce-run has none): scatter panel plus two tiles.
    width = (compare.SCATTER_WIDTH + 2 * compare.DIAGRAM_WIDTH) * compare.DPI
    assert image.shape[:2] == (round(compare.FIGURE_HEIGHT * compare.DPI), round(width))
    assert image[..., :3].std() > 0.05  # not blank
    assert _color_fraction(image, NEW_COLOR) > 0.01  # focal-run's epoch-2 diagram
    assert _color_fraction(image, GAMMA_COLOR) > 0.01
    assert _color_fraction(image, OLD_COLOR) == 0.0  # not its epoch-0 one


def test_comparison_figure_limits_the_diagrams(rows, store, tmp_path):
    from matplotlib.image import imread

    ordered = compare.sort_rows(rows.values())
    path = compare.comparison_figure(
        ordered, tmp_path / "one.png", tracking_uri=store["uri"], diagrams=1
    )
    image = imread(path)
    width = (compare.SCATTER_WIDTH + compare.DIAGRAM_WIDTH) * compare.DPI
    assert image.shape[1] == round(width)
    assert _color_fraction(image, GAMMA_COLOR) > 0.01  # the first in sort order
    assert _color_fraction(image, NEW_COLOR) == 0.0
    path = compare.comparison_figure(
        ordered, tmp_path / "0.png", tracking_uri=store["uri"], diagrams=0
    )
    assert imread(path).shape[1] == round(compare.SCATTER_WIDTH * compare.DPI)


def test_main_prints_the_table_and_writes_the_files(store, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--out", str(out)]
    assert compare.main([*argv, "--sort-by", "val/acc", "--descending", "--diagrams", "1"]) == 0
    printed = capsys.readouterr().out
    for loss in ("FocalLoss", "GammaCrossEntropyLoss", "CrossEntropyLoss"):
        assert loss in printed
    assert _table_order(printed.split("\n\n")[0]) == ["ce-run", "gamma-run", "focal-run"]
    assert str(out / "comparison.csv") in printed
    assert str(out / "comparison.png") in printed
    with (out / "comparison.csv").open(newline="") as handle:
        assert [row["run_name"] for row in csv.DictReader(handle)] == [
            "ce-run",
            "gamma-run",
            "focal-run",
        ]
    assert (out / "comparison.png").stat().st_size > 1000


def test_main_runs_option(store, tmp_path, capsys):
    ids = store["ids"]
    argv = ["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--out", str(tmp_path)]
    assert compare.main([*argv, "--diagrams", "0", "--runs", ids["focal-run"]]) == 0
    table = capsys.readouterr().out.split("\n\n")[0]
    assert _table_order(table) == ["focal-run"]


def test_main_unknown_experiment_fails_with_a_message(store, tmp_path, capsys):
    argv = ["--experiment", "nope", "--tracking-uri", store["uri"], "--out", str(tmp_path / "x")]
    assert compare.main(argv) != 0
    captured = capsys.readouterr()
    assert "nope" in captured.err
    assert EXPERIMENT in captured.err
    assert captured.out == ""
    assert not (tmp_path / "x").exists()


def test_main_experiment_without_runs(store, tmp_path, capsys):
    argv = ["--experiment", "other-experiment", "--tracking-uri", store["uri"]]
    assert compare.main([*argv, "--out", str(tmp_path / "x")]) == 1
    assert "no finished or running runs" in capsys.readouterr().err


def test_hparams_text_of_schedules():
    params = {
        "model.criterion.init_args.gammas": "[5.0, 3.0]",
        "model.criterion.init_args.thresholds.0": "0.2",
        "trainer.callbacks.0.class_path": "lightning_losses.callbacks.LossScheduler",
        "trainer.callbacks.0.init_args.attribute": "threshold",
        "trainer.callbacks.0.init_args.schedule.class_path": "x.CosineSchedule",
        "trainer.callbacks.0.init_args.schedule.init_args.start_value": "0.0",
        "trainer.callbacks.0.init_args.schedule.init_args.end_value": "0.2",
        "trainer.callbacks.0.init_args.schedule.init_args.start": "2",
        "trainer.callbacks.0.init_args.schedule.init_args.end": "8",
        "trainer.callbacks.1.class_path": "lightning_losses.callbacks.GammaAnnealing",
        "trainer.callbacks.1.init_args.shape": "cosine",
    }
    assert compare.hparams_text(params) == (
        "gammas=[5, 3], thresholds=[0.2]; LossScheduler(threshold: CosineSchedule 0->0.2, 2..8); "
        "GammaAnnealing(gamma 0->1, cosine)"
    )
    assert compare.hparams_text({}) == ""


def test_import_stays_light():
    code = (
        "import sys, lightning_losses.compare\n"
        "print(','.join(m for m in ('mlflow', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_running_wall_time_counts_to_now():
    start = time.time() * 1000.0 - 5_000.0
    assert compare._wall_time(start, None) == pytest.approx(5.0, abs=1.0)
    assert compare._wall_time(None, None) is None


def test_collect_runs_reads_a_resumed_run_as_its_resumed_fit_logged_it(tmp_path):
    """MLflow's latest value is the abandoned attempt's last step; the row is not."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'resumed.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("resumed", artifact_location=tmp_path.as_uri())
    run_id = client.create_run(experiment_id, run_name="resumed-run").info.run_id
    abandoned = {"val/acc": [0.5, 0.6, 0.7, 0.8], "val/ece": [0.4, 0.3, 0.2, 0.1]}
    abandoned["epoch"] = [0.0, 1.0, 2.0, 3.0]
    client.log_batch(
        run_id,
        metrics=[
            Metric(key, value, START_MS + step, step)
            for key, values in abandoned.items()
            for step, value in enumerate(values)
        ],
    )
    # Resumed from the checkpoint of step 2 (end of epoch 1), then stopped after epoch 2.
    client.set_tag(run_id, "resume.1", json.dumps({"step": 2, "time_ms": START_MS + 100}))
    resumed = {"val/acc": 0.65, "val/ece": 0.09, "epoch": 2.0}
    client.log_batch(
        run_id, metrics=[Metric(key, v, START_MS + 200, 2) for key, v in resumed.items()]
    )
    client.set_terminated(run_id)
    assert client.get_run(run_id).data.metrics["val/acc"] == 0.8  # MLflow's latest: stale

    [row] = compare.collect_runs("resumed", tracking_uri=uri)
    assert (row["val/acc"], row["val/ece"], row["epochs"]) == (0.65, 0.09, 3)
