"""Multi-node DDP on one machine: 2 "nodes" x 1 process, each in its own working directory.

The two commands are read from the "Running on a cluster" page (``docs/cluster.md``) and run as
written there, with a free port for ``MASTER_PORT`` and the test's folder for the page's
``/shared/node0``. The references are those of the DDP test (``helpers.references``: one
process, float64, the run's checkpoint, the whole split). Only global rank 0 may touch the
MLflow store: the other processes know their rank from the launcher's variables before the
Trainer exists.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers.ddp import RENDEZVOUS_VARIABLES, launch_env
from helpers.paths import DOCS, SCRIPT
from helpers.references import last_values, single_process_metrics
from helpers.server import free_port

from lightning_losses.lightning.classifier import ClassifierModule
from lightning_losses.tracking import (
    NOT_RANK_ZERO_URI,
    RANK_VARIABLES,
    TrackingLogger,
    client_uri,
    global_rank_zero,
)

PAGE = DOCS / "cluster.md"
#: What the page's commands name and the test replaces: node 0's folder and the port.
PAGE_FOLDER, PAGE_PORT = "/shared/node0", "29500"
#: The variables of a launch that must not leak into the nodes from the test's own process.
LAUNCH_VARIABLES = (*RANK_VARIABLES, *RENDEZVOUS_VARIABLES)


def page_commands() -> list[str]:
    """The page's command lines that start a node (``NODE_RANK=...``), continuations joined."""
    text = PAGE.read_text(encoding="utf-8").replace("\\\n", " ")
    return [" ".join(line.split()) for line in text.splitlines() if line.startswith("NODE_RANK=")]


def split_command(line: str) -> tuple[dict[str, str], list[str]]:
    """``VAR=value ... lightning-losses ARGS`` as (the variables, ARGS)."""
    words = shlex.split(line)
    variables = {}
    while re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        variables[name] = value
    assert words[0] == "lightning-losses", line
    return variables, words[1:]


def test_the_page_gives_every_node_the_same_command():
    lines = page_commands()
    assert len(lines) == 2
    commands = [split_command(line) for line in lines]
    assert [variables["NODE_RANK"] for variables, _ in commands] == ["0", "1"]
    assert all(variables["MASTER_PORT"] == PAGE_PORT for variables, _ in commands)
    assert lines[0].replace("NODE_RANK=0", "NODE_RANK=1") == lines[1]
    assert f"tracking_uri=sqlite:///{PAGE_FOLDER}/mlflow.db" in lines[0]


