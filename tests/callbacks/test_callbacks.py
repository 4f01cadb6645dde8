"""LossScheduler, GammaAnnealing and LossSwitch in real (tiny) Lightning runs.

The model records, inside ``training_step``, the criterion it is about to use: its type and its
``gamma`` and ``threshold``. The run has 24 samples in batches of 4, so 6 steps an epoch; the
expected values are the closed forms with the boundaries resolved by hand.
"""

from __future__ import annotations

import doctest
import math
import re
import warnings
from typing import Any, NamedTuple

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers.steps import SaveAtStep
from helpers.warned import REPLACED, RETIMED, package_warns
from jsonargparse import ArgumentParser
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

import lightning_losses.callbacks.loss_scheduler as loss_scheduler_module
import lightning_losses.callbacks.loss_switch as loss_switch_module
from lightning_losses import CrossEntropyLoss, FocalLoss, GammaCrossEntropyLoss
from lightning_losses.callbacks import (
    ConstantSchedule,
    ExponentialSchedule,
    GammaAnnealing,
    LinearSchedule,
    LossScheduler,
    LossSwitch,
    StepSchedule,
)
from lightning_losses.lightning.mixin import LossMixin

STEPS_PER_EPOCH = 6  # 24 samples, batch size 4


class Seen(NamedTuple):
    step: int
    epoch: int
    criterion: type
    gamma: float | None
    threshold: float | None


