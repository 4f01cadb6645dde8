"""ConformalPrediction under 2 gloo processes with uneven validation shares equals one process.

One DDP fit of the shipped ``digits_ce_posthoc`` config with a ``ConformalPrediction`` appended
after its ``PostHocCalibration`` (through the console; Lightning starts the second process),
one epoch: with batches of 179 the 359 validation samples split 180 / 179. The reference is one
process over the checkpoint's weights, in the processes' batches (so the float32 logits are the
same numbers), its own calibrator (read from the checkpoint) and the package's functions on the
samples the split picks by position: the thresholds must be equal exactly. The calibrator
itself must be the one-process fit on the other samples (to 1e-6, as in test_posthoc_ddp).
"""

from __future__ import annotations

import pytest
import torch
from helpers.ddp import DDP_ARGS, run_ddp_console
from helpers.paths import CONFIGS

from lightning_losses.calibration import conformal as CP
from lightning_losses.calibration.posthoc import get_calibrator
from lightning_losses.calibration.posthoc.select import select_calibrator
from lightning_losses.callbacks import ConformalPrediction, PostHocCalibration
from lightning_losses.callbacks.posthoc_parts import quiet_fits
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.classifier import ClassifierModule

BATCH = 179
METHODS = ("temperature", "vector", "ensemble_temperature", "isotonic")  # the config's
SCORES = ("lac", "aps", "raps", "saps")  # ConformalPrediction's defaults, alpha 0.1


def batched_logits(model: ClassifierModule) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validation logits in the processes' batches, their targets and positions (gathered order)."""
    features, target = DigitsDataModule().dataset("val").tensors
    order = torch.cat([torch.arange(rank, len(target), 2) for rank in (0, 1)])
    model.eval()
    with torch.no_grad():
        chunks = [model(features[rows]) for rows in order[:180].split(BATCH)]
        chunks += [model(features[rows]) for rows in order[180:].split(BATCH)]
    return torch.cat(chunks).double(), target[order], order


@pytest.mark.slow
def test_two_processes_give_the_one_process_thresholds(tmp_path):
    uri = f"sqlite:///{tmp_path}/ddp.db"
    run_ddp_console(
        [
            "fit",
            "--config",
            str(CONFIGS / "digits_ce_posthoc.yaml"),
            "--trainer.callbacks+=lightning_losses.callbacks.ConformalPrediction",
            f"--trainer.logger.init_args.tracking_uri={uri}",
            f"--data.init_args.batch_size={BATCH}",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            *DDP_ARGS,
        ],
        tmp_path,
    )
    checkpoint = next((tmp_path / "mlflow_runs").rglob("last.ckpt"))
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)["callbacks"]
    (state,) = [v for k, v in saved.items() if k.startswith("ConformalPrediction")]
    assert state["calibrated"] is True
    model = ClassifierModule.load_from_checkpoint(checkpoint, weights_only=True)
    logits, target, positions = batched_logits(model)
    part = ConformalPrediction().in_calibration_part(positions)
    assert state["n"] == int(part.sum())
    calibrator = PostHocCalibration.calibrator_from_checkpoint(checkpoint)
    with torch.no_grad():
        probs = calibrator(logits[part]).double().exp()
    for method in SCORES:
        scores = CP.conformal_scores(probs, target[part], method=method, randomized=False)
        want = CP.conformal_threshold(scores, [0.1])
        assert state["thresholds"][method] == want.tolist(), method  # exactly
    # the calibrator was fitted on the other samples only
    with quiet_fits():  # as the callback fits them: it reports fold fits' warnings itself
        reference = select_calibrator(
            [get_calibrator(m) for m in METHODS], logits[~part], target[~part], folds=5
        )
    assert saved["PostHocCalibration"]["method"] == reference.method
    for method, score in reference.scores.items():
        assert saved["PostHocCalibration"]["scores"][method] == pytest.approx(score, abs=1e-6)
