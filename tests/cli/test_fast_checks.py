"""A bad loss value or a misspelled key is refused before torch and Lightning are imported.

The console script's light checks (:func:`lightning_losses.cli.checks.check_command_line`)
read the ranges of :mod:`lightning_losses.loss_ranges` (the bounds the losses' own checks use)
and the argument names of the classes' source (:mod:`lightning_losses.cli.option_names`). Shown
here: in a fresh interpreter the checks raise without torch or Lightning in ``sys.modules``;
their message is the one the loss itself gives (the real constructor is the reference); the
table and the names agree with the real classes; every shipped config passes.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
from helpers.paths import CONFIGS

from lightning_losses import callbacks, data, losses
from lightning_losses.cli.checks import UsageError, check_command_line
from lightning_losses.cli.config_files import config_program
from lightning_losses.cli.option_names import (
    callback_arguments,
    classifier_arguments,
    data_arguments,
    loss_arguments,
    trainer_arguments,
)
from lightning_losses.lightning import ClassifierModule
from lightning_losses.loss_names import BUILTIN_LOSSES
from lightning_losses.loss_ranges import (
    CALLBACK_COUNTS,
    CALLBACK_RANGES,
    LOSS_RANGES,
    count_message,
    range_message,
)

BAD_END = """\
model:
  criterion:
    class_path: lightning_losses.GammaCrossEntropyLoss
trainer:
  callbacks:
    - class_path: lightning_losses.callbacks.GammaAnnealing
      init_args: {start: 0.0, end: 2.0}
"""

#: Command lines (after ``fit``) and the error the light checks give.
CASES = {
    "focal-gamma": (
        ["--config", "digits_focal", "--model.criterion.init_args.gamma=-1"],
        "model.criterion: FocalLoss: gamma must lie in [0, inf); got -1.0",
    ),
    "gamma-apart": (
        ["--config", "digits_focal", "--model.criterion.init_args.gamma", "-1"],
        "model.criterion: FocalLoss: gamma must lie in [0, inf); got -1.0",
    ),
    "label-smoothing": (
        ["--model.criterion.init_args.label_smoothing=-0.1"],  # the default config's gamma-CE
        "model.criterion: GammaCrossEntropyLoss: label_smoothing must lie in [0, 1); got -0.1",
    ),
    "by-name": (
        ["--model.criterion=binary_focal", "--model.criterion.alpha=1.5"],
        "model.criterion: BinaryFocalLoss: alpha must lie in [0, 1]; got 1.5",
    ),
    "annealing-end": (
        ["--config", "BAD_END"],
        "trainer.callbacks[0]: GammaAnnealing: end=2.0 is a value of the criterion's gamma, "
        "which GammaCrossEntropyLoss rejects: gamma must lie in [0, 1]; got 2.0",
    ),
    "callback-bins": (
        [
            "--trainer.callbacks+=lightning_losses.callbacks.CalibrationMonitor",
            "--trainer.callbacks.n_bins=0",
        ],
        "trainer.callbacks[4]: CalibrationMonitor: n_bins must be >= 1; got 0",
    ),
    "callback-real": (
        [
            "--trainer.callbacks+=lightning_losses.callbacks.AdaFocalUpdate",
            "--trainer.callbacks.init_args.lambda_=0",
        ],
        "trainer.callbacks[4]: AdaFocalUpdate: lambda_ must lie in (0, inf); got 0.0",
    ),
    "callback-folds": (
        [
            "--trainer.callbacks+=lightning_losses.callbacks.PostHocCalibration",
            "--trainer.callbacks.init_args.folds=1",
        ],
        "trainer.callbacks[4]: PostHocCalibration: folds must be >= 2; got 1",
    ),
    "callback-total": (
        [
            "--trainer.callbacks+=lightning_losses.callbacks.GammaAnnealing",
            "--trainer.callbacks.total=0",
        ],
        "trainer.callbacks[4]: GammaAnnealing: total must be >= 1; got 0",
    ),
    "callback-key": (
        [
            "--trainer.callbacks+=lightning_losses.callbacks.CalibrationMonitor",
            "--trainer.callbacks.n_bin=3",
        ],
        "--trainer.callbacks.n_bin: CalibrationMonitor has no argument 'n_bin'; did you mean "
        "n_bins?",
    ),
    "callback-key-apart": (
        [
            "--trainer.callbacks+",
            "lightning_losses.callbacks.PostHocCalibration",
            "--trainer.callbacks.init_args.fold",
            "3",
        ],
        "--trainer.callbacks.init_args.fold: PostHocCalibration has no argument 'fold'; did you "
        "mean folds?",
    ),
    "trainer-key": (
        ["--trainer.max_epoch=2"],
        "unrecognized argument --trainer.max_epoch=2; did you mean --trainer.max_epochs?",
    ),
    "model-key": (
        ["--model.hiden", "3"],
        "unrecognized argument --model.hiden 3; did you mean --model.hidden?",
    ),
    "data-key": (
        ["--config", "mnist1d_ce", "--data.init_args.num_sample=3"],
        "unrecognized argument --data.init_args.num_sample=3; did you mean "
        "--data.init_args.num_samples?",
    ),
    "loss-key": (
        ["--config=digits_focal", "--model.criterion.init_args.gama=1"],
        "--model.criterion.init_args.gama: FocalLoss has no argument 'gama'; did you mean gamma?",
    ),
}

#: Runs check_command_line on each case in a fresh interpreter; prints the messages and
#: whether torch or Lightning was imported.
PROBE = """
import json, sys
from lightning_losses.cli.checks import check_command_line
messages = {}
for name, args in json.loads(sys.argv[1]).items():
    try:
        check_command_line(["fit", *args])
        messages[name] = None
    except ValueError as error:
        messages[name] = str(error)
