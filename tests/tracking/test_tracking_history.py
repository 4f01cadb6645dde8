"""Resume keeps one consistent MLflow history per run, in the checkpoint's store and folder.

Real CLI fits on tiny budgets (4 training batches per epoch) into real SQLite stores or a real
`mlflow server`. The reference for what a resumed run's history must read is independent of
MLflow: a CSVLogger beside the TrackingLogger in each process (same metrics, same steps).
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.paths import SCRIPT
from helpers.warned import REPLACED, RETIMED, package_warns
from mlflow.tracking import MlflowClient

from lightning_losses import compare
from lightning_losses.cli.fit import main
from lightning_losses.cli.sync import sync_main
from lightning_losses.reproduce.runner import read_metrics
from lightning_losses.tracking import (
    PID_TAG,
    SPOOL_NAME,
    append_spool_record,
    metric_history,
    now_ms,
    resume_markers,
)

pytestmark = pytest.mark.usefixtures("isolated_tracking")

BATCHES = 4  # training batches per epoch: a checkpoint at step 3 is inside epoch 0


def write_config(
    path: Path, experiment: str, *, tracking_uri: str = "", csv_dir: str = "", every: int = 0
) -> Path:
    """A self-contained fit config: gamma-CE annealed over the fit, tiny budget.

    ``csv_dir`` adds a CSVLogger (the reference); ``every`` adds a checkpoint every that many
    steps (``step=N.ckpt``, all kept) beside the usual ``last.ckpt``.
    """
    uri = f"\n        tracking_uri: {tracking_uri}" if tracking_uri else ""
    loggers = [
        "    - class_path: lightning_losses.tracking.TrackingLogger\n"
        f"      init_args:\n        experiment_name: {experiment}{uri}\n"
    ]
    if csv_dir:
        loggers.append(
            "    - class_path: lightning.pytorch.loggers.CSVLogger\n"
            f"      init_args:\n        save_dir: {csv_dir}\n"
        )
    checkpoints = [
        "    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args:\n        save_last: true\n"
    ]
    if every:
        checkpoints.append(
            "    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
            f"      init_args:\n        every_n_train_steps: {every}\n"
            "        save_top_k: -1\n        filename: '{step}'\n"
        )
    path.write_text(
        "seed_everything: 0\n"
        "trainer:\n"
        "  accelerator: cpu\n  devices: 1\n  max_epochs: 3\n"
        f"  limit_train_batches: {BATCHES}\n  limit_val_batches: 2\n  log_every_n_steps: 1\n"
        "  enable_progress_bar: false\n  enable_model_summary: false\n"
        "  logger:\n" + "".join(loggers) + "  callbacks:\n"
        "    - class_path: lightning_losses.callbacks.GammaAnnealing\n"
        + "".join(checkpoints)
        + "model:\n  criterion: gamma_ce\n  hidden: [16]\n"
        "data:\n  class_path: lightning_losses.data.digits.DigitsDataModule\n"
        "  init_args:\n    batch_size: 64\n"
    )
    return path


def csv_history(folder: Path) -> dict[str, dict[int, float]]:
    """``{key: {step: value}}`` from a CSVLogger's metrics.csv (the last row of a step wins)."""
    [metrics] = folder.rglob("metrics.csv")
    history: dict[str, dict[int, float]] = {}
    with metrics.open() as handle:
        for row in csv.DictReader(handle):
            step = int(row.pop("step"))
            for key, value in row.items():
                if value != "":
                    history.setdefault(key, {})[step] = float(value)
    return history


def two_values_at_one_step(client: MlflowClient, run_id: str, key: str) -> bool:
    """Whether the raw MLflow history of ``key`` holds two different values for one step."""
    seen: dict[int, set[float]] = {}
    for metric in client.get_metric_history(run_id, key):
        seen.setdefault(metric.step, set()).add(metric.value)
    return any(len(values) > 1 for values in seen.values())


