"""``MyModule.load_from_checkpoint(path)`` (strict) of a plain LightningModule with LossMixin.

Whatever criterion the checkpoint was saved with (one with state, such as FocalLoss's ``alpha``
buffer, or one a LossSwitch swapped in during training), the module loads with Lightning's own
strict ``load_from_checkpoint``: the weights are the saved ones, and the criterion is the one
the module's hyper-parameters build, with the saved state where it fits.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.callbacks import LossSwitch
from lightning_losses.lightning.mixin import LossMixin

ALPHA = [0.2, 0.3, 0.5]
FOCAL = {"class_path": "lightning_losses.FocalLoss", "init_args": {"gamma": 2.0, "alpha": ALPHA}}


class MyModule(LossMixin, L.LightningModule):
    """A plain module: a linear layer, the criterion from its hyper-parameters."""

    def __init__(self, criterion: object = "ce") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(4, 3)
        self.set_criterion(criterion)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.compute_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_and_save(module: MyModule, path, epochs: int = 1, callbacks=()) -> dict:
    """Train briefly, save a checkpoint, return what it holds (read back with torch.load)."""
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 4, generator=generator), torch.arange(16) % 3)
    trainer = L.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )
    trainer.fit(module, DataLoader(data, batch_size=8))
    trainer.save_checkpoint(path)
    return torch.load(path, weights_only=True)


def assert_saved_weights(model: MyModule, saved: dict) -> None:
    assert torch.equal(model.net.weight, saved["state_dict"]["net.weight"])
    assert torch.equal(model.net.bias, saved["state_dict"]["net.bias"])


@pytest.fixture(scope="module")
def focal_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("focal") / "focal.ckpt"
    return path, fit_and_save(MyModule(FOCAL), path)


def load(path, **overrides) -> MyModule:
    return MyModule.load_from_checkpoint(path, strict=True, weights_only=True, **overrides)


def test_same_criterion_gets_its_saved_state_back(focal_checkpoint):
    path, saved = focal_checkpoint
    assert "criterion.alpha" in saved["state_dict"]  # the focal loss's state is in the file
    model = load(path)
    assert_saved_weights(model, saved)
    assert type(model.criterion).__name__ == "FocalLoss"
    assert model.criterion.gamma == 2.0
    assert torch.equal(model.criterion.alpha, saved["state_dict"]["criterion.alpha"])
    assert torch.allclose(model.criterion.alpha, torch.tensor(ALPHA))


@pytest.mark.parametrize(
    "criterion",
    [
        pytest.param("ce", id="registry-ce"),
        pytest.param(F.cross_entropy, id="plain-function"),
    ],
)
def test_focal_checkpoint_loads_into_a_stateless_criterion(focal_checkpoint, criterion):
    path, saved = focal_checkpoint
    model = load(path, criterion=criterion)
    assert_saved_weights(model, saved)
    assert "criterion.alpha" not in model.state_dict()
    logits, target = torch.randn(5, 3), torch.tensor([0, 1, 2, 0, 1])
    assert torch.allclose(model.criterion(logits, target), F.cross_entropy(logits, target))


def test_focal_checkpoint_with_an_alpha_of_another_shape_keeps_the_new_alpha(focal_checkpoint):
    path, saved = focal_checkpoint
    other = {"class_path": "lightning_losses.FocalLoss", "init_args": {"alpha": [1.0, 3.0]}}
    model = load(path, criterion=other)
    assert_saved_weights(model, saved)
    assert model.criterion.alpha.tolist() == [1.0, 3.0]


def test_stateless_checkpoint_loads_into_a_criterion_with_state(tmp_path):
    path = tmp_path / "ce.ckpt"
    saved = fit_and_save(MyModule("ce"), path)
    assert not any(key.startswith("criterion.") for key in saved["state_dict"])
    model = load(path, criterion=FOCAL)
    assert_saved_weights(model, saved)
    assert torch.allclose(model.criterion.alpha, torch.tensor(ALPHA))


def test_checkpoint_after_a_loss_switch_loads_with_the_module_hparams(tmp_path):
    path = tmp_path / "switched.ckpt"
    module = MyModule("ce")
    saved = fit_and_save(module, path, epochs=2, callbacks=[LossSwitch(["ce", FOCAL], [1])])
    assert type(module.criterion).__name__ == "FocalLoss"  # switched in epoch 1, then saved
    assert "criterion.alpha" in saved["state_dict"]
    model = load(path)
    assert_saved_weights(model, saved)
    assert type(model.criterion).__name__ == "CrossEntropyLoss"  # what the hparams build
    focal = load(path, criterion=FOCAL)  # loaded into the switched-to loss: its state back
    assert torch.equal(focal.criterion.alpha, saved["state_dict"]["criterion.alpha"])
