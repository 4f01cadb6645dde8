"""One home for argument checks and for ``class_path`` objects (issue #28).

Argument checks live in :mod:`lightning_losses.functional.checks`; a ``class_path`` becomes an
object only in :mod:`lightning_losses.lightning.class_path` (jsonargparse imports it, Lightning's
``instantiate_class`` builds it). The source is read with ``ast`` for second definitions, and
the modules that used to check or import by hand are shown to raise exactly what the one home
raises, and to build what a direct construction builds.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lightning_losses import AdaFocalLoss, EXACTLoss, FocalLoss, LinearTargetLoss, NormFaceHead
from lightning_losses.calibration import (
    AURC,
    CalibrationError,
    CalibrationErrorInterval,
    SmoothCalibrationError,
    calibration_error_interval,
)
from lightning_losses.calibration import bootstrap as BS
from lightning_losses.calibration import functional as CF
from lightning_losses.calibration import smooth as SM
from lightning_losses.calibration.aurc import aurc_histogram_edges
from lightning_losses.callbacks import (
    AdaFocalUpdate,
    CalibrationMonitor,
    LinearSchedule,
    LossScheduler,
    LossSwitch,
    SplitCurves,
)
from lightning_losses.callbacks.outputs import OutputAdapter, describe_output
from lightning_losses.compare.decide import decide, t_interval
from lightning_losses.compare.table import format_table
from lightning_losses.data.digits import (
    DigitsDataModule,
    LongTailedDigitsDataModule,
    RareDigitDataModule,
)
from lightning_losses.data.mnist1d import MNIST1DDataModule
from lightning_losses.data.samplers import UnpaddedDistributedSampler
from lightning_losses.data.tensor import TensorDataModule
from lightning_losses.functional import normface_min_scale
from lightning_losses.functional.checks import (
    ArgumentTypeError,
    check_choice,
    check_fraction,
    check_int,
    check_range,
    check_real,
)
from lightning_losses.lightning import CNN1D, MLP, ClassifierModule, build_criterion
from lightning_losses.lm.data import split_topics
from lightning_losses.lm.model import TinyLanguageModel
from lightning_losses.reproduce.spec import load_experiment

ROOT = Path(__file__).resolve().parents[2]
CHECKS = "lightning_losses/functional/checks.py"
CLASS_PATH = "lightning_losses/lightning/class_path.py"

#: The files that may import a module by name: the lazy exports and the class_path helper.
IMPORTERS = {
    "lightning_losses/_lazy.py",
    CLASS_PATH,
    # the Hugging Face integration's optional dependencies (transformers, tokenizers), imported
    # when first used and named in a one-line install hint when missing: not a class_path
    "lightning_losses/integrations/huggingface/_imports.py",
}

#: A function (or method) whose name says it checks something.
CHECK_NAME = re.compile(r"^_?check(ed)?_")

#: Methods named so by a protocol: the loss modules' re-check of their current attributes,
#: which LossScheduler and LossSwitch call on any criterion; a post-hoc calibrator's statement of
#: the class counts it applies to, which PostHocCalibrator.fit and forward call on any method.
PROTOCOL = {"check_hyperparameters", "check_classes"}

#: Check functions that stay outside the checks module, by file, and why.
ALLOWED: dict[str, set[str]] = {
    # A loss family's own rules (its hyper-parameters and input forms), shared by its function
    # and its module and composed from the checks module's concepts.
    "lightning_losses/functional/adafocal.py": {"check_adafocal_bins", "check_adafocal_update"},
    # The post-hoc calibrators' one input check (logits, labels, ignore_index), shared by every
    # method's fit and by select_calibrator.
    "lightning_losses/calibration/posthoc/base.py": {"check_fit_inputs"},
    "lightning_losses/functional/binary.py": {
        "check_binary_focal",
        "check_binary_ignore_index",
        "check_pos_weight_shape",
        "check_pos_weight_values",
    },
    "lightning_losses/functional/exact.py": {
        "_check_sigma_tensor",
        "check_exact",
        "check_exact_options",
    },
    "lightning_losses/functional/linear.py": {
        "_check_token_weight",
        "_check_class_weight",
        "_check_head_shapes",
        "_check_inputs",
        "_check_target",
        "check_chunk_size",
    },
    "lightning_losses/functional/multilabel.py": {"check_nm"},
    # The conformal scores' hyper-parameters (RAPS's k_reg and lam, SAPS's weight), shared by
    # every function that scores (true labels, all labels, set statistics), composed from the
    # checks module's check_int and check_real.
    "lightning_losses/calibration/conformal/scores.py": {"check_score_hyperparameters"},
    # Claim 9's rule that a run's text is scored only under a model of the same tokenizer: a
    # check of two runs' data settings, not of an argument's value.
    "lightning_losses/reproduce/reference_scores.py": {"check_same_tokenizer"},
    # A Hugging Face model's head must compute plain hidden @ weight.T + bias logits (no
    # soft-capping or scaling in its config): a check of the model, not of an argument's value.
    "lightning_losses/integrations/huggingface/loss.py": {"check_plain_head"},
    # The kernel path's one read of the checks module's own checks (targets, finite logits,
    # class weights, AdaFocal's bins): their conditions stacked on the device and read at once,
    # the checks module's function rerun only to raise its error.
    "lightning_losses/functional/_kernel_checks.py": {"check_index_values", "check_kernel_inputs"},
    # The console's rule of which command runs a shipped config (fit or lm): a command-line
    # check of config names, not of a function's arguments.
    "lightning_losses/cli/config_files.py": {"_check_program", "check_config_programs"},
    "lightning_losses/functional/target_probability.py": {
        "check_adaptive_focal",
        "check_cross_entropy",
        "check_focal",
        "check_gamma_ce",
        "check_hard_truncated",
        "check_no_label_smoothing",
        "check_poly1",
    },
    "lightning_losses/functional/truncation.py": {"check_soft_truncated"},
    # MNIST-1D's relations between its arguments: counts mnist1d can split per class, one seed
    # per generated split, split sizes that leave sequences for every split.
    "lightning_losses/data/mnist1d.py": {
        "_check_new_seed",
        "_check_per_class_count",
        "_checked_sizes",
    },
    # The console checks a command line before torch and Lightning are imported (it imports
    # the standard library only): options and their spelling, not Python arguments.
    "lightning_losses/cli/checks.py": {"_check_criterion", "_check_group", "check_command_line"},
    # Probes of a tracking server or store, not argument checks.
    "lightning_losses/tracking/uri.py": {"check_reachable", "check_store"},
    # The schedules' own concept, a boundary of training (an int count or a fraction), and the
    # order of two boundaries; shared by the schedules and LossScheduler.
    "callbacks/schedules.py": {"check_boundary", "check_order"},
    # LossScheduler's rules: its scope lists, the scheduled attribute of the criterion, and
    # the schedule's values against the criterion's own check_hyperparameters.
    "callbacks/loss_scheduler.py": {"_check_attribute", "_check_scope", "_check_values"},
    # Checks of data, not of arguments: batches against the monitor's task, the diagram's bin
    # arrays, the calibrators' logits, the bootstrap's sample positions, the calibration
    # functions' inputs by task and format, runs paired by seed, values to compare.
    "callbacks/calibration.py": {"_check_probabilities", "_check_targets"},
    "lightning_losses/calibration/bootstrap.py": {"_checked_index"},
    "lightning_losses/calibration/diagram.py": {"_check_bins"},
    "lightning_losses/calibration/posthoc/temperature.py": {
        "_check_inputs",
        "_check_shapes",
        "_check_soft_shape",
        "_checked_target",
    },
    "lightning_losses/calibration/functional.py": {
        "_check_preds_values",
        "_check_target_values",
        "_check_values",
    },
    "lightning_losses/compare/groups.py": {"_check_pairs"},
    "lightning_losses/compare/decide.py": {"_check_values"},
}

#: Argument checks that duplicate the checks module's concepts, waiting to be folded into it:
#: none are left (the calibration, compare, reproduce, lm and callback checks call it).
PENDING: dict[str, set[str]] = {}

#: Names that modules bind to a check of the checks module with the argument's name (and range)
#: fixed, ``check_<argument> = partial(<check>, "<argument>", ...)``, for their many callers.
BINDINGS = {
    "lightning_losses/calibration/functional.py": {"check_n_bins"},
    "lightning_losses/calibration/bootstrap.py": {
        "check_level",
        "check_n_bootstrap",
        "check_n_groups",
        "check_seed",
    },
    "lightning_losses/calibration/smooth.py": {"check_bandwidth"},
}


def _sources() -> Iterator[tuple[str, ast.Module]]:
    """Each package source file once (``lightning_losses/callbacks`` links to ``callbacks/``)."""
    for top in ("lightning_losses", "callbacks"):
        for folder, _, files in os.walk(ROOT / top):  # links to folders are not followed
            for name in sorted(files):
                if name.endswith(".py"):
                    path = Path(folder) / name
                    yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def _imports_by_name(tree: ast.Module) -> list[int]:
    """Lines that import a module named at run time (``import_module``, ``__import__``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "import_module":
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in ("import_module", "__import__"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "importlib":
            if any(alias.name == "import_module" for alias in node.names):
                lines.append(node.lineno)
    return lines


def test_the_source_is_read():
    files = dict(_sources())
    assert CHECKS in files
    assert CLASS_PATH in files
    assert "callbacks/outputs.py" in files
    assert not [name for name in files if name.startswith("lightning_losses/callbacks/")]


def test_modules_are_imported_by_name_only_in_the_lazy_exports_and_the_class_path_helper():
    found = {
        path: lines
        for path, tree in _sources()
        if path not in IMPORTERS and (lines := _imports_by_name(tree))
    }
    assert found == {}, f"import a class_path with lightning_losses.lightning.class_path: {found}"


def test_argument_checks_are_defined_only_in_the_checks_module():
    extra = {}
    for path, tree in _sources():
        if path == CHECKS:
            continue
        allowed = ALLOWED.get(path, set()) | PENDING.get(path, set()) | PROTOCOL
        names = {
            node.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and CHECK_NAME.match(node.name)
            and node.name not in allowed
        }
        if names:
            extra[path] = sorted(names)
    assert extra == {}, f"use (or extend) lightning_losses.functional.checks: {extra}"


def _imported_from_checks(tree: ast.Module) -> set[str]:
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "lightning_losses.functional.checks"
        for alias in node.names
    }


def _binds_a_check(name: str, value: ast.expr, checks: set[str]) -> bool:
    """Whether ``value`` is ``partial(<check>, "<argument>", ...)``, named ``check_<argument>``."""
    if not isinstance(value, ast.Call) or len(value.args) < 2:
        return False
    function, check, argument = value.func, value.args[0], value.args[1]
    named_partial = (isinstance(function, ast.Name) and function.id == "partial") or (
        isinstance(function, ast.Attribute) and function.attr == "partial"
    )
    return (
        named_partial
        and isinstance(check, ast.Name)
        and check.id in checks
        and isinstance(argument, ast.Constant)
        and name == f"check_{argument.value}"
    )


def test_check_names_bound_outside_the_checks_module_are_its_checks():
    bound: dict[str, set[str]] = {}
    for path, tree in _sources():
        if path == CHECKS:
            continue
        checks = _imported_from_checks(tree)
        for node in tree.body:  # module-level names
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Name) and CHECK_NAME.match(target.id):
                    ok = _binds_a_check(target.id, value, checks)
                    bound.setdefault(path, set()).add(target.id if ok else f"{target.id} (own)")
    assert bound == BINDINGS
    assert isinstance(BS.check_level, functools.partial)
    assert (BS.check_level.func, BS.check_level.args) == (check_fraction, ("level",))


