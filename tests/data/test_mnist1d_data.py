"""Tests of :class:`lightning_losses.data.mnist1d.MNIST1DDataModule` (the MNIST-1D benchmark).

Expected arrays come from the ``mnist1d`` package's own ``make_dataset`` called directly here;
cache behaviour is checked on real files (inode, modification time, contents), not with mocks.
"""

from __future__ import annotations

import inspect
import math
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from mnist1d.data import get_dataset_args, make_dataset

from lightning_losses import data as data_module
from lightning_losses.data.mnist1d import _MNIST1D_DEFAULTS, MNIST1DDataModule, default_cache_dir
from lightning_losses.lightning.classifier import ClassifierModule

SMALL = 200  # sequences of the small generated set: 160 training (144 + 16 val), 40 test
TINY = {"num_samples": 100, "val_fraction": 0.125}  # 80 training (70 + 10 val), 20 test


def _reference(**overrides: Any) -> dict[str, np.ndarray]:
    """mnist1d's ``make_dataset`` on its default arguments with ``overrides``, RNG restored."""
    args = get_dataset_args()
    for name, value in overrides.items():
        setattr(args, name, value)
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        return make_dataset(args)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def _split(dm: MNIST1DDataModule, split: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = dm.dataset(split).tensors
    return x.numpy(), y.numpy()


def _same_numpy_state(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and tuple(a[2:]) == tuple(b[2:])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mnist1d-cache")


@pytest.fixture(scope="module")
def small(cache: Path) -> MNIST1DDataModule:
    return MNIST1DDataModule(batch_size=32, num_samples=SMALL, cache_dir=str(cache))


@pytest.fixture(scope="module")
def tiny(cache: Path) -> MNIST1DDataModule:
    return MNIST1DDataModule(cache_dir=str(cache), **TINY)


# ----------------------------------------------------------------------------------------------
# The data are mnist1d's
# ----------------------------------------------------------------------------------------------


def test_defaults_are_mnist1ds() -> None:
    expected = get_dataset_args(as_dict=True)
    expected.pop("url")
    assert expected == _MNIST1D_DEFAULTS
    defaults = inspect.signature(MNIST1DDataModule).parameters
    assert defaults["num_samples"].default == expected["num_samples"]
    assert defaults["train_split"].default == expected["train_split"]
    assert defaults["generation_seed"].default == expected["seed"]
    assert data_module.MNIST1DDataModule is MNIST1DDataModule  # re-exported by the data module


def test_published_split_is_mnist1ds_default(tmp_path_factory: pytest.TempPathFactory) -> None:
    dm = MNIST1DDataModule(cache_dir=str(tmp_path_factory.mktemp("published")))
    reference = _reference()  # make_dataset(get_dataset_args()): the published split
    assert (dm.num_features, dm.num_classes, dm.num_tasks, dm.task) == (40, 10, 1, "multiclass")
    assert [len(dm.split_indices[s]) for s in ("train", "val", "test")] == [3600, 400, 1000]
    for split in ("train", "val"):
        x, y = _split(dm, split)
        index = dm.split_indices[split]
        assert np.array_equal(x, reference["x"][index].astype(np.float32))
        assert np.array_equal(y, reference["y"][index])
    assert np.array_equal(
        np.sort(np.concatenate([dm.split_indices["train"], dm.split_indices["val"]])),
        np.arange(4000),
    )
    x_test, y_test = _split(dm, "test")
    assert np.array_equal(x_test, reference["x_test"].astype(np.float32))
    assert np.array_equal(y_test, reference["y_test"])
    # the validation split is stratified: 10% of each class of the 4000 training sequences
    counts = np.bincount(_split(dm, "val")[1], minlength=10)
    assert np.all(np.abs(counts - 0.1 * np.bincount(reference["y"], minlength=10)) <= 1)


def test_small_set_is_mnist1ds(small: MNIST1DDataModule) -> None:
    reference = _reference(num_samples=SMALL)
    for split in ("train", "val"):
        x, y = _split(small, split)
        index = small.split_indices[split]
        assert x.dtype == np.float32
        assert y.dtype == np.int64
        assert np.array_equal(x, reference["x"][index].astype(np.float32))
        assert np.array_equal(y, reference["y"][index])
    x_test, y_test = _split(small, "test")
    assert np.array_equal(x_test, reference["x_test"].astype(np.float32))
    assert np.array_equal(y_test, reference["y_test"])
    assert [len(small.split_indices[s]) for s in ("train", "val", "test")] == [144, 16, 40]


def test_batches_and_predict(small: MNIST1DDataModule) -> None:
    for loader in (small.train_dataloader(), small.val_dataloader(), small.test_dataloader()):
        x, y = next(iter(loader))
        assert x.shape[1:] == (40,)
        assert x.dtype == torch.float32
        assert y.shape == x.shape[:1]
        assert y.dtype == torch.int64
    assert torch.equal(
        torch.cat(list(small.predict_dataloader())), small.dataset("test").tensors[0]
    )


def test_splits_depend_only_on_the_seed(small: MNIST1DDataModule, cache: Path) -> None:
    same = MNIST1DDataModule(num_samples=SMALL, cache_dir=str(cache))  # seed 0, like small
    other = MNIST1DDataModule(num_samples=SMALL, seed=4, cache_dir=str(cache))
    for split in ("train", "val"):
        assert np.array_equal(same.split_indices[split], small.split_indices[split])
        assert not np.array_equal(other.split_indices[split], small.split_indices[split])
        assert np.intersect1d(other.split_indices["train"], other.split_indices["val"]).size == 0
    assert np.array_equal(other.split_indices["test"], small.split_indices["test"])


# ----------------------------------------------------------------------------------------------
# A separately generated test set
# ----------------------------------------------------------------------------------------------


def test_generated_test_set(small: MNIST1DDataModule, cache: Path) -> None:
    dm = MNIST1DDataModule(num_samples=SMALL, test_samples=50, test_seed=7, cache_dir=str(cache))
    reference = _reference(num_samples=50, seed=7, train_split=0.0)
    x_test, y_test = _split(dm, "test")
    assert np.array_equal(x_test, reference["x_test"].astype(np.float32))
    assert np.array_equal(y_test, reference["y_test"])
    assert np.array_equal(np.bincount(y_test), np.full(10, 5))  # 50 // 10 per class
    # standardised by its own statistics, as mnist1d does
    assert abs(float(np.mean(x_test, dtype=np.float64))) < 1e-6
    assert abs(float(np.std(x_test, dtype=np.float64)) - 1.0) < 1e-6
    # training and validation are those of the published-style split; the test set is new
    for split in ("train", "val"):
        assert torch.equal(dm.dataset(split).tensors[0], small.dataset(split).tensors[0])
    assert x_test.shape == (50, 40)
    assert not np.isin(x_test, _split(small, "test")[0]).any()


def test_generated_test_set_with_every_sequence_for_training(cache: Path) -> None:
    dm = MNIST1DDataModule(
        num_samples=SMALL, train_split=1.0, test_samples=50, test_seed=7, cache_dir=str(cache)
    )
    reference = _reference(num_samples=SMALL, train_split=1.0)
    index = np.concatenate([dm.split_indices["train"], dm.split_indices["val"]])
    assert np.array_equal(np.sort(index), np.arange(SMALL))
    x, y = _split(dm, "train")
    assert np.array_equal(x, reference["x"][dm.split_indices["train"]].astype(np.float32))
    assert np.array_equal(y, reference["y"][dm.split_indices["train"]])
    assert len(dm.split_indices["test"]) == 50


# ----------------------------------------------------------------------------------------------
# Cache
# ----------------------------------------------------------------------------------------------


def test_second_construction_reads_the_cache(tmp_path: Path) -> None:
    first = MNIST1DDataModule(num_samples=SMALL, cache_dir=str(tmp_path))
    (path,) = first.cache_files
    assert sorted(tmp_path.iterdir()) == [path]  # one file, no temporary left behind
    assert re.fullmatch(r"mnist1d-[0-9a-f]{16}\.npz", path.name)
    before = path.stat()
    second = MNIST1DDataModule(num_samples=SMALL, seed=3, cache_dir=str(tmp_path))
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert torch.equal(second.dataset("test").tensors[0], first.dataset("test").tensors[0])
    # the file is what is read: alter its arrays (validly) and the module serves the change
    with np.load(path) as file:
        arrays = {name: file[name] for name in file.files}
    arrays["x_test"] = arrays["x_test"] + 1000.0
    with path.open("wb") as file:
        np.savez(file, **arrays)
    third = MNIST1DDataModule(num_samples=SMALL, cache_dir=str(tmp_path))
    assert torch.equal(third.dataset("test").tensors[0], first.dataset("test").tensors[0] + 1000)
    # other generation arguments are another file
    other = MNIST1DDataModule(num_samples=300, cache_dir=str(tmp_path))
    assert other.cache_files[0] != path
    assert len(list(tmp_path.iterdir())) == 2


def _garbage(path: Path) -> None:
    path.write_bytes(b"not an npz file at all")


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _rewrite(path: Path, change) -> None:
    with np.load(path) as file:
        arrays = {name: file[name] for name in file.files}
    change(arrays)
    with path.open("wb") as file:
        np.savez(file, **arrays)


CORRUPTIONS = {
    "garbage": _garbage,
    "truncated": _truncated,
    "missing key": lambda path: _rewrite(path, lambda a: a.pop("y_test")),
    "extra key": lambda path: _rewrite(path, lambda a: a.update(extra=np.zeros(3))),
    "wrong shape": lambda path: _rewrite(path, lambda a: a.update(x=a["x"][:, :10])),
    "other arguments": lambda path: _rewrite(path, lambda a: a.update(args=np.array("{}"))),
    "labels out of range": lambda path: _rewrite(path, lambda a: a.update(y=a["y"] + 10)),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_cache_is_regenerated(tiny: MNIST1DDataModule, tmp_path: Path, corruption: str):
    (path,) = MNIST1DDataModule(cache_dir=str(tmp_path), **TINY).cache_files
    CORRUPTIONS[corruption](path)
    corrupt_inode = path.stat().st_ino
    with pytest.warns(UserWarning, match=re.escape(str(path))) as record:
        dm = MNIST1DDataModule(cache_dir=str(tmp_path), **TINY)
    assert len(record) == 1
    assert "regenerated" in str(record[0].message)
    for split in ("train", "val", "test"):
        for got, want in zip(dm.dataset(split).tensors, tiny.dataset(split).tensors, strict=True):
            assert torch.equal(got, want)
    # replaced by a new file renamed over it (written elsewhere first, never in place)
    assert path.stat().st_ino != corrupt_inode
    assert sorted(tmp_path.iterdir()) == [path]
    with np.load(path) as file:  # a valid file
        assert sorted(file.files) == ["args", "x", "x_test", "y", "y_test"]
        assert np.array_equal(file["x_test"].astype(np.float32), _split(tiny, "test")[0])


def test_unwritable_cache_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for cache_dir in (blocker, blocker / "below-a-file"):
        with pytest.raises(OSError, match=re.escape(f"cache_dir={str(cache_dir)!r}")):
            MNIST1DDataModule(num_samples=SMALL, cache_dir=str(cache_dir))


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LIGHTNING_LOSSES_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "lightning-losses" / "mnist1d"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "lightning-losses" / "mnist1d"
    monkeypatch.setenv("LIGHTNING_LOSSES_CACHE", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    dm = MNIST1DDataModule(num_samples=SMALL)
    assert dm.cache_files[0].parent == tmp_path / "explicit"
    assert dm.cache_files[0].is_file()


# ----------------------------------------------------------------------------------------------
# Global random state
# ----------------------------------------------------------------------------------------------


def test_generation_leaves_the_global_random_state(tmp_path: Path) -> None:
    random.seed(1234)
    np.random.seed(5678)
    random.random(), np.random.rand()
    python_state, numpy_state = random.getstate(), np.random.get_state()
    # mnist1d itself reseeds both generators, so this test would fail without the restoring
    args = get_dataset_args()
    args.num_samples = 20
    make_dataset(args)
    assert random.getstate() != python_state
    assert not _same_numpy_state(np.random.get_state(), numpy_state)
    random.setstate(python_state)
    np.random.set_state(numpy_state)

    dm = MNIST1DDataModule(num_samples=SMALL, test_samples=20, cache_dir=str(tmp_path))
    assert len(list(tmp_path.glob("*.npz"))) == 2  # both sets were generated, not read
    assert random.getstate() == python_state
    assert _same_numpy_state(np.random.get_state(), numpy_state)
    assert len(dm.split_indices["test"]) == 20


# ----------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"test_samples": 5}, "test_samples"),
        ({"test_samples": 55}, "test_samples"),
        ({"test_samples": 2.0}, "test_samples"),
        ({"test_samples": 50, "test_seed": 42}, "test_seed"),
        ({"test_samples": 50, "generation_seed": 3, "test_seed": 3}, "test_seed"),
        ({"test_seed": -1}, "test_seed"),
        ({"generation_seed": 2**32}, "generation_seed"),
        ({"generation_seed": 1.5}, "generation_seed"),
        ({"num_samples": 205}, "num_samples"),
        ({"num_samples": 0}, "num_samples"),
        ({"num_samples": True}, "num_samples"),
        ({"train_split": 0.0}, "train_split"),
        ({"train_split": 1.0}, "train_split"),  # 1.0 leaves no published test split
        ({"train_split": 1.5}, "train_split"),
        ({"train_split": "0.8"}, "train_split"),
        ({"train_split": 0.001}, "train_split"),  # no training sequence of 200
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"val_fraction": 0.01}, "val_fraction"),  # 2 validation sequences cannot stratify
        ({"val_fraction": 0.97}, "val_fraction"),  # 5 training sequences cannot stratify
        ({"batch_size": 0}, "batch_size"),
        ({"seed": -1}, "seed"),
        ({"num_workers": -1}, "num_workers"),
    ],
)
def test_invalid_arguments(kwargs: dict, argument: str, tmp_path: Path) -> None:
    kwargs = {"num_samples": SMALL, **kwargs}
    with pytest.raises(ValueError, match=rf"\b{argument}\b"):
        MNIST1DDataModule(cache_dir=str(tmp_path), **kwargs)
    assert not list(tmp_path.iterdir())  # rejected before anything is generated


