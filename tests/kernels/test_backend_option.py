"""``backend=`` on the public ``[N, C]`` losses and their modules, without Triton's interpreter.

Here (the ordinary test process: no ``TRITON_INTERPRET``) ``"auto"`` and ``"torch"`` give the
default's numbers, ``"triton"`` on CPU tensors is a one-line error that says how to run the
kernels, and a value outside the three is a one-line ``ValueError`` naming ``backend``, from
the functions, the modules' constructors and their checks, the registry and the command line's
option names. The kernels themselves are tested in ``interpreted/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

import lightning_losses.functional as LF
from lightning_losses import losses
from lightning_losses.cli.option_names import loss_arguments
from lightning_losses.functional.adafocal import adafocal_loss
from lightning_losses.functional.calibration_penalties import dca_loss, mdca_loss, mmce_loss
from lightning_losses.functional.dual_focal import dual_focal_loss
from lightning_losses.functional.margin import mbls_loss
from lightning_losses.functional.truncation import soft_truncated_loss
from lightning_losses.registry import get_loss

EDGES = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
GAMMAS = torch.tensor([1.0, 2.0], dtype=torch.float64)
#: Every public function of the [N, C] losses, with options that make its call valid.
FUNCTIONS: list[tuple[Callable[..., Tensor], dict[str, Any]]] = [
    (LF.cross_entropy, {"label_smoothing": 0.1}),
    (LF.gamma_cross_entropy, {"gamma": 0.3, "threshold": 0.2}),
    (LF.soft_accuracy_loss, {}),
    (LF.focal_loss, {"gamma": 2.0}),
    (LF.adaptive_focal_loss, {}),
    (LF.hard_truncated_loss, {}),
    (LF.poly1_loss, {}),
    (adafocal_loss, {"edges": EDGES, "gammas": GAMMAS}),
    (mbls_loss, {"margin": 1.0}),
    (dual_focal_loss, {}),
    (mdca_loss, {"gamma": 1.0}),
    (dca_loss, {}),
    (mmce_loss, {}),
]
IDS = [function.__name__ for function, _ in FUNCTIONS]
#: The registry names of their modules (AdaFocal builds its own bins).
MODULES = [
    "ce",
    "gamma_ce",
    "soft_accuracy",
    "focal",
    "adaptive_focal",
    "adafocal",
    "hard_truncated",
    "soft_truncated",
    "poly1",
    "mbls",
    "dual_focal",
    "mdca",
    "dca",
    "mmce",
]
X = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [1.0, -2.0, 0.0]])
TARGET = torch.tensor([0, 2, -100])


@pytest.mark.parametrize(("function", "options"), FUNCTIONS, ids=IDS)
def test_auto_and_torch_give_the_default(function: Callable[..., Tensor], options: dict) -> None:
    expected = function(X, TARGET, reduction="none", **options)
    for backend in ("auto", "torch"):
        found = function(X, TARGET, reduction="none", backend=backend, **options)
        assert torch.equal(found, expected)


@pytest.mark.parametrize(("function", "options"), FUNCTIONS, ids=IDS)
def test_an_unknown_backend_is_a_one_line_error(
    function: Callable[..., Tensor], options: dict
) -> None:
    with pytest.raises(
        ValueError, match=r"^backend must be one of 'auto', 'triton', 'torch'; got 'gpu'$"
    ):
        function(X, TARGET, backend="gpu", **options)


@pytest.mark.parametrize(("function", "options"), FUNCTIONS, ids=IDS)
def test_triton_on_a_cpu_tensor_says_how_to_run_the_kernels(
    function: Callable[..., Tensor], options: dict
) -> None:
    with pytest.raises(RuntimeError, match=r"backend='triton' runs on CUDA tensors") as error:
        function(X, TARGET, backend="triton", **options)
    assert "\n" not in str(error.value)


def test_triton_refuses_what_the_kernels_do_not_read() -> None:
    with pytest.raises(RuntimeError, match=r"takes \[N, C\] logits; got shape \[3, 3, 2\]"):
        LF.focal_loss(X[..., None].expand(3, 3, 2), TARGET[:, None].expand(3, 2), backend="triton")
    with pytest.raises(RuntimeError, match="reads float32, float16 or bfloat16 logits"):
        mbls_loss(X.double(), TARGET, backend="triton")


def test_soft_truncation_is_not_of_the_family() -> None:
    expected = soft_truncated_loss(X, TARGET)
    assert torch.equal(soft_truncated_loss(X, TARGET, backend="torch"), expected)
    with pytest.raises(ValueError, match=r"^backend='triton' is not available for soft_trunc"):
        soft_truncated_loss(X, TARGET, backend="triton")
    with pytest.raises(ValueError, match="backend must be"):
        soft_truncated_loss(X, TARGET, backend="cuda")


@pytest.mark.parametrize("name", MODULES)
def test_modules_hold_backend_as_a_plain_attribute(name: str) -> None:
    criterion = get_loss(name, backend="torch")
    assert criterion.backend == "torch"
    assert criterion.options()["backend"] == "torch"
    expected = get_loss(name)(X, TARGET)
    assert torch.equal(criterion(X, TARGET), expected)
    criterion.backend = "gpu"  # a plain attribute: the next call and the check see it
    with pytest.raises(ValueError, match=r"^backend must be one of 'auto', 'triton', 'torch'"):
        criterion.check_hyperparameters()
    with pytest.raises(ValueError, match=r"^backend must be one of 'auto', 'triton', 'torch'"):
        criterion(X, TARGET)
    with pytest.raises(
        ValueError, match=r"^backend must be one of 'auto', 'triton', 'torch'; got 1$"
    ):
        get_loss(name, backend=1)
    assert "backend" in (loss_arguments(type(criterion).__name__) or ())


def test_every_family_module_class_takes_backend() -> None:
    for name in MODULES:
        assert get_loss(name).backend == "auto"
    assert losses.FocalLoss(backend="triton").backend == "triton"
