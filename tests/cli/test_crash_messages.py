"""Crash messages name the file and the cause in one line (issue 24, items 7 and 8).

Real commands on tiny fits: an empty or truncated ``--ckpt_path``, a SQLite store another
process holds locked, a checkpoint save past a real file-size limit (``RLIMIT_FSIZE``: the
kernel's ``EFBIG``, as a full disk gives ``ENOSPC``), ``validate``/``test`` of a checkpoint
(logged at its ``global_step``), and ``precision=16-true`` with Adam turning the weights NaN
(checked in the module; the command's one line is in tests/cli/test_divergence.py).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers.preloaded import run_preloaded
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from mlflow.tracking import MlflowClient
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.callbacks import LastCheckpoint
from lightning_losses.callbacks.checkpoint import AtomicCheckpointIO, use_atomic_saves
from lightning_losses.cli.checks import checkpoint_problem, store_error_message
from lightning_losses.cli.fit import main
from lightning_losses.lightning.mixin import LossMixin, non_finite_message

TINY = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
]


def run_cli(args: list[str], cwd: Path, limit: int | None = None) -> subprocess.CompletedProcess:
    """``lightning-losses ARGS`` in ``cwd`` (with a file-size limit in bytes if given).

    A process of its own, forked from a warm interpreter (:mod:`helpers.preloaded`): what is
    tested is the command's end, not its start.
    """
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return run_preloaded(args, cwd=cwd, env=env, timeout=600, fsize_limit=limit)


def store_options(folder: Path) -> list[str]:
    return [
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{folder / 'mlflow.db'}",
        f"--trainer.logger.init_args.save_dir={folder / 'mlflow_runs'}",
    ]


def runs_in(uri: str) -> list:
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments) if experiments else []


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One tiny fit in this process: its folder, store URI, run id and ``last.ckpt``."""
    folder = tmp_path_factory.mktemp("fitted")
    with contextlib.chdir(folder):
        cli = main(["fit", *TINY, *store_options(folder)])
    [last] = folder.glob("mlflow_runs/*/*/checkpoints/last.ckpt")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    return SimpleNamespace(folder=folder, uri=uri, run_id=cli.trainer.logger.run_id, last=last)


# --- a checkpoint that cannot be read ----------------------------------------------------------


def torch_load_fails(path: Path) -> bool:
    """Whether ``torch.load`` raises on ``path`` (any exception: EOF, pickle, zip, OS errors)."""
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return True
    return False


@pytest.mark.slow
def test_checkpoint_problem_refuses_what_torch_load_cannot_read(fitted, tmp_path):
    data = fitted.last.read_bytes()
    for cut in (0, 1, 4, 100, len(data) // 2, len(data) - 22, len(data) - 1):
        path = tmp_path / f"cut{cut}.ckpt"
        path.write_bytes(data[:cut])
        assert checkpoint_problem(path) is not None, cut
        assert torch_load_fails(path), cut  # the reference: torch.load fails too
    assert checkpoint_problem(fitted.last) is None
    legacy = tmp_path / "legacy.ckpt"  # torch.save's pickle format is left to torch.load
    torch.save({"global_step": 3}, legacy, _use_new_zipfile_serialization=False)
    assert checkpoint_problem(legacy) is None
    assert torch.load(legacy, weights_only=True)["global_step"] == 3
    notes = tmp_path / "notes.ckpt"
    notes.write_text("hello")
    assert checkpoint_problem(notes).startswith("neither a zip archive nor a pickle")


@pytest.mark.slow
def test_a_truncated_checkpoint_is_one_line_and_creates_no_run(fitted, tmp_path):
    bad = tmp_path / "last.ckpt"
    bad.write_bytes(fitted.last.read_bytes()[:3000])
    done = run_cli(["validate", "--ckpt_path", str(bad), *store_options(tmp_path)], tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stdout == ""
    [line] = done.stderr.splitlines()  # no traceback: one line
    assert line.startswith(
        f"lightning-losses validate: error: {bad} is not a readable checkpoint (truncated or "
        "damaged: 3000 bytes of a zip archive"
    )
    assert line.endswith(
        "give --ckpt_path another one (a run's checkpoints/ folder keeps last.ckpt and the "
        "best epoch's), or fit without --ckpt_path to start afresh"
    )
    assert runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}") == []


@pytest.mark.slow
def test_an_empty_checkpoint_is_one_line_and_creates_no_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    empty = tmp_path / "epoch=3-step=40.ckpt"
    empty.touch()
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--ckpt_path", str(empty), *store_options(tmp_path)])
    assert stop.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"lightning-losses fit: error: {empty} is not a readable checkpoint (empty: 0 bytes"
    )
    assert runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}") == []


