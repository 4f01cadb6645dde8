"""The calibration callbacks read other validation_step outputs through ``outputs=``.

Plain LightningModules (not ClassifierModule) return ``{"y_hat", "y"}`` or a tuple; the
callbacks read them through a key mapping, tuple positions, a callable or its import path
(also from a LightningCLI YAML file), and the logged ECE equals a float64 numpy ECE computed
here from the model's logits after the fit. Bad adapters fail with messages that name the
argument and what validation_step returned.
"""

from __future__ import annotations

import re
import textwrap

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses import AdaFocalLoss
from lightning_losses.callbacks import (
    AdaFocalUpdate,
    CalibrationMonitor,
    OutputAdapter,
    TemperatureScalingCallback,
)

KEYS = {"logits": "y_hat", "target": "y"}


def tiny_data(seed: int, count: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 8, generator=gen)
    y = (x[:, :3] + 0.8 * torch.randn(count, 3, generator=gen)).argmax(dim=1)
    return TensorDataset(x, y)


class KeyModule(pl.LightningModule):
    """A plain LightningModule whose validation_step returns ``{"y_hat", "y"}``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 3)
        self.criterion = AdaFocalLoss()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.criterion(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return {"y_hat": self(x), "y": y}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):
        return DataLoader(tiny_data(0, 64), batch_size=16)

    def val_dataloader(self):
        return DataLoader(tiny_data(1, 48), batch_size=16)


class TupleModule(KeyModule):
    """The same model; validation_step (and test_step) return ``(logits, target)``."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return self(x), y

    def test_step(self, batch, batch_idx):
        return self.validation_step(batch, batch_idx)


def reference_ece(model: pl.LightningModule, n_bins: int = 15) -> float:
    """Top-label ECE of the model's validation logits, bins (k/B, (k+1)/B], in float64 numpy."""
    x, y = tiny_data(1, 48).tensors
    model.eval()
    with torch.no_grad():
        logits = model(x).double().numpy()
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    conf, correct = probs.max(axis=1), (probs.argmax(axis=1) == y.numpy()).astype(np.float64)
    index = np.clip(np.ceil(conf * n_bins) - 1, 0, n_bins - 1)
    return sum(
        (index == k).mean() * abs(conf[index == k].mean() - correct[index == k].mean())
        for k in range(n_bins)
        if (index == k).any()
    )


@pytest.fixture(autouse=True)
def _in_a_temporary_folder(tmp_path, monkeypatch):
    """Trainers here write their diagrams under the working folder: keep it out of the tree."""
    monkeypatch.chdir(tmp_path)


def trainer(callbacks, **kwargs) -> pl.Trainer:
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "callbacks": callbacks,
        **kwargs,
    }
    return pl.Trainer(**options)


def pair(outputs):
    """An adapter for a tuple output (a plain function, as a user would write one)."""
    logits, target = outputs
    return logits, target


# --- a key mapping, a callable, tuple positions ------------------------------------------------


def test_key_mapping_reads_a_dict_output():
    torch.manual_seed(0)
    model = KeyModule()
    fit = trainer([CalibrationMonitor(outputs=KEYS, final_diagram=False)])
    fit.fit(model)
    assert fit.global_step == 4  # trained: the ECE below is that of the fitted weights
    got = float(fit.callback_metrics["val/ece"])
    np.testing.assert_allclose(got, reference_ece(model), rtol=1e-6)


def test_a_callable_reads_a_tuple_output_for_every_calibration_callback():
    torch.manual_seed(0)
    model = TupleModule()
    monitor = CalibrationMonitor(outputs=pair, final_diagram=False)
    scaling = TemperatureScalingCallback(outputs=pair)
    adafocal = AdaFocalUpdate(outputs=pair, final_diagram=False)
    fit = trainer([monitor, scaling, adafocal])
    fit.fit(model)
    want = reference_ece(model)
    np.testing.assert_allclose(float(fit.callback_metrics["val/ece"]), want, rtol=1e-6)
    np.testing.assert_allclose(scaling.report["ece_before"], want, rtol=1e-6)
    assert adafocal.updates == 1  # the per-bin gammas followed the one validation epoch


