"""Schedules that replace a value say so and can be scoped; callbacks check their inputs early.

- ``GammaAnnealing`` / ``LossScheduler`` warn once, before the first training step, when the
  schedule replaces a value the criterion was given; ``stages=[...]`` / ``losses=[...]`` scope
  them, and out of scope they set nothing.
- ``describe()`` gives the fit summary's line for each schedule.
- ``CalibrationMonitor`` and ``TemperatureScalingCallback`` reject a ``validation_step``
  without ``{"logits", "target"}`` in the sanity check, before any training step, in a plain
  LightningModule.
- Diagram names carry the epoch the weights are from (a checkpoint's, for test).
"""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers.warned import REPLACED, package_warns
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses import FocalLoss, GammaCrossEntropyLoss
from lightning_losses.callbacks import (
    AdaFocalUpdate,
    CalibrationMonitor,
    GammaAnnealing,
    LinearSchedule,
    LossScheduler,
    LossSwitch,
    TemperatureScalingCallback,
)

STEPS_PER_EPOCH = 4  # 64 samples, batch 16
GAMMA_CE_0 = {"name": "gamma_ce", "gamma": 0.0}  # starts where GammaAnnealing starts


def data(n: int = 64, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=generator)
    y = torch.randint(0, 3, (n,), generator=generator)
    dataset = TensorDataset(x, y)
    return DataLoader(dataset, batch_size=16), DataLoader(dataset, batch_size=16)


