"""ClassifierModule + LossMixin + schedules + data: training, resume and checkpoints."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_losses import FocalLoss, available_losses, loss_class
from lightning_losses.callbacks import GammaAnnealing, LinearSchedule, LossScheduler
from lightning_losses.data.digits import (
    DigitsDataModule,
    MultiLabelDigitsDataModule,
    NMDigitsDataModule,
    RareDigitDataModule,
)
from lightning_losses.lightning.classifier import ClassifierModule


def data_for(loss_name: str, batch_size: int = 64) -> L.LightningDataModule:
    """The embedded task whose target shape the loss expects."""
    if loss_name.startswith("binary_"):
        return RareDigitDataModule(batch_size=batch_size, positive_fraction=0.2)
    if loss_name == "multilabel_ce":
        return MultiLabelDigitsDataModule(batch_size=batch_size)
    if loss_name == "nm_ce":
        return NMDigitsDataModule(batch_size=batch_size)
    return DigitsDataModule(batch_size=batch_size)


def trainer(tmp_path, **kwargs) -> L.Trainer:
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "deterministic": True,
        "default_root_dir": tmp_path,
    }
    options.update(kwargs)
    return L.Trainer(**options)


@pytest.mark.parametrize("name", available_losses())
def test_same_module_trains_with_every_registered_loss(name, tmp_path):
    torch.manual_seed(0)
    dm = data_for(name)
    model = ClassifierModule(
        name,
        input_dim=dm.num_features,
        num_classes=dm.num_classes,
        num_tasks=dm.num_tasks,
        task=dm.task,
        hidden=[32],
    )
    before = copy.deepcopy(model.state_dict())
    t = trainer(tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=2)
    t.fit(model, dm)
    assert isinstance(model.criterion, loss_class(name))
    assert torch.isfinite(t.callback_metrics["train/loss_epoch"])
    assert torch.isfinite(t.callback_metrics["val/nll"])
    changed = [not torch.equal(before[k], v) for k, v in model.state_dict().items()]
    assert any(changed), "no parameter moved"


class Recorder(Callback):
    """Records (global_step, gamma) as the training step saw it."""

    def __init__(self) -> None:
        self.values: list[tuple[int, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.values.append((trainer.global_step - 1, float(pl_module.criterion.gamma)))


class Preempted(RuntimeError):
    pass


class Preemption(Callback):
    """Kills the run at the start of a given step or epoch, like a lost machine."""

    def __init__(self, step: int | None = None, epoch: int | None = None) -> None:
        self.step, self.epoch = step, epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise Preempted(f"epoch {self.epoch}")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise Preempted(f"step {self.step}")


def annealed_run(tmp_path, ckpt_path=None, callbacks=()):
    """Three epochs of gamma-CE with gamma annealed 0 -> 1 over the whole run."""
    L.seed_everything(0)
    model = ClassifierModule({"name": "gamma_ce", "gamma": 0.0}, hidden=[32])
    recorder = Recorder()
    t = trainer(
        tmp_path,
        max_epochs=3,
        callbacks=[GammaAnnealing(start=0.0, end=1.0, until=1.0), recorder, *callbacks],
        limit_val_batches=1,
        enable_checkpointing=bool(callbacks),
    )
    try:
        t.fit(model, DigitsDataModule(batch_size=256), ckpt_path=ckpt_path)
    except Preempted:
        pass
    return model, recorder.values, t


def assert_same_weights(a, b):
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key


def test_gamma_annealing_follows_its_closed_form(tmp_path):
    _, values, t = annealed_run(tmp_path)
    total = t.estimated_stepping_batches
    assert total == 15  # 1,077 training rows in batches of 256, three epochs
    assert [s for s, _ in values] == list(range(total))
    for step, gamma in values:
        assert gamma == pytest.approx(step / (total - 1), abs=1e-12)  # 1.0 at the last step


# Lightning's note that the resumed trainer lacks the checkpoint's callbacks: on purpose (the
# Preemption / ModelCheckpoint that wrote it is not needed to resume).
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks used to create")
@pytest.mark.parametrize(
    ("preemption", "checkpoint_name", "done"),
    [
        (Preemption(epoch=1), "epoch=0-step=5.ckpt", 5),  # stopped after epoch 1
        (Preemption(step=8), "epoch=1-step=8.ckpt", 8),  # stopped mid-epoch
    ],
    ids=["after-epoch", "mid-epoch"],
)
def test_resume_gives_same_schedule_and_weights(tmp_path, preemption, checkpoint_name, done):
    model, values, _ = annealed_run(tmp_path / "full")
    saver = ModelCheckpoint(
        dirpath=tmp_path / "ckpt",
        save_top_k=-1,
        every_n_train_steps=1,
        save_on_train_epoch_end=True,
    )
    _, first_values, _ = annealed_run(tmp_path / "part", callbacks=[saver, preemption])
    assert first_values == values[:done]
    path = tmp_path / "ckpt" / checkpoint_name
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["global_step"] == done
    resumed, resumed_values, _ = annealed_run(tmp_path / "resumed", ckpt_path=path)
    assert resumed_values == values[done:]
    assert_same_weights(model, resumed)


def test_checkpoint_with_two_schedules_loads_weights_only(tmp_path):
    model = ClassifierModule(FocalLoss(gamma=1.0, alpha=[0.1] * 10), hidden=[16])
    # A focal loss has one hyper-parameter; two schedules need a criterion with two.
    model.set_criterion("gamma_ce", gamma=0.0, threshold=0.0)
    schedules = [
        LossScheduler("gamma", LinearSchedule(0.0, 0.5)),
        LossScheduler("threshold", LinearSchedule(0.0, 0.2), interval="epoch"),
    ]
    t = trainer(tmp_path, max_epochs=2, limit_train_batches=2, limit_val_batches=1)
    t.callbacks.extend(schedules)
    t.fit(model, DigitsDataModule(batch_size=128))
    path = tmp_path / "two.ckpt"
    t.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    keys = [k for k in checkpoint["callbacks"] if k.startswith("LossScheduler")]
    assert len(keys) == 2
    assert model.criterion.gamma == 0.5  # the end value at the last of the 4 steps
    assert model.criterion.threshold == 0.2  # ... and in the last of the 2 epochs
    # The module given as an object was stored as a plain class_path description.
    assert checkpoint["hyper_parameters"]["criterion"]["class_path"].endswith("FocalLoss")
    assert checkpoint["hyper_parameters"]["criterion"]["init_args"]["alpha"] == pytest.approx(
        [0.1] * 10
    )
    restored = ClassifierModule.load_from_checkpoint(path, weights_only=True)
    assert isinstance(restored.criterion, FocalLoss)


def test_schedule_of_missing_attribute_fails_before_training(tmp_path):
    model = ClassifierModule("focal", hidden=[16])
    t = trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    t.callbacks.append(LossScheduler("gama", LinearSchedule(0.0, 1.0)))
    with pytest.raises(ValueError, match="gama"):
        t.fit(model, DigitsDataModule())
    assert t.global_step == 0


def test_set_criterion_swaps_and_logs_only_scheduled_hyperparameters(tmp_path):
    model = ClassifierModule("ce", hidden=[16])
    model.set_criterion({"class_path": "lightning_losses.GammaCrossEntropyLoss"}, gamma=0.25)
    t = trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    t.fit(model, DigitsDataModule())
    assert model.criterion.gamma == 0.25
    # No schedule changes gamma, threshold or label_smoothing: constants, not metrics.
    assert not [key for key in t.callback_metrics if key.startswith("criterion/")]


def test_validation_step_returns_logits_and_target():
    model = ClassifierModule("ce", hidden=[16])
    x = torch.randn(5, 64)
    y = torch.randint(0, 10, (5,))
    model.log = lambda *args, **kwargs: None  # outside a trainer: nothing to log to
    out = model.validation_step((x, y), 0)
    assert torch.equal(out["target"], y)
    assert torch.allclose(out["logits"], model(x))
    assert torch.allclose(out["loss"], torch.nn.functional.cross_entropy(model(x), y))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": "ranking"}, "task"),
        ({"head": "sphereface"}, "head"),
        ({"head": "normface", "task": "binary"}, "head"),
        ({"temperature": 0.0}, "temperature"),
        ({"criterion": "focall"}, "focall"),
    ],
)
def test_bad_model_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClassifierModule(**kwargs)
