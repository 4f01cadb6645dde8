"""Every validation and test metric is that of the whole split under real 2-process gloo DDP.

The digits' validation and test splits hold 359 samples (a prime): torch's DistributedSampler
would pad them to 360 by repeating a sample, and averaging per-process means would weight the
processes' 180 and 179 samples alike. The references here are computed in one process, in
float64, over the same checkpoint and the whole split, with formulas written out plainly.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lightning_losses.calibration.scaling import TemperatureScaler
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.data.samplers import UnpaddedDistributedSampler
from lightning_losses.lightning.classifier import ClassifierModule

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("lightning-losses")
QUICK = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
DDP = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]
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


def run_script(arguments: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("MLFLOW_TRACKING_URI", None)
    # A hang (collectives out of step) fails here instead of blocking the suite.
    done = subprocess.run(
        # --verbose: Lightning's "GLOBAL_RANK: 1" line, printed by the second process.
        [str(SCRIPT), *arguments, "--verbose"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in output  # a second process really ran
    return output


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One DDP fit (one epoch, temperature scaling) and one DDP test of its last checkpoint."""
    folder = tmp_path_factory.mktemp("ddp")
    uri = f"sqlite:///{folder}/ddp.db"
    common = [
        "--config",
        str(ROOT / "configs" / "digits_ce.yaml"),
        f"--trainer.logger.init_args.tracking_uri={uri}",
        f"--data.init_args.batch_size={BATCH}",
        *DDP,
        *QUICK,
    ]
    scaling = "lightning_losses.callbacks.TemperatureScalingCallback"
    curves = "lightning_losses.callbacks.SplitCurves"  # the last epoch is always evaluated
    run_script(
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
    run_script(["test", *common, f"--ckpt_path={checkpoint}"], folder)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("lightning-losses")
    runs = client.search_runs([experiment.experiment_id])
    model = ClassifierModule.load_from_checkpoint(checkpoint, weights_only=True)
    return client, runs, model


def last_values(client, run, prefix: str) -> dict[str, float]:
    """The last logged value of every metric of ``run`` whose name starts with ``prefix``."""
    names = [name for name in run.data.metrics if name.startswith(prefix)]
    return {name: client.get_metric_history(run.info.run_id, name)[-1].value for name in names}


def split_logits(model: ClassifierModule, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's float64 logits on the whole split, in one process, in one batch."""
    features, target = DigitsDataModule().dataset(split).tensors
    model.eval()
    with torch.no_grad():
        return model(features).double(), target


def top_label_ece_mce_rmsce(probs: torch.Tensor, target: torch.Tensor, n_bins: int = 15):
    """Equal-width bins (k/B, (k+1)/B] of the top-label confidence, as a plain loop."""
    confidence, prediction = probs.max(dim=1)
    correct = (prediction == target).double()
    ece, mce, squared = 0.0, 0.0, 0.0
    for k in range(n_bins):
        members = (confidence > k / n_bins) & (confidence <= (k + 1) / n_bins)
        if k == 0:
            members |= confidence == 0
        if members.any():
            gap = abs(float(confidence[members].mean() - correct[members].mean()))
            weight = float(members.double().mean())
            ece += weight * gap
            squared += weight * gap**2
            mce = max(mce, gap)
    return ece, mce, math.sqrt(squared)


def single_process_metrics(model: ClassifierModule, split: str) -> dict[str, float]:
    """Every metric that the module and the CalibrationMonitor log, computed independently."""
    logits, target = split_logits(model, split)
    log_probs = torch.log_softmax(logits, dim=1)
    probs = log_probs.exp()
    nll = float(-log_probs.gather(1, target[:, None]).mean())
    accuracy = float((probs.argmax(dim=1) == target).double().mean())
    ece, mce, rmsce = top_label_ece_mce_rmsce(probs, target)
    return {
        "loss": float(model.criterion(logits, target)),  # reduction="mean" over the split
        "acc": accuracy,
        "nll": nll,
        "ece": ece,
        "mce": mce,
        "rmsce": rmsce,
        "brier": float(((probs - F.one_hot(target, 10)) ** 2).sum(dim=1).mean()),
        # (the monitor's accuracy is left to the module's acc: one metric per quantity)
        "confidence": float(probs.max(dim=1).values.mean()),
    }


def test_ddp_fit_and_test_log_one_run(ddp_run):
    _, runs, _ = ddp_run
    assert len(runs) == 1


@pytest.mark.parametrize("stage, split", [("val", "val"), ("test", "test")])
def test_every_ddp_metric_equals_the_single_process_value(ddp_run, stage, split):
    client, [run], model = ddp_run
    logged = last_values(client, run, f"{stage}/")
    expected = {
        f"{stage}/{name}": value for name, value in single_process_metrics(model, split).items()
    }
    assert sorted(logged) == sorted(expected)  # every metric logged is checked, none is missing
    for name, value in logged.items():
        assert value == pytest.approx(expected[name], abs=1e-6), name


def test_ddp_split_curves_equal_the_single_process_test_metrics(ddp_run):
    client, [run], model = ddp_run
    logged = last_values(client, run, "curve/")
    reference = single_process_metrics(model, "test")
    assert sorted(logged) == ["curve/test_acc", "curve/test_ece", "curve/test_nll"]
    for name in ("acc", "ece", "nll"):
        assert logged[f"curve/test_{name}"] == pytest.approx(reference[name], abs=1e-6), name


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
