"""PostHocCalibration under 2 gloo processes with uneven validation shares equals one process.

One DDP fit of the shipped ``digits_ce_posthoc`` config through the console (Lightning starts
the second process), one epoch: with batches of 179 the 359 validation samples split 180 / 179
(rank 0 runs two batches, rank 1 one). The reference is one process over the same checkpoint's
weights and the whole split, in the processes' batches (so the float32 logits are the same
numbers): :func:`select_calibrator` called directly, and the metrics written plainly. The rows
come in the gathered order (rank 0's, then rank 1's), which the choice puts in a canonical
order first. States and scores agree to 1e-6, as do the logged values (float32).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.ddp import DDP_ARGS, run_ddp_console
from helpers.paths import CONFIGS
from helpers.references import last_values, top_label_ece_mce_rmsce

from lightning_losses.calibration.posthoc import get_calibrator
from lightning_losses.calibration.posthoc.select import select_calibrator
from lightning_losses.calibration.smooth import smooth_calibration_error
from lightning_losses.callbacks import PostHocCalibration
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.classifier import ClassifierModule

BATCH = 179
METHODS = ("temperature", "vector", "ensemble_temperature", "isotonic")  # the config's
QUICK = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def batched_logits(model: ClassifierModule) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation logits in the processes' batches (rank 0's rows, then rank 1's).

    The same batches give the same float32 logits, bit for bit; one batch of all 359 rows
    could round them differently (and move the fits by their optimizers' tolerance).
    """
    features, target = DigitsDataModule().dataset("val").tensors
    order = torch.cat([torch.arange(rank, len(target), 2) for rank in (0, 1)])
    model.eval()
    with torch.no_grad():
        chunks = [
            model(features[rows])
            for rank in (0, 1)
            for rows in torch.arange(rank, len(target), 2).split(BATCH)
        ]
    return torch.cat(chunks).double(), target[order]


def flat(state, prefix=""):
    """The entries of a nested state dict, by dotted key."""
    for key, value in state.items():
        if isinstance(value, dict):
            yield from flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.fixture(scope="module")
def ddp_fit(tmp_path_factory):
    folder = tmp_path_factory.mktemp("posthoc_ddp")
    uri = f"sqlite:///{folder}/ddp.db"
    run_ddp_console(
        [
            "fit",
            "--config",
            str(CONFIGS / "digits_ce_posthoc.yaml"),
            f"--trainer.logger.init_args.tracking_uri={uri}",
            f"--data.init_args.batch_size={BATCH}",
            *DDP_ARGS,
            *QUICK,
        ],
        folder,
    )
    from mlflow.tracking import MlflowClient

    checkpoint = next((folder / "mlflow_runs").rglob("last.ckpt"))
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("lightning-losses")
    (run,) = client.search_runs([experiment.experiment_id])
    model = ClassifierModule.load_from_checkpoint(checkpoint, weights_only=True)
    logits, target = batched_logits(model)
    reference = select_calibrator([get_calibrator(m) for m in METHODS], logits, target, folds=5)
    return client, run, checkpoint, model, (logits, target), reference


@pytest.mark.slow
def test_the_ddp_calibrator_equals_the_single_process_fit(ddp_fit):
    client, run, checkpoint, model, _, reference = ddp_fit
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)["callbacks"]
    state = saved["PostHocCalibration"]
    assert state["method"] == reference.method
    # each candidate's score comes from its five fold fits: they all agree
    assert state["scores"].keys() == reference.scores.keys()
    for method, score in reference.scores.items():
        assert state["scores"][method] == pytest.approx(score, abs=1e-6), method
    fitted = PostHocCalibration.calibrator_from_checkpoint(checkpoint)
    want = dict(flat(reference.calibrator.state_dict()))
    for calibrator in (fitted, model.calibrator):  # also what load_from_checkpoint reads
        got = dict(flat(calibrator.state_dict()))
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(got[key], value, atol=1e-6, rtol=0)
            else:
                assert got[key] == value, key
    logged = last_values(client, run, "posthoc/cv_nll_")
    # every method's latest value is the last fit's: NaN where it could not be scored
    assert sorted(logged) == sorted(f"posthoc/cv_nll_{m}" for m in reference.scores)
    for method, score in reference.scores.items():
        value = logged[f"posthoc/cv_nll_{method}"]
        if math.isfinite(score):
            assert value == pytest.approx(score, abs=1e-6), method
        else:
            assert math.isnan(value), (method, value)
    assert run.data.tags["posthoc/method"] == reference.method


@pytest.mark.slow
def test_the_ddp_metrics_equal_the_single_process_values(ddp_fit):
    client, run, _, _, (logits, target), reference = ddp_fit
    with torch.no_grad():
        calibrated = reference.calibrator(logits).double()
    expected = {}
    for prefix, log_probs in (("val/", torch.log_softmax(logits, 1)), ("val/posthoc_", calibrated)):
        probs = log_probs.exp()
        expected[f"{prefix}nll"] = float(-log_probs[torch.arange(len(target)), target].mean())
        expected[f"{prefix}ece"] = top_label_ece_mce_rmsce(probs, target)[0]
        expected[f"{prefix}smooth_ece"] = float(smooth_calibration_error(probs, target))
    logged = last_values(client, run, "val/")
    for name, value in expected.items():
        assert logged[name] == pytest.approx(value, abs=1e-6), name
