"""Backbones of ClassifierModule: the default MLP, the MNIST-1D CNN, any nn.Module, the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_losses.cli.fit import default_config_path, main
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.backbones import CNN1D, MLP
from lightning_losses.lightning.classifier import ClassifierModule

QUICK = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.logger=false",
]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def old_classifier_layers(input_dim, hidden, dropout, outputs):
    """ClassifierModule's backbone and head as they were built before backbones existed."""
    layers = []
    width = input_dim
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = size
    return nn.Sequential(*layers), nn.Linear(width, outputs)


def fit_and_save(model, path, input_dim=64):
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DigitsDataModule(batch_size=32))
    trainer.save_checkpoint(path)
    return path


# --- MLP: the default, unchanged ------------------------------------------------------------


@pytest.mark.parametrize(("hidden", "dropout"), [((128, 64), 0.0), ([32], 0.3), ([], 0.0)])
def test_default_backbone_has_the_old_weights_and_keys(hidden, dropout):
    torch.manual_seed(3)
    model = ClassifierModule("ce", input_dim=64, num_classes=10, hidden=hidden, dropout=dropout)
    torch.manual_seed(3)
    backbone, head = old_classifier_layers(64, hidden, dropout, 10)
    expected = {
        **{f"backbone.{k}": v for k, v in backbone.state_dict().items()},
        **{f"head.{k}": v for k, v in head.state_dict().items()},
    }
    actual = {k: v for k, v in model.state_dict().items() if not k.startswith("criterion")}
    assert list(actual) == list(expected)  # backbone.0.weight, backbone.0.bias, ...
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key
    assert isinstance(model.backbone, MLP)
    assert [type(m) for m in model.backbone] == [type(m) for m in backbone]
    assert model.hparams["backbone"] is None


def test_mlp_without_hidden_layers_is_logistic_regression():
    model = ClassifierModule("ce", input_dim=64, num_classes=10, hidden=[]).double()
    x = torch.randn(7, 64, dtype=torch.float64)
    expected = x @ model.head.weight.T + model.head.bias
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-12)
    assert model.backbone.out_features == 64
    assert list(model.parameters()) == [model.head.weight, model.head.bias]


def test_mlp_forward_is_its_layers_written_out():
    mlp = MLP(6, hidden=[5, 3], dropout=0.5).double().eval()
    x = torch.randn(4, 6, dtype=torch.float64)
    first, second = mlp[0], mlp[3]  # Linear, ReLU, Dropout, Linear, ReLU, Dropout
    expected = torch.relu(
        torch.relu(x @ first.weight.T + first.bias) @ second.weight.T + second.bias
    )
    torch.testing.assert_close(mlp(x), expected)
    assert mlp.out_features == 3
    assert mlp.init_args == {"input_dim": 6, "hidden": [5, 3], "dropout": 0.5}


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"input_dim": 0}, "input_dim"),
        ({"input_dim": 4, "hidden": [8, 0]}, "hidden"),
        ({"input_dim": 4, "hidden": "64"}, "hidden"),
        ({"input_dim": 4, "dropout": 1.0}, "dropout"),
        ({"input_dim": 4, "dropout": -0.1}, "dropout"),
    ],
)
def test_mlp_bad_arguments_name_them(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=name):
        MLP(**kwargs)


# --- CNN1D: the CNN of MNIST-1D ---------------------------------------------------------------


def test_cnn1d_is_the_mnist1d_paper_network():
    # Greydanus, "Scaling down deep learning": conv(1->25, 5, s2, p1), conv(25->25, 3, s2, p1)
    # twice, ReLU after each, flattened; 40 inputs give the 125 features of Linear(125, 10).
    torch.manual_seed(0)
    cnn = CNN1D(channels=25).double()
    x = torch.randn(6, 40, dtype=torch.float64)
    h = F.conv1d(x[:, None, :], cnn.conv1.weight, cnn.conv1.bias, stride=2, padding=1).relu()
    assert cnn.conv1.weight.shape == (25, 1, 5)
    h = F.conv1d(h, cnn.conv2.weight, cnn.conv2.bias, stride=2, padding=1).relu()
    assert cnn.conv2.weight.shape == (25, 25, 3)
    h = F.conv1d(h, cnn.conv3.weight, cnn.conv3.bias, stride=2, padding=1).relu()
    assert cnn.conv3.weight.shape == (25, 25, 3)
    assert h.shape == (6, 25, 5)
    out = cnn(x)
    assert out.shape == (6, 125)
    torch.testing.assert_close(out, h.reshape(6, 125), rtol=0, atol=0)
    torch.testing.assert_close(cnn(x[:, None, :]), out, rtol=0, atol=0)  # [N, 1, L] too
    assert cnn.init_args == {"channels": 25}
    assert cnn.output_features(40) == 125
    assert cnn.output_features(64) == 25 * 8  # 64 -> 31 -> 16 -> 8