@pytest.fixture(scope="module")
def multinode(tmp_path_factory):
    """The page's two node commands, run at once, each in its own folder; node 0's store."""
    folder = tmp_path_factory.mktemp("multinode")
    port = str(free_port())
    base = launch_env()
    processes = []
    for index, line in enumerate(page_commands()):
        node = folder / f"node{index}"
        node.mkdir()
        variables, arguments = split_command(line.replace(PAGE_FOLDER, str(folder / "node0")))
        env = {**base, **variables, "MASTER_PORT": port}
        processes.append(
            subprocess.Popen(
                [str(SCRIPT), *arguments],
                cwd=node,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for process in processes:
            # A hang (a node that never joins) fails here instead of blocking the suite.
            outputs.append(process.communicate(timeout=300)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    for index, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"node {index}:\n{output[-3000:]}"
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{folder / 'node0'}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("lightning-losses")
    runs = client.search_runs([experiment.experiment_id])
    return folder, client, experiment, runs


@pytest.mark.slow
def test_multinode_fit_logs_one_finished_run(multinode):
    _, _, _, runs = multinode
    assert len(runs) == 1
    assert runs[0].info.status == "FINISHED"


def run_folder(multinode) -> Path:
    folder, _, experiment, [run] = multinode
    return folder / "node0" / "mlflow_runs" / experiment.experiment_id / run.info.run_id


@pytest.mark.slow
def test_multinode_val_metrics_equal_one_process_over_the_whole_split(multinode):
    _, client, _, [run] = multinode
    checkpoint = run_folder(multinode) / "checkpoints" / "last.ckpt"
    model = ClassifierModule.load_from_checkpoint(checkpoint, weights_only=True)
    logged = last_values(client, run, "val/")
    expected = {f"val/{k}": v for k, v in single_process_metrics(model, "val").items()}
    assert sorted(logged) == sorted(expected)  # every metric logged is checked
    for name, value in logged.items():
        assert value == pytest.approx(expected[name], abs=1e-6), name


@pytest.mark.slow
def test_multinode_files_are_node0s_and_node1_writes_nothing(multinode):
    folder, client, _, [run] = multinode
    files = run_folder(multinode)
    for name in (
        "config.yaml",
        "checkpoints/last.ckpt",
        "checkpoints/best-epoch=0-step=2.ckpt",
        "calibration/val_epoch=000.png",
    ):
        assert (files / name).is_file(), name
    artifacts = folder / "node0" / "mlflow_runs" / "artifacts" / run.info.run_id / "artifacts"
    assert Path(run.info.artifact_uri.removeprefix("file://")) == artifacts
    listed = {
        entry.path
        for top in client.list_artifacts(run.info.run_id)
        for entry in ([top] if not top.is_dir else client.list_artifacts(run.info.run_id, top.path))
    }
    assert listed == {
        "config.yaml",
        "checkpoints/best-epoch=0-step=2.ckpt",
        "calibration/val_epoch=000.png",
    }
    assert sorted(p.name for p in (folder / "node1").iterdir()) == []  # no mlflow.db, no files


# ----------------------------------------------------------------------------------------------
# Who touches the store: global rank 0 only, known from the launcher's variables
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", RANK_VARIABLES)
def test_global_rank_zero_reads_every_launcher_variable(name):
    assert global_rank_zero({name: "0"}) is True
    assert global_rank_zero({name: ""}) is True
    assert global_rank_zero({name: "3"}) is False
    assert global_rank_zero({**dict.fromkeys(RANK_VARIABLES, "0"), name: "1"}) is False
    with pytest.raises(ValueError, match=f"environment variable {name} must be an integer"):
        global_rank_zero({name: "first"})


def test_client_uri_keeps_the_store_for_rank_zero_only():
    uri = "sqlite:////tmp/node0/mlflow.db"
    assert client_uri(uri, {"NODE_RANK": "0", "LOCAL_RANK": "0"}) == uri
    assert client_uri(uri, {"NODE_RANK": "1", "LOCAL_RANK": "0"}) == NOT_RANK_ZERO_URI


@pytest.mark.parametrize("name", RANK_VARIABLES)
def test_a_logger_off_global_rank_zero_creates_no_store(name, tmp_path, monkeypatch):
    for variable in LAUNCH_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, "1")
    TrackingLogger()  # the default store: sqlite:///mlflow.db in the working directory
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_logger_built_off_rank_zero_opens_the_store_if_used_on_rank_zero(
    multinode, tmp_path, monkeypatch
):
    """A logger built off rank 0 and then used by rank 0 logs into the store.

    Built with a non-zero rank variable (a notebook with a stray ``NODE_RANK``), it builds its
    client on first use.
    """
    folder, client, _, _ = multinode
    uri = f"sqlite:///{folder / 'node0'}/mlflow.db"
    monkeypatch.setenv("NODE_RANK", "1")
    logger = TrackingLogger(experiment_name="built-off-rank-zero", tracking_uri=uri)
    monkeypatch.delenv("NODE_RANK")
    logger.log_metrics({"x": 1.5}, step=3)
    logger.finalize("success")
    experiment = client.get_experiment_by_name("built-off-rank-zero")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "x")
    assert [(m.step, m.value) for m in history] == [(3, 1.5)]
