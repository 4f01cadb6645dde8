"""Every validation and test metric is that of the whole split under real 2-process gloo DDP.

The digits' validation and test splits hold 359 samples (a prime): torch's DistributedSampler
would pad them to 360 by repeating a sample, and averaging per-process means would weight the
processes' 180 and 179 samples alike. The references here are computed in one process, in
float64, over the same checkpoint and the whole split, with formulas written out plainly.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.ddp import DDP_ARGS, run_ddp_console
from helpers.paths import CONFIGS
from helpers.references import last_values, single_process_metrics, split_logits

from lightning_losses.calibration.posthoc.temperature import TemperatureScaler
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.data.samplers import UnpaddedDistributedSampler
from lightning_losses.lightning.classifier import ClassifierModule

QUICK = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
# With 359 samples, rank 0 holds 180 and rank 1 179: batches of 179 give rank 0 two batches
# (179 + 1) and rank 1 one, so the processes also run different numbers of steps.
BATCH = 179


# ----------------------------------------------------------------------------------------------
# The sampler, without a process group
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 5, 359])
def test_unpadded_sampler_shares_are_disjoint_and_cover_the_set(world, n):
    shares = [
        list(UnpaddedDistributedSampler(range(n), num_replicas=world, rank=rank))
        for rank in range(world)
    ]
    union = [index for share in shares for index in share]
    assert sorted(union) == list(range(n))  # every index once: no padding, no repeat
    assert shares == [list(range(rank, n, world)) for rank in range(world)]
    lengths = [
        len(UnpaddedDistributedSampler(range(n), num_replicas=world, rank=rank))
        for rank in range(world)
    ]
    assert lengths == [len(share) for share in shares]
    assert max(lengths) - min(lengths) <= 1


def test_unpadded_sampler_rejects_bad_ranks():
    with pytest.raises(ValueError, match="num_replicas must be >= 1"):
        UnpaddedDistributedSampler(range(3), num_replicas=0, rank=0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\); got rank=2"):
        list(UnpaddedDistributedSampler(range(3), num_replicas=2, rank=2))
    with pytest.raises(TypeError, match="rank must be an int"):
        UnpaddedDistributedSampler(range(3), rank=0.5)


def test_evaluation_loaders_use_the_unpadded_sampler():
    dm = DigitsDataModule(batch_size=BATCH)
    for loader in (dm.val_dataloader(), dm.test_dataloader(), dm.predict_dataloader()):
        assert isinstance(loader.sampler, UnpaddedDistributedSampler)
        assert list(loader.sampler) == list(range(359))  # no process group: everything, in order
    assert [len(dm.split_indices[split]) for split in ("val", "test")] == [359, 359]
    batches = [math.ceil(len(range(rank, 359, 2)) / BATCH) for rank in (0, 1)]
    assert batches == [2, 1]


# ----------------------------------------------------------------------------------------------
# The console script under DDP: fit, then test from its checkpoint, into one MLflow run
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One DDP fit (one epoch, temperature scaling) and one DDP test of its last checkpoint."""
    folder = tmp_path_factory.mktemp("ddp")
    uri = f"sqlite:///{folder}/ddp.db"
    common = [
        "--config",
        str(CONFIGS / "digits_ce.yaml"),
        f"--trainer.logger.init_args.tracking_uri={uri}",
        f"--data.init_args.batch_size={BATCH}",
        *DDP_ARGS,
        *QUICK,
    ]
    scaling = "lightning_losses.callbacks.TemperatureScalingCallback"
    curves = "lightning_losses.callbacks.SplitCurves"  # the last epoch is always evaluated
    run_ddp_console(
        [
            "fit",
            *common,
            "--trainer.max_epochs=1",
            f"--trainer.callbacks+={scaling}",
            f"--trainer.callbacks+={curves}",
        ],
        folder,
    )
    checkpoint = next((folder / "mlflow_runs").rglob("last.ckpt"))
    run_ddp_console(["test", *common, f"--ckpt_path={checkpoint}"], folder)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("lightning-losses")
    runs = client.search_runs([experiment.experiment_id])
    model = ClassifierModule.load_from_checkpoint(checkpoint, weights_only=True)
    return client, runs, model


@pytest.mark.slow
def test_ddp_fit_and_test_log_one_run(ddp_run):
    _, runs, _ = ddp_run
    assert len(runs) == 1


@pytest.mark.parametrize(("stage", "split"), [("val", "val"), ("test", "test")])
@pytest.mark.slow
def test_every_ddp_metric_equals_the_single_process_value(ddp_run, stage, split):
    client, [run], model = ddp_run
    logged = last_values(client, run, f"{stage}/")
    expected = {
        f"{stage}/{name}": value for name, value in single_process_metrics(model, split).items()
    }
    assert sorted(logged) == sorted(expected)  # every metric logged is checked, none is missing
    for name, value in logged.items():
        assert value == pytest.approx(expected[name], abs=1e-6), name


@pytest.mark.slow
def test_ddp_split_curves_equal_the_single_process_test_metrics(ddp_run):
    client, [run], model = ddp_run
    logged = last_values(client, run, "curve/")
    reference = single_process_metrics(model, "test")
    assert sorted(logged) == ["curve/test_acc", "curve/test_ece", "curve/test_nll"]
    for name in ("acc", "ece", "nll"):
        assert logged[f"curve/test_{name}"] == pytest.approx(reference[name], abs=1e-6), name


@pytest.mark.slow
def test_ddp_temperature_equals_the_single_process_fit(ddp_run):
    client, [run], model = ddp_run
    logits, target = split_logits(model, "val")
    # The gathered order: rank 0's samples (even positions), then rank 1's (odd positions).
    order = torch.cat([torch.arange(0, 359, 2), torch.arange(1, 359, 2)])
    expected = TemperatureScaler().fit(logits[order].float(), target[order]).temperature
    logged = last_values(client, run, "calibration/")
    assert logged["calibration/temperature"] == pytest.approx(float(expected), rel=1e-6)
    reference = single_process_metrics(model, "val")
    assert logged["calibration/val_ece_before"] == pytest.approx(reference["ece"], abs=1e-6)
    assert logged["calibration/val_nll_before"] == pytest.approx(reference["nll"], abs=1e-6)
