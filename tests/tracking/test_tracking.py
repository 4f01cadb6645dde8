"""MLflow tracking against a real `mlflow server` on 127.0.0.1 (SQLite backend)."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers.console import run_console
from helpers.paths import CONFIGS
from helpers.server import Server, free_port
from helpers.warned import REPLACED, package_warns
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_losses.callbacks import CalibrationMonitor, GammaAnnealing
from lightning_losses.cli.fit import main
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.classifier import ClassifierModule
from lightning_losses.tracking import TrackingLogger, metric_history, read_spool, sync_tracking
from lightning_losses.warning import LightningLossesWarning

QUICK = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]

pytestmark = pytest.mark.usefixtures("isolated_tracking")


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def runs_of(uri, experiment="lightning-losses"):
    c = client(uri)
    found = c.get_experiment_by_name(experiment)
    return [] if found is None else c.search_runs([found.experiment_id])


def artifact_paths(uri, run_id, path=None):
    c = client(uri)
    out = []
    for item in c.list_artifacts(run_id, path):
        out.extend(artifact_paths(uri, run_id, item.path) if item.is_dir else [item.path])
    return out


@pytest.mark.slow
def test_cli_fit_records_config_metrics_diagrams_and_checkpoint(mlflow_server, tmp_path):
    text = (CONFIGS / "digits_gamma_ce_annealed.yaml").read_text()
    config = tmp_path / "digits_gamma_ce_annealed.yaml"
    config.write_text(text.replace("diagram_every_n_epochs: 0", "diagram_every_n_epochs: 1"))
    cli = main(
        [
            "fit",
            "--config",
            str(config),
            "--trainer.max_epochs=2",
            f"--trainer.logger.init_args.tracking_uri={mlflow_server.uri}",
            "--trainer.logger.init_args.experiment_name=cli-fit",
            *QUICK,
        ]
    )
    [run] = runs_of(mlflow_server.uri, "cli-fit")
    assert run.info.run_id == cli.trainer.logger.run_id
    assert run.info.status == "FINISHED"
    params, tags = run.data.params, run.data.tags
    assert params["model.criterion.class_path"] == "lightning_losses.GammaCrossEntropyLoss"
    assert params["trainer.callbacks.0.class_path"] == "lightning_losses.callbacks.GammaAnnealing"
    assert params["seed_everything"] == "0"
    assert tags["loss"] == "GammaCrossEntropyLoss"
    assert tags["dataset"] == "DigitsDataModule"
    assert tags["config"] == "digits_gamma_ce_annealed"
    c = client(mlflow_server.uri)
    steps_per_epoch = cli.trainer.num_training_batches
    ece = c.get_metric_history(run.info.run_id, "val/ece")
    assert [m.step for m in ece] == [steps_per_epoch - 1, 2 * steps_per_epoch - 1]
    assert c.get_metric_history(run.info.run_id, "schedule/gamma") == []  # one metric: ...
    gamma = c.get_metric_history(run.info.run_id, "criterion/gamma")  # ... the module's
    assert len(gamma) >= 2
    assert gamma[-1].value > gamma[0].value  # the annealed values
    assert [m.step for m in gamma] == sorted(m.step for m in gamma)
    artifacts = artifact_paths(mlflow_server.uri, run.info.run_id)
    assert "config.yaml" in artifacts
    assert {"calibration/val_epoch=000.png", "calibration/val_epoch=001.png"} <= set(artifacts)
    assert any(a.startswith("checkpoints/") and a.endswith(".ckpt") for a in artifacts)


def test_unreachable_server_fails_within_seconds():
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        TrackingLogger(tracking_uri=f"http://127.0.0.1:{port}")
    assert time.monotonic() - start < 10


class StopServerAt(Callback):
    def __init__(self, server: Server, epoch: int) -> None:
        self.server, self.epoch = server, epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            self.server.stop()


@pytest.mark.slow
def test_server_lost_mid_fit_loses_nothing(tmp_path):
    srv = Server(tmp_path / "srv")
    srv.root.mkdir()
    srv.start()
    try:
        L.seed_everything(0)
        tracking = TrackingLogger(tracking_uri=srv.uri, experiment_name="lost", save_dir="runs")
        local = CSVLogger(tmp_path, name="local")
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=3,
            logger=[tracking, local],
            log_every_n_steps=2,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[
                GammaAnnealing(),
                CalibrationMonitor(diagram_every_n_epochs=1),
                ModelCheckpoint(monitor="val/nll", save_last=True),
                StopServerAt(srv, epoch=1),
            ],
        )
        model = ClassifierModule("gamma_ce", hidden=[32])
        # The server's loss is warned about when it happens and, with the replay command, at
        # the end; GammaAnnealing replaces the criterion's gamma=0.5 (not the point here).
        with (
            package_warns("were not recorded in"),
            package_warns(REPLACED),
            pytest.warns(LightningLossesWarning, match="MLflow tracking at .* failed") as caught,
        ):
            trainer.fit(model, DigitsDataModule(batch_size=128))
        # The closing warning names the first failure and the replay command with its store.
        closing = [str(w.message) for w in caught if "were not recorded in" in str(w.message)]
        assert closing
        assert "sync-tracking" in closing[0]
        assert "--tracking-uri" in closing[0]
        assert trainer.state.finished  # the fit completed without the server
        run_id = tracking.run_id
        spool = tracking.spool_path
        assert spool.is_file()
        assert tracking.spooled > 0
        assert spool.parent == Path(trainer.checkpoint_callback.dirpath).parent  # beside them

        spooled = [
            (key, line.record["step"])
            for line in read_spool(spool.read_bytes())
            if line.record["kind"] == "metrics"
            for key in line.record["metrics"]
        ]
        assert spooled
        assert len(set(spooled)) == len(spooled)  # each (metric, step) once
        copy = spool.read_bytes()

        srv.start()
        done = sync_tracking(spool, srv.uri)  # a server: named, not taken from the spool
        assert done["metrics"] > 0
        assert done["terminate"] == 1
        assert not spool.exists()
        assert spool.with_name(spool.name + ".synced").exists()

        # Every (metric, step) the local CSV logger saw is now in the MLflow run, with its value.
        c = client(srv.uri)
        expected: dict[str, dict[int, float]] = {}
        for row in csv.DictReader((Path(local.log_dir) / "metrics.csv").open()):
            step = int(row.pop("step"))
            for key, value in row.items():
                if value:
                    expected.setdefault(key, {})[step] = float(value)
        for key, values in expected.items():
            history = {m.step: m.value for m in metric_history(c, run_id, key)}
            assert history == pytest.approx(values), key
        assert c.get_run(run_id).info.status == "FINISHED"

        # A replay killed before it removed the spool, run again, writes nothing twice.
        counts = {key: len(c.get_metric_history(run_id, key)) for key in expected}
        spool.write_bytes(copy)
        again = sync_tracking(spool, srv.uri)
        assert again["skipped"] == len(spooled)
        assert {key: len(c.get_metric_history(run_id, key)) for key in expected} == counts
        artifacts = artifact_paths(srv.uri, run_id)
        assert "calibration/val_epoch=002.png" in artifacts  # drawn while the server was down
    finally:
        srv.stop()


@pytest.mark.slow
def test_resume_continues_the_same_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/resume.db"
    config = str(CONFIGS / "digits_focal.yaml")
    common = ["--config", config, f"--trainer.logger.init_args.tracking_uri={uri}", *QUICK]
    first = main(["fit", *common, "--trainer.max_epochs=1"])
    run_id = first.trainer.logger.run_id
    last = Path(first.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    assert torch.load(last, weights_only=True)["tracking"]["run_id"] == run_id
    second = main(["fit", *common, "--trainer.max_epochs=2", f"--ckpt_path={last}"])
    assert second.trainer.logger.run_id == run_id
    assert len(runs_of(uri)) == 1
    history = client(uri).get_metric_history(run_id, "val/acc")
    steps = [m.step for m in history]
    assert len(steps) == 2
    assert steps[1] > steps[0]


@pytest.mark.slow
def test_compare_three_runs_from_the_console(mlflow_server, tmp_path):
    for name in ("digits_ce", "digits_focal", "digits_gamma_ce_threshold"):
        main(
            [
                "fit",
                "--config",
                str(CONFIGS / f"{name}.yaml"),
                "--trainer.max_epochs=1",
                f"--trainer.logger.init_args.tracking_uri={mlflow_server.uri}",
                "--trainer.logger.init_args.experiment_name=compare-three",
                *QUICK,
            ]
        )
    done = run_console(
        [
            "compare",
            "--experiment",
            "compare-three",
            "--tracking-uri",
            mlflow_server.uri,
            "--out",
            str(tmp_path / "cmp"),
        ]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for loss in ("CrossEntropyLoss", "FocalLoss", "GammaCrossEntropyLoss"):
        assert loss in done.stdout
    rows = list(csv.DictReader((tmp_path / "cmp" / "comparison.csv").open()))
    assert len(rows) == 3
    assert all(0.0 <= float(r["val/ece"]) <= 1.0 for r in rows)
    figure = tmp_path / "cmp" / "comparison.png"
    assert figure.is_file()
    assert figure.stat().st_size > 10_000