class Tiny(LossMixin, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.set_criterion("gamma_ce", gamma=0.0)
        self.seen: list[Seen] = []

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        criterion = self.criterion
        self.seen.append(
            Seen(
                self.trainer.global_step,
                self.trainer.current_epoch,
                type(criterion),
                getattr(criterion, "gamma", None),
                getattr(criterion, "threshold", None),
            )
        )
        return self.compute_loss(self(x), y)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    @override
    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(24, 4, generator=generator)
        y = torch.randint(0, 3, (24,), generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=4)


class NoCriterion(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        raise AssertionError("training must not start")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    @override
    def train_dataloader(self) -> DataLoader:
        return Tiny().train_dataloader()


class BoundedGamma(nn.Module):
    """A test criterion whose ``gamma`` must lie in [0, 1], checked by its own method.

    It has the ``check_hyperparameters()`` the loss modules of the package have, so these
    tests do not depend on them: ``(1 + gamma) * cross_entropy``.
    """

    def __init__(self, gamma: float = 0.0) -> None:
        super().__init__()
        self.gamma = gamma

    def check_hyperparameters(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1]; got gamma={self.gamma!r}")

    @override
    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (1.0 + self.gamma) * F.cross_entropy(logits, target)


BOUNDED = f"{__name__}.BoundedGamma"


class HookSpy(Callback):
    """Records which of the fit hooks ran (and whether any training batch started)."""

    def __init__(self) -> None:
        self.hooks: list[str] = []

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.hooks.append("on_fit_start")

    @override
    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.hooks.append("on_sanity_check_start")

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.hooks.append("on_train_start")

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.hooks.append("on_train_batch_start")


def fit(
    callbacks: list[Callback], max_epochs: int = 3, model: L.LightningModule | None = None, **kw
) -> tuple[L.LightningModule, L.Trainer]:
    model = Tiny() if model is None else model
    trainer = L.Trainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
    )
    trainer.fit(model, **kw)
    return model, trainer


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def logged(trainer: L.Trainer, name: str) -> float:
    """A logged value (stored as a float32 tensor)."""
    return float(trainer.callback_metrics[name])


def clamp01(x: float) -> float:
    return min(max(x, 0.0), 1.0)


# 3 epochs of 6 steps: T = 18 steps, 0..17; a fraction f is step round(f * 17):
# 0.1 * 17 = 1.7 -> 2, 0.9 * 17 = 15.3 -> 15, 0.25 * 17 = 4.25 -> 4 and 0.75 * 17 = 12.75 -> 13.
STEP_CASES = [
    pytest.param(
        lambda: GammaAnnealing(start=0.0, end=1.0, begin=0.1, until=0.9),
        lambda g: clamp01((g - 2) / (15 - 2)),
        id="gamma-annealing-linear-fractions",
    ),
    pytest.param(
        lambda: GammaAnnealing(start=1.0, end=0.2, begin=3, until=12, shape="cosine"),
        lambda g: 0.2 + (1.0 - 0.2) * (1 + math.cos(math.pi * clamp01((g - 3) / 9))) / 2,
        id="gamma-annealing-cosine-steps",
    ),
    pytest.param(
        lambda: LossScheduler("gamma", ExponentialSchedule(0.9, 0.1, start=0.25, end=0.75)),
        lambda g: 0.9 * (0.1 / 0.9) ** clamp01((g - 4) / (13 - 4)),
        id="loss-scheduler-exponential-fractions",
    ),
]


@pytest.mark.parametrize(("make_callback", "expected"), STEP_CASES)
def test_step_interval_sets_the_closed_form_at_every_step(make_callback, expected):
    # Tiny's criterion was given gamma=0.0: a schedule that starts elsewhere replaces it.
    with package_warns(REPLACED, expected=expected(0) != 0.0):
        model, trainer = fit([make_callback()])
    assert [seen.step for seen in model.seen] == list(range(3 * STEPS_PER_EPOCH))
    for seen in model.seen:
        assert close(seen.gamma, expected(seen.step)), seen
    # The module logs criterion/gamma itself (LossMixin.compute_loss): the one gamma metric.
    assert math.isclose(logged(trainer, "criterion/gamma"), expected(17), rel_tol=1e-6)
    assert "schedule/gamma" not in trainer.callback_metrics


def test_epoch_interval_sets_the_closed_form_at_every_epoch():
    # 3 epochs, 0..2: until=1.0 resolves to the last one, epoch 2, so gamma = 0.6 * epoch / 2.
    model, trainer = fit([GammaAnnealing(start=0.0, end=0.6, until=1.0, interval="epoch")])
    assert [seen.epoch for seen in model.seen] == [e for e in range(3) for _ in range(6)]
    for seen in model.seen:
        assert close(seen.gamma, 0.6 * seen.epoch / 2), seen
    assert model.seen[-1].gamma == 0.6
    assert math.isclose(logged(trainer, "criterion/gamma"), 0.6, rel_tol=1e-6)
    assert "schedule/gamma" not in trainer.callback_metrics


def test_two_schedulers_on_two_attributes_and_their_checkpoint_states(tmp_path):
    gamma = LossScheduler("gamma", LinearSchedule(0.0, 0.5, start=0, end=12))
    threshold = LossScheduler("threshold", StepSchedule([0.0, 0.1, 0.3], [1, 2]), interval="epoch")
    model, trainer = fit([gamma, threshold])
    assert len(model.seen) == 18
    for seen in model.seen:
        assert close(seen.gamma, 0.5 * min(seen.step / 12, 1.0)), seen
        assert seen.threshold == [0.0, 0.1, 0.3][seen.epoch], seen

    path = tmp_path / "two.ckpt"
    trainer.save_checkpoint(path)
    states = torch.load(path, weights_only=True)["callbacks"]
    # "total": what the schedule was timed with (estimated stepping batches, or max_epochs).
    assert states["LossScheduler{'attribute': 'gamma'}"] == {
        "attribute": "gamma",
        "interval": "step",
        "last_value": 0.5,
        "total": 18,
    }
    assert states["LossScheduler{'attribute': 'threshold'}"] == {
        "attribute": "threshold",
        "interval": "epoch",
        "last_value": 0.3,
        "total": 3,
    }


def test_unknown_attribute_fails_at_setup():
    model, spy = Tiny(), HookSpy()
    with pytest.raises(ValueError, match=r"'gama'.*GammaCrossEntropyLoss.*: gamma, threshold"):
        fit([LossScheduler("gama", ConstantSchedule(0.5)), spy], model=model)
    assert spy.hooks == []
    assert model.seen == []


def test_method_name_is_not_a_hyperparameter():
    model = Tiny()
    with pytest.raises(ValueError, match=r"'forward'"):
        fit([LossScheduler("forward", ConstantSchedule(0.5))], model=model)
    assert model.seen == []


def test_module_without_criterion_fails_at_setup():
    with pytest.raises(
        ValueError,
        match=r"^GammaAnnealing\(attribute='criterion'\): NoCriterion has no attribute "
        r"'criterion' holding its loss; keep the loss module in an attribute",
    ):
        fit([GammaAnnealing()], model=NoCriterion())


def test_loss_switch_on_a_module_without_criterion_fails_at_setup():
    # A module that computes its loss itself: switching would change nothing, silently.
    with pytest.raises(
        ValueError, match=r"no attribute 'criterion'.*LossSwitch replaces NoCriterion\.criterion"
    ):
        fit([LossSwitch(["ce", "focal"], milestones=[1])], model=NoCriterion())


@pytest.mark.parametrize(
    ("interval", "source"),
    [
        ("epoch", r"trainer\.max_epochs=-1, max_steps=-1"),
        ("step", r"trainer\.estimated_stepping_batches=inf \(max_epochs=-1, max_steps=-1\)"),
    ],
)
def test_fraction_with_unbounded_training_fails_before_the_first_step(interval, source):
    model = Tiny()
    trainer = L.Trainer(
        max_epochs=-1,  # no end: the total is unknown
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[GammaAnnealing(until=0.5, interval=interval)],
    )
    unit = "optimizer steps" if interval == "step" else "epochs"
    with pytest.raises(
        ValueError,
        match=rf"^GammaAnnealing\(criterion\.gamma\): the schedule LinearSchedule\(.*\) has "
        rf"boundaries given as fractions of training, but the number of {unit} of this run is "
        rf"unknown \({source}\): pass total=<the number of {unit}> to GammaAnnealing",
    ):
        trainer.fit(model)
    assert model.seen == []


@pytest.mark.parametrize(
    "focal",
    [
        {"name": "focal", "gamma": 2.0},
        {"class_path": "lightning_losses.FocalLoss", "init_args": {"gamma": 2.0}},
    ],
)
def test_loss_switch_changes_the_criterion_at_the_milestone(focal):
    model, trainer = fit([LossSwitch(["ce", focal], milestones=[1])])
    assert len(model.seen) == 18
    for seen in model.seen:
        if seen.epoch == 0:
            assert seen.criterion is CrossEntropyLoss, seen
        else:
            assert seen.criterion is FocalLoss, seen
            assert seen.gamma == 2.0, seen
    assert logged(trainer, "switch/index") == 1.0


def test_scheduler_follows_the_switched_criterion():
    # The scheduler comes first, so at the start of epoch 2 it sets gamma on the outgoing
    # criterion; it sets it again on the new one before the first batch.
    annealing = GammaAnnealing(start=0.0, end=0.9, until=1.0, interval="epoch")
    with package_warns(REPLACED + r".*criteria\[1\]='focal'"):  # focal was given gamma=2.0
        model, _ = fit([annealing, LossSwitch(["gamma_ce", "focal"], milestones=[2])])
    for seen in model.seen:
        assert seen.criterion is (GammaCrossEntropyLoss if seen.epoch < 2 else FocalLoss), seen
        assert close(seen.gamma, 0.9 * seen.epoch / 2), seen


def test_scheduler_checks_every_switched_criterion_before_training():
    # The switch to cross-entropy (no gamma) comes at epoch 1; it fails before any step.
    model, spy = Tiny(), HookSpy()
    callbacks = [LossSwitch(["gamma_ce", "ce"], milestones=[1]), GammaAnnealing(), spy]
    with pytest.raises(
        ValueError,
        match=r"GammaAnnealing cannot schedule 'gamma': the criterion CrossEntropyLoss of "
        r"LossSwitch criteria\[1\]='ce' \(from epoch 1\) has no hyper-parameter 'gamma'; its "
        r"hyper-parameters are: label_smoothing",
    ):
        fit(callbacks, model=model)
    assert "on_train_batch_start" not in spy.hooks
    assert model.seen == []


def test_loss_switch_bad_name_fails_at_setup():
    model, spy = Tiny(), HookSpy()
    with pytest.raises(ValueError, match=r"criteria\[1\].*unknown loss name 'focall'"):
        fit([LossSwitch(["ce", "focall"], milestones=[1]), spy], model=model)
    assert spy.hooks == []
    assert model.seen == []


@pytest.mark.parametrize(
    ("criteria", "milestones", "match"),
    [
        (["ce", "focal"], [], r"one more entry than milestones"),
        (["ce"], [1], r"one more entry than milestones"),
        (["ce", "focal", "ce"], [2, 2], r"milestones must be increasing"),
        (["ce", "focal"], [0.5], r"milestones\[0\] must be an int >= 0; got 0\.5 \(float\)"),
        (["ce", "focal"], [-1], r"milestones\[0\] must be >= 0; got -1"),
        (["ce", 3], [1], r"criteria\[1\] must be a loss name or a mapping"),
        ("ce", [], r"criteria must be a list"),
    ],
)
def test_loss_switch_bad_arguments(criteria, milestones, match):
    with pytest.raises(ValueError, match=match):
        LossSwitch(criteria, milestones)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"interval": "batch"}, r"interval must be one of"),
        ({"hyperparameter": "gamma.x"}, r"hyperparameter must be an attribute name"),
        ({"schedule": 0.5}, r"schedule must be callable"),
        ({"attribute": "loss fn"}, r"^LossScheduler\(attribute='loss fn'\): attribute must name"),
        ({"total": 0}, r"total must be >= 1; got 0"),
        # The keyword of the hyper-parameter before the loss's attribute could be chosen.
        (
            {"hyperparameter": None, "attribute": "gamma"},
            r"^LossScheduler needs hyperparameter=, the criterion's hyper-parameter to set",
        ),
    ],
)
def test_loss_scheduler_bad_arguments(kwargs, match):
    arguments = {"hyperparameter": "gamma", "schedule": ConstantSchedule(0.5), **kwargs}
    with pytest.raises(ValueError, match=match):
        LossScheduler(**arguments)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shape": "exp"}, r"shape must be one of"),
        ({"begin": 0.5, "until": 0.2}, r"until must be after begin; got begin=0\.5, until=0\.2"),
        ({"until": 2.0}, r"until is a float"),
        ({"start": math.nan}, r"start must be a finite real number"),
    ],
)
def test_gamma_annealing_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GammaAnnealing(**kwargs)


