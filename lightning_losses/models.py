"""``ClassifierModule``: a ready LightningModule for the command line and the experiments."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .heads import NormFaceHead
from .mixins import LossMixin, _import_class, describe_criterion

TASKS = ("multiclass", "binary", "multilabel", "nm")
HEADS = ("linear", "normface", "cosface", "arcface")

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def task_nll(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Mean negative log-likelihood of the model's probabilities, whatever the loss trained it.

    Softmax cross-entropy for ``multiclass`` and ``nm`` (averaged over tasks), sigmoid binary
    cross-entropy for ``binary`` and ``multilabel`` (averaged over labels).
    """
    if task == "multiclass":
        return F.cross_entropy(logits.float(), target)
    if task == "nm":
        return F.cross_entropy(logits.float().flatten(0, 1), target.flatten())
    return F.binary_cross_entropy_with_logits(logits.float(), target.float())


def task_accuracy(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Accuracy: top-1 (``multiclass``), per task (``nm``), per label with ``x > 0`` otherwise."""
    if task == "multiclass":
        correct = logits.argmax(dim=1) == target
    elif task == "nm":
        correct = logits.argmax(dim=2) == target
    else:
        correct = (logits > 0) == (target > 0.5)
    return correct.float().mean()


class ClassifierModule(LossMixin, L.LightningModule):
    """An MLP classifier whose loss, head and optimizer are chosen in YAML.

    The backbone is ``Linear -> ReLU (-> Dropout)`` for each size in ``hidden``; the head is a
    linear layer (logits divided by a fixed ``temperature``) or a scaled-cosine
    :class:`~lightning_losses.NormFaceHead` (``normface``, ``cosface``, ``arcface``). The
    output takes the shape the task's losses expect: ``[N, C]`` (``multiclass``), ``[N]``
    (``binary``), ``[N, K]`` (``multilabel``) or ``[N, n, m]`` (``nm``).

    Logged: ``train/loss``, ``train/acc``, ``criterion/<hyper-parameter>``, ``val/loss``,
    ``val/acc``, ``val/nll`` (and ``test/*``), ``time/epoch_seconds``. ``validation_step``
    returns ``{"loss", "logits", "target"}`` for the calibration callback.

    Args:
        criterion: a registry name (``"focal"``), a loss module, or in YAML a
            ``class_path``/``init_args`` mapping (``lightning_losses.FocalLoss``...).
        input_dim: feature size (linked from the DataModule by the CLI).
        num_classes: classes ``C`` (multiclass), labels ``K`` (multilabel), classes per task
            ``m`` (nm); ignored for binary.
        num_tasks: tasks ``n`` for ``nm``.
        task: ``multiclass``, ``binary``, ``multilabel`` or ``nm``.
        hidden: sizes of the hidden layers.
        dropout: dropout after each hidden layer.
        head: ``linear``, ``normface``, ``cosface`` or ``arcface``.
        temperature: fixed divisor of the linear head's logits.
        scale: scale of a cosine head; ``None`` learns it.
        margin: CosFace / ArcFace margin.
        optimizer: a factory ``params -> Optimizer`` (in YAML a ``class_path`` such as
            ``torch.optim.Adam`` with ``init_args``).

    Example:
        >>> model = ClassifierModule("focal", input_dim=64, num_classes=10, hidden=[32])
        >>> model(torch.randn(5, 64)).shape
        torch.Size([5, 10])
    """

    def __init__(
        self,
        criterion: str | nn.Module = "ce",
        input_dim: int = 64,
        num_classes: int = 10,
        num_tasks: int = 1,
        task: str = "multiclass",
        hidden: Sequence[int] = (128, 64),
        dropout: float = 0.0,
        head: str = "linear",
        temperature: float = 1.0,
        scale: float | None = None,
        margin: float = 0.0,
        optimizer: OptimizerFactory | None = None,
    ) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}; got {task!r}")
        if head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}; got {head!r}")
        if head != "linear" and task != "multiclass":
            raise ValueError(f"head={head!r} needs task='multiclass'; got task={task!r}")
        if temperature <= 0:
            raise ValueError(f"temperature must be positive; got {temperature!r}")
        self.save_hyperparameters()
        # Checkpoints must load with torch.load(weights_only=True): keep hparams plain.
        if not _is_plain(self.hparams.get("criterion")):
            self.hparams["criterion"] = describe_criterion(criterion)
        if not _is_plain(self.hparams.get("optimizer")):
            self.hparams.pop("optimizer")
        self.task = task
        self.num_tasks = num_tasks
        self.num_classes = num_classes
        self.temperature = temperature
        self.optimizer_factory = optimizer

        layers: list[nn.Module] = []
        width = input_dim
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = size
        self.backbone = nn.Sequential(*layers)
        outputs = {"multiclass": num_classes, "binary": 1, "multilabel": num_classes}
        outputs["nm"] = num_tasks * num_classes
        if head == "linear":
            self.head: nn.Module = nn.Linear(width, outputs[task])
        else:
            self.head = NormFaceHead(width, num_classes, scale=scale, margin=margin, kind=head)
        self.set_criterion(criterion)
        self._epoch_started = 0.0

    def forward(self, x: Tensor, target: Tensor | None = None) -> Tensor:
        features = self.backbone(x)
        if isinstance(self.head, NormFaceHead):
            return self.head(features, target)
        logits = self.head(features) / self.temperature
        if self.task == "binary":
            return logits.squeeze(-1)
        if self.task == "nm":
            return logits.view(-1, self.num_tasks, self.num_classes)
        return logits

    def _shared_step(self, batch: Sequence[Tensor], stage: str) -> dict[str, Tensor]:
        x, target = batch
        # Margins (CosFace / ArcFace) apply in training only.
        logits = self(x, target if stage == "train" else None)
        loss = self.compute_loss(logits, target, log=stage == "train")
        on_step = stage == "train"
        # Epoch-level validation and test values are averaged across DDP processes.
        options = {"on_step": on_step, "on_epoch": True, "sync_dist": not on_step}
        self.log(f"{stage}/loss", loss, prog_bar=True, **options)
        accuracy = task_accuracy(logits, target, self.task)
        self.log(f"{stage}/acc", accuracy, prog_bar=True, **options)
        if stage != "train":
            self.log(f"{stage}/nll", task_nll(logits, target, self.task), **options)
        return self.validation_output(logits, target, loss)

    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> Tensor:
        return self._shared_step(batch, "train")["loss"]

    def validation_step(self, batch: Sequence[Tensor], batch_idx: int) -> dict[str, Tensor]:
        return self._shared_step(batch, "val")

    def test_step(self, batch: Sequence[Tensor], batch_idx: int) -> dict[str, Tensor]:
        return self._shared_step(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Probabilities: softmax (multiclass, nm) or sigmoid (binary, multilabel)."""
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        logits = self(x)
        if self.task in ("multiclass", "nm"):
            return torch.softmax(logits, dim=-1)
        return torch.sigmoid(logits)

    def on_train_epoch_start(self) -> None:
        self._epoch_started = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        self.log("time/epoch_seconds", time.perf_counter() - self._epoch_started)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        factory = self.optimizer_factory
        if factory is None:
            return torch.optim.Adam(self.parameters(), lr=1e-3)
        if isinstance(factory, Mapping):  # a class_path mapping restored from a checkpoint
            cls = _import_class(factory["class_path"])
            return cls(self.parameters(), **dict(factory.get("init_args") or {}))
        return factory(self.parameters())
