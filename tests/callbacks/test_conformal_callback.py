"""ConformalPrediction in real single-process Lightning runs.

References computed here, outside the callback: the same weights' validation and test logits
(float64, so the batches do not change the numbers), the split by position written plainly
(``torch.rand(N, generator=manual_seed(seed)) < fraction``), and the package's functions on
them (themselves tested against TorchCP and MAPIE in tests/calibration/conformal).
"""

from __future__ import annotations

import csv

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.calibration import conformal as CP
from lightning_losses.calibration.conformal import measures
from lightning_losses.calibration.posthoc import get_calibrator
from lightning_losses.calibration.posthoc.select import select_calibrator
from lightning_losses.callbacks import ConformalPrediction, PostHocCalibration
from lightning_losses.callbacks import conformal as conformal_callback

OTHER_CALLBACKS = pytest.mark.filterwarnings(
    "ignore:Be aware that when using `ckpt_path`:UserWarning"
)
CLASSES, SEED, FRACTION = 4, 3, 0.5
ALPHAS = [0.1, 0.2]
METHODS = ("lac", "aps", "raps", "saps")


class Plain(L.LightningModule):
    """Nothing of lightning_losses; its steps return tuples, read through ``outputs=``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(6, CLASSES).double()

    def forward(self, x):
        return self.net(x) * 3

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return self(x), y

    def test_step(self, batch, batch_idx):
        return self.validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


W = torch.randn(6, CLASSES, generator=torch.Generator().manual_seed(100), dtype=torch.float64)


def data(n: int, seed: int) -> TensorDataset:
    """Features and labels drawn from ``softmax(x @ W)``: one model, exchangeable samples."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    return TensorDataset(x, torch.multinomial((x @ W).softmax(1), 1, generator=g)[:, 0])


TRAIN, VAL, TEST = data(256, 0), data(300, 1), data(200, 2)


def loader(dataset, batch_size=64):
    return DataLoader(dataset, batch_size=batch_size)


def trainer(root, callbacks, epochs=1):
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        default_root_dir=root,
    )


def conformal(**kwargs):
    return ConformalPrediction(
        alpha=ALPHAS,
        methods=METHODS,
        fraction=FRACTION,
        seed=SEED,
        outputs={"logits": 0, "target": 1},
        **kwargs,
    )


def logits_of(module, dataset):
    module.eval()
    with torch.no_grad():
        return module(dataset.tensors[0]), dataset.tensors[1]


def reference_part(n: int) -> torch.Tensor:
    return (
        torch.rand(n, generator=torch.Generator().manual_seed(SEED), dtype=torch.float64) < FRACTION
    )


def reference_thresholds(probs, target) -> dict[str, torch.Tensor]:
    return {
        m: CP.conformal_threshold(
            CP.conformal_scores(probs, target, method=m, randomized=False), ALPHAS
        )
        for m in METHODS
    }