heavy = sorted(m for m in ("torch", "lightning", "jsonargparse", "mlflow") if m in sys.modules)
print(json.dumps({"messages": messages, "heavy": heavy}))
"""


@pytest.fixture
def cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    bad_end = tmp_path / "bad_end.yaml"
    bad_end.write_text(BAD_END)
    return {
        name: ([str(bad_end) if arg == "BAD_END" else arg for arg in args], message)
        for name, (args, message) in CASES.items()
    }


def test_errors_come_before_torch_and_lightning_are_imported(cases):
    given = json.dumps({name: args for name, (args, _) in cases.items()})
    done = subprocess.run(
        [sys.executable, "-c", PROBE, given], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["heavy"] == []  # neither torch nor Lightning (nor the parser, nor MLflow)
    assert result["messages"] == {name: message for name, (_, message) in cases.items()}


@pytest.mark.parametrize(
    ("case", "loss", "arguments"),
    [
        ("focal-gamma", losses.FocalLoss, {"gamma": -1.0}),
        ("label-smoothing", losses.GammaCrossEntropyLoss, {"label_smoothing": -0.1}),
        ("by-name", losses.BinaryFocalLoss, {"alpha": 1.5}),
        ("annealing-end", losses.GammaCrossEntropyLoss, {"gamma": 2.0}),
        ("callback-bins", callbacks.CalibrationMonitor, {"n_bins": 0}),
        ("callback-real", callbacks.AdaFocalUpdate, {"lambda_": 0.0}),
    ],
)
def test_the_message_is_the_losss_own(cases, case, loss, arguments):
    args, _ = cases[case]
    with pytest.raises(UsageError) as light:
        check_command_line(["fit", *args])
    with pytest.raises(ValueError, match=r"must (lie in|be >=)") as real:  # the reference
        loss(**arguments)
    assert str(light.value).endswith(f": {real.value}")


def _outside(bounds: dict) -> list[float]:
    """Values just outside each finite bound (the bound itself where it is open)."""
    values = []
    if "low" in bounds:
        values.append(bounds["low"] if bounds.get("low_open") else bounds["low"] - 0.5)
    if "high" in bounds:
        values.append(bounds["high"] if bounds.get("high_open") else bounds["high"] + 0.5)
    return [*values, float("nan"), float("inf")]


def _inside(bounds: dict) -> float:
    low, high = bounds.get("low"), bounds.get("high")
    if low is not None and high is not None:
        return (low + high) / 2
    return (low + 0.5) if low is not None else 0.0


@pytest.mark.parametrize("name", sorted(LOSS_RANGES))
def test_the_table_is_what_the_losses_check(name):
    """Each bound of the table, against the loss built with a value on either side of it."""
    loss = getattr(losses, BUILTIN_LOSSES[name])
    assert set(LOSS_RANGES[name]) <= set(inspect.signature(loss).parameters)
    for argument, bounds in LOSS_RANGES[name].items():
        sequence = argument in ("thresholds", "gammas")
        defaults = {"thresholds": [0.5], "gammas": [1.0, 1.0]} if sequence else {}

        def build(value, argument=argument, sequence=sequence, defaults=defaults):
            given = {argument: [value] * len(defaults[argument])} if sequence else {argument: value}
            return loss(**{**defaults, **given})

        build(_inside(bounds))  # accepted
        for value in _outside(bounds):
            with pytest.raises(ValueError, match="must lie in") as stop:
                build(value)
            assert str(stop.value) == range_message(argument, value, **bounds), (name, value)


@pytest.mark.parametrize("name", sorted({*CALLBACK_RANGES, *CALLBACK_COUNTS}))
def test_the_callback_tables_are_what_the_callbacks_check(name):
    callback = getattr(callbacks, name)
    for argument, bounds in CALLBACK_RANGES.get(name, {}).items():
        callback(**{argument: _inside(bounds)})
        for value in _outside(bounds):
            with pytest.raises(ValueError, match="must lie in") as stop:
                callback(**{argument: value})
            assert str(stop.value) == range_message(argument, value, **bounds), (name, value)
    for argument, counts in CALLBACK_COUNTS.get(name, {}).items():
        callback(**{argument: counts["low"]})
        with pytest.raises(ValueError, match="must be >=") as stop:
            callback(**{argument: counts["low"] - 1})
        assert str(stop.value) == count_message(argument, counts["low"] - 1, **counts)


def test_the_names_read_from_the_source_are_the_signatures():
    for class_name in BUILTIN_LOSSES.values():
        loss = getattr(losses, class_name)
        assert loss_arguments(class_name) == set(inspect.signature(loss).parameters), class_name
    assert classifier_arguments() == set(inspect.signature(ClassifierModule).parameters)
    assert trainer_arguments() == set(inspect.signature(L.Trainer).parameters)
    for name in ("DigitsDataModule", "RareDigitDataModule", "MNIST1DDataModule"):
        datamodule = getattr(data, name)
        assert data_arguments(name) == set(inspect.signature(datamodule).parameters), name
    for name in callbacks.__all__:
        callback = getattr(callbacks, name)
        if not isinstance(callback, type) or not issubclass(callback, L.Callback):
            continue  # the schedules: not callbacks, never --trainer.callbacks
        expected = set(inspect.signature(callback).parameters)
        assert callback_arguments(f"lightning_losses.callbacks.{name}") == expected, name


FIT_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if config_program(p) == "fit")


@pytest.mark.parametrize("config", FIT_CONFIGS, ids=[p.stem for p in FIT_CONFIGS])
def test_every_shipped_config_passes(config):
    args = ["fit", "--config", str(config), "--trainer.max_epochs=1"]
    assert check_command_line(args) == args


@pytest.mark.parametrize(
    "args",
    [
        ["--config", "digits_focal", "--model.criterion.init_args.gamma=0"],
        ["--model.criterion.init_args.gamma=1", "--model.criterion.init_args.threshold=0.2"],
        ["--model.criterion=focal", "--model.criterion.gamma=5"],
        [
            "--config",
            "digits_focal",
            "--model.criterion.class_path=my.Loss",
            "--model.criterion.init_args.gamma=-1",
        ],  # another class: its own check
        [
            "--trainer.callbacks+=lightning_losses.callbacks.GammaAnnealing",
            "--trainer.callbacks.until=50",
        ],
        ["--trainer.precision=bf16-mixed", "--model.optimizer.init_args.lr=1e12"],
        ["--model.criterion.init_args.gamma=notanumber"],  # the parser's to refuse
    ],
    ids=["zero", "in-range", "by-name", "other-class", "step-until", "other-keys", "not-a-number"],
)
def test_what_the_losses_accept_passes(args):
    assert check_command_line(["fit", *args])[0] == "fit"


def test_a_schedule_that_may_not_reach_its_end_is_left_to_the_loss(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(BAD_END.replace("end: 2.0}", "end: 2.0, until: 100000}"))  # a step count
    assert check_command_line(["fit", "--config", str(config)])[0] == "fit"
