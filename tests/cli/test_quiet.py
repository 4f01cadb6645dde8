"""``fit``, ``test`` and ``reproduce`` print only the package's own lines unless ``--verbose``.

Lightning's info lines (seed, devices, the litlogger tip, the model summary, "fit stopped"),
its warnings (the ``LeafSpec`` deprecation), MLflow's store creation and Lightning's MLflow
logger's "Experiment ... not found. Creating it." stay out of stdout and stderr; ``--verbose``
brings them back.
"""

from __future__ import annotations

import ast
import io
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers.paths import ROOT, SCRIPT
from jsonargparse import Namespace
from mlflow.tracking import MlflowClient

from lightning_losses.cli.quiet import (
    VERBOSE_ENV,
    command_output,
    fit_output_aside,
    progress_bar_off,
    take_verbose_flag,
)

TINY = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=2",
    "--trainer.limit_test_batches=2",
]
#: What Lightning and MLflow print when they are not kept out (each seen on today's output).
CHATTER = (
    "GPU available",
    "TPU available",
    "litlogger",
    "Tip:",
    "LeafSpec",
    "Creating it",
    "LOCAL_RANK",
    "Seed set",
    "INFO mlflow",
    "stopped",
    "Test metric",
    "it/s",
    "Params",
    "UserWarning",
)
#: The package's own lines: a command's summary, and the indented lines that go on with it.
OURS = re.compile(r"^(lightning-losses (fit|test): |  [a-z][\w /-]*: )")


