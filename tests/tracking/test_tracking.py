"""MLflow tracking against a real `mlflow server` on 127.0.0.1 (SQLite backend)."""

from __future__ import annotations

import csv
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_losses.callbacks import CalibrationMonitor, GammaAnnealing
from lightning_losses.cli.fit import main
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.classifier import ClassifierModule
from lightning_losses.tracking import TrackingLogger, metric_history, read_spool, sync_tracking

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
MLFLOW = Path(sys.executable).with_name("mlflow")

pytestmark = pytest.mark.usefixtures("isolated_tracking")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real `mlflow server` process on 127.0.0.1, stoppable and restartable."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> None:
        command = [
            str(MLFLOW),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.root}/server.db",
            "--artifacts-destination",
            str(self.root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        log = (self.root / "server.log").open("a")
        self.process = subprocess.Popen(command, stdout=log, stderr=log, cwd=self.root)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
            if self.process.poll() is not None:
                break
        log_text = (self.root / "server.log").read_text()
        raise RuntimeError(f"mlflow server did not start:\n{log_text}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("mlflow-server"))
    srv.start()
    yield srv
    srv.stop()


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


def test_cli_fit_records_config_metrics_diagrams_and_checkpoint(server, tmp_path):
    text = (ROOT / "configs" / "digits_gamma_ce_annealed.yaml").read_text()
    config = tmp_path / "digits_gamma_ce_annealed.yaml"
    config.write_text(text.replace("diagram_every_n_epochs: 0", "diagram_every_n_epochs: 1"))
    cli = main(
        [
            "fit",
            "--config",
            str(config),
            "--trainer.max_epochs=2",
            f"--trainer.logger.init_args.tracking_uri={server.uri}",
            "--trainer.logger.init_args.experiment_name=cli-fit",
            *QUICK,
        ]
    )
    [run] = runs_of(server.uri, "cli-fit")
    assert run.info.run_id == cli.trainer.logger.run_id
    assert run.info.status == "FINISHED"
    params, tags = run.data.params, run.data.tags
    assert params["model.criterion.class_path"] == "lightning_losses.GammaCrossEntropyLoss"
    assert params["trainer.callbacks.0.class_path"] == "lightning_losses.callbacks.GammaAnnealing"
    assert params["seed_everything"] == "0"
    assert tags["loss"] == "GammaCrossEntropyLoss"
    assert tags["dataset"] == "DigitsDataModule"
    assert tags["config"] == "digits_gamma_ce_annealed"
    c = client(server.uri)
    steps_per_epoch = cli.trainer.num_training_batches
    ece = c.get_metric_history(run.info.run_id, "val/ece")
    assert [m.step for m in ece] == [steps_per_epoch - 1, 2 * steps_per_epoch - 1]
    assert c.get_metric_history(run.info.run_id, "schedule/gamma") == []  # one metric: ...
    gamma = c.get_metric_history(run.info.run_id, "criterion/gamma")  # ... the module's
    assert len(gamma) >= 2 and gamma[-1].value > gamma[0].value  # the annealed values
    assert [m.step for m in gamma] == sorted(m.step for m in gamma)
    artifacts = artifact_paths(server.uri, run.info.run_id)
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
        with pytest.warns(UserWarning, match="MLflow tracking at .* failed") as caught:
            trainer.fit(model, DigitsDataModule(batch_size=128))
        # The closing warning names the first failure and the replay command with its store.
        closing = [str(w.message) for w in caught if "were not recorded in" in str(w.message)]
        assert closing and "sync-tracking" in closing[0] and "--tracking-uri" in closing[0]
        assert trainer.state.finished  # the fit completed without the server
        run_id = tracking.run_id
        spool = tracking.spool_path
        assert spool.is_file() and tracking.spooled > 0
        assert spool.parent == Path(trainer.checkpoint_callback.dirpath).parent  # beside them

        spooled = [
            (key, line.record["step"])
            for line in read_spool(spool.read_bytes())
            if line.record["kind"] == "metrics"
            for key in line.record["metrics"]
        ]
        assert spooled and len(set(spooled)) == len(spooled)  # each (metric, step) once
        copy = spool.read_bytes()

        srv.start()
        done = sync_tracking(spool, srv.uri)  # a server: named, not taken from the spool
        assert done["metrics"] > 0 and done["terminate"] == 1
        assert not spool.exists() and spool.with_name(spool.name + ".synced").exists()

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


def test_resume_continues_the_same_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/resume.db"
    config = str(ROOT / "configs" / "digits_focal.yaml")
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
    assert len(steps) == 2 and steps[1] > steps[0]


def test_compare_three_runs_from_the_console(server, tmp_path):
    for name in ("digits_ce", "digits_focal", "digits_gamma_ce_threshold"):
        main(
            [
                "fit",
                "--config",
                str(ROOT / "configs" / f"{name}.yaml"),
                "--trainer.max_epochs=1",
                f"--trainer.logger.init_args.tracking_uri={server.uri}",
                "--trainer.logger.init_args.experiment_name=compare-three",
                *QUICK,
            ]
        )
    script = Path(sys.executable).with_name("lightning-losses")
    done = subprocess.run(
        [
            str(script),
            "compare",
            "--experiment",
            "compare-three",
            "--tracking-uri",
            server.uri,
            "--out",
            str(tmp_path / "cmp"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for loss in ("CrossEntropyLoss", "FocalLoss", "GammaCrossEntropyLoss"):
        assert loss in done.stdout
    rows = list(csv.DictReader((tmp_path / "cmp" / "comparison.csv").open()))
    assert len(rows) == 3 and all(0.0 <= float(r["val/ece"]) <= 1.0 for r in rows)
    figure = tmp_path / "cmp" / "comparison.png"
    assert figure.is_file() and figure.stat().st_size > 10_000
