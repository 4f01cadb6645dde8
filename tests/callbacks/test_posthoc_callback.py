"""PostHocCalibration in real single-process Lightning runs.

The references are computed here, outside the callback: the validation (test) logits of the
same weights, :func:`select_calibrator` called directly on them, and the NLL, ECE and smooth ECE
written plainly (a float64 formula, a binning loop, relplot's smECE). The fitted state is
compared tensor by tensor: in checkpoints, after a resume, after ``load_from_checkpoint``.
Float64 models make the callback's logits and the test's the same numbers (the batches change
only the order of the rows, which the fit does not depend on): states and scores agree to
1e-9; values logged through Lightning are float32 (1e-6 relative); relplot's smECE agrees with
the package's smooth ECE to about 1e-4 (its grid).
"""

from __future__ import annotations

import math
import re

import lightning as L
import numpy as np
import pytest
import relplot
import torch
import torch.nn.functional as F
from helpers.warned import package_warns
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.calibration.posthoc import get_calibrator
from lightning_losses.calibration.posthoc.select import select_calibrator
from lightning_losses.callbacks import PostHocCalibration
from lightning_losses.compare import collect_runs, format_table
from lightning_losses.data.digits import DigitsDataModule
from lightning_losses.lightning.classifier import ClassifierModule
from lightning_losses.warning import LightningLossesWarning

# A checkpoint read by a trainer without its ModelCheckpoint: Lightning's note, not the package's.
OTHER_CALLBACKS = pytest.mark.filterwarnings(
    "ignore:Be aware that when using `ckpt_path`:UserWarning"
)


METHODS = ("temperature", "isotonic")
FOLDS = 4
CLASSES = 4
#: PostHocCalibration's warning about a method whose cross-validated NLL is not finite.
UNSCORED = r"PostHocCalibration: (\w+) cannot be scored at epoch \d+: its cross-validated NLL is"


def unscored_method(message: str) -> str | None:
    """The method an UNSCORED warning names (``None`` for another message)."""
    match = re.match(UNSCORED, message)
    return None if match is None else match.group(1)


class Plain(L.LightningModule):
    """Nothing of lightning_losses: a float64 linear classifier whose logits are too large."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(6, CLASSES).double()

    def forward(self, x):
        return self.net(x) * 4

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return {"logits": self(x), "target": y}

    def test_step(self, batch, batch_idx):
        return self.validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])  # logits, as LightningModule's default self(batch) would be

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


def dataset(n: int, seed: int) -> TensorDataset:
    """Noisy labels of a linear rule: an overconfident model after a few steps."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    y = x[:, :CLASSES].argmax(1)
    flip = torch.rand(n, generator=gen) < 0.3
    y[flip] = torch.randint(0, CLASSES, (int(flip.sum()),), generator=gen)
    return TensorDataset(x, y)


TRAIN, VAL, TEST = dataset(256, 0), dataset(240, 1), dataset(200, 2)


def loader(data: TensorDataset, batch_size: int = 64) -> DataLoader:
    return DataLoader(data, batch_size=batch_size)


def trainer(root, callbacks, epochs=1, logger=False, **options) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=logger,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        callbacks=callbacks,
        default_root_dir=root,
        **options,
    )


def logits_of(module: nn.Module, data: TensorDataset) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = data.tensors
    with torch.no_grad():
        return module(x), y


def by_hand(z: torch.Tensor, y: torch.Tensor, methods=METHODS, folds=FOLDS):
    return select_calibrator([get_calibrator(m) for m in methods], z, y, folds=folds)


def plain_scores(log_probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15) -> dict:
    """NLL (float64 formula), ECE (a binning loop) and smooth ECE (relplot)."""
    nll = float(-log_probs[torch.arange(len(y)), y].mean())
    probs = log_probs.exp().numpy()
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == y.numpy()).astype(float)
    ece = 0.0
    for k in range(n_bins):
        members = (confidence > k / n_bins) & (confidence <= (k + 1) / n_bins)
        if members.any():
            ece += members.mean() * abs(confidence[members].mean() - correct[members].mean())
    smooth = float(relplot.smECE(confidence, correct))
    return {"nll": nll, "ece": ece, "smooth_ece": smooth}


