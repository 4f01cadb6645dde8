"""``ClassifierModule``: a ready LightningModule for the command line and the experiments."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import lightning as L
import torch
from torch import Tensor, nn

from lightning_losses.functional.checks import check_choice, check_real
from lightning_losses.functional.evaluation import correct_terms, nll_terms
from lightning_losses.heads import NormFaceHead
from lightning_losses.lightning.backbone_spec import (
    DEFAULT_DROPOUT,
    DEFAULT_HIDDEN,
    backbone_features,
    build_backbone,
    describe_backbone,
    is_plain,
)
from lightning_losses.lightning.backbones import MLP
from lightning_losses.lightning.class_path import instantiate
from lightning_losses.lightning.evaluation import MeanOfTerms, evaluation_metrics
from lightning_losses.lightning.mixin import LossMixin, describe_criterion

if TYPE_CHECKING:
    from lightning_losses.calibration.posthoc.base import PostHocCalibrator

TASKS = ("multiclass", "binary", "multilabel", "nm")
HEADS = ("linear", "normface", "cosface", "arcface")

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def calibrator_from_state(state: Mapping[str, Any]) -> PostHocCalibrator:
    """The post-hoc calibrator a ``PostHocCalibration`` callback saved in its ``state_dict``.

    ``state`` holds ``method`` (``"none"``: the identity), ``hparams`` (its keyword arguments)
    and ``calibrator`` (the fitted calibrator's ``state_dict``).
    """
    from lightning_losses.calibration.posthoc import get_calibrator
    from lightning_losses.calibration.posthoc.base import IdentityCalibrator

    method, hparams = str(state["method"]), dict(state.get("hparams") or {})
    calibrator: PostHocCalibrator = (
        IdentityCalibrator() if method == "none" else get_calibrator(method, **hparams)
    )
    calibrator.load_state_dict(state["calibrator"])
    return calibrator


def posthoc_calibrator(checkpoint: Mapping[str, Any]) -> PostHocCalibrator | None:
    """The post-hoc calibrator saved in a checkpoint's callback states; ``None`` if none is."""
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, Mapping) and {"method", "calibrator"} <= set(state):
            return calibrator_from_state(state)
    return None


def calibrated_probabilities(calibrator: nn.Module, logits: Tensor) -> Tensor:
    """Calibrated probabilities of ``logits`` in their task's shape.

    ``[N, C]`` multiclass logits give ``[N, C]``, ``[N]`` binary logits the positive class's
    ``[N]``, ``[N, n, m]`` n-by-m logits ``[N, n, m]`` (each task calibrated as a multiclass row).
    """
    if logits.dim() == 3:
        return calibrator(logits.flatten(0, 1)).exp().view_as(logits)
    probs = calibrator(logits).exp()
    return probs[:, 1] if logits.dim() == 1 else probs


def _head_and_task(task: str, head: str, temperature: float) -> None:
    """``task`` and ``head`` among their choices (a margin head is multiclass), ``temperature > 0``.

    Raises:
        ValueError: naming the argument, its choices and the value given.
    """
    check_choice("task", task, TASKS)
    check_choice("head", head, HEADS)
    if head != "linear" and task != "multiclass":
        raise ValueError(f"head={head!r} needs task='multiclass'; got task={task!r}")
    check_real("temperature", temperature, low=0.0, low_open=True)


def _given_backbone(
    backbone: nn.Module | Mapping[str, Any], hidden: Sequence[int], dropout: float
) -> nn.Module:
    """A given backbone as a module (built from a ``class_path`` mapping), without MLP options.

    Raises:
        TypeError: neither an ``nn.Module`` nor a mapping.
        ValueError: ``hidden`` or ``dropout`` other than their defaults with it.
    """
    if isinstance(backbone, Mapping):
        backbone = build_backbone(backbone)
    if not isinstance(backbone, nn.Module):
        raise TypeError(
            "backbone must be None, an nn.Module or a {'class_path', 'init_args'} "
            f"mapping; got {type(backbone).__name__}"
        )
    if list(hidden) != list(DEFAULT_HIDDEN) or dropout != DEFAULT_DROPOUT:
        raise ValueError(
            f"hidden and dropout configure the default MLP backbone only; with "
            f"backbone={type(backbone).__name__} leave them at hidden="
            f"{list(DEFAULT_HIDDEN)}, dropout={DEFAULT_DROPOUT} (got hidden="
            f"{list(hidden)}, dropout={dropout}), or give backbone="
            "lightning_losses.lightning.backbones.MLP with those arguments"
        )
    return backbone