# --- the concepts, against rules written out here -------------------------------------------


@pytest.mark.parametrize(
    ("value", "low", "high", "optional", "accepted"),
    [
        (1, 1, None, False, True),
        (0, 1, None, False, False),
        (2**32 - 1, 0, 2**32 - 1, False, True),
        (2**32, 0, 2**32 - 1, False, False),
        (-1, None, 5, False, True),
        (6, None, 5, False, False),
        (np.int64(3), 0, 9, False, True),
        (3.0, 0, 9, False, False),  # an integral float is not an int
        (True, 0, 9, False, False),  # nor is a bool
        ("3", 0, 9, False, False),
        (None, 0, None, False, False),
        (None, 0, None, True, True),
    ],
)
def test_check_int(value, low, high, optional, accepted):
    if accepted:
        result = check_int("n", value, low=low, high=high, optional=optional)
        assert result == value
        assert result is None or type(result) is int
        return
    with pytest.raises((TypeError, ValueError)) as error:
        check_int("n", value, low=low, high=high)
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    assert isinstance(error.value, ArgumentTypeError) == (not is_int)
    got = f"got {value!r}" if is_int else f"got {value!r} ({type(value).__name__})"
    assert str(error.value).startswith("n must be ")
    assert str(error.value).endswith(got)