@OTHER_CALLBACKS
def test_thresholds_checkpoint_resume_test_and_predict(tmp_path, monkeypatch):
    torch.manual_seed(0)
    module = Plain()
    callback = conformal()

    def same_folder(save_top_k: int = 1) -> ModelCheckpoint:
        # the checkpoints of every trainer below in one folder (a trainer restoring a checkpoint
        # of another folder warns that it cannot reload that callback's state); the resume of
        # the finished fit saves none (a fit into a folder holding checkpoints warns too)
        return ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="last", save_top_k=save_top_k)

    trainer(tmp_path, [callback, same_folder()]).fit(module, loader(TRAIN), loader(VAL))
    z, y = logits_of(module, VAL)
    part = reference_part(len(y))
    want = reference_thresholds(z[part].softmax(1), y[part])
    assert callback.fitted_at["n"] == int(part.sum())
    for m in METHODS:
        assert torch.equal(callback.thresholds[m], want[m]), m
    # in the checkpoint, and restored by a fresh callback for test
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["callbacks"]
    (saved,) = [v for k, v in state.items() if k.startswith("ConformalPrediction")]
    assert saved["thresholds"] == {m: q.tolist() for m, q in want.items()}
    fresh = conformal()
    tester = trainer(tmp_path, [fresh, same_folder()])
    tester.test(Plain(), loader(TEST), ckpt_path=tmp_path / "ckpt" / "last.ckpt", verbose=False)
    assert all(torch.equal(fresh.thresholds[m], want[m]) for m in METHODS)
    zt, yt = logits_of(module, TEST)
    for m in METHODS:
        for a, q in zip(ALPHAS, want[m].tolist(), strict=True):
            sets = CP.prediction_sets(zt.softmax(1), q, method=m, randomized=False)
            covered = sets[torch.arange(len(yt)), yt].double()
            key = f"test/conformal_{m}_{a:g}"
            assert fresh.test_report[f"{key}_coverage"] == pytest.approx(float(covered.mean()))
            assert fresh.test_report[f"{key}_size"] == pytest.approx(
                float(sets.sum(1).double().mean())
            )
            assert float(tester.callback_metrics[f"{key}_sscv"]) == pytest.approx(
                float(CP.size_stratified_coverage_violation(sets, yt, alpha=a)), rel=1e-6
            )
            sizes = sets.sum(1)
            assert fresh.test_report[f"{key}_empty"] == float((sizes == 0).double().mean())
            assert fresh.test_report[f"{key}_singleton"] == float((sizes == 1).double().mean())
    # logged by default: four measures of every score and level; the report holds all six
    names = [f"test/conformal_{m}_{a:g}" for m in METHODS for a in ALPHAS]
    shown = ("coverage", "size", "sscv", "coverage_gap")
    logged = {k for k in tester.callback_metrics if k.startswith("test/conformal_")}
    assert logged == {f"{n}_{measure}" for n in names for measure in shown}
    assert set(fresh.test_report) == {f"{n}_{measure}" for n in names for measure in CP.MEASURES}
    # measured a block of 7 rows at a time (200 test rows: the last block partial): the same sums
    monkeypatch.setattr(conformal_callback, "BLOCK_ELEMENTS", 28)  # 4 classes: 7 rows a block
    monkeypatch.setattr(measures, "CHUNK_ELEMENTS", 12)  # and 3 rows a chunk of a block
    picky = conformal(measures=["empty", "singleton"])
    picked = trainer(tmp_path, [picky, same_folder()])
    picked.test(Plain(), loader(TEST), ckpt_path=tmp_path / "ckpt" / "last.ckpt", verbose=False)
    logged = {k for k in picked.callback_metrics if k.startswith("test/conformal_")}
    assert logged == {f"{n}_{measure}" for n in names for measure in ("empty", "singleton")}
    assert picky.test_report == fresh.test_report
    # a resume of the finished fit keeps them (no epoch left to refit)
    resumed = conformal()
    trainer(tmp_path, [resumed, same_folder(save_top_k=0)]).fit(
        Plain(), loader(TRAIN), loader(VAL), ckpt_path=tmp_path / "ckpt" / "last.ckpt"
    )
    assert all(torch.equal(resumed.thresholds[m], want[m]) for m in METHODS)
    assert resumed.fitted_at == callback.fitted_at
    predictions = trainer(tmp_path, [fresh]).predict(module, loader(TEST))
    sets = torch.cat([p["sets"]["aps_0.1"] for p in predictions])
    expected = CP.prediction_sets(zt.softmax(1), want["aps"][0], method="aps", randomized=False)
    assert torch.equal(sets, expected)


def test_posthoc_calibrator_is_fitted_on_the_other_part(tmp_path):
    torch.manual_seed(1)
    module = Plain()
    with torch.no_grad():  # logits 1.5 x the true ones: overconfident, a temperature near 1.5
        module.net.weight.copy_(W.T / 2)
        module.net.bias.zero_()
    posthoc = PostHocCalibration(
        methods=("temperature",), folds=4, log_diagrams=False, outputs={"logits": 0, "target": 1}
    )
    callback = conformal()
    trainer(tmp_path, [posthoc, callback]).fit(module, loader(TRAIN), loader(VAL))
    z, y = logits_of(module, VAL)
    part = reference_part(len(y))
    reference = select_calibrator([get_calibrator("temperature")], z[~part], y[~part], folds=4)
    assert posthoc.method == reference.method
    got, want = posthoc.calibrator.state_dict(), reference.calibrator.state_dict()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(got[key], value, atol=1e-9, rtol=0)
        else:
            assert got[key] == value, key
    with torch.no_grad():
        probs = reference.calibrator(z[part]).exp()
    expected = reference_thresholds(probs, y[part])
    for m in METHODS:
        torch.testing.assert_close(callback.thresholds[m], expected[m], atol=1e-9, rtol=0)


