"""A method that cannot be scored: PostHocCalibration warns, and logs NaN rather than a stale value.

A real Trainer and a real MLflow store (sqlite); the module's validation outputs are given per
epoch, so that isotonic regression scores a finite cross-validated NLL in epoch 0 and an
infinite one in epoch 1 (the references, :func:`select_calibrator` on the same outputs, say
so). The latest ``posthoc/cv_nll_isotonic`` in the store must be epoch 1's: NaN.

Isotonic regression floors its probabilities since issue 38, so it no longer gives 0: every
test here runs it without the floor (its maps' values, ``_mapped_log_probs``), a stand-in for
any calibrator that emits probability 0, so that the unscored path stays tested.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import pytest
import torch
from helpers.warned import package_warns
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.calibration.posthoc import IsotonicCalibration, get_calibrator
from lightning_losses.calibration.posthoc.select import select_calibrator
from lightning_losses.callbacks import PostHocCalibration
from lightning_losses.warning import LightningLossesWarning

METHODS = ("temperature", "isotonic")
FOLDS = 5
N = 60


def mixed_outputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Two-class logits whose most confident samples are wrong and least confident right.

    The isotonic map of the top-label confidence then lies strictly between 0 and 1 on every
    fold: no held-out label gets probability 0.
    """
    margin = torch.linspace(0.1, 4.0, N, dtype=torch.float64)
    logits = torch.stack([margin, torch.zeros_like(margin)], dim=1)  # class 0 predicted
    target = (torch.arange(N) % 3 == 0).long()  # a third wrong, at every confidence
    target[-10:] = 1  # the 10 most confident: wrong
    target[:10] = 0  # the 10 least confident: right
    return logits, target


def separated_but_one() -> tuple[torch.Tensor, torch.Tensor]:
    """Every prediction right but one, at high confidence: the folds without it map to 1.

    Both classes are predicted (and are labels), so no fold falls back for a single class.
    """
    margin = torch.linspace(0.1, 4.0, N, dtype=torch.float64)
    sign = torch.where(torch.arange(N) % 2 == 0, 1.0, -1.0).to(torch.float64)
    logits = torch.stack([margin * sign, torch.zeros_like(margin)], dim=1)
    target = (sign < 0).long()  # the predicted class
    target[-3] = 1 - target[-3]  # one wrong, the third most confident
    return logits, target


OUTPUTS = [mixed_outputs(), separated_but_one()]  # by epoch


@pytest.fixture(autouse=True)
def isotonic_without_its_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """IsotonicCalibration as it was before its floor: probability 0 where a map gives 0."""
    monkeypatch.setattr(IsotonicCalibration, "_log_probs", IsotonicCalibration._mapped_log_probs)