# --- a locked store ----------------------------------------------------------------------------

HOLD_LOCK = textwrap.dedent(
    """
    import sqlite3, sys
    connection = sqlite3.connect(sys.argv[1], isolation_level=None)
    connection.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    sys.stdin.read()  # hold the lock until the test closes stdin
    """
)


@pytest.mark.slow
def test_a_locked_store_is_one_line_naming_the_file(fitted, tmp_path):
    store = tmp_path / "mlflow.db"
    store.write_bytes((fitted.folder / "mlflow.db").read_bytes())  # an MLflow store with a run
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        done = run_cli(["fit", *TINY, *store_options(tmp_path)], tmp_path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "Union subtypes" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last == (
        f"lightning-losses fit: error: the MLflow store {store} is locked by another process "
        "(sqlite3.OperationalError: database is locked): wait for that process to end or stop "
        "it, or choose another store with "
        "--trainer.logger.init_args.tracking_uri=sqlite:///OTHER.db"
    )
    assert len(runs_in(f"sqlite:///{store}")) == 1  # the copied run only: none was created


def test_other_sqlite_errors_name_the_store_and_their_cause(tmp_path):
    with pytest.raises(sqlite3.OperationalError) as cause:
        sqlite3.connect(tmp_path)  # a folder is no database: a real sqlite3 error
    try:
        raise ValueError("Does not validate against any of the Union subtypes") from cause.value
    except ValueError as error:
        message = store_error_message(error, [tmp_path / "mlflow.db"])
    assert message.startswith(
        f"the MLflow store {tmp_path / 'mlflow.db'} cannot be used (sqlite3.OperationalError: "
        f"{cause.value})"
    )
    assert store_error_message(ValueError("no sqlite here"), [tmp_path]) is None


# --- a failed save -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_failed_save_leaves_no_checkpoint_and_names_it(tmp_path):
    hidden, limit = 1024, 4_000_000
    # float32 weights plus Adam's two moments of the digits MLP [64 -> 1024 -> 1024 -> 10]:
    weights = (64 * hidden + hidden) + (hidden * hidden + hidden) + (hidden * 10 + 10)
    assert 3 * 4 * weights > 3 * limit  # each checkpoint is far past the limit
    args = ["fit", *TINY, f"--model.hidden=[{hidden},{hidden}]", *store_options(tmp_path)]
    done = run_cli(args, tmp_path, limit=limit)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.splitlines()[-1]
    runs = tmp_path / "mlflow_runs"
    assert last.startswith(f"OSError: [Errno 27] could not save the checkpoint {runs}/"), last
    assert ".ckpt (File too large); nothing was written" in last
    assert sorted(tmp_path.rglob("*.ckpt")) == []  # no 0-byte, no partial checkpoint
    assert sorted(tmp_path.rglob("*.tmp")) == []


SAVE_PAST_LIMIT = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    import torch
    from lightning_losses.callbacks.checkpoint import AtomicCheckpointIO
    target = Path(sys.argv[1])
    io = AtomicCheckpointIO()
    io.save_checkpoint({"w": torch.zeros(10)}, target)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    try:
        io.save_checkpoint({"w": torch.zeros(1_000_000)}, target)
    except OSError as error:
        print(error)
    """
)


@pytest.mark.slow
def test_a_failed_save_keeps_the_earlier_checkpoint_of_that_name(tmp_path):
    target = tmp_path / "last.ckpt"
    done = subprocess.run(
        [sys.executable, "-c", SAVE_PAST_LIMIT, str(target)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(
        f"[Errno 27] could not save the checkpoint {target} (File too large); nothing was written"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left
    saved = torch.load(target, weights_only=True)  # the earlier checkpoint, whole
    assert torch.equal(saved["w"], torch.zeros(10))


def test_an_atomic_save_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        AtomicCheckpointIO().save_checkpoint({"global_step": 1}, tmp_path / "a.ckpt")
        (tmp_path / "reference").touch()  # what open() makes under the same umask
    finally:
        os.umask(old)
    assert (tmp_path / "a.ckpt").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "reference").stat().st_mode & 0o777 == 0o640


def test_atomic_saves_replace_only_lightnings_default_io(tmp_path):
    class MyIO(TorchCheckpointIO):
        pass

    options = {"logger": False, "enable_progress_bar": False, "default_root_dir": tmp_path}
    trainer = L.Trainer(**options)
    use_atomic_saves(trainer)
    assert type(trainer.strategy.checkpoint_io) is AtomicCheckpointIO
    mine = L.Trainer(plugins=[MyIO()], **options)
    use_atomic_saves(mine)
    assert type(mine.strategy.checkpoint_io) is MyIO
    with_last = L.Trainer(callbacks=[LastCheckpoint(str(tmp_path))], **options)
    with_last.checkpoint_callback.setup(with_last, nn.Linear(1, 1), "fit")
    assert type(with_last.strategy.checkpoint_io) is AtomicCheckpointIO


# --- validate and test log at the checkpoint's step --------------------------------------------


def _new_entries(client: MlflowClient, run_id: str, key: str, before: list) -> list:
    seen = {(m.step, m.timestamp, m.value) for m in before}
    history = client.get_metric_history(run_id, key)
    return [m for m in history if (m.step, m.timestamp, m.value) not in seen]


@pytest.mark.slow
def test_validate_logs_at_the_checkpoints_global_step(fitted):
    step = int(torch.load(fitted.last, weights_only=True)["global_step"])
    assert step > 0
    client = MlflowClient(fitted.uri)
    before = client.get_metric_history(fitted.run_id, "val/acc")
    done = run_cli(
        ["validate", "--ckpt_path", str(fitted.last), "--trainer.limit_val_batches=2"],
        fitted.folder,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    new = _new_entries(client, fitted.run_id, "val/acc", before)
    assert new
    assert {m.step for m in new} == {step}


@pytest.mark.slow
def test_test_logs_at_the_checkpoints_global_step(fitted):
    step = int(torch.load(fitted.last, weights_only=True)["global_step"])
    client = MlflowClient(fitted.uri)
    before = client.get_metric_history(fitted.run_id, "test/acc")
    with contextlib.chdir(fitted.folder):
        main(["test", "--ckpt_path", str(fitted.last), "--trainer.limit_test_batches=2"])
    new = _new_entries(client, fitted.run_id, "test/acc", before)
    assert new
    assert {m.step for m in new} == {step}


# --- 16-true ----------------------------------------------------------------------------------


class _Broken(LossMixin, L.LightningModule):
    """A linear classifier whose logits (``nan_logits``) or loss (``inf_loss``) go bad."""

    def __init__(self, fault: str) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.fault = fault
        if fault == "inf_loss":
            self.set_criterion(lambda logits, target: logits.sum() * 0 + float("inf"))
        else:
            self.set_criterion("ce")

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.layer(x)
        if self.fault == "nan_logits":
            logits = logits + float("nan")
        return self.compute_loss(logits, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(module: L.LightningModule, precision: str, tmp_path: Path) -> None:
    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    trainer = L.Trainer(
        precision=precision,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=tmp_path,
    )
    trainer.fit(module, DataLoader(data, batch_size=4))


@pytest.mark.parametrize(("fault", "what"), [("nan_logits", "logits"), ("inf_loss", "loss")])
def test_true_half_checks_logits_and_loss(fault, what, tmp_path):
    with pytest.raises(FloatingPointError) as stop:
        _fit(_Broken(fault), "16-true", tmp_path)
    assert str(stop.value).startswith(f"non-finite {what} (nan or inf) at global_step 0 under ")


def test_other_precisions_are_not_checked(tmp_path):
    with pytest.raises(ValueError, match="logits must be finite"):  # the loss's own check
        _fit(_Broken("nan_logits"), "32-true", tmp_path)
    _fit(_Broken("inf_loss"), "32-true", tmp_path)  # an inf loss trains on


def test_bf16_true_suggests_bf16_mixed_first():
    message = non_finite_message("loss", "bf16-true", 5)
    assert "weights and the optimizer state are bfloat16" in message
    assert message.endswith(
        "use --trainer.precision=bf16-mixed (or 16-mixed), which keeps float32 weights and "
        "computes in bfloat16"
    )