@pytest.mark.parametrize(
    ("value", "accepted"),
    [(0.5, True), (1e-9, True), (0.0, False), (1.0, False), (math.nan, False), (-0.5, False)],
)
def test_check_fraction(value, accepted):
    if accepted:
        check_fraction("share", value)
    else:
        with pytest.raises(ValueError, match=r"^share must lie in \(0, 1\); got "):
            check_fraction("share", value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(2, 2.0), (np.float32(0.5), 0.5), (-1e300, -1e300), (math.inf, None), ("1", None)],
)
def test_check_real(value, expected):
    if expected is not None:
        assert check_real("v", value) == expected
        assert type(check_real("v", value)) is float
    else:
        with pytest.raises(ValueError, match=f"^v must be a finite real number; got {value!r}$"):
            check_real("v", value)


@pytest.mark.parametrize(
    ("value", "optional", "accepted"),
    [
        (0.5, False, True),
        (0.001, False, True),  # the bound itself (closed)
        (3, False, True),
        (np.float32(0.25), True, True),
        (0.0009, False, False),
        (-1.0, True, False),
        (math.inf, False, False),  # [0.001, inf) excludes inf
        (math.nan, True, False),
        (None, True, True),
        (None, False, False),
        ("0.1", True, False),
        (True, True, False),
    ],
)
def test_check_real_with_a_bound(value, optional, accepted):
    if accepted:
        result = check_real("b", value, low=0.001, optional=optional)
        assert result == (None if value is None else float(value))
        assert result is None or type(result) is float
        return
    with pytest.raises((TypeError, ValueError)) as error:
        check_real("b", value, low=0.001, optional=optional)
    is_real = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    assert isinstance(error.value, ArgumentTypeError) == (not is_real)
    either = "be None or " if optional else ""
    assert str(error.value) == f"b must {either}lie in [0.001, inf); got {value!r}"