class GivenOutputs(L.LightningModule):
    """Trains a dummy weight; validation returns the logits and targets given for the epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, dtype=torch.float64))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return (self.weight - 1.0).square().sum()

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        (index,) = batch
        logits, target = OUTPUTS[self.current_epoch]
        return {"logits": logits[index], "target": target[index]}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(module: L.LightningModule, callbacks: list[Any], root: Any, logger: Any = False) -> None:
    """Two epochs of ``module`` on the N sample indices (validation: the given outputs)."""
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        logger=logger,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        default_root_dir=root,
    )
    index = DataLoader(TensorDataset(torch.arange(N)), batch_size=16)
    trainer.fit(module, index, index)


def test_isotonic_unscored_in_the_final_fit_is_logged_as_nan_not_as_epoch_0s(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    references = [
        select_calibrator([get_calibrator(m) for m in METHODS], *out, folds=FOLDS)
        for out in OUTPUTS
    ]
    # The premise, from the references: isotonic scores in epoch 0, not in epoch 1.
    assert math.isfinite(references[0].scores["isotonic"])
    assert references[1].scores["isotonic"] == math.inf
    assert all(math.isfinite(r.scores["temperature"]) for r in references)

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # restored after the test
    # its artifacts in tmp_path (a SQLite store's default artifact root is ./mlruns of the cwd)
    logger = MLFlowLogger(
        experiment_name="unscored",
        tracking_uri=uri,
        artifact_location=(tmp_path / "artifacts").as_uri(),
    )
    callback = PostHocCalibration(methods=METHODS, folds=FOLDS, log_diagrams=False)
    with package_warns(
        r"^PostHocCalibration: isotonic cannot be scored at epoch 1: its cross-validated NLL "
        r"is inf: on a held-out fold it gave a sample's true label probability 0 .* It is not "
        r"chosen, and posthoc/cv_nll_isotonic is logged as NaN"
    ):
        fit(GivenOutputs(), [callback], tmp_path, logger)

    assert callback.selection.scores == pytest.approx(references[1].scores)
    assert callback.method == references[1].method != "isotonic"
    client = MlflowClient(uri)
    run = client.get_run(logger.run_id)
    history = client.get_metric_history(run.info.run_id, "posthoc/cv_nll_isotonic")
    values = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert len(values) == 2
    assert values[0] == pytest.approx(references[0].scores["isotonic"], rel=1e-6)
    assert math.isnan(values[1])  # epoch 1's own value, not epoch 0's
    assert math.isnan(run.data.metrics["posthoc/cv_nll_isotonic"])  # the latest: NaN
    for method in ("none", "temperature"):
        assert run.data.metrics[f"posthoc/cv_nll_{method}"] == pytest.approx(
            references[1].scores[method], rel=1e-6
        )


def test_a_method_unscored_in_every_epoch_warns_once_and_logs_nan_each_time(tmp_path):
    OUTPUTS_BOTH = [separated_but_one(), separated_but_one()]
    callback = PostHocCalibration(methods=("isotonic",), folds=FOLDS, log_diagrams=False)

    class Both(GivenOutputs):
        def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
            (index,) = batch
            logits, target = OUTPUTS_BOTH[self.current_epoch]
            return {"logits": logits[index], "target": target[index]}

    logged: list[float] = []

    class Spy(L.Callback):
        def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
            logged.append(float(trainer.callback_metrics["posthoc/cv_nll_isotonic"]))

    with pytest.warns() as caught:
        fit(Both(), [callback, Spy()], tmp_path)
    unscored = [w for w in caught if "cannot be scored" in str(w.message)]
    assert len(unscored) == 1, [str(w.message) for w in caught]
    assert "isotonic cannot be scored at epoch 0" in str(unscored[0].message)
    assert len(logged) == 2
    assert all(math.isnan(value) for value in logged)
    assert callback.method == "none"


def test_the_chosen_map_at_a_bound_is_warned_once_per_fit(tmp_path):
    # Every validation label is the predicted class, in both epochs: temperature scaling is
    # chosen (its held-out NLL is below the identity's) and its T runs to 0.
    margin = torch.linspace(0.5, 4.0, N, dtype=torch.float64)
    sign = torch.where(torch.arange(N) % 2 == 0, 1.0, -1.0).to(torch.float64)
    logits = torch.stack([margin * sign, torch.zeros_like(margin)], dim=1)
    target = (sign < 0).long()

    class Separated(GivenOutputs):
        def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
            (index,) = batch
            return {"logits": logits[index], "target": target[index]}

    callback = PostHocCalibration(methods=("temperature",), folds=FOLDS, log_diagrams=False)
    with pytest.warns(LightningLossesWarning) as caught:
        fit(Separated(), [callback], tmp_path)
    ours = [str(w.message) for w in caught if issubclass(w.category, LightningLossesWarning)]
    assert len(ours) == 1, ours
    assert ours[0].startswith(
        "PostHocCalibration: the chosen TemperatureScaler (temperature) ran to a bound of its "
        "fit at epoch 0: the fitted temperature T="
    )
    assert "runs to 0: every validation label is the arg-max of its logits" in ours[0]
    assert callback.method == "temperature"
    assert callback.calibrator.bound in ours[0]