def run(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess:
    unset = ("MLFLOW_TRACKING_URI", "PYTHONWARNINGS", "LIGHTNING_LOSSES_VERBOSE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [str(SCRIPT), *arguments], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def assert_no_chatter(text: str) -> None:
    for line in text.splitlines():
        assert not any(word in line for word in CHATTER), line


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One tiny fit of the default config (digits) through the console script."""
    folder = tmp_path_factory.mktemp("quiet")
    uri = f"sqlite:///{folder / 'store.db'}"
    done = run(["fit", f"--trainer.logger.init_args.tracking_uri={uri}", *TINY], folder)
    assert done.returncode == 0, done.stderr[-3000:]
    [checkpoint] = (folder / "mlflow_runs").rglob("last.ckpt")
    return folder, uri, checkpoint, done


@pytest.mark.slow
def test_fit_prints_only_its_own_summary_lines(fitted):
    _, _, _, done = fitted
    assert_no_chatter(done.stdout + done.stderr)
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines, lines
    assert all(OURS.match(line) for line in lines), lines
    assert lines[0].startswith("lightning-losses fit: criterion ")


@pytest.mark.slow
def test_test_prints_one_line_with_the_metrics_it_logged(fitted):
    folder, uri, checkpoint, _ = fitted
    done = run(["test", "--ckpt_path", str(checkpoint), *TINY[3:]], folder)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    assert_no_chatter(done.stdout)
    [line] = done.stdout.splitlines()
    # The run the checkpoint was saved under holds the logged test metrics: the line says each.
    client = MlflowClient(uri)
    [run_] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    logged = {k: v for k, v in run_.data.metrics.items() if k.startswith("test/")}
    assert logged
    expected = ", ".join(f"{name} {logged[name]:.4g}" for name in sorted(logged))
    assert line == f"lightning-losses test: {expected}; MLflow run {run_.info.run_id}"
    # What the quiet output changes is not recorded as the run's configuration.
    assert "trainer.enable_progress_bar" not in run_.data.params
    assert run_.data.params.get("verbose") in (None, "True")


@pytest.mark.slow
def test_verbose_brings_lightning_output_back(fitted):
    folder, _, checkpoint, _ = fitted
    done = run(["test", "--ckpt_path", str(checkpoint), "--verbose", *TINY[3:]], folder)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GPU available" in done.stderr
    assert "Test metric" in done.stdout  # Lightning's results table, not our line
    assert "lightning-losses test:" not in done.stdout


def test_command_output_puts_levels_and_variables_back(monkeypatch):
    monkeypatch.delenv("LIGHTNING_LOSSES_VERBOSE", raising=False)
    monkeypatch.delenv("MLFLOW_LOGGING_LEVEL", raising=False)
    logger = logging.getLogger("lightning.pytorch")
    level, filters = logger.level, list(warnings.filters)
    with command_output(False):
        assert logger.level == logging.WARNING
        assert os.environ["LIGHTNING_LOSSES_VERBOSE"] == "0"  # what DDP ranks inherit
        assert os.environ["MLFLOW_LOGGING_LEVEL"] == "WARNING"
        assert warnings.filters != filters
    assert logger.level == level
    assert warnings.filters == filters
    assert "LIGHTNING_LOSSES_VERBOSE" not in os.environ
    assert "MLFLOW_LOGGING_LEVEL" not in os.environ


@pytest.mark.slow
def test_reproduce_prints_progress_lines_only(tmp_path):
    out = tmp_path / "report"
    done = run(
        [
            "reproduce",
            "--claims",
            "6",
            "--seeds",
            "1",
            "--epochs-scale",
            "0.07",  # one epoch
            "--out",
            str(out),
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'store.db'}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    assert_no_chatter(done.stdout)
    lines = done.stdout.splitlines()
    assert lines[0] == f"lightning-losses reproduce: the report goes to {out}/REPORT.md"
    progress = r"^\[(\d)/2\] claim 6 (pairwise|centered) seed 0: \w{32} \(\d+\.\d s\) ETA \d+ s$"
    assert [re.match(progress, line)[1] for line in lines[1:3]] == ["1", "2"]
    assert lines[3:] == [f"report: {out}/REPORT.md"]


def warn_from_the_package_and_the_libraries() -> None:
    """One UserWarning from each of three modules, one DeprecationWarning from each of two."""
    sources = ("lightning_losses.callbacks.adafocal", "lightning.pytorch.loops", "mlflow.store")
    for module in sources:
        warnings.warn_explicit(f"from {module}", UserWarning, "x.py", 1, module=module)
    for module in ("lightning_losses.losses", "torch.utils"):
        warnings.warn_explicit(f"old {module}", DeprecationWarning, "x.py", 2, module=module)


def test_the_package_warnings_stay_and_the_libraries_go():
    with pytest.warns((UserWarning, DeprecationWarning)) as record, command_output(False):
        warn_from_the_package_and_the_libraries()
    assert [str(w.message) for w in record] == [
        "from lightning_losses.callbacks.adafocal",
        "old lightning_losses.losses",
    ]


def test_every_warning_of_the_package_has_the_package_category():
    """Each ``warnings.warn`` / ``rank_zero_warn`` call of the source names the category.

    One category (:mod:`lightning_losses.warning`) is what pytest turns into errors and what a
    user filters; a call without it would be a plain ``UserWarning``. Read with ``ast``.
    """
    ours = {"LightningLossesWarning", "LightningLossesRuntimeWarning"}
    # The callbacks in their top-level folder (lightning_losses/callbacks links to it; glob does
    # not follow the link).
    files = sorted(ROOT.glob("lightning_losses/**/*.py")) + sorted(ROOT.glob("callbacks/*.py"))
    calls, missing = 0, []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name not in ("warnings.warn", "rank_zero_warn"):
                continue
            calls += 1
            given = [ast.unparse(node.args[1])] if len(node.args) > 1 else []
            given += [ast.unparse(k.value) for k in node.keywords if k.arg == "category"]
            if not set(given) & ours:
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls >= 10  # the source was read
    assert missing == []


def test_verbose_flag_is_taken_out_of_the_arguments(monkeypatch):
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    assert take_verbose_flag(["fit", "--trainer.max_epochs=1"]) == (
        ["fit", "--trainer.max_epochs=1"],
        False,
    )
    assert take_verbose_flag(["test", "--verbose=true", "--ckpt_path", "a"]) == (
        ["test", "--ckpt_path", "a"],
        True,
    )
    monkeypatch.setenv(VERBOSE_ENV, "1")
    assert take_verbose_flag(["fit"]) == (["fit"], True)
    assert take_verbose_flag(["fit", "--verbose", "no"]) == (["fit"], False)


def trainer_config(enable_progress_bar=None, callbacks=None):
    trainer = Namespace(enable_progress_bar=enable_progress_bar, callbacks=callbacks)
    return Namespace(trainer=trainer)


def test_progress_bar_off_but_for_fit_in_a_terminal_or_where_chosen(monkeypatch):
    assert progress_bar_off(trainer_config(), "fit")  # stdout is not a terminal here
    assert progress_bar_off(trainer_config(), "test")
    bar = Namespace(class_path="lightning.pytorch.callbacks.RichProgressBar", init_args=None)
    assert not progress_bar_off(trainer_config(enable_progress_bar=True), "fit")
    assert not progress_bar_off(trainer_config(callbacks=[bar]), "test")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    assert not progress_bar_off(trainer_config(), "fit")
    assert progress_bar_off(trainer_config(), "test")


def test_reproduce_keeps_fit_lines_out_unless_verbose(monkeypatch, capsys):
    from lightning_losses.reproduce.cli import parse_args

    assert parse_args(["--verbose"]).verbose
    assert not parse_args([]).verbose
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    with fit_output_aside():
        print("lightning-losses fit: kept out")
    monkeypatch.setenv(VERBOSE_ENV, "1")
    with fit_output_aside():
        print("lightning-losses fit: shown")
    assert capsys.readouterr().out == "lightning-losses fit: shown\n"
