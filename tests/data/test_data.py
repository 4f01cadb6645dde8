"""Tests of the DataModules and of the resumable training loader in ``lightning_losses.data``.

Expected values come from scikit-learn's digits directly (not from the modules' helpers), and
the resume tests compare a stopped-and-resumed Lightning run with an uninterrupted one.
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F

from lightning_losses.data.digits import (
    DigitsDataModule,
    LongTailedDigitsDataModule,
    MultiLabelDigitsDataModule,
    NMDigitsDataModule,
    RareDigitDataModule,
)
from lightning_losses.data.samplers import ResumableDataLoader, ResumableSampler
from lightning_losses.data.tensor import TensorDataModule

DIGITS = load_digits()
N_DIGITS = len(DIGITS.target)  # 1797


def _union(dm) -> np.ndarray:
    return np.concatenate([dm.split_indices[s] for s in ("train", "val", "test")])


# ----------------------------------------------------------------------------------------------
# Shapes, dtypes, properties
# ----------------------------------------------------------------------------------------------

MODULES = {
    "digits": (DigitsDataModule, "multiclass", 10, 1, torch.int64, ()),
    "longtail": (LongTailedDigitsDataModule, "multiclass", 10, 1, torch.int64, ()),
    "rare": (RareDigitDataModule, "binary", 1, 1, torch.float32, ()),
    "multilabel": (MultiLabelDigitsDataModule, "multilabel", 5, 1, torch.float32, (5,)),
    "nm": (NMDigitsDataModule, "nm", 3, 3, torch.int64, (3,)),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_properties_and_batches(name: str) -> None:
    cls, task, num_classes, num_tasks, target_dtype, target_tail = MODULES[name]
    dm = cls(batch_size=16)  # properties are available before setup
    assert (dm.task, dm.num_features, dm.num_classes, dm.num_tasks) == (
        task,
        64,
        num_classes,
        num_tasks,
    )
    dm.setup("fit")
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        x, y = next(iter(loader))
        assert x.shape == (16, 64)
        assert x.dtype == torch.float32
        assert y.shape == (16, *target_tail)
        assert y.dtype == target_dtype
        assert 0.0 <= x.min()
        assert x.max() <= 1.0
    predicted = torch.cat(list(dm.predict_dataloader()))
    assert torch.equal(predicted, dm.dataset("test").tensors[0])


def test_features_are_the_digits_scaled() -> None:
    dm = DigitsDataModule()
    for split in ("train", "val", "test"):
        index = dm.split_indices[split]
        x, y = dm.dataset(split).tensors
        assert torch.equal(x, torch.tensor(DIGITS.data[index] / 16.0, dtype=torch.float32))
        assert torch.equal(y, torch.tensor(DIGITS.target[index], dtype=torch.int64))


# ----------------------------------------------------------------------------------------------
# Splits
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [DigitsDataModule, MultiLabelDigitsDataModule, NMDigitsDataModule])
def test_splits_disjoint_covering_and_stratified(cls) -> None:
    dm = cls(val_fraction=0.25, test_fraction=0.15)
    union = _union(dm)
    assert len(np.unique(union)) == len(union) == N_DIGITS
    assert len(dm.split_indices["val"]) == round(0.25 * N_DIGITS)
    assert len(dm.split_indices["test"]) == round(0.15 * N_DIGITS)
    totals = np.bincount(DIGITS.target)
    for split, fraction in (("val", 0.25), ("test", 0.15)):
        counts = np.bincount(DIGITS.target[dm.split_indices[split]], minlength=10)
        assert np.all(np.abs(counts - fraction * totals) <= 1.5)


def test_splits_depend_only_on_the_seed() -> None:
    a, b, c = DigitsDataModule(seed=3), DigitsDataModule(seed=3), DigitsDataModule(seed=4)
    for split in ("train", "val", "test"):
        assert np.array_equal(a.split_indices[split], b.split_indices[split])
        assert not np.array_equal(a.split_indices[split], c.split_indices[split])
    # the derived label sets share the digits' splits
    for cls in (MultiLabelDigitsDataModule, NMDigitsDataModule):
        other = cls(seed=3)
        for split in ("train", "val", "test"):
            assert np.array_equal(a.split_indices[split], other.split_indices[split])


# ----------------------------------------------------------------------------------------------
# Derived data sets
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [1.0, 10.0, 50.0])
def test_long_tailed_counts(ratio: float) -> None:
    seed = 2
    balanced = DigitsDataModule(seed=seed)
    dm = LongTailedDigitsDataModule(imbalance_ratio=ratio, seed=seed)
    train_labels = DIGITS.target[balanced.split_indices["train"]]
    n_max = np.bincount(train_labels).min()
    expected = [int(n_max * ratio ** (-c / 9)) for c in range(10)]
    counts = np.bincount(dm.dataset("train").tensors[1].numpy(), minlength=10)
    assert counts.tolist() == expected
    assert counts[0] == n_max
    assert counts[0] / counts[9] == pytest.approx(ratio, rel=0.1)
    # the kept samples are a subset of the balanced training split; val and test unchanged
    assert np.isin(dm.split_indices["train"], balanced.split_indices["train"]).all()
    for split in ("val", "test"):
        assert np.array_equal(dm.split_indices[split], balanced.split_indices[split])
    again = LongTailedDigitsDataModule(imbalance_ratio=ratio, seed=seed)
    assert np.array_equal(again.split_indices["train"], dm.split_indices["train"])
    if ratio > 1:
        other = LongTailedDigitsDataModule(imbalance_ratio=ratio, seed=seed + 1)
        assert not np.array_equal(other.split_indices["train"], dm.split_indices["train"])


@pytest.mark.parametrize(("digit", "fraction"), [(0, 0.05), (7, 0.02), (3, 0.5)])
def test_rare_digit_fraction(digit: int, fraction: float) -> None:
    dm = RareDigitDataModule(positive_digit=digit, positive_fraction=fraction)
    union = _union(dm)
    assert len(np.unique(union)) == len(union)
    is_positive = DIGITS.target[union] == digit
    assert abs(is_positive.sum() - fraction * len(union)) <= 1
    natural = np.mean(DIGITS.target == digit)
    # the majority side is kept whole: negatives for a rare digit, positives otherwise
    kept_whole = ~is_positive if fraction < natural else is_positive
    assert kept_whole.sum() == np.sum((DIGITS.target == digit) == (fraction >= natural))
    for split in ("train", "val", "test"):
        index = dm.split_indices[split]
        y = dm.dataset(split).tensors[1]
        assert torch.equal(y, torch.tensor(DIGITS.target[index] == digit, dtype=torch.float32))
        assert abs(y.sum().item() - fraction * len(y)) <= 1.5  # stratified


def test_multilabel_attributes() -> None:
    dm = MultiLabelDigitsDataModule()
    assert len(dm.label_names) == 5
    assert dm.num_classes == 5

    def attributes(d: int) -> list[float]:
        return [
            float(d % 2 == 0),
            float(d in (2, 3, 5, 7)),
            float(d > 4),
            float(d in (0, 4, 6, 8, 9)),
            float(math.isqrt(d) ** 2 == d),
        ]

    for split in ("train", "test"):
        index = dm.split_indices[split]
        expected = torch.tensor([attributes(int(d)) for d in DIGITS.target[index]])
        assert torch.equal(dm.dataset(split).tensors[1], expected)
    assert dm.label_names == (
        "is_even",
        "is_prime",
        "greater_than_4",
        "has_closed_loop",
        "is_square",
    )


def test_nm_targets_are_base3_digits() -> None:
    dm = NMDigitsDataModule()
    index = dm.split_indices["train"]
    expected = [
        [int(c) for c in reversed(np.base_repr(d, 3).zfill(3))] for d in DIGITS.target[index]
    ]
    assert torch.equal(dm.dataset("train").tensors[1], torch.tensor(expected, dtype=torch.int64))


# ----------------------------------------------------------------------------------------------
# TensorDataModule
# ----------------------------------------------------------------------------------------------


def _rows(dm) -> tuple[np.ndarray, np.ndarray]:
    """All samples of the three splits, in original row order."""
    union = _union(dm)
    order = np.argsort(union)
    xs = np.concatenate([dm.dataset(s).tensors[0].numpy() for s in ("train", "val", "test")])
    ys = np.concatenate([dm.dataset(s).tensors[1].numpy() for s in ("train", "val", "test")])
    return xs[order], ys[order]


def test_tensor_npz_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 2, 3))
    y = np.arange(100) % 4
    np.savez(tmp_path / "d.npz", feats=x, labs=y)
    dm = TensorDataModule(str(tmp_path / "d.npz"), features_key="feats", labels_key="labs")
    assert (dm.task, dm.num_features, dm.num_classes, dm.num_tasks) == ("multiclass", 6, 4, 1)
    assert np.array_equal(np.sort(_union(dm)), np.arange(100))
    xs, ys = _rows(dm)
    assert np.array_equal(xs, x.reshape(100, 6).astype(np.float32))
    assert np.array_equal(ys, y)
    assert ys.dtype == np.int64
    assert np.bincount(ys[dm.split_indices["test"]]).tolist() == [5, 5, 5, 5]  # stratified

    nm = np.stack([y, (y + 1) % 5], axis=1)
    np.savez(tmp_path / "nm.npz", x=x, y=nm)
    dm = TensorDataModule(str(tmp_path / "nm.npz"), task="nm")
    assert (dm.num_classes, dm.num_tasks) == (5, 2)
    assert np.array_equal(_rows(dm)[1], nm)


def test_tensor_csv_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 9, size=(50, 3)).astype(float)
    y = np.arange(50) % 2
    lines = ["f0,label,f1,f2"] + [f"{a},{t},{b},{c}" for (a, b, c), t in zip(x, y, strict=True)]
    (tmp_path / "h.csv").write_text("\n".join(lines) + "\n")
    dm = TensorDataModule(str(tmp_path / "h.csv"), task="binary", label_column="label")
    assert (dm.task, dm.num_features, dm.num_classes) == ("binary", 3, 1)
    xs, ys = _rows(dm)
    assert np.array_equal(xs, x.astype(np.float32))
    assert np.array_equal(ys, y.astype(np.float32))
    assert ys.dtype == np.float32

    # no header, label by index; multilabel from a list of columns
    rows = [f"{t},{a},{b},{c}" for (a, b, c), t in zip(x, y, strict=True)]
    (tmp_path / "n.csv").write_text("\n".join(rows))
    dm = TensorDataModule(str(tmp_path / "n.csv"), label_column=0)
    assert (dm.num_features, dm.num_classes) == (3, 2)
    assert np.array_equal(_rows(dm)[0], x.astype(np.float32))
    multi = np.stack([y, 1 - y, (np.arange(50) % 3 == 0)], axis=1).astype(float)
    rows = [f"{a},{b},{p},{c},{q}" for (a, b, c), (p, q, _) in zip(x, multi, strict=True)]
    (tmp_path / "m.csv").write_text("a,b,p,c,q\n" + "\n".join(rows))
    ml = TensorDataModule(str(tmp_path / "m.csv"), task="multilabel", label_column=["p", -1])
    assert (ml.task, ml.num_features, ml.num_classes) == ("multilabel", 3, 2)
    xs, ys = _rows(ml)
    assert np.array_equal(xs, x.astype(np.float32))
    assert np.array_equal(ys, multi[:, :2].astype(np.float32))


def test_tensor_errors(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((10, 2)), y=np.zeros(9))
    (tmp_path / "d.txt").write_text("1,2\n")
    (tmp_path / "d.csv").write_text("1,0\n2,1\n3,2\n" * 10)
    (tmp_path / "b.csv").write_text("1,0\n2,1\n3,2\n" * 10)
    with pytest.raises(FileNotFoundError, match="no such file"):
        TensorDataModule(str(tmp_path / "missing.npz"))
    with pytest.raises(ValueError, match=r"unknown extension '\.txt'"):
        TensorDataModule(str(tmp_path / "d.txt"))
    with pytest.raises(ValueError, match="labels_key='labels' is not an array"):
        TensorDataModule(str(tmp_path / "d.npz"), labels_key="labels")
    with pytest.raises(ValueError, match="different lengths: 10 and 9"):
        TensorDataModule(str(tmp_path / "d.npz"))
    with pytest.raises(ValueError, match="no header"):
        TensorDataModule(str(tmp_path / "d.csv"), label_column="label")
    with pytest.raises(ValueError, match="out of range"):
        TensorDataModule(str(tmp_path / "d.csv"), label_column=5)
    with pytest.raises(ValueError, match="list only for multilabel"):
        TensorDataModule(str(tmp_path / "d.csv"), label_column=[0, 1])
    with pytest.raises(ValueError, match="labels 0 or 1"):
        TensorDataModule(str(tmp_path / "b.csv"), task="binary")
    with pytest.raises(ValueError, match="task must be one of"):
        TensorDataModule(str(tmp_path / "d.csv"), task="regression")


@pytest.mark.parametrize(
    ("cls", "kwargs", "argument"),
    [
        (DigitsDataModule, {"batch_size": 0}, "batch_size"),
        (DigitsDataModule, {"seed": -1}, "seed"),
        (DigitsDataModule, {"val_fraction": 0.0}, "val_fraction"),
        (DigitsDataModule, {"test_fraction": 1.0}, "test_fraction"),
        (DigitsDataModule, {"val_fraction": 0.5, "test_fraction": 0.5}, "val_fraction"),
        (DigitsDataModule, {"num_workers": -1}, "num_workers"),
        (LongTailedDigitsDataModule, {"imbalance_ratio": 0.5}, "imbalance_ratio"),
        (LongTailedDigitsDataModule, {"imbalance_ratio": 1000.0}, "imbalance_ratio"),
        (RareDigitDataModule, {"positive_digit": 10}, "positive_digit"),
        (RareDigitDataModule, {"positive_fraction": 1.0}, "positive_fraction"),
        (RareDigitDataModule, {"positive_fraction": 0.0001}, "positive_fraction"),
    ],
)
def test_invalid_arguments(cls, kwargs: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        cls(**kwargs)


# ----------------------------------------------------------------------------------------------
# ResumableDataLoader without Lightning
# ----------------------------------------------------------------------------------------------


def _epoch(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def test_loader_order_depends_only_on_seed_and_epoch() -> None:
    data = torch.arange(23)
    torch.manual_seed(0)
    loader = ResumableDataLoader(data, batch_size=5, seed=1)
    epochs = [_epoch(loader) for _ in range(3)]  # a complete pass moves to the next epoch
    assert loader.state_dict() == {"epoch": 2, "position": 23}
    for batches in epochs:
        assert [len(b) for b in batches] == [5, 5, 5, 5, 3]
        assert sorted(i for batch in batches for i in batch) == list(range(23))
    assert epochs[0] != epochs[1] != epochs[2]
    torch.manual_seed(123)  # the global random state plays no part, and is not consumed
    state = torch.get_rng_state()
    other = ResumableDataLoader(data, batch_size=5, seed=1)
    other.sampler.set_epoch(1)
    assert _epoch(other) == epochs[1]
    assert torch.equal(torch.get_rng_state(), state)
    assert _epoch(ResumableDataLoader(data, batch_size=5, seed=2)) != epochs[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_resumes_mid_epoch(num_workers: int) -> None:
    data = torch.arange(40)
    reference = ResumableDataLoader(data, batch_size=4, seed=7)
    expected = _epoch(reference) + _epoch(reference)
    loader = ResumableDataLoader(data, batch_size=4, seed=7, num_workers=num_workers)
    _epoch(loader)
    it = iter(loader)
    seen = [next(it).tolist() for _ in range(3)]  # workers have prefetched more than this
    state = loader.state_dict()
    assert state == {"epoch": 1, "position": 12}
    resumed = ResumableDataLoader(data, batch_size=4, seed=7)
    resumed.load_state_dict(state)
    assert expected[10:] == seen + _epoch(resumed)


def test_sampler_shards_between_replicas() -> None:
    shards = [list(ResumableSampler(range(10), seed=0, num_replicas=3, rank=r)) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]
    assert {i for shard in shards for i in shard} == set(range(10))


# ----------------------------------------------------------------------------------------------
# Resuming a Lightning run
# ----------------------------------------------------------------------------------------------


class _Recorder(L.LightningModule):
    """A linear classifier that records every training batch it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(64, 10)
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.seen.append(x.detach().clone())
        return F.cross_entropy(self.layer(x), y)

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.layer(x), y))

    def predict_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def _fit(root: Path, ckpt_path: str | None = None, callbacks=(), **kwargs) -> _Recorder:
    torch.manual_seed(0)
    model = _Recorder()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        default_root_dir=root,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        num_sanity_val_steps=0,
        **kwargs,
    )
    trainer.fit(model, DigitsDataModule(batch_size=256, seed=5), ckpt_path=ckpt_path)
    model.trainer_ = trainer
    return model