@pytest.mark.slow
def test_resume_from_an_earlier_checkpoint_reads_one_value_per_step(tmp_path):
    uri = f"sqlite:///{tmp_path}/store.db"
    first_config = tmp_path / "first.yaml"
    write_config(first_config, "resume-history", tracking_uri=uri, csv_dir="csv_first", every=3)
    with package_warns(REPLACED):  # GammaAnnealing from 0.0: gamma_ce was given gamma=0.5
        first = main(["fit", "--config", str(first_config)])  # 3 epochs: steps 0..11
    run_id = first.trainer.logger.run_id
    earlier = Path(first.trainer.checkpoint_callback.dirpath) / "step=3.ckpt"  # inside epoch 0

    # Back to step 3 with a 2-epoch budget: gamma is annealed over 8 steps instead of 12,
    # so the resumed fit logs other values for steps 3..7, and never reaches 8..11.
    resumed_config = tmp_path / "resumed.yaml"
    write_config(resumed_config, "resume-history", tracking_uri=uri, csv_dir="csv_resumed")
    before = now_ms()
    with package_warns(RETIMED), package_warns(REPLACED):
        resumed = main(
            [
                "fit",
                "--config",
                str(resumed_config),
                "--trainer.max_epochs=2",
                f"--ckpt_path={earlier}",
            ]
        )
    after = now_ms()
    assert resumed.trainer.logger.run_id == run_id

    client = MlflowClient(uri)
    first_csv, resumed_csv = (
        csv_history(tmp_path / "csv_first"),
        csv_history(tmp_path / "csv_resumed"),
    )
    assert min(step for values in resumed_csv.values() for step in values) == 3
    # What the run must read: the first process's steps before the checkpoint, then the
    # resumed process's steps (and nothing of the first process's steps 3..11).
    expected = {
        key: {step: v for step, v in first_csv.get(key, {}).items() if step < 3}
        | resumed_csv.get(key, {})
        for key in first_csv.keys() | resumed_csv.keys()
    }
    assert two_values_at_one_step(client, run_id, "criterion/gamma")  # the raw store does
    for key, values in expected.items():
        history = metric_history(client, run_id, key)
        assert [m.step for m in history] == sorted(values), key
        assert [m.value for m in history] == pytest.approx([values[s] for s in sorted(values)])

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    [marker] = resume_markers(run.data.tags)
    assert (marker.step, marker.previous_status) == (3, "FINISHED")
    assert before <= marker.time_ms <= after

    # MLflow's own "latest" value is the abandoned attempt's step 11; the readers are not.
    final_acc = resumed_csv["val/acc"][max(resumed_csv["val/acc"])]
    assert run.data.metrics["val/acc"] == pytest.approx(first_csv["val/acc"][11])
    assert run.data.metrics["val/acc"] != pytest.approx(final_acc)
    [row] = compare.collect_runs("resume-history", tracking_uri=uri)
    assert row["val/acc"] == pytest.approx(final_acc)
    assert row["epochs"] == 2
    assert f"{final_acc:.4f}" in compare.format_table([row])
    assert read_metrics(client, run_id)["val/acc"] == pytest.approx(final_acc)


@pytest.mark.slow
def test_resume_from_another_directory_continues_the_run_in_its_store(tmp_path, monkeypatch):
    first_dir, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first_dir.mkdir()
    elsewhere.mkdir()
    config = write_config(tmp_path / "fit.yaml", "moved")  # the default store: ./mlflow.db
    monkeypatch.chdir(first_dir)
    with package_warns(REPLACED):  # GammaAnnealing from 0.0: gamma_ce was given gamma=0.5
        first = main(["fit", "--config", str(config), "--trainer.max_epochs=1"])
    run_id = first.trainer.logger.run_id
    run_folder = first_dir / "mlflow_runs" / first.trainer.logger.experiment_id / run_id
    last = run_folder / "checkpoints" / "last.ckpt"
    assert last.is_file()

    monkeypatch.chdir(elsewhere)
    with package_warns(RETIMED), package_warns(REPLACED):  # 1 epoch, then 2
        resumed = main(
            ["fit", "--config", str(config), "--trainer.max_epochs=2", f"--ckpt_path={last}"]
        )
    assert resumed.trainer.logger.run_id == run_id
    assert Path(resumed.trainer.logger.save_dir) == first_dir / "mlflow_runs"
    assert sorted(elsewhere.iterdir()) == []  # no store, no run folder here
    store = f"sqlite:///{first_dir / 'mlflow.db'}"
    client = MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name("moved").experiment_id])
    assert run.info.run_id == run_id
    assert run.info.status == "FINISHED"
    steps = [m.step for m in metric_history(client, run_id, "val/acc")]
    assert steps == [BATCHES - 1, 2 * BATCHES - 1]  # one run, steps continue
    saved = sorted(p.name for p in (run_folder / "checkpoints").glob("epoch=*.ckpt"))
    assert any(name.startswith("epoch=1-") for name in saved)  # the resumed fit's checkpoint