def assert_close_states(got: dict, want: dict, tol: float = 1e-9) -> None:
    """Two calibrators' state_dicts: the same keys, tensors within ``tol``."""

    def flat(state, prefix=""):
        for key, value in state.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    got_items, want_items = dict(flat(got)), dict(flat(want))
    assert got_items.keys() == want_items.keys()
    for key, value in want_items.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(got_items[key], value, atol=tol, rtol=0)
        else:
            assert got_items[key] == value, key


def assert_equal_states(got: dict, want: dict) -> None:
    assert_close_states(got, want, tol=0.0)


# ----------------------------------------------------------------------------------------------
# One fit: the choice and the logged values equal a direct computation on the same logits
# ----------------------------------------------------------------------------------------------


def test_the_fit_equals_select_calibrator_and_the_plain_metrics(tmp_path):
    torch.manual_seed(0)
    module = Plain()
    callback = PostHocCalibration(methods=METHODS, folds=FOLDS, log_diagrams=False)
    fit = trainer(tmp_path, [callback], logger=CSVLogger(tmp_path, name="run"))
    fit.fit(module, loader(TRAIN), loader(VAL))  # no UNSCORED warning (an error if raised)
    z, y = logits_of(module, VAL)
    want = by_hand(z, y)
    # every method scores: isotonic's held-out probabilities of 0 are floored (issue 38)
    assert all(math.isfinite(score) for score in want.scores.values()), want.scores
    assert callback.method == want.method
    assert callback.selection.scores == pytest.approx(want.scores, abs=1e-9)
    assert set(want.scores) == {"none", *METHODS}
    assert_close_states(callback.calibrator.state_dict(), want.calibrator.state_dict())
    with torch.no_grad():
        after = plain_scores(want.calibrator(z).double(), y)
    before = plain_scores(torch.log_softmax(z, dim=1), y)
    assert after["nll"] <= before["nll"]  # the choice never worsens the held-out NLL
    metrics = fit.callback_metrics
    for q in ("nll", "ece", "smooth_ece"):
        tol = 2e-4 if q == "smooth_ece" else 1e-9
        assert callback.report[f"{q}_after"] == pytest.approx(after[q], abs=tol), q
        assert callback.report[f"{q}_before"] == pytest.approx(before[q], abs=tol), q
        # a plain module logs none of these: the raw ones are the callback's too
        assert float(metrics[f"val/posthoc_{q}"]) == pytest.approx(after[q], rel=1e-6, abs=tol)
        assert float(metrics[f"val/{q}"]) == pytest.approx(before[q], rel=1e-6, abs=tol)
    for method, score in want.scores.items():
        logged = float(metrics[f"posthoc/cv_nll_{method}"])
        if math.isfinite(score):
            assert logged == pytest.approx(score, rel=1e-6)
        else:
            assert math.isnan(logged), (method, logged)  # this fit's: it cannot be scored
    logged = (tmp_path / "run" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "val/posthoc_nll" in logged.split(",")


# ----------------------------------------------------------------------------------------------
# Checkpoints: each holds the calibrator of its own weights; resume, test, predict restore it
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_epochs(tmp_path_factory):
    """Three epochs, fitting every 2nd (and the last): a checkpoint per epoch."""
    root = tmp_path_factory.mktemp("posthoc")
    torch.manual_seed(0)
    module = Plain()
    callback = PostHocCalibration(methods=METHODS, folds=FOLDS, every_n_epochs=2)
    saves = ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, filename="{epoch}")
    fit = trainer(root, [callback, saves], epochs=3, logger=CSVLogger(root, name="run"))
    fit.fit(module, loader(TRAIN), loader(VAL))  # every method scores, as in the test above
    return root, module, callback


def weights(path) -> Plain:
    module = Plain()
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    module.load_state_dict(state)
    return module.eval()