def test_check_fraction_returns_a_float_and_quotes_an_example():
    value = check_fraction("level", np.float32(0.5))
    assert (value, type(value)) == (0.5, float)
    with pytest.raises(ValueError, match=r"^level must lie in \(0, 1\), e\.g\. 0\.95; got 1$"):
        check_fraction("level", 1, example="0.95")
    with pytest.raises(TypeError, match=r"^level must lie in \(0, 1\), e\.g\. 0\.95; got '0\.5'$"):
        check_fraction("level", "0.5", example="0.95")


def test_a_type_error_is_both_kinds():
    # The data modules raised ValueError for a float count, the samplers TypeError: one error
    # keeps both callers' handlers (as jsonargparse's ImportDenied is an ImportError and a
    # ValueError).
    assert issubclass(ArgumentTypeError, TypeError)
    assert issubclass(ArgumentTypeError, ValueError)


# --- the modules raise what the one home raises -----------------------------------------------


def _tensor_module_with_task(task: str) -> Any:
    return TensorDataModule("unused.npz", task=task)


ONE_HOME: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
    ("MLP input_dim", lambda: MLP(0), lambda: check_int("input_dim", 0, low=1)),
    ("MLP hidden", lambda: MLP(4, hidden=[8, 0]), lambda: check_int("hidden", 0, low=1)),
    (
        "MLP dropout",
        lambda: MLP(4, dropout=1.0),
        lambda: check_range("dropout", 1.0, low=0.0, high=1.0, high_open=True),
    ),
    ("CNN1D channels", lambda: CNN1D(2.5), lambda: check_int("channels", 2.5, low=1)),
    ("NormFaceHead", lambda: NormFaceHead(0, 3), lambda: check_int("in_features", 0, low=1)),
    ("AdaFocalLoss", lambda: AdaFocalLoss(num_bins=0), lambda: check_int("num_bins", 0, low=1)),
    ("EXACTLoss", lambda: EXACTLoss(n_nodes=1), lambda: check_int("n_nodes", 1, low=2)),
    (
        "LinearTargetLoss",
        lambda: LinearTargetLoss(chunk_size=0),
        lambda: check_int("chunk_size", 0, low=1, optional=True),
    ),
    (
        "normface_min_scale",
        lambda: normface_min_scale(1, 0.9),
        lambda: check_int("num_classes", 1, low=2),
    ),
    (
        "data batch_size",
        lambda: DigitsDataModule(batch_size=0),
        lambda: check_int("batch_size", 0, low=1),
    ),
    (
        "data seed",
        lambda: DigitsDataModule(seed=2**32),
        lambda: check_int("seed", 2**32, low=0, high=2**32 - 1),
    ),
    (
        "data val_fraction",
        lambda: DigitsDataModule(val_fraction=1.0),
        lambda: check_fraction("val_fraction", 1.0),
    ),
    (
        "data imbalance_ratio",
        lambda: LongTailedDigitsDataModule(imbalance_ratio=0.5),
        lambda: check_range("imbalance_ratio", 0.5, low=1.0),
    ),
    (
        "data positive_digit",
        lambda: RareDigitDataModule(positive_digit=10),
        lambda: check_int("positive_digit", 10, low=0, high=9),
    ),
    (
        "data task",
        lambda: _tensor_module_with_task("ranking"),
        lambda: check_choice("task", "ranking", ("multiclass", "binary", "multilabel", "nm")),
    ),
    (
        "MNIST-1D num_samples",
        lambda: MNIST1DDataModule(num_samples=5),
        lambda: check_int("num_samples", 5, low=10),
    ),
    (
        "MNIST-1D val_source",
        lambda: MNIST1DDataModule(val_source="test"),
        lambda: check_choice("val_source", "test", ("split", "generated")),
    ),
    (
        "sampler rank",
        lambda: UnpaddedDistributedSampler(range(3), rank=0.5),
        lambda: check_int("rank", 0.5, low=0, optional=True),
    ),
    (
        "schedule value",
        lambda: LinearSchedule(math.nan, 1.0),
        lambda: check_real("start_value", math.nan),
    ),
    (
        "LossScheduler interval",
        lambda: LossScheduler("gamma", LinearSchedule(0.0, 1.0), interval="batch"),
        lambda: check_choice("interval", "batch", ("step", "epoch")),
    ),
    (
        "AdaFocalUpdate",
        lambda: AdaFocalUpdate(diagram_every_n_epochs=-1),
        lambda: check_int("diagram_every_n_epochs", -1, low=0),
    ),
    (
        "calibration n_bins",
        lambda: CF.calibration_error(torch.tensor([0.5]), torch.tensor([1]), n_bins=0),
        lambda: check_int("n_bins", 0, low=1),
    ),
    (
        "CalibrationError n_bins",
        lambda: CalibrationError(n_bins=2.0),
        lambda: check_int("n_bins", 2.0, low=1),
    ),
    (
        "AURC histogram_bins",
        lambda: AURC(histogram_bins=1),
        lambda: check_int("histogram_bins", 1, low=2),
    ),
    (
        "AURC edges",
        lambda: aurc_histogram_edges(2.5),
        lambda: check_int("histogram_bins", 2.5, low=2),
    ),
    (
        "interval level",
        lambda: calibration_error_interval(torch.tensor([0.8]), torch.tensor([1]), level=1.0),
        lambda: check_fraction("level", 1.0, example="0.95"),
    ),
    (
        "CalibrationMonitor level",
        lambda: CalibrationMonitor(intervals=True, level="0.95"),
        lambda: check_fraction("level", "0.95", example="0.95"),
    ),
    (
        "interval n_bootstrap",
        lambda: CalibrationErrorInterval(n_bootstrap=1),
        lambda: check_int("n_bootstrap", 1, low=2),
    ),
    (
        "interval n_groups",
        lambda: CalibrationErrorInterval(n_groups=2**31 + 1),
        lambda: check_int("n_groups", 2**31 + 1, low=2, high=2**31),
    ),
    (
        "interval seed",
        lambda: CalibrationErrorInterval(seed=2**63),
        lambda: check_int("seed", 2**63, low=0, high=2**63 - 1),
    ),
    (
        "smooth bandwidth",
        lambda: SM.smooth_calibration_error(torch.tensor([0.5]), torch.tensor([1]), bandwidth=0.0),
        lambda: check_real("bandwidth", 0.0, low=SM.MIN_BANDWIDTH, optional=True),
    ),
    (
        "SmoothCalibrationError bandwidth",
        lambda: SmoothCalibrationError(bandwidth="0.1"),
        lambda: check_real("bandwidth", "0.1", low=SM.MIN_BANDWIDTH, optional=True),
    ),
    (
        "smooth grid_size",
        lambda: SM.smooth_grid_statistics(torch.tensor([0.5]), torch.tensor([1.0]), grid_size=1),
        lambda: check_int("grid_size", 1, low=2),
    ),
    (
        "decide level",
        lambda: decide([1.0, 2.0], margin=0.0, level=1.5),
        lambda: check_fraction("level", 1.5, example="0.95"),
    ),
    (
        "t_interval level",
        lambda: t_interval([1.0, 2.0], level=True),
        lambda: check_fraction("level", True, example="0.95"),
    ),
    (
        "table width",
        lambda: format_table([], width=0),
        lambda: check_int("width", 0, low=1, optional=True),
    ),
    (
        "LM val_fraction",
        lambda: split_topics(["a", "b"], 1.0, seed=0),
        lambda: check_fraction("val_fraction", 1.0),
    ),
    (
        "SplitCurves split",
        lambda: SplitCurves("holdout"),
        lambda: check_choice("split", "holdout", ("train", "val", "test")),
    ),
    (
        "SplitCurves every_n_epochs",
        lambda: SplitCurves(every_n_epochs=0),
        lambda: check_int("every_n_epochs", 0, low=1),
    ),
    (
        "SplitCurves n_bins",
        lambda: SplitCurves(n_bins=2.5),
        lambda: check_int("n_bins", 2.5, low=1),
    ),
    (
        "LossSwitch milestones",
        lambda: LossSwitch(["ce", "focal", "ce"], milestones=[1, -2]),
        lambda: check_int("milestones[1]", -2, low=0),
    ),
]