def test_cnn1d_bad_channels_and_input():
    with pytest.raises(ValueError, match="channels"):
        CNN1D(channels=0)
    with pytest.raises(ValueError, match=r"\[N, L\]"):
        CNN1D(4)(torch.zeros(2, 3, 40))


# --- any backbone ------------------------------------------------------------------------------


def test_classifier_on_cnn1d_sizes_its_head_from_one_forward():
    cnn = CNN1D(channels=25)
    model = ClassifierModule("ce", input_dim=40, num_classes=10, backbone=cnn)
    assert model.backbone is cnn
    assert model.head.in_features == 125
    assert model.head.out_features == 10
    assert cnn.training  # the probe ran in eval mode and gave the mode back
    assert model(torch.randn(3, 40)).shape == (3, 10)
    assert model.hparams["backbone"] == {
        "class_path": "lightning_losses.lightning.backbones.CNN1D",
        "init_args": {"channels": 25},
    }


def test_backbone_with_a_cosine_head():
    model = ClassifierModule(
        "ce", input_dim=40, num_classes=10, backbone=CNN1D(8), head="cosface", margin=0.2
    )
    assert model.head.weight.shape == (10, 8 * 5)
    assert model(torch.randn(3, 40), torch.tensor([0, 1, 2])).shape == (3, 10)


def test_backbone_given_as_a_mapping_is_built():
    spec = {
        "class_path": "lightning_losses.lightning.backbones.CNN1D",
        "init_args": {"channels": 7},
    }
    model = ClassifierModule("ce", input_dim=40, backbone=spec)
    assert isinstance(model.backbone, CNN1D)
    assert model.backbone.channels == 7
    assert model.head.in_features == 35
    assert model.hparams["backbone"] == spec


@pytest.mark.parametrize(
    ("backbone", "match"),
    [
        ({"class_path": "lightning_losses.lightning.backbones.CNN2D"}, "backbone.*CNN2D"),
        ({"class_path": "lightning_losses.data.digits.DigitsDataModule"}, "backbone.*nn.Module"),
        (
            {"class_path": "lightning_losses.lightning.backbones.CNN1D", "args": {}},
            "backbone mapping",
        ),
        ({"init_args": {"channels": 3}}, "backbone mapping"),
    ],
)
def test_bad_backbone_mapping_names_backbone(backbone, match):
    with pytest.raises(ValueError, match=match):
        ClassifierModule("ce", backbone=backbone)


def test_backbone_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match="backbone"):
        ClassifierModule("ce", backbone="cnn")


class Pair(nn.Module):
    def forward(self, x):
        return x, x


@pytest.mark.parametrize(
    ("backbone", "got"),
    [
        (nn.Linear(10, 5), "raised RuntimeError"),  # 64 features into a Linear(10, 5)
        (nn.Unflatten(1, (8, 8)), "gave shape [2, 8, 8]"),
        (Pair(), "gave a tuple"),
    ],
)
def test_backbone_that_does_not_give_2d_features_is_rejected(backbone, got):
    named = f"backbone {type(backbone).__name__} "
    with pytest.raises(ValueError, match=f"^{re.escape(named)}") as error:
        ClassifierModule("ce", input_dim=64, backbone=backbone)
    message = str(error.value)
    assert "[2, 64]" in message
    assert got in message


