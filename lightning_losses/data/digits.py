"""DataModules on scikit-learn's digits (1797 images of 8x8 pixels, 10 classes), in [0, 1]."""

from __future__ import annotations

import functools

import numpy as np

from lightning_losses.data.base import _SplitDataModule
from lightning_losses.functional.checks import check_fraction, check_int, check_range


@functools.cache
def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: features ``[1797, 64]`` float32 in [0, 1], labels int64."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    features.flags.writeable = False
    labels.flags.writeable = False
    return features, labels


class DigitsDataModule(_SplitDataModule):
    """scikit-learn's handwritten digits: 10 classes, 64 features in [0, 1].

    Splits are stratified by digit. Targets are int64 class indices.

    Args:
        batch_size: samples per batch.
        seed: chooses the splits and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = DigitsDataModule(batch_size=32)
        >>> dm.num_features, dm.num_classes, dm.num_tasks, dm.task
        (64, 10, 1, 'multiclass')
        >>> x, y = next(iter(dm.train_dataloader()))
        >>> x.shape, x.dtype, y.shape, y.dtype
        (torch.Size([32, 64]), torch.float32, torch.Size([32]), torch.int64)
    """

    def __init__(
        self,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        features, labels = _load_digits()
        splits = self._split(np.arange(len(labels)), labels)
        self._set_data(features, labels, splits, task="multiclass", num_classes=10)


class LongTailedDigitsDataModule(_SplitDataModule):
    """Digits whose training split is long-tailed; validation and test stay balanced.

    The data is first split exactly as :class:`DigitsDataModule` splits it (same ``seed``, same
    fractions). Then the training split keeps ``int(n_max * imbalance_ratio ** (-c / 9))``
    samples of class ``c``, drawn at random by ``seed``, where ``n_max`` is the size of the
    smallest class in the training split: class 0 is the most frequent, class 9 the rarest, and
    their ratio is ``imbalance_ratio`` up to rounding. Validation and test keep their balanced
    classes, so that they measure accuracy on every class alike (the usual long-tailed protocol).

    Args:
        imbalance_ratio: largest over smallest class count in training, ``>= 1``.
        batch_size: samples per batch.
        seed: chooses the splits, the kept samples and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = LongTailedDigitsDataModule(imbalance_ratio=10.0)
        >>> counts = np.bincount(dm.dataset("train").tensors[1].numpy())
        >>> bool(counts[0] >= 10 * counts[9] > 0), bool(np.all(np.diff(counts) <= 0))
        (True, True)
    """

    def __init__(
        self,
        imbalance_ratio: float = 10.0,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        check_range("imbalance_ratio", imbalance_ratio, low=1.0)
        self.imbalance_ratio = imbalance_ratio
        features, labels = _load_digits()
        splits = self._split(np.arange(len(labels)), labels)
        train = splits["train"]
        n_classes = 10
        n_max = int(np.bincount(labels[train], minlength=n_classes).min())
        if imbalance_ratio > n_max:
            raise ValueError(
                f"imbalance_ratio must be <= {n_max} (the smallest class count in the training "
                f"split), got {imbalance_ratio!r}"
            )
        rng = np.random.default_rng(seed)
        kept = []
        for c in range(n_classes):
            count = int(n_max * imbalance_ratio ** (-c / (n_classes - 1)))
            kept.append(rng.choice(train[labels[train] == c], size=count, replace=False))
        splits["train"] = np.sort(np.concatenate(kept))
        self._set_data(features, labels, splits, task="multiclass", num_classes=n_classes)


class RareDigitDataModule(_SplitDataModule):
    """Binary one-vs-rest digits: is it ``positive_digit``? Positives are a chosen fraction.

    Before splitting, one side is subsampled (by ``seed``) so that positives make up
    ``positive_fraction`` of the data: the positives when the fraction is below the natural one
    (about 0.1), the negatives when it is above. The splits are then stratified by the binary
    label, so that every split has the same positive fraction. Targets are float32 0. or 1.

    Args:
        positive_digit: the digit labelled 1.0, in 0..9.
        positive_fraction: fraction of positives in the data, in (0, 1).
        batch_size: samples per batch.
        seed: chooses the kept samples, the splits and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = RareDigitDataModule(positive_digit=3, positive_fraction=0.05)
        >>> dm.task, dm.num_classes
        ('binary', 1)
        >>> y = dm.dataset("train").tensors[1]
        >>> y.dtype, round(y.mean().item(), 2)
        (torch.float32, 0.05)
    """

    def __init__(
        self,
        positive_digit: int = 0,
        positive_fraction: float = 0.05,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        positive_digit = check_int("positive_digit", positive_digit, low=0, high=9)
        check_fraction("positive_fraction", positive_fraction)
        self.positive_digit = positive_digit
        self.positive_fraction = positive_fraction
        features, labels = _load_digits()
        positives = np.flatnonzero(labels == positive_digit)
        negatives = np.flatnonzero(labels != positive_digit)
        f = positive_fraction
        if f * len(negatives) / (1.0 - f) <= len(positives):  # keep every negative
            n_pos, n_neg = round(f * len(negatives) / (1.0 - f)), len(negatives)
        else:  # keep every positive
            n_pos, n_neg = len(positives), round(len(positives) * (1.0 - f) / f)
        if min(n_pos, n_neg) < 3:
            raise ValueError(
                f"positive_fraction={f} leaves {n_pos} positives and {n_neg} negatives; "
                "each split needs at least one of each"
            )
        rng = np.random.default_rng(seed)
        kept = np.sort(
            np.concatenate(
                [
                    rng.choice(positives, size=n_pos, replace=False),
                    rng.choice(negatives, size=n_neg, replace=False),
                ]
            )
        )
        targets = (labels == positive_digit).astype(np.float32)
        splits = self._split(kept, targets[kept])
        self._set_data(features, targets, splits, task="binary", num_classes=1)


class MultiLabelDigitsDataModule(_SplitDataModule):
    """Five binary attributes of each digit, named in :attr:`label_names`.

    ``is_even`` (0 2 4 6 8), ``is_prime`` (2 3 5 7), ``greater_than_4`` (5..9),
    ``has_closed_loop`` (0 4 6 8 9) and ``is_square`` (0 1 4 9). Splits are stratified by digit
    and equal those of :class:`DigitsDataModule` with the same arguments. Targets are float32
    ``[B, 5]`` of 0. and 1.

    Args:
        batch_size: samples per batch.
        seed: chooses the splits and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = MultiLabelDigitsDataModule()
        >>> dm.task, dm.num_classes, dm.label_names[0]
        ('multilabel', 5, 'is_even')
        >>> MultiLabelDigitsDataModule.attributes(np.array([7])).tolist()
        [[0.0, 1.0, 1.0, 0.0, 0.0]]
    """

    label_names: tuple[str, ...] = (
        "is_even",
        "is_prime",
        "greater_than_4",
        "has_closed_loop",
        "is_square",
    )
    _label_digits: tuple[tuple[int, ...], ...] = (
        (0, 2, 4, 6, 8),
        (2, 3, 5, 7),
        (5, 6, 7, 8, 9),
        (0, 4, 6, 8, 9),
        (0, 1, 4, 9),
    )

    def __init__(
        self,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        features, labels = _load_digits()
        splits = self._split(np.arange(len(labels)), labels)
        targets = self.attributes(labels)
        self._set_data(features, targets, splits, task="multilabel", num_classes=len(targets[0]))

    @classmethod
    def attributes(cls, digits: np.ndarray) -> np.ndarray:
        """The ``[N, 5]`` float32 attribute matrix of an array of digits."""
        return np.stack([np.isin(digits, members) for members in cls._label_digits], axis=1).astype(
            np.float32
        )


class NMDigitsDataModule(_SplitDataModule):
    """Three 3-way tasks per digit: the base-3 digits of its label, least significant first.

    Label ``d`` gives the targets ``[d % 3, (d // 3) % 3, (d // 9) % 3]`` (int64 ``[B, 3]``);
    ``num_tasks`` is 3 and ``num_classes`` (per task) is 3. Splits are stratified by digit and
    equal those of :class:`DigitsDataModule` with the same arguments.

    Args:
        batch_size: samples per batch.
        seed: chooses the splits and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Example:
        >>> dm = NMDigitsDataModule()
        >>> dm.task, dm.num_tasks, dm.num_classes
        ('nm', 3, 3)
        >>> NMDigitsDataModule.base3(np.array([5])).tolist()
        [[2, 1, 0]]
    """

    def __init__(
        self,
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        features, labels = _load_digits()
        splits = self._split(np.arange(len(labels)), labels)
        targets = self.base3(labels)
        self._set_data(features, targets, splits, task="nm", num_classes=3, num_tasks=3)

    @staticmethod
    def base3(digits: np.ndarray) -> np.ndarray:
        """The ``[N, 3]`` int64 base-3 digits of labels 0..26, least significant first."""
        digits = np.asarray(digits, dtype=np.int64)
        return np.stack([digits % 3, (digits // 3) % 3, (digits // 9) % 3], axis=1)