def test_cache_dir_must_be_a_path() -> None:
    with pytest.raises(TypeError, match="cache_dir"):
        MNIST1DDataModule(num_samples=SMALL, cache_dir=3)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_module_can_be_imported_before_the_data_package() -> None:
    # lightning_losses.data re-exports the class of lightning_losses.data.mnist1d, which imports
    # lightning_losses.data.base: importing the submodule first, in a fresh interpreter, must
    # neither hit a circular import nor give a second class.
    code = (
        "import lightning_losses.data.mnist1d as m, lightning_losses.data as d\n"
        "assert d.MNIST1DDataModule is m.MNIST1DDataModule\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------------------------
# Under a Lightning Trainer
# ----------------------------------------------------------------------------------------------


def test_fit_test_predict_one_epoch(small: MNIST1DDataModule, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ClassifierModule(input_dim=small.num_features, num_classes=10, hidden=[16])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, small)
    assert trainer.global_step == math.ceil(144 / 32)
    (results,) = trainer.test(model, small, verbose=False)
    assert 0.0 <= results["test/acc"] <= 1.0
    assert math.isfinite(results["test/loss"])
    predictions = torch.cat(trainer.predict(model, small))
    assert predictions.shape == (40, 10)
    with torch.no_grad():
        expected = torch.softmax(model(small.dataset("test").tensors[0]), dim=-1)
    assert torch.allclose(predictions, expected, atol=1e-6)