def test_wrong_order_and_bad_arguments(tmp_path):
    posthoc = PostHocCalibration(methods=("temperature",), outputs={"logits": 0, "target": 1})
    with pytest.raises(ValueError, match="must come after PostHocCalibration"):
        trainer(tmp_path, [conformal(), posthoc]).fit(Plain(), loader(TRAIN), loader(VAL))
    with pytest.raises(ValueError, match="fraction must lie in"):
        ConformalPrediction(fraction=1.0)
    with pytest.raises(ValueError, match="method must be one of"):
        ConformalPrediction(methods=["thr"])
    with pytest.raises(ValueError, match="measures must be one of 'coverage'"):
        ConformalPrediction(measures=["size", "width"])


@pytest.mark.slow
def test_the_shipped_config_fits_through_the_cli(tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from lightning_losses.cli.fit import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    quick = [
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=2",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    cli = main(["fit", "--config", "mnist1d_ce_conformal", *quick])
    (posthoc,) = [c for c in cli.trainer.callbacks if isinstance(c, PostHocCalibration)]
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, ConformalPrediction)]
    assert callback.calibrated  # the last epoch: the calibrator was fitted for these weights
    assert callback.alpha == [0.1, 0.05]
    assert callback.fitted_at["n"] == int(callback.in_calibration_part(torch.arange(200)).sum())
    (last,) = tmp_path.glob("mlflow_runs/*/*/checkpoints/last.ckpt")
    state = torch.load(last, map_location="cpu", weights_only=True)["callbacks"]
    (saved,) = [v for k, v in state.items() if k.startswith("ConformalPrediction")]
    assert saved["thresholds"] == {m: q.tolist() for m, q in callback.thresholds.items()}
    assert saved["calibrated"] is True
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("lightning-losses").experiment_id])
    metrics = run.data.metrics
    assert metrics["conformal/n"] == callback.fitted_at["n"]
    q = float(callback.thresholds["aps"][1])
    assert metrics["conformal/q_aps_0.05"] == pytest.approx(q, rel=1e-6)
    assert posthoc.calibrator is not None

    # `lightning-losses test` logs the sets' measures; `compare` shows and writes them.
    tested = ["test", "--config", "mnist1d_ce_conformal", "--ckpt_path", str(last)]
    main([*tested, "--trainer.limit_test_batches=2", *quick[3:]])
    tested = client.get_run(run.info.run_id).data.metrics
    capsys.readouterr()
    from lightning_losses.compare.cli import main as compare

    assert compare(["--experiment", "lightning-losses", "--tracking-uri", client.tracking_uri]) == 0
    out = capsys.readouterr().out.splitlines()
    title = out.index("prediction sets at test: coverage / mean set size, by score and alpha")
    header, _, line = out[title + 1 : title + 4]
    columns = [
        word for m in sorted(callback.thresholds) for a in ("0.05", "0.1") for word in (m, a)
    ]
    assert header.split() == ["run", "id", *columns]  # every score at both levels
    assert line.startswith(f"{run.info.run_name}  {run.info.run_id[:8]}")
    cells = line.split("  ")
    key = "test/conformal_aps_0.1"
    shown = f"{tested[key + '_coverage']:.3f} / {tested[key + '_size']:.2f}"
    assert shown in cells
    (csv_path,) = tmp_path.glob("comparison/comparison.csv")
    [row] = list(csv.DictReader(csv_path.open()))
    assert float(row[key + "_size"]) == tested[key + "_size"]  # full precision in the CSV