def test_each_checkpoint_holds_the_calibrator_of_its_weights(three_epochs):
    root, _, callback = three_epochs
    folder = root / "ckpt"
    # epoch 0 is skipped by every_n_epochs=2: its checkpoint holds no calibrator
    skipped = torch.load(folder / "epoch=0.ckpt", map_location="cpu", weights_only=True)
    assert "PostHocCalibration" not in skipped["callbacks"]
    with pytest.raises(ValueError, match="holds no post-hoc calibrator"):
        PostHocCalibration.calibrator_from_checkpoint(folder / "epoch=0.ckpt")
    for epoch in (1, 2):
        path = folder / f"epoch={epoch}.ckpt"
        want = by_hand(*logits_of(weights(path), VAL))
        saved = torch.load(path, map_location="cpu", weights_only=True)["callbacks"]
        assert saved["PostHocCalibration"]["method"] == want.method
        assert saved["PostHocCalibration"]["epoch"] == epoch
        loaded = PostHocCalibration.calibrator_from_checkpoint(path)
        assert_close_states(loaded.state_dict(), want.calibrator.state_dict())
    # the last one is exactly the callback's own
    final = PostHocCalibration.calibrator_from_checkpoint(folder / "epoch=2.ckpt")
    assert_equal_states(final.state_dict(), callback.calibrator.state_dict())
    diagrams = sorted(p.name for p in (root / "run" / "version_0" / "calibration").glob("*.png"))
    assert diagrams == ["posthoc_val_calibrated_epoch=002.png", "posthoc_val_raw_epoch=002.png"]


@OTHER_CALLBACKS
def test_resume_restores_the_calibrator_exactly(three_epochs):
    root, _, _ = three_epochs
    path = root / "ckpt" / "epoch=1.ckpt"
    saved = PostHocCalibration.calibrator_from_checkpoint(path)
    resumed = PostHocCalibration(methods=("temperature",), folds=3)  # the checkpoint's wins
    # max_epochs=2: the fit is over as soon as the state is restored
    trainer(root / "resume", [resumed], epochs=2).fit(
        Plain(), loader(TRAIN), loader(VAL), ckpt_path=path
    )
    assert resumed.fitted_at == {"epoch": 1, "global_step": 8}
    assert_equal_states(resumed.calibrator.state_dict(), saved.state_dict())
    assert resumed.state_dict()["calibrator"].keys() == saved.state_dict().keys()