def test_state_keys_are_distinct():
    keys = {
        LossScheduler("gamma", ConstantSchedule(0.0)).state_key,
        LossScheduler("threshold", ConstantSchedule(0.0)).state_key,
        GammaAnnealing().state_key,
        LossSwitch(["ce", "focal"], [1]).state_key,
    }
    assert len(keys) == 4


def test_resumed_run_continues_the_step_schedule(tmp_path):
    # 4 epochs: T = 24 steps, begin 0.1 * 23 = 2.3 -> 2 and until 0.9 * 23 = 20.7 -> 21.
    def annealing() -> GammaAnnealing:
        return GammaAnnealing(start=0.0, end=1.0, begin=0.1, until=0.9, shape="cosine")

    def expected(g: int) -> float:
        return 1.0 + (0.0 - 1.0) * (1 + math.cos(math.pi * clamp01((g - 2) / 19))) / 2

    straight, _ = fit([annealing()], max_epochs=4)
    uninterrupted = {seen.step: seen.gamma for seen in straight.seen}
    assert sorted(uninterrupted) == list(range(24))
    for step, gamma in uninterrupted.items():
        assert close(gamma, expected(step)), (step, gamma)

    _, first = fit([annealing()], max_epochs=2)
    path = tmp_path / "half.ckpt"
    first.save_checkpoint(path)
    # A checkpoint of 2 epochs (12 steps) resumed to 4: the schedule's fractions move.
    with package_warns("timed for a total of 12 steps.*" + RETIMED):
        resumed, _ = fit([annealing()], max_epochs=4, ckpt_path=path)
    assert [seen.step for seen in resumed.seen] == list(range(12, 24))
    for seen in resumed.seen:
        assert seen.gamma == uninterrupted[seen.step], seen