BATCHES_PER_EPOCH = 5  # ceil(1079 / 256)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> _Recorder:
    model = _fit(tmp_path_factory.mktemp("full"), max_epochs=3)
    assert len(model.seen) == 3 * BATCHES_PER_EPOCH
    return model


def _assert_same_run(reference: _Recorder, first: _Recorder, second: _Recorder) -> None:
    assert torch.equal(torch.cat(reference.seen), torch.cat(first.seen + second.seen))
    for ref, got in zip(reference.parameters(), second.parameters(), strict=True):
        assert torch.equal(ref, got)


def test_resume_after_an_epoch(uninterrupted: _Recorder, tmp_path: Path) -> None:
    first = _fit(tmp_path, max_epochs=1)
    path = tmp_path / "epoch1.ckpt"
    first.trainer_.save_checkpoint(path)
    torch.load(path, weights_only=True)
    second = _fit(tmp_path, ckpt_path=str(path), max_epochs=3)
    assert len(first.seen) == BATCHES_PER_EPOCH
    _assert_same_run(uninterrupted, first, second)


def test_predict_yields_the_test_features(uninterrupted: _Recorder) -> None:
    dm = DigitsDataModule(batch_size=256, seed=5)
    logits = torch.cat(uninterrupted.trainer_.predict(uninterrupted, dm))
    with torch.no_grad():
        assert torch.allclose(logits, uninterrupted.layer(dm.dataset("test").tensors[0]))


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
@pytest.mark.parametrize("step", [2, 5, 7])
def test_resume_mid_epoch(uninterrupted: _Recorder, tmp_path: Path, step: int) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=step, save_top_k=-1)
    first = _fit(tmp_path, callbacks=[checkpoint], max_epochs=3, max_steps=step)
    (path,) = tmp_path.glob(f"*step={step}.ckpt")
    state = torch.load(path, weights_only=True)
    # the loader's position counts the batches trained, not one more (no prefetch is counted)
    epoch, done = divmod(step, BATCHES_PER_EPOCH)
    position = 1079 if done == 0 else done * 256
    expected = {"epoch": epoch - 1 if done == 0 else epoch, "position": position}
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [expected]
    assert len(first.seen) == step
    second = _fit(tmp_path, ckpt_path=str(path), max_epochs=3, max_steps=-1)
    _assert_same_run(uninterrupted, first, second)