@OTHER_CALLBACKS
def test_test_and_predict_with_ckpt_path_apply_the_checkpoints_calibrator(three_epochs):
    root, _, _ = three_epochs
    path = root / "ckpt" / "epoch=1.ckpt"
    model = weights(path)
    calibrator = by_hand(*logits_of(model, VAL)).calibrator
    callback = PostHocCalibration(methods=METHODS, folds=FOLDS)
    check = trainer(root / "check", [callback])
    check.test(Plain(), loader(TEST, 50), ckpt_path=path, verbose=False)
    z, y = logits_of(model, TEST)
    with torch.no_grad():
        after = plain_scores(calibrator(z).double(), y)
    before = plain_scores(torch.log_softmax(z, dim=1), y)
    for q in ("nll", "ece"):
        got = check.callback_metrics
        assert float(got[f"test/posthoc_{q}"]) == pytest.approx(after[q], rel=1e-6), q
        assert float(got[f"test/{q}"]) == pytest.approx(before[q], rel=1e-6), q
    assert callback.test_report["smooth_ece_after"] == pytest.approx(after["smooth_ece"], abs=2e-4)

    module = Plain()
    x = TEST.tensors[0]
    batches = check.predict(module, DataLoader(TensorDataset(x), batch_size=64), ckpt_path=path)
    predicted = torch.cat(batches)
    with torch.no_grad():
        want = calibrator(model(x)).exp()
    torch.testing.assert_close(predicted, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(predicted.sum(1), torch.ones(len(x), dtype=torch.float64))
    assert "predict_step" not in module.__dict__  # the module's own predict_step is back


# ----------------------------------------------------------------------------------------------
# ClassifierModule: load_from_checkpoint predicts calibrated probabilities
# ----------------------------------------------------------------------------------------------


@OTHER_CALLBACKS
def test_classifier_load_from_checkpoint_predicts_calibrated_probabilities(tmp_path):
    L.seed_everything(0)
    dm = DigitsDataModule(batch_size=128)
    callback = PostHocCalibration(methods=("temperature",), folds=3)
    saves = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="last")
    fit = trainer(tmp_path, [callback, saves], limit_train_batches=3)
    fit.fit(ClassifierModule("ce", hidden=[16]), dm)
    path = tmp_path / "ckpt" / "last.ckpt"
    model = ClassifierModule.load_from_checkpoint(path, weights_only=True)
    assert "calibrator" not in "".join(model.state_dict())  # not part of the weights
    assert_equal_states(model.calibrator.state_dict(), callback.calibrator.state_dict())
    x = torch.cat([batch[0] for batch in dm.test_dataloader()])
    model.eval()
    with torch.no_grad():
        want = callback.calibrator(model(x)).exp().float()
    plain = trainer(tmp_path, [])  # no callback: the module applies its checkpoint's calibrator
    got = torch.cat(plain.predict(model, dm.test_dataloader()))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # with the callback as well, it is applied once
    again = trainer(tmp_path, [PostHocCalibration(methods=("temperature",))]).predict(
        model, dm, ckpt_path=path
    )
    again = torch.cat(again)
    torch.testing.assert_close(again, want, atol=1e-6, rtol=0)
    assert model.calibrator is not None  # handed back after predicting


class Binary(Plain):
    """One logit per sample, 0/1 float targets (as the binary DataModules give them)."""

    def forward(self, x):
        out = self.net(x)
        return (out[:, 0] - out[:, 1]) * 3

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.binary_cross_entropy_with_logits(self(x), (y == 0).double())

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return {"logits": self(x), "target": (y == 0).double()}