def wait_for(condition, what: str, process: subprocess.Popen, log: Path) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` if the process ends first."""
    deadline = time.monotonic() + 300
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"{what} never happened:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.mark.slow
def test_sigkilled_fit_is_marked_killed_by_sync_and_by_its_resume(tmp_path):
    uri = f"sqlite:///{tmp_path}/store.db"
    config = write_config(tmp_path / "fit.yaml", "killed", tracking_uri=uri, every=2)
    log = tmp_path / "fit.log"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [str(SCRIPT), "fit", "--config", str(config), "--trainer.max_epochs=1000"]
    with log.open("w") as out:
        fit = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=out)

    def checkpoints() -> list[Path]:
        return sorted(tmp_path.rglob("step=*.ckpt"), key=lambda p: int(p.stem[5:]))

    wait_for(lambda: len(checkpoints()) >= 2, "a second checkpoint", fit, log)
    fit.send_signal(signal.SIGKILL)
    fit.wait()

    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    run_id = run.info.run_id
    assert run.info.status == "RUNNING"  # nobody ended it
    assert run.data.tags[PID_TAG] == str(fit.pid)

    # Had the store been unreachable, the killed fit would have left a spool: sync replays it
    # and, the run's process being gone, marks the run KILLED.
    run_folder = checkpoints()[0].parents[1]
    record = {"kind": "metrics", "metrics": {"spooled/x": 1.5}, "step": 5}
    append_spool_record(
        run_folder / SPOOL_NAME,
        {**record, "run_id": run_id, "tracking_uri": uri, "timestamp": now_ms()},
    )
    assert sync_main([str(tmp_path / "mlflow_runs")]) == 0
    assert client.get_run(run_id).info.status == "KILLED"
    assert [m.value for m in client.get_metric_history(run_id, "spooled/x")] == [1.5]

    earliest = checkpoints()[0]  # step=2.ckpt
    with package_warns(RETIMED), package_warns(REPLACED):  # 1000 epochs, then 2
        resumed = main(
            ["fit", "--config", str(config), "--trainer.max_epochs=2", f"--ckpt_path={earliest}"]
        )
    assert resumed.trainer.logger.run_id == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    [marker] = resume_markers(run.data.tags)
    assert (marker.step, marker.previous_status) == (2, "KILLED")
    assert run.data.tags[PID_TAG] == str(os.getpid())
    steps = [m.step for m in metric_history(client, run_id, "val/acc")]
    assert steps == [BATCHES - 1, 2 * BATCHES - 1]
    assert metric_history(client, run_id, "spooled/x") == []  # step 5 of the killed attempt


def test_two_resumes_leave_one_value_per_step(tmp_path):
    from mlflow.entities import Metric

    client = MlflowClient(f"sqlite:///{tmp_path}/store.db")
    run_id = client.create_run(client.create_experiment("cut")).info.run_id
    logged = [  # (step, value, timestamp) of three attempts
        *((step, 10.0 + step, 10 + step) for step in range(6)),  # steps 0..5
        *((step, 20.0 + step, 110 + step) for step in range(3, 7)),  # resumed at 3: 3..6
        (2, 32.0, 212),  # resumed at 2 (an older checkpoint): 2, 3
        (3, 33.0, 213),
        (3, 33.5, 214),  # step 3 logged twice by one attempt: the later wins
    ]
    client.log_batch(run_id, metrics=[Metric("g", v, t, s) for s, v, t in logged])
    client.set_tag(run_id, "resume.1", '{"step": 3, "time_ms": 100}')
    client.set_tag(run_id, "resume.2", '{"step": 2, "time_ms": 200}')
    history = [(m.step, m.value) for m in metric_history(client, run_id, "g")]
    assert history == [(0, 10.0), (1, 11.0), (2, 32.0), (3, 33.5)]
