"""The smooth ECE metric under real 2-process gloo DDP equals the one-process value on all data.

Two processes (``torch.multiprocessing.spawn``, ``init_process_group("gloo")`` on 127.0.0.1)
hold uneven shares of one data set (1001 and 517 samples, in batches of different sizes);
torchmetrics sums the ``mass`` and ``residual`` grids across them in ``compute()``, ``grid()``
and ``curve()``, and those of ``CalibrationSummary(smooth=True)`` in its ``compute()``. The
reference is :func:`smooth_calibration_error` in this process over all 1518 samples.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.ddp import spawn_gloo

from lightning_losses.calibration import CalibrationSummary
from lightning_losses.calibration.metrics import SmoothCalibrationError
from lightning_losses.calibration.smooth import smooth_calibration_error

SHARES = (1001, 517)
BATCHES = (300, 128)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(sum(SHARES), 6, generator=generator, dtype=torch.float64) * 2.5
    target = torch.multinomial((logits / 2.5).softmax(1), 1, generator=generator)[:, 0]
    return logits, target


def _worker(rank: int, out: str) -> None:
    logits, target = _data()
    start = sum(SHARES[:rank])
    mine = slice(start, start + SHARES[rank])
    results = {}
    for bandwidth in (None, 0.03):
        metric = SmoothCalibrationError(input_format="logits", bandwidth=bandwidth)
        for chunk, labels in zip(
            logits[mine].split(BATCHES[rank]), target[mine].split(BATCHES[rank]), strict=True
        ):
            metric.update(chunk, labels)
        local_mass = metric.mass.clone()
        curve = metric.curve()
        results[bandwidth] = {
            "value": metric.compute(),
            "grid": metric.grid(),
            "curve_value": curve.value,
            "curve_bandwidth": curve.bandwidth,
            "local_restored": torch.equal(metric.mass, local_mass),
            "local_total": local_mass.sum().item(),
        }
    summary = CalibrationSummary(input_format="logits", smooth=True)
    for chunk, labels in zip(logits[mine].split(97), target[mine].split(97), strict=True):
        summary.update(chunk, labels)
    results["summary"] = summary.compute()["smooth_ece"]
    torch.save(results, Path(out) / f"rank{rank}.pt")


@pytest.mark.slow
def test_synced_metric_equals_single_process_value(tmp_path):
    spawn_gloo(_worker, str(tmp_path), processes=len(SHARES))
    logits, target = _data()
    for bandwidth in (None, 0.03):
        reference, sigma = smooth_calibration_error(
            logits, target, input_format="logits", bandwidth=bandwidth, return_bandwidth=True
        )
        single = SmoothCalibrationError(input_format="logits", bandwidth=bandwidth)
        single.update(logits, target)
        full_mass, full_residual = single.grid()
        for rank in range(len(SHARES)):
            result = torch.load(tmp_path / f"rank{rank}.pt")[bandwidth]
            assert abs(result["value"].item() - reference.item()) < 1e-12
            assert abs(result["curve_value"] - reference.item()) < 1e-12
            assert result["curve_bandwidth"] == sigma.item()
            mass, residual = result["grid"]
            torch.testing.assert_close(mass, full_mass, rtol=0, atol=1e-12)
            torch.testing.assert_close(residual, full_residual, rtol=0, atol=1e-12)
            # the local states come back after the sync, holding this rank's share only
            assert result["local_restored"]
            assert abs(result["local_total"] - SHARES[rank]) < 1e-9
    reference = smooth_calibration_error(logits, target, input_format="logits")
    for rank in range(len(SHARES)):  # CalibrationSummary(smooth=True) syncs its grid too
        summary = torch.load(tmp_path / f"rank{rank}.pt")["summary"]
        assert abs(summary.item() - reference.item()) < 1e-12