def test_binary_logits_are_calibrated_as_two_classes(tmp_path):
    torch.manual_seed(0)
    module = Binary()
    methods = ("temperature", "beta")
    callback = PostHocCalibration(methods=methods, folds=FOLDS, log_diagrams=False)
    trainer(tmp_path, [callback]).fit(module, loader(TRAIN), loader(VAL))
    z, y = logits_of(module, VAL)
    y = (y == 0).long()
    want = by_hand(z, y, methods=methods)
    assert callback.method == want.method
    assert_close_states(callback.calibrator.state_dict(), want.calibrator.state_dict())
    with torch.no_grad():
        p = want.calibrator(z).double().exp()[:, 1]  # the positive class
    # the binary ECE of the positive class's probability, as CalibrationMonitor bins [N] logits
    ece = sum(
        abs(float(p[members].sum() - y[members].sum())) / len(y)
        for k in range(15)
        if (members := (p > k / 15) & (p <= (k + 1) / 15)).any()
    )
    assert callback.report["ece_after"] == pytest.approx(ece, abs=1e-9)
    nll = float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())
    assert callback.report["nll_after"] == pytest.approx(nll, abs=1e-9)
    x = VAL.tensors[0]
    out = trainer(tmp_path, [callback]).predict(module, DataLoader(TensorDataset(x), batch_size=64))
    torch.testing.assert_close(torch.cat(out), p, atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------------------------
# MLflow: metrics, tags and diagrams in a real store; a method that cannot help says so
# ----------------------------------------------------------------------------------------------


def test_mlflow_gets_the_metrics_tags_and_diagrams(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # MLflow's set_tracking_uri also sets MLFLOW_TRACKING_URI: monkeypatch restores it after
    # the test, so later tests in this process do not log into this store.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # its artifacts in tmp_path (a SQLite store's default artifact root is ./mlruns of the cwd)
    logger = MLFlowLogger(
        experiment_name="posthoc",
        tracking_uri=uri,
        artifact_location=(tmp_path / "artifacts").as_uri(),
    )
    torch.manual_seed(0)
    small = TensorDataset(*(t[:12] for t in VAL.tensors))  # 12 samples: matrix needs 20
    callback = PostHocCalibration(methods=("temperature", "matrix"), folds=3)
    fit = trainer(tmp_path, [callback], logger=logger)
    with package_warns(r"MatrixScaling \(matrix\) falls back to the identity: 12 samples"):
        fit.fit(Plain(), loader(TRAIN), loader(small))
    fit.test(fit.lightning_module, loader(TEST), verbose=False)
    client = MlflowClient(uri)
    run = client.get_run(logger.run_id)
    metrics = run.data.metrics
    for q in ("nll", "ece", "smooth_ece"):
        assert metrics[f"val/posthoc_{q}"] == pytest.approx(callback.report[f"{q}_after"], 1e-6)
        assert metrics[f"test/posthoc_{q}"] == pytest.approx(
            callback.test_report[f"{q}_after"], 1e-6
        )
    assert metrics["posthoc/fallback_matrix"] == 1.0
    assert metrics["posthoc/cv_nll_matrix"] == pytest.approx(metrics["posthoc/cv_nll_none"])
    assert run.data.tags["posthoc/method"] == callback.method
    assert run.data.tags["posthoc/fallbacks"].startswith("matrix: 12 samples are fewer")
    # lightning-losses compare shows the calibrated values beside the raw ones
    (row,) = collect_runs("posthoc", tracking_uri=uri)
    assert row["val/posthoc_nll"] == pytest.approx(metrics["val/posthoc_nll"])
    assert row["val/posthoc_ece"] == pytest.approx(metrics["val/posthoc_ece"])
    header = format_table([row], wide=True).splitlines()[0].split()
    assert {"val/nll", "val/ece", "val/posthoc_nll", "val/posthoc_ece"} <= set(header)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "calibration")}
    assert artifacts == {
        f"calibration/posthoc_{stage}_{kind}_epoch=000.png"
        for stage in ("val", "test")
        for kind in ("raw", "calibrated")
    }


# ----------------------------------------------------------------------------------------------
# Bad input: at construction, in the sanity check, or a warning naming the method
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"methods": ("temprature",)}, ValueError, r"methods=\('temprature',\)\): unknown"),
        ({"methods": ()}, ValueError, "no method"),
        ({"methods": ("vector", "vector")}, ValueError, "repeats"),
        (
            {"methods": ("temperature",), "method_args": {"isotonic": {}}},
            ValueError,
            r"\['isotonic'\] are not among methods=\['temperature'\]",
        ),
        ({"method_args": {"vector": 3}}, TypeError, "method_args=.*keyword arguments"),
        ({"method_args": {"temperature": {"max_iters": 5}}}, TypeError, "method_args=.*max_iters"),
        ({"method_args": {"temperature": {"max_iter": 0}}}, ValueError, "max_iter must be >= 1"),
        ({"folds": 1}, ValueError, "folds must be >= 2; got 1"),
        ({"folds": 2.5}, TypeError, "folds must be an int"),
        ({"every_n_epochs": 0}, ValueError, "every_n_epochs must be >= 1"),
        ({"n_bins": 0}, ValueError, "n_bins"),
        ({"ignore_index": "pad"}, TypeError, "ignore_index must be an int"),
        ({"log_diagrams": "yes"}, TypeError, "log_diagrams must be True or False"),
        ({"outputs": {"logit": "y_hat"}}, ValueError, r"PostHocCalibration\(outputs="),
    ],
)
def test_bad_arguments_fail_at_construction(options, error, match):
    with pytest.raises(error, match=match):
        PostHocCalibration(**options)


class Shifted(Plain):
    """Hands the callback ``transform(logits)`` and ``target + shift``."""

    def __init__(self, transform=lambda z: z, shift: int = 0) -> None:
        super().__init__()
        self.transform, self.shift = transform, shift

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return {"logits": self.transform(self(x)), "target": y + self.shift}