def test_positions_read_a_tuple_output_in_validation_and_test():
    torch.manual_seed(0)
    model = TupleModule()
    check = trainer([CalibrationMonitor(outputs={"logits": 0, "target": 1}, final_diagram=False)])
    check.validate(model, verbose=False)
    want = reference_ece(model)
    np.testing.assert_allclose(float(check.callback_metrics["val/ece"]), want, rtol=1e-6)
    check.test(model, dataloaders=model.val_dataloader(), verbose=False)
    np.testing.assert_allclose(float(check.callback_metrics["test/ece"]), want, rtol=1e-6)


def test_a_name_left_out_keeps_its_default_key():
    adapter = OutputAdapter({"logits": "y_hat"}, owner="CalibrationMonitor")
    logits, target = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    got = adapter({"y_hat": logits, "target": target, "logits": torch.zeros(4, 3)})
    assert torch.equal(got[0], logits)
    assert torch.equal(got[1], target)


def test_an_import_path_names_the_callable(tmp_path, monkeypatch):
    (tmp_path / "my_outputs.py").write_text(
        "def pair(outputs):\n    return outputs[0], outputs[1]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    adapter = OutputAdapter("my_outputs.pair", owner="CalibrationMonitor")
    logits, target = torch.zeros(2, 3), torch.tensor([0, 1])
    got = adapter((logits, target))
    assert got[0] is not logits
    assert torch.equal(got[0], logits)
    assert torch.equal(got[1], target)


def test_lightning_cli_yaml_takes_a_mapping_and_an_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_outputs.py").write_text(
        "def pair(outputs):\n    return outputs[0], outputs[1]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("sys.argv", ["fit"])  # pytest's own arguments are not the CLI's
    config = tmp_path / "config.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            trainer:
              accelerator: cpu
              max_epochs: 1
              logger: false
              enable_checkpointing: false
              enable_progress_bar: false
              default_root_dir: {tmp_path}
              callbacks:
                - class_path: lightning_losses.callbacks.CalibrationMonitor
                  init_args:
                    outputs: {{logits: y_hat, target: y}}
                    final_diagram: false
                - class_path: lightning_losses.callbacks.TemperatureScalingCallback
                  init_args:
                    outputs: {{logits: y_hat, target: y}}
            """
        )
    )
    torch.manual_seed(0)
    cli = LightningCLI(
        KeyModule,
        args=["fit", "--config", str(config)],
        save_config_callback=None,
        seed_everything_default=0,
    )
    monitor, scaling = (c for c in cli.trainer.callbacks if hasattr(c, "outputs"))
    assert monitor.outputs == KEYS
    assert scaling.outputs == KEYS
    want = reference_ece(cli.model)
    np.testing.assert_allclose(float(cli.trainer.callback_metrics["val/ece"]), want, rtol=1e-6)
    np.testing.assert_allclose(scaling.report["ece_before"], want, rtol=1e-6)

    # the import path of a callable, as a YAML string (jsonargparse resolves it)
    torch.manual_seed(0)
    cli = LightningCLI(
        TupleModule,
        args=[
            "validate",
            "--trainer.accelerator=cpu",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.callbacks+=lightning_losses.callbacks.CalibrationMonitor",
            "--trainer.callbacks.outputs=my_outputs.pair",
        ],
        save_config_callback=None,
        seed_everything_default=0,
    )
    (monitor,) = (c for c in cli.trainer.callbacks if isinstance(c, CalibrationMonitor))
    assert callable(monitor.outputs)
    assert monitor.outputs.__name__ == "pair"
    np.testing.assert_allclose(
        float(cli.trainer.callback_metrics["val/ece"]), reference_ece(cli.model), rtol=1e-6
    )


def test_the_default_dict_still_works():
    class DictModule(KeyModule):
        def validation_step(self, batch, batch_idx):
            x, y = batch
            return {"logits": self(x), "target": y, "loss": torch.zeros(())}

    torch.manual_seed(0)
    model = DictModule()
    check = trainer([CalibrationMonitor()])
    check.validate(model, verbose=False)
    np.testing.assert_allclose(
        float(check.callback_metrics["val/ece"]), reference_ece(model), rtol=1e-6
    )


# --- errors --------------------------------------------------------------------------------------


def test_a_missing_key_names_the_argument_and_the_keys_found():
    class OtherKeys(KeyModule):
        def validation_step(self, batch, batch_idx):
            x, y = batch
            return {"pred": self(x), "y": y}

    fit = trainer([CalibrationMonitor(outputs=KEYS)])
    owner = "CalibrationMonitor(outputs={'logits': 'y_hat', 'target': 'y'})"
    with pytest.raises(ValueError, match=f"^{re.escape(owner)}") as info:
        fit.fit(OtherKeys())
    assert fit.global_step == 0  # in the sanity check, before any training step
    message = str(info.value)
    assert "OtherKeys.validation_step returned a dict with keys ['pred', 'y']" in message
    assert "no key 'y_hat' (where logits should be)" in message


def test_the_default_contract_points_to_the_adapter():
    check = trainer([TemperatureScalingCallback()])
    with pytest.raises(ValueError, match="return a dict with 'logits' and 'target'") as info:
        check.validate(TupleModule(), verbose=False)
    message = str(info.value)
    assert "got a tuple of 2 (Tensor [16, 3], Tensor [16])" in message
    assert "pass TemperatureScalingCallback(outputs=...)" in message


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ({"logit": "y_hat"}, r"outputs=\{'logit': 'y_hat'\}\): the mapping's keys must be"),
        ({"logits": 1.5}, r"'logits' must map to a dict key \(str\) or a tuple position"),
        ({"target": True}, r"'target' must map to a dict key"),
        ("y_hat", r"AdaFocalUpdate\(outputs=...\) must be a mapping .* got the string 'y_hat'"),
        ("no_such_package.module.fn", r"cannot import 'no_such_package.module.fn'"),
        ("math.pi", r"'math.pi' is a float, not a callable"),
        (3, r"AdaFocalUpdate\(outputs=...\) must be a mapping .* got a int"),
    ],
)
def test_bad_adapters_fail_when_built(outputs, message):
    with pytest.raises(ValueError, match=message):
        AdaFocalUpdate(outputs=outputs)
    with pytest.raises(ValueError, match="outputs"):
        CalibrationMonitor(outputs=outputs)


def test_a_callable_must_return_two_tensors():
    adapter = OutputAdapter(lambda outputs: outputs[0], owner="CalibrationMonitor")
    returned = "must return (logits, target), two tensors; it returned a Tensor of shape [4, 3]"
    with pytest.raises(ValueError, match=re.escape(returned)) as info:
        adapter((torch.zeros(4, 3), torch.zeros(4)), "MyModule")
    assert "from MyModule.validation_step" in str(info.value)


def test_positions_and_values_are_checked_against_the_output():
    adapter = OutputAdapter({"logits": 0, "target": 2}, owner="CalibrationMonitor")
    with pytest.raises(ValueError, match=r"returned a tuple of 2 .* no position 2 \(where target"):
        adapter((torch.zeros(4, 3), torch.zeros(4)), "MyModule")
    adapter = OutputAdapter(KEYS, owner="CalibrationMonitor")
    with pytest.raises(ValueError, match=r"logits \('y_hat' of what M.validation_step returned"):
        adapter({"y_hat": [1.0], "y": torch.zeros(1)}, "M")
