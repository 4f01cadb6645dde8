"""A diagram says what it shows: its title names the run and its loss, its axes the task.

A binary diagram bins the positive-class probability against how often the sample is positive,
so its axes say ``P(positive)`` and "Observed positive frequency", not "Confidence" and
"Accuracy". The figures are drawn with matplotlib's Agg canvas and read back as text.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_losses import BinaryFocalLoss, FocalLoss, GammaCrossEntropyLoss
from lightning_losses.calibration import diagram as D
from lightning_losses.calibration import smooth_diagram as SD
from lightning_losses.calibration.smooth import smooth_grid_statistics
from lightning_losses.callbacks import CalibrationMonitor
from lightning_losses.callbacks.artifacts import diagram_title, loss_label

BINS = ([0, 2, 3, 5], [0.0, 0.7, 1.9, 4.6], [0, 1, 2, 4])


@pytest.mark.parametrize(
    ("task", "x", "y"),
    [
        ("multiclass", "Confidence", "Accuracy"),
        ("binary", "P(positive)", "Observed positive frequency"),
        ("multilabel", "P(label)", "Observed label frequency"),
    ],
)
def test_axes_say_what_the_bins_hold(task, x, y):
    top, hist = D.reliability_diagram(*BINS, task=task).axes
    assert (top.get_ylabel(), hist.get_xlabel()) == (y, x)
    assert top.containers[0].get_label() == y  # the bars, in the legend too
    alone = D.reliability_diagram(*BINS, task=task, show_histogram=False).axes[0]
    assert (alone.get_xlabel(), alone.get_ylabel()) == (x, y)
    mass, residual = smooth_grid_statistics(
        torch.tensor([0.9, 0.8, 0.7, 0.6]), torch.tensor([1.0, 0.0, 1.0, 0.0])
    )
    curve, density = SD.smooth_reliability_diagram(mass, residual, task=task).axes
    assert (curve.get_ylabel(), density.get_xlabel()) == (y, x)


def test_an_unknown_task_is_one_clear_error():
    with pytest.raises(ValueError, match=r"^task must be one of 'multiclass', 'binary', 'multil"):
        D.reliability_diagram(*BINS, task="regression")


def test_a_long_title_wraps_inside_the_figure():
    title = (
        "rare_digit_binary_soft_truncated_with_a_long_name · run 3f2a9c1e\n"
        "GammaCrossEntropyLoss(gamma=0.5, threshold=0.2, something=1.0) · val, epoch 19"
    )
    fig = D.reliability_diagram(*BINS, title=title)
    lines = fig.axes[0].get_title().splitlines()
    assert len(lines) == 5  # the second line wraps; the ECE last
    assert all(len(line) <= D.TITLE_WIDTH for line in lines)
    assert lines[-1] == "ECE = 0.1000"
    fig.canvas.draw()
    box = fig.axes[0].title.get_window_extent()
    assert box.y1 <= fig.bbox.y1  # not cut off at the top
    assert box.x0 >= 0
    assert box.x1 <= fig.bbox.x1


def test_loss_label_names_the_class_and_its_hyper_parameters():
    assert loss_label(FocalLoss(gamma=2.0)) == "FocalLoss(gamma=2.0)"
    gamma_ce = GammaCrossEntropyLoss(gamma=0.5, threshold=0.2)
    assert loss_label(gamma_ce) == "GammaCrossEntropyLoss(gamma=0.5, threshold=0.2)"
    assert loss_label(torch.nn.CrossEntropyLoss()) == "CrossEntropyLoss()"
    assert loss_label(FocalLoss(reduction="sum")) == "FocalLoss(gamma=2.0, reduction='sum')"
    gamma_ce.gamma = 0.75  # a schedule moved it: the title shows the value of the epoch drawn
    assert loss_label(gamma_ce) == "GammaCrossEntropyLoss(gamma=0.75, threshold=0.2)"


@pytest.mark.slow  # a fit into a new SQLite MLflow store
def test_a_fit_s_diagrams_name_the_run_and_the_loss(tmp_path, monkeypatch):
    from lightning_losses.data import RareDigitDataModule
    from lightning_losses.lightning import ClassifierModule
    from lightning_losses.tracking import TrackingLogger

    drawn = []

    def keep(draw):
        def wrapper(*args, **kwargs):
            drawn.append(draw(*args, **kwargs))
            return drawn[-1]

        return wrapper

    monkeypatch.setattr(D, "reliability_diagram", keep(D.reliability_diagram))
    monkeypatch.setattr(SD, "smooth_reliability_diagram", keep(SD.smooth_reliability_diagram))
    dm = RareDigitDataModule(batch_size=128, positive_fraction=0.2)
    model = ClassifierModule(
        BinaryFocalLoss(gamma=2.0),
        input_dim=dm.num_features,
        num_classes=dm.num_classes,
        num_tasks=dm.num_tasks,
        task=dm.task,
        hidden=[16],
    )
    logger = TrackingLogger(
        run_name="rare_probe",
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        save_dir=str(tmp_path / "runs"),
        log_model=False,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=2,
        logger=logger,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[CalibrationMonitor(smooth=True)],
    )
    trainer.fit(model, dm)
    assert len(drawn) == 2  # the binned and the smoothed diagram of the last epoch
    run = f"rare_probe · run {logger.run_id[:8]}"
    loss = "BinaryFocalLoss(gamma=2.0, alpha=None) · val, epoch 0"
    for fig in drawn:
        top, bottom = fig.axes
        assert top.get_title().splitlines()[:2] == [run, loss]
        assert bottom.get_xlabel() == "P(positive)"
        assert top.get_ylabel() == "Observed positive frequency"
    assert diagram_title(trainer, "val, epoch 0") == f"{run}\n{loss}"


def test_adafocal_s_diagram_names_its_loss(tmp_path, monkeypatch):
    from lightning.pytorch.loggers import CSVLogger

    from lightning_losses import AdaFocalLoss
    from lightning_losses.callbacks import AdaFocalUpdate
    from lightning_losses.data import DigitsDataModule
    from lightning_losses.lightning import ClassifierModule

    drawn = []

    def keep(*args, **kwargs):
        drawn.append(gamma_diagram(*args, **kwargs))
        return drawn[-1]

    gamma_diagram = D.gamma_diagram
    monkeypatch.setattr(D, "gamma_diagram", keep)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=2,
        logger=CSVLogger(tmp_path, name="run"),  # names no run: the title starts at the loss
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[AdaFocalUpdate(final_diagram=True)],
    )
    trainer.fit(ClassifierModule(AdaFocalLoss(num_bins=15), hidden=[8]), DigitsDataModule())
    (fig,) = drawn
    title = fig.axes[0].get_title()
    assert title.replace("\n", " ").startswith(
        "AdaFocalLoss(num_bins=15, gammas=[15 values]) · AdaFocal bins after validation, epoch 0"
    )
    assert len(title.splitlines()) == 3  # the line wrapped once, then the ECE