@pytest.mark.parametrize(
    ("module", "match"),
    [
        (Shifted(shift=3), r"first val batch has targets from 3 to 6; .* \[0, 3\]"),
        (Shifted(lambda z: z * float("nan")), "NaN or infinite logits"),
        (Shifted(lambda z: z.long()), "calibrates \\[N, C\\] logits"),
    ],
)
def test_bad_outputs_fail_in_the_sanity_check(tmp_path, module, match):
    before = module.net.weight.detach().clone()
    fit = trainer(tmp_path, [PostHocCalibration(methods=METHODS)])
    with pytest.raises(ValueError, match=match) as info:
        fit.fit(module, loader(TRAIN), loader(VAL))
    assert str(info.value).startswith("PostHocCalibration: ")
    assert fit.global_step == 0  # before any training step
    assert torch.equal(module.net.weight, before)


def test_a_method_for_another_task_fails_in_the_sanity_check(tmp_path):
    fit = trainer(tmp_path, [PostHocCalibration(methods=("temperature", "beta"))])
    with pytest.raises(ValueError, match=r"'beta' does not apply to these 4-class outputs"):
        fit.fit(Plain(), loader(TRAIN), loader(VAL))
    assert fit.global_step == 0


class Diverged(Plain):
    """NaN logits in the second validation batch after training (the first ones are finite)."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        z = self(x)
        nan = batch_idx == 1 and not self.trainer.sanity_checking
        return {"logits": z * float("nan") if nan else z, "target": y}


def test_nan_logits_after_training_name_the_methods(tmp_path):
    fit = trainer(tmp_path, [PostHocCalibration(methods=METHODS)])
    with pytest.raises(ValueError, match=r"methods=\['temperature', 'isotonic'\]\) cannot") as info:
        fit.fit(Diverged(), loader(TRAIN), loader(VAL))
    assert "of epoch 0: PostHocCalibration.fit: logits contain NaN" in str(info.value)


def own(caught) -> list[str]:
    """The messages of the package's own warnings among those caught."""
    return [str(w.message) for w in caught if issubclass(w.category, LightningLossesWarning)]


def test_too_few_samples_and_one_class_fall_back_to_the_identity(tmp_path):
    three = TensorDataset(*(t[:3] for t in VAL.tensors))
    callback = PostHocCalibration(methods=METHODS, folds=5, log_diagrams=False)
    with pytest.warns(LightningLossesWarning) as caught:
        trainer(tmp_path, [callback]).fit(Plain(), loader(TRAIN), loader(three))
    assert sorted(own(caught)) == [
        f"PostHocCalibration: {name} ({method}) falls back to the identity: 3 samples are "
        "fewer than folds=5"
        for name, method in (
            ("IsotonicCalibration", "isotonic"),
            ("TemperatureScaler", "temperature"),
        )
    ]
    assert callback.method == "none"
    assert set(callback.selection.fallbacks) == set(METHODS)

    x, y = VAL.tensors
    one_class = TensorDataset(x[y == 2], y[y == 2])
    callback = PostHocCalibration(methods=METHODS, folds=3, log_diagrams=False)
    with pytest.warns(LightningLossesWarning, match="falls back") as caught:
        trainer(tmp_path, [callback]).fit(Plain(), loader(TRAIN), loader(one_class))
    assert len(own(caught)) == 2  # once per method, not once per epoch or fold
    assert all("every label is class 2: one class cannot be calibrated" in m for m in own(caught))
    assert callback.method == "none"
    assert callback.report["nll_after"] == callback.report["nll_before"]


class MultiLabel(Plain):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        return {"logits": self(x), "target": F.one_hot(y, CLASSES).double()}


def test_multilabel_outputs_are_left_alone_with_a_warning(tmp_path):
    callback = PostHocCalibration(methods=METHODS)
    with package_warns("multi-label outputs are not calibrated"):
        trainer(tmp_path, [callback], epochs=2).fit(MultiLabel(), loader(TRAIN), loader(VAL))
    assert callback.calibrator is None
    assert callback.state_dict() == {}