@pytest.mark.parametrize(
    ("kwargs", "name"), [({"hidden": [32]}, "hidden"), ({"dropout": 0.1}, "dropout")]
)
def test_backbone_with_mlp_arguments_is_a_contradiction(kwargs, name):
    with pytest.raises(ValueError, match="backbone") as error:
        ClassifierModule("ce", input_dim=40, backbone=CNN1D(), **kwargs)
    assert "hidden" in str(error.value)
    assert "dropout" in str(error.value)
    # the defaults, spelled out, are no contradiction
    ClassifierModule("ce", input_dim=40, backbone=CNN1D(), hidden=[128, 64], dropout=0.0)


# --- checkpoints -------------------------------------------------------------------------------


def test_cnn1d_checkpoint_loads_back_with_the_same_outputs(tmp_path):
    torch.manual_seed(0)
    model = ClassifierModule("focal", input_dim=64, backbone=CNN1D(channels=6))
    path = fit_and_save(model, tmp_path / "cnn.ckpt")
    saved = torch.load(path, weights_only=True)
    assert saved["hyper_parameters"]["backbone"] == {
        "class_path": "lightning_losses.lightning.backbones.CNN1D",
        "init_args": {"channels": 6},
    }
    restored = ClassifierModule.load_from_checkpoint(path, weights_only=True)
    assert isinstance(restored.backbone, CNN1D)
    assert restored.backbone.channels == 6
    x = torch.randn(5, 64)
    model.eval()
    restored.eval()
    with torch.no_grad():
        torch.testing.assert_close(restored(x), model(x), rtol=0, atol=0)


def test_foreign_backbone_is_left_out_and_given_back_at_load(tmp_path):
    def foreign():
        return nn.Sequential(nn.Linear(64, 12), nn.Tanh())

    torch.manual_seed(0)
    model = ClassifierModule("ce", input_dim=64, backbone=foreign())
    assert "backbone" not in model.hparams
    path = fit_and_save(model, tmp_path / "foreign.ckpt")
    assert "backbone" not in torch.load(path, weights_only=True)["hyper_parameters"]
    with pytest.raises(RuntimeError, match="backbone"):  # the default MLP does not fit
        ClassifierModule.load_from_checkpoint(path, weights_only=True)
    restored = ClassifierModule.load_from_checkpoint(path, weights_only=True, backbone=foreign())
    x = torch.randn(5, 64)
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(x), model.eval()(x), rtol=0, atol=0)


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_backbone_by_class_path_fits_and_checkpoints(tmp_path):
    cli = main(["fit", "--model.backbone=lightning_losses.lightning.backbones.CNN1D", *QUICK])
    model = cli.model
    assert isinstance(model.backbone, CNN1D)
    assert model.backbone.channels == 25
    assert model.head.in_features == 25 * 8  # the digits have 64 features
    assert cli.trainer.global_step == 2
    assert torch.isfinite(cli.trainer.callback_metrics["val/nll"])
    checkpoint = cli.trainer.checkpoint_callback.best_model_path
    assert checkpoint
    assert Path(checkpoint).is_file()
    saved = torch.load(checkpoint, weights_only=True)
    assert (
        saved["hyper_parameters"]["backbone"]["class_path"]
        == "lightning_losses.lightning.backbones.CNN1D"
    )
    restored = ClassifierModule.load_from_checkpoint(checkpoint, weights_only=True)
    x = torch.randn(4, 64)
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(x), model.eval()(x), rtol=0, atol=0)


def test_cli_backbone_in_yaml(tmp_path):
    config = tmp_path / "cnn.yaml"
    config.write_text(
        "model:\n"
        "  backbone:\n"
        "    class_path: lightning_losses.lightning.backbones.CNN1D\n"
        "    init_args:\n"
        "      channels: 4\n"
    )
    # A config on top of the packaged one (data, criterion, optimizer).
    cli = main(["fit", "--config", default_config_path(), "--config", str(config), *QUICK])
    assert isinstance(cli.model.backbone, CNN1D)
    assert cli.model.backbone.channels == 4
    assert cli.model.head.in_features == 4 * 8
    assert cli.trainer.global_step == 2


def test_cli_unknown_backbone_names_model_backbone(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--model.backbone=lightning_losses.lightning.backbones.CNN2D", *QUICK])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert 'Parser key "model.backbone"' in err
    assert "lightning_losses.lightning.backbones.CNN2D" in err
    assert not list(tmp_path.rglob("*.ckpt"))  # nothing ran
