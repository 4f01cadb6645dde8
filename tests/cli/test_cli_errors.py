"""Start-up of `lightning-losses fit|test`: one-line errors with "did you mean", --version, --help.

The console script checks before Lightning is imported: an unknown loss name, a config that is
neither a file nor a shipped name, a misspelled option group, option or loss argument, a loss
value out of its range (tests/cli/test_fast_checks.py); from Python (``main``), the same
errors come from the parser and the constructors, and are one line too.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import subprocess
import sys

import lightning as L
import pytest

import lightning_losses.callbacks as callbacks_module
import lightning_losses.data as data_module
from lightning_losses import FocalLoss, register_loss, registry
from lightning_losses.cli.fit import default_config_path, main

QUICK = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=1"]

# Runs the console script's entry point as the installed script does; the last line of stdout
# says its exit status and whether Lightning was imported.
PROBE = """
import json, sys
sys.argv = ["lightning-losses", *json.loads(sys.argv[1])]
from lightning_losses.cli.console import console_main
try:
    status = console_main()
except SystemExit as stop:
    status = stop.code
print("\\nPROBE " + json.dumps({"status": status, "lightning": "lightning" in sys.modules}))
"""


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("COLUMNS", "80")  # the help's width, as in an 80-column terminal


def probe(args: list[str]) -> tuple[str, str, dict]:
    """stdout, stderr and ``{"status", "lightning"}`` of ``lightning-losses ARGS``."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out, _, last = done.stdout.rpartition("\nPROBE ")
    return out, done.stderr, json.loads(last)


def assert_one_error_line(stderr: str, command: str, *names: str) -> str:
    """The only line of ``stderr``: ``lightning-losses COMMAND: error: ...`` naming ``names``."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    [line] = lines
    assert line.startswith(f"lightning-losses {command}: error: "), line
    for name in names:
        assert name in line, (name, line)
    return line


@pytest.mark.parametrize(
    ("args", "names", "suggestion"),
    [
        (["fit", "--model.criterion=focall"], ["--model.criterion", "'focall'"], "'focal'"),
        (["test", "--model.criterion", "FocalLoss"], ["FocalLoss"], "'focal'"),
        (["fit", "--traner.max_epochs=2"], ["--traner.max_epochs"], "--trainer.max_epochs"),
        (["fit", "--config", "digits_focall"], ["--config digits_focall"], "digits_focal"),
        (["fit", "--config=nothere.yaml"], ["--config nothere.yaml", "no such file"], None),
        (
            ["fit", "--model.criterion=lightning_losses.FocalLoss"],
            ["--model.criterion.class_path=lightning_losses.FocalLoss"],
            None,
        ),
        (
            ["fit", "--model.criterion.init_args.gamma=-1"],
            ["model.criterion", "GammaCrossEntropyLoss", "gamma", "-1"],
            None,
        ),
        (["fit", "--trainer.max_epoch=2"], ["--trainer.max_epoch=2"], "--trainer.max_epochs"),
        (["fit", "--model.hiden=3"], ["--model.hiden=3"], "--model.hidden"),
        (
            ["fit", "--model.criterion.init_args.gama=1"],
            ["'gama'", "GammaCrossEntropyLoss"],
            "gamma",
        ),
    ],
    ids=[
        "loss-name",
        "loss-class-name",
        "option-group",
        "config-name",
        "missing-config",
        "loss-class-path",
        "out-of-range",
        "trainer-key",
        "model-key",
        "class-argument",
    ],
)
def test_errors_found_before_lightning_is_imported(args, names, suggestion, tmp_path):
    out, err, result = probe([*args, *QUICK])
    assert result == {"status": 2, "lightning": False}
    assert out.strip() == ""
    assert list(tmp_path.iterdir()) == []
    line = assert_one_error_line(err, args[0], *names)
    if suggestion is None:
        assert "did you mean" not in line
    else:
        assert f"did you mean {suggestion}?" in line


@pytest.mark.parametrize(
    ("args", "names", "suggestion"),
    [
        (["--model.criterion.init_args.gama=1"], ["'gama'", "GammaCrossEntropyLoss"], "gamma"),
        (["--model.criterion=focall"], ["'focall'"], "'focal'"),
        (
            [
                "--trainer.callbacks+=lightning_losses.callbacks.CalibrationMonitor",
                "--trainer.callbacks.n_bins=0",
            ],
            ["trainer.callbacks[4]", "CalibrationMonitor", "n_bins"],
            None,
        ),
    ],
    ids=["class-argument", "loss-name", "callback-value"],
)
@pytest.mark.slow
def test_python_main_reports_the_same_errors_in_one_line(args, names, suggestion, capsys):
    """From Python (no light checks first): the parser's and the constructors' one line."""
    with pytest.raises(SystemExit) as stop:
        main(["fit", *args, *QUICK])
    assert stop.value.code == 2
    line = assert_one_error_line(capsys.readouterr().err, "fit", *names)
    if suggestion is None:
        assert "did you mean" not in line
    else:
        assert f"did you mean {suggestion}?" in line


@pytest.mark.slow
def test_python_main_takes_a_registered_loss_name(monkeypatch):
    """Only the console script's light check knows just the built-in names."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # put back after
    register_loss("my_focal", FocalLoss)
    cli = main(["--config", default_config_path(), "--model.criterion=my_focal"], run=False)
    assert type(cli.model.criterion) is FocalLoss