class ClassifierModule(LossMixin, L.LightningModule):
    """A classifier whose backbone, loss, head and optimizer are chosen in YAML.

    The backbone maps inputs ``[N, input_dim]`` to features ``[N, F]``: by default an
    :class:`~lightning_losses.lightning.backbones.MLP`, ``Linear -> ReLU (-> Dropout)`` for
    each size in ``hidden`` (``hidden=[]``: none, a logistic regression under a linear head), or
    any ``nn.Module`` given as ``backbone`` (such as the MNIST-1D CNN
    :class:`~lightning_losses.lightning.backbones.CNN1D`). The head is a linear layer (logits
    divided by a fixed ``temperature``) or a scaled-cosine :class:`~lightning_losses.NormFaceHead`
    (``normface``, ``cosface``, ``arcface``) on the ``F`` features. The output takes the shape
    the task's losses expect: ``[N, C]`` (``multiclass``), ``[N]`` (``binary``), ``[N, K]``
    (``multilabel``) or ``[N, n, m]`` (``nm``).

    In YAML the backbone is a ``class_path``/``init_args`` mapping::

        model:
          backbone:
            class_path: lightning_losses.lightning.backbones.CNN1D
            init_args: {channels: 25}

    (or ``--model.backbone=lightning_losses.lightning.backbones.CNN1D`` on the command line).

    Checkpoints keep their hyper-parameters plain (they load with ``weights_only=True``): a
    backbone that keeps its constructor arguments in a plain ``init_args`` dict, as those of
    :mod:`lightning_losses.lightning.backbones` do, is stored as ``{"class_path", "init_args"}`` and
    ``load_from_checkpoint(path)`` builds it again. Any other backbone is left out of the
    hyper-parameters: load such a checkpoint with ``load_from_checkpoint(path,
    backbone=<a backbone of the same architecture>)``.

    Logged: ``train/loss``, ``train/acc`` (each step, this process's batch: ``*_step``; and the
    epoch's exact mean over every process's samples: ``*_epoch``),
    ``criterion/<hyper-parameter>`` (each training step, for the values a schedule or switch
    changes; the constants are params), ``time/epoch_seconds`` (the slowest
    process's), and per validation (and test) epoch ``val/loss``, ``val/acc``, ``val/nll``
    (``test/*``). Every value logged on epoch level is reduced across DDP processes, so no
    ``sync_dist`` warning is due. ``validation_step`` returns ``{"loss", "logits", "target"}``
    for the calibration callback.

    The validation and test values are :class:`MeanOfTerms` metrics (one set per stage) whose
    sums are reduced across DDP processes, so with an evaluation loader that gives each sample
    to one process (:class:`~lightning_losses.data.samplers.UnpaddedDistributedSampler`, as the
    DataModules of :mod:`lightning_losses.data` do) they are exact over the whole split, however
    many samples each process holds. ``acc`` and ``nll`` are means over terms (samples; per task
    for ``nm``; per label for ``binary`` and ``multilabel``), the float32 terms of
    :func:`~lightning_losses.functional.evaluation.correct_terms` and
    :func:`~lightning_losses.functional.evaluation.nll_terms`. ``loss`` is the criterion's value
    on each batch weighted by the batch's number of samples: the exact mean over the split for
    criteria whose ``reduction="mean"`` is a mean over samples (or over a fixed number of terms
    per sample); for a class-weighted cross-entropy, which divides each batch by its sum of
    weights, it is the sample-weighted mean of the batch values.

    Args:
        criterion: a registry name (``"focal"``), a loss module, or in YAML a
            ``class_path``/``init_args`` mapping (``lightning_losses.FocalLoss``...).
        input_dim: feature size (linked from the DataModule by the CLI).
        num_classes: classes ``C`` (multiclass), labels ``K`` (multilabel), classes per task
            ``m`` (nm); ignored for binary.
        num_tasks: tasks ``n`` for ``nm``.
        task: ``multiclass``, ``binary``, ``multilabel`` or ``nm``.
        hidden: sizes of the hidden layers of the default MLP backbone.
        dropout: dropout after each hidden layer of the default MLP backbone.
        head: ``linear``, ``normface``, ``cosface`` or ``arcface``.
        temperature: fixed divisor of the linear head's logits.
        scale: scale of a cosine head; ``None`` learns it.
        margin: CosFace / ArcFace margin.
        optimizer: a factory ``params -> Optimizer`` (in YAML a ``class_path`` such as
            ``torch.optim.Adam`` with ``init_args``).
        backbone: ``None`` for ``MLP(input_dim, hidden, dropout)``; an ``nn.Module`` mapping
            ``[N, input_dim]`` to ``[N, F]``; or its ``{"class_path": ..., "init_args":
            {...}}`` mapping (YAML, checkpoints). ``F`` is found by one forward pass of
            ``torch.zeros(2, input_dim)`` in eval mode. ``hidden`` and ``dropout`` describe the
            default MLP only: giving them other values than their defaults together with a
            backbone is an error.

    Raises:
        ValueError: a bad ``task``, ``head``, ``temperature``; a backbone that does not map
            ``[2, input_dim]`` to ``[2, F]``; a backbone together with ``hidden`` or
            ``dropout`` other than their defaults.

    Example:
        >>> model = ClassifierModule("focal", input_dim=64, num_classes=10, hidden=[32])
        >>> model(torch.randn(5, 64)).shape
        torch.Size([5, 10])

        The CNN of MNIST-1D (40 features): ``F = 25 * 5 = 125`` features under the head.

        >>> from lightning_losses.lightning.backbones import CNN1D
        >>> model = ClassifierModule("ce", input_dim=40, num_classes=10, backbone=CNN1D(25))
        >>> model.head
        Linear(in_features=125, out_features=10, bias=True)
        >>> model(torch.randn(5, 40)).shape
        torch.Size([5, 10])
        >>> model.hparams["backbone"]
        {'class_path': 'lightning_losses.lightning.backbones.CNN1D', 'init_args': {'channels': 25}}
    """

    def __init__(
        self,
        criterion: str | nn.Module = "ce",
        input_dim: int = 64,
        num_classes: int = 10,
        num_tasks: int = 1,
        task: str = "multiclass",
        hidden: Sequence[int] = DEFAULT_HIDDEN,
        dropout: float = DEFAULT_DROPOUT,
        head: str = "linear",
        temperature: float = 1.0,
        scale: float | None = None,
        margin: float = 0.0,
        optimizer: OptimizerFactory | None = None,
        backbone: nn.Module | None = None,
    ) -> None:
        super().__init__()
        _head_and_task(task, head, temperature)
        if backbone is not None:
            backbone = _given_backbone(backbone, hidden, dropout)
        with warnings.catch_warnings():  # criterion and backbone modules: replaced just below
            warnings.filterwarnings(
                "ignore", "Attribute '(backbone|criterion)' is an instance of `nn.Module`"
            )
            self.save_hyperparameters()
        self._make_hparams_plain(criterion, backbone)
        self.task = task
        self.num_tasks = num_tasks
        self.num_classes = num_classes
        self.temperature = temperature
        self.optimizer_factory = optimizer

        if backbone is None:
            backbone = MLP(input_dim, hidden, dropout)
            width = backbone.out_features
        else:
            width = backbone_features(backbone, input_dim)
        self.backbone = backbone
        outputs = {"multiclass": num_classes, "binary": 1, "multilabel": num_classes}
        outputs["nm"] = num_tasks * num_classes
        self.head: nn.Module
        if head == "linear":
            self.head = nn.Linear(width, outputs[task])
        else:
            self.head = NormFaceHead(width, num_classes, scale=scale, margin=margin, kind=head)
        self.set_criterion(criterion)
        # One set per stage, so that a test after fit does not mix with validation.
        self.evaluation_metrics = nn.ModuleDict(
            {"val": evaluation_metrics(), "test": evaluation_metrics()}
        )
        self.training_metrics = nn.ModuleDict({"loss": MeanOfTerms(), "acc": MeanOfTerms()})
        self._epoch_started = 0.0

    def _make_hparams_plain(self, criterion: str | nn.Module, backbone: nn.Module | None) -> None:
        """Describe or drop the hyper-parameters that are not plain data.

        Checkpoints must load with ``torch.load(weights_only=True)``: a criterion module becomes
        its description, an optimizer factory is dropped, and a backbone module becomes its
        ``{"class_path", "init_args"}`` mapping where it has one (else it is dropped).
        """
        if not is_plain(self.hparams.get("criterion")):
            self.hparams["criterion"] = describe_criterion(criterion)
        if not is_plain(self.hparams.get("optimizer")):
            self.hparams.pop("optimizer")
        if backbone is not None and not is_plain(self.hparams.get("backbone")):
            description = describe_backbone(backbone)
            if description is None:  # load_from_checkpoint(path, backbone=...) rebuilds it
                self.hparams.pop("backbone")
            else:
                self.hparams["backbone"] = description

    def forward(self, x: Tensor, target: Tensor | None = None) -> Tensor:
        """Logits of ``x`` in the task's shape; a margin head uses ``target`` (training)."""
        features = self.backbone(x)
        if isinstance(self.head, NormFaceHead):
            return self.head(features, target)
        logits = self.head(features)
        if self.temperature != 1.0:  # x / 1 is x: no extra op (and autograd node) each step
            logits = logits / self.temperature
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
        if stage == "train":
            self._log_training(logits, target, loss)
        else:
            self._log_evaluation(stage, logits, target, loss)
        return self.validation_output(logits, target, loss)

    def _log_training(self, logits: Tensor, target: Tensor, loss: Tensor) -> None:
        """Log the batch's loss and accuracy (this process's) and their exact epoch means.

        Each metric's ``forward`` gives the batch value (``train/loss_step``, ``train/acc_step``:
        no collective per step) and adds the batch to the epoch's sums, which Lightning reduces
        across processes at the epoch's end (``train/loss_epoch``, ``train/acc_epoch``).
        """
        metrics = cast(Mapping[str, MeanOfTerms], self.training_metrics)  # an nn.ModuleDict
        metrics["loss"](loss, weight=target.shape[0])
        metrics["acc"](correct_terms(logits, target, self.task))
        for name in ("loss", "acc"):
            self.log(f"train/{name}", metrics[name], on_step=True, on_epoch=True, prog_bar=True)

    def _log_evaluation(self, stage: str, logits: Tensor, target: Tensor, loss: Tensor) -> None:
        """Accumulate the stage's exact means; Lightning syncs their sums at the epoch's end."""
        metrics = cast(Mapping[str, MeanOfTerms], self.evaluation_metrics[stage])
        metrics["loss"].update(loss, weight=target.shape[0])
        metrics["acc"].update(correct_terms(logits, target, self.task))
        metrics["nll"].update(nll_terms(logits, target, self.task))
        for name, prog_bar in (("loss", True), ("acc", True), ("nll", False)):
            self.log(
                f"{stage}/{name}", metrics[name], on_step=False, on_epoch=True, prog_bar=prog_bar
            )

    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> Tensor:
        """The batch's loss; logs ``train/loss`` and ``train/acc``."""
        return self._shared_step(batch, "train")["loss"]

    def validation_step(self, batch: Sequence[Tensor], batch_idx: int) -> dict[str, Tensor]:
        """``{"loss", "logits", "target"}``; accumulates ``val/loss``, ``val/acc``, ``val/nll``."""
        return self._shared_step(batch, "val")

    def test_step(self, batch: Sequence[Tensor], batch_idx: int) -> dict[str, Tensor]:
        """As :meth:`validation_step`, for the ``test/*`` metrics."""
        return self._shared_step(batch, "test")

    @property
    def calibrator(self) -> nn.Module | None:
        """The post-hoc calibrator :meth:`predict_step` applies (``None``: none)."""
        return self.__dict__.get("_calibrator")

    def set_calibrator(self, calibrator: nn.Module | None) -> None:
        """Apply ``calibrator`` in :meth:`predict_step` (not in the module's ``state_dict``)."""
        object.__setattr__(self, "_calibrator", calibrator)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Also take the post-hoc calibrator the checkpoint holds (or none), for predict_step."""
        super().on_load_checkpoint(checkpoint)
        self.set_calibrator(posthoc_calibrator(checkpoint))

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Probabilities: softmax (multiclass, nm) or sigmoid (binary, multilabel).

        With a post-hoc :attr:`calibrator` (read from the checkpoint loaded, or handed over by
        :class:`~lightning_losses.callbacks.PostHocCalibration` while predicting) they are its
        calibrated probabilities.
        """
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        logits = self(x)
        if self.calibrator is not None:
            return calibrated_probabilities(self.calibrator, logits)
        if self.task in ("multiclass", "nm"):
            return torch.softmax(logits, dim=-1)
        return torch.sigmoid(logits)

    def on_train_start(self) -> None:
        """Start the epoch's clock (also for a fit resumed inside an epoch); drop a calibrator."""
        # A fit resumed inside an epoch gets no on_train_epoch_start for it: count from here.
        self._epoch_started = time.perf_counter()
        self.set_calibrator(None)  # fitted for the weights loaded, not for those trained now

    def on_train_epoch_start(self) -> None:
        """Start the epoch's clock."""
        self._epoch_started = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        """Log ``time/epoch_seconds``, the slowest process's."""
        # The slowest process's time is the epoch's (one reduction per epoch under DDP).
        seconds = time.perf_counter() - self._epoch_started
        self.log("time/epoch_seconds", seconds, sync_dist=True, reduce_fx="max")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The optimizer ``optimizer`` makes (a factory or a ``class_path`` mapping), else Adam."""
        factory = self.optimizer_factory
        if factory is None:
            return torch.optim.Adam(self.parameters(), lr=1e-3)
        if isinstance(factory, Mapping):  # a class_path mapping restored from a checkpoint
            return instantiate(factory, self.parameters(), argument="optimizer")
        return factory(self.parameters())