def test_resumed_run_uses_the_criterion_of_its_epoch(tmp_path):
    def switch() -> LossSwitch:
        return LossSwitch(["ce", {"name": "focal", "gamma": 2.0}], milestones=[3])

    _, first = fit([switch()], max_epochs=2)
    path = tmp_path / "half.ckpt"
    first.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["callbacks"]
    assert saved[switch().state_key] == {"milestones": [3], "last_index": 0}

    resumed, _ = fit([switch()], max_epochs=4, ckpt_path=path)
    assert [(seen.epoch, seen.criterion) for seen in resumed.seen] == [
        (2, CrossEntropyLoss)
    ] * 6 + [(3, FocalLoss)] * 6


@pytest.mark.parametrize(
    ("interval", "expected"),
    [
        # 4 epochs: T = 24 steps, begin 0.1 * 23 = 2.3 -> 2, until 0.9 * 23 = 20.7 -> 21.
        ("step", lambda seen: clamp01((seen.step - 2) / 19)),
        # epochs 0..3: begin 0.1 * 3 = 0.3 -> 0 and until 0.9 * 3 = 2.7 -> 3.
        ("epoch", lambda seen: seen.epoch / 3),
    ],
)
@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch")
def test_run_resumed_mid_epoch_is_right_from_its_first_step(tmp_path, interval, expected):
    # Lightning calls no on_train_epoch_start for the epoch a run resumes in, and the scheduler
    # comes before the switch: the switch must be in place before the first resumed batch.
    def callbacks() -> list[Callback]:
        return [
            GammaAnnealing(begin=0.1, until=0.9, interval=interval),
            LossSwitch(["gamma_ce", {"name": "focal", "gamma": 2.0}], milestones=[1]),
        ]

    path = tmp_path / "mid-epoch.ckpt"
    with package_warns(REPLACED):  # focal was given gamma=2.0
        fit([*callbacks(), SaveAtStep(path, 8)], max_epochs=2)
    # 2 epochs, then 4: the fractions of training fall on other steps.
    with package_warns(RETIMED), package_warns(REPLACED):
        resumed, _ = fit(callbacks(), max_epochs=4, ckpt_path=path)
    assert [seen.step for seen in resumed.seen] == list(range(8, 24))
    assert resumed.seen[0].epoch == 1
    for seen in resumed.seen:
        assert seen.criterion is FocalLoss, seen
        assert close(seen.gamma, expected(seen)), seen