def test_version_prints_the_installed_version_without_lightning():
    out, err, result = probe(["--version"])
    assert result == {"status": 0, "lightning": False}
    assert out.strip() == f"lightning-losses {importlib.metadata.version('lightning-losses')}"
    assert err == ""


def _fit_help(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as stop:
        main(["fit", *args, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def _package_classes(module, base: type) -> set[str]:
    return {
        f"{module.__name__}.{name}"
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, base)
        and value.__module__.startswith(module.__name__)
        and not name.startswith("_")
    }


def test_fit_help_is_short_shows_the_default_config_and_lists_the_package(capsys):
    text = _fit_help(capsys)
    assert len(text.splitlines()) < 400  # 1,483 lines before
    assert text.startswith("usage: lightning-losses fit ")
    # The defaults are those of the packaged default config, which a bare `fit` trains.
    criterion = text.split("--model.criterion CRITERION", 1)[1].split("\n  --", 1)[0]
    assert "default: GammaCrossEntropyLoss(gamma=0.0," in " ".join(criterion.split())
    assert "default: ce" not in text
    # The losses by name, not a hundred torch.nn classes.
    assert "torch.nn.Linear" not in text
    assert "torch.nn.Conv2d" not in text
    for name in ("FocalLoss", "GammaCrossEntropyLoss", "NMCategoricalCrossEntropyLoss"):
        assert f"lightning_losses.{name}" in "".join(criterion.split()), name
    for name in ("ce", "gamma_ce", "focal", "adafocal", "soft_truncated", "nm_ce"):
        assert f" {name}," in " ".join(criterion.split()) or f" {name};" in criterion, name
    # The package's callbacks and DataModules, from the modules themselves.
    callbacks = {
        f"lightning_losses.callbacks.{name}"
        for name in callbacks_module.__all__
        if inspect.isclass(getattr(callbacks_module, name))
        and issubclass(getattr(callbacks_module, name), L.Callback)
    }
    # every DataModule of the data package's submodules, by the path the package re-exports
    datamodules = _package_classes(data_module, L.LightningDataModule)
    assert {"lightning_losses.callbacks.CalibrationMonitor"} <= callbacks
    assert {"lightning_losses.data.MNIST1DDataModule"} <= datamodules
    flat = "".join(text.split())
    for name in sorted(callbacks | datamodules):
        assert name in flat, name
    # The shipped configs by name.
    assert "digits_focal," in text
    assert "lm/lm_ce" not in text  # the language model's: `lightning-losses lm fit --help`


def test_fit_help_shows_the_defaults_of_the_config_given(capsys):
    text = " ".join(_fit_help(capsys, "--config", "digits_focal").split())
    assert "default: FocalLoss(gamma=2.0," in text


def test_criterion_help_describes_a_loss_by_class_name(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--model.criterion.help", "FocalLoss"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "lightning_losses.FocalLoss" in out
    assert "--model.criterion.gamma GAMMA" in out
