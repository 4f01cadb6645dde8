"""A schedule reaches its end value at the last training step, in a plain LightningModule.

The module keeps its loss as ``self.loss_fn`` (no LossMixin) and records, inside
``training_step``, the ``gamma`` its loss is about to use, with the trainer's step and epoch.
Every test compares the whole recorded sequence with a closed form written here:
``GammaAnnealing(0, 1)`` is ``gamma = k / (T - 1)`` at optimizer step ``k`` of ``T`` (epoch
``e`` of ``E``: ``e / (E - 1)``), so the loss of the last step uses exactly 1.0.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import pytest
import torch
from helpers.steps import SaveAtStep, StopAtStep
from helpers.warned import package_warns
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from lightning_losses import AdaFocalLoss, FocalLoss, GammaCrossEntropyLoss
from lightning_losses.callbacks import (
    AdaFocalUpdate,
    CosineSchedule,
    GammaAnnealing,
    LossScheduler,
    LossSwitch,
)

SAMPLES = 25  # batches of 4: 7 batches an epoch (the last one of a single sample)
BATCHES = 7


class Seen(NamedTuple):
    step: int
    epoch: int
    batch: int
    gamma: float
    loss: type


class Plain(L.LightningModule):
    """A LightningModule as a user writes one: its loss is ``self.loss_fn``."""

    def __init__(self, loss_fn: nn.Module | None = None, validate: bool = False) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.loss_fn = GammaCrossEntropyLoss(gamma=0.0) if loss_fn is None else loss_fn
        self.validate = validate
        self.seen: list[Seen] = []

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        gamma = float(getattr(self.loss_fn, "gamma", math.nan))
        trainer = self.trainer
        self.seen.append(
            Seen(trainer.global_step, trainer.current_epoch, batch_idx, gamma, type(self.loss_fn))
        )
        return self.loss_fn(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        return {"logits": self.layer(x).detach(), "target": y}

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    @override
    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(SAMPLES, 4, generator=generator)
        y = torch.randint(0, 3, (SAMPLES,), generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=4)

    @override
    def val_dataloader(self) -> DataLoader:
        return self.train_dataloader()


def fit(
    callbacks: list[Callback], model: Plain | None = None, ckpt_path: Any = None, **trainer: Any
) -> Plain:
    model = Plain() if model is None else model
    options: dict[str, Any] = {
        "max_epochs": 3,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        **trainer,
    }
    if model.validate:
        options.pop("limit_val_batches")
    L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        **options,
    ).fit(model, ckpt_path=ckpt_path)
    return model


def linear(k: int, last: int) -> float:
    """``GammaAnnealing(0, 1)`` at step (or epoch) ``k`` of ``0..last``: ``k / last``."""
    return k / last


def assert_sequence(seen: list[Seen], progress: list[int], last: int) -> None:
    """Each recorded gamma is ``linear(p, last)``; the last one exactly 1.0."""
    assert [linear(p, last) for p in progress] == pytest.approx(
        [s.gamma for s in seen], rel=1e-12, abs=1e-15
    )
    assert seen[-1].gamma == 1.0


@pytest.mark.parametrize(
    ("trainer", "steps"),
    [
        # 3 epochs of 7 batches: T = 21 optimizer steps.
        pytest.param({}, 21, id="odd-batches"),
        # limit_train_batches=5: 5 batches an epoch, T = 15.
        pytest.param({"limit_train_batches": 5}, 15, id="limit-train-batches"),
        # max_steps before the end of max_epochs: T = 10 (mid-epoch).
        pytest.param({"max_steps": 10}, 10, id="max-steps"),
        # one epoch, T = 7.
        pytest.param({"max_epochs": 1}, 7, id="one-epoch"),
    ],
)
def test_step_schedule_ends_at_one_at_the_last_step(trainer, steps):
    model = fit([GammaAnnealing(start=0.0, end=1.0, attribute="loss_fn")], **trainer)
    assert [s.step for s in model.seen] == list(range(steps))
    assert_sequence(model.seen, [s.step for s in model.seen], steps - 1)


def test_step_schedule_with_gradient_accumulation_ends_at_one_at_the_last_optimizer_step():
    # 7 batches accumulated 3 at a time: optimizer steps after batches 3, 6 and 7 (Lightning
    # steps on an epoch's last batch), so 3 steps an epoch and T = 9 over 3 epochs. Every batch
    # of one optimizer step uses the value of its step.
    model = fit([GammaAnnealing(attribute="loss_fn")], accumulate_grad_batches=3)
    assert [s.step for s in model.seen] == [
        3 * epoch + window for epoch in range(3) for window in (0, 0, 0, 1, 1, 1, 2)
    ]
    assert_sequence(model.seen, [s.step for s in model.seen], 8)
    last_window = [s for s in model.seen if s.step == 8]
    assert [s.gamma for s in last_window] == [1.0]  # the last step: the epoch's 7th batch alone


def test_accumulation_changing_by_epoch_counts_each_epochs_steps():
    # 7 batches: epoch 0 steps after each (7 steps), epochs 1 and 2 after every 2nd and the
    # last (4 each): T = 15, where Lightning's estimate (one accumulation for all) says 21.
    scheduler = GradientAccumulationScheduler({0: 1, 1: 2})
    model = fit([GammaAnnealing(attribute="loss_fn"), scheduler])
    assert [s.step for s in model.seen] == list(range(7)) + [
        7 + 4 * epoch + b // 2 for epoch in range(2) for b in range(7)
    ]
    assert_sequence(model.seen, [s.step for s in model.seen], 14)
    # An epoch schedule under max_steps=9: epoch 0 takes 7 steps, epoch 1 the other 2.
    model = fit(
        [GammaAnnealing(interval="epoch", attribute="loss_fn"), scheduler],
        max_epochs=-1,
        max_steps=9,
    )
    assert sorted({s.epoch for s in model.seen}) == [0, 1]
    assert_sequence(model.seen, [s.epoch for s in model.seen], 1)


@pytest.mark.parametrize(
    ("callbacks", "trainer", "progress", "last"),
    [
        # max_steps=10 ends training in epoch 1: the epochs come from the steps per epoch.
        ([], {"max_epochs": -1, "max_steps": 10}, "epoch", 1),
        # accumulation {0: 1, 1: 2}: 7 + 4 + 4 optimizer steps.
        ([GradientAccumulationScheduler({0: 1, 1: 2})], {}, "step", 14),
    ],
    ids=["epoch-max-steps", "accumulation-by-epoch"],
)
def test_totals_that_need_the_training_data_are_right_after_a_sanity_check(
    callbacks, trainer, progress, last
):
    # The check runs when the sanity check starts, before Lightning loads the training data
    # for the fit loop: the callback loads it, as estimated_stepping_batches does.
    interval = "epoch" if progress == "epoch" else "step"
    annealing = GammaAnnealing(interval=interval, attribute="loss_fn")
    model = fit(
        [annealing, *callbacks], model=Plain(validate=True), num_sanity_val_steps=2, **trainer
    )
    assert annealing.total == last + 1
    assert_sequence(model.seen, [getattr(s, progress) for s in model.seen], last)


def test_cosine_schedule_ends_at_one_at_the_last_step():
    model = fit([GammaAnnealing(shape="cosine", attribute="loss_fn")])
    expected = [(1 - math.cos(math.pi * s.step / 20)) / 2 for s in model.seen]
    assert [s.gamma for s in model.seen] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert model.seen[-1].gamma == 1.0


@pytest.mark.parametrize(
    ("trainer", "epochs"),
    [
        pytest.param({"max_epochs": 4}, 4, id="max-epochs"),
        # max_steps=10 ends training in the second epoch (7 steps an epoch): 2 epochs.
        pytest.param({"max_epochs": -1, "max_steps": 10}, 2, id="max-steps"),
        # 7 batches accumulated by 2: 4 optimizer steps an epoch; max_steps=9 -> 3 epochs.
        pytest.param(
            {"max_epochs": 5, "max_steps": 9, "accumulate_grad_batches": 2}, 3, id="accumulated"
        ),
    ],
)
def test_epoch_schedule_uses_the_end_value_in_the_last_epoch(trainer, epochs):
    model = fit([GammaAnnealing(interval="epoch", attribute="loss_fn")], **trainer)
    assert sorted({s.epoch for s in model.seen}) == list(range(epochs))
    assert_sequence(model.seen, [s.epoch for s in model.seen], epochs - 1)
    assert {s.gamma for s in model.seen if s.epoch == epochs - 1} == {1.0}


@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch")
@pytest.mark.parametrize(("interval", "save_at"), [("step", 9), ("epoch", 9)])
def test_resumed_run_ends_at_one(tmp_path, interval, save_at):
    def callbacks() -> list[Callback]:
        return [GammaAnnealing(interval=interval, attribute="loss_fn")]

    straight = fit(callbacks(), max_epochs=4)
    path = tmp_path / "mid.ckpt"
    fit([*callbacks(), SaveAtStep(path, save_at)], max_epochs=4)
    resumed = fit(callbacks(), ckpt_path=path, max_epochs=4)
    # Saved after optimizer step 9 (epoch 1, mid-epoch): the resumed run starts at step 9.
    assert [s.step for s in resumed.seen] == list(range(save_at, 28))
    uninterrupted = {s.step: s.gamma for s in straight.seen}
    assert [s.gamma for s in resumed.seen] == [uninterrupted[s.step] for s in resumed.seen]
    progress = [s.step if interval == "step" else s.epoch for s in resumed.seen]
    assert_sequence(resumed.seen, progress, 27 if interval == "step" else 3)


def test_unbounded_training_with_a_given_total_ends_at_one():
    # max_epochs=-1: the trainer cannot tell the length; total=12 says it (a callback stops
    # training after 12 optimizer steps).
    model = fit([GammaAnnealing(total=12, attribute="loss_fn"), StopAtStep(12)], max_epochs=-1)
    assert [s.step for s in model.seen] == list(range(12))
    assert_sequence(model.seen, list(range(12)), 11)


def test_a_given_total_replaces_the_trainers():
    # total=11 in a run of 21 steps: the end value from step 10 on.
    model = fit([GammaAnnealing(total=11, attribute="loss_fn")])
    assert [s.gamma for s in model.seen] == pytest.approx(
        [min(s.step / 10, 1.0) for s in model.seen], rel=1e-12, abs=1e-15
    )


# --- attribute=: the loss of a module that keeps it elsewhere than `criterion` -------------------


@pytest.mark.parametrize(
    "make_callback",
    [
        pytest.param(lambda a: GammaAnnealing(attribute=a), id="GammaAnnealing"),
        pytest.param(
            lambda a: LossScheduler("gamma", CosineSchedule(0.0, 1.0), attribute=a),
            id="LossScheduler",
        ),
        pytest.param(lambda a: LossSwitch(["ce", "focal"], [1], attribute=a), id="LossSwitch"),
        pytest.param(lambda a: AdaFocalUpdate(attribute=a), id="AdaFocalUpdate"),
    ],
)
def test_a_missing_loss_attribute_names_it_the_callback_and_the_one_to_pass(make_callback):
    callback = make_callback("criterion")
    name = type(callback).__name__
    model = Plain(loss_fn=AdaFocalLoss() if name == "AdaFocalUpdate" else None)
    with pytest.raises(
        ValueError,
        match=rf"^{name}\(attribute='criterion'\): Plain has no attribute 'criterion' holding "
        r"its loss; its loss is in loss_fn: pass attribute='loss_fn'",
    ):
        fit([callback], model=model)
    assert model.seen == []


def test_loss_scheduler_sets_the_given_attribute():
    schedule = CosineSchedule(0.0, 1.0)
    model = fit([LossScheduler("gamma", schedule, attribute="loss_fn")])
    expected = [(1 - math.cos(math.pi * s.step / 20)) / 2 for s in model.seen]
    assert [s.gamma for s in model.seen] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert model.seen[-1].gamma == 1.0


def test_loss_switch_replaces_the_given_attribute_and_the_schedule_follows_it():
    # Epoch 0: gamma-CE; from epoch 1: focal (given gamma=2.0, which the schedule replaces).
    switch = LossSwitch(["gamma_ce", {"name": "focal", "gamma": 2.0}], [1], attribute="loss_fn")
    annealing = GammaAnnealing(interval="epoch", attribute="loss_fn")
    with package_warns(r"GammaAnnealing sets loss_fn\.gamma from its schedule"):
        model = fit([annealing, switch])
    assert [(s.epoch, s.loss) for s in model.seen] == [
        (e, GammaCrossEntropyLoss if e == 0 else FocalLoss) for e in range(3) for _ in range(7)
    ]
    assert [s.gamma for s in model.seen] == [e / 2 for e in range(3) for _ in range(7)]
    assert not hasattr(model, "criterion")


def test_adafocal_update_reads_the_given_attribute():
    model = Plain(loss_fn=AdaFocalLoss(), validate=True)
    before = model.loss_fn.gammas.clone()
    update = AdaFocalUpdate(final_diagram=False, attribute="loss_fn")
    fit([update], model=model, max_epochs=1)
    assert update.updates == 1
    assert not torch.equal(model.loss_fn.gammas, before)


def test_describe_names_the_attribute():
    assert GammaAnnealing(attribute="loss_fn").describe() == (
        "GammaAnnealing: loss_fn.gamma 0.0 -> 1.0, linear, from step 0 to 100% of training"
    )
    assert LossScheduler("gamma", CosineSchedule(0.0, 1.0), attribute="loss_fn").describe() == (
        "LossScheduler: loss_fn.gamma = CosineSchedule(start_value=0.0, end_value=1.0, start=0, "
        "end=1.0) per step"
    )


# --- a total the trainer cannot tell ------------------------------------------------------------


class Endless(torch.utils.data.IterableDataset):
    """Batches without a length: the trainer cannot count the steps of an epoch."""

    def __iter__(self):
        generator = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(4, generator=generator), torch.randint(0, 3, (), generator=generator)


class EndlessPlain(Plain):
    @override
    def train_dataloader(self) -> DataLoader:
        return DataLoader(Endless(), batch_size=4)


@pytest.mark.parametrize(
    ("model", "trainer", "source"),
    [
        pytest.param(
            Plain,
            {"max_epochs": -1},
            r"trainer\.estimated_stepping_batches=inf \(max_epochs=-1, max_steps=-1\)",
            id="max-epochs-minus-one",
        ),
        pytest.param(
            EndlessPlain,
            {"max_epochs": 2},
            r"trainer\.estimated_stepping_batches=-1 \(max_epochs=2, max_steps=-1\)",
            id="iterable-without-length",
        ),
    ],
)
def test_an_unknown_total_is_an_error_naming_total(model, trainer, source):
    module = model()
    callbacks = [GammaAnnealing(attribute="loss_fn"), *trainer.pop("callbacks", [])]
    with pytest.raises(
        ValueError,
        match=r"^GammaAnnealing\(loss_fn\.gamma\): the schedule LinearSchedule\(.*\) has "
        r"boundaries given as fractions of training, but the number of optimizer steps of this "
        rf"run is unknown \({source}\.?\): pass total=<the number of optimizer steps> to "
        r"GammaAnnealing, or give the boundaries as ints",
    ):
        fit(callbacks, model=module, **trainer)
    assert module.seen == []


def test_the_docs_example_of_attribute_runs():
    text = (Path(__file__).resolve().parents[2] / "docs" / "schedules.md").read_text()
    block = text.split("## Your own module: `attribute=`", 1)[1].split("```python\n")[1]
    namespace: dict[str, Any] = {}
    exec(block.split("```", 1)[0], namespace)
    (annealing,) = [c for c in namespace["trainer"].callbacks if isinstance(c, GammaAnnealing)]
    assert annealing.attribute == "loss_fn"
    model = namespace["Existing"]()
    data = DataLoader(TensorDataset(torch.randn(12, 64), torch.randint(0, 10, (12,))), batch_size=4)
    L.Trainer(
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[GammaAnnealing(attribute="loss_fn")],
    ).fit(model, data)
    assert model.loss_fn.gamma == 1.0  # set for the last of the 6 steps
