"""``TensorDataModule``: any task, from the user's ``.npz`` or ``.csv`` file."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lightning_losses.data.base import TASKS, _SplitDataModule
from lightning_losses.functional.checks import check_choice

# ----------------------------------------------------------------------------------------------
# The user's own arrays
# ----------------------------------------------------------------------------------------------


def _read_csv(path: Path) -> tuple[list[str] | None, np.ndarray]:
    """Rows of numbers, with an optional header row of column names."""
    with path.open(newline="") as file:
        rows = [row for row in csv.reader(file) if row]
    header = None
    if rows:
        try:
            [float(cell) for cell in rows[0]]
        except ValueError:
            header = [cell.strip() for cell in rows.pop(0)]
    if not rows:
        raise ValueError(f"{path} has no data rows")
    widths = {len(row) for row in rows}
    if len(widths) != 1 or (header is not None and widths != {len(header)}):
        raise ValueError(f"{path}: every row (and the header) must have the same number of cells")
    try:
        return header, np.array(rows, dtype=np.float64)
    except ValueError as error:
        raise ValueError(f"{path}: non-numeric value in a data row ({error})") from None


def _column_index(column: str | int, header: list[str] | None, width: int) -> int:
    if isinstance(column, str):
        if header is None:
            raise ValueError(f"label_column={column!r} names a column, but the CSV has no header")
        if column not in header:
            raise ValueError(f"label_column={column!r} is not a column; the columns are {header}")
        return header.index(column)
    if not -width <= column < width:
        raise ValueError(f"label_column={column} is out of range for {width} columns")
    return column % width


def _task_labels(labels: np.ndarray, task: str) -> np.ndarray:
    """The labels read from a file, cast for ``task``: int64 or float32, 1-D or 2-D as the task.

    Raises ``ValueError`` for labels the task cannot take (a file's content, not an argument).
    """
    if task in ("multiclass", "binary"):
        if labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.ndim != 1:
            raise ValueError(f"task={task!r} needs one label per sample, got shape {labels.shape}")
    else:
        labels = labels.reshape(len(labels), -1)
    if task in ("multiclass", "nm"):
        if not np.all(np.isfinite(labels)) or np.any(labels < 0) or np.any(labels != labels // 1):
            raise ValueError(f"task={task!r} needs labels that are integers >= 0")
        return labels.astype(np.int64)
    if task == "binary" and not np.all(np.isin(labels, (0, 1))):
        raise ValueError("task='binary' needs labels 0 or 1")
    if task == "multilabel" and not np.all((labels >= 0) & (labels <= 1)):
        raise ValueError("task='multilabel' needs labels in [0, 1]")
    return labels.astype(np.float32)


class TensorDataModule(_SplitDataModule):
    r"""The user's own features and labels, from a ``.npz`` or ``.csv`` file.

    ``.npz``: the features are the array ``features_key`` (``[N, D]``, or ``[N, ...]``, which is
    flattened) and the labels the array ``labels_key``. ``.csv``: numeric cells, an optional
    header row of column names; the labels are ``label_column`` (a name or an index, negative
    counting from the end; for ``"multilabel"`` and ``"nm"`` also a list of them) and the
    features are all other columns. Features are used as they are (float32, not rescaled).

    Labels per ``task``: ``"multiclass"``: integers >= 0, ``num_classes = max + 1``;
    ``"binary"``: 0 or 1, ``num_classes = 1``; ``"multilabel"``: ``[N, K]`` in [0, 1],
    ``num_classes = K``; ``"nm"``: ``[N, n]`` integers >= 0, ``num_tasks = n`` and
    ``num_classes = max + 1``. Splits are stratified by label for multiclass and binary when
    every class has enough samples, and random otherwise.

    Args:
        path: the ``.npz`` or ``.csv`` file.
        task: ``"multiclass"``, ``"binary"``, ``"multilabel"`` or ``"nm"``.
        label_column: CSV only: the label column(s), by name or index.
        features_key: NPZ only: name of the features array.
        labels_key: NPZ only: name of the labels array.
        batch_size: samples per batch.
        seed: chooses the splits and the training order.
        val_fraction: fraction of the samples in the validation split.
        test_fraction: fraction of the samples in the test split.
        num_workers: DataLoader worker processes.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unknown extension or task, missing array or column, labels of the wrong
            kind for the task, or features and labels of different lengths.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "data.csv"
        >>> rows = [f"{i},{i % 4},{i % 3}" for i in range(60)]
        >>> _ = path.write_text("a,b,label\n" + "\n".join(rows))
        >>> dm = TensorDataModule(str(path), label_column="label")
        >>> dm.num_features, dm.num_classes, len(dm.dataset("test"))
        (2, 3, 12)
    """

    def __init__(
        self,
        path: str,
        task: str = "multiclass",
        label_column: str | int | list[str | int] = -1,
        features_key: str = "x",
        labels_key: str = "y",
        batch_size: int = 64,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, val_fraction, test_fraction, num_workers)
        check_choice("task", task, TASKS)
        self.path = path
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"path={path!r}: no such file")
        suffix = file.suffix.lower()
        if suffix == ".npz":
            features, labels = self._load_npz(file, features_key, labels_key)
        elif suffix == ".csv":
            features, labels = self._load_csv(file, task, label_column)
        else:
            raise ValueError(f"path={path!r}: unknown extension {suffix!r}; use .npz or .csv")
        if len(features) != len(labels):
            raise ValueError(
                f"features and labels have different lengths: {len(features)} and {len(labels)}"
            )
        features = features.reshape(len(features), -1).astype(np.float32)
        labels = _task_labels(labels, task)
        num_tasks = labels.shape[1] if task == "nm" else 1
        if task == "multiclass" or task == "nm":
            num_classes = int(labels.max()) + 1
        else:
            num_classes = labels.shape[1] if task == "multilabel" else 1
        indices = np.arange(len(labels))
        try:
            splits = self._split(indices, labels if task in ("multiclass", "binary") else None)
        except ValueError:  # a class too rare to stratify (or too few samples: raised again)
            splits = self._split(indices, None)
        self._set_data(
            features, labels, splits, task=task, num_classes=num_classes, num_tasks=num_tasks
        )

    @staticmethod
    def _load_npz(file: Path, features_key: str, labels_key: str) -> tuple[np.ndarray, np.ndarray]:
        with np.load(file, allow_pickle=False) as arrays:
            for argument, key in (("features_key", features_key), ("labels_key", labels_key)):
                if key not in arrays:
                    raise ValueError(
                        f"{argument}={key!r} is not an array in {file}; it has {list(arrays)}"
                    )
            return arrays[features_key], arrays[labels_key]

    @staticmethod
    def _load_csv(
        file: Path, task: str, label_column: str | int | Sequence[str | int]
    ) -> tuple[np.ndarray, np.ndarray]:
        header, data = _read_csv(file)
        width = data.shape[1]
        if isinstance(label_column, (str, int)):
            columns = [_column_index(label_column, header, width)]
        elif task in ("multilabel", "nm"):
            columns = [_column_index(column, header, width) for column in label_column]
        else:
            raise ValueError(f"label_column may be a list only for multilabel or nm, not {task!r}")
        if not columns or len(set(columns)) != len(columns) or len(columns) >= width:
            raise ValueError(
                f"label_column={label_column!r} must name distinct columns and leave features"
            )
        features = np.delete(data, columns, axis=1)
        labels = data[:, columns]
        return features, labels[:, 0] if len(columns) == 1 and task != "multilabel" else labels