@pytest.mark.parametrize(("case", "call", "reference"), ONE_HOME, ids=[c[0] for c in ONE_HOME])
def test_modules_raise_what_the_checks_module_raises(case, call, reference):
    with pytest.raises((TypeError, ValueError)) as expected:
        reference()
    with pytest.raises((TypeError, ValueError)) as got:
        call()
    assert type(got.value) is type(expected.value)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("value", [0, "2", True, 1.5])
def test_experiment_min_seeds_raises_what_the_checks_module_raises(tmp_path, value):
    path = tmp_path / "claim.yaml"
    path.write_text(f"min_seeds: {json.dumps(value)}\nvariants:\n  - {{name: a, config: c.yaml}}\n")
    with pytest.raises((TypeError, ValueError)) as expected:
        check_int("min_seeds", value, low=1)
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: min_seeds must be ") as got:
        load_experiment(path)
    assert type(got.value) is ValueError  # the experiment file's error, whatever the kind
    assert str(got.value) == f"{path}: {expected.value}"


# --- class_path objects: built by jsonargparse and Lightning ----------------------------------


def test_class_path_objects_equal_direct_constructions():
    spec = {"class_path": "lightning_losses.FocalLoss", "init_args": {"gamma": 1.5}}
    criterion = build_criterion(spec, reduction="sum")
    assert type(criterion) is FocalLoss
    assert (criterion.gamma, criterion.reduction) == (1.5, "sum")

    backbone = {"class_path": "lightning_losses.lightning.backbones.CNN1D", "init_args": {}}
    model = ClassifierModule(
        "ce", input_dim=40, backbone={**backbone, "init_args": {"channels": 3}}
    )
    assert type(model.backbone) is CNN1D
    assert model.backbone.channels == 3
    assert model.hparams["backbone"]["init_args"] == {"channels": 3}  # described back

    optimizer = {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.125, "momentum": 0.5}}
    for module in (
        ClassifierModule("ce", hidden=[4], optimizer=optimizer),
        TinyLanguageModel(
            vocab_size=16, context_length=4, d_model=8, n_heads=2, optimizer=optimizer
        ),
    ):
        built = module.configure_optimizers()
        assert type(built) is torch.optim.SGD
        assert built.defaults["lr"] == 0.125
        assert built.defaults["momentum"] == 0.5
        assert built.param_groups[0]["params"] == list(module.parameters())

    path = "lightning_losses.callbacks.outputs.describe_output"
    assert OutputAdapter(path, owner="CalibrationMonitor").function is describe_output