def test_predict_without_a_fit_warns_and_leaves_the_outputs(tmp_path):
    x = TEST.tensors[0]
    module = Plain()
    with package_warns("no fitted calibrator to predict with"):
        out = trainer(tmp_path, [PostHocCalibration(methods=METHODS)]).predict(
            module, DataLoader(TensorDataset(x), batch_size=100)
        )
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(out), module(x))


# ----------------------------------------------------------------------------------------------
# The shipped configs, through the real command line
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_shipped_config_fits_through_the_cli(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from lightning_losses.cli.fit import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    quick = [
        "--trainer.max_epochs=2",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=2",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    cli = main(["fit", "--config", "digits_ce_posthoc", *quick])  # every method scores
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, PostHocCalibration)]
    assert callback.methods == ("temperature", "vector", "ensemble_temperature", "isotonic")
    assert callback.fitted_at == {"epoch": 1, "global_step": 4}
    (last,) = tmp_path.glob("mlflow_runs/*/*/checkpoints/last.ckpt")
    saved = PostHocCalibration.calibrator_from_checkpoint(last)
    assert_equal_states(saved.state_dict(), callback.calibrator.state_dict())
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("lightning-losses").experiment_id])
    metrics = run.data.metrics
    assert metrics["val/posthoc_nll"] == pytest.approx(callback.report["nll_after"], rel=1e-6)
    assert run.data.tags["posthoc/method"] == callback.method
    # Each method's latest value in the store is its score at the last fit: NaN where it
    # cannot be scored (MLflow keeps NaN as NaN), never an earlier epoch's value.
    scores = callback.selection.scores
    assert {k for k in metrics if k.startswith("posthoc/cv_nll_")} == {
        f"posthoc/cv_nll_{m}" for m in scores
    }
    for method, score in scores.items():
        history = client.get_metric_history(run.info.run_id, f"posthoc/cv_nll_{method}")
        assert len(history) == 2, (method, history)  # one value per epoch
        latest = metrics[f"posthoc/cv_nll_{method}"]
        if math.isfinite(score):
            assert latest == pytest.approx(score, rel=1e-6), method
        else:
            assert math.isnan(latest), (method, latest)
    # val/nll is the module's and val/ece the monitor's: each logged once per epoch
    for key in ("val/nll", "val/ece"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)) == 2, (key, steps)
    # the raw smooth ECE, which nothing else logs here, is the callback's
    assert metrics["val/smooth_ece"] == pytest.approx(callback.report["smooth_ece_before"], 1e-6)


def test_the_mnist1d_config_is_found_by_name(capsys):
    from lightning_losses.cli.fit import main

    with pytest.raises(SystemExit):
        main(["fit", "--config", "mnist1d_ce_posthoc", "--print_config"])
    printed = capsys.readouterr().out
    assert "class_path: lightning_losses.callbacks.PostHocCalibration" in printed
    assert "run_name: mnist1d_ce_posthoc" in printed


def test_the_calibrated_probabilities_sum_to_one_for_every_task_shape():
    calibrator = get_calibrator("temperature", max_iter=50)
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(40, 3, generator=gen) * 3
    calibrator.fit(z, torch.randint(0, 3, (40,), generator=gen))
    from lightning_losses.lightning.classifier import calibrated_probabilities

    t = calibrator.temperature
    np.testing.assert_allclose(
        calibrated_probabilities(calibrator, z), torch.softmax(z / t, dim=1), atol=1e-6
    )
    nm = z.view(8, 5, 3)
    np.testing.assert_allclose(
        calibrated_probabilities(calibrator, nm), torch.softmax(nm / t, dim=2), atol=1e-6
    )
    binary = z[:, 0]
    np.testing.assert_allclose(
        calibrated_probabilities(calibrator, binary), torch.sigmoid(binary / t), atol=1e-6
    )