class Plain(L.LightningModule):
    """A LightningModule of the user's: nothing of ours but the criterion attribute."""

    def __init__(self, criterion: nn.Module | None = None, outputs: bool = True) -> None:
        super().__init__()
        self.net = nn.Linear(6, 3)
        self.criterion = criterion
        self.outputs = outputs

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        if self.criterion is None:
            return F.cross_entropy(logits, y)
        return self.criterion(logits, y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        if self.outputs:
            return {"logits": logits, "target": y}
        return F.cross_entropy(logits, y)

    def test_step(self, batch, batch_idx):
        return self.validation_step(batch, batch_idx)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Record(Callback):
    """The criterion's class and gamma at every training batch (after the schedules ran)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, float | None]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        criterion = pl_module.criterion
        gamma = getattr(criterion, "gamma", None)
        self.seen.append((trainer.global_step, type(criterion).__name__, gamma))


def trainer(tmp_path, callbacks, epochs=2, **kw) -> L.Trainer:
    options = {
        "accelerator": "cpu",
        "max_epochs": epochs,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "default_root_dir": tmp_path,
        **kw,
    }
    return L.Trainer(callbacks=callbacks, **options)


def replace_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "replacing the value given" in str(w.message)]


# ----------------------------------------------------------------------------------------------
# The notice
# ----------------------------------------------------------------------------------------------


def test_annealing_says_once_that_it_replaces_a_given_gamma(tmp_path):
    record = Record()
    t = trainer(tmp_path, [GammaAnnealing(0.0, 1.0), record])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(Plain(FocalLoss(gamma=2.0)), *data())
    messages = replace_warnings(caught)
    assert len(messages) == 1, messages
    assert messages[0].startswith("GammaAnnealing sets criterion.gamma")
    assert "FocalLoss was given gamma=2.0, the schedule sets 0.0 at step 0" in messages[0]
    assert "stages=[...]" in messages[0]
    assert "losses=[...]" in messages[0]
    # ... and it does replace it: gamma = step / (total - 1), linearly from 0 to 1 at the last.
    total = 2 * STEPS_PER_EPOCH
    assert [g for _, _, g in record.seen] == [step / (total - 1) for step in range(total)]


def test_no_notice_when_the_schedule_starts_at_the_given_value(tmp_path):
    t = trainer(tmp_path, [GammaAnnealing(0.0, 1.0)], epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(Plain(GammaCrossEntropyLoss(gamma=0.0)), *data())
    assert replace_warnings(caught) == []


def test_notice_names_the_loss_switch_stage(tmp_path):
    switch = LossSwitch([GAMMA_CE_0, {"name": "focal", "gamma": 2.0}], milestones=[1])
    t = trainer(tmp_path, [switch, GammaAnnealing(0.0, 1.0, interval="epoch")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(Plain(GammaCrossEntropyLoss(gamma=0.0)), *data())
    (message,) = replace_warnings(caught)
    assert (
        "LossSwitch criteria[1]={'name': 'focal', 'gamma': 2.0} (from epoch 1) was given "
        "gamma=2.0, the schedule sets 1.0 at epoch 1 (the last epoch)"
    ) in message
    assert "criteria[0]" not in message  # gamma_ce starts at the schedule's 0.0


# ----------------------------------------------------------------------------------------------
# Scoping
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scope", [{"stages": [0]}, {"losses": ["gamma_ce"]}, {"losses": ["GammaCrossEntropyLoss"]}]
)
def test_a_scoped_schedule_leaves_the_other_stage_alone(tmp_path, scope):
    switch = LossSwitch([GAMMA_CE_0, {"name": "focal", "gamma": 2.0}], milestones=[1])
    record = Record()
    annealing = GammaAnnealing(0.0, 1.0, **scope)
    t = trainer(tmp_path, [switch, annealing, record])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(Plain(GammaCrossEntropyLoss(gamma=0.0)), *data())
    assert replace_warnings(caught) == []
    total = 2 * STEPS_PER_EPOCH
    expected = [("GammaCrossEntropyLoss", step / (total - 1)) for step in range(STEPS_PER_EPOCH)]
    expected += [("FocalLoss", 2.0)] * STEPS_PER_EPOCH  # untouched in its stage
    assert [(name, gamma) for _, name, gamma in record.seen] == expected


def test_scope_to_a_stage_whose_loss_has_no_gamma(tmp_path):
    # Without the scope, cross-entropy's stage would be an error (it has no gamma).
    switch = LossSwitch(["ce", {"name": "focal", "gamma": 2.0}], milestones=[1])
    with pytest.raises(ValueError, match="has no hyper-parameter 'gamma'"):
        trainer(tmp_path, [switch, GammaAnnealing(0.0, 1.0)]).fit(Plain(FocalLoss()), *data())
    record = Record()
    t = trainer(tmp_path, [switch, GammaAnnealing(0.0, 1.0, losses=["focal"]), record])
    with package_warns(REPLACED):  # the focal stage was given gamma=2.0
        t.fit(Plain(FocalLoss()), *data())
    total = 2 * STEPS_PER_EPOCH
    expected = [("CrossEntropyLoss", None)] * STEPS_PER_EPOCH
    expected += [("FocalLoss", step / (total - 1)) for step in range(STEPS_PER_EPOCH, total)]
    assert [(name, gamma) for _, name, gamma in record.seen] == expected


def test_scope_that_matches_nothing_fails_before_training(tmp_path):
    model = Plain(GammaCrossEntropyLoss())
    before = model.net.weight.detach().clone()
    with pytest.raises(ValueError, match=r"losses=\['focal'\]\) acts on no criterion") as error:
        trainer(tmp_path, [GammaAnnealing(losses=["focal"])]).fit(model, *data())
    assert "GammaCrossEntropyLoss" in str(error.value)
    assert "gamma_ce" in str(error.value)
    with pytest.raises(ValueError, match="no LossSwitch callback"):
        trainer(tmp_path, [GammaAnnealing(stages=[1])]).fit(model, *data())
    switch = LossSwitch(["ce", "focal"], milestones=[1])
    with pytest.raises(ValueError, match="acts on no criterion of this run"):
        trainer(tmp_path, [switch, GammaAnnealing(stages=[1])], epochs=1).fit(model, *data())
    assert torch.equal(model.net.weight, before)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"stages": 1}, "stages must be a non-empty list of ints"),
        ({"stages": []}, "stages must be a non-empty list of ints"),
        ({"stages": [-1]}, r"stages\[0\] must be a LossSwitch criteria index"),
        ({"stages": [True]}, r"stages\[0\] must be a int"),
        ({"losses": "focal"}, "losses must be a non-empty list of strs"),
        ({"losses": [3]}, r"losses\[0\] must be a str"),
    ],
)
def test_bad_scope_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GammaAnnealing(**kwargs)
    with pytest.raises(ValueError, match=match):
        LossScheduler("gamma", LinearSchedule(0.0, 1.0), **kwargs)


# ----------------------------------------------------------------------------------------------
# describe(): the fit summary's line per schedule
# ----------------------------------------------------------------------------------------------


def test_describe_lines():
    assert GammaAnnealing().describe() == (
        "GammaAnnealing: gamma 0.0 -> 1.0, linear, from step 0 to 100% of training"
    )
    assert GammaAnnealing(0.5, 1.0, 2, 10, "cosine", "epoch", losses=["focal"]).describe() == (
        "GammaAnnealing: gamma 0.5 -> 1.0, cosine, from epoch 2 to epoch 10 (only losses ['focal'])"
    )
    scheduler = LossScheduler("alpha", LinearSchedule(0.1, 0.9), "epoch", stages=[1])
    assert scheduler.describe() == (
        "LossScheduler: criterion.alpha = LinearSchedule(start_value=0.1, end_value=0.9, "
        "start=0, end=1.0) per epoch (only LossSwitch criteria [1])"
    )
    switch = LossSwitch(["ce", {"name": "focal", "gamma": 2.0}, "ce"], milestones=[3, 5])
    assert switch.describe() == (
        "LossSwitch: 'ce' in epochs 0-2, {'name': 'focal', 'gamma': 2.0} in epochs 3-4, "
        "'ce' from epoch 5"
    )
    assert AdaFocalUpdate(lambda_=2.0).describe() == (
        "AdaFocalUpdate: per-bin gammas from each validation epoch (lambda_=2.0, "
        "switch_point=0.2, gamma in [-20.0, 20.0])"
    )


# ----------------------------------------------------------------------------------------------
# validation_step outputs are checked in the sanity check
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("callback", [CalibrationMonitor(), TemperatureScalingCallback()], ids=type)
def test_missing_outputs_fail_in_the_sanity_check(tmp_path, callback):
    model = Plain(outputs=False)
    before = model.net.weight.detach().clone()
    t = trainer(tmp_path, [callback], epochs=1)
    with pytest.raises(ValueError, match="'logits' and 'target'") as error:
        t.fit(model, *data())
    assert "Plain.validation_step" in str(error.value)
    assert t.global_step == 0
    assert torch.equal(model.net.weight, before)


# ----------------------------------------------------------------------------------------------
# Diagram names carry the epoch of the weights
# ----------------------------------------------------------------------------------------------


# Lightning's note that a checkpoint tested by a second trainer was written in another folder.
@pytest.mark.filterwarnings("ignore:The dirpath has changed from:UserWarning")
def test_diagram_names_carry_the_epoch_of_the_weights(tmp_path):
    train, val = data()
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{epoch}")
    options = {"logger": CSVLogger(tmp_path, name="run"), "enable_checkpointing": True}
    model = Plain()
    fitted = trainer(tmp_path, [CalibrationMonitor(), checkpoints], epochs=3, **options)
    fitted.fit(model, train, val)
    folder = tmp_path / "run" / "version_0" / "calibration"
    assert sorted(p.name for p in folder.glob("*.png")) == ["val_epoch=002.png"]
    fitted.test(model, val)  # the weights of the last epoch trained, epoch 2
    assert (folder / "test_epoch=002.png").is_file()
    assert not (folder / "test_epoch=003.png").exists()

    for epoch in (0, 1):  # a new trainer tests a checkpoint: its epoch
        options["logger"] = CSVLogger(tmp_path, name=f"test{epoch}")
        tester = trainer(tmp_path, [CalibrationMonitor()], **options)
        tester.test(Plain(), val, ckpt_path=str(tmp_path / "ckpt" / f"epoch={epoch}.ckpt"))
        found = (tmp_path / f"test{epoch}" / "version_0" / "calibration").glob("*.png")
        assert [p.name for p in found] == [f"test_epoch={epoch:03d}.png"]

    options["logger"] = CSVLogger(tmp_path, name="untrained")
    trainer(tmp_path, [CalibrationMonitor()], **options).test(Plain(), val)
    found = (tmp_path / "untrained" / "version_0" / "calibration").glob("*.png")
    assert [p.name for p in found] == ["test_untrained.png"]


# ----------------------------------------------------------------------------------------------
# One metric per quantity: callbacks log what the module does not log itself
# ----------------------------------------------------------------------------------------------


def test_a_plain_module_gets_the_callbacks_metrics(tmp_path):
    """Nothing of ours in the module: the schedule and the monitor log their own names."""
    t = trainer(tmp_path, [GammaAnnealing(0.0, 1.0), CalibrationMonitor()], epochs=1)
    t.fit(Plain(GammaCrossEntropyLoss(gamma=0.0)), *data())
    metrics = t.callback_metrics
    assert float(metrics["schedule/gamma"]) == 1.0  # the last step's
    assert "criterion/gamma" not in metrics
    _, val = data()
    x, y = val.dataset.tensors
    model = t.lightning_module
    with torch.no_grad():
        accuracy = (model.net(x).argmax(1) == y).double().mean()
    assert float(metrics["val/accuracy"]) == pytest.approx(float(accuracy), abs=1e-7)


@pytest.mark.slow
def test_the_default_config_with_another_loss_says_what_the_schedule_replaces(isolated_tracking):
    """``lightning-losses fit --model.criterion=focal``: the default GammaAnnealing replaces 2.0."""
    from lightning_losses.cli.fit import run_fit

    quick = [
        "--model.criterion=focal",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false",
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = run_fit(quick)
    (message,) = replace_warnings(caught)
    assert "FocalLoss was given gamma=2.0, the schedule sets 0.0 at step 0" in message
    assert type(cli.model.criterion).__name__ == "FocalLoss"