# --- resuming with another length of training ---------------------------------------------------


def resume_with_more_epochs(tmp_path, make_callback) -> tuple[list[Seen], list[str]]:
    """Fit 2 epochs, save, resume to 4 epochs; the resumed steps and our warnings."""
    _, first = fit([make_callback()], max_epochs=2)
    path = tmp_path / "two-epochs.ckpt"
    first.save_checkpoint(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, _ = fit([make_callback()], max_epochs=4, ckpt_path=path)
    ours = [str(w.message) for w in caught if "criterion.gamma" in str(w.message)]
    return resumed.seen, ours


@pytest.mark.parametrize(
    ("interval", "saved", "now"),
    [("step", "12 steps", "is 24;"), ("epoch", "2 epochs", "is 4;")],
)
def test_resume_with_another_total_warns_once_naming_both(tmp_path, interval, saved, now):
    def annealing() -> GammaAnnealing:
        return GammaAnnealing(start=0.0, end=1.0, until=1.0, interval=interval)

    seen, ours = resume_with_more_epochs(tmp_path, annealing)
    assert len(ours) == 1, ours
    (message,) = ours
    assert message.startswith("GammaAnnealing (criterion.gamma): ")
    assert f"timed for a total of {saved}" in message
    assert f"this run's total {now}" in message
    assert "give the boundaries as ints" in message
    assert len(seen) == 2 * STEPS_PER_EPOCH  # it warns and goes on


def test_resume_with_int_boundaries_and_another_total_is_silent_and_exact(tmp_path):
    def annealing() -> GammaAnnealing:
        return GammaAnnealing(start=0.0, end=1.0, begin=2, until=20)  # absolute steps

    straight, _ = fit([annealing()], max_epochs=4)
    uninterrupted = {seen.step: seen.gamma for seen in straight.seen}
    seen, ours = resume_with_more_epochs(tmp_path, annealing)
    assert ours == []
    assert [s.step for s in seen] == list(range(12, 24))
    for each in seen:
        assert each.gamma == uninterrupted[each.step] == clamp01((each.step - 2) / 18), each


def test_resume_with_the_same_total_is_silent(tmp_path):
    _, first = fit([GammaAnnealing(until=1.0)], max_epochs=2)
    path = tmp_path / "two-epochs.ckpt"
    first.save_checkpoint(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit([GammaAnnealing(until=1.0)], max_epochs=2, ckpt_path=path)
    assert not [w for w in caught if "criterion.gamma" in str(w.message)]


# --- schedules checked against the loss before the first training step ---------------------------


def fit_bounded(callbacks: list[Callback], max_epochs: int = 3) -> tuple[Tiny, HookSpy]:
    """Fit ``Tiny`` with a ``BoundedGamma`` criterion; the error must come before any step."""
    model, spy = Tiny(), HookSpy()
    model.set_criterion(BoundedGamma())
    fit([*callbacks, spy], max_epochs=max_epochs, model=model)
    return model, spy


@pytest.mark.parametrize(
    ("make_callback", "message"),
    [
        pytest.param(
            lambda: GammaAnnealing(start=0.0, end=2.0),
            # 3 epochs of 6 steps, 0..17: until=1.0 is step 17.
            "GammaAnnealing (criterion.gamma): the schedule reaches gamma=2.0 at step 17 "
            "(the last step), but BoundedGamma rejects it: gamma must lie in [0, 1]; "
            "got gamma=2.0",
            id="end",
        ),
        pytest.param(
            lambda: GammaAnnealing(start=-0.5, end=1.0, begin=3, until=9),
            "GammaAnnealing (criterion.gamma): the schedule reaches gamma=-0.5 at step 0, but "
            "BoundedGamma rejects it: gamma must lie in [0, 1]; got gamma=-0.5",
            id="start",
        ),
        pytest.param(
            lambda: LossScheduler("gamma", StepSchedule([0.0, 1.5, 1.0], [0.25, 0.5])),
            # 0.25 * 17 = 4.25 -> 4.
            "LossScheduler (criterion.gamma): the schedule reaches gamma=1.5 at step 4, but "
            "BoundedGamma rejects it: gamma must lie in [0, 1]; got gamma=1.5",
            id="step-value",
        ),
        pytest.param(
            lambda: LossScheduler("gamma", LinearSchedule(0.0, 3.0, end=1.0), interval="epoch"),
            "LossScheduler (criterion.gamma): the schedule reaches gamma=3.0 at epoch 2 "
            "(the last epoch), but BoundedGamma rejects it",
            id="epoch",
        ),
    ],
)
def test_schedule_leaving_the_range_fails_before_the_first_step(make_callback, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        fit_bounded([make_callback()])


class TinyWithValidation(Tiny):
    """``Tiny`` with a validation loop, so Lightning runs its sanity check before training."""

    def __init__(self) -> None:
        super().__init__()
        self.validated = 0

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.validated += 1

    @override
    def val_dataloader(self) -> DataLoader:
        return self.train_dataloader()


@pytest.mark.parametrize(
    ("interval", "hooks"),
    [
        # An epoch schedule's total is max_epochs: checked when fitting starts.
        ("epoch", ["on_fit_start"]),
        # A step schedule's total needs the training data, which Lightning loads after it
        # restores a resumed run: checked when the sanity check starts, before it runs.
        ("step", ["on_fit_start", "on_sanity_check_start"]),
    ],
)
def test_error_comes_before_any_validation_or_training_step(interval, hooks):
    model, spy = TinyWithValidation(), HookSpy()
    model.set_criterion(BoundedGamma())
    with pytest.raises(ValueError, match=r"reaches gamma=2\.0"):
        fit([spy, GammaAnnealing(end=2.0, interval=interval)], model=model)
    assert spy.hooks == hooks  # the spy comes first: the hook where the check failed is last
    assert model.validated == 0
    assert model.seen == []


def test_without_a_sanity_check_a_step_schedule_is_checked_at_train_start():
    model, spy = Tiny(), HookSpy()  # no validation loop, so no sanity check
    model.set_criterion(BoundedGamma())
    with pytest.raises(ValueError, match=r"reaches gamma=2\.0"):
        fit([spy, GammaAnnealing(end=2.0)], model=model)
    assert spy.hooks == ["on_fit_start", "on_train_start"]
    assert model.seen == []


def test_schedule_inside_the_range_trains():
    model, _ = fit_bounded([GammaAnnealing(start=0.0, end=1.0)])
    assert len(model.seen) == 18
    assert model.seen[-1].gamma == 1.0  # the end value, exactly, at the last step


def test_value_past_the_end_of_training_is_not_reached():
    # until=30 is after the 18 steps of training: at most 2.0 * 17 / 30 at the last step, 17.
    with pytest.raises(ValueError, match=rf"reaches gamma={2.0 * 17 / 30!r} at step 17 \(the last"):
        fit_bounded([GammaAnnealing(start=0.0, end=2.0, until=30)])
    model, _ = fit_bounded([GammaAnnealing(start=0.0, end=2.0, until=34)])  # 1.0 at the end
    assert len(model.seen) == 18
    assert model.seen[-1].gamma == 1.0


def test_loss_switch_stage_with_an_invalid_value_fails_at_setup():
    stage = {"class_path": BOUNDED, "init_args": {"gamma": 5.0}}
    model, spy = Tiny(), HookSpy()
    with pytest.raises(ValueError, match=r"gamma must lie in \[0, 1\]; got gamma=5\.0") as error:
        fit([LossSwitch(["ce", stage], milestones=[2]), spy], model=model)
    assert str(error.value) == (
        f"LossSwitch criteria[1]={stage!r} (from epoch 2): gamma must lie in [0, 1]; got gamma=5.0"
    )
    assert spy.hooks == []
    assert model.seen == []


@pytest.mark.parametrize(
    ("interval", "milestone", "where"),
    [("epoch", 2, "epoch 1"), ("step", 7, "step 6")],
)
def test_schedule_is_checked_against_each_switched_criterion_in_its_epochs(
    interval, milestone, where
):
    # Stage 0 (epoch 0, steps 0-5) takes any gamma; BoundedGamma from epoch 1 (step 6) on.
    schedule = StepSchedule([3.0, 0.5], milestones=[milestone])
    switch = LossSwitch([{"name": "focal", "gamma": 3.0}, {"class_path": BOUNDED}], milestones=[1])
    message = (
        f"LossScheduler (criterion.gamma): the schedule reaches gamma=3.0 at {where}, but "
        f"BoundedGamma of LossSwitch criteria[1]={{'class_path': {BOUNDED!r}}} (from epoch 1) "
        "rejects it: "
        "gamma must lie in [0, 1]; got gamma=3.0"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        fit_bounded([LossScheduler("gamma", schedule, interval=interval), switch])


@pytest.mark.parametrize(("interval", "milestone"), [("epoch", 1), ("step", 6)])
def test_schedule_aligned_with_the_switch_trains(interval, milestone):
    schedule = StepSchedule([3.0, 0.5], milestones=[milestone])
    switch = LossSwitch([{"name": "focal", "gamma": 3.0}, {"class_path": BOUNDED}], milestones=[1])
    with package_warns(REPLACED):  # BoundedGamma was given gamma=0.0, the schedule sets 0.5
        model, _ = fit_bounded([LossScheduler("gamma", schedule, interval=interval), switch])
    assert [(s.criterion, s.gamma) for s in model.seen] == [(FocalLoss, 3.0)] * 6 + [
        (BoundedGamma, 0.5)
    ] * 12


def test_gamma_annealing_beyond_one_on_gamma_ce_fails_before_the_first_step():
    # Uses GammaCrossEntropyLoss.check_hyperparameters (lightning_losses/losses.py).
    model, spy = Tiny(), HookSpy()  # GammaCrossEntropyLoss(gamma=0.0)
    message = (
        "GammaAnnealing (criterion.gamma): the schedule reaches gamma=2.0 at step 17 (the last "
        "step), but GammaCrossEntropyLoss rejects it: "
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}") as error:
        fit([GammaAnnealing(end=2.0), spy], model=model)
    reason = str(error.value).split("rejects it: ", 1)[1]  # the loss's own message
    assert "gamma" in reason, reason
    assert "2.0" in reason, reason
    assert "on_train_batch_start" not in spy.hooks


def test_callbacks_from_yaml():
    parser = ArgumentParser()
    parser.add_argument("--callbacks", type=list[Callback])
    config = parser.parse_string(
        """
        callbacks:
          - class_path: lightning_losses.callbacks.LossScheduler
            init_args:
              hyperparameter: threshold
              schedule:
                class_path: lightning_losses.callbacks.StepSchedule
                init_args: {values: [0.0, 0.1], milestones: [0.5]}
              interval: epoch
          - class_path: lightning_losses.callbacks.GammaAnnealing
            init_args: {begin: 0.1, until: 0.9, shape: cosine}
          - class_path: lightning_losses.callbacks.LossSwitch
            init_args:
              criteria: [ce, {class_path: lightning_losses.FocalLoss, init_args: {gamma: 2.0}}]
              milestones: [3]
        """
    )
    threshold, annealing, switch = parser.instantiate(config).callbacks
    assert isinstance(threshold.schedule, StepSchedule)
    assert threshold.schedule(5, 10) == 0.1
    assert threshold.interval == "epoch"
    assert repr(annealing.schedule) == (
        "CosineSchedule(start_value=0.0, end_value=1.0, start=0.1, end=0.9)"
    )
    assert switch.criteria[1] == {
        "class_path": "lightning_losses.FocalLoss",
        "init_args": {"gamma": 2.0},
    }


@pytest.mark.parametrize("module", [loss_scheduler_module, loss_switch_module])
def test_docstring_examples(module):
    results = doctest.testmod(module)
    assert results.attempted > 0
    assert results.failed == 0
