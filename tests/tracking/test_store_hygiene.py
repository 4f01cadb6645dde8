"""What a CLI fit leaves in the MLflow store and the run folders, and what it prints.

Two ``lightning-losses fit`` processes start at once in one directory on one new SQLite store
(its tables, experiment and runs are created under a lock on the store's folder, so neither
fit fails on the other's schema creation): each run gets its own config (in its own run
folder and as its own artifact, with its own values), its own checkpoints, each stored once
as an artifact, params logged once each (no ``None`` values, no copies of the config's
``model.*`` under other names, no ``_instantiator``), and two summary lines on stdout. A
2-process DDP fit logs no "use sync_dist=True" warning for its already-reduced metrics.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from helpers.ddp import DDP_ARGS
from helpers.paths import SCRIPT
from helpers.preloaded import run_preloaded

from lightning_losses.callbacks import GammaAnnealing

pytestmark = pytest.mark.slow

QUICK = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=3",
    "--trainer.limit_val_batches=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]
ANNEALING = {"start": 0.0, "end": 1.0, "begin": 0, "until": 1.0}
CHECKPOINTS = [
    {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"monitor": "val/nll", "mode": "min"},
    },
    {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"filename": "last", "save_top_k": 1, "enable_version_counter": False},
    },
]


def write_config(path: Path, run_name: str, criterion: dict, callbacks: list[dict]) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "log_every_n_steps": 1,
            "logger": {
                "class_path": "lightning_losses.tracking.TrackingLogger",
                "init_args": {"experiment_name": "hygiene", "run_name": run_name},
            },
            "callbacks": callbacks + CHECKPOINTS,
        },
        "model": {"criterion": criterion, "hidden": [16]},
        "data": {
            "class_path": "lightning_losses.data.digits.DigitsDataModule",
            "init_args": {"batch_size": 64, "seed": 0},
        },
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start(arguments: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ}
    env.pop("MLFLOW_TRACKING_URI", None)
    env["PYTHONWARNINGS"] = "ignore"
    return subprocess.Popen(
        [str(SCRIPT), *arguments],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> tuple[str, str]:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, (out + err)[-3000:]
    return out, err


GAMMA = {"class_path": "lightning_losses.GammaCrossEntropyLoss", "init_args": {"gamma": 0.0}}
FOCAL = {"class_path": "lightning_losses.FocalLoss", "init_args": {"gamma": 2.0}}
ANNEALED = [{"class_path": "lightning_losses.callbacks.GammaAnnealing", "init_args": ANNEALING}]
MONITOR = [{"class_path": "lightning_losses.callbacks.CalibrationMonitor"}]
SWITCH = [
    {
        "class_path": "lightning_losses.callbacks.LossSwitch",
        "init_args": {"criteria": [{"name": "gamma_ce", "gamma": 0.0}, "focal"], "milestones": [1]},
    }
]
#: Pairs of names for one quantity: a run has at most one of each.
SAME_QUANTITY = [
    ("schedule/gamma", "criterion/gamma"),
    ("val/accuracy", "val/acc"),
    ("test/accuracy", "test/acc"),
]


@pytest.fixture(scope="module")
def two_fits(tmp_path_factory):
    """Two fits started at once in one folder: gamma-CE annealed (a) and focal loss (b)."""
    folder = tmp_path_factory.mktemp("two")
    configs = {
        "a": write_config(folder / "a.yaml", "a", GAMMA, ANNEALED + MONITOR),
        "b": write_config(folder / "b.yaml", "b", FOCAL, MONITOR),
    }
    processes = {
        name: start(["fit", "--config", str(path), *QUICK], folder)
        for name, path in configs.items()
    }
    outputs = {name: finish(process) for name, process in processes.items()}
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("hygiene")
    runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
    return folder, uri, client, experiment, runs, outputs


def test_both_runs_complete_with_their_own_config_and_checkpoints(two_fits):
    folder, _, client, experiment, runs, _ = two_fits
    assert sorted(runs) == ["a", "b"]
    expected = {"a": "lightning_losses.GammaCrossEntropyLoss", "b": "lightning_losses.FocalLoss"}
    for name, run in runs.items():
        assert run.info.status == "FINISHED"
        run_dir = folder / "mlflow_runs" / experiment.experiment_id / run.info.run_id
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["model"]["criterion"]["class_path"] == expected[name]
        assert config["trainer"]["logger"]["init_args"]["run_name"] == name
        stored = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(folder)))
        assert yaml.safe_load(stored.read_text()) == config
        checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
        assert checkpoints == ["epoch=0-step=3.ckpt", "last.ckpt"]
        for path in (run_dir / "checkpoints").glob("*.ckpt"):
            saved = torch.load(path, map_location="cpu", weights_only=True)
            assert saved["tracking"]["run_id"] == run.info.run_id
        stored = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
        assert stored == ["checkpoints/epoch=0-step=3.ckpt"]  # the best, once
        assert not (
            folder / "mlflow_runs" / experiment.experiment_id / "tracking-spool.jsonl"
        ).exists()
        assert not list(run_dir.glob("tracking-spool.jsonl"))  # every call reached the store
    # Nothing shared by all runs: only the run folders and the artifact store at the root.
    assert sorted(p.name for p in (folder / "mlflow_runs").iterdir()) == sorted(
        ["artifacts", experiment.experiment_id]
    )


def test_each_param_once_without_none_values(two_fits):
    _, _, _, _, runs, _ = two_fits
    for run in runs.values():
        params = run.data.params
        assert "None" not in params.values()
        assert not [k for k in params if "instantiator" in k or "/" in k or k == "ckpt_path"]
        sections = ("seed_everything", "trainer.", "model.", "data.")
        assert all(key.startswith(sections) for key in params), sorted(params)
        assert params["model.criterion.init_args.gamma"] in ("0.0", "2.0")
        # Values linked from the data (not in the config) come from the module, once.
        assert params["model.input_dim"] == "64"
        assert params["model.num_classes"] == "10"
        assert params["model.hidden.0"] == "16"


def test_module_metrics_logged_once_each(two_fits):
    _, _, client, _, runs, _ = two_fits
    for name, run in runs.items():
        metrics = run.data.metrics
        scheduled = ["criterion/gamma"] if name == "a" else []  # b's fixed gamma is a param
        assert ("criterion/gamma" in metrics) == (name == "a")
        for key in ("val/acc", "val/nll", "val/loss", "train/loss_epoch", *scheduled):
            assert key in metrics
            history = client.get_metric_history(run.info.run_id, key)
            assert len({m.step for m in history}) == len(history)  # one value per step
        for pair in SAME_QUANTITY:
            assert len(set(pair) & set(metrics)) <= 1, pair
        assert "val/ece" in metrics
        assert "val/accuracy" not in metrics  # the monitor's, once


def test_summary_lines(two_fits):
    folder, uri, _, experiment, runs, outputs = two_fits
    gamma_line = "lightning-losses fit: criterion GammaCrossEntropyLoss(gamma=0.0, threshold=0.0, "
    gamma_line += f"reduction='mean'); {GammaAnnealing(**ANNEALING).describe()}"
    focal_line = "lightning-losses fit: criterion FocalLoss(gamma=2.0, reduction='mean'); "
    focal_line += "fixed during training"
    for name, start_line in (("a", gamma_line), ("b", focal_line)):
        out, err = outputs[name]
        lines = [line for line in out.splitlines() if line.startswith("lightning-losses fit:")]
        run = runs[name]
        checkpoints = folder / "mlflow_runs" / experiment.experiment_id / run.info.run_id
        end_line = (
            f"lightning-losses fit: MLflow run {run.info.run_id} (experiment 'hygiene') in {uri}"
        )
        assert lines == [start_line, end_line]
        closing = out.splitlines()[out.splitlines().index(end_line) + 1 :]
        assert f"  checkpoints: {checkpoints / 'checkpoints'}" in closing
        assert f"  to see it: mlflow ui --backend-store-uri {uri}" in closing
        assert "lightning-losses fit:" not in err  # printed, not warned


def test_ddp_fit_warns_about_no_sync_dist(tmp_path):
    # Every callback that logs an epoch value: the monitor, the schedule per epoch, the switch.
    annealed = [{**ANNEALED[0], "init_args": {**ANNEALING, "interval": "epoch"}}]
    config = write_config(tmp_path / "ddp.yaml", "ddp", GAMMA, annealed + MONITOR + SWITCH)
    # --verbose: Lightning's lines ("GLOBAL_RANK: 1", a sync_dist warning) are not kept out.
    arguments = ["fit", "--config", str(config), *QUICK, *DDP_ARGS, "--verbose"]
    env = {
        k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PYTHONWARNINGS")
    }
    # Rank 0 forked from a warm interpreter (warnings at run time are the point, not imports).
    done = run_preloaded(arguments, cwd=tmp_path, env=env)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, (out + err)[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out + err  # a second process really ran
    assert "sync_dist" not in out + err
    starts = [line for line in out.splitlines() if line.startswith("lightning-losses fit: crit")]
    assert len(starts) == 1  # rank 0 only