DATA_MODULE = "lightning_losses.data.digits.DigitsDataModule"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: build_criterion({"class_path": "no_such.Loss"}), "criterion: cannot import"),
        (
            lambda: build_criterion({"class_path": "lightning_losses.FocalLoss", "args": {}}),
            "criterion mapping must be",
        ),
        (
            lambda: ClassifierModule("ce", backbone={"class_path": "no_such.Net"}),
            "backbone: cannot import 'no_such.Net'",
        ),
        (
            lambda: ClassifierModule("ce", backbone={"class_path": DATA_MODULE}),
            f"backbone: class_path {DATA_MODULE!r} does not name a subclass of torch.nn.Module",
        ),
        (
            lambda: ClassifierModule(
                "ce", optimizer={"class_path": "torch.optim.NoSuchOptimizer"}
            ).configure_optimizers(),
            "optimizer: cannot import 'torch.optim.NoSuchOptimizer'",
        ),
        (
            lambda: OutputAdapter("no_such.fn", owner="CalibrationMonitor"),
            "CalibrationMonitor(outputs=...): cannot import 'no_such.fn'",
        ),
    ],
)
def test_class_path_errors_name_the_argument(build, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        build()


def test_class_paths_follow_the_import_path_policy_of_the_cli(monkeypatch):
    # jsonargparse imports every class_path, so the policy LightningCLI applies to YAML values
    # (set_parsing_settings) applies to criteria, backbones and optimizers from Python too.
    import jsonargparse
    from jsonargparse import _common

    if (
        "import_path_denylist"
        not in inspect.signature(jsonargparse.set_parsing_settings).parameters
    ):
        pytest.skip("this jsonargparse has no import path policy (added in 4.4x)")
    for key in ("import_path_verdicts", "import_paths_enforced"):  # restored after the test
        monkeypatch.setitem(_common.parsing_settings, key, _common.parsing_settings[key])
    jsonargparse.set_parsing_settings(import_path_denylist=["lightning_losses.losses.FocalLoss"])
    for path in ("lightning_losses.losses.FocalLoss", "lightning_losses.FocalLoss"):
        with pytest.raises(ValueError, match=f"^criterion: cannot import '{path}' .*not allowed"):
            build_criterion({"class_path": path})
    assert type(build_criterion("focal")) is FocalLoss  # a registry name is no import path
